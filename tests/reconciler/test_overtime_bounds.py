"""The overtime covering first fills, parked slots and their PENDING VMs, its two caps (3 steps
that list, 10 that do not), run tokens spent on a <= 10 s old list only while the list budget is
empty (never while the list's token is booked: the two cases below), and the first step planning
on the tick's first ledger read.

Through ``index.handler`` (Powertools telemetry, the real boto3 clients, the synthesized
environment) against the MicroVMs emulator and moto; every assertion is from the emulator's side
(its request log and each VM's history), never from what the reconciler says it did."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from .harness import RECONCILER_CALLER, deployed_fleet, peak_live, act_during_sleep

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

ENDED = ("TERMINATING", "TERMINATED")
from lambdas.reconciler.core.lifetimes import CALL_MARGIN_SECONDS as MARGIN  # noqa: E402



def _ours(fleet: Any, operation: str, since: float = 0.0, until: float = float("inf"), ok: Optional[bool] = None) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == operation and r.caller == RECONCILER_CALLER
            and since <= r.time <= until and (ok is None or (r.status < 300) == ok)]


_peak = peak_live


def _dump(fleet: Any, start: float) -> str:
    return "\n".join(f"{r.time - start:7.2f} {r.operation} {r.status}" for r in fleet.emulator.requests
                     if r.caller == RECONCILER_CALLER and r.time >= start)




_hook_sleep = act_during_sleep



def _warm(fleet: Any, monkeypatch: Any) -> Any:
    """The fleet's execution environment, built as the handler builds it, before its first
    invocation (so a test can hook its sleep)."""
    fleet._environment, fleet._built_env = fleet.reconciler(monkeypatch), (dict(fleet.env), True)
    return fleet._environment


# ------------------------------------------------------------------ a fleet that can never fill


@pytest.mark.parametrize("fault", ["InsufficientCapacity", "memory_quota"])
def test_a_fleet_that_never_fills_keeps_its_overtime_within_its_bounds(aws, monkeypatch, fault) -> None:
    """Every RunMicrovm refused (500 InsufficientCapacity, or the 402 memory quota once two VMs
    run): the overtime (short slots are now any wanted slot without a VM) lists at most
    MAX_OVERTIME_STEPS times past the deadline, sends no RunMicrovm past the invocation's time
    less its 8 s margin, and our VMs never pass max_vms. Held: 2 lists past 50 s, last call 55 s."""
    env = {"MIN_VMS": "3", "WARM_VMS": "2", "MAX_VMS": "5"}
    options = {"memory_quota_mib": 8192} if fault == "memory_quota" else {}
    with deployed_fleet(aws, env=env, pending_seconds=2, **options) as fleet:
        if fault == "InsufficientCapacity":
            fleet.emulator.inject("RunMicrovm", fault, times=None, caller=RECONCILER_CALLER)
        start = fleet.clock.now()
        invocation = fleet.invoke(monkeypatch)
        until = start + 65.0 - MARGIN
        assert "lease_lost" not in invocation.result
        assert len(_ours(fleet, "ListMicrovms", start + 50.0 + 1e-3)) <= 3, _dump(fleet, start)
        assert not [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.time > until]
        assert fleet.clock.now() <= until + 1e-3
        assert _peak(fleet, mine=True) <= 5 and len(_ours(fleet, "RunMicrovm", ok=True)) <= 5


@pytest.mark.parametrize("tick, timeout", [("50", 59.0), ("50", 58.3), ("5", 20.0), ("10", 25.0)])
def test_short_invocations_end_their_overtime_before_the_margin(aws, monkeypatch, tick, timeout) -> None:
    """TICK_SECONDS below 50 (the construct gives the function tick + 15 s) and timeouts that
    leave under a second of overtime, with half the runs refused: no call past the invocation's
    remaining time less 8 s, at most three lists past the deadline."""
    budgets = '{"RunMicrovm":[0.0952,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "6", "WARM_VMS": "1", "MAX_VMS": "8", "BUDGETS": budgets, "TICK_SECONDS": tick}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None, caller=RECONCILER_CALLER, probability=0.5)
        start = fleet.clock.now()
        fleet.invoke(monkeypatch, timeout=timeout)
        until = start + timeout - MARGIN
        deadline = start + min(float(tick), timeout - MARGIN)
        assert not [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.time > until], _dump(fleet, start)
        assert fleet.clock.now() <= until + 1e-3
        assert len(_ours(fleet, "ListMicrovms", deadline + 1e-3)) <= 3, _dump(fleet, start)


# ------------------------------------------------------------------ a duplicate delivery in the overtime


@pytest.mark.parametrize("second_timeout", [9.5, 65.0])
def test_a_tick_taken_over_in_its_overtime_makes_no_duplicate(aws, monkeypatch, second_timeout) -> None:
    """Six first fills at 1 RunMicrovm every 10.5 s: the sixth is due at 52.5 s, in the overtime.
    At 51 s a second invocation (a duplicate delivery; 9.5 s: a deadline of 1.5 s, 65 s: a whole
    tick) takes the lease over, as the lease's recorded end (the deadline) allows. Held: the first
    stops at its next write (9.5 s: ``lease_lost``, its booked token unused, the slot left to the
    next tick) or finds nothing to do; one VM per slot, never more than max_vms."""
    budgets = '{"RunMicrovm":[0.0952,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "6", "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        _warm(fleet, monkeypatch)
        start = fleet.clock.now()
        second: list[Any] = []
        done = _hook_sleep(fleet, start + 51.0,
                           lambda: second.append(fleet.invoke(monkeypatch, cold=True, timeout=second_timeout)))
        first = fleet.invoke(monkeypatch, cold=False)
        assert done and second and "skipped" not in second[0].result
        ever = [vm for vm in fleet.emulator.microvms_ever() if vm["imageArn"] == fleet.image]
        assert len({vm["clientToken"] for vm in ever}) == len(ever) <= 6
        assert _peak(fleet) <= 6
        if second_timeout < 10:
            assert first.result.get("lease_lost")
            assert not _ours(fleet, "RunMicrovm", start + 51.0 + 1e-3), _dump(fleet, start)
        else:
            assert len(ever) == 6 and len(fleet.live()) == 6  # the sixth made by the second invocation


# ------------------------------------------------------------------ runs on a list older than the booked one


def _clients_start_after_our_list(aws: str, monkeypatch: Any) -> Any:
    """4 base slots, max_vms 4, 1 RunMicrovm every 3 s, 1 ListMicrovms every 5 s: the tick lists
    at 0 s and runs one VM; at 1 s a client starts 3 VMs of the image; the second run token is due
    at 3 s while the list's is booked for 5 s."""
    budgets = '{"RunMicrovm":[0.3333,1],"ListMicrovms":[0.2,1]}'
    env = {"MIN_VMS": "4", "WARM_VMS": "0", "MAX_VMS": "4", "BUDGETS": budgets}
    cm = deployed_fleet(aws, env=env, pending_seconds=2)
    fleet = cm.__enter__()
    monkeypatch.setattr(fleet, "_cm", cm, raising=False)
    _warm(fleet, monkeypatch)
    start = fleet.clock.now()
    client = fleet.emulator.client(access_key="someone-else")
    _hook_sleep(fleet, start + 1.0, lambda: [client.run_microvm(imageIdentifier=fleet.image, clientToken=f"client-{i}")
                                             for i in range(3)])
    fleet.invoke(monkeypatch, cold=False)
    return fleet


