"""AgentImage is the product's agent image: what ``rayito agent deploy`` publishes for the project.

The proof that matters is the first one: the zip composed at synth is byte for byte the zip the
product's own, unmodified ``ProjectService.build`` uploads, run against the MicroVMs emulator
and moto, for the example and for projects ``rayito agent init`` scaffolds.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from aws_cdk.assertions import Template

from rayito_constructs import AgentFleet, AgentImage, AgentProject
from rayito_constructs.image_composition import (
    PRODUCT_FUNCTIONS,
    compose_artifact,
    has_rayd,
    template_env_of,
)

from .cdk_helpers import PRODUCT_HOOKS, lint_template, nag, new_app, new_stack
from .cdk_helpers import stand_in_base_zip as base_zip
from .conftest import EXAMPLE


@pytest.fixture
def release(tmp_path) -> Any:
    from rayito.cdk import MicrovmImageArtifact

    path = tmp_path / "rayito-image.zip"
    path.write_bytes(base_zip())
    return MicrovmImageArtifact.from_file(path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def copy_example(tmp_path: Path, **replace: str) -> Path:
    folder = tmp_path / "agent"
    shutil.copytree(EXAMPLE, folder)
    toml = folder / "rayito-agent.toml"
    text = toml.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    toml.write_text(text)
    return folder


def scaffold(tmp_path: Path, runtime: str) -> Path:
    folder = tmp_path / runtime
    done = subprocess.run([sys.executable, "-m", "rayito.cli", "agent", "init", str(folder), "--runtime", runtime,
                           "--region", "us-east-1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return folder


def synth_image(project: Any, rayd: Any, **props: Any) -> tuple[Any, Any, Template]:
    app = new_app()
    stack = new_stack(app)
    props.setdefault("keep_image_versions", None)  # the pruner: tests/test_image_pruner.py
    image = AgentImage(stack, "Image", project=project, rayd=rayd, **props)
    return app, image, Template.from_stack(stack)


# ------------------------------------------------------------------ the product's own build


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from .moto_server import moto_server

    with moto_server() as url:
        yield url


@pytest.fixture
def product_world(moto_endpoint, monkeypatch) -> Iterator[Any]:
    """The emulator (builds done at once) and moto for S3, STS and Logs, with the base
    ``rayito-base-caps`` published as ``rayito setup --caps-image`` leaves it: its zip in S3."""
    import boto3

    from rayito_constructs.testing import MicrovmsEmulator

    for name, value in {"AWS_ENDPOINT_URL_S3": moto_endpoint, "AWS_ENDPOINT_URL_STS": moto_endpoint,
                        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    with MicrovmsEmulator(image_build_seconds=0, consistency_seconds=0) as emulator:
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA_MICROVMS", emulator.endpoint_url)
        session = boto3.Session()
        s3 = session.client("s3")
        for bucket in ("rayito-artifacts-base", "rayito-artifacts-agent"):
            try:
                s3.create_bucket(Bucket=bucket)
            except s3.exceptions.BucketAlreadyOwnedByYou:
                pass
        s3.put_object(Bucket="rayito-artifacts-base", Key="rayito/images/base.zip", Body=base_zip())
        microvms = session.client("lambda-microvms")
        if not any(i["name"] == "rayito-base-caps" for i in microvms.list_microvm_images()["items"]):
            microvms.create_microvm_image(
                name="rayito-base-caps", baseImageArn="arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1",
                baseImageVersion="1", buildRoleArn="arn:aws:iam::123456789012:role/rayito-build",
                codeArtifact={"uri": "s3://rayito-artifacts-base/rayito/images/base.zip"},
                additionalOsCapabilities=["ALL"], hooks=json.loads(json.dumps(_api_hooks())),
                cpuConfigurations=[{"architecture": "ARM_64"}])
        yield session


def _api_hooks() -> dict[str, Any]:
    from rayito._images_publish_domain import IMAGE_HOOKS

    return IMAGE_HOOKS


def product_upload(session: Any, folder: Path) -> tuple[bytes, dict[str, Any]]:
    """What the product's unmodified ``ProjectService.build`` uploads for ``folder``, and the
    image it creates."""
    from rayito import AgentProject as ProductProject
    from rayito._agent._project_service import ProjectService

    project = ProductProject.load(str(folder))
    # force=True skips the reuse lookup: it lists the versions of an image that does not exist
    # yet, which the emulator answers with ResourceNotFoundException (the upload is the same).
    info = ProjectService(project).build(bucket="rayito-artifacts-agent", session=session, region="us-east-1",
                                         timeout=60, force=True)
    microvms = session.client("lambda-microvms")
    version = str(info.build_id).split("/", 1)[0]
    image = microvms.get_microvm_image_version(imageIdentifier=str(info.template_id), imageVersion=version)
    bucket, _, key = image["codeArtifact"]["uri"][len("s3://"):].partition("/")
    data = session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    assert key == f"rayito/templates/{hashlib.sha256(data).hexdigest()}.zip"
    return data, image


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_composed_zip_is_what_the_products_build_uploads(product_world, tmp_path, release) -> None:
    folder = copy_example(tmp_path)
    uploaded, created = product_upload(product_world, folder)
    project = AgentProject.load(folder)
    composed = compose_artifact(project.product, base_zip())
    assert entries(composed) == entries(uploaded)  # a readable diff first
    assert composed == uploaded
    # The construct's asset holds those very bytes, and declares what the product's build sent.
    _, image, template = synth_image(project, release)
    assert image.artifact_sha256 == hashlib.sha256(uploaded).hexdigest()
    (resource,) = template.find_resources("AWS::Lambda::MicrovmImage").values()
    p = resource["Properties"]
    assert p["Hooks"] == PRODUCT_HOOKS
    assert created["hooks"]["port"] == p["Hooks"]["Port"] == 9000
    assert p["AdditionalOsCapabilities"] == created["additionalOsCapabilities"] == ["ALL"]
    assert p["Resources"] == [{"MinimumMemoryInMiB": created["resources"][0]["minimumMemoryInMiB"]}]
    assert p["Logging"] == {"CloudWatch": {"LogGroup": created["logging"]["cloudWatch"]["logGroup"]}}
    assert p["CpuConfigurations"] == [{"Architecture": "ARM_64"}]
    assert p["BaseImageVersion"] == "1"


@pytest.mark.parametrize("runtime", ["strands", "custom", "deepagents"])
def test_scaffolds_compose_as_the_product_builds_them(product_world, tmp_path, runtime) -> None:
    folder = scaffold(tmp_path, runtime)
    uploaded, _ = product_upload(product_world, folder)
    assert compose_artifact(AgentProject.load(folder).product, base_zip()) == uploaded


def test_the_fleets_variables_go_to_the_template_env_and_nothing_else_changes() -> None:
    project = AgentProject.load(EXAMPLE)
    plain = compose_artifact(project.product, base_zip())
    with_env = compose_artifact(project.product, base_zip(), template_env={"RAYITO_METRICS": "off"})
    # The product's own variables (its OpenCode switches) stay; ours are added beside them.
    assert template_env_of(with_env) == {**template_env_of(plain), "RAYITO_METRICS": "off"}
    assert "RAYITO_METRICS" not in template_env_of(plain)
    assert has_rayd(with_env) and has_rayd(plain)
    # The project's [env] is the run payload's, never baked.
    assert "GREETING" not in template_env_of(with_env)


def test_same_project_same_bytes_same_asset(release) -> None:
    project = AgentProject.load(EXAMPLE)
    assert compose_artifact(project.product, base_zip()) == compose_artifact(project.product, base_zip())
    _, first, one = synth_image(project, release)
    _, second, two = synth_image(project, release)
    assert first.artifact_sha256 == second.artifact_sha256
    assert one.to_json() == two.to_json()


def test_product_functions_still_exist() -> None:
    assert all(callable(f) for f in PRODUCT_FUNCTIONS)


def test_the_image_passes_the_gates(release) -> None:
    app, _, template = synth_image(AgentProject.load(EXAMPLE), release, template_env={"A": "1"})
    assert lint_template(template) == [] and nag(app) == []
    (group,) = template.find_resources("AWS::Logs::LogGroup").values()
    assert group["Properties"]["LogGroupName"] == "/rayito/mi-agente"


def test_a_rayito_microvm_image_of_the_app_gives_rayd_and_its_configuration(tmp_path, release) -> None:
    from rayito.cdk import RayitoMicrovmImage

    app = new_app()
    stack = new_stack(app)
    base = RayitoMicrovmImage(stack, "Base", name="team-base", artifact=release, base_image_version="1",
                              os_capabilities=True, environment={"TEAM": "a"})
    image = AgentImage(stack, "Image", project=AgentProject.load(EXAMPLE), rayd=base, keep_image_versions=None)
    template = Template.from_stack(stack)
    images = template.find_resources("AWS::Lambda::MicrovmImage")
    ours = next(v for k, v in images.items() if k.startswith("Image"))
    theirs = next(v for k, v in images.items() if k.startswith("Base"))
    for key in ("Hooks", "AdditionalOsCapabilities", "EnvironmentVariables", "BaseImageArn", "BaseImageVersion",
                "CpuConfigurations"):
        assert ours["Properties"][key] == theirs["Properties"][key], key
    assert any(d.startswith("Base") for d in ours["DependsOn"])
    assert image.artifact_sha256 == hashlib.sha256(
        compose_artifact(AgentProject.load(EXAMPLE).product, base_zip())).hexdigest()


def test_the_fleet_builds_it_from_rayd_and_bakes_its_own_variables(release) -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), rayd=release, metrics=True)
    assert fleet.image is not None
    env = fleet.image.template_env
    assert env["RAYITO_EGRESS_BUDGET_TABLE"] == "rayito-egress-mi-agente"
    assert set(env) == {"RAYITO_EGRESS_BUDGET_TABLE", "RAYITO_METRICS", "RAYITO_EGRESS_ENVELOPES"} or len(env) == 3
    template = Template.from_stack(stack)
    tables = template.find_resources("AWS::DynamoDB::Table")
    assert any(t["Properties"].get("TableName") == "rayito-egress-mi-agente" for t in tables.values())


def test_without_rayd_the_fleet_builds_no_image() -> None:
    app = new_app(base_artifact=None)
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))
    assert fleet.image is None
    assert Template.from_stack(stack).find_resources("AWS::Lambda::MicrovmImage") == {}


# ------------------------------------------------------------------ one-line refusals


def refusal(call: Any) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_a_reserved_image_name(tmp_path, release) -> None:
    folder = copy_example(tmp_path, **{'name = "mi-agente"': 'name = "rayito-base-mine"'})
    message = refusal(lambda: synth_image(AgentProject.load(folder), release))
    assert message.startswith("image name: 'rayito-base-mine' starts with 'rayito-base'")


@pytest.mark.parametrize("port", [8080, 9000, 8088])
def test_an_app_on_a_port_of_rayd_the_hooks_or_the_host(tmp_path, release, port) -> None:
    folder = copy_example(tmp_path, **{"port = 9100": f"port = {port}"})
    message = refusal(lambda: synth_image(AgentProject.load(folder), release))
    assert message.startswith(f"runtime.app.port: {port} is ")


def test_a_zip_without_rayd(tmp_path) -> None:
    from rayito.cdk import MicrovmImageArtifact

    path = tmp_path / "no-rayd.zip"
    path.write_bytes(base_zip(rayd=False))
    message = refusal(lambda: synth_image(AgentProject.load(EXAMPLE), MicrovmImageArtifact.from_file(path)))
    assert message.startswith("rayd: the zip has no 'rayd'")


def test_the_products_artifact_errors(tmp_path) -> None:
    from rayito.cdk import MicrovmImageArtifact

    from rayito_constructs.agent_image import release_artifact

    path = tmp_path / "slim.zip"
    path.write_bytes(base_zip(variant="slim"))
    assert refusal(lambda: release_artifact(str(path), "0" * 64)).startswith("base_artifact: ")
    assert refusal(lambda: release_artifact(str(tmp_path / "none.zip"), None)).startswith("base_artifact: ")
    message = refusal(lambda: synth_image(AgentProject.load(EXAMPLE), MicrovmImageArtifact.from_file(path)))
    assert message.startswith("rayd: ") and "slim" in message


def test_a_deploy_time_value_in_the_template_env(release) -> None:
    import aws_cdk as cdk

    message = refusal(lambda: synth_image(AgentProject.load(EXAMPLE), release,
                                          template_env={"TABLE": cdk.Aws.STACK_NAME}))
    assert message.startswith("template_env.TABLE: a deploy-time value")


def test_memory_below_the_floor_or_not_a_class(release) -> None:
    from rayito_constructs.agent_image import check_image_project

    project = AgentProject.load(EXAMPLE).product
    import dataclasses

    for memory in (3000, 1024):
        changed = dataclasses.replace(project, memory_mib=memory) if memory >= 2048 else _bypass(project, memory)
        message = refusal(lambda: check_image_project(changed, "mi-agente"))
        assert message.startswith(f"memory_mib: {memory} is not one the product's agent image takes")


def _bypass(project: Any, memory: int) -> Any:
    """A project with memory under the floor (the product's own dataclass refuses to make one)."""
    import copy

    clone = copy.copy(project)
    object.__setattr__(clone, "memory_mib", memory)
    return clone


def test_a_runtime_the_product_cannot_install(release) -> None:
    from rayito_constructs.agent_image import check_image_project

    clone = _bypass(AgentProject.load(EXAMPLE).product, 4096)
    object.__setattr__(clone, "runtime", "no-such-runtime")
    message = refusal(lambda: check_image_project(clone, "mi-agente"))
    assert message.startswith("runtime: the product cannot build this project")


def test_a_folder_the_products_build_refuses_is_refused_in_its_words(tmp_path, release) -> None:
    """A TypeScript project without its lockfile: the product's build runs ``npm ci`` and its
    context collection refuses the folder (``BuildException``, ``context_path_missing``); so do we,
    in one line with its reason, whether the image is composed at synth or at deploy."""
    from rayito.exceptions import BuildException

    from rayito_constructs.image_composer import PublishedBaseImage
    from rayito_constructs.image_composition import agent_template, template_overlay

    from .projects import scaffold as product_scaffold

    folder = product_scaffold(tmp_path / "ts", "strands", "typescript", "anthropic")
    (folder / "package-lock.json").unlink(missing_ok=True)
    project = AgentProject.load(folder)
    with pytest.raises(BuildException) as product:  # the product's own refusal, as its build meets it
        template_overlay(agent_template(project.product))
    expected = (f"source: the product cannot build this project's image ({product.value}; context_path_missing): "
                "the source folder must hold package-lock.json, not excluded from the build context "
                "(npm install writes it)")
    assert refusal(lambda: synth_image(project, release)) == expected
    assert refusal(lambda: synth_image(project, PublishedBaseImage())) == expected
    (folder / "package-lock.json").write_text('{"lockfileVersion": 3, "packages": {}}\n')
    synth_image(AgentProject.load(folder), release)  # with it, the product builds it and so do we


@pytest.mark.parametrize("other", [{"image_arn": "arn:aws:lambda:us-east-1:123456789012:microvm-image:otra"},
                                   {"build_image": False}], ids=["image_arn", "build_image"])
def test_rayd_with_an_image_made_elsewhere_is_refused_not_ignored(release, other) -> None:
    """``rayd`` is for the image the fleet builds: given with ``image_arn`` or ``build_image=False``
    it was silently dropped; it is one line naming both."""
    (name,) = other
    shown = "build_image=False" if name == "build_image" else name
    message = refusal(lambda: AgentFleet(new_stack(new_app(base_artifact=None)), "F", project=AgentProject.load(EXAMPLE),
                                         rayd=release, **other))
    assert message.startswith(f"rayd, {shown}: give one of them"), message


def test_a_dockerfile_in_the_folder_is_ignored_with_an_info_line(tmp_path, release) -> None:
    folder = copy_example(tmp_path)
    (folder / "Dockerfile").write_text("FROM scratch\n")
    app, image, _ = synth_image(AgentProject.load(folder), release)
    texts = [str(entry.data) for entry in image.node.metadata]
    assert any("Dockerfile" in text and "ignored" in text for text in texts), texts
