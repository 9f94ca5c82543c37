"""app.py, what `make synth` and `npx cdk synth` run: names that synthesize, context checked like
the project file, one line and exit status 2 for every mistake, no traceback, no jsii banner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .app_runner import stacks, synth
from .conftest import ROOT, record_template
from .contract_support import image_template_env

BANNER = "end-of-life"


@pytest.fixture
def agent(tmp_path):
    """A product project in agents/<folder_name>, named ``name`` (the folder's by default), that
    builds its image (a Dockerfile)."""
    from .projects import write_project

    def make(folder_name: str, name: str | None = None, **tables):
        return write_project(tmp_path / "agents" / folder_name, name=name or folder_name, tables=tables, dockerfile=True)

    return make


@pytest.mark.parametrize(
    ("folder_name", "name", "stack_prefix"),
    [
        ("my_agent", None, "RayitoFleet-my-agent-"),  # the product takes _ in a name, a stack does not
        ("agente", "my_agent", "RayitoFleet-my-agent-"),
        ("agente", "x" + "_x" * 31 + "y", "RayitoFleet-x" + "-x" * 31),  # 64 characters
    ],
)
def test_names_plan_accepts_synthesize(monkeypatch, tmp_path, capsys, agent, folder_name, name, stack_prefix) -> None:
    from rayito_constructs import AgentProject

    folder = agent(folder_name, name)
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
        ({"idle": "30"}, None),
        ({"metadata_index": "maybe", "max_vms": "65"}, ["-c metadata_index: 'maybe' is not true or false", None]),
        ({"project": "/nonexistent"}, ["-c project: '/nonexistent' is not a folder"]),
        ({"image_arn": "arn:aws:s3:::bucket", "base_artifact": None}, [
            "-c image_arn: 'arn:aws:s3:::bucket' is not a MicroVM image ARN "
            "(arn:<partition>:lambda:<region>:<account>:microvm-image:<name>)"
        ]),
        ({"env": "GITHUB_TOKEN=x"}, None),
        ({"env": "{bad"}, ["-c env: '{bad' is not valid JSON (Expecting property name enclosed in double quotes at character 1)"]),
        ({"env": '{"A=B": "1"}'}, ["-c env: 'A=B': a name is a string without '='"]),
        ({"env": '{"A": null}', "allow_out": 5, "secret_env": 7}, [
            "-c env: A: None is not a value", "-c allow_out: 5 is not a comma-separated list of hosts",
            "-c secret_env: 7 is not NAME=VALUE pairs"]),
        ({"keep_image_versions": "50", "retain_vms_on_delete": "perhaps"}, [
            "-c retain_vms_on_delete: 'perhaps' is not true or false",
            "-c keep_image_versions: '50' is not a whole number of image versions from 1 to 49 (default 5), or none",
        ]),
        ({"keep_image_versions": "٣"}, None),
        ({"keep_image_versions": "2.5"}, None),
        ({"memory": "3072"}, None),
        ({"base_image": "rayito-base-caps"}, [  # synth() gives base_artifact too
            "-c base_image: give -c base_artifact or -c base_image, not both (a release zip composed at synth, "
            "or the base published in the account, composed at deploy)"]),
        ({"base_image": "rayito-base", "base_artifact": None}, [
            "-c base_image: the base image 'rayito-base' is not the project's base 'rayito-base-caps' ([image] base), "
            "which rayito agent deploy composes on; set [image] base = 'rayito-base'"]),
        ({"egress.default_burst": "0", "egress.default_rate": "fast"}, [
            "-c egress.default_rate: 'fast' is not a rate such as 60/minute or 10/second",
            "-c egress.default_burst: 0 is below the minimum of 1",
        ]),
        ({"egress.budgets": "[{"}, [
            "-c egress.budgets: '[{' is not valid JSON (Expecting property name enclosed in double quotes at character 2)",
        ]),
        ({"egress.budgets": '[{"target": "https://api.example.com", "rate": "fast"}]'}, [
            "-c egress.budgets[0].rate: 'fast' is not a rate such as 60/minute or 10/second",
        ]),
        ({"egress.budgets": '{"target": "https://api.example.com"}'}, None),
        ({"egress.default_burts": "3"}, ["-c egress.default_burts: unknown context key; did you mean 'egress.default_burst'?"]),
        ({"egress.budgets": '[{"target": "ftp://x", "rate": "1/s"}]', "max_vms": "65"}, None),
    ],
    ids=["unknown-key", "idle", "flag-and-limit", "project", "image-arn", "env-secret", "env-not-json",
         "env-name-with-equals", "values-of-the-wrong-shape",
         "lifecycle", "versions-unicode-digit", "versions-fraction", "memory", "two-rayds", "not-the-base",
         "egress-scalars", "egress-not-json", "egress-budget-rate", "egress-not-a-list", "egress-unknown",
         "egress-and-a-flag"],
)
def test_mistakes_are_one_line_each_and_exit_2(monkeypatch, tmp_path, capsys, context, lines) -> None:
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, **context)
    assert code == 2 and not (outdir / "manifest.json").exists()
    got = err.splitlines()
    if lines is not None:
        assert len(got) == len(lines) and all(w is None or g == w for g, w in zip(got, lines)), got
    assert got and all(line.startswith("-c ") for line in got), got
    assert "Traceback" not in err


@pytest.mark.parametrize(("stack", "context", "line"), [
    ({"base_artifact": "rayd.zip"}, {"base_artifact_sha256": "0" * 64, "base_artifact": None},
     "rayito-constructs.toml: stack.base_artifact: el sha256 de "),  # the file's zip (the folder's path), -c sha256
    ({}, {"base_artifact_sha256": "0" * 64, "base_artifact": None},
     "-c base_artifact_sha256: give base_artifact (the zip it is the sha256 of) with it"),
    ({"image_arn": "arn:aws:lambda:us-east-1:123456789012:microvm-image:otra"}, {},  # synth() gives -c base_artifact
     "rayito-constructs.toml: stack.image_arn, -c base_artifact: give one of them (an image published elsewhere, "
     "or the one the stack builds)"),
    ({"image_arn": "arn:aws:lambda:us-east-1:123456789012:microvm-image:otra", "base_image": "rayito-base-caps"},
     {"base_artifact": None}, "rayito-constructs.toml: stack.image_arn, stack.base_image: give one of them"),
], ids=["file-zip-context-sha", "sha-alone", "file-arn-context-rayd", "file-arn-file-rayd"])
def test_rayd_rules_across_the_file_and_the_context(monkeypatch, tmp_path, capsys, agent, stack, context, line) -> None:
    """Context wins key by key; a rule across keys holds whichever place gave each, and names it."""
    from .cdk_helpers import stand_in_rayd

    folder = agent("across", stack=stack)
    if "base_artifact" in stack:
        (folder / stack["base_artifact"]).write_bytes(open(stand_in_rayd(), "rb").read())  # relative: the folder's
    code, err, _ = synth(monkeypatch, tmp_path, capsys, project=str(folder), **context)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(line), err


@pytest.mark.parametrize(("stack", "line"), [
    ({"log_retention": 13}, "rayito-constructs.toml: stack.log_retention: 13 is not a retention CloudWatch Logs offers: "
                            "1, 3, 5, 7, 14, 30, "),
    ({"base_artifact": "x.zip", "base_image": "rayito-base-caps"},
     "rayito-constructs.toml: stack.base_artifact, stack.base_image: give one of them (a release zip composed at synth"),
    ({"base_artifact_sha256": "a" * 64}, "rayito-constructs.toml: stack.base_artifact_sha256: give base_artifact with it"),
], ids=["retention", "two-rayds", "sha-alone"])
def test_stack_table_mistakes_are_one_line_at_plan_and_at_synth(monkeypatch, tmp_path, capsys, agent, stack, line) -> None:
    """``[stack]`` is checked where the file is read, as ``-c`` is: ``plan`` refuses what synth
    would, and both name the file and the key."""
    from rayito_constructs.cli import main as cli

    folder = agent("filed", stack=stack)
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(folder))
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(line), err
    assert cli(["plan", str(folder)]) == 2
    assert capsys.readouterr().err.startswith(line)


def test_the_context_names_rayd_over_the_stack_table(monkeypatch, tmp_path, capsys, agent) -> None:
    """``-c base_artifact`` wins over the file's ``base_image`` (context wins, key by key; the
    two name one thing, so the file's goes): composed at synth, no image composer."""
    folder = agent("based", stack={"base_image": "rayito-base-caps"})
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(folder))  # gives -c base_artifact
    assert code == 0, err
    (template,) = stacks(outdir).values()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "AWS::Lambda::MicrovmImage" in types and "Custom::RayitoImageArtifact" not in types


