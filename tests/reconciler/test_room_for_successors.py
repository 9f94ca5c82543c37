"""Successors that wait for room under ``max_vms`` woken for
the end of a VM of ours being replaced (``frees``), a parked VM too near its end terminated for
room (``room_for_successor``), the lead that keeps a look and a start (``SCHEDULE_SECONDS``),
first lifetimes spread down to 20 s a slot, a Conflict naming no VM on an in-doubt retry that
keeps the token, and the ``short_lifetime`` synth warning that mirrors them.

Everything runs ``index.handler`` through ``tests/reconciler_harness.py`` (the synthesized
environment, Powertools telemetry, the real boto3 clients) against the emulator and moto, on the
virtual clock; every number is measured from the emulator's side (VM histories, its request log),
never from the reconciler's own counters. Breaks are strict xfails with the numbers found."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest


from ..projects import project_with
from .harness import RECONCILER_CALLER, deployed_fleet, list_lag, peak_live, seconds_below
from .support import _drive
from .support import _holds
from .support import assert_no_duplicates

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

ENDED = ("TERMINATING", "TERMINATED")


def _requests(fleet: Any, operation: str, *, caller: Optional[str] = RECONCILER_CALLER) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == operation and (caller is None or r.caller == caller)]


def _touched_foreign(fleet: Any) -> list[Any]:
    """Our Suspend/Resume/Terminate calls on a VM no token of ours started (ground truth)."""
    foreign = {vm["microvmId"] for vm in fleet.emulator.microvms_ever()
               if not (vm["clientToken"] or "").startswith("rz1-")}
    return [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.microvm_id in foreign
            and r.operation in ("SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm")]




def _report(found: dict) -> str:
    return (f"below={found['below']:.2f} peak={found['peak']}/{found['max_vms']} runs={found['runs']}"
            f" (bound {found['churn_bound']:.1f}) errors={len(found['errors'])}"
            f" foreign={len(found['foreign_touched'])} terminates={found['terminates']}")


def _warned(shape: dict) -> list[str]:
    """What the construct's ``short_lifetime`` warning says about a shape (the pure check the synth runs)."""
    from rayito_constructs.reconciler import short_lifetime_problems

    project = project_with(name="corta", min_vms=shape["min_vms"], max_vms=shape["max_vms"],
                                     warm_vms=shape.get("warm_vms", 0))
    return short_lifetime_problems(project, shape["lifetime"], 900, shape.get("period", 60), shape.get("tick", 50))


def _rollout_told(shape: dict) -> list[str]:
    """What the construct's ``short_lifetime_rollout`` info says about a shape."""
    from rayito_constructs.reconciler import rollout_problems

    project = project_with(name="corta", min_vms=shape["min_vms"], max_vms=shape["max_vms"],
                                     warm_vms=shape.get("warm_vms", 0))
    return rollout_problems(project, shape["lifetime"], 900, shape.get("period", 60))


def _parked(fleet: Any) -> list[str]:
    return [vm["microvmId"] for vm in fleet.ours() if vm["state"] == "SUSPENDED"]


def _client_resume(fleet: Any, vm_id: str, resumed: list) -> None:
    """A fleet client (not the reconciler) resumes a parked VM for a session."""
    fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=vm_id)
    resumed.append((vm_id, fleet.clock.now()))


def _touched_after(fleet: Any, resumed: list) -> list[Any]:
    """Our Suspend/Terminate calls on a VM after a client resumed it (a VM RUNNING may serve)."""
    return [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER
            and r.operation in ("SuspendMicrovm", "TerminateMicrovm")
            and any(r.microvm_id == vm and r.time > at for vm, at in resumed)]


WARM_HANDOVER = dict(lifetime=600, min_vms=1, warm_vms=1, max_vms=2)


# ------------------------------------------------------------------ the terminate for room under faults


