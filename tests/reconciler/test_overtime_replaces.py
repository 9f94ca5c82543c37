"""A base VM that nothing can replace before its end (``max_vms == min_vms``, nothing parked) is
replaced the moment it ends, also when the end falls between a tick's deadline (50 s) and the next
scheduled tick: the tick works past its deadline for it, within what the invocation has left
(``overtime_seconds``). Before, such an end waited for the next tick: up to 10 s more below
``min_vms`` (the 37-fleet benchmark day, seed 5).

Through ``index.handler`` with its Powertools telemetry, against the emulator and moto; every
time asserted is the emulator's (its request log and each VM's history)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .harness import RECONCILER_CALLER, deployed_fleet, seconds_below

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

NO_HEADROOM = {"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2", "IDLE_SECONDS": ""}


def _next_end(fleet: Any) -> tuple[float, str]:
    """When the first of the fleet's live VMs reaches its maximum lifetime, and which."""
    live = {vm["microvmId"] for vm in fleet.live()}
    ends = [(vm["servesUntil"], vm["microvmId"])
            for vm in fleet.emulator.microvms_ever() if vm["microvmId"] in live]
    return min(ends)


def _runs_after(fleet: Any, t: float) -> list[float]:
    return [r.time for r in fleet.emulator.requests
            if r.operation == "RunMicrovm" and r.caller == RECONCILER_CALLER and r.time >= t]


def _converged(aws: str, monkeypatch: Any, **env: str) -> Any:
    fleet_cm = deployed_fleet(aws, env={**NO_HEADROOM, **env}, pending_seconds=2)
    fleet = fleet_cm.__enter__()
    monkeypatch.setattr(fleet, "_cm", fleet_cm, raising=False)
    fleet.every_minute(monkeypatch, 2)
    assert len(fleet.live(("RUNNING",))) == 2
    return fleet


@pytest.fixture
def fleet(aws: str, monkeypatch: Any) -> Iterator[Any]:
    f = _converged(aws, monkeypatch)
    try:
        yield f
    finally:
        f._cm.__exit__(None, None, None)


def _tick_starting_before_end(fleet: Any, monkeypatch: Any, before: float, timeout: float = 65.0) -> tuple[Any, float, str]:
    """Move the clock to ``before`` seconds ahead of the next end and invoke the handler."""
    end, vm_id = _next_end(fleet)
    fleet.clock.advance(end - before - fleet.clock.now())
    start = fleet.clock.now()
    invocation = fleet.invoke(monkeypatch, timeout=timeout)
    return invocation, end - start, vm_id


@pytest.mark.parametrize("into_tick", [50.5, 55.5])
def test_an_end_after_the_deadline_is_replaced_in_overtime(fleet, monkeypatch, into_tick) -> None:
    """The end in the gap is replaced in overtime, 1 s after it, within the invocation's time.
    Below min_vms for the wake (1 s), the successor's PENDING (2 s) and the server's answer that it
    serves (~2 s): 4.98 s measured (3 s before the fleet was served)."""
    invocation, _, vm_id = _tick_starting_before_end(fleet, monkeypatch, into_tick)
    end = _next_end_of(fleet, vm_id)
    runs = _runs_after(fleet, end)
    assert runs and runs[0] - end <= 2.5, (end, runs)  # end + EXPIRY_WAKE_SECONDS (1 s) + the list
    assert invocation.events("tick_overtime")
    assert fleet.clock.now() - (end - into_tick) <= 59.0 + 1.0  # within the invocation's time, margin kept
    fleet.every_minute(monkeypatch, 1)
    assert seconds_below(fleet, int(fleet.env["MIN_VMS"]), end - 5, end + 30) <= 5.5
    assert len(fleet.live()) <= 2


@pytest.mark.parametrize("into_tick", [50.5, 55.5])
def test_an_end_after_the_deadline_costs_one_overtime_step(fleet, monkeypatch, into_tick) -> None:
    """(Split from the test above, unchanged.) The end in the gap costs one overtime step: the one
    that lists 1 s after it and runs the successor."""
    invocation, _, vm_id = _tick_starting_before_end(fleet, monkeypatch, into_tick)
    assert len(invocation.events("tick_overtime")) == 1, [e["wake"] for e in invocation.events("tick_overtime")]


def _next_end_of(fleet: Any, vm_id: str) -> float:
    vm = next(v for v in fleet.emulator.microvms_ever() if v["microvmId"] == vm_id)
    return vm["servesUntil"]


def test_the_overtime_ends_before_the_invocation_does(fleet, monkeypatch) -> None:
    """With the default timeout (65 s) and call margin (6 s), an end at 59 s (wake at 60 s) is past
    the overtime: the next tick (at 60 s) replaces it, at once."""
    invocation, _, vm_id = _tick_starting_before_end(fleet, monkeypatch, 59.0)
    end = _next_end_of(fleet, vm_id)
    assert not invocation.events("tick_overtime")
    assert not _runs_after(fleet, end)
    tick_start = end - 59.0
    fleet.clock.advance(tick_start + 60 - fleet.clock.now())
    fleet.invoke(monkeypatch)
    runs = _runs_after(fleet, end)
    assert runs and runs[0] - (tick_start + 60) <= 1.0, runs


