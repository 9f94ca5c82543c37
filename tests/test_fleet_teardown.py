"""FleetTeardown, the construct: what the template holds, the delete order CloudFormation derives
from it, the teardown role's permissions, and the options' limits. The handler is tested in
tests/test_fleet_teardown_handler.py."""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template

from rayito_constructs import AgentFleet, AgentProject, FleetStack

from .cdk_helpers import nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE
from .projects import project_with

TYPE = "Custom::RayitoFleetTeardown"


@pytest.fixture(scope="module")
def example() -> tuple[cdk.App, dict[str, Any]]:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    return app, Template.from_stack(stack).to_json()


def teardown_of(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((logical, resource),) = [(k, r) for k, r in template["Resources"].items() if r["Type"] == TYPE]
    return logical, resource


def function_of(template: dict[str, Any], handler: str = "reconciler.teardown.handler") -> tuple[str, dict[str, Any]]:
    ((logical, resource),) = [(k, r) for k, r in template["Resources"].items()
                              if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == handler]
    return logical, resource


def references(value: Any) -> set[str]:
    """Logical ids a value refers to (Ref, Fn::GetAtt)."""
    found: set[str] = set()
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str) and not value["Ref"].startswith("AWS::"):
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            found.add(value["Fn::GetAtt"][0])
        for item in value.values():
            found |= references(item)
    elif isinstance(value, list):
        for item in value:
            found |= references(item)
    return found


def depends_on(template: dict[str, Any], logical: str) -> set[str]:
    """Everything ``logical`` depends on, directly or not: CloudFormation deletes it before them."""
    resources = template["Resources"]
    seen: set[str] = set()
    todo = [logical]
    while todo:
        current = resources[todo.pop()]
        direct = set(current.get("DependsOn", [])) | references(current.get("Properties", {}))
        for item in direct & set(resources):
            if item not in seen:
                seen.add(item)
                todo.append(item)
    return seen


def test_the_teardown_is_deleted_before_everything_it_needs(example) -> None:
    _, template = example
    logical, resource = teardown_of(template)
    needed = depends_on(template, logical)
    types = {template["Resources"][k]["Type"] for k in needed}
    assert {"AWS::Scheduler::Schedule", "AWS::DynamoDB::Table", "AWS::Lambda::MicrovmImage", "AWS::IAM::Role",
            "AWS::IAM::Policy", "AWS::Lambda::Function", "AWS::Logs::LogGroup"} <= types
    function, _ = function_of(template)
    reconciler, _ = function_of(template, "reconciler.index.handler")
    schedules = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::Scheduler::Schedule"
                 and "Reconciler" in k]
    ledger = [k for k in template["Resources"] if k.startswith("RayitoFleetLedger")]
    assert {function, reconciler, *schedules, *ledger} <= needed
    # The roles it acts with: its own, the schedule's (passed again by UpdateSchedule), the
    # MicroVMs' execution role (passed again by a RunMicrovm of a lost run's token).
    roles = {k for k in needed if template["Resources"][k]["Type"] == "AWS::IAM::Role"}
    assert any("Teardown" in r for r in roles) and any("ScheduleRole" in r for r in roles)
    assert any("ExecutionRole" in r for r in roles)
    # Nothing waits for it: it is the first thing a delete removes.
    assert not [k for k in template["Resources"] if k != logical and logical in depends_on(template, k)]


def test_its_properties_and_environment(example) -> None:
    _, template = example
    logical, resource = teardown_of(template)
    props = resource["Properties"]
    assert props["FleetName"] == "mi-agente" and props["RetainVms"] == "false" and props["FailureMode"] == "warn"
    assert props["LedgerTable"] == {"Ref": [k for k in template["Resources"] if k.startswith("RayitoFleetLedger")][0]}
    function, fn = function_of(template)
    assert props["ServiceToken"] == {"Fn::GetAtt": [function, "Arn"]}
    env = fn["Properties"]["Environment"]["Variables"]
    assert json.loads(env["RESOURCES"]) == {logical: "mi-agente"}
    assert env["FLEET_NAME"] == "mi-agente" and env["STACK_ID"] == {"Ref": "AWS::StackId"}
    assert env["IMAGE_ARN"] == props["ImageArn"] and env["LEDGER_TABLE"] == props["LedgerTable"]
    assert fn["Properties"]["Timeout"] == 600 and int(props["ServiceTimeout"]) == 720
    assert fn["Properties"]["Architectures"] == ["arm64"] and fn["Properties"]["Runtime"] == "python3.14"
    # The reconciler's code asset (the model, the ledger, the tokens), another handler.
    reconciler, rfn = function_of(template, "reconciler.index.handler")
    assert fn["Properties"]["Code"] == rfn["Properties"]["Code"]
    # The schedule tells which fleet it ticks: the teardown disables it only while it is this one's.
    (schedule,) = [r for k, r in template["Resources"].items() if r["Type"] == "AWS::Scheduler::Schedule"
                   and "Reconciler" in k]
    assert json.loads(schedule["Properties"]["Target"]["Input"]) == {"source": "schedule", "fleet": "mi-agente"}


