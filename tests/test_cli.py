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
    assert doc["name"] == "mi-agente" and doc["product"] == {"package": "rayito", "version": "0.17.1", "runtime": "custom"}
    assert doc["serve"] == {"port": 8088, "timeout_seconds": 3600, "idle_seconds": 600, "max_concurrency": 2,
                            "queue_max": 4, "queue_timeout_seconds": 30, "max_concurrency_limit": 15}
    assert doc["scaling"] == {"min_vms": 1, "max_vms": 3, "warm_vms": 1, "sessions": "shared",
                              "scale_in_after_seconds": 900}
    assert doc["scaling_source"] == "project"
    assert doc["image"] == {"name": "mi-agente", "memory_mib": 4096, "architecture": "ARM_64"}
    recipe = doc["recipe"]
    assert recipe["parameter_name"] == "/rayito/agents/mi-agente/recipe" and recipe["saved"] is True
    assert recipe["schema"] == "rayito.agent-recipe/1" and recipe["saved_by"] == "python/0.17.1"
    assert recipe["encoding"] == "json" and 0 < recipe["bytes"] <= 4096
    assert recipe["document"]["scaling"] == {"maxVms": 3, "minVms": 1, "scaleInAfterSeconds": 900,
                                             "sessions": "shared", "warmVms": 1}
    assert recipe["document"]["project"]["serve"]["idle_seconds"] == 600
    assert doc["egress_budgets"] == [
        {"target": "https://api.example.com", "rate_per_second": 1.0, "burst": 5},
        {"target": "https://api.example.com/v1/search?region", "rate_per_second": 0.5, "burst": 2},
    ]
    assert doc["allow_out"] == ["bedrock-runtime.us-east-1.amazonaws.com", "api.example.com"]
    # 1 base VM at the page's $0.25/hour for 4 GB that suspends after 600 s idle: it runs 600 s of
    # each 8-hour life, the rest is snapshot storage at $0.011/day; 1 parked slot at $0.011/day.
    cost = doc["cost"]
    assert cost["priced"] and cost["vm_hour_usd"] == 0.25 and cost["suspended_vm_day_usd"] == 0.011
    assert cost["warm_slots_monthly_usd"] == pytest.approx(0.33)
    assert cost["checked"] == {"fleet": "2026-10-06", "recipe": "2026-10-22"}
    assert cost["assumptions"]["hours_per_month"] == 730 and cost["assumptions"]["idle_seconds"] == 600
    assert doc["stack_name"] == "RayitoFleet-mi-agente"
    # The secrets its sessions read, as the product names them (its gateway's key under rayito/).
    assert doc["secrets"] == {"gateways": ["rayito/provider-key"], "secret_env": []}


def test_plan_lists_the_secrets_to_create(tmp_path) -> None:
    """The stack grants the secrets the sessions read and never creates one: ``plan`` lists each
    as the product reads it (a gateway's key under ``rayito/``, a ``secret_env`` id as written)."""
    from .projects import write_project

    folder = write_project(tmp_path / "secreto", name="secreto",
                           tables={"secret_env": {"DB_PASSWORD": "prod/db-password"}})
    code, text = run("plan", str(folder), "--json")
    assert code == 0
    assert json.loads(text)["secrets"] == {"gateways": ["rayito/provider-key"], "secret_env": ["prod/db-password"]}
    code, text = run("plan", str(folder))
    listed = text.split("\nSecrets the sessions read", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert code == 0 and listed == ["  rayito/provider-key", "  prod/db-password"]


def test_flags_of_rayito_agent_deploy() -> None:
    code, text = run(
        "plan", str(EXAMPLE), "--json", "--memory", "2048", "--max-sessions", "1", "--queue", "0",
        "--queue-timeout", "60", "--min-vms", "2", "--max-vms", "4", "--warm", "2", "--sessions",
        "shared", "--scale-in-after", "120", "--idle", "900", "--timeout", "1800", "--env", "EXTRA=1",
        "--secret-env", "DB_URL=app/db#url", "--allow-out", "example.org", "--no-save-recipe",
    )
    assert code == 0
    doc = json.loads(text)
    assert doc["scaling"] == {"min_vms": 2, "max_vms": 4, "warm_vms": 2, "sessions": "shared",
                              "scale_in_after_seconds": 120}
    assert doc["serve"]["max_concurrency"] == 1 and doc["serve"]["idle_seconds"] == 900
    assert doc["serve"]["queue_timeout_seconds"] == 60 and doc["serve"]["timeout_seconds"] == 1800
    assert doc["scaling_source"] == "explicit" and doc["sources"]["max_vms"] == "explicit"
    assert "EXTRA" in doc["env"] and doc["secret_env"] == {"DB_URL": "app/db"}
    assert doc["allow_out"] == ["example.org"]
    assert doc["recipe"] == {"parameter_name": "/rayito/agents/mi-agente/recipe", "saved": False,
                             "reason": "save_recipe is off (--no-save-recipe): no recipe is saved"}


def _noise(size: int) -> str:
    """Text that gzip cannot shrink much: a recipe holding it is too large even as gzip+base64."""
    import random

    rng = random.Random(3)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size))