def test_runs_on_a_stale_list_keep_our_vms_within_max_vms(aws, monkeypatch) -> None:
    """Held: our own VMs never pass max_vms (the ledger counts every run of ours), and no
    client's VM is touched."""
    fleet = _clients_start_after_our_list(aws, monkeypatch)
    try:
        assert _peak(fleet, mine=True) <= 4
        clients = {vm["microvmId"] for vm in fleet.emulator.microvms_ever() if vm["clientToken"].startswith("client-")}
        assert not [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.microvm_id in clients]
    finally:
        fleet._cm.__exit__(None, None, None)


def test_runs_on_a_stale_list_do_not_take_the_image_past_max_vms(aws, monkeypatch) -> None:
    """The clients' 3 VMs (started at 1 s) and our first make 4 = max_vms; the run at 3 s on the
    3 s old list made 5 (found at 0a22317, where run tokens due while the list's token was booked
    went out on the last list, up to 10 s old). Now the run waits for the list booked for 5 s,
    which shows them (docs/performance.md: 'runs need a fresh view of max_vms (clients' and
    others' VMs of the image count)')."""
    fleet = _clients_start_after_our_list(aws, monkeypatch)
    try:
        assert _peak(fleet) <= 4, _peak(fleet)
    finally:
        fleet._cm.__exit__(None, None, None)