def test_no_time_left_no_overtime(fleet, monkeypatch) -> None:
    """An invocation with no more than its deadline and margin left (timeout 58 s) works no
    overtime: the end at 53 s waits for the next tick."""
    invocation, _, vm_id = _tick_starting_before_end(fleet, monkeypatch, 53.0, timeout=58.0)
    end = _next_end_of(fleet, vm_id)
    assert not invocation.events("tick_overtime")
    assert not _runs_after(fleet, end)


def test_overtime_is_for_ends_nothing_can_replace_before(aws, monkeypatch) -> None:
    """With one slot of headroom the successor starts before the end (SUCCESSOR_LEAD_SECONDS):
    no tick works past its deadline, through every first VM's end."""
    f = _converged(aws, monkeypatch, MAX_VMS="3", MAX_LIFETIME_SECONDS="1500", SUCCESSOR_LEAD_SECONDS="300")
    try:
        t0 = f.clock.now()
        runs = f.every_minute(monkeypatch, 26)
        assert not [r for r in runs if r.events("tick_overtime")]
        assert len(_runs_after(f, 0)) >= 4  # 2 first VMs and their 2 successors at least
        assert seconds_below(f, int(f.env["MIN_VMS"]), t0, f.clock.now()) == 0.0
    finally:
        f._cm.__exit__(None, None, None)


def test_no_overtime_while_clients_hold_the_room_under_max_vms(fleet, monkeypatch) -> None:
    """The base VM ends in the gap while a client's session VM of the image holds the one slot
    of headroom there is (max 2: the other base VM and the client's): its replacement waits for
    room, and the tick does not spend its overtime listing for a run it may not make (clients may
    hold the room for hours)."""
    fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken="client-session-1")
    end, vm_id = _next_end(fleet)
    fleet.clock.advance(end - 52.0 - fleet.clock.now())
    start = fleet.clock.now()
    invocation = fleet.invoke(monkeypatch)
    assert not _runs_after(fleet, end)
    overtime_lists = [r for r in fleet.emulator.requests
                      if r.operation == "ListMicrovms" and r.caller == RECONCILER_CALLER and r.time > start + 50]
    assert len(overtime_lists) <= 1, [r.time - end for r in overtime_lists]  # the end's own look
    assert len(invocation.events("tick_overtime")) <= 1


# --------------------------------------------------------------------------- convergence past the deadline


def _reconciler_requests(fleet: Any, operation: str) -> list[float]:
    return [r.time for r in fleet.emulator.requests if r.operation == operation and r.caller == RECONCILER_CALLER]


@pytest.mark.parametrize("rate, fills", [(1 / 10.5, 6), (1 / 17.5, 4), (1 / 1.5, 38)])
def test_first_fills_that_come_due_past_the_deadline_are_made_in_overtime(aws, monkeypatch, rate, fills) -> None:
    """A fleet from empty whose last RunMicrovm token comes due just past the tick's 50 s deadline
    (the shared budget: 1 every 10.5 s, the sixth at 52.5 s; 1 every 17.5 s, the fourth at
    52.5 s) makes it in overtime, not a minute later with the next tick (the 36-fleet benchmark
    run, seed 19, missed its convergence goal by 1.5 s that way). Steps that do not list (they
    wait for their tokens, or run on the step's list: 1 every 1.5 s, four runs past the deadline)
    do not use up the overtime's three steps; the budget's pace holds."""
    budgets = f'{{"RunMicrovm":[{rate},1],"ListMicrovms":[5,5]}}'
    env = {"MIN_VMS": str(fills), "WARM_VMS": "0", "MAX_VMS": str(fills), "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        start = fleet.clock.now()
        invocation = fleet.invoke(monkeypatch)
        runs = [t - start for t in _reconciler_requests(fleet, "RunMicrovm")]
        assert len(runs) == fills, runs
        assert 50.0 < runs[-1] <= 59.0, runs  # past the deadline, within the invocation's time less its margin
        assert all(b - a >= 1 / rate - 0.2 for a, b in zip(runs, runs[1:])), runs  # as budgeted
        assert invocation.events("tick_overtime") and not fleet.emulator.throttled
        assert fleet.clock.now() - start <= 59.0 + 1.0
        assert len(fleet.live()) == fills


def test_a_parked_slots_suspend_that_comes_due_past_the_deadline_is_sent_in_overtime(aws, monkeypatch) -> None:
    """Two parked slots and a SuspendMicrovm budget of 1 every 50 s: the first VM is parked once
    it runs, the second's suspend comes due at about 52 s, past the deadline, and is sent then
    (the 31-fleet benchmark run, seed 13, parked its last VM at 58 s that way: by the next tick)."""
    budgets = '{"SuspendMicrovm":[0.02,1],"ListMicrovms":[5,5]}'
    env = {"MIN_VMS": "0", "WARM_VMS": "2", "MAX_VMS": "2", "BUDGETS": budgets}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        start = fleet.clock.now()
        invocation = fleet.invoke(monkeypatch)
        suspends = [t - start for t in _reconciler_requests(fleet, "SuspendMicrovm")]
        assert len(suspends) == 2, suspends
        assert 50.0 < suspends[-1] <= 59.0 and suspends[1] - suspends[0] >= 50 - 0.2, suspends
        assert invocation.events("tick_overtime") and not fleet.emulator.throttled
        assert len(fleet.live(("SUSPENDING", "SUSPENDED"))) == 2