def test_a_recipe_too_large_is_planned_as_the_synth_says(capsys, agent_folder) -> None:
    """With no recipe the reconciler is off by default (``no_reconciler``): plan said only
    ``recipe_too_large`` while the synth went on to warn ``no_reconciler``; now plan prints the
    synth's own warning, in --json and in its text, and refuses ``[stack] reconciler = true`` as
    the synth does."""
    from aws_cdk.assertions import Annotations, Match

    from rayito_constructs import AgentFleet, AgentProject

    from .cdk_helpers import new_app, new_stack

    folder = agent_folder(name="big", agent={"instructions": _noise(9000)})
    code, text = run("plan", str(folder), "--json")
    assert code == 0
    warnings = {w["code"]: w["message"] for w in json.loads(text)["warnings"]}
    assert list(warnings) == ["recipe_too_large", "no_reconciler"]
    stack = new_stack(new_app())
    AgentFleet(stack, "Fleet", project=AgentProject.load(folder), build_image=False)
    (synth,) = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^no_reconciler: "))
    assert synth.entry.data == f"no_reconciler: {warnings['no_reconciler']} [ack: rayito:no_reconciler]"  # same words
    code, text = run("plan", str(folder))
    assert code == 0 and f"  no_reconciler: {warnings['no_reconciler']}\n" in text
    code, text = run("plan", str(EXAMPLE), "--no-save-recipe", "--json")
    assert [w["code"] for w in json.loads(text)["warnings"]] == ["no_reconciler"]
    assert run("plan", str(EXAMPLE), "--json")[0] == 0 and "no_reconciler" not in run("plan", str(EXAMPLE))[1]
    kept = agent_folder(name="kept", agent={"instructions": _noise(9000)}, stack={"reconciler": True})
    capsys.readouterr()
    code, text = run("plan", str(kept))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    (line,) = err
    assert code == 2 and text == ""
    assert line.startswith("rayito-constructs.toml: stack.reconciler: True needs the fleet's recipe, and the recipe is ")
    off = agent_folder(name="off", agent={"instructions": _noise(9000)}, stack={"reconciler": False})
    assert [w["code"] for w in json.loads(run("plan", str(off), "--json")[1])["warnings"]] == ["recipe_too_large"]


def test_plan_for_a_person() -> None:
    code, text = run("plan", str(EXAMPLE))
    assert code == 0
    assert "Fleet mi-agente (custom runtime, rayito 0.17.1), scaling from: project" in text
    assert "/rayito/agents/mi-agente/recipe  SecureString, standard tier, rayito.agent-recipe/1, json" in text
    assert "max_vms" in text and "checked 2026-10-06" in text
    assert "budget https://api.example.com  " in text and "60/minute, burst 5" in text


def test_invalid_input_exit_2_one_line(capsys) -> None:
    code, text = run("plan", str(EXAMPLE), "--warm", "x")
    assert code == 2 and text == ""
    assert capsys.readouterr().err.splitlines() == ["--warm: 'x' is not a whole number"]
    code, text = run("plan", str(EXAMPLE), "--env", "GITHUB_TOKEN=1")
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and line.startswith("--env: GITHUB_TOKEN: ") and "=1" not in line
    code, text = run("plan", str(EXAMPLE), "--max-vms", "65")
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and line.startswith("--max-vms: 65: ") and "64" in line


