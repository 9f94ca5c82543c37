"""Issue #11's scenarios on the production path (``index.handler`` with Powertools, its own
clients, the synthesized environment), at inputs and scales other than the issue's and the other
tests'. Every assertion comes from the emulator, moto or stdout.

Pinned here: no parked VM is left SUSPENDED while the account refuses base slots' runs for room
(the memory quota's 402, InsufficientCapacity), and a minute of 500s on every RunMicrovm, which
dead-letters every slot in 42 s, is healed by the first probe 60 s later, not 15 minutes later.
Of 44 variants that held, the ones closest to those two stay as guards."""

from __future__ import annotations

from collections import Counter

import pytest

from lambdas.reconciler.core import FleetSpec

from .harness import RECONCILER_CALLER, deployed_fleet, peak_live, seconds_below, serving

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")



def history(fleet, vm_id: str) -> list[str]:
    return [h[1] for h in fleet.emulator._vms[vm_id].history] if vm_id in fleet.emulator._vms else []


def client_vm(fleet, token: str) -> str:
    client = fleet.emulator.client(access_key="client")  # not the reconciler's key: its faults miss clients
    return client.run_microvm(imageIdentifier=fleet.image, clientToken=token)["microvmId"]


def assert_no_duplicates(fleet) -> None:
    tokens = Counter(vm["clientToken"] for vm in fleet.ours())
    assert all(n == 1 for n in tokens.values()), tokens
    held = [i for s in fleet.ledger_slots().values() for i in (s["microvm_id"], s["retiring_id"]) if i]
    assert len(held) == len(set(held)), held


def assert_sessions_untouched(fleet, sessions: list[str]) -> None:
    for vm_id in sessions:
        assert set(history(fleet, vm_id)) <= {"PENDING", "RUNNING"}, (vm_id, history(fleet, vm_id))
    held = {i for s in fleet.ledger_slots().values() for i in (s["microvm_id"], s["retiring_id"]) if i}
    assert not held & set(sessions)


# --------------------------------------------------------------------------- #11.1 at larger counts


@pytest.mark.parametrize("fault", ["InternalServer", "quota"])
def test_many_client_sessions_after_a_failed_first_tick_min5_max8(aws, monkeypatch, fault) -> None:
    """min 5 / warm 2 / max 8: the whole first tick's runs fail; then 3 clients start sessions of
    the fleet's image. No session is touched or held; the image never exceeds 8 from our runs."""
    options = {"memory_quota_mib": 0} if fault == "quota" else {}
    with deployed_fleet(aws, env={"MIN_VMS": "5", "WARM_VMS": "2", "MAX_VMS": "8"}, **options) as fleet:
        if fault == "throttle":
            fleet.emulator.set_rate_limit("RunMicrovm", 0.05, 1, surge=0)
        elif fault != "quota":
            armed = fleet.emulator.inject("RunMicrovm", fault, times=None, caller=RECONCILER_CALLER)
        fleet.invoke(monkeypatch)
        fleet.clock.advance(10)
        if fault == "throttle":
            fleet.emulator.set_rate_limit("RunMicrovm", 5, 5)
        elif fault == "quota":
            fleet.emulator.memory_quota_mib = 1 << 20
        else:
            fleet.emulator.remove_fault(armed)
        sessions = [client_vm(fleet, f"client-{i}") for i in range(3)]
        worst = 0
        for _ in range(10):
            fleet.clock.advance(50)
            fleet.invoke(monkeypatch)
            worst = max(worst, len(fleet.live()))
        assert_sessions_untouched(fleet, sessions)
        assert_no_duplicates(fleet)
        mine = len(fleet.ours())
        assert mine >= 5, mine  # min_vms reached: 8 - 3 clients leaves room for the 5 base slots
        assert peak_live(fleet, mine=True) <= 7, peak_live(fleet, mine=True)


def test_a_small_memory_quota_is_bounded_and_never_dead_letters(aws, monkeypatch) -> None:
    """Quota for 3 VMs, min 5 / warm 2 / max 8: 402 on the rest for 30 minutes, then raised."""
    with deployed_fleet(aws, env={"MIN_VMS": "5", "WARM_VMS": "2", "MAX_VMS": "8", "IDLE_SECONDS": ""}, memory_quota_mib=3 * 4096) as fleet:
        runs = fleet.every_minute(monkeypatch, 30)
        calls = fleet.emulator.calls["RunMicrovm"]
        assert calls <= 3 + 2 * 30, calls  # a shared back off of a minute: a call or two a tick
        assert len(serving(fleet)) == 3  # base slots first
        assert not fleet.dead_letters()
        assert any(r.metrics("Deficit") for r in runs)
        fleet.emulator.memory_quota_mib = 1 << 20
        fleet.every_minute(monkeypatch, 3)
        assert len(fleet.ours()) == 7
        assert_no_duplicates(fleet)


