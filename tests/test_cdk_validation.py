"""The CDK's built-in CloudFormation validation: off in app.py unless ``CDK_VALIDATION=true``, and
the templates app.py writes pass it with its errors as errors (cdk.json sets
``@aws-cdk/core:validateAgainstDefaultRules``), so leaving it off loses no finding.

aws-cdk-lib runs cfn-lint, compiled to WebAssembly, in jsii's Node process at every synth; the
suite turns it off (tests/conftest.py) and runs it here, in processes of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import builtin_validation

from .cdk_helpers import stand_in_rayd

ROOT = Path(__file__).resolve().parent.parent


def _run(command: list[str], tmp_path: Path, context: dict[str, object], validation: str | None):
    env = {k: v for k, v in os.environ.items() if k != "CDK_VALIDATION"}
    if validation is not None:
        env["CDK_VALIDATION"] = validation
    cdk_context = json.loads((ROOT / "cdk.json").read_text())["context"]
    env.update(CDK_CONTEXT_JSON=json.dumps({**cdk_context, **context}), CDK_OUTDIR=str(tmp_path / "out"),
               CDK_DEFAULT_ACCOUNT="123456789012", CDK_DEFAULT_REGION="us-east-1")
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("value", "runs"), [(None, False), ("false", False), ("", False), ("1", False),
                                             ("true", True), ("TRUE", True), (" true ", True)])
def test_app_py_runs_the_cdks_validation_only_when_asked(value, runs) -> None:
    assert builtin_validation({} if value is None else {"CDK_VALIDATION": value}) is runs


# A template the CDK's validation refuses (an unknown property, a string for an integer), made by
# app.py's own App: the validation runs exactly when CDK_VALIDATION=true, and fails the synth.
BROKEN = """
import aws_cdk as cdk
from aws_cdk import aws_sqs as sqs
import app
scope = app.new_app()
queue = sqs.Queue(cdk.Stack(scope, "Broken"), "Queue")
queue.node.default_child.add_property_override("VisibilityTimeout", "soon")
scope.synth()
"""


@pytest.mark.parametrize(("validation", "refused"), [("true", True), (None, False), ("false", False)])
def test_the_apps_validation_refuses_a_broken_template_only_when_on(tmp_path, validation, refused) -> None:
    result = _run([sys.executable, "-c", BROKEN], tmp_path, {}, validation)
    assert (result.returncode != 0) is refused, result.stderr[-2000:]
    assert ("F3012" in result.stderr) is refused, result.stderr[-2000:]


def _findings(outdir: Path) -> list[tuple[str, str, str]]:
    """What a plugin other than the construct annotations found (their warnings are the library's
    own, told at synth, never a template's fault)."""
    report = json.loads((outdir / "validation-report.json").read_text())
    return [(plugin["pluginName"], violation["ruleName"], violation["description"])
            for plugin in report["pluginReports"] if plugin["pluginName"] != "Construct Annotations"
            for violation in plugin.get("violations", [])]


def test_the_examples_template_passes_the_cdks_validation_as_errors(tmp_path) -> None:
    """``CDK_VALIDATION=true python app.py``, as ``CDK_VALIDATION=true npx cdk synth`` runs it."""
    result = _run([sys.executable, "app.py"], tmp_path, {}, "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _findings(tmp_path / "out") == []
    assert "ERROR" not in result.stderr and "(CloudFormation Validate)" not in result.stderr, result.stderr


#: The shapes of stack app.py writes, by its context: each switch that adds, removes or changes
#: resources at least once.
SHAPES: dict[str, dict[str, str]] = {
    "built-image-every-feature": {
        "base_artifact": "RAYD", "metrics": "true", "dashboard": "true", "metadata_index": "true",
        "alarm_actions": "arn:aws:sns:us-east-1:123456789012:a,arn:aws:sns:us-east-1:123456789012:b",
        "log_retention": "30", "keep_image_versions": "10", "retain_vms_on_delete": "true",
        "min_vms": "2", "max_vms": "4", "warm": "1"},
    "composed-at-deploy": {"base_image": "rayito-base-caps", "base_image_version": "1", "metrics": "true",
                           "scope_microvm_actions_to_image": "false", "saved_queries": "false"},
    "many-egress-budgets": {"base_artifact": "RAYD", "metrics": "true", "egress.budgets": json.dumps(
        [{"target": f"https://api{i}.example.com", "rate": "10/second", "burst": 3} for i in range(6)])},
    "never-pruned-one-day-logs": {"base_artifact": "RAYD", "keep_image_versions": "none", "log_retention": "1"},
    "dedicated-sessions": {"sessions": "dedicated", "max_sessions": "1", "min_vms": "0", "max_vms": "3",
                           "memory": "8192", "env": "A=1,B=2"},
    "no-recipe": {"save_recipe": "false"},
    "no-reconciler-with-index": {"reconciler": "false", "metadata_index": "true", "egress.budgets": "[]"},
    "image-of-another-stack": {"image_arn": "arn:aws:lambda:us-east-1:123456789012:microvm-image:other-image",
                               "keep_recipe": "true"},
    "not-built": {"build_image": "false"},
}

# app.py's main() over each shape in one process: one Node, whose validation engine starts once.
# Each App reads cdk.json's context from CDK_CONTEXT_JSON (_run), and the shape's over it.
EVERY_SHAPE = """
import json, sys
import aws_cdk as cdk
import app
shapes, out = json.loads(sys.argv[1]), sys.argv[2]
codes = {}
for name, context in shapes.items():
    scope = cdk.App(builtin_cloud_formation_validation=True, outdir=f"{out}/{name}", analytics_reporting=False,
                    context=context)
    try:
        codes[name] = app.main(scope)
    except Exception as exc:  # the validation failing the synth
        codes[name] = " ".join(str(exc).split())[:300]
print(json.dumps(codes))
"""


def test_every_shape_of_app_pys_stack_passes_the_cdks_validation_as_errors(tmp_path) -> None:
    shapes = {name: {key: stand_in_rayd() if value == "RAYD" else value for key, value in context.items()}
              for name, context in SHAPES.items()}
    result = _run([sys.executable, "-c", EVERY_SHAPE, json.dumps(shapes), str(tmp_path / "out")], tmp_path, {}, "true")
    assert result.returncode == 0, result.stderr[-3000:]
    codes = json.loads(result.stdout.strip().splitlines()[-1])
    assert codes == dict.fromkeys(SHAPES, 0), result.stderr[-3000:]
    assert {name: _findings(tmp_path / "out" / name) for name in SHAPES} == dict.fromkeys(SHAPES, [])
    assert "(CloudFormation Validate)" not in result.stderr, result.stderr[-3000:]
