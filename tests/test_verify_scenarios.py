"""``verify`` in worlds of their own: other stack names and regions, stacks that are not fleets or
are half deployed, fleets without their optional parts, several fleets in one stack, and faults that
cannot be undone (a deleted table, a terminated VM). Each test deploys what it needs into a fresh
moto and emulator (tests/verify_world.py)."""

from __future__ import annotations

import copy
import json
import time
from typing import Any, Iterator

import pytest

from rayito_constructs import AgentProject
from rayito_constructs.verify import Status, TargetNotFound

from . import verify_world as vw
from .conftest import EXAMPLE
from .verify_world import finding, statuses

FLEET = "mi-agente"
STACK = "RayitoFleet-mi-agente"


@pytest.fixture(scope="module")
def example() -> vw.Assembly:
    return vw.synth("example", vw.fleet_stack(AgentProject.load(EXAMPLE), metrics=True))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, example: vw.Assembly) -> Iterator[vw.World]:
    """A world of its own, the example deployed (not converged)."""
    with vw.world(monkeypatch) as world:
        world.deploy(example)
        yield world


def test_found_by_stack_name_and_by_fleet_output(monkeypatch: pytest.MonkeyPatch, example: vw.Assembly) -> None:
    with vw.world(monkeypatch) as world:
        world.deploy(example, stack_name="renamed-stack")
        by_output = world.verify(FLEET)  # no RayitoFleet-mi-agente: the stack whose FleetName says so
        by_name = world.verify("renamed-stack")
        stack_id = world.moto("cloudformation").describe_stacks(StackName="renamed-stack")["Stacks"][0]["StackId"]
        by_arn = world.verify(stack_id)
    assert by_arn.stack == "renamed-stack" and by_arn.fleet == FLEET
    assert by_output.stack == "renamed-stack" and by_output.fleet == FLEET
    assert by_name.stack == "renamed-stack" and by_name.fleet == FLEET


def test_stack_in_another_region(monkeypatch: pytest.MonkeyPatch, example: vw.Assembly) -> None:
    with vw.world(monkeypatch) as world:
        world.deploy(example, region="eu-west-1")
        with pytest.raises(TargetNotFound) as caught:
            world.verify(FLEET, region="us-east-1")
        assert "it exists in eu-west-1: pass --region eu-west-1" in str(caught.value)
        report = world.verify(FLEET, region="eu-west-1")
        assert report.stack == STACK and report.region == "eu-west-1"
        assert finding(report, "region").status is Status.OK


