"""The image composer as it runs at deploy: ``composer.handler`` (the Lambda entry point) with the
environment and the ``Custom::RayitoImageComposer`` properties the example fleet synthesizes over a
published base (``rayd=PublishedBaseImage()``), its own clients (boto3, built from the function's
environment: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL_LAMBDA_MICROVMS``), moto's S3 over HTTP
(behind a proxy that counts requests and can answer AWS's errors), the MicroVMs emulator over HTTP
with ``rayito-base-caps`` published as ``rayito setup --caps-image`` leaves it (its zip in S3), and
CloudFormation's response endpoint over TLS.

Assertions come from the other side: the object moto holds, the emulator's request log, and the
answer CloudFormation received. One test runs the handler string from the template in a new
process with the staged code and only the product layer on its path, as Lambda runs it.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
from aws_cdk.assertions import Template

from lambdas.reconciler import composer
from rayito_constructs import AgentProject, FleetStack, PublishedBaseImage
from rayito_constructs.image_composition import compose_artifact, has_rayd, template_env_of
from rayito_constructs.testing import MicrovmsEmulator

from . import contract_support as cs
from .cdk_helpers import new_app, stack_props
from .cdk_helpers import stand_in_base_zip as base_zip
from .conftest import EXAMPLE, ROOT
from .lifecycle_harness import resolve
from .recipe_writer_helpers import CFN_HOST, CloudFormationEndpoint, FaultProxy

ACCOUNT = "123456789012"
STACK_ID = f"arn:aws:cloudformation:us-east-1:{ACCOUNT}:stack/MiAgente/0d5c5a40-0000-11f0-9000-0a1b2c3d4e5f"
FUNCTION_ARN = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:MiAgente-ImageComposer"
BASE = "rayito-base-caps"
BASE_BUCKET = f"rayito-artifacts-{ACCOUNT}-us-east-1"


class Synthesized:
    """The example fleet over the published base: the composer's function, resource and staged assets."""

    def __init__(self) -> None:
        app = new_app(base_artifact=None)
        self.project = AgentProject.load(EXAMPLE)
        stack = FleetStack(app, "MiAgente", project=self.project, rayd=PublishedBaseImage(), **stack_props())
        self.template = Template.from_stack(stack).to_json()
        self.assembly = Path(app.synth().directory)
        self.template_env = stack.fleet.image.template_env
        resources = self.template["Resources"]
        ((self.function_id, self.function),) = [
            (k, r) for k, r in resources.items() if r["Type"] == "AWS::Lambda::Function"
            and r["Properties"]["Handler"] == "reconciler.composer.handler"]
        ((self.logical_id, resource),) = [(k, r) for k, r in resources.items() if r["Type"] == composer.RESOURCE_TYPE]
        names = {"AWS::StackId": STACK_ID, f"{self.function_id}.Arn": FUNCTION_ARN}
        self.env = {k: str(resolve(v, names)) for k, v in self.function["Properties"]["Environment"]["Variables"].items()}
        self.properties = {k: resolve(v, names) for k, v in resource["Properties"].items()}
        self.context_file = self.assembly / f"asset.{self.properties['BuildContextKey']}"


@pytest.fixture(scope="module")
def synthesized() -> Synthesized:
    return Synthesized()