# Found (a strict xfail until fixed): a TerminateMicrovm for room refused once (409 naming no VM,
# or a 500 that did nothing) was never sent again: the warm slot kept ending='room_for_successor',
# core.plan counted it in frees as ending 'now' at every step, so the base successor waited for an
# end nobody asked for until its own VM ended. min 1 / warm 1 / max 2, 600 s VMs: Conflict, 2 s
# PENDING: 3.00 s below min_vms, 1 TerminateMicrovm; InternalServer with 30 s PENDING: 31.00 s.
# Fixed: asked again once a list PARK_GRACE_SECONDS after the ask still shows it SUSPENDED.
@pytest.mark.parametrize("fault, pending", [("Conflict", 2), ("InternalServer", 30)])
def test_a_refused_terminate_for_room_is_asked_again_before_the_base_vm_ends(aws, monkeypatch, fault,  
                                                                            pending) -> None:
    """The parked VM (600 s) is too near its end to take over the base slot (its first VM's
    deadline at 460 s) at 340 s: it is ended for room; the service refuses that once. The base VM must still have
    its successor RUNNING before its end (the refused end asked again, or the parked VM taken)."""
    found = _drive(aws, monkeypatch, pending_seconds=pending, **WARM_HANDOVER, arm=lambda fleet: fleet.emulator.inject(
        "TerminateMicrovm", fault, times=1, caller=RECONCILER_CALLER))
    assert [t[1] for t in found["terminates"]][:1] in ([409], [500]), _report(found)
    _holds(found)


def test_a_lost_answer_to_the_terminate_for_room_holds(aws, monkeypatch) -> None:  
    """The terminate for room is carried out and its answer lost (500): the next list shows the
    parked VM ending, and the successor runs. Held: 0 s below, peak 2/2, 6 RunMicrovm (as with
    no fault), 2 TerminateMicrovm for room (at 340 s, the lost one, and 820.5 s), no error
    logged. The other 2 TerminateMicrovm end base VMs at their deadlines (``past_deadline``, at
    460 s and 940.5 s, their successors serving since 344.5 s and 825 s)."""
    reasons: dict = {}

    def check(fleet):
        reasons.update({e["microvm_id"]: e["reason"] for i in fleet.invocations for e in i.events("vm_terminated")})

    found = _drive(aws, monkeypatch, **WARM_HANDOVER, check=check,
                   arm=lambda fleet: fleet.emulator.inject("TerminateMicrovm", "lost_response", times=1))
    # The lost answer logs no vm_terminated: every terminate not of a base VM's end is for room.
    ends = [t for t in found["terminates"] if reasons.get(t[2]) == "past_deadline"]
    room = [t for t in found["terminates"] if reasons.get(t[2]) != "past_deadline"]
    assert [t[1] for t in room] == [500, 200], _report(found)
    assert [reasons.get(t[2]) for t in room] == [None, "room_for_successor"], (reasons, _report(found))
    assert [t[1] for t in ends] == [200, 200], _report(found)
    assert found["runs"] == 6, _report(found)
    _holds(found)


@pytest.mark.parametrize("when", ["before_the_room_terminate", "after_a_refused_room_terminate"])
def test_a_parked_vm_a_client_resumed_is_never_ended_for_room(aws, monkeypatch, when) -> None:  
    """A client resumes the parked VM the reconciler would end for room: at 330 s (while a tick
    sleeps, 10 s before the terminate), or right after a refused terminate for room (409). Held:
    no Suspend/Terminate of ours on it after the resume, peak 2/2, 4 RunMicrovm, never below
    min_vms (the client's resumed VM is RUNNING and counted, as the benchmark's dips count)."""
    from .harness import act_during_sleep, at_first_call

    resumed: list = []
    fired: list = []

    def arm(fleet):
        if when == "before_the_room_terminate":
            fired.append(act_during_sleep(fleet, fleet.t0 + 330,
                                          lambda: [_client_resume(fleet, v, resumed) for v in _parked(fleet)]))
        else:
            fleet.emulator.inject("TerminateMicrovm", "Conflict", times=1, caller=RECONCILER_CALLER)
            fired.append(at_first_call(fleet, "TerminateMicrovm", lambda r: _client_resume(fleet, r.microvm_id, resumed)))

    touched: list = []
    found = _drive(aws, monkeypatch, **WARM_HANDOVER, arm=arm,
                   check=lambda fleet: touched.extend(_touched_after(fleet, resumed)))
    assert fired[0] and len(resumed) == 1, resumed
    assert touched == [], touched
    _holds(found)


# ------------------------------------------------------------------ shapes, schedules, lags and skews


def _rollout(at_look: int = 3) -> Callable[[Any, int], None]:
    """A deploy publishes image version 2.0 (its first 5 launches slow: 26-65 s PENDING, measured,
    GT section 3) and the function's IMAGE_VERSION follows, at look ``at_look``."""
    def each(fleet: Any, n: int) -> None:
        if n == at_look:
            fleet.emulator.publish_version(fleet.fleet, "2.0")
            fleet.env.update(IMAGE_VERSION="2.0")
    return each


