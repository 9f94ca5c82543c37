"""app.py, what `make synth` and `npx cdk synth` run: names that synthesize, context checked like
the project file, one line and exit status 2 for every mistake, no traceback, no jsii banner."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .conftest import EXAMPLE, ROOT, record_template

BANNER = "end-of-life"


def load_app():
    spec = importlib.util.spec_from_file_location("rayito_app", ROOT / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synth(monkeypatch, tmp_path, capsys, **context):
    """Run app.py's main() in this process as `cdk synth -c key=value...` would."""
    import aws_cdk as cdk

    outdir = tmp_path / "cdk.out"
    code = load_app().main(cdk.App(outdir=str(outdir), context=context, analytics_reporting=False))
    err = capsys.readouterr().err
    return code, err, outdir


@pytest.fixture
def agent(tmp_path):
    def make(folder_name: str, toml: str | None = None):
        folder = tmp_path / "agents" / folder_name
        folder.mkdir(parents=True)
        for name in ("Dockerfile", "server.py"):
            (folder / name).write_text((EXAMPLE / name).read_text())
        if toml is not None:
            (folder / "rayito-agent.toml").write_text(toml)
        return folder

    return make


def stacks(outdir):
    manifest = json.loads((outdir / "manifest.json").read_text())
    return {
        artifact["properties"].get("stackName", key): json.loads((outdir / artifact["properties"]["templateFile"]).read_text())
        for key, artifact in manifest["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    }


@pytest.mark.parametrize(
    ("folder_name", "toml", "stack_prefix"),
    [
        ("my_agent", None, "RayitoFleet-my-agent-"),  # a folder named my_agent with no name set
        ("agente", 'name = "my_agent"\n', "RayitoFleet-my-agent-"),
        ("agente", f'name = "{"x_" * 32}"\n', "RayitoFleet-" + "x-" * 32),  # 64 characters
    ],
)
def test_names_plan_accepts_synthesize(monkeypatch, tmp_path, capsys, agent, folder_name, toml, stack_prefix) -> None:
    from rayito_constructs import AgentProject

    folder = agent(folder_name, toml)
    project = AgentProject.load(folder)  # what plan accepts
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(folder))
    assert code == 0, err
    (name, template) = next(iter(stacks(outdir).items()))
    record_template(f"app.py {name}", template)  # what `make synth` writes passes the session gate too
    assert name == project.stack_name and name.startswith(stack_prefix)
    images = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    assert [i["Properties"]["Name"] for i in images] == [project.name]


@pytest.mark.parametrize(
    ("context", "lines"),
    [
        ({"max_vm": "5"}, ["-c max_vm: unknown context key; did you mean 'max_vms'?"]),
        ({"name": ".."}, None),
        ({"name": "mi agente", "idle": "30"}, None),
        ({"metadata_index": "maybe", "max_vms": "65"}, [
            "-c metadata_index: 'maybe' is not true or false", "-c max_vms: 65 is above the limit of 64",
        ]),
        ({"project": "/nonexistent"}, ["-c project: '/nonexistent' is not a directory"]),
        ({"image_arn": "arn:aws:s3:::bucket"}, [
            "-c image_arn: 'arn:aws:s3:::bucket' is not a MicroVM image ARN "
            "(arn:<partition>:lambda:<region>:<account>:microvm-image:<name>)"
        ]),
        ({"env": "GITHUB_TOKEN=x"}, [
            "-c env: GITHUB_TOKEN looks like a secret (it ends in _TOKEN); pass it with --secret-env "
            "GITHUB_TOKEN=<secret> so the recipe keeps only its name"
        ]),
        ({"keep_image_versions": "50", "retain_vms_on_delete": "perhaps"}, [
            "-c retain_vms_on_delete: 'perhaps' is not true or false",
            "-c keep_image_versions: '50' is not a whole number of image versions from 1 to 49 (5), or none",
        ]),
        ({"keep_image_versions": "٣"}, None),
        ({"keep_image_versions": "2.5"}, None),
    ],
    ids=["unknown-key", "dotdot", "name-and-idle", "flag-and-limit", "project", "image-arn", "env-secret",
         "lifecycle", "versions-unicode-digit", "versions-fraction"],
)
def test_mistakes_are_one_line_each_and_exit_2(monkeypatch, tmp_path, capsys, context, lines) -> None:
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, **context)
    assert code == 2 and not (outdir / "manifest.json").exists()
    got = err.splitlines()
    if lines is not None:
        assert got == lines
    assert got and all(line.startswith("-c ") for line in got), got
    assert "Traceback" not in err


def test_env_with_commas_reaches_the_image(monkeypatch, tmp_path, capsys) -> None:
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, **{"env.URL": "https://a,b"})
    assert code == 0, err
    (template,) = stacks(outdir).values()
    (image,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    variables = image["Properties"]["EnvironmentVariables"]
    assert {"URL": "https://a,b"}.items() <= (variables if isinstance(variables, dict) else {v["Key"]: v["Value"] for v in variables}).items()


def test_the_real_command_prints_no_traceback_and_no_banner(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    env.update(CDK_CONTEXT_JSON=json.dumps({"name": "my agent", "min_vms": "3", "max_vms": "1"}), CDK_OUTDIR=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "-c min_vms: 3 is above max_vms (1)",
        "warm_vms: 1 is above the limit of 0 (max_vms - min_vms = 1 - 3)",  # from the file: its key
        "-c name: 'my agent' must be 1 to 64 letters (A-Z, a-z), digits, '-' or '_' (it names the MicroVM "
        "image, the stack and /rayito/agents/<name>/recipe); for example 'my-agent'",
    ]


@pytest.mark.parametrize(
    ("code", "banner"),
    [
        ("import rayito_constructs, aws_cdk", False),
        ("from rayito_constructs import AgentFleet", False),
        ("import aws_cdk, rayito_constructs", True),  # jsii started before the library was imported
    ],
)
def test_the_node_20_banner(code, banner) -> None:
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout
    if not node.startswith("v20."):
        pytest.skip(f"jsii prints this banner on Node 20 only (this is {node.strip()})")
    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0
    assert (BANNER in result.stderr) is banner


def test_the_banner_is_the_users_choice() -> None:
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": ""}
    result = subprocess.run([sys.executable, "-c", "import rayito_constructs, aws_cdk"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout
    assert (BANNER in result.stderr) is node.startswith("v20.")


def test_lifecycle_context_reaches_the_stack(monkeypatch, tmp_path, capsys) -> None:
    """``-c retain_vms_on_delete`` and ``-c keep_image_versions`` (docs/teardown.md, docs/image.md)."""
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, keep_image_versions="9")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    (pruner,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoImagePruner"]
    assert pruner["Properties"]["KeepVersions"] == "9"
    (teardown,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoFleetTeardown"]
    assert teardown["Properties"]["RetainVms"] == "false"  # off means off by default
    code, err, outdir = synth(monkeypatch, tmp_path / "b", capsys, keep_image_versions="none",
                              retain_vms_on_delete="true")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "Custom::RayitoImagePruner" not in types
    (teardown,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoFleetTeardown"]
    assert teardown["Properties"]["RetainVms"] == "true"
