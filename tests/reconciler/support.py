"""What the reconciler's handler scenarios share: ground truth read from the emulator, moto and
the handler's output (duplicates, our calls, members, leaks, sessions), and the hooks that make a
scenario (a killed tick, a store that dates its answers, the handler's clients on every build)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

import pytest

from lambdas.reconciler import core, index

from .harness import RECONCILER_CALLER, deployed_fleet, peak_live, seconds_below, serving


def assert_no_duplicates(fleet) -> None:
    """At most one live VM per slot generation token, and no VM in two slots."""
    tokens = Counter(vm["clientToken"] for vm in fleet.ours())
    assert all(n == 1 for n in tokens.values()), tokens
    held = [i for s in fleet.ledger_slots().values() for i in (s["microvm_id"], s["retiring_id"]) if i]
    assert len(held) == len(set(held)), held


def ours(fleet, operation: str, since: float = 0.0) -> list[Any]:
    return [r for r in fleet.emulator.requests
            if r.operation == operation and r.caller == RECONCILER_CALLER and r.time >= since]


def members(fleet: Any) -> list[str]:
    return [s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "member"]


class _Killed(BaseException):
    """The Lambda was killed: nothing more runs in it, not even ``finally`` blocks' writes."""


class _KilledAfter:
    """A client or store of an execution environment that dies after ``left`` MicroVMs calls."""

    def __init__(self, target, state: dict, counts: bool) -> None:
        self._target, self._state, self._counts = target, state, counts

    def __getattr__(self, name: str):
        attribute = getattr(self._target, name)
        if not callable(attribute) or name.startswith("_") or name == "exceptions":
            return attribute

        def call(*args, **kwargs):
            if self._state["left"] <= 0:
                raise _Killed(name)
            if self._counts:
                self._state["left"] -= 1
            return attribute(*args, **kwargs)

        return call


def kill_a_tick_after(fleet, monkeypatch, left: int) -> None:
    """One warm invocation whose execution environment dies after ``left`` MicroVMs calls (its
    client, ledger and telemetry all stop there: nothing after the last call is written down)."""
    dying = fleet.reconciler(monkeypatch)
    state = {"left": left}
    dying.microvms = _KilledAfter(dying.microvms, state, counts=True)
    dying.ledger = _KilledAfter(dying.ledger, state, counts=False)
    dying.telemetry = _KilledAfter(dying.telemetry, state, counts=False)
    index._RECONCILER = dying
    with pytest.raises(_Killed):
        fleet.invoke(monkeypatch, cold=False)


def dynamodb_dates_on(reconciler, clock) -> None:
    """DynamoDB's answers dated on the shared clock (moto dates them on the machine's real one):
    a ``Date`` header rewritten before the reconciler's own hook reads it."""
    from email.utils import formatdate

    def redate(parsed=None, **_):
        if isinstance(parsed, dict):
            parsed.setdefault("ResponseMetadata", {}).setdefault("HTTPHeaders", {})["date"] = formatdate(
                clock.now(), usegmt=True)

    reconciler.ledger._ddb.meta.events.register_first("after-call.dynamodb", redate)


def _holds(found: dict) -> None:
    assert found["errors"] == []
    assert found["peak"] <= found["max_vms"]
    assert found["runs"] <= found["churn_bound"], found
    assert found["below"] == 0.0, found


def _calls_of(fleet: Any, operation: str, *, caller: Optional[str] = RECONCILER_CALLER) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == operation and (caller is None or r.caller == caller)]


def _touched_foreign(fleet: Any) -> list[Any]:
    """Our Suspend/Resume/Terminate calls on a VM no token of ours started (ground truth)."""
    foreign = {vm["microvmId"] for vm in fleet.emulator.microvms_ever()
               if not (vm["clientToken"] or "").startswith("rz1-")}
    return [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.microvm_id in foreign
            and r.operation in ("SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm")]