def _lag(seconds: float) -> Callable[[Any], None]:
    return lambda fleet: list_lag(fleet, seconds)


def _client_vm(fleet: Any) -> None:
    """A fleet client starts a VM of the image: it holds one VM of the headroom under max_vms."""
    fleet.emulator.client(access_key="client").run_microvm(imageIdentifier=fleet.image, clientToken="client-session-1")


# Shapes and schedules beyond the tests above, none warned by ``short_lifetime``: each
# must hold through the handler (a dip here would make the warning dishonest). Measured held (0 s
# below min_vms, peak = max_vms): RunMicrovm counts in the comments.
HELD = [
    pytest.param(dict(lifetime=600, min_vms=5, max_vms=6), id="five-six-600"),  # 13 runs, 56 s a slot
    pytest.param(dict(lifetime=300, min_vms=6, max_vms=7, looks=15), id="six-seven-300-21s-a-slot"),  # 28 runs
    pytest.param(dict(lifetime=130, min_vms=2, max_vms=3, looks=15), id="two-three-130-25s-a-slot"),  # 23 runs
    pytest.param(dict(lifetime=160, min_vms=3, max_vms=4, looks=15), id="three-four-160-20s-a-slot"),  # 25 runs
    pytest.param(dict(lifetime=90, min_vms=1, max_vms=2, looks=15, pending_seconds=30), id="one-two-90-slow"),  # 17
    pytest.param(dict(lifetime=1200, min_vms=1, warm_vms=3, max_vms=4, looks=20), id="one-warm3-four-1200"),  # 8
    # The shape with 1,200 s VMs, and with a new image version at look 8 (5 VMs of 2.0):
    # 10 runs each, one parked VM ended for room (616 s).
    pytest.param(dict(lifetime=1200, min_vms=3, warm_vms=2, max_vms=5, looks=20), id="three-warm2-five-1200"),
    pytest.param(dict(lifetime=1200, min_vms=3, warm_vms=2, max_vms=5, looks=20, each=_rollout(8)),
                 id="three-warm2-five-1200-new-version"),
    # A client's VM of the image holds one VM of the headroom: 2 slots, 1 VM of room left (8 runs).
    pytest.param(dict(lifetime=300, min_vms=2, max_vms=4, arm=_client_vm), id="client-holds-headroom"),
    # Lists that omit VMs younger than 6 s / 20 s, three slots 20 s apart (18 runs each).
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4, arm=_lag(6)), id="lag6-three-180"),
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4, arm=_lag(20)), id="lag20-three-180"),
    # The function's clock 30 s off the service's (reckoned on the service's Date): 18 and 27 runs.
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4, skew=30.0), id="skew+30-three-180"),
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4, skew=-30.0), id="skew-30-three-180"),
    pytest.param(dict(lifetime=600, min_vms=10, max_vms=11, skew=-30.0, looks=16), id="skew-30-ten-600"),
    # Looked at every 2 minutes with 50 s ticks (63 s of each period unwatched): 7, 12, 8 runs.
    pytest.param(dict(lifetime=300, min_vms=1, max_vms=2, period=120, looks=12), id="p120-one-two-300"),
    pytest.param(dict(lifetime=400, min_vms=2, max_vms=3, period=120, looks=12), id="p120-two-three-400"),
    pytest.param(dict(lifetime=900, min_vms=3, max_vms=4, period=120, looks=12), id="p120-three-four-900"),
    # Every 5 minutes with 50 s ticks: 10 and 12 runs.
    pytest.param(dict(lifetime=1200, min_vms=2, max_vms=3, period=300, looks=12), id="p300-two-three-1200"),
    pytest.param(dict(lifetime=3600, min_vms=5, max_vms=6, period=300, looks=18), id="p300-five-six-3600"),
    # A template from before SCHEDULE_SECONDS (the handler assumes 60 s, the schedule's default): 8 runs.
    pytest.param(dict(lifetime=300, min_vms=2, max_vms=3, env={"SCHEDULE_SECONDS": None}), id="no-schedule-seconds"),
]


@pytest.mark.parametrize("shape", HELD)
def test_unwarned_shapes_hold_through_the_handler(aws, monkeypatch, shape) -> None:  
    assert _warned(shape) == []
    found = _drive(aws, monkeypatch, **shape)
    assert found["foreign_touched"] == [] and found["dead_letters"] == [], _report(found)
    _holds(found)


