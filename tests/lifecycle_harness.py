"""The fleet's lifecycle functions as they run in AWS, here: ``teardown.handler`` and
``pruner.handler`` (the Lambda entry points) with a Lambda context, the clients they build
(``teardown.clients()``, ``pruner.client()``: one attempt per MicroVMs call, the bundled model), the
environment and the resource properties the example stack synthesizes (references swapped for
moto's and the emulator's names), CloudFormation's response endpoint over TLS
(:class:`~tests.recipe_writer_helpers.CloudFormationEndpoint`), moto in server mode for DynamoDB,
EventBridge Scheduler and CloudFormation, and the MicroVMs emulator.

Only time is virtual: the handlers' ``CLOCK``/``SLEEP`` are the emulator's :class:`VirtualClock`, and
the Lambda context's remaining time counts down on it. Everything tests assert comes from the
emulator (VMs, calls), moto (ledger items, the schedule) and what CloudFormation received.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from lambdas.reconciler import pruner, teardown
from rayito_constructs.testing import VirtualClock

from .moto_server import client as aws_client
from .reconciler.harness import Fleet, LambdaContext

TEARDOWN_ARN = "arn:aws:lambda:us-east-1:123456789012:function:MiAgente-FleetTeardown"
PRUNER_ARN = "arn:aws:lambda:us-east-1:123456789012:function:MiAgente-FleetImagePruner"


@lru_cache(maxsize=None)
def synthesized(handler: str, resource_type: str, **overrides: Any) -> dict[str, Any]:
    """The function of ``handler`` and the ``resource_type`` resource, from the example stack."""
    from aws_cdk.assertions import Template

    from rayito_constructs import AgentProject, FleetStack

    from .cdk_helpers import new_app, stack_props
    from .conftest import EXAMPLE

    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **overrides, **stack_props())
    template = Template.from_stack(stack).to_json()
    resources = template["Resources"]
    ((function_id, function),) = [(k, r) for k, r in resources.items() if r["Type"] == "AWS::Lambda::Function"
                                  and r["Properties"].get("Handler") == handler]
    ((logical_id, resource),) = [(k, r) for k, r in resources.items() if r["Type"] == resource_type]
    return {
        "function_id": function_id,
        "env": function["Properties"]["Environment"]["Variables"],
        "timeout": function["Properties"]["Timeout"],
        "logical_id": logical_id,
        "properties": resource["Properties"],
        "depends_on": resource.get("DependsOn", []),
        "resources": resources,
    }


def resolve(value: Any, names: dict[str, Any]) -> Any:
    """The intrinsics the synthesized values use, resolved as CloudFormation would at deploy:
    ``names`` gives ``Ref``/``GetAtt`` values by logical id (``"<id>"`` or ``"<id>.<attribute>"``)."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            return names[arg]
        if key == "Fn::GetAtt":
            return names[f"{arg[0]}.{arg[1]}"]
        if key == "Fn::Join":
            return arg[0].join(str(resolve(v, names)) for v in arg[1])
    if isinstance(value, dict):
        return {k: resolve(v, names) for k, v in value.items()}
    return value


@dataclass
class Answer:
    """One invocation: what CloudFormation received, and the JSON lines printed."""

    body: Optional[dict[str, Any]]
    records: list[dict[str, Any]]
    calls: dict[str, int]

    @property
    def status(self) -> str:
        return (self.body or {}).get("Status", "")

    @property
    def data(self) -> dict[str, str]:
        return (self.body or {}).get("Data", {})

    def report(self) -> dict[str, Any]:
        (line,) = [r for r in self.records if r.get("event") == "teardown"]
        return line


