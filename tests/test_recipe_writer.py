"""The recipe writer as it runs in AWS: its real entry point (``index.handler``), its real client
factory and retry configuration, the environment and properties the stack synthesizes, moto's SSM
and S3 over HTTP (behind a proxy that counts what the store saw and injects AWS's errors), and
CloudFormation's response endpoint over TLS.

Nothing here passes the writer a stand-in client: endpoints come from ``AWS_ENDPOINT_URL`` as any
boto3 client reads them. Assertions are made from the store's side (the parameter moto holds, the
requests the proxy counted) and from what CloudFormation received.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator

import boto3
import pytest

from lambdas.recipe_writer import index
from rayito_constructs import AgentProject
from rayito_constructs.model.product import canonical_json, decode
from rayito_constructs.model.recipe import plan_recipe

from .recipe_writer_helpers import CFN_HOST
from .recipe_writer_world import BUILT_VERSION, FUNCTION_ARN, NAME, STACK_ID, Aws, Context, Synthesized, project, run


def build_recipe(project: AgentProject, version: str | None = None) -> dict[str, Any]:
    """The document the stack ships (no version: a deploy-time one goes in at deploy)."""
    return plan_recipe(project, version).document


def stored_value(project: AgentProject, version: str | None) -> Any:
    """What the product stores for ``project`` with ``version``."""
    return plan_recipe(project, version).encoded


def decode_recipe(value: str) -> Any:
    return decode(value)[0]


@pytest.fixture(scope="module")
def synthesized() -> Synthesized:
    return Synthesized()


@pytest.fixture(scope="module")
def world(stores, cfn, synthesized) -> "Aws":
    endpoint, proxy = stores
    return Aws(endpoint, proxy, cfn, synthesized)


@pytest.fixture
def aws(world, monkeypatch) -> Iterator["Aws"]:
    """The writer's environment as in AWS (its synthesized variables), pointed at the local stores."""
    for key, value in {
        **world.synthesized.environment,
        **world.cfn.environ(),
        "AWS_ENDPOINT_URL": world.proxy.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    # As in a fresh Lambda process, boto3's default session resolves this environment's credentials
    # (it is kept across tests, as a warm Lambda keeps it; the denied test starts a new one).
    if world.session is None:
        boto3.DEFAULT_SESSION = None
        boto3.setup_default_session()
        world.session = boto3.DEFAULT_SESSION
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", world.session)
    world.reset()
    yield world


# ------------------------------------------------------------------ the contract: template → handler


def test_create_writes_the_recipe_the_template_describes(aws, capsys) -> None:
    run(aws.event("Create", Metrics="on"))  # as synthesized with metrics=True (off: no EMF, test_monitoring_runtime)
    expected = stored_value(aws.synthesized.project, BUILT_VERSION)
    assert aws.stored() == expected.value
    assert decode_recipe(aws.stored()).image_version == BUILT_VERSION  # filled in at deploy
    parameter = aws.ssm.get_parameter(Name=NAME)["Parameter"]
    assert parameter["Type"] == "SecureString"
    answer = aws.answer
    assert answer["Status"] == "SUCCESS" and answer["PhysicalResourceId"] == NAME
    assert answer["Data"] == {"Outcome": "saved", "Saved": "true", "Reason": "saved", "Encoding": "json",
                              "Bytes": str(expected.bytes), "JsonBytes": str(expected.json_bytes),
                              "ImageVersion": BUILT_VERSION, "ParameterName": NAME}
    assert answer["NoEcho"] is False  # the outputs read the outcome; no recipe in it
    assert aws.proxy.seen == {"s3:GET": 1, "PutParameter": 1}
    assert aws.cfn.tunnels == [f"{CFN_HOST}:443"]
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    (metric,) = emf
    assert metric["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Rayito/Fleet"
    assert metric["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "RecipeSaved", "Unit": "Count"},
                                                                {"Name": "RecipeNotSaved", "Unit": "Count"}]
    assert (metric["fleet"], metric["RecipeSaved"], metric["RecipeNotSaved"]) == ("mi-agente", 1, 0)


def test_the_template_holds_no_recipe(aws) -> None:
    template = json.dumps(aws.synthesized.template)
    doc = build_recipe(aws.synthesized.project)
    for value in (doc["project"]["agent"]["instructions"], canonical_json(doc)[:60], '"scaleInAfterSeconds"'):
        assert value not in template
    # [env] values reach the VMs as the product sends them, in each run payload (from the recipe's
    # project): neither the image nor anything else of the template carries them.
    assert doc["project"]["env"]
    for key, value in doc["project"]["env"].items():
        assert json.dumps({"Key": key, "Value": value}) not in template
    assert set(aws.synthesized.properties) == {"ServiceToken", "ParameterName", "DocumentBucket", "DocumentKey",
                                                "DocumentSha256", "ImageVersion", "KeepOnDelete", "FailureMode", "Metrics",
                                                "ServiceTimeout"}


def test_update_and_delete(aws) -> None:
    run(aws.event("Create"))
    bigger = build_recipe(project(flags={"max_vms": 5}))
    run(aws.event("Update", physical=NAME, **aws.upload(bigger)))
    assert decode_recipe(aws.stored()).scaling.max_vms == 5
    assert aws.ssm.get_parameter(Name=NAME)["Parameter"]["Version"] == 2
    run(aws.event("Delete", physical=NAME))
    assert aws.stored() is None and aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"]["Outcome"] == "deleted"


def test_delete_of_a_missing_parameter_and_after_a_failed_create(aws) -> None:
    run(aws.event("Delete", physical=NAME))
    assert aws.answer["Status"] == "SUCCESS" and aws.answer["Data"]["Reason"] == "already gone"
    run(aws.event("Delete", physical="2026/11/29/[$LATEST]abc"))  # a create that never wrote anything
    assert aws.answer["Status"] == "SUCCESS" and aws.answer["Data"]["Outcome"] == "skipped"
    assert aws.proxy.seen["DeleteParameter"] == 1


def test_keep_on_delete(aws) -> None:
    run(aws.event("Create", KeepOnDelete="true"))
    run(aws.event("Delete", physical=NAME, KeepOnDelete="true"))
    assert aws.stored() is not None and aws.answer["Data"]["Outcome"] == "kept"
    assert aws.proxy.seen["DeleteParameter"] == 0


def test_a_compressed_recipe_keeps_the_image_version(aws) -> None:
    big = project(agent={"instructions": "hola " * 1200})
    run(aws.event("Update", physical=NAME, **aws.upload(build_recipe(big))))
    assert aws.answer["Data"]["Encoding"] == "gzip+base64"
    stored = aws.stored()
    assert stored.startswith('{"data":"H4sI') and stored == stored_value(big, BUILT_VERSION).value
    assert decode_recipe(stored).image_version == BUILT_VERSION


# ------------------------------------------------------------------ a failed save never fails the deploy


def _noise(size: int, seed: int = 5) -> str:
    import random

    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size))