# --------------------------------------------------------------------------- #11.5 a 2-hour outage


@pytest.mark.parametrize("shape,quota_vms,floor", [
    ({"MIN_VMS": "5", "WARM_VMS": "2", "MAX_VMS": "8"}, 3, 3),
    ({"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "2"}, 1, 1),
], ids=["min5-quota3", "min1-quota1"])
def test_under_a_memory_quota_a_parked_vm_never_holds_the_room_base_slots_need(aws, monkeypatch, shape,
                                                                              quota_vms, floor) -> None:
    """The account's memory quota fits ``quota_vms`` of the image's VMs (402 past it). Base slots
    come first: every VM the quota allows serves as a base VM (a parked one is handed over or
    never run) until min_vms is reached. Observed before the fix: the first tick runs warm-0
    before base-0, the parked VM holds a quota place for good, and base VMs stay one below what
    the quota allows. Measured now: warm-0's VM (run first) is handed over to a base slot in the first
    tick (the base slot's run refused 402) and served as a member at 14 s; every quota place is a
    base slot's VM the server served, none parked. That VM keeps the pool's idle policy (300 s,
    auto-resume): idle since it serves, it is suspended by that policy at 312 s and still serves
    (a request resumes it), so it is counted by ``serving``, not by its RUNNING state."""
    env = {**shape, "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, memory_quota_mib=quota_vms * 4096) as fleet:
        fleet.every_minute(monkeypatch, 2)
        since = fleet.clock.now()
        fleet.every_minute(monkeypatch, 15)
        below = seconds_below(fleet, floor, since, fleet.clock.now())
        states = Counter(vm["state"] for vm in fleet.live())
        base_vms = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "base" and s["microvm_id"]}
        served_by_base = {vm["microvmId"] for vm in serving(fleet)} & base_vms
        parked = [vm["microvmId"] for vm in fleet.ours()
                  if vm["state"] in ("SUSPENDING", "SUSPENDED") and not vm["idleSuspended"]]
        assert below == 0 and len(served_by_base) >= floor and not parked, (below, states, served_by_base, parked)


def test_with_capacity_refused_after_the_first_run_the_parked_vm_is_handed_to_the_base_slot(aws, monkeypatch) -> None:
    """min 1 / warm 1 / max 2: the first RunMicrovm succeeds, every later one is refused
    InsufficientCapacity (no VM can be made). The one VM we have must serve min_vms."""
    from .harness import at_first_call

    env = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "2", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env) as fleet:
        at_first_call(fleet, "RunMicrovm", lambda record: fleet.emulator.inject(
            "RunMicrovm", "InsufficientCapacity", times=None, caller=RECONCILER_CALLER))
        fleet.every_minute(monkeypatch, 2)
        since = fleet.clock.now()
        fleet.every_minute(monkeypatch, 15)
        below = seconds_below(fleet, 1, since, fleet.clock.now())
        states = Counter(vm["state"] for vm in fleet.live())
        assert below == 0, (below, states)


def test_a_one_minute_outage_of_run_does_not_empty_the_fleet_for_fifteen_minutes(aws, monkeypatch) -> None:
    """InternalServer on every RunMicrovm during the first tick only (about 50 s). The 2, 8, 32 s
    backoff spends all max_start_attempts (3) in 42 s: every slot is dead-lettered and probed
    only after 15 minutes, so the fleet stays empty with the service back and room for all."""
    with deployed_fleet(aws, env={"MIN_VMS": "5", "WARM_VMS": "2", "MAX_VMS": "8", "IDLE_SECONDS": ""}) as fleet:
        outage = fleet.emulator.inject("RunMicrovm", "InternalServer", times=None)
        fleet.invoke(monkeypatch)
        fleet.emulator.remove_fault(outage)
        fleet.clock.advance(10)
        back = fleet.clock.now()
        fleet.every_minute(monkeypatch, 5)
        below = seconds_below(fleet, 5, back + 180, fleet.clock.now())
        assert len(fleet.ours()) >= 5 and below == 0, (len(fleet.ours()), below)


@pytest.mark.parametrize("fault", ["InsufficientCapacity", "quota"])
def test_a_base_vm_expiring_while_no_vm_can_be_made_takes_the_parked_vm(aws, monkeypatch, fault) -> None:
    """min 2 / warm 1 / max 4 (headroom for successors), 1,800 s VMs. From minute 3 on no new VM can
    be made (InsufficientCapacity on every run, or the memory quota is full). When a base VM
    expires, the parked VM must serve as its successor: sampled after every tick, never fewer
    than min_vms serving while a parked VM of ours (suspended by our SuspendMicrovm) sits
    SUSPENDED. A VM handed over from the pool keeps the pool's idle policy (300 s, auto-resume):
    suspended by it, it still serves and is no parked VM. Measured: base-1's first VM (rayd's
    deadline at 1,202 s, a spread first lifetime) gets the parked VM, resumed at 900.5 s and
    served from 962 s; with InsufficientCapacity nothing can replace the VMs whose deadlines
    then pass (1,502 s, 1,802 s): 780 s below min_vms by the end, nothing parked meanwhile; with
    the quota, 0 s below (each end frees room for a run)."""
    env = {"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4", "MAX_LIFETIME_SECONDS": "1800",
           "SUCCESSOR_LEAD_SECONDS": "300", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 3)
        if fault == "quota":
            fleet.emulator.memory_quota_mib = 3 * 4096
        else:
            fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None, caller=RECONCILER_CALLER)
        idle_while_below = []
        since = fleet.clock.now()
        for minute in range(35):
            fleet.every_minute(monkeypatch, 1)
            states = Counter(vm["state"] for vm in fleet.ours())
            parked = [vm["microvmId"] for vm in fleet.ours() if vm["state"] == "SUSPENDED" and not vm["idleSuspended"]]
            if len(serving(fleet)) < 2 and parked:
                idle_while_below.append((minute, dict(states), parked))
        below = seconds_below(fleet, 2, since, fleet.clock.now())
        assert not idle_while_below, (below, idle_while_below)
        # The scenario happened: a parked VM was handed to a base slot after the fault, and served.
        handed = [e["microvm_id"] for i in fleet.invocations for e in i.events("vm_handed_over")
                  if e["slot"].startswith("base-") and e["donor"].startswith("warm-") and e["time"] >= since]
        assert handed and all(vm in fleet.server.served for vm in handed), handed