@dataclass
class TeardownWorld:
    """A deployed fleet (its reconciler on the emulator and moto) and its teardown's function."""

    fleet: Fleet
    cfn: Any
    aws: str
    stack_id: str
    schedule_name: str
    env: dict[str, str]
    properties: dict[str, str]
    logical_id: str
    timeout: float = 600.0
    function_arn: str = TEARDOWN_ARN
    answers: list[Answer] = field(default_factory=list)
    _stdout: io.StringIO = field(default_factory=io.StringIO)

    @property
    def clock(self) -> VirtualClock:
        return self.fleet.clock

    @property
    def emulator(self) -> Any:
        return self.fleet.emulator

    def event(self, kind: str, *, physical: Optional[str] = None, logical_id: Optional[str] = None,
              **overrides: Any) -> dict[str, Any]:
        props = {"ServiceToken": self.function_arn, **self.properties, **overrides}
        props = {k: v for k, v in props.items() if v is not None}
        request = f"req-{uuid.uuid4().hex[:8]}"
        event: dict[str, Any] = {
            "RequestType": kind,
            "ServiceToken": self.function_arn,
            "ResponseURL": self.cfn.url(request),
            "StackId": self.stack_id,
            "RequestId": request,
            "LogicalResourceId": logical_id or self.logical_id,
            "ResourceType": teardown.RESOURCE_TYPE,
            "ResourceProperties": props,
        }
        if kind != "Create":
            event["PhysicalResourceId"] = physical or teardown.physical_id(props["FleetName"], props["LedgerTable"])
        if kind == "Update":
            event["OldResourceProperties"] = dict(props)
        return event

    def invoke(self, monkeypatch: Any, event: dict[str, Any], *, timeout: Optional[float] = None,
               env: Optional[dict[str, str]] = None, cold: bool = False, arn: Optional[str] = None) -> Answer:
        """One invocation of ``teardown.handler`` as Lambda makes it (a warm environment keeps
        its clients, as Lambda does; ``cold`` starts a new one)."""
        for key, value in {**self.env, **(env or {})}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(teardown, "CLOCK", self.clock.now)
        monkeypatch.setattr(teardown, "SLEEP", self.clock.advance)
        if cold:
            teardown._CLIENTS = None
        received = len(self.cfn.received)
        before = dict(self.emulator.calls)
        out = self._stdout
        start = out.tell()
        context = LambdaContext(self.clock, float(timeout or self.timeout))
        context.invoked_function_arn = arn or self.function_arn
        with redirect_stdout(out):
            teardown.handler(event, context)
        records = [json.loads(line) for line in out.getvalue()[start:].splitlines() if line.startswith("{")]
        bodies = [r["body"] for r in self.cfn.received[received:]]
        calls = {k: v - before.get(k, 0) for k, v in self.emulator.calls.items() if v != before.get(k, 0)}
        answer = Answer(bodies[-1] if bodies else None, records, calls)
        self.answers.append(answer)
        return answer

    # -------------------------------------------------------------- the stores, as they are

    def ddb(self) -> Any:
        return aws_client("dynamodb", self.aws)

    def tick_item(self) -> dict[str, Any]:
        return self.ddb().get_item(TableName=self.env["LEDGER_TABLE"], ConsistentRead=True,
                                   Key={"fleet": {"S": self.fleet.fleet}, "key": {"S": "#tick"}}).get("Item") or {}

    def claim_item(self) -> dict[str, Any]:
        return self.ddb().get_item(TableName=self.env["LEDGER_TABLE"], ConsistentRead=True,
                                   Key={"fleet": {"S": self.fleet.fleet}, "key": {"S": teardown.CLAIM_KEY}}).get("Item") or {}

    def schedule_state(self) -> str:
        return aws_client("scheduler", self.aws).get_schedule(Name=self.schedule_name)["State"]

    def set_stack_status(self, status: str) -> None:
        """CloudFormation's side: the stack is in ``status`` (moto cannot roll an update back)."""
        from moto.cloudformation.models import cloudformation_backends

        cloudformation_backends["123456789012"]["us-east-1"].stacks[self.stack_id].status = status

    def age_schedule(self, seconds: float) -> None:
        """EventBridge Scheduler's side: the schedule was made ``seconds`` ago (a fleet that was
        there before this stack operation)."""
        from moto.scheduler.models import scheduler_backends

        backend = scheduler_backends["123456789012"]["us-east-1"]
        schedule = backend.schedule_groups["default"].schedules[self.schedule_name]
        schedule.creation_date = time.time() - seconds


