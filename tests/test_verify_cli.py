"""``rayito-constructs verify`` as a command: exit statuses, the table and ``--json`` through a pipe,
bad input, a closed pipe, and the real ``python -m rayito_constructs verify`` in a subprocess
against moto and the emulator (no fakes there: moto answers the IAM simulator and Service Quotas
with errors, which must come out as findings, never as a traceback)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any, Iterator

import pytest

from rayito_constructs import AgentProject
from rayito_constructs.cli import _parser
from rayito_constructs.verify import cli as verify_cli

from . import verify_world as vw
from .conftest import EXAMPLE, ROOT

FLEET = "mi-agente"


@pytest.fixture(scope="module")
def world() -> Iterator[vw.World]:
    assembly = vw.synth("example", vw.fleet_stack(AgentProject.load(EXAMPLE), metrics=True))
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        world.deploy(assembly)
        world.tick(f"RayitoFleet-{FLEET}")
        yield world


def run(world: vw.World, *argv: str, out: Any = None, **kwargs: Any) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    args = _parser().parse_args(["verify", *argv])
    kwargs.setdefault("session", world.session())
    kwargs.setdefault("attempts", 2)
    code = verify_cli.run(args, out, err, **kwargs)
    return code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue()


def test_table_and_exit_status(world: vw.World) -> None:
    code, out, err = run(world, FLEET)
    lines = out.rstrip().splitlines()
    assert lines[0].startswith(f"Fleet {FLEET}, stack RayitoFleet-{FLEET} (us-east-1, account {vw.ACCOUNT})")
    assert lines[-1].startswith("verify: ") and lines[-1].endswith(" FAIL")
    failing = int(lines[-1].split(", ")[-1].split()[0])
    assert code == (1 if failing else 0)
    assert "\033[" not in out and err == ""


def test_json_for_machines(world: vw.World) -> None:
    code, out, _ = run(world, FLEET, "--json")
    doc = json.loads(out)
    assert doc["fleet"] == FLEET and doc["exit_code"] == code
    assert doc["summary"] == {s: sum(1 for c in doc["checks"] if c["status"] == s) for s in ("OK", "WARN", "FAIL")}
    for check in doc["checks"]:
        assert check["status"] in ("OK", "WARN", "FAIL") and check["summary"]
        assert (check["fix"] is None) == (check["status"] == "OK") or check["status"] == "OK"


@pytest.mark.parametrize("argv,message", [
    (["no-such-fleet"], "verify: no stack no-such-fleet or RayitoFleet-no-such-fleet"),
    ([FLEET, "--region", "mars"], "is not a region name"),
    ([FLEET, "--launch-timeout", "soon"], "--launch-timeout 'soon' is not a number of seconds"),
    ([FLEET, "--launch-timeout", "nan"], "must be from 10 to 3600 seconds"),
    ([FLEET, "--launch-timeout", "5"], "must be from 10 to 3600 seconds"),
    ([FLEET, "--launch-role", "launcher"], "is not a role ARN"),
    ([FLEET, "--project", "/no/such/folder"], "is not a folder"),
    ([FLEET, "--fleet", "other"], "holds no fleet 'other'"),
    (["   "], "give a fleet name or a stack name"),
    (["ñandú"], "no stack with output FleetName = 'ñandú'"),
    (["two\nlines"], "no stack with output FleetName = 'two\\nlines'"),
    (["x" * 300], "no stack with output FleetName"),
    (["arn:aws:cloudformation:us-east-1:123456789012:stack/Gone/0a1b2c3d-0000-0000-0000-000000000000"], "no stack"),
])
def test_bad_input_exits_2_with_one_line(world: vw.World, argv: list[str], message: str) -> None:
    code, out, err = run(world, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1
    code, out, err = run(world, *argv, "--json")
    doc = json.loads(out)  # JSON on every outcome, a fleet that is not found included
    assert code == 2 and doc["exit_code"] == 2 and message in doc["error"] and doc["checks"] == []
    assert doc["summary"] == {"OK": 0, "WARN": 0, "FAIL": 0} and message in err


@pytest.mark.parametrize("argv,message,target,region", [
    (["verify", "nonexistent", "--json", "--bogus"], "unrecognized arguments: --bogus", "nonexistent", None),
    (["verify", "--json"], "the following arguments are required: fleet-name-or-stack", "", None),
    (["verify", "--region", "eu-west-1", "x", "--json", "--launch-timeout"], "--launch-timeout: expected one argument",
     "x", "eu-west-1"),
    (["verify", "x", "--js", "--bogus"], "unrecognized arguments: --bogus", "x", None),
    (["verify", "x", "--json=1"], "--json: ignored explicit argument '1'", "x", None),
])
def test_a_flag_argparse_refuses_is_json_too(argv: list[str], message: str, target: str, region: str | None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--json`` is JSON on every outcome: a flag the parser refuses (before verify runs) too."""
    from rayito_constructs.cli import main

    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        main(argv, out=out)
    doc = json.loads(out.getvalue())
    assert exited.value.code == 2 and doc["exit_code"] == 2 and message in doc["error"]
    assert doc["target"] == target and doc["region"] == region and doc["checks"] == []
    assert message in capsys.readouterr().err
    if "--json" not in message:  # the same mistake without --json: the line on stderr only
        with pytest.raises(SystemExit):
            main([a for a in argv if not a.startswith("--js")], out=(plain := io.StringIO()))
        assert plain.getvalue() == ""


