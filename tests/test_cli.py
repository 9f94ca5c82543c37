"""The plan command: what a person reads, what --json says, and how bad input fails."""

from __future__ import annotations

import io
import json
import os
import signal
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
    # 1 base VM at the page's $0.25/hour for 4 GB that suspends after 600 s idle: it runs 600 s of
    # each 8-hour life, the rest is snapshot storage at $0.011/day; 1 parked slot at $0.011/day.
    cost = doc["cost"]
    assert cost["priced"] and cost["vm_hour_usd"] == 0.25 and cost["suspended_vm_day_usd"] == 0.011
    assert cost["base_vms_monthly_usd"] == pytest.approx(4.26, abs=0.01)
    assert cost["base_vms_without_idle_monthly_usd"] == pytest.approx(188.39, abs=0.01)
    assert cost["warm_slots_monthly_usd"] == pytest.approx(0.33)
    assert cost["checked"] == {"fleet": "2026-10-06", "recipe": "2026-10-22"}
    assert cost["assumptions"]["hours_per_month"] == 730 and cost["assumptions"]["idle_seconds"] == 600
    assert doc["stack_name"] == "RayitoFleet-mi-agente"


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
        "--max-vms: 65 is above the limit of 64",
        "--warm: 'x' is not a whole number",
        "--env: GITHUB_TOKEN looks like a secret (it ends in _TOKEN); pass it with --secret-env "
        "GITHUB_TOKEN=<secret> so the recipe keeps only its name",
    ]


def test_usage_errors_are_one_line_no_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rayito_constructs", "plan", str(EXAMPLE), "--max-vmz", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["rayito-constructs: unrecognized arguments: --max-vmz 3"]
    assert "Traceback" not in result.stderr


def test_missing_folder(capsys, tmp_path) -> None:
    code, text = run("plan", str(tmp_path / "none"))
    assert code == 2 and text == ""
    assert capsys.readouterr().err.startswith("folder: ")


# ---------------------------------------------------------------------------- a good Unix tool


def plan_errors(capsys, *argv: str) -> list[str]:
    code, text = run("plan", *argv)
    assert code == 2 and text == ""
    return capsys.readouterr().err.splitlines()


def test_errors_name_the_flag_that_was_typed(capsys, agent_folder) -> None:
    folder = str(agent_folder("[scaling]\nmax_vms = 2\n"))
    assert plan_errors(capsys, folder, "--name", "mi agente") == [
        "--name: 'mi agente' must be 1 to 64 letters (A-Z, a-z), digits, '-' or '_' (it names the "
        "MicroVM image, the stack and /rayito/agents/<name>/recipe); for example 'mi-agente'"
    ]
    # The same mistake in the file names the file's key, and a rule between a flag and the file
    # names the flag that broke it.
    assert plan_errors(capsys, folder, "--min-vms", "3") == ["--min-vms: 3 is above max_vms (2)"]
    assert plan_errors(capsys, folder, "--memory", "3000")[0].startswith("--memory: 3000 is not a MicroVM size class")
    assert plan_errors(capsys, folder, "--queue-timeout", "none") == [
        "--queue-timeout: none is not accepted: give a whole number of seconds (90) or a number with a unit (90s, 10m, 1h)"
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "--idle: 'soon' is not a duration: a whole number of seconds (90) or a number with a unit (90s, 10m, 1h), or none"),
        ("30", "--idle: 30 seconds is below the minimum of 60 seconds (1m); none turns suspension off"),
        ("9h", "--idle: 32400 seconds is above the limit of 28800 seconds (8h); none turns suspension off"),
        ("1.5h", "--idle: '1.5h' is not a duration: a whole number of seconds (90) or a number with a unit (90s, 10m, 1h), or none"),
        ("-60", "--idle: -60 seconds is below the minimum of 60 seconds (1m); none turns suspension off"),
    ],
)
def test_every_idle_error_has_units_and_none(capsys, value, message) -> None:
    assert plan_errors(capsys, str(EXAMPLE), f"--idle={value}") == [message]


@pytest.mark.parametrize("value", ["10m", "600", "600s", "10 minutes", "none", "NONE", "off"])
def test_idle_accepts_units_and_none(value) -> None:
    code, text = run("plan", str(EXAMPLE), "--json", "--idle", value)
    assert code == 0
    assert json.loads(text)["scaling"]["idle_seconds"] == (None if value.lower() in ("none", "off") else 600)


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("https://api.example.com/v1", "is a URL, not a host: give the host alone ('api.example.com')"),
        ("api.example.com:443", "has a port or is not an address"),
        ("bad host.com", "has a space"),
        ("-bad.example.com", "is not a valid host name"),
        ("a..b", "is not a valid host name"),
        ("x" * 64 + ".com", "is not a valid host name"),
        ("*", "is not a valid host name"),
        ("", "is empty"),
        ("1.2.3", "is not a valid host name"),
    ],
)
def test_allow_out_rejects_what_is_not_a_host(capsys, host, why) -> None:
    (line,) = plan_errors(capsys, str(EXAMPLE), f"--allow-out={host}")
    assert line.startswith(f"--allow-out: {host!r} {why}"), line