def test_without_project_away_from_the_example_says_to_give_one(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # cdk synth run from another folder: the example is not there
    code, err, _ = synth(monkeypatch, tmp_path, capsys)
    assert code == 2 and err.splitlines() == [
        "-c project: not given, and the example 'examples/mi-agente' is not a folder here: "
        "give -c project=<your agent folder>"]


def test_env_with_commas_reaches_the_recipe_not_the_image(monkeypatch, tmp_path, capsys, agent) -> None:
    """The project's [env] is the run payload's (the recipe's project), never baked in the image."""
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(agent("imaged")), **{"env.URL": "https://a,b"})
    assert code == 0, err
    (template,) = stacks(outdir).values()
    (image,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    assert "URL" not in json.dumps(image["Properties"]["EnvironmentVariables"])


def test_egress_context_sets_the_envelopes(monkeypatch, tmp_path, capsys, agent) -> None:
    """``-c egress.<key>`` over a folder with no [egress] of its own: the budgets (JSON) and the
    default envelope reach the fleet's budget table and the image's declaration of envelopes."""
    budgets = [{"target": "https://api.example.com", "rate": "120/minute", "burst": 4}]
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(agent("metered")),
                              **{"egress.budgets": json.dumps(budgets), "egress.default_rate": "30/minute",
                                 "egress.default_burst": "3"})
    assert code == 0, err
    (template,) = stacks(outdir).values()
    variables = image_template_env(outdir, template)  # what rayd hands to the agent's processes
    assert json.loads(variables["RAYITO_EGRESS_ENVELOPES"]) == {
        "budgets": [{"target": "https://api.example.com", "rate_per_second": 2.0, "burst": 4}],
        "default": {"rate_per_second": 0.5, "burst": 3}}
    # and over the example's file: an empty list declares no budget (no table), the rest is kept
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, **{"egress.budgets": "[]"})
    assert code == 0, err
    (template,) = stacks(outdir).values()
    tables = [r for r in template["Resources"].values() if r["Type"] == "AWS::DynamoDB::Table"
              and "egress" in json.dumps(r["Properties"].get("TableName", ""))]
    assert tables == [] and "RAYITO_EGRESS_ENVELOPES" not in image_template_env(outdir, template)