def test_a_fleet_not_found_names_the_region_searched(world: vw.World) -> None:
    code, out, _ = run(world, "no-such-fleet", "--json")
    doc = json.loads(out)
    assert code == 2 and doc["region"] and doc["region"] in doc["error"]


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return os.open(os.devnull, os.O_WRONLY)


def test_a_closed_pipe_is_quiet(world: vw.World) -> None:
    code, _, err = run(world, FLEET, out=_ClosedPipe())
    assert code in (0, 1) and "Traceback" not in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal(world: vw.World, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Terminal()
    run(world, FLEET, out=out)
    assert "\033[" in out.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Terminal()
    run(world, FLEET, out=out)
    assert "\033[" not in out.getvalue()


def test_the_launch_cost_comes_first(world: vw.World) -> None:
    order: list[str] = []

    def probe(endpoint: str, headers: dict[str, str]) -> int:
        order.append("probe")
        return 200

    err = io.StringIO()

    class _Err(io.StringIO):
        def write(self, text: str) -> int:
            order.append(text.split(":")[0])
            return err.write(text)

    args = _parser().parse_args(["verify", FLEET, "--launch", "--launch-timeout", "30", "--json"])
    out = io.StringIO()
    code = verify_cli.run(args, out, _Err(), session=world.session(), attempts=2, probe=probe)
    doc = json.loads(out.getvalue())  # stdout stays pure JSON
    assert order[0] == "launch" and order.index("probe") > 0
    assert "at most $" in err.getvalue() and doc["notes"][0].startswith("launch: one 4096 MiB MicroVM")
    launch = next(c for c in doc["checks"] if c["check"] == "launch")
    assert launch["status"] == "OK" and code == doc["exit_code"]


def _subprocess(world: vw.World, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": world.endpoint,
           "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": world.emulator.endpoint_url,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "PYTHONPATH": str(ROOT)}
    env.pop("AWS_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "rayito_constructs", "verify", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_the_command_in_a_pipe(world: vw.World) -> None:
    """The real entry point, stdout a pipe: no colour, no traceback for any AWS error (moto does not
    implement the simulator or the Lambda quotas: those checks say so), the summary line last."""
    table = _subprocess(world, FLEET)
    assert "Traceback" not in table.stderr and "Traceback" not in table.stdout, table.stderr
    assert "\033[" not in table.stdout
    last = table.stdout.rstrip().splitlines()[-1]
    assert last.startswith("verify: ") and table.returncode == (1 if not last.endswith(" 0 FAIL") else 0)
    assert "iam.SandboxLauncherPolicy" in table.stdout and "quotas" in table.stdout
    piped = _subprocess(world, FLEET, "--json")
    doc = json.loads(piped.stdout)
    assert piped.returncode == doc["exit_code"] and "Traceback" not in piped.stderr
    wrong = _subprocess(world, "nothing-here", "--json")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
    assert json.loads(wrong.stdout)["error"] == wrong.stderr.strip()


def test_a_closed_stderr_during_launch_still_terminates_the_vm(world: vw.World) -> None:
    """``2>&1 | head -1`` closes verify's stderr while its VM runs: the notes cannot be written, yet
    verify goes on and terminates what it started (SIGPIPE ignored only while launching, then
    restored to what ``rayito-constructs`` set)."""
    import signal

    before = {vm["microvmId"] for vm in world.emulator.microvms_ever()}
    seen: list[Any] = []

    def probe(endpoint: str, headers: dict[str, str]) -> int:
        seen.append(signal.getsignal(signal.SIGPIPE))
        return 200

    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        args = _parser().parse_args(["verify", FLEET, "--launch", "--launch-timeout", "30", "--json"])
        out = io.StringIO()
        code = verify_cli.run(args, out, _ClosedPipe(), session=world.session(), attempts=2, probe=probe)
        assert signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGPIPE, previous)
    assert seen and seen[0] == signal.SIG_IGN
    doc = json.loads(out.getvalue())
    assert code == doc["exit_code"]
    launched = [vm for vm in world.emulator.microvms_ever() if vm["microvmId"] not in before]
    assert len(launched) == 1
    states = [entry[1] for entry in launched[0]["history"]]
    assert "TERMINATED" in states or "TERMINATING" in states, states