def teardown_world(fleet: Fleet, cfn: Any, aws: str, *, timeout: float = 600, **overrides: Any) -> TeardownWorld:
    """The example stack's teardown for ``fleet``: a schedule and a stack in moto stand for the
    reconciler's schedule and the stack; the rest of the environment is the synthesized one."""
    made = synthesized("reconciler.teardown.handler", teardown.RESOURCE_TYPE, **overrides)
    suffix = uuid.uuid4().hex[:8]
    schedule_name = f"MiAgente-FleetReconcilerSchedule-{suffix}"
    aws_client("scheduler", aws).create_schedule(
        Name=schedule_name, ScheduleExpression="rate(1 minute)", FlexibleTimeWindow={"Mode": "OFF"},
        Target={"Arn": "arn:aws:lambda:us-east-1:123456789012:function:MiAgenteReconciler",
                "RoleArn": "arn:aws:iam::123456789012:role/MiAgente-ReconcilerScheduleRole",
                "Input": json.dumps({"source": "schedule", "fleet": fleet.fleet}),
                "RetryPolicy": {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}})
    stack_id = aws_client("cloudformation", aws).create_stack(
        StackName=f"MiAgente-{suffix}",
        TemplateBody=json.dumps({"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}),
    )["StackId"]
    names: dict[str, Any] = {"AWS::StackId": stack_id, f"{made['function_id']}.Arn": TEARDOWN_ARN}
    resources = made["resources"]
    for logical, resource in resources.items():
        if resource["Type"] == "AWS::DynamoDB::Table" and "Ledger" in logical:
            names[logical] = fleet.env["LEDGER_TABLE"]
        if resource["Type"] == "AWS::Scheduler::Schedule" and "Reconciler" in logical:
            names[logical] = schedule_name
        if resource["Type"] == "AWS::Lambda::MicrovmImage":
            names[f"{logical}.ImageArn"] = fleet.image
    env = {k: str(resolve(v, names)) for k, v in made["env"].items()}
    assert env["FLEET_NAME"] == fleet.fleet, "the example fleet's teardown"
    env.update({k: v for k, v in fleet.env.items() if k.startswith("AWS_")})
    env.update({"AWS_ENDPOINT_URL_SCHEDULER": aws, "AWS_ENDPOINT_URL_CLOUDFORMATION": aws,
                "AWS_ENDPOINT_URL_DYNAMODB": aws, **cfn.environ()})
    properties = {k: resolve(v, names) for k, v in made["properties"].items() if k != "ServiceToken"}
    return TeardownWorld(fleet=fleet, cfn=cfn, aws=aws, stack_id=stack_id, schedule_name=schedule_name, env=env,
                         properties=properties, logical_id=made["logical_id"], timeout=timeout)


# ------------------------------------------------------------------ the pruner


@dataclass
class PrunerWorld:
    """An image on the emulator and its pruner's function, as the example stack synthesizes it."""

    emulator: Any
    clock: VirtualClock
    cfn: Any
    image_name: str
    env: dict[str, str]
    properties: dict[str, str]
    logical_id: str
    function_arn: str = PRUNER_ARN
    _stdout: io.StringIO = field(default_factory=io.StringIO)

    @property
    def image_arn(self) -> str:
        return self.emulator.image_arn(self.image_name)

    def event(self, kind: str, *, old_digest: Optional[str] = None, **overrides: Any) -> dict[str, Any]:
        props = {"ServiceToken": self.function_arn, **self.properties, **overrides}
        request = f"req-{uuid.uuid4().hex[:8]}"
        event: dict[str, Any] = {
            "RequestType": kind, "ServiceToken": self.function_arn, "ResponseURL": self.cfn.url(request),
            "StackId": self.env["STACK_ID"], "RequestId": request, "LogicalResourceId": self.logical_id,
            "ResourceType": pruner.RESOURCE_TYPE, "ResourceProperties": props,
        }
        if kind != "Create":
            event["PhysicalResourceId"] = f"rayito-pruner:{self.image_arn}"
        if kind == "Update":
            event["OldResourceProperties"] = {**props, "ImageDigest": old_digest or props["ImageDigest"]}
        return event

    def invoke(self, monkeypatch: Any, event: dict[str, Any], *, timeout: float = 300.0,
               env: Optional[dict[str, str]] = None) -> tuple[Optional[dict[str, Any]], Optional[dict[str, Any]], list[dict]]:
        """``pruner.handler`` once: (what it returned, what CloudFormation received, its log lines)."""
        for key, value in {**self.env, **(env or {})}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(pruner, "CLOCK", self.clock.now)
        monkeypatch.setattr(pruner, "SLEEP", self.clock.advance)
        pruner._CLIENT = None
        received = len(self.cfn.received)
        out = self._stdout
        start = out.tell()
        context = LambdaContext(self.clock, timeout)
        context.invoked_function_arn = self.function_arn
        with redirect_stdout(out):
            result = pruner.handler(event, context)
        records = [json.loads(line) for line in out.getvalue()[start:].splitlines() if line.startswith("{")]
        bodies = [r["body"] for r in self.cfn.received[received:]]
        return result, (bodies[-1] if bodies else None), records


def pruner_world(emulator: Any, clock: VirtualClock, cfn: Any, image_name: str = "mi-agente",
                 **overrides: Any) -> PrunerWorld:
    made = synthesized("reconciler.pruner.handler", pruner.RESOURCE_TYPE, **overrides)
    stack_id = "arn:aws:cloudformation:us-east-1:123456789012:stack/MiAgente/0d5c5a40-0000-11f0-9000-0a1b2c3d4e5f"
    names: dict[str, Any] = {"AWS::StackId": stack_id, "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
                             "AWS::Partition": "aws", f"{made['function_id']}.Arn": PRUNER_ARN}
    env = {k: str(resolve(v, names)) for k, v in made["env"].items()}
    assert env["IMAGE_ARN"] == emulator.image_arn(image_name), env["IMAGE_ARN"]
    env.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": emulator.endpoint_url, **cfn.environ(),
    })
    properties = {k: resolve(v, names) for k, v in made["properties"].items() if k != "ServiceToken"}
    return PrunerWorld(emulator=emulator, clock=clock, cfn=cfn, image_name=image_name, env=env,
                       properties=properties, logical_id=made["logical_id"])
