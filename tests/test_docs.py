"""The docs name every option, flag and warning code the code has, and the README's commands exist."""

from __future__ import annotations

import json
import re

from rayito_constructs.cli import FLAGS, REPEATED_FLAGS
from rayito_constructs.model.fleet_file import StackOptions
from rayito_constructs.model.options import EgressBudgetOptions, EgressOptions

from .conftest import ROOT


def test_options_doc_lists_every_flag_and_key_of_our_file() -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    for flag, dest, _ in [*FLAGS, *REPEATED_FLAGS, ("--no-save-recipe", "save_recipe", ""),
                          ("--renew-gateway-keys", "renew_gateway_keys", "")]:
        assert flag in text and f"-c {dest}" in text, flag
    for model in (EgressOptions, EgressBudgetOptions, StackOptions):
        for key in model.model_fields:
            assert f"`{key}`" in text, key


def test_warning_codes_are_documented() -> None:
    codes = set()
    for path in (ROOT / "rayito_constructs").glob("*.py"):
        codes |= set(re.findall(r'FleetWarning\(\s*"([a-z_]+)"', path.read_text()))
    codes |= {"recipe_too_large", "recipe_unreadable"}
    docs = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert codes and all(code in docs for code in codes), codes


def test_readme_starts_with_the_two_commands() -> None:
    lines = [l for l in (ROOT / "README.md").read_text().splitlines() if l.strip()]
    assert lines[1] == "```sh"
    assert lines[2].startswith("make synth ") and lines[3].startswith("make test ")
    assert lines[4] == "```"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^synth:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def test_every_cost_assumption_is_in_the_docs_next_to_the_estimate() -> None:
    from rayito_constructs import AgentProject
    from rayito_constructs.cli import _render_cost
    from rayito_constructs.model.cost import (
        DAYS_PER_MONTH, KMS_USD_PER_10K, SUSPENDED_DAY_USD, VM_HOUR_USD, estimate,
    )
    import io

    from .conftest import EXAMPLE

    cost = _section((ROOT / "docs" / "options.md").read_text(), "Cost")
    assumptions = estimate(AgentProject.load(EXAMPLE), has_recipe=True).assumptions
    assert f"{assumptions['hours_per_month']} hours" in cost and f"{DAYS_PER_MONTH:.2f} days" in cost
    assert f"{assumptions['vm_lifetime_seconds']:,} s" in cost and "8 hours" in cost
    assert f"{assumptions['successor_lead_seconds'] // 60} minutes" in cost
    assert f"{assumptions['recipe_reads_per_day']} recipe reads a day" in cost
    for hourly in VM_HOUR_USD.values():
        assert f"${hourly}" in cost
    assert f"${SUSPENDED_DAY_USD}/day" in cost and f"${KMS_USD_PER_10K} per 10,000" in cost
    assert "not priced" in cost and "512, 1024 and 8192 MiB" in cost
    out = io.StringIO()
    _render_cost(estimate(AgentProject.load(EXAMPLE), has_recipe=True).to_dict(), out)
    assert "docs/options.md#cost" in out.getvalue()


def test_links_to_sections_exist() -> None:
    for doc, target, heading in [
        ("README.md", "docs/performance.md", "first-make-synth-from-a-fresh-clone"),
        ("docs/getting-started.md", "docs/options.md", "cost"),
        ("docs/getting-started.md", "docs/options.md", "names"),
    ]:
        assert f"#{heading}" in (ROOT / doc).read_text(), (doc, heading)
        headings = re.findall(r"^#+ (.+)$", (ROOT / target).read_text(), re.M)
        assert heading in {_anchor(h) for h in headings}, (target, heading)


def test_make_synth_installs_only_what_synthesis_needs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    synth_rule = re.search(r"^synth: (.*)$", makefile, re.M).group(1)
    assert "$(STAMP)/synth" in synth_rule and "$(STAMP)/python" not in synth_rule
    stamp = makefile[makefile.index("$(STAMP)/synth:") :].split("\n\n")[0]
    assert "requirements-synth.txt" in stamp and "requirements-dev.txt" not in stamp
    synth = [l.split("==")[0] for l in (ROOT / "requirements-synth.txt").read_text().splitlines() if "==" in l]
    # idna: egress targets; rayito (the product) and its pinned dependencies
    assert sorted(synth) == ["aws-cdk-lib", "boto3", "botocore", "cdk-nag", "constructs", "grpcio", "idna", "protobuf",
                             "pydantic", "rayito[cli]", "rich", "typer"]
    dev = (ROOT / "requirements-dev.txt").read_text() + (ROOT / "requirements.txt").read_text()
    assert "-r requirements.txt" in dev and "-r requirements-synth.txt" in dev
    for tool in ("pytest", "cfn-lint", "moto", "hypothesis", "ruff"):
        assert tool not in (ROOT / "requirements-synth.txt").read_text()


def test_the_testing_guides_first_example_runs_as_written() -> None:
    """docs/testing.md's emulator example, executed as a user pastes it."""
    text = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"```python\n(import boto3\nfrom rayito_constructs.testing import .*?)```", text, re.S)
    assert block is not None
    exec(compile(block.group(1), "docs/testing.md", "exec"), {})


def test_the_getting_started_app_runs_as_written(tmp_path, monkeypatch) -> None:
    """docs/getting-started.md's own app, run as a user pastes it, next to a product project
    named support-bot: every grant in it lands, and the remote fleet's grant matches the fleet's."""
    from .projects import write_project

    text = (ROOT / "docs" / "getting-started.md").read_text()
    block = re.search(r"```python\n(from rayito_constructs import AgentFleet, AgentProject, SandboxLauncherPolicy.*?)```",
                      text, re.S)
    assert block is not None
    write_project(tmp_path / "agents" / "support-bot", name="support-bot")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block.group(1), "docs/getting-started.md", "exec"), scope)
    reader = scope["other"].node.find_child("Reader")
    statements = json.dumps(scope["other"].resolve(reader.node.find_child("DefaultPolicy").document.to_json()))
    assert "rayito/provider-key" in statements and "dynamodb:" in statements  # the project's secrets, the index