def test_thirty_slots_spread_20s_and_more_hold(aws, monkeypatch) -> None:  
    """min 30 / max 31 with 3,600 s VMs (60 s a slot, one VM of headroom): 64 minutes, every
    first lifetime's end (1,800 s to 3,600 s), each successor waiting for the end before its own.
    Held: 0 s below, peak 31/31, 61 RunMicrovm (bound 73.7). (77 minutes, 75 looks, also held:
    61 RunMicrovm for a bound of 82.3; slower than the suite allows.)"""
    shape = dict(lifetime=3600, min_vms=30, max_vms=31, looks=62)
    assert _warned(shape) == []
    found = _drive(aws, monkeypatch, **shape)
    _holds(found)


# ------------------------------------------------------------------ a deploy of a new image version


# Found (a strict xfail until told): a new image version (first 5 launches 26-65 s PENDING,
# measured) on shapes short_lifetime does not warn about: successors that wait for room run at the
# end before their own and need up to 65 s to be RUNNING. min 3 / max 4, 180 s VMs: 42.45 s below
# min_vms in 13 min, 18 RunMicrovm; min 5 / max 6, 600 s VMs (56 s a slot): 6.40 s below in 16
# min, 13 RunMicrovm. Told since at synth as the info short_lifetime_rollout (rollout_problems):
# outside a rollout these shapes hold (test_unwarned_shapes_hold_through_the_handler).
@pytest.mark.parametrize("shape", [
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4), id="three-four-180"),
    pytest.param(dict(lifetime=600, min_vms=5, max_vms=6), id="five-six-600"),
])
def test_a_new_image_version_does_not_dip_where_short_lifetime_is_silent(aws, monkeypatch, shape) -> None:  
    found = _drive(aws, monkeypatch, each=_rollout(), **shape)
    assert found["peak"] <= found["max_vms"] and found["errors"] == [], _report(found)
    assert found["below"] == 0.0 or _warned(shape) or _rollout_told(shape), _report(found)


@pytest.mark.parametrize("shape", [
    pytest.param(dict(lifetime=600, min_vms=1, max_vms=2), id="one-two-600"),  # 4 runs
    pytest.param(dict(lifetime=300, min_vms=2, max_vms=3), id="two-three-300"),  # 8 runs
    pytest.param(dict(lifetime=600, min_vms=1, warm_vms=1, max_vms=2), id="warm-handover-600"),  # 6 runs
])
def test_a_new_image_version_holds_where_successors_start_a_lead_early(aws, monkeypatch, shape) -> None:  
    """Held: the same deploy where each successor has room a lead before its VM's end (or one
    waits for an end 140 s or more before its own): 0 s below, peak = max_vms."""
    _holds(_drive(aws, monkeypatch, each=_rollout(), **shape))


# ------------------------------------------------------------------ a spec change, duplicate deliveries


def test_a_spec_change_while_successors_wait_for_room(aws, monkeypatch) -> None:  
    """min 2 / max 3 with 600 s VMs, then (a deploy at look 6, 6 minutes in) min 3 / max 4 with
    900 s VMs. Held: never more than 3 live before the change and 4 after, never below 2 before
    it, nor below 3 from two looks after it; 7 RunMicrovm in 17 minutes."""
    marks: dict = {}

    def each(fleet, n):
        if n == 6:
            marks["changed"], marks["peak_before"] = fleet.clock.now(), peak_live(fleet)
            fleet.env.update(MIN_VMS="3", MAX_VMS="4", MAX_LIFETIME_SECONDS="900")
        if n == 8:
            marks["settled"] = fleet.clock.now()

    def check(fleet):
        marks["below2"] = seconds_below(fleet, 2, fleet.t0 + 120, marks["changed"])
        marks["below3"] = seconds_below(fleet, 3, marks["settled"], fleet.clock.now())

    found = _drive(aws, monkeypatch, lifetime=600, min_vms=2, max_vms=3, each=each, check=check)
    assert marks["peak_before"] <= 3 and found["peak"] <= 4, (marks, _report(found))
    assert marks["below2"] == 0.0 and marks["below3"] == 0.0, marks
    assert found["errors"] == [] and found["runs"] <= 12, _report(found)