@pytest.mark.parametrize("shape", [("2", "1", "3"), ("2", "1", "4"), ("3", "2", "6")], ids=["2-1-3", "2-1-4", "3-2-6"])
def test_room_freed_by_a_base_vm_that_ends_early_goes_to_its_base_slot(aws, monkeypatch, shape) -> None:
    """The account's memory quota has room for ``min_vms`` VMs only (402 past it): base slots hold
    it, parked slots are refused. A base VM ends early (a client ends it between two ticks): the
    tick that sees the end gives the freed room to that base slot, never to a parked slot, three
    times in a row: below min_vms only until the successor serves, measured 3.98 s from that
    tick (its PENDING, 2 s, then the fleet's server's answer, 1.98 s after RUNNING). Before, the parked
    slot's run (first in the start order) took the room, the base slot's run was refused, and the
    parked VM was suspended: 61 s below min_vms each time, until the next tick handed it over."""
    min_vms, warm_vms, max_vms = shape
    env = {"MIN_VMS": min_vms, "WARM_VMS": warm_vms, "MAX_VMS": max_vms, "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, memory_quota_mib=int(min_vms) * 4096, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 4)
        client = fleet.emulator.client(access_key="client")
        worst, seen = 0.0, []
        for _ in range(3):
            fleet.clock.advance(30)
            base = sorted(s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "base" and s["microvm_id"])
            client.terminate_microvm(microvmIdentifier=base[0])
            fleet.clock.advance(30)
            since = fleet.clock.now()  # the tick that sees the end
            fleet.every_minute(monkeypatch, 3)
            worst = max(worst, seconds_below(fleet, int(min_vms), since, fleet.clock.now()))
            seen.append(dict(Counter(vm["state"] for vm in fleet.ours())))
        assert worst <= 4.5, (worst, seen)  # 2 s PENDING + the server's answer (~2 s); was 61 s
        assert all(states == {"RUNNING": int(min_vms)} for states in seen), seen
        assert_no_duplicates(fleet)


# --------------------------------------------------------------------------- the plan itself (pure)


def test_the_plan_hands_parked_vms_to_base_slots_the_account_refused_for_room() -> None:
    """``core.plan``: a base slot whose last run the account refused for room (402, or
    InsufficientCapacity) takes a parked VM, even with headroom under max_vms, and no parked slot is
    refilled meanwhile; a base slot refused for another reason (a 500) runs as before, and so does
    a refused slot when nothing is parked."""
    from lambdas.reconciler import core

    spec = FleetSpec("f", "arn:aws:lambda:us-east-1:123456789012:microvm-image:f", min_vms=2, max_vms=5, warm_vms=2)
    seen = [core.Observed("vm-p", "SUSPENDED", 100.0)]

    def slots(reason: str) -> dict[str, core.Slot]:
        return {
            "base-0": core.Slot("base-0", core.BASE, phase=core.QUEUED, reason=reason),
            "base-1": core.Slot("base-1", core.BASE, phase=core.QUEUED, reason=reason),
            "warm-0": core.Slot("warm-0", core.WARM, phase=core.PARKED, microvm_id="vm-p", vm_started_at=100.0),
            "warm-1": core.Slot("warm-1", core.WARM, phase=core.QUEUED),
        }

    for code in core.REFUSED_FOR_ROOM:
        plan = core.plan(spec, slots(f"{code}: no room"), seen, 200.0)
        kinds = [(i.kind, i.slot_id, i.microvm_id) for i in plan.intents]
        # One parked VM: the first base slot takes it, the other asks again; warm-1 waits.
        assert kinds == [("resume", "base-0", "vm-p"), ("run", "base-1", None)], kinds
    plan = core.plan(spec, slots("InternalServerException: boom"), seen, 200.0)
    assert not [i for i in plan.intents if i.kind == "resume"]
    assert {i.slot_id for i in plan.intents if i.kind == "run"} == {"base-0", "base-1", "warm-1"}
    alone = {k: v for k, v in slots("ServiceQuotaExceededException: full").items() if k.startswith("base")}
    plan = core.plan(spec, alone, [], 200.0)
    assert {i.slot_id for i in plan.intents if i.kind == "run"} >= {"base-0", "base-1"}


def test_a_base_slot_refused_room_takes_a_parked_slots_vm_not_parked_yet() -> None:
    """``core.plan``: base-0's run was refused for room and warm-0's VM is still being started
    (PENDING, or RUNNING and about to be suspended): base-0 takes that VM (a handover, no call), the
    warm slot's suspend is not sent, no parked slot runs. A refusal of a parked slot's run five
    minutes old still keeps base slots first (the shared backoff after a 402 is only 60 s)."""
    from lambdas.reconciler import core

    spec = FleetSpec("f", "arn:aws:lambda:us-east-1:123456789012:microvm-image:f", min_vms=2, max_vms=3, warm_vms=1)
    for state in ("PENDING", "RUNNING"):
        slots = {
            "base-0": core.Slot("base-0", core.BASE, phase=core.QUEUED, reason="ServiceQuotaExceededException: full"),
            "base-1": core.Slot("base-1", core.BASE, phase=core.RUNNING, microvm_id="vm-b", vm_started_at=100.0),
            "warm-0": core.Slot("warm-0", core.WARM, phase=core.STARTING, microvm_id="vm-w", vm_started_at=190.0,
                                requested_at=190.0),
        }
        seen = [core.Observed("vm-b", "RUNNING", 100.0), core.Observed("vm-w", state, 190.0)]
        plan = core.plan(spec, slots, seen, 200.0)
        kinds = [(i.kind, i.slot_id, i.microvm_id) for i in plan.intents]
        assert kinds == [("handover", "base-0", "vm-w")], (state, kinds)
    slots = {
        "base-0": core.Slot("base-0", core.BASE, phase=core.QUEUED, reason="replaced_after_early_end"),
        "base-1": core.Slot("base-1", core.BASE, phase=core.RUNNING, microvm_id="vm-b", vm_started_at=100.0),
        "warm-0": core.Slot("warm-0", core.WARM, phase=core.QUEUED, requested_at=-100.0,
                            reason="ServiceQuotaExceededException: full"),
    }
    plan = core.plan(spec, slots, [core.Observed("vm-b", "RUNNING", 100.0)], 200.0)
    assert [(i.kind, i.slot_id) for i in plan.intents] == [("run", "base-0")]


def test_a_dead_lettered_slot_is_probed_sooner_then_less_often() -> None:
    """``core.dead_probe_delay``: 60 s after a slot is dead-lettered for the service's failures,
    then twice as long after each failed probe, at most 15 minutes."""
    from lambdas.reconciler import core

    assert [core.dead_probe_delay(n) for n in range(6)] == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0]
    assert core.dead_probe_delay(-1) == 60.0 and core.dead_probe_delay(10_000) == 900.0
