"""The plan command: what a person reads, what --json says, and how bad input fails."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from rayito_constructs.cli import main

from .conftest import EXAMPLE, ROOT


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_plan_json_of_the_example() -> None:
    code, text = run("plan", str(EXAMPLE), "--json")
    assert code == 0
    doc = json.loads(text)
    assert doc["name"] == "mi-agente" and doc["target"] == "microvm"
    assert doc["serve"] == {"max_concurrency": 2, "queue_max": 4, "queue_timeout_seconds": 30}
    assert doc["scaling"] == {
        "min_vms": 1, "max_vms": 3, "warm_vms": 1, "sessions": "shared",
        "scale_in_after_seconds": 900, "idle_seconds": 600,
    }
    assert doc["scaling_source"] == "project"
    assert doc["image"]["memory_mib"] == 4096
    assert doc["recipe"]["parameter_name"] == "/rayito/agents/mi-agente/recipe"
    assert doc["recipe"]["encoding"] == "json" and 0 < doc["recipe"]["bytes"] <= 4096
    assert doc["warnings"] == []
    assert doc["egress_budgets"] == [
        {"target": "https://api.example.com", "rate_per_second": 1.0, "burst": 5},
        {"target": "https://api.example.com/v1/search?region", "rate_per_second": 0.5, "burst": 2},
    ]
    # 1 base VM at the page's $0.25/hour for 4 GB over 730 hours, 1 parked slot at $0.011/day.
    assert doc["cost"]["base_vms_monthly_usd"] == 182.5
    assert doc["cost"]["warm_slots_monthly_usd"] == pytest.approx(0.33)
    assert doc["cost"]["checked"] == {"fleet": "2026-10-06", "recipe": "2026-10-22"}


def test_overrides_mirror_deploy_flags() -> None:
    code, text = run(
        "plan", str(EXAMPLE), "--json", "--memory", "2048", "--max-sessions", "1", "--queue", "0",
        "--queue-timeout", "60", "--min-vms", "2", "--max-vms", "4", "--warm", "2", "--sessions",
        "shared", "--scale-in-after", "120", "--idle", "none", "--env", "EXTRA=1",
        "--secret-env", "API_TOKEN=sekrit", "--allow-out", "example.org", "--no-save-recipe",
    )
    assert code == 0
    doc = json.loads(text)
    assert doc["scaling"] == {
        "min_vms": 2, "max_vms": 4, "warm_vms": 2, "sessions": "shared",
        "scale_in_after_seconds": 120, "idle_seconds": None,
    }
    assert doc["serve"] == {"max_concurrency": 1, "queue_max": 0, "queue_timeout_seconds": 60}
    assert doc["scaling_source"] == "explicit"
    assert "EXTRA" in doc["env"] and doc["secret_env"] == ["API_TOKEN", "MODEL_API_KEY"]
    assert doc["egress_allow"] == ["example.org"]
    assert doc["recipe"] is None
    assert [w["code"] for w in doc["warnings"]] == ["recipe_not_saved"]
    assert "sekrit" not in text


def test_plan_for_a_person() -> None:
    code, text = run("plan", str(EXAMPLE))
    assert code == 0
    assert "Fleet mi-agente (microvm), scaling from: project" in text
    assert "/rayito/agents/mi-agente/recipe  SecureString, standard tier, json" in text
    assert "max_vms" in text and "checked 2026-10-06" in text
    assert "budget https://api.example.com  " in text and "60/minute, burst 5" in text


def test_agentcore_plan_warns() -> None:
    code, text = run("plan", str(EXAMPLE), "--json", "--target", "agentcore")
    doc = json.loads(text)
    assert code == 0 and doc["scaling"] is None
    assert {w["code"] for w in doc["warnings"]} == {"option_not_supported"}


def test_invalid_input_exit_2_one_line_each(capsys) -> None:
    code, text = run("plan", str(EXAMPLE), "--max-vms", "65", "--warm", "x", "--env", "GITHUB_TOKEN=1")
    assert code == 2 and text == ""
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "max_vms: 65 is above the limit of 64",
        "warm_vms: 'x' is not a whole number",
        "env: GITHUB_TOKEN looks like a secret (it ends in _TOKEN); pass it with --secret-env "
        "GITHUB_TOKEN=<secret> so the recipe keeps only its name",
    ]


def test_usage_errors_are_one_line_no_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rayito_constructs", "plan", str(EXAMPLE), "--max-vmz", "3"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["rayito-constructs: unrecognized arguments: --max-vmz 3"]
    assert "Traceback" not in result.stderr


def test_missing_folder(capsys, tmp_path) -> None:
    code, text = run("plan", str(tmp_path / "none"))
    assert code == 2 and text == ""
    assert capsys.readouterr().err.startswith("folder: ")