# ------------------------------------------------------------------ parking in the overtime


@pytest.mark.parametrize("take_at", [4.0, 51.0])
def test_a_parked_vm_a_client_takes_is_never_suspended_again(aws, monkeypatch, take_at) -> None:
    """Two parked slots, 1 SuspendMicrovm every 50 s: the first VM is parked at 2.6 s, the
    second's suspend is deferred to 52.6 s (the overtime). A client resumes the parked VM at
    ``take_at`` (just after it read SUSPENDED, or just before the overtime suspend). Held: the
    client's VM is never suspended again by us (this tick and the next two)."""
    budgets = '{"SuspendMicrovm":[0.02,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "0", "WARM_VMS": "2", "MAX_VMS": "3", "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        _warm(fleet, monkeypatch)
        start = fleet.clock.now()
        client = fleet.emulator.client(access_key="someone-else")
        taken: list[tuple[float, str]] = []

        def take() -> None:
            for vm in fleet.live(("SUSPENDED",)):
                client.resume_microvm(microvmIdentifier=vm["microvmId"])
                taken.append((fleet.clock.now(), vm["microvmId"]))

        _hook_sleep(fleet, start + take_at, take)
        fleet.invoke(monkeypatch, cold=False)
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        fleet.every_minute(monkeypatch, 2)
        assert taken
        for at, vm_id in taken:
            assert not [r for r in _ours(fleet, "SuspendMicrovm", at) if r.microvm_id == vm_id]
        assert len(_ours(fleet, "SuspendMicrovm", ok=True)) >= 2  # the overtime suspend went out
        assert _peak(fleet) <= 3


# ------------------------------------------------------------------ a skewed clock in the overtime


@pytest.mark.stores("dynamodb")  # a skewed clock is learned from DynamoDB's answers
@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_first_fills_in_overtime_with_a_skewed_clock(aws, monkeypatch, skew) -> None:
    """The function's clock 30 s off the service's (the stores' answers dated on the service's):
    the six first fills keep the budget's pace (10.5 s), the sixth goes out past the deadline and
    before the margin, no duplicate. Held."""
    from .support import dynamodb_dates_on

    budgets = '{"RunMicrovm":[0.0952,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "6", "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        reconciler = _warm(fleet, monkeypatch)
        reconciler.clock = lambda: fleet.clock.now() + skew
        dynamodb_dates_on(reconciler, fleet.clock)
        start = fleet.clock.now()
        fleet.invoke(monkeypatch, cold=False)
        runs = [r.time - start for r in _ours(fleet, "RunMicrovm")]
        assert len(runs) == 6 and 50.0 < runs[-1] <= 59.0, runs
        assert all(b - a >= 10.5 - 0.2 for a, b in zip(runs, runs[1:])), runs
        assert len(fleet.live()) == 6 and _peak(fleet) <= 6



# ------------------------------------------------------------------ ends and resumes on a stale list