def test_too_large_at_deploy_is_reported_and_the_previous_recipe_deleted(aws, capsys) -> None:
    run(aws.event("Create"))
    assert aws.stored() is not None
    big = build_recipe(project(agent={"instructions": _noise(9000)}))
    run(aws.event("Update", physical=NAME, Metrics="on", **aws.upload(big)))
    answer = aws.answer
    assert answer["Status"] == "SUCCESS"
    assert answer["Data"]["Outcome"] == "recipe_too_large" and answer["Data"]["Saved"] == "false"
    assert "does not fit the 4096 bytes" in answer["Data"]["Reason"] and "recipe_too_large" in answer["Reason"]
    assert aws.stored() is None  # the page: the previous one is deleted
    assert aws.proxy.seen["PutParameter"] == 0 and aws.proxy.seen["DeleteParameter"] == 1
    metric = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')][-1]
    assert (metric["RecipeSaved"], metric["RecipeNotSaved"], metric["Outcome"]) == (0, 1, "recipe_too_large")


def test_strict_mode_fails_the_deploy(aws) -> None:
    big = build_recipe(project(agent={"instructions": _noise(9000)}))
    run(aws.event("Create", FailureMode="fail", **aws.upload(big)))
    assert aws.answer["Status"] == "FAILED"
    assert aws.answer["Reason"].startswith("recipe_too_large") and "recipe_failure='fail'" in aws.answer["Reason"]


