"""ImagePruner, the construct: the image waits for it on every build, its digest follows the
image's properties, its permissions, its limits. The handler is tested in
tests/test_image_pruner_handler.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from rayito_constructs import AgentFleet, AgentImage, AgentProject, FleetStack

from .cdk_helpers import nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE

TYPE = "Custom::RayitoImagePruner"
IMAGE = "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente"


def synth(folder: Path = EXAMPLE, **props) -> tuple[cdk.App, dict]:
    app = new_app()
    stack = new_stack(app)
    from rayito_constructs.agent_image import release_artifact

    from .cdk_helpers import stand_in_rayd

    memory = props.pop("memory_mib", None)
    project = AgentProject.load(folder, **({"memory": memory} if memory else {}))
    AgentImage(stack, "Image", project=project, rayd=release_artifact(stand_in_rayd(), None), **props)
    return app, Template.from_stack(stack).to_json()


def pruner_of(template: dict) -> tuple[str, dict]:
    ((logical, resource),) = [(k, r) for k, r in template["Resources"].items() if r["Type"] == TYPE]
    return logical, resource


def test_the_image_waits_for_the_pruner_before_every_build() -> None:
    app, template = synth()
    logical, resource = pruner_of(template)
    (image,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    assert logical in image["DependsOn"]
    props = resource["Properties"]
    assert props["ImageName"] == "mi-agente" and props["KeepVersions"] == "5" and len(props["ImageDigest"]) == 64
    (fn,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["IMAGE_ARN"] == IMAGE and env["KEEP_VERSIONS"] == "5" and env["IMAGE_NAME"] == "mi-agente"
    assert json.loads(env["RESOURCES"]) == {logical: "mi-agente"}
    assert fn["Properties"]["Handler"] == "reconciler.pruner.handler" and fn["Properties"]["Timeout"] == 600
    # One pass at a time (a deploy's waits for a scheduled one still deleting), and CloudFormation
    # waits for a queued pass: a whole scheduled pass, Lambda's retry backoff, then its own.
    assert fn["Properties"]["ReservedConcurrentExecutions"] == 1
    assert env["DEPLOY_BUDGET_SECONDS"] == "480" and int(props["ServiceTimeout"]) == 2 * 600 + 360
    (schedule,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Scheduler::Schedule"]
    assert schedule["Properties"]["ScheduleExpression"] == "rate(1 hour)"
    # It reads and deletes this image's versions, and lists VMs: nothing else.
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                 and {"Ref": role} in r["Properties"]["Roles"]]
    by_sid = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(by_sid) == {"Logs", "ListMicrovms", "MicrovmImages"}
    assert by_sid["MicrovmImages"]["Action"] == ["lambda:DeleteMicrovmImageVersion", "lambda:GetMicrovmImage",
                                                 "lambda:ListMicrovmImageVersions", "lambda:UpdateMicrovmImageVersion"]
    assert by_sid["MicrovmImages"]["Resource"] == [IMAGE, IMAGE + ":*"]
    assert nag(app) == []


def test_the_digest_changes_exactly_when_the_image_builds(tmp_path) -> None:
    folder = tmp_path / "agent"
    shutil.copytree(EXAMPLE, folder)

    def digest(**props) -> str:
        return pruner_of(synth(folder, **props)[1])[1]["Properties"]["ImageDigest"]

    first = digest()
    assert digest() == first  # same folder, same properties: no build, no room made
    assert digest(keep_image_versions=7) == first  # keep changes the pruner, not the image
    assert digest(memory_mib=8192) != first
    (folder / "serve.py").write_text("print('changed')\n")
    assert digest() != first  # a changed folder is a new zip: a build


@pytest.mark.parametrize("keep", [0, 50, 51, -1, 10**100, True, 2.5, 5.0, float("nan"), float("inf"), "5"])
def test_keep_image_versions_limits(keep) -> None:
    with pytest.raises(ValueError, match=r"keep_image_versions: .* is not a whole number within 1 to 49"):
        synth(keep_image_versions=keep)


@pytest.mark.parametrize("builds", [True, False], ids=["builds-the-image", "builds-none"])
@pytest.mark.parametrize("keep", [0, -5, 51, float("nan"), "3"])
def test_a_bad_keep_is_one_line_from_the_stack(keep, builds) -> None:
    """Through ``FleetStack``, as a user's app meets it: one line that names the option and its
    value, whether or not the stack builds an image (a typo is not silently kept for later)."""
    with pytest.raises(ValueError) as caught:
        FleetStack(new_app(**({} if builds else {"base_artifact": None})), "S", project=AgentProject.load(EXAMPLE),
                   keep_image_versions=keep, **stack_props())
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"keep_image_versions: {keep!r} ")


@pytest.mark.parametrize("keep", [1, 49])
def test_the_limits_themselves_are_accepted(keep) -> None:
    _, resource = pruner_of(synth(keep_image_versions=keep)[1])
    assert resource["Properties"]["KeepVersions"] == str(keep)


def test_none_keeps_every_version_and_the_fleet_passes_it_on() -> None:
    _, template = synth(keep_image_versions=None)
    assert not [r for r in template["Resources"].values() if r["Type"] == TYPE]
    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), keep_image_versions=3)
    assert fleet.image is not None and fleet.image.pruner is not None
    _, resource = pruner_of(Template.from_stack(stack).to_json())
    assert resource["Properties"]["KeepVersions"] == "3"
    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), keep_image_versions=None)
    assert fleet.image.pruner is None


def test_an_image_made_elsewhere_is_never_pruned() -> None:
    stack = new_stack(new_app())
    AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), image_arn=IMAGE.replace("mi-agente", "otra"))
    assert not Template.from_stack(stack).find_resources(TYPE)


def test_the_schedule_is_not_too_often() -> None:
    with pytest.raises(ValueError, match="prune_every: 60 s is more often than every 5 minutes"):
        synth(prune_every=cdk.Duration.minutes(1))


def test_a_scheduled_pass_and_a_deploys_never_overlap_unless_the_account_cannot_reserve() -> None:
    """A scheduled pass still deleting when a deploy's pass answers would leave the image
    UPDATING for the build CloudFormation starts next (a ConflictException fails the deploy).
    Reserved concurrency 1 queues the deploy's pass (CloudFormation invokes asynchronously);
    an account that cannot reserve (``reconciler_reserved_concurrency=None``) reserves for
    neither function."""
    _, template = synth(pruner_reserved_concurrency=None)
    (fn,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert "ReservedConcurrentExecutions" not in fn["Properties"]
    assert int(pruner_of(template)[1]["Properties"]["ServiceTimeout"]) == 660
    for reserved, expected in ((1, 1), (None, None)):
        stack = new_stack(new_app())
        fleet = AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE), reconciler_reserved_concurrency=reserved)
        functions = Template.from_stack(stack).find_resources("AWS::Lambda::Function")
        pruner = functions[stack.get_logical_id(fleet.image.pruner.function.node.default_child)]
        assert pruner["Properties"].get("ReservedConcurrentExecutions") == expected
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="reserved_concurrency: .* is not a whole number of at least 1"):
            synth(pruner_reserved_concurrency=bad)
