"""The step at a base VM's deadline (``end_past_deadline``: ended past rayd's deadline at
max_vms, its successor run in its room, ``core.paid_successor``) decides on a list of its own:
what a client or the service did since the tick's last look (a session started, the base VM
ended, room freed) is seen before the end and the run, and the run never takes the reconciler
above max_vms. (Planned on the tick's last list instead, to save that list, the step ran the
successor with 3 VMs live against max_vms 2 in three of these scenarios.) Also: the handover at
its lead.

Most scenarios are min 1 / warm 1 / max 2 with the parked VM taken by a client 3 minutes before
the tick that ends the base VM (``deadline_scene.taken_before_a_base_end``): the tick lists about
10 s before the end (room a client's VM may free), then sleeps to the deadline. Judged from the
emulator: its request log and each VM's history."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable

import pytest

from .deadline_scene import (client_of, counted_end, gone_at, lists_since, no_headroom_fleet, runs_over_max,
                             runs_since, settle, take_parked, taken_before_a_base_end, terminates, to_before_end)
from .harness import RECONCILER_CALLER, act_during_sleep, deployed_fleet, list_lag, peak_live, seconds_below
from .support import _drive, assert_no_duplicates

pytestmark = pytest.mark.stores("memory")

BEFORE = 51.0  # the tick starts this long before the base VM's end as the reconciler counts it


def _in_sleep(at: float, action: Callable[[Any], None]) -> Callable[[Any], None]:
    """An ``arm``: ``action(fleet)`` runs ``at`` s after the tick's start (in the sleep before
    the deadline step, after the tick's last list)."""
    def arm(fleet: Any) -> None:
        start = fleet.clock.now()
        act_during_sleep(fleet, start + at, lambda: action(fleet))
    return arm


def test_a_client_session_started_after_the_last_list_is_not_overrun(aws, stack, monkeypatch) -> None:
    """A client runs a session VM of the fleet's image 4 s before the base VM's deadline, after
    the tick's last list (10 s before it): with the VM the client took, 3 live at the deadline.
    The end frees one room but two others still hold max_vms 2: a successor run then is the
    reconciler's own step above max_vms (as test_a_successor_never_runs_while_others_hold_max_vms,
    where the session is seen by a list)."""
    def session(f: Any) -> None:
        f.emulator.direct_client(caller="client").run_microvm(imageIdentifier=f.image, clientToken="session-0")

    fleet, base, start, _ = taken_before_a_base_end(aws, stack, monkeypatch, BEFORE,
                                                    arm=_in_sleep(BEFORE - 4.0, session))
    ends = [r for r in terminates(fleet, start) if r.microvm_id == base["microvmId"]]
    lists = [r.time for r in lists_since(fleet, start, ends[0].time if ends else float("inf"))]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    over = runs_over_max(fleet, start)
    assert over == [], (over, [round(t - start, 2) for t in lists],
                        [(round(r.time - start, 2), r.status) for r in ends])


