"""The recipe writer Lambda against moto's SSM over HTTP, and CloudFormation's response protocol."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterator

import pytest

from lambdas.recipe_writer import index
from rayito_constructs import AgentProject, plan_recipe

from .conftest import EXAMPLE
from .moto_server import client, moto_server

NAME = "/rayito/agents/mi-agente/recipe"


class _Responses(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def ssm_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def cfn() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local stand-in for CloudFormation's pre-signed response URL."""
    _Responses.received = []
    server = HTTPServer(("127.0.0.1", 0), _Responses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/response", _Responses.received
    server.shutdown()


def event(kind: str, url: str, props: dict[str, Any], physical: str | None = None) -> dict[str, Any]:
    e = {
        "RequestType": kind,
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/S/1",
        "RequestId": f"req-{kind}",
        "LogicalResourceId": "FleetRecipe",
        "ResourceType": "Custom::RayitoRecipe",
        "ResourceProperties": {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:w", **props},
    }
    if physical:
        e["PhysicalResourceId"] = physical
    return e


def props(value: str, **extra: str) -> dict[str, str]:
    return {"ParameterName": NAME, "Value": value, "Encoding": "json", "KeepOnDelete": "false", **extra}


def test_create_update_delete(ssm_endpoint, cfn) -> None:
    url, responses = cfn
    ssm = client("ssm", ssm_endpoint)
    factory = lambda: ssm  # noqa: E731
    first = plan_recipe(AgentProject.load(EXAMPLE)).encoded.value
    index.handler(event("Create", url, props(first)), None, factory)
    stored = ssm.get_parameter(Name=NAME, WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and stored["Value"] == first
    assert responses[-1]["Status"] == "SUCCESS" and responses[-1]["PhysicalResourceId"] == NAME
    assert responses[-1]["NoEcho"] is True and first not in json.dumps(responses[-1])

    second = plan_recipe(AgentProject.load(EXAMPLE, max_vms=5)).encoded.value
    index.handler(event("Update", url, props(second), physical=NAME), None, factory)
    assert ssm.get_parameter(Name=NAME, WithDecryption=True)["Parameter"]["Value"] == second  # Overwrite
    assert ssm.get_parameter(Name=NAME)["Parameter"]["Version"] == 2

    index.handler(event("Delete", url, props(second), physical=NAME), None, factory)
    with pytest.raises(ssm.exceptions.ParameterNotFound):
        ssm.get_parameter(Name=NAME)
    assert responses[-1]["Status"] == "SUCCESS"


def test_delete_of_a_missing_parameter_succeeds(ssm_endpoint, cfn) -> None:
    url, responses = cfn
    ssm = client("ssm", ssm_endpoint)
    index.handler(event("Delete", url, props("{}"), physical="/rayito/agents/gone/recipe"), None, lambda: ssm)
    assert responses[-1]["Status"] == "SUCCESS"


def test_delete_after_a_failed_create_touches_nothing(ssm_endpoint, cfn) -> None:
    url, responses = cfn
    ssm = client("ssm", ssm_endpoint)
    index.handler(event("Delete", url, props("{}"), physical="2026/11/29/[$LATEST]abc"), None, lambda: ssm)
    assert responses[-1]["Status"] == "SUCCESS"


def test_keep_on_delete(ssm_endpoint, cfn) -> None:
    url, _ = cfn
    ssm = client("ssm", ssm_endpoint)
    name = "/rayito/agents/kept/recipe"
    p = {**props('{"version":1}'), "ParameterName": name, "KeepOnDelete": "true"}
    index.handler(event("Create", url, p), None, lambda: ssm)
    index.handler(event("Delete", url, p, physical=name), None, lambda: ssm)
    assert ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"] == '{"version":1}'


def test_refuses_parameters_outside_the_prefix(ssm_endpoint, cfn) -> None:
    url, responses = cfn
    ssm = client("ssm", ssm_endpoint)
    index.handler(event("Create", url, {**props("x"), "ParameterName": "/other/secret"}), None, lambda: ssm)
    assert responses[-1]["Status"] == "FAILED"
    assert "ParameterName must start with /rayito/agents/" in responses[-1]["Reason"]


def test_failures_reach_cloudformation(cfn) -> None:
    url, responses = cfn
    dead = client("ssm", "http://127.0.0.1:9")  # nothing listens there
    dead.meta.config.retries = {"max_attempts": 1}
    index.handler(event("Create", url, props("SECRET-LOOKING-VALUE")), None, lambda: dead)
    assert responses[-1]["Status"] == "FAILED"
    assert "SECRET-LOOKING-VALUE" not in json.dumps(responses[-1])


def test_the_value_never_reaches_the_logs(ssm_endpoint, cfn, caplog, capsys) -> None:
    url, responses = cfn
    ssm = client("ssm", ssm_endpoint)
    marker = "recipe-value-that-must-not-be-logged-7f3a"
    value = json.dumps({"version": 1, "instructions": marker})
    caplog.set_level(logging.DEBUG)  # botocore's own debug logging included
    for kind in ("Create", "Update", "Delete"):
        index.handler(event(kind, url, props(value), physical=NAME), None, lambda: ssm)
    # And a failure, whose error must not carry the value either.
    index.handler(event("Create", url, {**props(value), "KeyId": "alias/does-not-exist"}), None, lambda: ssm)
    logged = caplog.text + capsys.readouterr().out + capsys.readouterr().err
    assert "Create" in caplog.text and NAME in caplog.text  # the handler does log what it does
    assert marker not in logged
    assert all(marker not in json.dumps(r) for r in responses)