def test_throttled_writes_are_retried_by_the_real_client(aws) -> None:
    aws.proxy.fail("PutParameter", "ThrottlingException", times=2)
    run(aws.event("Create"))
    assert aws.answer["Data"]["Outcome"] == "saved" and aws.stored() is not None
    assert aws.proxy.seen["PutParameter"] == 3  # two throttled, the third one wrote


def test_throttling_that_never_ends_is_reported(aws) -> None:
    aws.proxy.fail("PutParameter", "ThrottlingException")
    run(aws.event("Create"))
    assert aws.proxy.seen["PutParameter"] == index.RETRIES["total_max_attempts"] == 3
    assert aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"].items() >= {"Outcome": "recipe_not_saved", "Saved": "false",
                                          "Reason": "PutParameter: ThrottlingException"}.items()
    assert aws.stored() is None


def test_a_key_the_store_refuses(aws) -> None:
    # moto accepts any KeyId; SSM answers InvalidKeyId, injected here as AWS sends it.
    aws.proxy.fail("PutParameter", "InvalidKeyId")
    run(aws.event("Create", KeyId="alias/does-not-exist"))
    assert aws.answer["Data"]["Reason"] == "PutParameter: InvalidKeyId"
    assert aws.proxy.seen["PutParameter"] == 1  # not retried: it would fail the same way


def test_a_document_the_bucket_does_not_have(aws) -> None:
    run(aws.event("Create", DocumentKey="0" * 64 + ".json", DocumentSha256="0" * 64))
    assert aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"]["Outcome"] == "recipe_not_saved"
    assert aws.answer["Data"]["Reason"] == "reading the recipe document: NoSuchKey"  # moto's S3 refused it
    assert aws.proxy.seen["PutParameter"] == 0


def test_a_document_that_changed_in_the_bucket(aws) -> None:
    tampered = build_recipe(project(flags={"max_vms": 9}))
    aws.s3.put_object(Bucket=aws.synthesized.properties["DocumentBucket"], Key=aws.synthesized.properties["DocumentKey"],
                      Body=canonical_json(tampered).encode())
    run(aws.event("Create"))
    assert aws.answer["Data"]["Reason"] == "the recipe document does not match its DocumentSha256"
    assert aws.stored() is None