def _base_after(fleet: Any, start: float, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Our VMs started since ``start`` (the base slot's successors)."""
    return [vm for vm in fleet.emulator.microvms_ever() if vm["imageArn"] == fleet.image
            and (vm["clientToken"] or "").startswith("rz1-") and vm["history"][0][0] >= start]


def _slot_gap(fleet: Any, start: float, base: dict[str, Any]) -> float:
    """Seconds from the base VM's end (TERMINATING) to its successor's first RUNNING."""
    (old,) = [vm for vm in fleet.emulator.microvms_ever() if vm["microvmId"] == base["microvmId"]]
    new = [vm for vm in _base_after(fleet, start, base) if any(st == "RUNNING" for _, st, _ in vm["history"])]
    up = min(next(at for at, st, _ in vm["history"] if st == "RUNNING") for vm in new)
    return up - gone_at(old)


def _base_vm(fleet: Any) -> str:
    """The base slot's VM, as the ledger holds it."""
    (vm,) = [s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "base"]
    return str(vm)


def test_room_freed_by_a_client_after_the_last_list_still_gets_one_successor(aws, stack, monkeypatch) -> None:
    """The client ends the VM it took 4 s before the base VM's deadline (room the tick's last list
    does not show): the deadline step ends the base VM and runs one successor in its room; no
    duplicate, never above max_vms, no second end."""
    holder: dict[str, str] = {}

    def end_taken(f: Any) -> None:
        running = [v for v in f.live(("RUNNING",)) if v["microvmId"] != holder["base"]]
        for v in running:
            client_of(f).terminate_microvm(microvmIdentifier=v["microvmId"])

    def arm(f: Any) -> None:
        holder["base"] = _base_vm(f)
        _in_sleep(BEFORE - 4.0, end_taken)(f)

    fleet, base, start, _ = taken_before_a_base_end(aws, stack, monkeypatch, BEFORE, arm=arm)
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    ends = [r for r in terminates(fleet, start) if r.microvm_id == base["microvmId"]]
    assert [r.status for r in ends] == [200], [(r.time - start, r.status) for r in ends]
    assert peak_live(fleet) <= 2
    assert runs_over_max(fleet, start) == []
    got = _base_after(fleet, start, base)
    assert len([vm for vm in got if gone_at(vm) == float("inf")]) >= 1
    assert _slot_gap(fleet, start, base) <= 4.0, _slot_gap(fleet, start, base)


@pytest.mark.parametrize("how", ["client_terminates", "app_exits"])
def test_a_base_vm_gone_before_its_deadline_step_is_replaced_once(aws, stack, monkeypatch, how) -> None:
    """The base VM ends 6 s before its deadline, after the tick's last list (a client's
    TerminateMicrovm, or its app exits): the deadline step's list shows it gone and the slot gets
    exactly one successor, never above max_vms, no VM of the client's ended, and below min_vms no
    longer than the gap to a fresh look."""
    def gone(f: Any) -> None:
        vm = _base_vm(f)
        if how == "client_terminates":
            client_of(f).terminate_microvm(microvmIdentifier=vm)
        else:
            f.emulator.exit_app(vm)

    fleet, base, start, _ = taken_before_a_base_end(aws, stack, monkeypatch, BEFORE,
                                                    arm=_in_sleep(BEFORE - 6.0, gone))
    ends = [(round(r.time - start, 2), r.status) for r in terminates(fleet, start)]
    runs = [(round(r.time - start, 2), r.status) for r in runs_since(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    assert peak_live(fleet) <= 2
    assert runs_over_max(fleet, start) == [], (ends, runs)
    got = _base_after(fleet, start, base)
    assert len([vm for vm in got if gone_at(vm) == float("inf")]) == 1, [vm["microvmId"] for vm in got]
    client_ended = [r for r in terminates(fleet, start) if r.microvm_id != base["microvmId"]]
    assert client_ended == []
    gap = _slot_gap(fleet, start, base)
    assert gap <= 12.0, (gap, ends, runs)


@pytest.mark.parametrize("how", ["resume_own_session", "end_base_then_session"])
def test_a_client_filling_the_room_after_the_last_list_is_not_overrun(aws, stack, monkeypatch, how) -> None:
    """Variants of the session: the client resumes its own suspended session of the fleet's image
    after the tick's last list; or it ends the base VM itself and starts a session in its room.
    Either way max_vms 2 is held by the client's VMs at the deadline: a successor run is ours."""
    def arm(f: Any) -> None:
        client = client_of(f)
        if how == "resume_own_session":
            vm = client.run_microvm(imageIdentifier=f.image, clientToken="session-1")["microvmId"]
            f.clock.advance(3.0)
            client.suspend_microvm(microvmIdentifier=vm)

            def resume(g: Any) -> None:
                client.resume_microvm(microvmIdentifier=vm)
            _in_sleep(BEFORE - 4.0, resume)(f)
        else:
            def swap(g: Any) -> None:
                client.terminate_microvm(microvmIdentifier=_base_vm(g))
                client.run_microvm(imageIdentifier=g.image, clientToken="session-2")
            _in_sleep(BEFORE - 4.0, swap)(f)

    fleet, base, start, _ = taken_before_a_base_end(aws, stack, monkeypatch, BEFORE, arm=arm)
    ends = [(round(r.time - start, 2), r.status) for r in terminates(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    over = runs_over_max(fleet, start)
    assert over == [], (over, ends, [round(r.time - start, 2) for r in lists_since(fleet, start, start + 60)])


@pytest.mark.parametrize("before", [55.0, 56.0, 56.5, 57.0, 58.0, 62.0])
def test_a_deadline_near_the_hard_stop_calls_nothing_after_the_timeout(aws, stack, monkeypatch, before) -> None:
    """The base VM's deadline falls near the invocation's end (65 s, its hard bound 8 s before):
    the deadline step calls nothing after the timeout, and the
    slot still gets exactly one successor by the next tick, never above max_vms."""
    fleet, base, start, invocation = taken_before_a_base_end(aws, stack, monkeypatch, before)
    returned = fleet.clock.now()
    late = [(r.operation, round(r.time - start, 2)) for r in fleet.emulator.requests
            if r.caller == RECONCILER_CALLER and start <= r.time <= returned and r.time > start + 65.0]
    assert returned - start <= 65.0 and late == [], (returned - start, late)
    ends = [(round(r.time - start, 2), r.status) for r in terminates(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    assert peak_live(fleet) <= 2
    assert runs_over_max(fleet, start) == []
    got = _base_after(fleet, start, base)
    assert len([vm for vm in got if gone_at(vm) == float("inf")]) == 1, ([vm["microvmId"] for vm in got], ends)


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_a_clock_30_s_off_ends_each_vm_once_at_its_deadline(aws, monkeypatch, skew) -> None:
    """The reconciler's clock 30 s ahead of or behind the service's (learned from DynamoDB's
    dates), 600 s VMs at max_vms with the parked VM taken at each look, so that every base VM's
    end is a deadline step's: each end asked once and accepted, none
    (past_deadline) more than 5 s before rayd's own deadline, never above max_vms, no duplicate,
    nothing of a client's touched, no error."""
    got: dict[str, Any] = {}
    out = _drive(aws, monkeypatch, lifetime=600, min_vms=1, warm_vms=1, max_vms=2, each=take_parked, skew=skew,
                 check=lambda f: got.update(fleet=f, vms={vm["microvmId"]: vm for vm in f.emulator.microvms_ever()}))
    fleet, vms = got["fleet"], got["vms"]
    accepted = Counter(vm for _, status, vm in out["terminates"] if status < 300)
    assert [vm for vm, n in accepted.items() if n > 1] == [], out["terminates"]
    early = [(r.microvm_id, round(r.time - vms[r.microvm_id]["servesUntil"], 1)) for r in fleet.emulator.requests
             if r.caller == RECONCILER_CALLER and r.operation == "TerminateMicrovm" and r.microvm_id in vms
             and r.time < (vms[r.microvm_id].get("servesUntil") or float("inf")) - 5]
    reasons = {e["microvm_id"]: e.get("reason") for i in fleet.invocations if i is not None
               for e in i.events("vm_terminated")}
    assert "past_deadline" in reasons.values(), reasons  # a deadline step's end was exercised
    assert [e for e in early if reasons.get(e[0]) == "past_deadline"] == [], (early, reasons)
    assert out["peak"] <= 2, out["peak"]
    assert out["foreign_touched"] == []
    assert out["errors"] == [], out["errors"][:3]


def _second_session(aws: str, stack: contextlib.ExitStack, monkeypatch: Any, at: float,
                    lag: float = 0.0) -> tuple[Any, float]:
    """min 1 / warm 0 / max 2, a client session of the fleet's image running, and a tick that
    starts ``BEFORE`` s ahead of the base VM's end, during which a second session starts ``at`` s
    in (the reconciler's lists omitting VMs younger than ``lag`` s): (fleet, the tick's start)."""
    fleet = no_headroom_fleet(aws, stack, monkeypatch, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"})
    client_of(fleet).run_microvm(imageIdentifier=fleet.image, clientToken="session-0")
    _, _, start = to_before_end(fleet, BEFORE)
    act_during_sleep(fleet, start + at, lambda: client_of(fleet).run_microvm(imageIdentifier=fleet.image,
                                                                           clientToken="session-1"))
    if lag:
        list_lag(fleet, lag)
    fleet.invoke(monkeypatch)
    return fleet, start


@pytest.mark.parametrize("at", [5.0, 30.0, 47.0])
def test_no_parked_slot_a_second_session_in_the_tick_is_not_overrun(aws, stack, monkeypatch, at) -> None:
    """min 1 / warm 0 / max 2 (a fleet that scales in: rayd ends its VMs), a client session of the
    fleet's image holds the other room at the tick's list. A second session started ``at`` s into
    the tick (51 s before the base VM's end) holds the room the end frees: a successor run then is
    ours above max_vms."""
    fleet, start = _second_session(aws, stack, monkeypatch, at)
    lists = [round(r.time - start, 2) for r in lists_since(fleet, start, start + 60)]
    ends = [(round(r.time - start, 2), r.status) for r in terminates(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    over = runs_over_max(fleet, start)
    assert over == [], (over, lists, ends)


@pytest.mark.parametrize("apart", [0.0, 0.3, 3.0])
def test_two_base_vms_at_their_deadlines_in_one_tick(aws, stack, monkeypatch, apart) -> None:
    """min 2 / warm 0 / max 3, a client session holds the third room: both base VMs' ends (as
    the reconciler counts them: their ledger lifetimes set so) fall ``apart`` s from each other
    in one tick, so the second deadline step (or the same one) may plan on a list on which the
    first VM still runs. Each VM ended once, one successor each, every run of ours
    with fewer than max_vms others live, no duplicate."""
    fleet = stack.enter_context(deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3",
                                                         "IDLE_SECONDS": ""}, pending_seconds=2))
    fleet.every_minute(monkeypatch, 2)
    assert len(fleet.live(("RUNNING",))) == 2
    client_of(fleet).run_microvm(imageIdentifier=fleet.image, clientToken="session-0")
    fleet.every_minute(monkeypatch, 1)
    rows = fleet.memory[0]._slots[fleet.fleet]
    bases = sorted((k for k, v in rows.items() if v.get("role") == "base"))
    assert len(bases) == 2
    first = min(rows[k]["vm_started_at"] + rows[k]["lifetime"] for k in bases)
    for n, k in enumerate(bases):  # both end together, before rayd (which ends them later)
        rows[k]["lifetime"] = first + n * apart - rows[k]["vm_started_at"]
    old = {rows[k]["microvm_id"] for k in bases}
    fleet.clock.advance(first - BEFORE - fleet.clock.now())
    start = fleet.clock.now()
    fleet.invoke(monkeypatch)
    ends = [(round(r.time - start, 2), r.status, r.microvm_id in old) for r in terminates(fleet, start)]
    runs = [(round(r.time - start, 2), r.status) for r in runs_since(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    assert runs_over_max(fleet, start) == [], (ends, runs)
    accepted = [e for e in ends if e[1] < 300 and e[2]]
    assert len(accepted) == 2 and all(e[2] for e in ends), ends
    new = [vm for vm in fleet.emulator.microvms_ever() if (vm["clientToken"] or "").startswith("rz1-")
           and vm["history"][0][0] >= start]
    assert len(new) == 2 and all(gone_at(vm) == float("inf") for vm in new), (ends, runs)
    assert peak_live(fleet) <= 3


@pytest.mark.xfail(strict=True, reason=(
    "known limit: a session the lists omit (lag 20 s from +36.0 s, or lag 1 s from +48.5 s) is "
    "missing from the deadline step's own list at +49.0 s: TerminateMicrovm 200 and RunMicrovm at "
    "+49.0 s with 2 sessions live (max_vms 2). The paid guard trusts a list for VMs a client "
    "started up to the list's lag before it (0.5 s measured)."))
@pytest.mark.parametrize("lag, at", [(20.0, 36.0), (1.0, 48.5)])
def test_a_session_a_lagging_list_omits_is_not_overrun(aws, stack, monkeypatch, lag, at) -> None:
    """As the no-parked-slot scenario, with the reconciler's lists omitting VMs younger than
    ``lag`` s (an eventually consistent list; 0.5 s measured): the second session, started ``at``
    s into the tick, is missing from every list up to the deadline (+49.0 s) whether or not the
    step lists afresh."""
    fleet, start = _second_session(aws, stack, monkeypatch, at, lag)
    ends = [(round(r.time - start, 2), r.status) for r in terminates(fleet, start)]
    settle(fleet, monkeypatch, start)
    assert_no_duplicates(fleet)
    over = runs_over_max(fleet, start)
    assert over == [], (over, ends, [round(r.time - start, 2) for r in lists_since(fleet, start, start + 60)])


def _handover_fleet(aws: str, stack: contextlib.ExitStack, monkeypatch: Any,
                    before: float) -> tuple[Any, dict, float]:
    """min 1 / warm 1 / max 2 (no headroom), the parked VM SUSPENDED; the clock moved to ``before``
    s ahead of the base VM's end as the reconciler counts it, then one tick."""
    fleet = stack.enter_context(deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "2",
                                                         "IDLE_SECONDS": ""}, pending_seconds=2))
    fleet.every_minute(monkeypatch, 3)
    assert len(fleet.live(("SUSPENDED",))) == 1 and len(fleet.live(("RUNNING",))) == 1
    (base,) = [vm for vm in fleet.emulator.microvms_ever() if vm["microvmId"] == _base_vm(fleet)]
    fleet.clock.advance(counted_end(base) - before - fleet.clock.now())
    start = fleet.clock.now()
    fleet.invoke(monkeypatch)
    return fleet, base, start


@pytest.mark.parametrize("before", [119.0, 121.0, 126.0])
def test_the_handover_at_its_lead(aws, stack, monkeypatch, before) -> None:
    """The tick's list lands ``before`` s ahead of the base VM's end: within the handover lead
    (120 s) the parked VM is taken on that list (ResumeMicrovm in the tick's first step); sooner,
    the step wakes at the lead and lists (a list there also finds clients' takes of parked VMs:
    300 fleets' refill median rose from 8.1 to 11.2 s when it was skipped within 5 s of a look).
    Either way the base VM's end leaves min_vms served, the parked VM is taken once, never above
    max_vms, no duplicate."""
    fleet, base, start = _handover_fleet(aws, stack, monkeypatch, before)
    resumes = [(round(r.time - start, 2), r.status) for r in fleet.emulator.requests
               if r.caller == RECONCILER_CALLER and r.operation == "ResumeMicrovm" and r.time >= start]
    lists = [round(r.time - start, 2) for r in lists_since(fleet, start, start + 60)]
    assert len(resumes) == 1 and resumes[0][1] == 200, (resumes, lists)
    if before <= 120.0:
        assert resumes[0][0] < 1.0 and lists == [0.0], (resumes, lists)
    else:
        assert resumes[0][0] >= before - 120.0 and len(lists) == 2, (resumes, lists)
    fleet.clock.advance(start + 60 - fleet.clock.now())
    fleet.every_minute(monkeypatch, 2)  # past the base VM's end
    assert_no_duplicates(fleet)
    assert peak_live(fleet) <= 2
    assert seconds_below(fleet, 1, start, fleet.clock.now()) == 0.0