# A stall from 156.5 s (found at 4.00 s below min_vms when a VM's lifetime was its maximum
# duration) now holds: the end at 156 s (our TerminateMicrovm at base-1's VM's deadline) frees room
# for base-0's successor; the stalled tick holds the lease, the second delivery waits for it
# (tick_waiting, 13.55 s) and runs that successor at 170.05 s, serving at 174.03 s, before base-0's
# VM ends (its deadline, 180 s; rayd's 182 s): 0 s below, 18 RunMicrovm, peak 4/4.
STALLED_AT_133 = pytest.mark.xfail(strict=True, reason=(
    "found: a tick that stalls while a successor waits for an end (woken for it) holds every other "
    "delivery back until its recorded end, the tick's deadline (the second waits for the holder: tick_waiting, "
    "by design): min 3 / max 4, 180 s VMs, the warm tick stalls from 133.5 s, right after the end at 133 s "
    "(our past_deadline TerminateMicrovm of base-2's first VM) that frees room for base-1's successor; the "
    "second delivery waits 36.55 s and its first call is at 170.05 s (the first's deadline): base-1's VM "
    "stops serving at rayd's deadline (158 s), its successor runs at 170.05 s and serves at 174.03 s (16.03 s "
    "below min_vms); the stall leaves two successors' VMs started 0.5 s apart whose ends (350.05 s, 350.55 s) "
    "and the next (361 s) each wait for room: 3.98 s below at 350.55 s and at 361 s; 23.99 s in all, 17 "
    "RunMicrovm. Ends 20 s apart leave no slack for a tick that dies or freezes holding the lease"))


@pytest.mark.parametrize("offset", [pytest.param(133.5, marks=STALLED_AT_133), 156.5])
def test_a_tick_stalled_while_a_successor_waits_for_an_end_leaves_no_dip(aws, monkeypatch, offset) -> None:  
    """min 3 / max 4, 180 s VMs ending 20-ish s apart (the first at 133 s and 156 s, each freeing
    room for the next successor). While the warm tick sleeps until an end, a second delivery (a
    new execution environment) runs a whole invocation; the harness runs it inside the first's
    sleep, so the first is stalled meanwhile (a frozen execution environment, a slow store call),
    its lease held. Must hold: one VM per token, never above max_vms, never below min_vms."""
    from .harness import act_during_sleep

    fired: list = []
    second: list = []

    def arm(fleet):
        fired.append(act_during_sleep(fleet, fleet.t0 + offset,
                                      lambda: second.append(fleet.invoke(monkeypatch, cold=True, timeout=65))))

    found = _drive(aws, monkeypatch, lifetime=180, min_vms=3, max_vms=4, arm=arm)
    assert fired[0] and second and "skipped" not in second[0].result, "the second invocation never ran"
    assert second[0].events("tick_waiting"), "the second delivery never waited for the stalled tick's lease"
    _holds(found)


# ------------------------------------------------------------------ a Conflict on an in-doubt retry


def test_an_in_doubt_slot_that_keeps_getting_conflict_dead_letters_and_a_redrive_recovers(aws, monkeypatch) -> None:  
    """RunMicrovm's answer lost (the VM made), then every retry of that token answered 409 naming
    no VM. Held: the slot is dead-lettered after 3 attempts (500, 409, 409 in 10 s) still in doubt,
    its token kept (one token ever); the lost VM is never suspended nor ended; with the fault gone,
    a redrive asks the same token, which returns that VM: one VM ever, held by the slot."""
    from .harness import at_first_call

    env = {"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        fleet.emulator.inject("RunMicrovm", "lost_response", times=1)
        conflict: list = []
        at_first_call(fleet, "RunMicrovm", lambda r: conflict.append(
            fleet.emulator.inject("RunMicrovm", "Conflict", times=None, caller=RECONCILER_CALLER)))
        fleet.every_minute(monkeypatch, 4)
        (letter,) = fleet.dead_letters()
        assert letter["in_doubt"] is True and letter["slot"] == "base-0", letter
        calls = _requests(fleet, "RunMicrovm")
        assert [r.status for r in calls] == [500, 409, 409]
        fleet.emulator.remove_fault(conflict[0])
        redriven = fleet.invoke(monkeypatch, {"action": "redrive"})
        assert redriven.result["redriven"] == ["base-0"]
        fleet.every_minute(monkeypatch, 2)
        calls = _requests(fleet, "RunMicrovm")
        assert len({r.client_token for r in calls}) == 1 and calls[-1].status == 200
        ever = [vm for vm in fleet.emulator.microvms_ever() if vm["imageArn"] == fleet.image]
        assert len(ever) == 1 and ever[0]["state"] == "RUNNING", ever
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == ever[0]["microvmId"]
        assert not _requests(fleet, "SuspendMicrovm") and not _requests(fleet, "TerminateMicrovm")
        assert_no_duplicates(fleet)
