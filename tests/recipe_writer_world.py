"""The recipe writer's world as its tests and the metrics test run it: the example stack's
synthesized writer (its environment, its custom resource, its document) and the stores it writes
to (moto's S3 and SSM behind a :class:`FaultProxy`, CloudFormation's response endpoint), with the
events CloudFormation sends and the Lambda context the runtime passes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3
from aws_cdk.assertions import Template

from lambdas.recipe_writer import index
from rayito_constructs import AgentProject, FleetStack
from rayito_constructs.model.product import canonical_json

from .cdk_helpers import new_app, stack_props
from .projects import scratch, write_project
from .recipe_writer_helpers import CFN_HOST, CloudFormationEndpoint, FaultProxy

STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/MiAgente/0d5c5a40-0000-11f0-9000-0a1b2c3d4e5f"
FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:MiAgente-RayitoRecipeWriterFunction-abc"
NAME = "/rayito/agents/mi-agente/recipe"
BUILT_VERSION = "3"


def project(folder_name: str = "mi-agente", **tables: Any) -> AgentProject:
    """A product project named mi-agente (or another fleet) with ``tables`` over the base."""
    root = scratch("recipe-writer-")
    flags = tables.pop("flags", {})
    tables.setdefault("env", {"GREETING": "Hola", "LOG_LEVEL": "info"})
    return AgentProject.load(write_project(root / folder_name, name=folder_name, tables=tables, dockerfile=True), **flags)


class Context:
    """The Lambda context the runtime passes (the fields the writer reads)."""

    def __init__(self, remaining_ms: int = 150_000, arn: str = FUNCTION_ARN) -> None:
        self._deadline = time.monotonic() + remaining_ms / 1000
        self.invoked_function_arn = arn
        self.function_name = arn.rsplit(":", 1)[-1]
        self.aws_request_id = "req"
        self.log_stream_name = "2026/11/30/[$LATEST]abc"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _resolve(value: Any, function_logical: str) -> Any:
    """The few intrinsics the writer's inputs use, resolved as CloudFormation would at deploy."""
    if isinstance(value, dict) and len(value) == 1:
        (key, arg), = value.items()
        if key == "Ref" and arg == "AWS::StackId":
            return STACK_ID
        if key == "Fn::GetAtt" and arg == [function_logical, "Arn"]:
            return FUNCTION_ARN
        if key == "Fn::GetAtt" and arg[1] == "LatestActiveImageVersion":
            return BUILT_VERSION
        if key == "Fn::Join":
            return arg[0].join(str(_resolve(v, function_logical)) for v in arg[1])
    if isinstance(value, dict):
        return {k: _resolve(v, function_logical) for k, v in value.items()}
    return value


class Synthesized:
    """What the example stack gives the writer: its environment, its resource and its document."""

    def __init__(self) -> None:
        app = new_app()
        self.project = project()  # the example's app, with a Dockerfile: the stack builds the image
        stack = FleetStack(app, "MiAgente", project=self.project, **stack_props())
        self.template = Template.from_stack(stack).to_json()
        self.assembly = Path(app.synth().directory)
        functions = {k: r for k, r in self.template["Resources"].items() if r["Type"] == "AWS::Lambda::Function"
                     and "RECIPE_RESOURCES" in r["Properties"].get("Environment", {}).get("Variables", {})}
        ((self.function_logical, function),) = functions.items()
        self.environment = _resolve(function["Properties"]["Environment"]["Variables"], self.function_logical)
        ((self.logical_id, resource),) = [(k, r) for k, r in self.template["Resources"].items()
                                          if r["Type"] == "Custom::RayitoRecipe"]
        self.properties = _resolve(resource["Properties"], self.function_logical)
        self.document_file = self.assembly / f"asset.{self.properties['DocumentKey']}"


class Aws:
    def __init__(self, endpoint: str, proxy: FaultProxy, cfn: CloudFormationEndpoint, synthesized: Synthesized) -> None:
        self.proxy = proxy
        self.cfn = cfn
        self.synthesized = synthesized
        direct = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
        self.ssm = boto3.client("ssm", **direct)
        self.s3 = boto3.client("s3", **direct)
        self.s3.create_bucket(Bucket=synthesized.properties["DocumentBucket"])
        self.session: Any = None

    def reset(self) -> None:
        """Before each test: the document `cdk deploy` uploads, no parameter, nothing counted."""
        self.s3.put_object(Bucket=self.synthesized.properties["DocumentBucket"], Key=self.synthesized.properties["DocumentKey"],
                           Body=self.synthesized.document_file.read_bytes())
        try:
            self.ssm.delete_parameter(Name=NAME)
        except self.ssm.exceptions.ParameterNotFound:
            pass
        self.proxy.reset()
        self.cfn.received.clear()
        self.cfn.tunnels.clear()

    def event(self, kind: str, *, physical: str | None = None, **overrides: Any) -> dict[str, Any]:
        props = {**self.synthesized.properties, **overrides}
        props = {k: v for k, v in props.items() if v is not None}
        event = {
            "RequestType": kind,
            "ServiceToken": FUNCTION_ARN,
            "ResponseURL": self.cfn.url(f"req-{kind}"),
            "StackId": STACK_ID,
            "RequestId": f"req-{kind}",
            "LogicalResourceId": self.synthesized.logical_id,
            "ResourceType": "Custom::RayitoRecipe",
            "ResourceProperties": props,
        }
        if physical:
            event["PhysicalResourceId"] = physical
        if kind == "Update":
            event["OldResourceProperties"] = dict(props)
        return event

    def upload(self, document: dict[str, Any]) -> dict[str, str]:
        """Ship another document, as a deploy of another project would; its properties."""
        import hashlib

        data = canonical_json(document).encode()
        digest = hashlib.sha256(data).hexdigest()
        key = f"{digest}.json"
        self.s3.put_object(Bucket=self.synthesized.properties["DocumentBucket"], Key=key, Body=data)
        self.proxy.reset()
        return {"DocumentKey": key, "DocumentSha256": digest}

    def stored(self) -> str | None:
        try:
            return self.ssm.get_parameter(Name=NAME, WithDecryption=True)["Parameter"]["Value"]
        except self.ssm.exceptions.ParameterNotFound:
            return None

    @property
    def answer(self) -> dict[str, Any]:
        (received,) = self.cfn.received[-1:]
        assert received["host"] == CFN_HOST
        return received["body"]


def run(event: dict[str, Any], context: Context | None = None) -> None:
    """The Lambda runtime's call: the module's handler, its default clients."""
    index.handler(event, context or Context())