def test_the_role_can_stop_and_end_this_fleet_only(example) -> None:
    _, template = example
    function, fn = function_of(template)
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                 and {"Ref": role} in r["Properties"]["Roles"]]
    by_sid = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(by_sid) == {"Logs", "ListMicrovms", "RunMicrovm", "Microvms", "PassNetworkConnectors",
                           "PassExecutionRole", "Ledger", "ReconcilerSchedule", "PassScheduleRole", "StackStatus"}
    assert by_sid["Ledger"]["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}
    assert by_sid["ReconcilerSchedule"]["Action"] == ["scheduler:GetSchedule", "scheduler:UpdateSchedule"]
    assert by_sid["PassScheduleRole"]["Condition"] == {"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}
    assert by_sid["StackStatus"] == {"Sid": "StackStatus", "Effect": "Allow", "Action": "cloudformation:DescribeStacks",
                                     "Resource": {"Ref": "AWS::StackId"}}
    image = {"Fn::GetAtt": ["FleetImage4D94793D", "ImageArn"]}
    assert by_sid["RunMicrovm"]["Resource"] == image
    actions = [a for s in by_sid.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert not [a for a in actions if a.startswith(("ssm:", "kms:"))]


def test_options_reach_the_resource_and_are_checked() -> None:
    app = new_app()
    stack = FleetStack(app, "Keep", project=AgentProject.load(EXAMPLE), retain_vms_on_delete=True,
                       teardown_failure="fail", **stack_props())
    _, resource = teardown_of(Template.from_stack(stack).to_json())
    assert resource["Properties"]["RetainVms"] == "true" and resource["Properties"]["FailureMode"] == "fail"
    bad = [({"teardown_failure": "loud"}, "teardown_failure: 'loud' is not one of 'warn', 'fail'"),
           ({"teardown_timeout": cdk.Duration.seconds(30)}, "teardown_timeout: 30 s is not within 60 to 900"),
           ({"teardown_timeout": cdk.Duration.minutes(16)}, "teardown_timeout: 960 s is not within 60 to 900"),
           ({"teardown_timeout": 600}, r"teardown_timeout: 600 is not a Duration"),
           # A string is truthy: "false" must not quietly keep every VM running.
           ({"retain_vms_on_delete": "false"}, "retain_vms_on_delete: 'false' is not True or False"),
           ({"retain_vms_on_delete": 1}, "retain_vms_on_delete: 1 is not True or False")]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            AgentFleet(new_stack(new_app()), "F", project=AgentProject.load(EXAMPLE), **options)


def test_no_reconciler_no_teardown() -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), reconciler=False)
    assert fleet.teardown is None
    assert not Template.from_stack(stack).find_resources(TYPE)


def test_a_renamed_fleet_gets_a_new_teardown_and_each_fleet_its_own() -> None:
    """The construct id carries the fleet's name: renaming a fleet in place makes a new resource,
    and the old one's delete ends the old fleet's VMs with the old function."""
    ids = {}
    for name in ("uno", "dos"):
        stack = new_stack(new_app(), "Same")
        AgentFleet(stack, "F", project=project_with(name=name))
        template = Template.from_stack(stack).to_json()
        ids[name] = teardown_of(template)[0]
        reconciler = function_of(template, "reconciler.index.handler")[0]
    assert ids["uno"] != ids["dos"] and reconciler.startswith("FReconcilerFunction")
    stack = new_stack(new_app(), "Two")
    AgentFleet(stack, "A", project=project_with(name="a"))
    AgentFleet(stack, "B", project=project_with(name="b"))
    template = Template.from_stack(stack).to_json()
    teardowns = [r for r in template["Resources"].values() if r["Type"] == TYPE]
    assert sorted(t["Properties"]["FleetName"] for t in teardowns) == ["a", "b"]


def test_a_customer_key_is_used_through_dynamodb_only() -> None:
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), recipe_key=key)
    template = Template.from_stack(stack).to_json()
    _, fn = function_of(template)
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                 and {"Ref": role} in r["Properties"]["Roles"]]
    (tables_key,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "TablesKey"]
    assert tables_key["Condition"] == {"StringEquals": {"kms:ViaService": "dynamodb.us-east-1.amazonaws.com"}}
    assert nag(app) == []


def test_nag_clean(example) -> None:
    app, _ = example
    assert nag(app) == []
