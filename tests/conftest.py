"""Shared fixtures: paths, the example project and a factory for agent folders."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Callable

import pytest

# Quiet jsii's Node 20 banner for a plain `pytest` too (make test sets it already).
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mi-agente"


@pytest.fixture
def agent_folder(tmp_path: Path) -> Callable[..., Path]:
    """Make an agent folder with the given rayito-agent.toml text (or none)."""

    def make(toml: str | None = None, name: str = "agente") -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "Dockerfile").write_text("FROM scratch\n")
        if toml is not None:
            (folder / "rayito-agent.toml").write_text(textwrap.dedent(toml))
        return folder

    return make


@pytest.fixture
def snapshot_json(snapshot):
    """syrupy JSON snapshots with asset hashes neutralized."""
    from syrupy.extensions.json import JSONSnapshotExtension

    from .cdk_helpers import neutralize

    return snapshot.with_defaults(extension_class=JSONSnapshotExtension, matcher=neutralize)


# Every template a test synthesizes passes cfn-lint and keeps the IAM invariants of
# tests/iam_invariants.py (the launcher never writes the recipe, wildcards only where the
# allow-list says, PassRole on roles with iam:PassedToService): Template.from_stack is wrapped to
# keep each one, and the session fails at the end if any has a finding (cfn-lint's W3005, the
# DependsOn CDK adds on purpose, aside). Templates taken from a stack object also keep the
# operations invariants of tests/monitoring_invariants.py: below a fleet, no alarm on a custom
# metric while metrics are off, and every alarm carries the fleet's alarm_actions when it has any.
_TEMPLATES: dict[str, dict] = {}
_FLEETS: dict[str, list] = {}


def record_template(name: str, template: dict, fleets: list | None = None) -> None:
    """Put one synthesized template under the session gate (``fleets``: what
    ``monitoring_invariants.expectations`` read from its stack)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    key = f"{test} {name}#{len(_TEMPLATES)}"
    _TEMPLATES[key] = template
    if fleets:
        _FLEETS[key] = fleets


def pytest_configure(config) -> None:
    from aws_cdk.assertions import Template

    original = Template.from_stack  # a bound classmethod

    def from_stack(cls, stack, *args, **kwargs):
        from .monitoring_invariants import expectations

        template = original(stack, *args, **kwargs)
        record_template(stack.node.path, template.to_json(), expectations(stack))
        return template

    Template.from_stack = classmethod(from_stack)


def pytest_sessionfinish(session, exitstatus) -> None:
    if not _TEMPLATES or exitstatus not in (0,):
        return
    import json as _json

    from cfnlint.api import ManualArgs, lint

    from .iam_invariants import iam_violations
    from .monitoring_invariants import violations as operations_violations

    findings = []
    iam_findings = []
    ops_findings = [f"{name}: {v}" for name, fleets in _FLEETS.items()
                    for v in operations_violations(_TEMPLATES[name], fleets)]
    seen: set[str] = set()
    for name, template in _TEMPLATES.items():
        text = _json.dumps(template, sort_keys=True)
        if text in seen:  # the same template synthesized twice (from_stack, then nag) is linted once
            continue
        seen.add(text)
        for match in lint(_json.dumps(template), config=ManualArgs(regions=["us-east-1"], ignore_checks=["W3005"])):
            findings.append(f"{name}: {match.rule.id} {match.message}")
        iam_findings.extend(f"{name}: {v}" for v in iam_violations(template))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"cfn-lint: {len(seen)} distinct templates synthesized by the tests, {len(findings)} findings; "
            f"IAM invariants: {len(iam_findings)} violations; operations invariants: {len(ops_findings)} "
            f"violations over {sum(len(f) for f in _FLEETS.values())} fleets, "
            f"{sum(f['actions'] > 0 for fl in _FLEETS.values() for f in fl)} with alarm actions"
        )
    if findings or iam_findings or ops_findings:
        for finding in (*findings, *iam_findings, *ops_findings):
            reporter.write_line(finding) if reporter else print(finding)
        session.exitstatus = 1