def test_plan_of_a_recipe_takes_no_flags(capsys, tmp_path) -> None:
    saved = tmp_path / "r.json"
    saved.write_text("{}")
    code, _ = run("plan", "--recipe", str(saved), "--max-vms", "3")
    assert code == 2 and "cannot be given with it" in capsys.readouterr().err
    code, _ = run("plan", "--recipe", str(tmp_path / "none.json"))
    assert code == 2 and "cannot read" in capsys.readouterr().err
    code, _ = run("plan")
    assert code == 2 and "give the agent folder" in capsys.readouterr().err


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
    folder = str(agent_folder(scaling={"max_vms": 2}))
    # A rule between a flag and the file names the flag that broke it; the file's own mistakes
    # name the file's key.
    (line,) = plan_errors(capsys, folder, "--min-vms", "3")
    assert line.startswith("--min-vms: 3: ")
    assert plan_errors(capsys, folder, "--memory", "3000")[0].startswith("--memory: 3000 is not a MicroVM size class")
    (line,) = plan_errors(capsys, str(agent_folder(serve={"idle_seconds": 30}, name="idle")))
    assert line.startswith("serve.idle_seconds = 30: ")


def test_a_folder_the_product_cannot_detect(capsys, tmp_path) -> None:
    folder = tmp_path / "empty_agent"
    folder.mkdir()
    (line,) = plan_errors(capsys, str(folder))
    assert line.startswith("source: ") and "(not_detected)" in line


def test_plan_checks_the_image_as_synth_when_the_folder_has_the_stack_build_it(tmp_path) -> None:
    """``plan`` reads no ``-c`` context: when the folder's own ``[stack]`` has the stack build the
    image, a folder the product's build refuses is refused there in synth's line (exit 2); a stack
    that runs a published image builds nothing, and plan reads none of the folder's files for it."""
    import contextlib

    from .projects import scaffold

    folder = scaffold(tmp_path / "ts", "strands", "typescript", "anthropic")
    (folder / "package-lock.json").unlink(missing_ok=True)
    code, out = run("plan", str(folder), "--json")
    assert code == 0 and not [w for w in json.loads(out)["warnings"] if w["code"] == "build_context_secrets"]
    (folder / "rayito-constructs.toml").write_text('[stack]\nbase_image = "rayito-base-caps"\n')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code, out = run("plan", str(folder))
    assert code == 2 and out == ""
    assert err.getvalue().splitlines() == [
        "source: the product cannot build this project's image (la ruta de contexto no existe: app/package-lock.json; "
        "context_path_missing): the source folder must hold package-lock.json, not excluded from the build context "
        "(npm install writes it)"]
    (folder / "package-lock.json").write_text("{}\n")
    (folder / "server.pem").write_text("-----BEGIN CERTIFICATE-----\n")  # the product notes such files
    code, out = run("plan", str(folder), "--json")
    notes = [w["message"] for w in json.loads(out)["warnings"] if w["code"] == "build_context_secrets"]
    assert code == 0 and len(notes) == 1 and "server.pem" in notes[0], notes


def test_plan_of_files_a_zip_cannot_hold_is_one_line(tmp_path) -> None:
    """A file name that is not UTF-8 cannot go into the image's zip: one line, not a traceback."""
    import contextlib

    from .projects import write_project

    folder = write_project(tmp_path / "raro", name="raro", tables={"stack": {"base_image": "rayito-base-caps"}})
    (folder / os.fsdecode(b"mal\xff.txt")).write_text("x")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code, _ = run("plan", str(folder))
    (line,) = err.getvalue().splitlines()
    assert code == 2 and line.startswith("source: the project's files cannot be packed into its image (")


def test_a_gateway_on_a_webhook_secret_is_one_line_at_plan(tmp_path) -> None:
    """The product never lets a session read its webhook signing secrets; plan refuses as synth does."""
    from .projects import write_project

    folder = write_project(tmp_path / "wh", name="wh", tables={"gateways": {"svc": {
        "preset": "custom", "upstream": "https://api.example.com", "allow": [["POST", "/v1/*"]],
        "headers": {"Authorization": "webhooks/x"}}}})
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = main(["plan", str(folder)], out=out)
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue().splitlines() == ["gateways.svc: 'rayito/webhooks/x' is under rayito/webhooks/, the product's "
                                           "webhook signing secrets, which a session never reads; name another secret"]


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
    """plan and assembly (issue #36) load none of verify's checks: only its argument parser."""
    script = f"""
import io, sys
from rayito_constructs.cli import main
assert main(["plan", {str(EXAMPLE)!r}, "--json"], out=io.StringIO()) == 0
assert main(["assembly", {str(tmp_path)!r}], out=io.StringIO()) == 2
loaded = [m for m in sys.modules if m.startswith("rayito_constructs.verify.")]
assert loaded == ["rayito_constructs.verify.parser"], loaded
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