def test_a_denied_write_is_access_denied(aws, monkeypatch) -> None:
    """moto enforces IAM: the writer's credentials are a user with no SSM permission at all."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    iam = boto3.client("iam", endpoint_url=aws.ssm.meta.endpoint_url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    iam.create_user(UserName="writer-without-ssm")
    iam.put_user_policy(UserName="writer-without-ssm", PolicyName="s3-only", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
    keys = iam.create_access_key(UserName="writer-without-ssm")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys["SecretAccessKey"])
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    run(aws.event("Create"))
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", float("inf"))
    assert aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"]["Outcome"] == "recipe_access_denied"
    # moto answers SSM's denial with HTTP 403 (an XML body botocore cannot name); SSM itself says
    # AccessDeniedException: the writer maps both to the page's recipe_access_denied.
    assert aws.answer["Data"]["Reason"].startswith("PutParameter: ")
    assert aws.stored() is None


def test_no_time_left_is_an_answer_not_a_timeout(aws) -> None:
    run(aws.event("Create"), Context(remaining_ms=20_000))
    assert aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"]["Reason"].startswith("not enough time left")
    assert aws.proxy.seen == {}  # nothing was started that could outlast the function


def test_a_denied_delete_is_reported_not_raised(aws) -> None:
    run(aws.event("Create"))
    aws.proxy.fail("DeleteParameter", "AccessDeniedException")
    run(aws.event("Delete", physical=NAME))
    assert aws.answer["Status"] == "SUCCESS"
    assert aws.answer["Data"]["Outcome"] == "recipe_access_denied" and aws.stored() is not None
    run(aws.event("Delete", physical=NAME, FailureMode="fail"))
    assert aws.answer["Status"] == "FAILED"


def test_without_a_deploy_time_version_the_document_keeps_its_own(aws) -> None:
    run(aws.event("Create", ImageVersion=None, **aws.upload(build_recipe(project(), "2.0"))))
    assert decode_recipe(aws.stored()).image_version == "2.0"
    run(aws.event("Update", physical=NAME, ImageVersion=None, **aws.upload(build_recipe(project()))))
    assert decode_recipe(aws.stored()).image_version is None


def test_a_client_that_cannot_be_made_is_an_answer(aws, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not a url")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    run(aws.event("Create"))
    assert aws.answer["Status"] == "SUCCESS" and aws.answer["Data"]["Outcome"] == "recipe_not_saved"
    assert aws.answer["Data"]["Reason"] == "ValueError"


def test_malformed_documents_and_properties(aws) -> None:
    import hashlib

    body = b"not json"
    aws.s3.put_object(Bucket=aws.synthesized.properties["DocumentBucket"], Key="garbage.json", Body=body)
    run(aws.event("Create", DocumentKey="garbage.json", DocumentSha256=hashlib.sha256(body).hexdigest()))
    assert aws.answer["Data"]["Reason"] == "the recipe document is not JSON"
    old = json.dumps({"version": 1, "name": "mi-agente", "image": {}}).encode()  # this library's old format
    aws.s3.put_object(Bucket=aws.synthesized.properties["DocumentBucket"], Key="old.json", Body=old)
    run(aws.event("Create", DocumentKey="old.json", DocumentSha256=hashlib.sha256(old).hexdigest()))
    assert aws.answer["Data"]["Reason"] == "the recipe document is not the rayito.agent-recipe/1 recipe of fleet mi-agente"
    broken = json.dumps({**build_recipe(project()), "savedBy": 7}).encode()  # the product does not read it
    aws.s3.put_object(Bucket=aws.synthesized.properties["DocumentBucket"], Key="broken.json", Body=broken)
    run(aws.event("Create", DocumentKey="broken.json", DocumentSha256=hashlib.sha256(broken).hexdigest()))
    assert aws.answer["Data"]["Reason"] == "the recipe document is not one rayito reads"
    run(aws.event("Create", DocumentSha256="not-a-hash"))
    assert aws.answer["Data"]["Reason"] == "refused: DocumentBucket, DocumentKey and DocumentSha256 are required"
    assert aws.proxy.seen["PutParameter"] == 0 and aws.stored() is None


# ------------------------------------------------------------------ who may ask


@pytest.mark.parametrize("change, refusal", [
    ({"StackId": STACK_ID.replace("MiAgente", "Other")}, "StackId is not this writer's stack"),
    ({"LogicalResourceId": "SomethingElse"}, "LogicalResourceId is not one of this stack's recipe resources"),
    ({"ResourceType": "Custom::Other"}, "ResourceType must be Custom::RayitoRecipe"),
    ({"ServiceToken": FUNCTION_ARN + "-other"}, "ServiceToken is not this function"),
    ({"RequestType": "Read"}, "RequestType must be Create, Update or Delete"),
    ({"props": {"ServiceToken": FUNCTION_ARN + "-other"}}, "ServiceToken is not this function"),
    ({"props": {"ParameterName": "/rayito/agents/other/recipe"}}, "ParameterName must be /rayito/agents/mi-agente/recipe"),
    ({"props": {"ParameterName": "/other/secret"}}, "ParameterName must be"),
])
def test_a_hostile_event_writes_nothing(aws, change, refusal) -> None:
    event = aws.event("Create")
    event["ResourceProperties"].update(change.pop("props", {}))
    event.update(change)
    run(event)
    assert aws.answer["Status"] == "FAILED" and refusal in aws.answer["Reason"]
    assert aws.proxy.seen == {} and aws.stored() is None


def test_the_cleanup_delete_of_a_fleet_removed_or_renamed_never_fails(aws) -> None:
    """One fleet of several removed from a stack: the update phase takes its logical id out of
    the writer's RECIPE_RESOURCES (and its parameter out of the writer's role) before the
    cleanup's Delete comes. Answered SUCCESS 'skipped' with the parameter left and named (the
    writer may no longer delete it), never FAILED (a DELETE_FAILED in the stack's events). The
    same for a fleet renamed in place. Anything else about the event still has to be this stack's."""
    run(aws.event("Create"))
    assert aws.stored() is not None
    aws.proxy.reset()
    removed = aws.event("Delete", physical=NAME)
    removed["LogicalResourceId"] = "RemovedFleetRecipe0A1B2C3D"
    run(removed)
    assert aws.answer["Status"] == "SUCCESS" and aws.answer["Data"]["Outcome"] == "skipped"
    assert NAME in aws.answer["Data"]["Reason"] and aws.answer["PhysicalResourceId"] == NAME
    assert aws.proxy.seen == {} and aws.stored() is not None  # touched nothing
    # A fleet renamed in place (same logical id, now this fleet's): the old recipe's cleanup Delete.
    aws.proxy.reset()
    run(aws.event("Delete", physical="/rayito/agents/old-name/recipe", ParameterName="/rayito/agents/old-name/recipe"))
    assert aws.answer["Status"] == "SUCCESS" and aws.answer["Data"]["Outcome"] == "skipped"
    assert "renamed" in aws.answer["Data"]["Reason"] and aws.proxy.seen == {}
    for change in ({"RequestType": "Create"}, {"ServiceToken": FUNCTION_ARN + "-other"},
                   {"PhysicalResourceId": "/rayito/agents/other/recipe"}, {"StackId": STACK_ID + "-other"}):
        run({**removed, **change})
        assert aws.answer["Status"] == "FAILED", change
    assert aws.proxy.seen == {} and aws.stored() is not None


def test_a_hostile_document_writes_nothing(aws) -> None:
    other = build_recipe(project("other"))  # another fleet's recipe
    run(aws.event("Create", **aws.upload(other)))
    assert aws.answer["Data"]["Reason"] == "the recipe document is not the rayito.agent-recipe/1 recipe of fleet mi-agente"
    run(aws.event("Create", ImageVersion="1.0; rm -rf"))
    assert aws.answer["Data"]["Reason"] == "refused: ImageVersion must look like 1 or 1.0"
    assert aws.proxy.seen["PutParameter"] == 0 and aws.stored() is None
    # A delete that names another fleet's parameter as its physical id deletes nothing.
    aws.ssm.put_parameter(Name="/rayito/agents/other/recipe", Value="{}", Type="SecureString")
    run(aws.event("Delete", physical="/rayito/agents/other/recipe"))
    assert aws.answer["Data"]["Outcome"] == "skipped" and aws.proxy.seen["DeleteParameter"] == 0
    assert aws.ssm.get_parameter(Name="/rayito/agents/other/recipe")["Parameter"]["Name"]


@pytest.mark.parametrize("url", [
    "https://attacker.example.com/collect",
    "http://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x",
    "https://cloudformation-custom-resource-response-uswest2.s3.amazonaws.com/x",
    "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com.attacker.com/x",
    "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com@attacker.com/x",
    "file:///etc/passwd",
    "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com:99999/x",
    "https://[cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x",
])
def test_only_cloudformation_is_answered(aws, url, caplog) -> None:
    event = aws.event("Create")
    event["ResponseURL"] = url
    caplog.set_level(logging.ERROR)
    run(event)
    assert aws.cfn.tunnels == [] and aws.cfn.received == []  # nothing left the function
    assert aws.proxy.seen == {} and aws.stored() is None  # and nothing was written
    assert "ResponseURL is not CloudFormation's response endpoint" in caplog.text


def test_a_busy_response_endpoint_is_tried_again(aws) -> None:
    aws.cfn.unavailable(2)
    run(aws.event("Create"))
    assert aws.cfn.attempts == 3 and aws.answer["Status"] == "SUCCESS"
    aws.cfn.unavailable(3)
    with pytest.raises(Exception, match="503"):  # the runtime then reports the error; CloudFormation times out
        run(aws.event("Update", physical=NAME))
    assert aws.cfn.attempts == 3
    # A response host that cannot be reached at all (the path-style URL, which the proxy has no way to)
    event = aws.event("Update", physical=NAME)
    event["ResponseURL"] = "https://s3.amazonaws.com/cloudformation-custom-resource-response-useast1/x?Signature=y"
    aws.cfn.tunnels.clear()
    with pytest.raises(OSError, match="Tunnel connection failed"):
        run(event)
    assert aws.cfn.tunnels == ["s3.amazonaws.com:443"] * 3


def test_an_alias_of_the_function_is_the_function(aws) -> None:
    run(aws.event("Create"), Context(arn=FUNCTION_ARN + ":live"))
    assert aws.answer["Data"]["Outcome"] == "saved"


# ------------------------------------------------------------------ the recipe is never logged


def test_the_recipe_never_reaches_the_logs(aws, caplog, capsys) -> None:
    marker = "recipe-value-that-must-not-be-logged-7f3a"
    marked = project(agent={"instructions": marker})
    caplog.set_level(logging.DEBUG)  # botocore's own debug logging included
    props = aws.upload(build_recipe(marked))
    for kind in ("Create", "Update", "Delete"):
        run(aws.event(kind, physical=NAME, **props))
    aws.proxy.fail("PutParameter", "InvalidKeyId")
    run(aws.event("Create", KeyId="alias/does-not-exist", **props))
    out = capsys.readouterr()
    logged = caplog.text + out.out + out.err
    assert "Create" in caplog.text and NAME in caplog.text  # the handler does log what it does
    assert marker not in logged
    assert all(marker not in json.dumps(r) for r in aws.cfn.received)


# ------------------------------------------------------------------ the writer encodes as the product


def test_the_writer_encodes_as_the_product() -> None:
    """The writer's value with a deploy-time version is the product's own value of the same
    project, flags and version (``recipe_of`` + ``encode_recipe``), plain JSON or gzip envelope."""
    from rayito._agent._fleet_recipe import encode_recipe, recipe_document, recipe_of

    for size in (1, 2500, 2700, 2900, 12000):  # plain JSON near the limit and above it (gzip envelope)
        sized = project("sized", agent={"instructions": "x" * size})
        theirs = encode_recipe(recipe_document(recipe_of(sized.product, name="sized", image_version="7",
                                                          scaling=sized.product_scaling, renew_gateway_keys=False)))
        value, encoding, _ = index.encode(build_recipe(sized), "7")
        assert value == theirs and encoding == ("json" if value.startswith('{"gatewayPresets"') else "gzip+base64")
    with pytest.raises(index.NotSaved) as info:
        index.encode(build_recipe(project("n", agent={"instructions": _noise(9000)})), "7")
    assert info.value.code == "recipe_too_large"