def test_the_real_command_prints_no_traceback_and_no_banner(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    env.update(CDK_CONTEXT_JSON=json.dumps({"min_vms": "3", "max_vms": "1"}), CDK_OUTDIR=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()  # a rule the two flags broke together: both named, one line
    assert line == "-c min_vms: 3, -c max_vms: 1: ScalingOptions.min_vms no puede superar a max_vms (max_vms is 1)", line


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


def test_lifecycle_context_reaches_the_stack(monkeypatch, tmp_path, capsys, agent) -> None:
    """``-c retain_vms_on_delete`` and ``-c keep_image_versions`` (docs/teardown.md, docs/image.md)."""
    folder = str(agent("imaged"))
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=folder, keep_image_versions="9")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    (pruner,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoImagePruner"]
    assert pruner["Properties"]["KeepVersions"] == "9"
    (teardown,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoFleetTeardown"]
    assert teardown["Properties"]["RetainVms"] == "false"  # off means off by default
    code, err, outdir = synth(monkeypatch, tmp_path / "b", capsys, project=folder, keep_image_versions="none",
                              retain_vms_on_delete="true")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "Custom::RayitoImagePruner" not in types
    (teardown,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoFleetTeardown"]
    assert teardown["Properties"]["RetainVms"] == "true"


def test_the_stack_table_of_our_file_and_context_over_it(monkeypatch, tmp_path, capsys, agent) -> None:
    """``[stack]`` of rayito-constructs.toml sets the switches; ``-c`` wins over each."""
    folder = agent("switches", stack={"keep_image_versions": 7, "retain_vms_on_delete": True})
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(folder))
    assert code == 0, err
    (template,) = stacks(outdir).values()
    (pruner,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoImagePruner"]
    (teardown,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoFleetTeardown"]
    assert pruner["Properties"]["KeepVersions"] == "7" and teardown["Properties"]["RetainVms"] == "true"
    code, err, outdir = synth(monkeypatch, tmp_path / "c", capsys, project=str(folder), keep_image_versions="3")
    (template,) = stacks(outdir).values()
    (pruner,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoImagePruner"]
    assert pruner["Properties"]["KeepVersions"] == "3"


def test_no_save_recipe_synthesizes_a_fleet_the_stack_does_not_keep(monkeypatch, tmp_path, capsys) -> None:
    """``-c save_recipe=false`` (``--no-save-recipe``) synthesizes, as ``plan`` plans it: no recipe,
    so no reconciler (it keeps the fleet the recipe describes), said once; asking for one anyway
    is one line naming the key."""
    import json

    code, err, outdir = synth(monkeypatch, tmp_path, capsys, save_recipe="false", warm="2", max_sessions="4")
    assert code == 0, err
    (template,) = [json.loads(p.read_text()) for p in outdir.glob("*.template.json")]
    types = {r["Type"] for r in template["Resources"].values()}
    assert "Custom::RayitoRecipe" not in types
    assert not any("Reconciler" in logical for logical in template["Resources"])
    code, err, _ = synth(monkeypatch, tmp_path / "kept", capsys, save_recipe="false", reconciler="true")
    assert code == 2 and err.splitlines() == [err.strip()] and err.startswith("-c reconciler: True needs the fleet's recipe")
    code, err, outdir = synth(monkeypatch, tmp_path / "off", capsys, reconciler="false")
    assert code == 0, err
    (template,) = [json.loads(p.read_text()) for p in outdir.glob("*.template.json")]
    assert not any("Reconciler" in logical for logical in template["Resources"])
    assert any(r["Type"] == "Custom::RayitoRecipe" for r in template["Resources"].values())


def test_a_published_base_composes_the_image_at_deploy(monkeypatch, tmp_path, capsys, agent) -> None:
    """``-c base_image=rayito-base-caps`` (or ``[stack] base_image``): no zip at synth, an image composer."""
    folder = agent("published", stack={"base_image": "rayito-base-caps"})
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, project=str(folder), base_artifact=None)
    assert code == 0, err
    (template,) = stacks(outdir).values()
    record_template("app.py base_image", template)
    (composer,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::RayitoImageComposer"]
    (image,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    assert composer["Properties"]["BaseImageName"] == "rayito-base-caps"
    assert "Fn::GetAtt" in image["Properties"]["CodeArtifact"]["Uri"]