def _drive(aws: str, monkeypatch: Any, *, lifetime: int, min_vms: int, max_vms: int, warm_vms: int = 0,  
           pending_seconds: float = 2, period: int = 60, looks: int = 0, tick: int = 50,
           env: Optional[dict[str, str]] = None, arm: Optional[Callable[[Any], None]] = None,
           each: Optional[Callable[[Any, int], None]] = None, spec_lead: Optional[float] = None,
           check: Optional[Callable[[Any], None]] = None, skew: float = 0.0) -> dict:
    """As ``test_reconciler_attack_short._run`` (deploy, fill with two looks a minute apart, then a
    look every ``period`` s with ticks of ``tick`` s for a lifetime and a half), with hooks:
    ``arm(fleet)`` once the fleet is filled (faults, client VMs), ``each(fleet, n)`` after each
    later look, ``check(fleet)`` at the end. Measured from the emulator from the fill on."""
    values = {"MIN_VMS": str(min_vms), "WARM_VMS": str(warm_vms), "MAX_VMS": str(max_vms),
              "MAX_LIFETIME_SECONDS": str(lifetime), "IDLE_SECONDS": "", "SCHEDULE_SECONDS": str(period),
              "TICK_SECONDS": str(tick)}
    values.update(env or {})
    values = {k: v for k, v in values.items() if v is not None}
    # A skewed clock is learned from DynamoDB's answers (dynamodb_dates_on): those scenarios keep moto's tables.
    stores = "dynamodb" if skew else None
    with deployed_fleet(aws, env=values, pending_seconds=pending_seconds, stores=stores) as fleet:
        for key in [k for k, v in (env or {}).items() if v is None]:
            fleet.env.pop(key, None)
            monkeypatch.delenv(key, raising=False)
        if skew:
            from contextlib import redirect_stdout

            with redirect_stdout(fleet._stdout):
                reconciler = fleet.reconciler(monkeypatch)
            dynamodb_dates_on(reconciler, fleet.clock)
            reconciler.clock = lambda: fleet.clock.now() + skew
            fleet._environment, fleet._built_env = reconciler, (dict(fleet.env), True)
        start = fleet.t0 = fleet.clock.now()
        looks = looks or max(10, 3 * lifetime // (2 * period))
        for n in range(2 + looks):
            begun = fleet.clock.now()
            fleet.invoke(monkeypatch, timeout=tick + 15)
            if n == 1:
                filled = fleet.clock.now()
                assert len(serving(fleet)) >= min_vms
                if arm:
                    arm(fleet)
            elif n > 1 and each:
                each(fleet, n)
            rest = begun + (60 if n < 2 else period) - fleet.clock.now()
            if rest > 0:
                fleet.clock.advance(rest)
        end = fleet.clock.now()
        assert_no_duplicates(fleet)
        if check:
            check(fleet)
        runs = _calls_of(fleet, "RunMicrovm")
        errors = [r for i in fleet.invocations for r in i.events() if r.get("level") in ("ERROR", "CRITICAL")]
        lead = spec_lead if spec_lead is not None else core.successor_lead(core.FleetSpec(
            "f", "arn", min_vms, max_vms, warm_vms=warm_vms, max_lifetime_seconds=lifetime,
            look_period_seconds=period))
        return {"below": seconds_below(fleet, min_vms, filled, end), "peak": peak_live(fleet), "runs": len(runs),
                "churn_bound": (min_vms + warm_vms) * (1 + (end - start) / (lifetime - lead)) + 1,
                "errors": errors, "max_vms": max_vms, "foreign_touched": _touched_foreign(fleet),
                "terminates": [(round(r.time - start, 1), r.status, r.microvm_id)
                               for r in _calls_of(fleet, "TerminateMicrovm")],
                "dead_letters": fleet.dead_letters(), "fleet_end": end - start}


def sqs_client_of(reconciler: Any) -> Any:
    """The SQS client ``index.build`` made for the dead letters (in the sink's closure)."""
    for cell in reconciler.dead_letters.__closure__ or ():
        value = cell.cell_contents
        if hasattr(value, "send_message"):
            return value
    raise AssertionError("no SQS client in the dead-letter sink")


def on_every_build(monkeypatch, install: Callable[[Any], None]) -> None:
    """``install(reconciler)`` on every execution environment ``index.build`` makes."""
    built = index.build

    def build(*args: Any, **kwargs: Any) -> Any:
        reconciler = built(*args, **kwargs)
        install(reconciler)
        return reconciler

    monkeypatch.setattr(index, "build", build)


def catch_crashes(monkeypatch) -> list[str]:
    """The handler's exceptions, recorded instead of raised (the schedule goes on, as Lambda's)."""
    crashes: list[str] = []
    handler = index.handler

    def caught(event: Any, context: Any) -> Any:
        try:
            return handler(event, context)
        except Exception as exc:  # noqa: BLE001 - what Lambda's runtime does with it
            crashes.append(f"{type(exc).__name__}: {exc}"[:300])
            return {"crashed": crashes[-1]}

    monkeypatch.setattr(index, "handler", caught)
    return crashes


class Http:
    """What botocore needs of an HTTP response a ``before-call`` handler answers with."""

    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers: dict[str, str] = {}
        self.content = b""
        self.raw = None


def error_answer(code: str, status: int = 400, message: str = "injected", **extra: Any) -> tuple[Http, dict]:
    parsed = {"Error": {"Code": code, "Message": message},
              "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}}, **extra}
    return Http(status), parsed


def leaked(fleet) -> list[str]:
    """Live VMs of our tokens that no slot of the ledger holds (foreign to the fleet forever)."""
    held = {i for s in fleet.ledger_slots().values() for i in (s["microvm_id"], s["retiring_id"]) if i}
    return sorted(vm["microvmId"] for vm in fleet.ours() if vm["microvmId"] not in held)


def _shape(min_vms: int, warm_vms: int, max_vms: int, **more: Any) -> dict[str, str]:
    env = {"MIN_VMS": str(min_vms), "WARM_VMS": str(warm_vms), "MAX_VMS": str(max_vms), "IDLE_SECONDS": ""}
    env.update({k: str(v) for k, v in more.items()})
    return env


def _requests(fleet, operation: str, caller: Optional[str] = RECONCILER_CALLER, since: float = float("-inf")) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == operation and r.time >= since
            and (caller is None or r.caller == caller)]


def _errors(fleet) -> list[dict]:
    return [r for i in fleet.invocations for r in i.events() if r.get("level") in ("ERROR", "CRITICAL")]


def _held_twice(fleet) -> list[str]:
    """VMs two slots of the ledger (moto's items) hold."""
    held = [i for s in fleet.ledger_slots().values() for i in (s["microvm_id"], s["retiring_id"]) if i]
    return [i for i, n in Counter(held).items() if n > 1]


def _ours(fleet) -> Counter:
    return Counter(vm["state"] for vm in fleet.ours())


def room_taken_from_the_base_vm(fleet, monkeypatch) -> tuple[str, str, float]:
    """For min 1 / warm 1 / max 2 under an account's memory quota of 3 VMs: a client's VM of another
    app, then two minutes of ticks (the base VM and the parked one); then a client ends the base
    VM and another session of that app takes the room it freed, so base-0's next run is refused
    for room (402). Returns the ended base VM, the parked VM and when the base VM was ended."""
    client = fleet.emulator.direct_client(caller="client")
    if not fleet.emulator.has_image("otra"):
        fleet.emulator.create_image("otra", memory_mib=4096)
    other = fleet.emulator.image_arn("otra")
    client.run_microvm(imageIdentifier=other, clientToken="otra-0")
    fleet.every_minute(monkeypatch, 2)
    assert _ours(fleet) == {"RUNNING": 1, "SUSPENDED": 1}, _ours(fleet)
    slots = fleet.ledger_slots()
    base_vm, parked_vm = slots["base-0"]["microvm_id"], slots["warm-0"]["microvm_id"]
    ended = fleet.clock.now()
    fleet.emulator.terminating_seconds, fleet.emulator.terminated_linger_seconds = 0.1, 0.2
    client.terminate_microvm(microvmIdentifier=base_vm)
    fleet.clock.advance(1)
    client.run_microvm(imageIdentifier=other, clientToken="otra-1")  # the room the base VM freed
    return base_vm, parked_vm, ended


def _ended_sessions(fleet, count: int) -> None:
    """``count`` client sessions of the image started and ended (TERMINATED VMs stay listed 20
    minutes), with the service's rate limits lifted meanwhile and put back after."""
    client = fleet.emulator.direct_client(caller="client")
    fleet.emulator.set_rate_limit("RunMicrovm", 100000, 100000)
    fleet.emulator.set_rate_limit("TerminateMicrovm", 100000, 100000)
    for i in range(count):
        vm = client.run_microvm(imageIdentifier=fleet.image, clientToken=f"session-{i}")["microvmId"]
        client.terminate_microvm(microvmIdentifier=vm)
    fleet.emulator.set_rate_limit("RunMicrovm", 5, 5)
    fleet.emulator.set_rate_limit("TerminateMicrovm", 10, 10)


def _reused_tokens(fleet, since: float) -> list[tuple[float, int, str]]:
    """Our RunMicrovm calls after ``since`` whose client token had already made a VM before the
    call (the service answers with that VM, or a 409 naming it): (time, status, its state now)."""
    made = {}
    for vm in fleet.emulator.microvms_ever():
        made.setdefault(vm["clientToken"], (vm["history"][0][0], vm["state"]))
    return [(round(r.time - since, 1), r.status, made[r.client_token][1]) for r in _requests(fleet, "RunMicrovm")
            if r.time >= since and r.client_token in made and made[r.client_token][0] < r.time - 1e-6]
