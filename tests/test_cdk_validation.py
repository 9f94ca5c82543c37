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


@pytest.mark.parametrize(
    "context",
    [
        pytest.param({}, id="the-example"),
        pytest.param({"base_artifact": "RAYD", "metrics": "true",
                      "alarm_actions": "arn:aws:sns:us-east-1:123456789012:ops", "metadata_index": "true",
                      "log_retention": "30", "keep_image_versions": "10", "retain_vms_on_delete": "true",
                      "min_vms": "2", "max_vms": "4", "warm": "1"}, id="built-image-every-feature"),
        pytest.param({"base_image": "rayito-base-caps", "scope_microvm_actions_to_image": "false",
                      "saved_queries": "false", "egress.budgets": "[]"}, id="composed-at-deploy"),
    ],
)
def test_app_pys_templates_pass_the_cdks_validation_as_errors(tmp_path, context) -> None:
    context = {key: stand_in_rayd() if value == "RAYD" else value for key, value in context.items()}
    result = _run([sys.executable, "app.py"], tmp_path, context, "true")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    findings = [(plugin["pluginName"], violation["ruleName"], violation["description"])
                for plugin in report["pluginReports"] if plugin["pluginName"] != "Construct Annotations"
                for violation in plugin.get("violations", [])]
    assert findings == []
    assert "ERROR" not in result.stderr and "(CloudFormation Validate)" not in result.stderr, result.stderr
