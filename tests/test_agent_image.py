"""AgentImage: the MicroVM image built from the agent folder, with no Docker at synth."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk.assertions import Match, Template

from rayito_constructs import AgentFleet, AgentImage, AgentProject, ImageHooks

from .cdk_helpers import lint_template, nag, new_app, new_stack
from .conftest import EXAMPLE
from .projects import project_with


def synth_image(**props):
    app = new_app()
    stack = new_stack(app)
    # The image's own pieces; its pruner's function, role and log group: tests/test_image_pruner.py.
    props.setdefault("keep_image_versions", None)
    image = AgentImage(stack, "Image", **props)
    return app, stack, image, Template.from_stack(stack)


def test_image_from_the_example_folder() -> None:
    app, _, image, template = synth_image(
        folder=EXAMPLE, image_name="mi-agente", memory_mib=4096, environment={"LOG_LEVEL": "info"},
        hooks=ImageHooks(run=True, ready=True, port=9000, runtime_timeout_seconds=10, build_timeout_seconds=900),
    )
    props = template.find_resources("AWS::Lambda::MicrovmImage")
    (resource,) = props.values()
    p = resource["Properties"]
    assert p["Name"] == "mi-agente"
    assert p["Resources"] == [{"MinimumMemoryInMiB": 4096}]
    assert p["CpuConfigurations"] == [{"Architecture": "ARM_64"}]
    assert p["BaseImageArn"] == "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1" and p["BaseImageVersion"] == "1"
    assert p["EnvironmentVariables"] == [{"Key": "LOG_LEVEL", "Value": "info"}]
    assert p["Logging"] == {"CloudWatch": {"LogGroup": "/aws/lambda-microvms/mi-agente"}}
    assert p["Hooks"]["Port"] == 9000
    assert p["Hooks"]["MicrovmHooks"]["Run"] == "ENABLED" and p["Hooks"]["MicrovmHooks"]["Suspend"] == "DISABLED"
    assert p["Hooks"]["MicrovmImageHooks"] == {"Ready": "ENABLED", "ReadyTimeoutInSeconds": 900,
                                               "Validate": "DISABLED", "ValidateTimeoutInSeconds": 900}
    uri = p["CodeArtifact"]["Uri"]
    assert uri.startswith("s3://cdk-hnb659fds-assets-123456789012-us-east-1/") and uri.endswith(".zip")
    # The build role: trusted by Lambda for this image only, reads this zip only, writes its logs.
    roles = template.find_resources("AWS::IAM::Role")
    (role,) = roles.values()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    image = "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente"
    assert trust["Condition"]["ArnLike"] == {"aws:SourceArn": [image, image + ":*"]}
    # Its log group belongs to the stack and exists before the build.
    ((group_id, group),) = template.find_resources("AWS::Logs::LogGroup").items()
    assert group["Properties"] == {"LogGroupName": "/aws/lambda-microvms/mi-agente", "RetentionInDays": 30}
    assert group_id in resource["DependsOn"]
    (policy,) = template.find_resources("AWS::IAM::Policy").values()
    by_sid = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert by_sid["ReadCode"]["Action"] == "s3:GetObject"
    assert by_sid["ReadCode"]["Resource"] == uri.replace("s3://", "arn:aws:s3:::")
    assert resource["DependsOn"]  # the role and its policy exist before the build starts
    assert lint_template(template) == [] and nag(app) == []


def test_asset_holds_the_folder_as_the_service_expects(tmp_path) -> None:
    folder = tmp_path / "agente"
    (folder / "tests").mkdir(parents=True)
    (folder / "__pycache__").mkdir()
    (folder / "Dockerfile").write_text("FROM scratch\n")
    (folder / "server.py").write_text("print('hola')\n")
    (folder / "notes.secret").write_text("x\n")
    (folder / "tests" / "test_x.py").write_text("\n")
    (folder / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"\0")
    (folder / ".dockerignore").write_text("# not shipped\ntests\n*.secret\n")
    app = new_app()
    stack = new_stack(app)
    AgentImage(stack, "Image", folder=folder, image_name="agente", keep_image_versions=None)  # no pruner code asset
    assembly = app.synth()
    (staged,) = [p for p in Path(assembly.directory).iterdir() if p.name.startswith("asset.")]
    files = sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file())
    assert files == [".dockerignore", "Dockerfile", "server.py"]


def test_clear_errors() -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError) as info:
        AgentImage(stack, "Bad", folder=Path(__file__).parent, image_name="no name", memory_mib=3000,
                   architecture="RISCV", environment={"GITHUB_TOKEN": "x", "REPO_URL": "https://bot:s3cret@git.example/x"})
    assert str(info.value).splitlines() == [
        "image_name: 'no name' must be 1 to 64 letters, digits, '-' or '_'",
        "memory_mib: 3000 is not a MicroVM size class (512, 1024, 2048, 4096, 8192 MiB)",
        "architecture: 'RISCV' is not one of 'ARM_64', 'X86_64'",
        "environment: GITHUB_TOKEN looks like a secret (it ends in _TOKEN); pass it at run time, not in the image",
        "environment.REPO_URL: the value looks like a credential (a URL with a user and password); plain env "
        "values are stored in the image and the recipe, readable by anyone who may read the template or the "
        "recipe: move REPO_URL to secret_env (--secret-env REPO_URL=<secret>)",
        f"folder: {str(Path(__file__).parent)!r} has no Dockerfile at its root",
    ]
    with pytest.raises(ValueError, match="folder, code: give exactly one of them"):
        AgentImage(stack, "Neither", image_name="x")


def test_from_image_arn() -> None:
    app = new_app()
    stack = new_stack(app)
    image = AgentImage.from_image_arn(stack, "Shared", "arn:aws:lambda:us-east-1:123456789012:microvm-image:compartida")
    assert image.image_name == "compartida"


def test_fleet_builds_its_image_and_grants_the_publisher() -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), base_rollout="rolling")
    assert fleet.image is not None
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::Lambda::MicrovmImage", 1)
    template.has_resource_properties("AWS::Lambda::MicrovmImage", {
        "Name": "mi-agente", "Resources": [{"MinimumMemoryInMiB": 4096}],
        "EnvironmentVariables": [
            {"Key": "GREETING", "Value": "Hola"}, {"Key": "LOG_LEVEL", "Value": "info"},
            # The example declares egress budgets: the agents find their table here.
            {"Key": "RAYITO_EGRESS_BUDGET_TABLE", "Value": {"Ref": Match.string_like_regexp("^FleetEgressBudgetTable")}},
            # ... the envelopes they declare (rayito-constructs.toml's [egress]: the recipe has no place for them)
            {"Key": "RAYITO_EGRESS_ENVELOPES", "Value": Match.string_like_regexp('^\\{"budgets":\\[\\{"burst":5,')},
            # ... and whether their EmfRecorder sends metrics (the fleet's metrics=, off by default).
            {"Key": "RAYITO_METRICS", "Value": "off"},
        ],
    })
    publisher = [p for k, p in template.find_resources("AWS::IAM::ManagedPolicy").items() if k.startswith("FleetImagePublisher")][0]
    sids = {s["Sid"] for s in publisher["Properties"]["PolicyDocument"]["Statement"]}
    assert {"PassBuildRole", "UploadArtifacts"} <= sids
    env = [f["Properties"]["Environment"]["Variables"] for f in template.find_resources("AWS::Lambda::Function").values()
           if f["Properties"].get("Handler") == "reconciler.index.handler"][0]
    assert env["BASE_ROLLOUT"] == "rolling"


def test_fleet_with_a_given_image_arn_builds_nothing() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE),
               image_arn="arn:aws:lambda:us-east-1:123456789012:microvm-image:elsewhere")
    Template.from_stack(stack).resource_count_is("AWS::Lambda::MicrovmImage", 0)
    with pytest.raises(ValueError, match="base_rollout"):
        AgentFleet(stack, "Bad", project=project_with(name="otra"), base_rollout="sometimes")


@pytest.mark.parametrize("version, ok", [("1", True), ("0", True), ("12", True), ("1.0", False), ("latest", False),
                                         ("", False), (" 1", False), ("1 ", False), ("1\n", False)])
def test_base_image_version_is_a_major_number(version: str, ok: bool) -> None:
    """Measured: create rejects "1.0" ("Expected a single major version number (e.g., 1)")."""
    app = new_app()
    stack = new_stack(app)
    if ok:
        AgentImage(stack, "Image", folder=EXAMPLE, image_name="x", base_image_version=version)
        return
    with pytest.raises(ValueError, match="is not a major version number such as '1'"):
        AgentImage(stack, "Image", folder=EXAMPLE, image_name="x", base_image_version=version)


def test_base_image_version_may_be_a_parameter() -> None:
    import aws_cdk as cdk

    app = new_app()
    stack = new_stack(app)
    version = cdk.CfnParameter(stack, "BaseVersion", type="String", default="1")
    AgentImage(stack, "Image", folder=EXAMPLE, image_name="x", base_image_version=version.value_as_string)
    (image,) = Template.from_stack(stack).find_resources("AWS::Lambda::MicrovmImage").values()
    assert image["Properties"]["BaseImageVersion"] == {"Ref": "BaseVersion"}


def test_without_its_own_log_group_the_build_may_create_it() -> None:
    app, _, image, template = synth_image(folder=EXAMPLE, image_name="x_1", own_log_group=False)
    template.resource_count_is("AWS::Logs::LogGroup", 0)
    (policy,) = template.find_resources("AWS::IAM::Policy").values()
    logs = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Sid"] == "BuildLogs"][0]
    assert logs["Action"][0] == "logs:CreateLogGroup" and not image.owns_log_group
    assert nag(app) == []


@pytest.mark.parametrize("name", ["agente\n", "\nagente", "agente\r", "a" * 65, "", "agénte"])
def test_image_name_is_checked_whole(name: str) -> None:
    """A trailing newline is not a name character (``$`` would have let ``'agente\\n'`` through)."""
    stack = new_stack(new_app())
    with pytest.raises(ValueError, match="must be 1 to 64 letters, digits"):
        AgentImage(stack, "Image", folder=EXAMPLE, image_name=name)
