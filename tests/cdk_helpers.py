"""Helpers to synthesize stacks the same way on every machine, and to lint and nag them."""

from __future__ import annotations

import json
import re
from typing import Any

import aws_cdk as cdk
import cdk_nag
from aws_cdk.assertions import Template

from rayito_constructs.testing.snapshots import neutralize_asset_hashes

from .conftest import ROOT

#: The feature flags of cdk.json, so tests synthesize what `cdk synth` does.
FLAGS: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
ENV = cdk.Environment(account="123456789012", region="us-east-1")
#: The product's hooks of rayito-base (_images_publish_domain.IMAGE_HOOKS), in CloudFormation's names.
PRODUCT_HOOKS = {
    "Port": 9000,
    "MicrovmHooks": {"Run": "ENABLED", "RunTimeoutInSeconds": 30, "Resume": "ENABLED", "ResumeTimeoutInSeconds": 30,
                     "Suspend": "ENABLED", "SuspendTimeoutInSeconds": 30, "Terminate": "ENABLED",
                     "TerminateTimeoutInSeconds": 10},
    "MicrovmImageHooks": {"Ready": "ENABLED", "ReadyTimeoutInSeconds": 600, "Validate": "ENABLED",
                          "ValidateTimeoutInSeconds": 600},
}


#: The stand-in base's Dockerfile: rayd as its entry point, as the product's release zip has it.
BASE_DOCKERFILE = 'FROM scratch\nCOPY rayd /usr/local/bin/rayd\nENTRYPOINT ["/usr/local/bin/rayd"]\n'


def stand_in_base_zip(*, rayd: bool = True, notice: str = "stand-in", variant: str | None = None) -> bytes:
    """A stand-in for the product's ``rayito-image.zip`` (its Dockerfile, the notices, ``rayd``;
    ``variant="slim"`` marks the slim variant), the same bytes on every call: each entry's time is
    fixed, since a zip records its entries' times and two calls a second apart would differ."""
    import io
    import zipfile

    entries = [("Dockerfile", BASE_DOCKERFILE), ("licenses/LICENSE", notice)]
    entries += [("rayd", "\x7fELF stand-in")] if rayd else []
    entries += [("kernel-sidecar/ipython/startup/warmup_variant", "slim\n")] if variant == "slim" else []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def stand_in_rayd() -> str:
    """:func:`stand_in_base_zip` at the same path every time, so that fleets build the product's
    agent image."""
    import tempfile
    from pathlib import Path

    data = stand_in_base_zip()
    path = Path(tempfile.gettempdir()) / "rayito-constructs-tests" / "rayito-image.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
    return str(path)


def new_app(**context: Any) -> cdk.App:
    """An App with pinned feature flags, no analytics and no bootstrap-version rule; its fleets
    build the product's agent image over a stand-in rayd zip (``base_artifact=None``: none)."""
    context.setdefault("base_artifact", stand_in_rayd())
    context = {k: v for k, v in context.items() if v is not None}
    return cdk.App(analytics_reporting=False, context={**FLAGS, **context})


def new_stack(app: cdk.App, id: str = "Test", **props: Any) -> cdk.Stack:
    props.setdefault("env", ENV)
    props.setdefault("synthesizer", cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))
    return cdk.Stack(app, id, **props)


def stack_props(**props: Any) -> dict[str, Any]:
    props.setdefault("env", ENV)
    props.setdefault("synthesizer", cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))
    return props


def lint_template(template: Template) -> list[str]:
    """cfn-lint errors and warnings (W3005, the DependsOn CDK adds on purpose, aside), from the
    session gate's linter: a template the gate lints anyway is linted once."""
    from .conftest import _LINTER

    return _LINTER.findings(_LINTER.submit(template.to_json()))


def nag(app: cdk.App, *, gate: bool = True) -> list[str]:
    """Unacknowledged AwsSolutions violations as 'rule path' lines.

    The app is synthesized first, as ``cdk synth`` does before its validation plugins run: the
    library vouches for its wildcard statements in an aspect that looks at each policy as it is
    finally synthesized. Its templates go under the session gate unless ``gate=False`` (a test
    that builds a bad template on purpose).
    """
    from .conftest import record_template

    assembly = app.synth()
    if gate:
        for stack in assembly.stacks:
            record_template(f"{stack.stack_name} (nag)", stack.template)
    report = cdk_nag.AwsSolutionsChecks().validate_scope(app)
    found = []
    for violation in report.violations:
        for resource in violation.violating_resources:
            found.append(f"{violation.rule_name} {resource.construct_path}")
    return sorted(found)


#: The library's syrupy matcher, as users import it.
neutralize = neutralize_asset_hashes


# ------------------------------------------------------------------ reading a template


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def dashboard_body(template: dict) -> dict:
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    if isinstance(body, dict):  # Fn::Join of text and references: references become placeholders
        body = "".join(p if isinstance(p, str) else "REF_" + re.sub(r"\W", "_", json.dumps(p)) for p in body["Fn::Join"][1])
    return json.loads(body)


def widget_metrics(body: dict) -> list[dict[str, Any]]:
    """Every metric of every graph: namespace, name, dimensions, stat, the widget's title."""
    found = []
    for widget in body["widgets"]:
        props = widget.get("properties", {})
        for metric in props.get("metrics", []):
            options = metric[-1] if isinstance(metric[-1], dict) else {}
            parts = [p for p in metric if not isinstance(p, dict)]
            if not parts:  # a math or search expression
                found.append({"expression": options["expression"], "title": props.get("title")})
                continue
            namespace, name, *dims = parts
            found.append({"namespace": namespace, "name": name, "dims": dict(zip(dims[::2], dims[1::2])),
                          # CloudWatch's default statistic is Average (CDK leaves it out then).
                          "stat": options.get("stat", props.get("stat", "Average")), "title": props.get("title"),
                          "label": options.get("label")})
    return found