class Context:
    """The Lambda context (the fields the composer reads)."""

    def __init__(self, remaining_ms: int = 300_000) -> None:
        self._deadline = time.monotonic() + remaining_ms / 1000
        self.invoked_function_arn = FUNCTION_ARN

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class World:
    """Moto's S3 (the asset bucket, rayito setup's bucket), the emulator, CloudFormation's endpoint."""

    def __init__(self, synthesized: Synthesized, endpoint: str, proxy: FaultProxy, cfn: CloudFormationEndpoint,
                 emulator: MicrovmsEmulator) -> None:
        self.synthesized, self.proxy, self.cfn, self.emulator = synthesized, proxy, cfn, emulator
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                               aws_secret_access_key="testing")
        self.microvms = emulator.client()
        props = synthesized.properties
        for bucket in (props["ArtifactBucket"], BASE_BUCKET):
            try:
                self.s3.create_bucket(Bucket=bucket)
            except self.s3.exceptions.BucketAlreadyOwnedByYou:
                pass
        # What cdk deploy uploads before CloudFormation runs; no composed zip of an earlier test.
        self.s3.put_object(Bucket=props["BuildContextBucket"], Key=props["BuildContextKey"],
                           Body=synthesized.context_file.read_bytes())
        listed = self.s3.list_objects_v2(Bucket=props["ArtifactBucket"], Prefix=props["ArtifactPrefix"])
        for item in listed.get("Contents", []):
            self.s3.delete_object(Bucket=props["ArtifactBucket"], Key=item["Key"])
        proxy.reset()
        cfn.received.clear()
        self.env = {**synthesized.env, **cfn.environ(), "AWS_ENDPOINT_URL_S3": proxy.endpoint,
                    "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": emulator.endpoint_url, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing", "AWS_REGION": "us-east-1",
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def publish_base(self, data: bytes, *, caps: bool = True, name: str = BASE, **changed: Any) -> str:
        """A version of the base, as ``rayito setup`` publishes it: its zip, content-addressed, in S3
        (``changed``: members of the request given otherwise; None leaves one out)."""
        from rayito._images_publish_domain import IMAGE_HOOKS

        key = f"rayito/images/rayd-{hashlib.sha256(data).hexdigest()}.zip"
        self.s3.put_object(Bucket=BASE_BUCKET, Key=key, Body=data)
        request: dict[str, Any] = {
            "baseImageArn": "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1", "baseImageVersion": "1",
            "buildRoleArn": f"arn:aws:iam::{ACCOUNT}:role/rayito-build", "codeArtifact": {"uri": f"s3://{BASE_BUCKET}/{key}"},
            "hooks": json.loads(json.dumps(IMAGE_HOOKS)), "cpuConfigurations": [{"architecture": "ARM_64"}],
            **({"additionalOsCapabilities": ["ALL"]} if caps else {}),
        }
        request = {k: v for k, v in {**request, **changed}.items() if v is not None}
        if self.emulator.has_image(name):
            made = self.microvms.update_microvm_image(imageIdentifier=self.emulator.image_arn(name), **request)
        else:
            made = self.microvms.create_microvm_image(name=name, **request)
        return str(made["imageVersion"])

    def event(self, kind: str, **overrides: Any) -> dict[str, Any]:
        props = {"ServiceToken": FUNCTION_ARN, **self.synthesized.properties, **overrides}
        props = {k: v for k, v in props.items() if v is not None}
        request = f"req-{uuid.uuid4().hex[:8]}"
        event: dict[str, Any] = {
            "RequestType": kind, "ServiceToken": FUNCTION_ARN, "ResponseURL": self.cfn.url(request), "StackId": STACK_ID,
            "RequestId": request, "LogicalResourceId": self.synthesized.logical_id,
            "ResourceType": composer.RESOURCE_TYPE, "ResourceProperties": props,
        }
        if kind != "Create":
            event["PhysicalResourceId"] = "rayito-composer:mi-agente"
        if kind == "Update":
            event["OldResourceProperties"] = dict(props)
        return event

    def invoke(self, monkeypatch: Any, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """``composer.handler`` once, in this process, with the function's environment: what
        CloudFormation received."""
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        before = len(self.cfn.received)
        assert composer.handler(event, context or Context()) is None  # a custom resource returns nothing
        (answer,) = self.cfn.received[before:]
        assert answer["host"] == CFN_HOST
        return dict(answer["body"])

    def composed(self, answer: dict[str, Any]) -> bytes:
        data = answer["Data"]
        return bytes(self.s3.get_object(Bucket=data["ArtifactBucket"], Key=data["ArtifactKey"])["Body"].read())

    def calls(self) -> list[str]:
        return [r.operation for r in self.emulator.requests]


@pytest.fixture
def world(synthesized, stores, cfn) -> Iterator[World]:
    endpoint, proxy = stores
    with MicrovmsEmulator(image_build_seconds=0, consistency_seconds=0) as emulator:
        yield World(synthesized, endpoint, proxy, cfn, emulator)


def failed(answer: dict[str, Any]) -> str:
    """The reason of a FAILED answer, checked to be one line."""
    assert answer["Status"] == "FAILED", answer
    reason = str(answer["Reason"])
    assert "\n" not in reason and reason.strip() == reason and reason, reason
    return reason


# ------------------------------------------------------------------ what it makes


def test_it_uploads_what_synth_composes_from_the_same_base_and_only_once(world, monkeypatch) -> None:
    version = world.publish_base(base_zip())
    answer = world.invoke(monkeypatch, world.event("Create"))
    assert answer["Status"] == "SUCCESS", answer
    data = answer["Data"]
    composed = world.composed(answer)
    # The bytes synth makes from the same base zip: and so the product's ProjectService.build's
    # (tests/test_agent_image.py proves synth's), the fleet's variables included.
    synthesized = world.synthesized
    assert synthesized.template_env and template_env_of(composed).items() >= synthesized.template_env.items()
    assert composed == compose_artifact(synthesized.project.product, base_zip(), template_env=synthesized.template_env)
    assert has_rayd(composed)
    digest = hashlib.sha256(composed).hexdigest()
    assert data["ArtifactKey"] == f"rayito/templates/mi-agente/{digest}.zip" == f"{synthesized.properties['ArtifactPrefix']}/{digest}.zip"
    assert data["ArtifactUri"] == f"s3://{data['ArtifactBucket']}/{data['ArtifactKey']}" == answer["PhysicalResourceId"]
    assert (data["ArtifactSha256"], data["Uploaded"], data["BaseImageVersion"]) == (digest, "true", version)
    # What the agent image inherits, in the spelling CreateMicrovmImage takes ("1", not the echoed "1.0").
    assert (data["ManagedBaseImageArn"], data["ManagedBaseImageVersion"]) == (
        "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1", "1")
    assert data["BaseArtifactUri"].startswith(f"s3://{BASE_BUCKET}/rayito/images/rayd-")
    assert world.calls() == ["CreateMicrovmImage", "GetMicrovmImage", "ListMicrovmImageVersions",
                             "GetMicrovmImageVersion"]
    # Again (an update that changed nothing the zip depends on): the same key, nothing uploaded.
    puts = world.proxy.seen["s3:PUT"]
    again = world.invoke(monkeypatch, world.event("Update"))
    assert again["Status"] == "SUCCESS"
    assert again["Data"]["ArtifactKey"] == data["ArtifactKey"] and again["Data"]["Uploaded"] == "false"
    assert world.proxy.seen["s3:PUT"] == puts
    assert world.composed(again) == composed


def test_the_newest_active_version_unless_one_is_pinned(world, monkeypatch) -> None:
    first = world.publish_base(base_zip(notice="first"))
    second = world.publish_base(base_zip(notice="second"))
    assert (first, second) == ("1.0", "2.0")
    latest = world.invoke(monkeypatch, world.event("Create"))
    assert latest["Data"]["BaseImageVersion"] == "2.0"
    assert world.composed(latest) == compose_artifact(world.synthesized.project.product, base_zip(notice="second"),
                                                      template_env=world.synthesized.template_env)
    pinned = world.invoke(monkeypatch, world.event("Update", BaseImageVersion="1.0"))
    assert pinned["Data"]["BaseImageVersion"] == "1.0" and pinned["Data"]["ArtifactKey"] != latest["Data"]["ArtifactKey"]
    # A newest version made INACTIVE is skipped, as the product's build skips it.
    world.microvms.update_microvm_image_version(imageIdentifier=world.emulator.image_arn(BASE), imageVersion="2.0",
                                                status="INACTIVE")
    assert world.invoke(monkeypatch, world.event("Update"))["Data"]["BaseImageVersion"] == "1.0"


def test_the_lambda_runtime_runs_it_with_its_staged_code_and_only_the_product_layer(world) -> None:
    """The handler string, timeout and staged code from the assembly, in a new process whose path
    is the code and the layer (no rayito_constructs, no pydantic), as Lambda runs it."""
    world.publish_base(base_zip())
    synthesized = world.synthesized
    code = cs.asset_code(synthesized.assembly, synthesized.function, ROOT / "lambdas" / "reconciler")
    env = {**cs.lambda_environment(synthesized.function, "MiAgente-ImageComposer", synthesized.env,
                                   {"S3": world.proxy.endpoint, "LAMBDA_MICROVMS": world.emulator.endpoint_url}),
           **world.cfn.environ()}
    run = cs.run_lambda(code, synthesized.function, env, [world.event("Create")],
                        layers=tuple(cs.layer_folders(synthesized.template, synthesized.function)))
    assert run.errors == [] and run.results == [None]
    (answer,) = [r["body"] for r in world.cfn.received]
    assert answer["Status"] == "SUCCESS", answer
    assert world.composed(answer) == compose_artifact(synthesized.project.product, base_zip(),
                                                      template_env=synthesized.template_env)
    (line,) = [r for r in run.records if r.get("event") == "image_composed"]
    assert line["ArtifactKey"] == answer["Data"]["ArtifactKey"] and line["service"] == "rayito-image-composer"


def test_a_delete_keeps_the_composed_zips(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    made = world.invoke(monkeypatch, world.event("Create"))
    gone = world.invoke(monkeypatch, world.event("Delete"))
    assert gone["Status"] == "SUCCESS" and gone["PhysicalResourceId"] == "rayito-composer:mi-agente"
    assert world.composed(made)  # still there
    assert world.proxy.seen["s3:DELETE"] == 0


# ------------------------------------------------------------------ each failure, one line


def test_no_base_image_in_the_account(world, monkeypatch) -> None:
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == (f"base image {BASE}: not found in account {ACCOUNT} region us-east-1 (publish it with rayito setup "
                      "--caps-image, or compose at synth from a release zip: base_artifact)")


def test_no_active_version(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.microvms.update_microvm_image_version(imageIdentifier=world.emulator.image_arn(BASE), imageVersion="1.0",
                                                status="INACTIVE")
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith(f"base image {BASE}: no SUCCESSFUL and ACTIVE version to compose on")


def test_a_pinned_version_that_does_not_exist(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    reason = failed(world.invoke(monkeypatch, world.event("Create", BaseImageVersion="7")))
    assert reason.startswith(f"base image {BASE}: the pinned version 7 does not exist")


def test_a_base_zip_gone_after_rayito_setups_seven_days(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    key = f"rayito/images/rayd-{hashlib.sha256(base_zip()).hexdigest()}.zip"
    world.s3.delete_object(Bucket=BASE_BUCKET, Key=key)  # the bucket's expiry rule did it
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == (f"base image {BASE} version 1.0: its zip s3://{BASE_BUCKET}/{key} is gone (rayito setup keeps "
                      "base zips 7 days): publish the base again, or compose at synth from the release zip (base_artifact)")


def test_a_base_zip_that_is_no_base(world, monkeypatch) -> None:
    world.publish_base(base_zip(rayd=False))
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith(f"base image {BASE} version 1.0: the zip has no 'rayd' at its root")


def test_a_base_that_declares_otherwise_than_the_stack(world, monkeypatch) -> None:
    world.publish_base(base_zip(), caps=False)  # rayito-base-caps published without its capabilities
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith(f"base image {BASE} version 1.0: its additionalOsCapabilities differ from what the stack")


def test_s3_denies_the_upload(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.proxy.fail("s3:PUT", "AccessDenied")
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith("uploading the composed zip to s3://") and reason.endswith(": access denied")


def test_s3_denies_the_build_context(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.proxy.fail("s3:GET", "AccessDenied")
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith("the project's build context s3://") and "AccessDenied (HTTP 403)" in reason


def test_a_build_context_that_is_not_the_synthesized_one(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    reason = failed(world.invoke(monkeypatch, world.event("Create", BuildContextSha256="0" * 64)))
    assert reason.endswith("its sha256 is not the BuildContextSha256 the stack was synthesized with")


@pytest.mark.parametrize("overrides, what", [
    ({"BuildContextSha256": None}, "BuildContextSha256 is missing or malformed"),
    ({"BuildContextKey": ""}, "BuildContextKey is missing"),
    ({"ArtifactPrefix": "elsewhere/mi-agente"}, "ArtifactPrefix is missing or malformed"),
    ({"BaseImageVersion": "latest"}, "BaseImageVersion must be empty"),
    ({"Inherits": "{not json"}, "Inherits must be a JSON object"),
    ({"ImageName": "otra"}, "ImageName is not this function's image"),
])
def test_bad_properties_are_refused_without_a_call(world, monkeypatch, overrides, what) -> None:
    world.publish_base(base_zip())
    before = len(world.emulator.requests)
    reason = failed(world.invoke(monkeypatch, world.event("Create", **overrides)))
    assert reason.startswith(f"refused: {what}")
    assert len(world.emulator.requests) == before and world.proxy.seen["s3:GET"] == 0


def test_a_resource_of_another_image_is_refused_without_a_call(world, monkeypatch) -> None:
    """The stack's map names the resource's image; a function made for another image (its
    IMAGE_NAME) composes nothing for it."""
    world.publish_base(base_zip())
    world.env["IMAGE_NAME"] = "otra"
    before = len(world.emulator.requests)
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == "refused: the resource is not this function's image"
    assert len(world.emulator.requests) == before and world.proxy.seen["s3:GET"] == 0


@pytest.mark.parametrize("fault, said", [
    ("AccessDenied", f"base image {BASE}: GetMicrovmImage: AccessDeniedException (HTTP 403)"),
    ("unreachable", f"base image {BASE}: GetMicrovmImage: EndpointConnectionError"),
])
def test_the_base_image_cannot_be_read(world, monkeypatch, fault, said) -> None:
    world.publish_base(base_zip())
    if fault == "unreachable":  # nothing listens there: the connection is refused
        world.env["AWS_ENDPOINT_URL_LAMBDA_MICROVMS"] = f"http://127.0.0.1:{_closed_port()}"
    else:
        world.emulator.inject("GetMicrovmImage", fault, times=None)
    assert failed(world.invoke(monkeypatch, world.event("Create"))) == said


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_base_image_being_deleted_is_not_found(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.microvms.delete_microvm_image(imageIdentifier=world.emulator.image_arn(BASE))
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason.startswith(f"base image {BASE}: not found in account {ACCOUNT} region us-east-1")
    assert "ListMicrovmImageVersions" not in world.calls()


def test_the_base_versions_cannot_be_read(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.emulator.inject("ListMicrovmImageVersions", "AccessDenied", times=None)
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == f"base image {BASE}: reading its versions: AccessDeniedException (HTTP 403)"


def test_a_base_version_without_a_managed_base_version(world, monkeypatch) -> None:
    world.publish_base(base_zip(), baseImageVersion=None)
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == (f"base image {BASE} version 1.0: it declares no managed base (baseImageArn, baseImageVersion) "
                      "to inherit")
    assert world.proxy.seen["s3:GET"] == 1  # the build context; the base's zip is not read


def test_s3_denies_the_base_zip(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    world.proxy.fail("s3:GET", "AccessDenied", times=1, after=1)  # the build context is read first
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    key = f"rayito/images/rayd-{hashlib.sha256(base_zip()).hexdigest()}.zip"
    assert reason == (f"base image {BASE} version 1.0: reading its zip s3://{BASE_BUCKET}/{key}: access denied (the "
                      "composer reads rayito/images/* of the base's artifact bucket: give base_artifact_bucket)")


def test_a_base_zip_whose_bucket_is_gone(world, monkeypatch) -> None:
    uri = f"s3://rayito-artifacts-gone-{ACCOUNT}/rayito/images/rayd-0.zip"
    world.publish_base(base_zip(), codeArtifact={"uri": uri})
    reason = failed(world.invoke(monkeypatch, world.event("Create")))
    assert reason == f"base image {BASE} version 1.0: reading its zip {uri}: NoSuchBucket (HTTP 404)"


def test_out_of_time_is_said_before_cloudformation_waits(world, monkeypatch) -> None:
    world.publish_base(base_zip())
    reason = failed(world.invoke(monkeypatch, world.event("Create"), Context(remaining_ms=5_000)))
    assert reason.startswith("out of time before reading the project's build context")


def test_a_request_for_another_url_is_never_answered(world, monkeypatch) -> None:
    event = world.event("Create")
    event["ResponseURL"] = "https://example.com/answer"
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    assert composer.handler(event, Context()) is None
    assert world.cfn.received == [] and list(world.emulator.requests) == []
