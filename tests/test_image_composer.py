"""ImageComposer: the agent image over a base published in the account, composed at deploy.

What the stack declares: the composer's resource and properties, its function and least-privilege
role (one Sid per statement), the image taking its code and managed base from the composer's
answer, and the order CloudFormation runs them in. The handler itself:
tests/test_image_composer_handler.py.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from rayito_constructs import AgentFleet, AgentImage, AgentProject, PublishedBaseImage
from rayito_constructs.image_composition import build_context
from rayito_constructs.permissions import BASE_IMAGE_ACTIONS

from .cdk_helpers import PRODUCT_HOOKS, lint_template, nag, new_app, new_stack
from .conftest import EXAMPLE

ACCOUNT = "123456789012"
ASSETS = f"cdk-hnb659fds-assets-{ACCOUNT}-us-east-1"


def synth(project: Any = None, **props: Any) -> tuple[Any, AgentImage, Template]:
    app = new_app(base_artifact=None)
    stack = new_stack(app)
    props.setdefault("rayd", PublishedBaseImage())
    image = AgentImage(stack, "Image", project=project or AgentProject.load(EXAMPLE), **props)
    return app, image, Template.from_stack(stack)


def only(template: Template, kind: str) -> tuple[str, dict[str, Any]]:
    ((logical, resource),) = template.find_resources(kind).items()
    return logical, resource


def statements(template: Template, role_logical: str) -> dict[str, dict[str, Any]]:
    policies = [p for p in template.find_resources("AWS::IAM::Policy").values()
                if {"Ref": role_logical} in p["Properties"]["Roles"]]
    return {s["Sid"]: s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]}


def pinned_folder(tmp_path, pin: str) -> str:
    import shutil

    folder = tmp_path / "agent"
    shutil.copytree(EXAMPLE, folder)
    with (folder / "rayito-agent.toml").open("a") as toml:
        toml.write(f'\n[deploy]\nbase_image_version = "{pin}"\n')
    return str(folder)


def test_the_image_takes_its_code_and_managed_base_from_the_composer() -> None:
    app, image, template = synth()
    composer_id, composer = only(template, "Custom::RayitoImageComposer")
    _, resource = only(template, "AWS::Lambda::MicrovmImage")
    p = resource["Properties"]
    assert p["CodeArtifact"] == {"Uri": {"Fn::GetAtt": [composer_id, "ArtifactUri"]}}
    assert p["BaseImageArn"] == {"Fn::GetAtt": [composer_id, "ManagedBaseImageArn"]}
    assert p["BaseImageVersion"] == {"Fn::GetAtt": [composer_id, "ManagedBaseImageVersion"]}
    # Declared as rayito setup --caps-image publishes rayito-base-caps; the composer checks the version.
    assert p["Hooks"] == PRODUCT_HOOKS and p["AdditionalOsCapabilities"] == ["ALL"]
    assert p["CpuConfigurations"] == [{"Architecture": "ARM_64"}]
    props = composer["Properties"]
    declared = json.loads(props["Inherits"])
    assert declared["additionalOsCapabilities"] == ["ALL"] and declared["hooks"]["port"] == 9000
    assert sorted(declared) == ["additionalOsCapabilities", "cpuConfigurations", "hooks"]
    assert (props["ImageName"], props["BaseImageName"], props["BaseImageVersion"]) == (
        "mi-agente", "rayito-base-caps", "")
    assert props["ArtifactBucket"] == props["BuildContextBucket"] == ASSETS
    assert props["ArtifactPrefix"] == "rayito/templates/mi-agente"
    # Nothing composed at synth: the build context travels, no zip with rayd does.
    assert image.code is None and image.composer is not None
    assert props["BuildContextKey"] == f"{image.composer.build_context.asset_hash}.zip"


def test_the_build_context_is_the_projects_side_of_the_composition() -> None:
    import hashlib

    project = AgentProject.load(EXAMPLE)
    _, image, template = synth(project)
    _, composer = only(template, "Custom::RayitoImageComposer")
    expected = build_context(project.product)
    assert composer["Properties"]["BuildContextSha256"] == hashlib.sha256(expected).hexdigest()


def test_the_composer_function_and_its_least_privilege_role() -> None:
    app, image, template = synth()
    functions = {k: r for k, r in template.find_resources("AWS::Lambda::Function").items()
                 if r["Properties"]["Handler"] == "reconciler.composer.handler"}
    ((function_id, function),) = functions.items()
    composer_id, composer = only(template, "Custom::RayitoImageComposer")
    f = function["Properties"]
    assert (f["Runtime"], f["Architectures"], f["Timeout"], f["MemorySize"]) == ("python3.14", ["arm64"], 300, 2048)
    assert f["Environment"]["Variables"]["IMAGE_NAME"] == "mi-agente"
    assert json.loads(f["Environment"]["Variables"]["RESOURCES"]) == {composer_id: "mi-agente"}
    assert len(f["Layers"]) == 1  # the product layer: the product's build functions
    assert composer["Properties"]["ServiceToken"] == {"Fn::GetAtt": [function_id, "Arn"]}
    role_id = f["Role"]["Fn::GetAtt"][0]
    found = statements(template, role_id)
    assert set(found) == {"Logs", "BaseImage", "ReadBaseArtifacts", "ReadBuildContext", "ComposedArtifacts"}
    base = f"arn:aws:lambda:us-east-1:{ACCOUNT}:microvm-image:rayito-base-caps"
    assert sorted(found["BaseImage"]["Action"]) == sorted(BASE_IMAGE_ACTIONS)
    assert found["BaseImage"]["Resource"] == [base, f"{base}:*"]
    assert found["ReadBaseArtifacts"]["Action"] == "s3:GetObject"
    assert found["ReadBaseArtifacts"]["Resource"] == f"arn:aws:s3:::rayito-artifacts-{ACCOUNT}-us-east-1/rayito/images/*"
    key = composer["Properties"]["BuildContextKey"]
    assert found["ReadBuildContext"] == {"Sid": "ReadBuildContext", "Action": "s3:GetObject", "Effect": "Allow",
                                         "Resource": f"arn:aws:s3:::{ASSETS}/{key}"}
    assert sorted(found["ComposedArtifacts"]["Action"]) == ["s3:GetObject", "s3:PutObject"]
    assert found["ComposedArtifacts"]["Resource"] == f"arn:aws:s3:::{ASSETS}/rayito/templates/mi-agente/*"
    # The build role reads only this image's composed zips.
    stack = cdk.Stack.of(image)
    build = statements(template, stack.resolve(stack.get_logical_id(image.build_role.node.default_child)))
    assert build["ReadCode"]["Resource"] == f"arn:aws:s3:::{ASSETS}/rayito/templates/mi-agente/*"
    assert nag(app) == []
    assert lint_template(template) == []


def test_the_order_cloudformation_runs_them_in() -> None:
    _, image, template = synth()
    composer_id, composer = only(template, "Custom::RayitoImageComposer")
    role_id = next(k for k, r in template.find_resources("AWS::IAM::Role").items()
                   if "image composer" in r["Properties"]["Description"])
    policy_id = next(k for k, r in template.find_resources("AWS::IAM::Policy").items()
                     if {"Ref": role_id} in r["Properties"]["Roles"])
    # Composed once its role may read and write; the image builds on its answer (Fn::GetAtt),
    # after its build role, its log group and the pruner.
    assert {role_id, policy_id} <= set(composer["DependsOn"])
    _, resource = only(template, "AWS::Lambda::MicrovmImage")
    assert composer_id in json.dumps(resource["Properties"])
    pruner_id, _ = only(template, "Custom::RayitoImagePruner")
    assert pruner_id in resource["DependsOn"]
    assert composer_id not in json.dumps(template.find_resources("Custom::RayitoImagePruner"))


def test_the_pruner_sees_a_new_build_when_the_composers_inputs_change(tmp_path) -> None:
    def digest(**props: Any) -> str:
        _, _, template = synth(**props)
        _, pruner = only(template, "Custom::RayitoImagePruner")
        return str(pruner["Properties"]["ImageDigest"])

    assert digest() == digest()
    assert digest(rayd=PublishedBaseImage(version="3")) != digest()


@pytest.mark.parametrize(("rayd", "pin", "expected"), [
    (PublishedBaseImage(), "3", "3"),                      # the product's pin, [deploy] base_image_version
    (PublishedBaseImage(version="4.0"), "3", "4.0"),       # the option wins
    (PublishedBaseImage(), "latest", ""),                  # the product's word for the newest ACTIVE
])
def test_the_base_version_to_compose_on(tmp_path, rayd, pin, expected) -> None:
    _, _, template = synth(AgentProject.load(pinned_folder(tmp_path, pin)), rayd=rayd)
    _, composer = only(template, "Custom::RayitoImageComposer")
    assert composer["Properties"]["BaseImageVersion"] == expected


@pytest.mark.parametrize(("rayd", "message"), [
    (PublishedBaseImage(name="rayito-base"),
     "rayd: the base image 'rayito-base' is not the project's base 'rayito-base-caps' ([image] base), which rayito "
     "agent deploy composes on; set [image] base = 'rayito-base'"),
    (PublishedBaseImage(version="three"),
     "rayd: the base version 'three' is not a version such as '3' or '3.0' (none: the newest ACTIVE one when the "
     "composer runs)"),
    ("account", "rayd: str is not a rayito.cdk.MicrovmImageArtifact, a rayito.cdk.RayitoMicrovmImage or a "
                "rayito_constructs.PublishedBaseImage"),
])
def test_refused_at_synth_in_one_line(rayd, message) -> None:
    with pytest.raises(ValueError) as raised:
        synth(rayd=rayd)
    assert str(raised.value) == message


def test_a_fleet_composes_at_deploy_from_the_context_key() -> None:
    app = new_app(base_artifact=None, base_image="rayito-base-caps")
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))
    template = Template.from_stack(stack)
    assert fleet.image is not None and fleet.image.composer is not None
    template.has_resource_properties("Custom::RayitoImageComposer", {
        "ImageName": "mi-agente", "BaseImageName": "rayito-base-caps",
        "ArtifactPrefix": "rayito/templates/mi-agente", "Inherits": Match.any_value()})
    # The fleet's own variables still reach every process rayd starts: in the build context.
    assert fleet.image.template_env.get("RAYITO_EGRESS_BUDGET_TABLE") == "rayito-egress-mi-agente"


def test_without_opting_in_the_fleet_still_builds_no_image() -> None:
    app = new_app(base_artifact=None)
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))
    assert fleet.image is None
    template = Template.from_stack(stack)
    template.resource_count_is("Custom::RayitoImageComposer", 0)


def test_a_release_zip_and_a_published_base_at_once() -> None:
    from .cdk_helpers import stand_in_rayd

    app = new_app(base_artifact=stand_in_rayd(), base_image="rayito-base-caps")
    stack = new_stack(app)
    with pytest.raises(ValueError, match=r"^base_artifact, base_image: give one of them"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))