@pytest.mark.parametrize("list_rate", [0.2, 0.1])
def test_a_parked_vm_a_client_takes_is_not_ended_on_a_stale_list(aws, monkeypatch, list_rate) -> None:
    """1 base VM and 2 parked ones, max_vms 3, and a client's own VM of the image: 4 > 3, so the
    plan ends a parked VM (above_max_vms). The TerminateMicrovm budget (1 every 3 s) was just
    used, the list's (1 every 5 s) too: the tick lists at 0 s, its terminate is due at 3 s, its
    next list at 5 s. At 1 s the client resumes both parked VMs (its sessions): nothing parked is
    left to end. Broke at 0a22317: at 3 s the reconciler terminated one of them, on the 3 s old
    list that still showed it SUSPENDED (``step``'s stale-observation branch left
    ``suspends_only`` False, unlike its ``_last_look`` branch, whose comment says why: a parked VM
    a client may have resumed since). Now that branch ends and resumes nothing either."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "3"}, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 1)
        assert len(fleet.live(("SUSPENDED",))) == 2 and len(fleet.live(("RUNNING",))) == 1
        client = fleet.emulator.client(access_key="someone-else")
        client.run_microvm(imageIdentifier=fleet.image, clientToken="client-own")
        fleet.clock.advance(5.0)  # its VM runs
        # 1 list every 5 s: the next list's token is booked (2 s ahead); every 10 s: the list
        # budget is empty at 3 s (the step runs on the last list then).
        fleet.env["BUDGETS"] = f'{{"ListMicrovms":[{list_rate},1],"TerminateMicrovm":[0.3333,1]}}'
        reconciler = _warm(fleet, monkeypatch)
        start = fleet.clock.now()
        reconciler.offset = 0.0  # the harness's stores date on the machine's clock; the service's is this one
        assert type(reconciler.budget.acquire("TerminateMicrovm", start, cost=1)).__name__ == "Granted"  # the budget's token, used
        taken: list[tuple[float, str]] = []

        def take() -> None:
            for vm in fleet.live(("SUSPENDED",)):
                client.resume_microvm(microvmIdentifier=vm["microvmId"])
                taken.append((fleet.clock.now(), vm["microvmId"]))

        _hook_sleep(fleet, start + 1.0, take)
        fleet.invoke(monkeypatch)  # in the environment built above (the BUDGETS changed: a new one)
        assert len(taken) == 2, _dump(fleet, start)
        for at, vm_id in taken:
            ended = [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.microvm_id == vm_id
                     and r.operation == "TerminateMicrovm" and r.time >= at]
            assert not ended, (vm_id, [r.time - start for r in ended], _dump(fleet, start))


@pytest.mark.parametrize("pending", [19.0, 30.0])
def test_a_parked_slots_pending_vm_in_the_overtime_is_polled_within_bounds(aws, monkeypatch, pending) -> None:
    """Three parked slots at 1 RunMicrovm every 16 s, each VM PENDING ``pending`` s: the last
    (run at 32 s) runs at about 51 s (19 s) or 62 s (30 s). Held: the polls of its PENDING VM stay
    within the overtime's bounds (at most three lists past the deadline, no call past 57 s), no VM
    is parked before it ran, never above max_vms, and the next tick parks what is left at once.
    Found (19 s): the tick's last look (48.7 s) scheduled the next poll at 57.05 s (the plan's
    expected end of PENDING), 0.05 s past the overtime's end, so the VM that runs at about 51 s
    was parked by the next tick (about 62 s). The look is now taken just before the overtime ends
    (OVERTIME_LAST_LOOK_SECONDS), and that VM is parked by this tick."""
    budgets = '{"RunMicrovm":[0.0625,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "0", "WARM_VMS": "3", "MAX_VMS": "3", "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=pending) as fleet:
        start = fleet.clock.now()
        fleet.invoke(monkeypatch)
        past = [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.time > start + 50.0 + 1e-3]
        assert len([r for r in past if r.operation == "ListMicrovms"]) <= 3, _dump(fleet, start)
        assert len(past) <= 3 + 10 + 3, _dump(fleet, start)  # lists, quiet steps' reads, the suspend
        assert not [r for r in past if r.time > start + 59.0], _dump(fleet, start)
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        fleet.every_minute(monkeypatch, 1)
        assert len(_ours(fleet, "RunMicrovm")) == 3 and _peak(fleet) <= 3
        suspended = {r.microvm_id: r.time for r in _ours(fleet, "SuspendMicrovm", ok=True)}
        assert len(suspended) == 3, _dump(fleet, start)
        for vm in fleet.emulator.microvms_ever():
            running = next(at for at, state, _ in vm["history"] if state == "RUNNING")
            assert running <= suspended[vm["microvmId"]] <= max(running, start + 60) + 3.0, _dump(fleet, start)
            if pending == 19.0:  # RUNNING at about 51 s: parked within this tick's overtime
                assert suspended[vm["microvmId"]] <= start + 59.0, _dump(fleet, start)


def test_first_fills_while_clients_hold_max_vms_spend_no_overtime(aws, monkeypatch) -> None:
    """Clients' VMs of the image hold all of max_vms before the fleet's first tick (2 base slots
    and a parked one wanted): no run, and the overtime (which now covers first fills and parked
    slots) is not spent listing for runs that wait for room (clients may hold it for hours). Held."""
    env = {"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "3"}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        client = fleet.emulator.client(access_key="someone-else")
        for i in range(3):
            client.run_microvm(imageIdentifier=fleet.image, clientToken=f"client-{i}")
        fleet.clock.advance(5.0)
        start = fleet.clock.now()
        invocation = fleet.invoke(monkeypatch)
        assert not _ours(fleet, "RunMicrovm") and not invocation.events("tick_overtime")
        assert not [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.time > start + 50.0]
        assert _peak(fleet) <= 3