def test_allow_out_normalizes_hosts() -> None:
    code, text = run(
        "plan", str(EXAMPLE), "--json", "--allow-out", "API.Example.COM", "--allow-out", "api.example.com.",
        "--allow-out", "*.example.org", "--allow-out", "10.0.0.1", "--allow-out", "::1", "--allow-out", "bücher.de",
    )
    assert code == 0
    assert json.loads(text)["egress_allow"] == ["api.example.com", "*.example.org", "10.0.0.1", "::1", "xn--bcher-kva.de"]


def test_a_folder_without_a_project_file_is_planned_with_a_warning(capsys, tmp_path) -> None:
    folder = tmp_path / "empty_agent"
    folder.mkdir()
    code, text = run("plan", str(folder), "--json")
    assert code == 0
    doc = json.loads(text)
    assert doc["name"] == "empty_agent" and doc["stack_name"].startswith("RayitoFleet-empty-agent-")
    assert [w["code"] for w in doc["warnings"]] == ["no_project_file", "no_dockerfile", "recipe_without_image_version"]
    err = capsys.readouterr().err
    assert err.startswith("rayito-constructs: warning: no_project_file: ") and "rayito-agent.toml" in err


def test_closed_pipe_is_quiet(tmp_path) -> None:
    """``plan ... | head -1``: the reader is gone before the command writes; no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "rayito_constructs", "plan", str(EXAMPLE)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode in (-signal.SIGPIPE, 128 + signal.SIGPIPE)


def test_head_of_a_long_plan_is_quiet() -> None:
    shell = f"{sys.executable} -m rayito_constructs plan {EXAMPLE} --json | head -1"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.stdout == "{\n" and result.stderr == "" and result.returncode == 0


# ---------------------------------------------------------------------------- assembly


@pytest.fixture(scope="module")
def assembly_dir(tmp_path_factory):
    """A cloud assembly of the example fleet, synthesized the way app.py does it."""
    from rayito_constructs import AgentProject, FleetStack

    from .cdk_helpers import new_app, stack_props

    outdir = tmp_path_factory.mktemp("cdk.out")
    app = new_app()
    app = type(app)(analytics_reporting=False, outdir=str(outdir), context=dict(app.node.get_all_context()))
    project = AgentProject.load(EXAMPLE)
    FleetStack(app, project.stack_name, project=project, **stack_props())
    app.synth()
    return outdir


def test_assembly_summarizes_what_synth_made(assembly_dir) -> None:
    code, text = run("assembly", str(assembly_dir))
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("RayitoFleet-mi-agente: ") and " resources, " in lines[0]
    total = int(lines[0].split(": ")[1].split(" ")[0])
    counts = [int(line.split()[0]) for line in lines[1:] if line.strip()[0].isdigit()]
    assert sum(counts) == total
    assert any(line.strip().endswith("AWS::Lambda::MicrovmImage") for line in lines)
    assert lines[-1].startswith("  outputs: ") and "FleetName" in lines[-1]


def test_assembly_json_matches_the_template(assembly_dir) -> None:
    code, text = run("assembly", str(assembly_dir), "--json")
    assert code == 0
    stacks = json.loads(text)
    (name,) = stacks
    template = json.loads((assembly_dir / f"{name}.template.json").read_text())
    types = [r["Type"] for r in template["Resources"].values()]
    assert stacks[name]["resources"] == {t: types.count(t) for t in sorted(set(types))}
    assert stacks[name]["outputs"] == sorted(template["Outputs"])
    assert stacks[name]["bytes"] == (assembly_dir / f"{name}.template.json").stat().st_size


def test_assembly_without_a_synth(capsys, tmp_path) -> None:
    code, text = run("assembly", str(tmp_path))
    assert code == 2 and text == ""
    assert capsys.readouterr().err == f"assembly: {str(tmp_path)!r} has no manifest.json; run the synth first\n"


def test_plan_and_assembly_never_load_verify(tmp_path) -> None:
    """`make synth`'s environment has no boto3 (issue #36): plan and assembly must not import
    verify's checks, and verify without boto3 is one line and exit status 2, not a traceback."""
    script = f"""
import builtins, io, sys
real_import = builtins.__import__
def no_aws(name, *args, **kwargs):
    if name.split(".")[0] in {{"boto3", "botocore"}}:
        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name.split(".")[0])
    return real_import(name, *args, **kwargs)
builtins.__import__ = no_aws
from rayito_constructs.cli import main
assert main(["plan", {str(EXAMPLE)!r}, "--json"], out=io.StringIO()) == 0
assert main(["assembly", {str(tmp_path)!r}], out=io.StringIO()) == 2
assert not [m for m in sys.modules if m.startswith("rayito_constructs.verify.") and m != "rayito_constructs.verify.parser"]
sys.exit(main(["verify", "mi-agente"], out=io.StringIO()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("verify:")]
    assert lines == [
        "verify: needs boto3, which this environment lacks: pip install 'boto3>=1.44' "
        "(installed with rayito-constructs; `make synth` alone installs only what a synth needs)"
    ], done.stderr
    assert "Traceback" not in done.stderr
