"""Contract from template to handler: the recipe writer as `make synth` deploys it.

The example fleet is synthesized by app.py (what `make synth` runs). The writer's handler string,
timeout, staged code (checked equal to lambdas/recipe_writer), environment and the
``Custom::RayitoRecipe`` properties come from that template; the recipe document is the asset the
assembly staged, uploaded where the template says. The handler runs in a new process
(tests/lambda_runner.py) with a real Lambda context and its own client factory (``index.clients``:
its retries and timeouts), against moto for S3 and SSM and CloudFormation's response endpoint
(tests/recipe_writer_helpers.py: a local TLS server for that host, reached through a proxy).

Failures are ones the stores really make, not injected answers: a store that refuses the
connection, one that hangs up (every attempt counted on the socket), and a bucket moto does not
have. Asserted from the other side: moto's parameter, the answer CloudFormation received, the
connections the dead store accepted, and the EMF record on stdout.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from rayito_constructs import AgentProject
from rayito_constructs.model.product import decode
from rayito_constructs.model.recipe import plan_recipe

from . import contract_support as cs
from .conftest import EXAMPLE, ROOT
from .moto_server import client as aws_client
from .moto_server import moto_server
from .recipe_writer_helpers import CFN_HOST, CloudFormationEndpoint

HANDLER = "index.handler"
STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/RayitoFleet-mi-agente/6a1e0c40-0000-11f0-9000-0a1b2c3d4e5f"
BUILT_VERSION = "2"


@pytest.fixture(scope="module")
def deployed(example_assembly, tmp_path_factory):
    outdir, template = example_assembly
    logical, resource = cs.function(template, HANDLER)
    code = cs.asset_code(outdir, resource, ROOT / "lambdas" / "recipe_writer")
    ((recipe_logical, recipe),) = [(k, r) for k, r in template["Resources"].items() if r["Type"] == "Custom::RayitoRecipe"]
    with moto_server() as aws:
        cfn = CloudFormationEndpoint(tmp_path_factory.mktemp("cfn"))
        try:
            yield {"template": template, "outdir": outdir, "logical": logical, "resource": resource, "code": code,
                   "recipe_logical": recipe_logical, "recipe": recipe, "aws": aws, "cfn": cfn}
        finally:
            cfn.close()


class Deploy:
    """One CloudFormation operation on the recipe resource, run as Lambda runs the writer."""

    def __init__(self, d: dict[str, Any], *, ssm_endpoint: str | None = None, upload: bool = True) -> None:
        self.d = d
        self.ssm = aws_client("ssm", d["aws"])
        self.s3 = aws_client("s3", d["aws"])
        self.function_name = f"RayitoFleet-mi-agente-RecipeWriter-{uuid.uuid4().hex[:6]}"
        self.function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
        account = "123456789012"

        def resolve(value: Any) -> Any:
            if isinstance(value, dict) and "Fn::Sub" in value:
                return value["Fn::Sub"].replace("${AWS::AccountId}", account).replace("${AWS::Region}", "us-east-1")
            if isinstance(value, dict) and value == {"Ref": "AWS::StackId"}:
                return STACK_ID
            if isinstance(value, dict) and "Fn::GetAtt" in value:
                target, attribute = value["Fn::GetAtt"]
                if target == d["logical"] and attribute == "Arn":
                    return self.function_arn
                if attribute == "LatestActiveImageVersion":
                    return BUILT_VERSION
            return None

        self.properties = {}
        for key, value in d["recipe"]["Properties"].items():
            resolved = value if isinstance(value, str) else resolve(value)
            assert resolved is not None, f"{key}: cannot resolve {value}"
            self.properties[key] = resolved
        self.name = self.properties["ParameterName"]
        self.bucket = self.properties["DocumentBucket"]
        self.staged = (d["outdir"] / f"asset.{self.properties['DocumentKey']}").read_bytes()
        assert hashlib.sha256(self.staged).hexdigest() == self.properties["DocumentSha256"]
        if upload:  # what `cdk deploy` publishes before CloudFormation runs
            self.s3.create_bucket(Bucket=self.bucket)
            self.s3.put_object(Bucket=self.bucket, Key=self.properties["DocumentKey"], Body=self.staged)
        variables = cs.function_environment(d["resource"], resolve)
        endpoints = {"S3": d["aws"], "SSM": ssm_endpoint or d["aws"]}
        self.env = {**cs.lambda_environment(d["resource"], self.function_name, variables, endpoints),
                    **d["cfn"].environ()}

    def event(self, kind: str, request_id: str, **props: Any) -> dict[str, Any]:
        event = {"RequestType": kind, "ServiceToken": self.function_arn, "ResponseURL": self.d["cfn"].url(request_id),
                 "StackId": STACK_ID, "RequestId": request_id, "LogicalResourceId": self.d["recipe_logical"],
                 "ResourceType": "Custom::RayitoRecipe", "ResourceProperties": {**self.properties, **props}}
        if kind != "Create":
            event["PhysicalResourceId"] = self.name
        return event

    def run(self, *events: dict[str, Any]) -> tuple[cs.Run, list[dict[str, Any]]]:
        before = len(self.d["cfn"].received)
        run = cs.run_lambda(self.d["code"], self.d["resource"], self.env, list(events),
                            layers=tuple(cs.layer_folders(self.d["template"], self.d["resource"])))
        assert run.errors == [] and run.results == [None] * len(events)  # a custom resource returns nothing
        answers = self.d["cfn"].received[before:]
        assert [a["host"] for a in answers] == [CFN_HOST] * len(events)
        return run, [a["body"] for a in answers]

    def stored(self) -> dict[str, Any] | None:
        try:
            return self.ssm.get_parameter(Name=self.name, WithDecryption=True)["Parameter"]
        except self.ssm.exceptions.ParameterNotFound:
            return None

    def clean(self) -> None:
        try:
            self.ssm.delete_parameter(Name=self.name)
        except self.ssm.exceptions.ParameterNotFound:
            pass


def _emf(run: cs.Run) -> list[dict[str, Any]]:
    return [r for r in run.records if "_aws" in r]


def test_create_update_delete_as_cloudformation_sends_them(deployed) -> None:
    deploy = Deploy(deployed)
    deploy.clean()
    run, (created, deleted) = deploy.run(deploy.event("Create", "c1"), deploy.event("Delete", "d1"))
    assert created["Status"] == "SUCCESS" and created["PhysicalResourceId"] == deploy.name
    assert created["Data"]["Outcome"] == "saved" and created["Data"]["ImageVersion"] == BUILT_VERSION
    assert deleted["Status"] == "SUCCESS" and deleted["Data"]["Outcome"] == "deleted" and deploy.stored() is None
    # create again and keep it: what moto holds is the library's encoding of the example's recipe
    run, (again,) = deploy.run(deploy.event("Create", "c2"))
    stored = deploy.stored()
    (described,) = deploy.ssm.describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [deploy.name]}])["Parameters"]
    assert stored["Type"] == described["Type"] == "SecureString" and described["Tier"] == "Standard"
    expected = plan_recipe(AgentProject.load(EXAMPLE), BUILT_VERSION).encoded  # the product's value, its version
    assert stored["Value"] == expected.value and decode(stored["Value"])[0].image_version == BUILT_VERSION
    (metric,) = _emf(run)
    assert metric["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "RecipeSaved", "Unit": "Count"},
                                                                {"Name": "RecipeNotSaved", "Unit": "Count"}]
    assert (metric["fleet"], metric["RecipeSaved"], metric["RecipeNotSaved"]) == ("mi-agente", 1, 0)
    assert expected.value not in run.stdout + run.stderr  # the recipe never reaches the logs
    deploy.clean()


@contextmanager
def refusing_port() -> Iterator[str]:
    """A port bound and not listening: every connection is refused (held bound, so no one takes it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@contextmanager
def hanging_up() -> Iterator[tuple[str, list[int]]]:
    """A store that accepts each connection and closes it without an answer; counts them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted = [0]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted[0] += 1
            conn.recv(65536)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


def _not_saved(answer: dict[str, Any], reason: str) -> None:
    assert answer["Status"] == "SUCCESS"  # FailureMode warn (the template's): the deploy goes on
    assert answer["Data"]["Outcome"] == "recipe_not_saved" and answer["Data"]["Saved"] == "false"
    assert answer["Data"]["Reason"] == reason, answer["Data"]
    assert "recipe_failure='warn'" in answer["Reason"]


def test_a_store_that_refuses_the_connection(deployed) -> None:
    with refusing_port() as dead:
        deploy = Deploy(deployed, ssm_endpoint=dead)
        deploy.clean()
        run, (answer,) = deploy.run(deploy.event("Create", "refused"))
    _not_saved(answer, "PutParameter: EndpointConnectionError")
    assert deploy.stored() is None
    (metric,) = _emf(run)
    assert (metric["RecipeSaved"], metric["RecipeNotSaved"], metric["Outcome"]) == (0, 1, "recipe_not_saved")


def test_a_store_that_hangs_up_is_tried_as_often_as_the_client_says(deployed) -> None:
    from lambdas.recipe_writer.index import RETRIES

    with hanging_up() as (dead, accepted):
        deploy = Deploy(deployed, ssm_endpoint=dead)
        deploy.clean()
        _, (answer,) = deploy.run(deploy.event("Create", "hangup"))
    _not_saved(answer, "PutParameter: ConnectionClosedError")
    assert accepted[0] == RETRIES["total_max_attempts"] == 3  # counted by the socket, not the writer
    assert deploy.stored() is None


def test_a_document_bucket_the_store_does_not_have(deployed) -> None:
    deploy = Deploy(deployed, upload=False)
    deploy.clean()
    missing = f"not-there-{uuid.uuid4().hex[:8]}"
    _, (answer,) = deploy.run(deploy.event("Create", "nobucket", DocumentBucket=missing))
    assert answer["Data"]["Outcome"] == "recipe_not_saved" and "NoSuchBucket" in answer["Data"]["Reason"]
    assert deploy.stored() is None


def test_strict_mode_fails_the_deploy_on_a_real_refusal(deployed) -> None:
    with refusing_port() as dead:
        deploy = Deploy(deployed, ssm_endpoint=dead)
        _, (answer,) = deploy.run(deploy.event("Create", "strict", FailureMode="fail"))
    assert answer["Status"] == "FAILED"
    assert answer["Reason"] == "recipe_not_saved: PutParameter: EndpointConnectionError (recipe_failure='fail')"