def test_a_stack_that_is_not_a_fleet(fresh: vw.World) -> None:
    fresh.moto("cloudformation").create_stack(StackName="plain", TemplateBody=json.dumps({
        "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}}}))
    with pytest.raises(TargetNotFound) as caught:
        fresh.verify("plain")
    assert "holds no rayito fleet" in str(caught.value)


def test_partially_deployed_stack(monkeypatch: pytest.MonkeyPatch, example: vw.Assembly) -> None:
    """Only some of the fleet's resources exist and the stack is still being created: every check
    says what is missing, none crashes."""
    keep = ("AWS::Lambda::MicrovmImage", "AWS::IAM::Role", "AWS::IAM::ManagedPolicy", "AWS::DynamoDB::Table")
    partial = copy.deepcopy(example.template)
    partial["Resources"] = {k: v for k, v in partial["Resources"].items()
                            if v["Type"] in keep and "SandboxLauncher" not in k and "Publisher" not in k}
    for resource in partial["Resources"].values():
        resource.pop("DependsOn", None)
    partial["Outputs"] = {k: v for k, v in partial["Outputs"].items()
                          if k in ("FleetName", "ImageArn", "ExecutionRoleArn", "CallerPolicyArn")}

    def in_progress(parsed: dict[str, Any], **_: Any) -> None:
        for stack in parsed.get("Stacks", []):
            stack["StackStatus"] = "CREATE_IN_PROGRESS"

    with vw.world(monkeypatch) as world:
        world.deploy(example, stack_name="half-deployed", template=partial)
        report = world.verify("half-deployed", session=world.session(
            hooks=[lambda ev: ev.register("after-call.cloudformation.DescribeStacks", in_progress)]))
    got = statuses(report)
    assert got["stack"] == "WARN" and "in progress" in finding(report, "stack").summary
    assert got["iam.SandboxLauncherPolicy"] == "FAIL" and "not deployed" in finding(report, "iam.SandboxLauncherPolicy").summary
    assert got["reconciler"] == "WARN" and "not deployed" in finding(report, "reconciler").summary
    assert got["recipe"] == "WARN" and "not saved" in finding(report, "recipe").summary
    assert not any("internal error" in f.summary for f in report.findings)


def test_a_missing_recipe_and_why(fresh: vw.World) -> None:
    name = fresh.outputs(STACK)["RecipeParameterName"]
    fresh.moto("ssm").delete_parameter(Name=name)
    group = fresh.physical(STACK, "RayitoRecipeWriterLogs", "AWS::Logs::LogGroup")
    fresh.put_log(group, [json.dumps({"action": "Update", "error": "ClientError AccessDeniedException"})])
    report = fresh.verify(FLEET)
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "not in Parameter Store" in recipe.summary
    assert "AccessDeniedException" in recipe.summary


def test_a_fleet_below_min_vms_and_a_stray(fresh: vw.World) -> None:
    fresh.converge(STACK)
    image = fresh.outputs(STACK)["ImageArn"]
    stray = fresh.microvms.run_microvm(imageIdentifier=image)["microvmId"]
    fresh.tick(STACK)  # the reconciler notes the stray in its ledger (it never touches it)
    report = fresh.verify(FLEET)
    fleet = finding(report, "reconciler.fleet")
    assert fleet.status is Status.WARN and stray in fleet.summary and fleet.data["strays"] == [stray]
    assert "the reconciler first saw one 0 min ago" in fleet.summary
    base = next(vm["microvmId"] for vm in fresh.emulator.microvms() if vm["state"] == "RUNNING" and vm["microvmId"] != stray)
    fresh.microvms.terminate_microvm(microvmIdentifier=base)
    time.sleep(0.3)
    report = fresh.verify(FLEET)
    fleet = finding(report, "reconciler.fleet")  # minutes after a deploy, a deficit is the fleet coming up
    assert fleet.status is Status.WARN and "still coming up" in fleet.summary
    later = time.time() + 400
    report = fresh.verify(FLEET, clock=lambda: later)
    fleet = finding(report, "reconciler.fleet")
    assert fleet.status is Status.FAIL and "below min_vms" in fleet.summary and fleet.data["base_live"] == 0


def test_egress_table_gone(fresh: vw.World) -> None:
    fresh.moto("dynamodb").delete_table(TableName=fresh.outputs(STACK)["EgressBudgetTableName"])
    report = fresh.verify(FLEET)
    egress = finding(report, "egress")
    assert egress.status is Status.FAIL and "does not exist" in egress.summary


def test_a_newer_version_than_the_reconciler_runs(fresh: vw.World) -> None:
    fresh.emulator.publish_version(FLEET, "2.0", fresh=False)
    report = fresh.verify(FLEET)
    version = finding(report, "image.version")
    assert version.status is Status.WARN and "newer active version 2.0" in version.summary
    assert finding(report, "image").data["latest_active"] == "2.0"


def test_a_deploy_that_could_not_save_the_recipe(monkeypatch: pytest.MonkeyPatch, example: vw.Assembly) -> None:
    """The writer never fails a deploy (product page): the stack says what happened, verify says why."""
    with vw.world(monkeypatch) as world:
        world.recipe_fault = ("recipe_access_denied", "PutParameter: AccessDeniedException")
        world.deploy(example)
        assert world.outputs(STACK)["RecipeOutcome"] == "recipe_access_denied"
        report = world.verify(FLEET)
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "recipe_access_denied" in recipe.summary
    assert "AccessDeniedException" in recipe.summary and "writer's role" in recipe.fix
