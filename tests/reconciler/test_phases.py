"""The plan's phases, pure and table-driven (``lambdas/reconciler/core/phases.py``): each row a ledger
and what the service shows, and what that phase decides. Scenarios through the handler prove the
same rules on the production path; these prove each rule alone, in milliseconds."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from lambdas.reconciler import core
from lambdas.reconciler.core import BASE, DEAD, MEMBER, PARKED, PARKING, QUEUED, RUNNING, SERVING, STARTING, WARM, FleetSpec
from lambdas.reconciler.core import Observed as VM
from lambdas.reconciler.core import Slot

ARN = "arn:aws:lambda:us-east-1:123456789012:microvm-image:f"
NOW = 100_000.0


def spec(min_vms: int = 2, max_vms: int = 4, warm_vms: int = 1, **kw: Any) -> FleetSpec:
    return FleetSpec("f", ARN, min_vms=min_vms, max_vms=max_vms, warm_vms=warm_vms, **kw)


def ledger(*slots: Slot) -> dict[str, Slot]:
    return {s.slot_id: s for s in slots}


def base(i: int = 0, vm: Optional[str] = None, **kw: Any) -> Slot:
    kw.setdefault("phase", RUNNING if vm else QUEUED)
    if vm:
        kw.setdefault("vm_started_at", NOW - 1_000)
        kw.setdefault("lifetime", 28_800)
    return Slot(f"base-{i}", BASE, microvm_id=vm, **kw)


def warm(i: int = 0, vm: Optional[str] = None, **kw: Any) -> Slot:
    kw.setdefault("phase", PARKED if vm else QUEUED)
    if vm:
        kw.setdefault("vm_started_at", NOW - 1_000)
        kw.setdefault("lifetime", 28_800)
    return Slot(f"warm-{i}", WARM, microvm_id=vm, **kw)


def seen(state: str, vm: str, started: float = NOW - 1_000, **kw: Any) -> VM:
    return VM(vm, state, started, **kw)


def intents(plan: core.Plan, *kinds: str) -> list[tuple[str, str, Optional[str]]]:
    return [(str(i.kind), i.slot_id, i.microvm_id) for i in plan.intents if not kinds or i.kind in kinds]


def told(plan: core.Plan) -> list[str]:
    return [e["event"] for e in plan.events]


# ------------------------------------------------------------------------------ settle slots and shape


def test_a_converged_fleet_plans_nothing() -> None:
    plan = core.plan(spec(), ledger(base(0, "b0"), base(1, "b1"), warm(0, "w0")),
                     [seen("RUNNING", "b0"), seen("RUNNING", "b1"), seen("SUSPENDED", "w0")], NOW)
    assert plan.intents == [] and plan.events == [] and plan.gauges["Deficit"] == 0 and plan.live_vms == 3
    assert plan.gauges["LiveBaseVMs"] == 2 and plan.gauges["ParkedSlots"] == 1


def test_an_empty_ledger_queues_every_slot_and_runs_them_spread() -> None:
    plan = core.plan(spec(6, 9, 2), {}, [], NOW)
    assert told(plan).count("slot_queued") == 8
    # Parked slots spread over the fleet's starts from the first one on.
    assert [i.slot_id for i in plan.intents] == ["warm-0", "base-0", "base-1", "base-2", "warm-1", "base-3",
                                                 "base-4", "base-5"]


@pytest.mark.parametrize("rows,expect", [
    # a member whose VM ended is forgotten; one still live is kept, never touched
    ([base(0, "b0"), base(1, "b1"), warm(0, "w0"), Slot("member-m", MEMBER, phase=RUNNING, microvm_id="m")],
     {"member-m": "TERMINATED"}),
    ([base(0, "b0"), base(1, "b1"), warm(0, "w0"), Slot("member-m", MEMBER, phase=RUNNING, microvm_id="m")],
     {"member-m": "RUNNING"}),
])
def test_members_end_by_themselves(rows, expect) -> None:
    state = expect["member-m"]
    plan = core.plan(spec(), ledger(*rows), [seen("RUNNING", "b0"), seen("RUNNING", "b1"), seen("SUSPENDED", "w0"),
                                             seen(state, "m")], NOW)
    assert ("member-m" in plan.slots) == (state == "RUNNING") and intents(plan) == []
    assert told(plan) == ([] if state == "RUNNING" else ["member_released"])


@pytest.mark.parametrize("kind,retry_at,redrive,expect", [
    ("service", NOW, False, (QUEUED, ["dead_slot_probed"], True)),  # its probe is due
    ("service", NOW + 60, False, (DEAD, [], False)),  # not yet
    ("request", NOW - 1, False, (DEAD, [], False)),  # waits for a redrive or a new spec
    ("crash", None, True, (QUEUED, ["slot_redriven"], True)),  # the spec changed
])
def test_dead_slots_are_probed_or_redriven(kind, retry_at, redrive, expect) -> None:
    dead = base(1, phase=DEAD, dead_kind=kind, retry_at=retry_at, errors=3)
    plan = core.plan(spec(2, 4, 0), ledger(base(0, "b0"), dead), [seen("RUNNING", "b0")], NOW, redrive=redrive)
    phase, events, runs = expect
    assert plan.slots["base-1"].phase == phase and told(plan) == events
    assert bool(intents(plan, "run")) == runs
    assert plan.gauges["DeadLetteredSlots"] == (0 if phase == QUEUED else 1)


def test_a_vm_missing_from_the_look_is_live_and_unknown() -> None:
    plan = core.plan(spec(1, 2, 0), ledger(base(0, "b0")), [], NOW)
    assert intents(plan) == [] and plan.live_vms == 1 and plan.slots["base-0"].phase == RUNNING
    gone = core.plan(spec(1, 2, 0), ledger(base(0, "b0")), [seen(core.GONE, "b0")], NOW)
    assert intents(gone, "run") == [("run", "base-0", None)] and told(gone) == ["vm_ended_unexpectedly"]


def test_a_lowered_spec_drains_parked_slots_and_lets_base_vms_go_as_members() -> None:
    rows = ledger(base(0, "b0"), base(1, "b1"), warm(0, "w0"), warm(1, "w1"), base(2, phase=STARTING, requested_at=NOW - 5))
    look = [seen("RUNNING", "b0"), seen("RUNNING", "b1"), seen("SUSPENDED", "w0"), seen("SUSPENDED", "w1")]
    plan = core.plan(spec(1, 4, 1), rows, look, NOW)
    assert plan.slots["warm-1"].draining and "slot_draining" in told(plan)
    assert ("terminate", "warm-1", "w1") in intents(plan, "terminate")  # parked: serves nobody
    assert "base-1" not in plan.slots and plan.slots["member-b1"].role == MEMBER  # may serve: ends by itself
    assert "base-2" in plan.slots  # in doubt: its token is asked again before it is forgotten
    assert core.retired_generations(rows, plan.slots) == {"base-1": 1}
    again = core.plan(spec(2, 4, 2), plan.slots, look, NOW, retired={"base-1": 1})
    assert not again.slots["warm-1"].draining and again.slots["base-1"].generation == 1


# ------------------------------------------------------------------------------ strays and the count


def test_foreign_vms_count_toward_max_vms_and_are_never_touched() -> None:
    rows = ledger(base(0, "b0"), base(1))
    plan = core.plan(spec(2, 2, 0), rows, [seen("RUNNING", "b0"), seen("RUNNING", "x")], NOW)
    assert plan.live_vms == 2 and plan.strays["x"]["seen"] == 1 and "stray_vm" in told(plan)
    assert intents(plan) == [("run", "base-1", None)]  # planned; the shell sees max_vms reached
    shared = core.plan(spec(2, 2, 0), rows, [seen("RUNNING", "b0"), seen("RUNNING", "x")], NOW, others=["x"])
    assert shared.live_vms == 1 and shared.strays == {}


def test_an_idle_stray_is_ended_only_when_opted_in_and_suspended_for_the_grace() -> None:
    known = {"x": {"first_seen": NOW - 4_000, "seen": 5, "started_at": NOW - 5_000, "suspended_since": NOW - 3_700}}
    for opted, state, expect in ((True, "SUSPENDED", [("terminate", "stray-x", "x")]), (False, "SUSPENDED", []),
                                 (True, "RUNNING", [])):
        plan = core.plan(spec(0, 2, 0, terminate_strays=opted), {}, [seen(state, "x")], NOW, strays=known)
        assert intents(plan) == expect
    fresh = core.plan(spec(0, 2, 0, terminate_strays=True), {}, [seen("SUSPENDED", "x")], NOW, strays={})
    assert intents(fresh) == [] and fresh.strays["x"]["suspended_since"] == NOW


def test_in_doubt_runs_count_as_live() -> None:
    plan = core.plan(spec(2, 2, 0), ledger(base(0, "b0"), base(1, in_doubt_since=NOW - 3)), [seen("RUNNING", "b0")], NOW)
    assert plan.live_vms == 2 and plan.gauges["InDoubtRuns"] == 1
    assert [(i.slot_id, i.retry) for i in plan.intents] == [("base-1", True)]  # the same token again


# ------------------------------------------------------------------------------ trim parked


@pytest.mark.parametrize("max_vms,client_vms,ended", [(3, 0, []), (3, 1, ["warm-1"]), (3, 2, ["warm-1", "warm-0"]),
                                                      (2, 0, ["warm-1"])])
def test_parked_vms_are_ended_youngest_first_above_max_vms(max_vms, client_vms, ended) -> None:
    rows = ledger(base(0, "b0"), warm(0, "w0", vm_started_at=NOW - 500), warm(1, "w1", vm_started_at=NOW - 100))
    look = [seen("RUNNING", "b0"), seen("SUSPENDED", "w0", NOW - 500), seen("SUSPENDED", "w1", NOW - 100)]
    look += [seen("RUNNING", f"c{i}") for i in range(client_vms)]
    plan = core.plan(spec(1, max_vms, 2), rows, look, NOW)
    assert [i.slot_id for i in plan.intents if i.reason == "above_max_vms"] == ended


def test_an_end_asked_for_is_not_asked_again_before_a_look_could_show_it() -> None:
    rows = ledger(base(0, "b0"), warm(0, "w0", ending="above_max_vms", end_requested_at=NOW - 10))
    plan = core.plan(spec(1, 1, 1), rows, [seen("RUNNING", "b0"), seen("SUSPENDED", "w0")], NOW)
    assert intents(plan, "terminate") == []


# ------------------------------------------------------------------------------ schedule runs


def test_a_backed_off_slot_wakes_the_step_when_its_backoff_ends() -> None:
    plan = core.plan(spec(1, 2, 0), ledger(base(0, retry_at=NOW + 8)), [], NOW)
    assert intents(plan) == [] and plan.wake_at(core.Reason.BACKOFF) == NOW + 8


def test_a_long_wait_is_told_once_past_the_admission_deadline() -> None:
    plan = core.plan(spec(1, 2, 0), ledger(base(0, queued_at=NOW - 301)), [], NOW)
    assert told(plan) == ["admission_deadline_exceeded"] and core.noted(plan.slots["base-0"], "deadline")
    assert told(core.plan(spec(1, 2, 0), plan.slots, [], NOW + 5)) == []


@pytest.mark.parametrize("age,expect", [(27_000, []), (28_000, [("run", "base-0", "b0")])])
def test_a_successor_is_due_the_lead_before_the_end(age, expect) -> None:
    rows = ledger(base(0, "b0", vm_started_at=NOW - age))
    plan = core.plan(spec(1, 2, 0), rows, [seen("RUNNING", "b0", NOW - age)], NOW)
    assert intents(plan) == expect and all(i.successor for i in plan.intents)


def test_a_new_image_version_replaces_parked_slots_first_then_base_slots_when_rolling() -> None:
    rows = ledger(base(0, "b0"), warm(0, "w0"))
    look = [seen("RUNNING", "b0", image_version="1"), seen("SUSPENDED", "w0", image_version="1")]
    on_expiry = core.plan(spec(1, 4, 1, image_version="2"), rows, look, NOW)
    assert [(i.slot_id, i.reason) for i in on_expiry.intents] == [("warm-0", "image_version")]
    rolling = core.plan(spec(1, 4, 1, image_version="2", base_rollout="rolling"), rows, look, NOW)
    assert [(i.slot_id, i.priority) for i in rolling.intents] == [("warm-0", 2), ("base-0", 3)]
    assert told(rolling).count("vm_outdated") == 2


def test_a_parked_slots_replaced_vm_is_ended_once_its_successor_is_parked() -> None:
    rows = ledger(base(0, "b0"), warm(0, "w1", retiring_id="w0"))
    look = [seen("RUNNING", "b0"), seen("SUSPENDED", "w1"), seen("SUSPENDED", "w0")]
    plan = core.plan(spec(1, 4, 1), rows, look, NOW)
    assert [(i.kind, i.microvm_id, i.reason) for i in plan.intents] == [("terminate", "w0", "replaced_parked_slot")]


# ------------------------------------------------------------------------------ allocate room


def room_rows(reason: str) -> dict[str, Slot]:
    return ledger(base(0, reason=reason), base(1, reason=reason), warm(0, "w0", vm_started_at=100.0), warm(1))


@pytest.mark.parametrize("reason,no_room,expect", [
    # one parked VM: the first base slot takes it, the other asks again; no parked slot runs
    ("ServiceQuotaExceededException: full", False, [("resume", "base-0", "w0"), ("run", "base-1", None)]),
    ("InsufficientCapacityException: none", False, [("resume", "base-0", "w0"), ("run", "base-1", None)]),
    ("InternalServerException: boom", False, [("run", "base-0", None), ("run", "base-1", None), ("run", "warm-1", None)]),
    ("InternalServerException: boom", True, [("resume", "base-0", "w0"), ("run", "base-1", None)]),  # another fleet's
])
def test_base_slots_refused_room_take_parked_vms_and_parked_slots_wait(reason, no_room, expect) -> None:
    plan = core.plan(spec(2, 5, 2), room_rows(reason), [seen("SUSPENDED", "w0", 100.0)], 200.0, no_room=no_room)
    assert sorted(intents(plan)) == sorted(expect)


@pytest.mark.parametrize("refused_ago,expect", [
    (10, [("resume", "base-1", "w0")]),
    (core.ROOM_REFUSED_SECONDS - 1, [("resume", "base-1", "w0")]),  # remembered past a schedule period
    (core.ROOM_REFUSED_SECONDS, [("run", "base-1", None), ("run", "warm-1", None)]),
])
def test_a_parked_slots_refusal_keeps_base_slots_first_for_a_while(refused_ago, expect) -> None:
    rows = ledger(base(0, "b0"), base(1), warm(0, "w0"),
                  warm(1, reason="ServiceQuotaExceededException: no room", requested_at=NOW - refused_ago))
    plan = core.plan(spec(2, 4, 2), rows, [seen("RUNNING", "b0"), seen("SUSPENDED", "w0")], NOW)
    assert sorted(intents(plan, "run", "resume")) == sorted(expect)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING"])
def test_a_base_slot_refused_room_takes_a_parked_slots_vm_not_parked_yet(state) -> None:
    rows = ledger(base(0, reason="ServiceQuotaExceededException: full"), base(1, "b1"),
                  warm(0, "w0", phase=STARTING, vm_started_at=NOW - 10, requested_at=NOW - 10))
    plan = core.plan(spec(2, 3, 1), rows, [seen("RUNNING", "b1"), seen(state, "w0", NOW - 10)], NOW)
    assert intents(plan) == [("handover", "base-0", "w0")]  # and the warm slot's suspend is not sent


def test_more_new_runs_than_headroom_go_to_base_slots_first() -> None:
    rows = ledger(base(0, "b0"), base(1), base(2), warm(0), warm(1, "w1"))
    look = [seen("RUNNING", "b0"), seen("SUSPENDED", "w1")]
    plan = core.plan(spec(3, 4, 2), rows, look, NOW)
    runs = [i for i in plan.intents if i.kind == "run"]
    assert [i.slot_id for i in runs][:2] == ["base-1", "base-2"]  # the run beyond the headroom is the parked one's


def test_a_base_vm_lost_at_max_vms_takes_a_parked_vm() -> None:
    rows = ledger(base(0, "b0"), base(1), warm(0, "w0"), warm(1, "w1"))
    look = [seen("RUNNING", "b0"), seen("SUSPENDED", "w0"), seen("SUSPENDED", "w1"), seen("RUNNING", "c")]
    plan = core.plan(spec(2, 4, 2), rows, look, NOW)
    assert intents(plan, "resume") == [("resume", "base-1", "w0")] or intents(plan, "resume") == [("resume", "base-1", "w1")]


def successor_rows(end_in: float, donor_life: Optional[float] = None) -> tuple[dict[str, Slot], list[VM]]:
    rows = [base(0, "b0", vm_started_at=NOW + end_in - 28_800)]
    look = [seen("RUNNING", "b0", NOW + end_in - 28_800)]
    if donor_life is not None:
        rows.append(warm(0, "w0", vm_started_at=NOW + donor_life - 28_800))
        look.append(seen("SUSPENDED", "w0", NOW + donor_life - 28_800))
    return ledger(*rows), look


SUCCESSOR = ("run", "base-0", "b0")  # planned; with no headroom the shell notes max_vms_reached


@pytest.mark.parametrize("end_in,donor_life,expect,wake", [
    (500, 20_000, [SUCCESSOR], ("handover", 500 - 120)),  # no headroom: the handover comes 120 s before the end
    (100, 20_000, [("resume", "base-0", "w0")], None),  # within the handover lead: the parked VM takes over
    # too near its own end (it is due a successor itself): ended for room
    (100, 600, [("terminate", "warm-0", "w0"), SUCCESSOR, ("run", "warm-0", "w0")], ("replace", 0.5)),
    (100, None, [SUCCESSOR], ("replace", 101)),  # nothing parked: replaced a second after its end
])
def test_a_successor_without_headroom(end_in, donor_life, expect, wake) -> None:
    rows, look = successor_rows(end_in, donor_life)
    warm_vms = 0 if donor_life is None else 1
    plan = core.plan(spec(1, 1 + warm_vms, warm_vms), rows, look, NOW)
    assert intents(plan) == expect
    if wake is not None:
        reason, at = wake
        assert plan.wake_at(core.Reason(reason)) == NOW + at


def test_successors_that_wait_for_room_run_at_ends_of_ours() -> None:
    """Two base VMs end 100 s and 300 s from now; one slot of headroom: the first successor takes
    it, and the second runs when the first VM ends (its own end is later), woken for that end when
    the next scheduled look could come too late."""
    rows = ledger(base(0, "b0", vm_started_at=NOW + 100 - 28_800), base(1, "b1", vm_started_at=NOW + 300 - 28_800))
    look = [seen("RUNNING", "b0", NOW + 100 - 28_800), seen("RUNNING", "b1", NOW + 300 - 28_800)]
    plan = core.plan(spec(2, 3, 0), rows, look, NOW)
    assert intents(plan) == [("run", "base-0", "b0"), ("run", "base-1", "b1")]  # planned in order of their ends
    # The shell runs the first (headroom 1) and sees max_vms for the second; the plan knows the second waits.
    assert plan.wake_at(core.Reason.REPLACE) is None or plan.wake_at(core.Reason.REPLACE) >= NOW


def test_parked_refills_wait_while_a_base_vm_near_its_end_has_no_room() -> None:
    rows = ledger(base(0, "b0", vm_started_at=NOW + 100 - 28_800), warm(0))
    look = [seen("RUNNING", "b0", NOW + 100 - 28_800)]
    plan = core.plan(spec(1, 2, 1), rows, look, NOW)
    assert intents(plan) == [("run", "base-0", "b0")]  # the base successor, not the parked refill


def test_parked_slots_pending_vms_are_looked_at_as_pending_ends() -> None:
    rows = ledger(base(0, "b0"), warm(0, "w0", phase=STARTING, vm_started_at=NOW - 1))
    plan = core.plan(spec(1, 2, 1), rows, [seen("RUNNING", "b0"), seen("PENDING", "w0", NOW - 1)], NOW)
    assert plan.pending_warm == ["w0"] and plan.wake_at(core.Reason.PENDING) == NOW + core.PENDING_POLL_SECONDS
    slow = core.plan(spec(1, 2, 1), rows, [seen("RUNNING", "b0"), seen("PENDING", "w0", NOW - 40)], NOW)
    assert slow.wake_at(core.Reason.PENDING) == NOW + 20  # slow starts: polled less often


def test_a_parked_slots_vm_listed_suspending_is_parking() -> None:
    rows = ledger(warm(0, "w0", phase=STARTING, vm_started_at=100.0))
    plan = core.plan(spec(0, 1, 1), rows, [seen("SUSPENDING", "w0", 100.0)], 105.0)
    assert plan.slots["warm-0"].phase == PARKING and plan.intents == []
    plan = core.plan(spec(0, 1, 1), plan.slots, [seen("SUSPENDED", "w0", 100.0)], 107.0)
    assert plan.slots["warm-0"].phase == PARKED and told(plan) == ["vm_parked"]


# ------------------------------------------------------------------------------ ask the server


@pytest.mark.parametrize("row, state, asked", [
    (base(0, "b0", phase=SERVING), "RUNNING", True),
    (warm(0, "w0", phase=STARTING), "RUNNING", True),
    # A VM we are ending for another reason is not served (its end is asked for already).
    (warm(0, "w0", phase=STARTING, ending="above_max_vms", end_requested_at=NOW - 1), "RUNNING", False),
    # A parked slot's VM parking or parked already: a client's take serves it.
    (warm(0, "w0", phase=PARKING, parking_since=NOW - 1), "SUSPENDING", False),
    (warm(0, "w0", phase=PARKED), "SUSPENDED", False),
])
def test_the_server_is_asked_about_a_vm_that_serves_nobody_yet(row, state, asked) -> None:
    plan = core.plan(spec(0, 3, 1, serve=True), ledger(row), [seen(state, row.microvm_id)], NOW)
    assert intents(plan, "serve") == ([("serve", row.slot_id, row.microvm_id)] if asked else [])


# ------------------------------------------------------------------------------ rayd's deadline


@pytest.mark.parametrize("parked", [False, True])
def test_a_vm_ended_past_its_deadline_at_max_vms_pays_for_its_successor(parked) -> None:
    """A served fleet at max_vms (a client's VM holds the headroom): base-0's VM is past its end
    (rayd ended its agents, still listed RUNNING). It is ended, and with nothing parked its
    successor runs in its room in the same step (``paid_by``: the shell runs it once the end is
    accepted), with no wake to see the end first. With a parked VM the slot takes it instead."""
    rows = [base(0, "b0", vm_started_at=NOW - 3600, lifetime=3600)]
    look = [seen("RUNNING", "b0", NOW - 3600), seen("RUNNING", "client")]
    if parked:
        rows.append(warm(0, "w0", vm_started_at=NOW - 100))
        look.append(seen("SUSPENDED", "w0", NOW - 100))
    plan = core.plan(spec(1, 2 + parked, int(parked), serve=True, rayd_deadline=True, max_lifetime_seconds=3600),
                     ledger(*rows), look, NOW)
    ends = [(i.microvm_id, i.reason) for i in plan.intents if i.kind == "terminate"]
    successors = [i for i in plan.intents if i.kind == "run" and i.successor]
    if parked:
        assert intents(plan, "resume") == [("resume", "base-0", "w0")] and not any(i.paid_by for i in plan.intents)
        return
    assert ends == [("b0", "past_deadline")]
    assert [(i.slot_id, i.paid_by) for i in successors] == [("base-0", "b0")]
    assert plan.wake_at(core.Reason.REPLACE) is None or plan.wake_at(core.Reason.REPLACE) > NOW + 60


def test_a_successor_run_keeps_the_end_asked_of_the_vm_it_replaces_apart() -> None:
    """Run in the room of its VM, whose end the service accepted in the same step: that end is
    the retiring VM's (not asked again before a list could show it), never the new VM's."""
    row = base(0, "b0", vm_started_at=NOW - 3600, ending="past_deadline", end_requested_at=NOW)
    intent = core.Intent(core.IntentKind.RUN, "base-0", "b0", role=core.BASE, successor=True, paid_by="b0")
    slot = core.admit_run(spec(1, 2, 0, max_lifetime_seconds=3600), row, intent, NOW)
    assert (slot.retiring_id, slot.microvm_id, slot.retiring_end_asked_at) == ("b0", None, NOW)
    assert slot.ending is None and slot.end_requested_at is None and slot.room_asked_at is None


@pytest.mark.parametrize("asked_ago, ended", [
    (None, True),
    (1.0, False),  # asked a second ago: a look could not show its end yet
    (core.CONSISTENCY_SECONDS, True),  # asked again once a look could have shown it
])
def test_a_replaced_vm_past_its_deadline_is_ended_once_until_a_look_could_show_it(asked_ago, ended) -> None:
    """A served fleet at max_vms: base-0's successor b1 runs, and the VM it replaces (b0) is past
    its end (rayd ended its agents) yet listed RUNNING, holding the room."""
    row = base(0, "b1", vm_started_at=NOW - 100, retiring_id="b0", retiring_ends_at=NOW - 5,
               retiring_end_asked_at=None if asked_ago is None else NOW - asked_ago)
    look = [seen("RUNNING", "b1", NOW - 100), seen("RUNNING", "b0", NOW - 28_805)]
    plan = core.plan(spec(1, 2, 0, serve=True, rayd_deadline=True), ledger(row), look, NOW)
    ends = [(i.microvm_id, i.reason) for i in plan.intents if i.kind == "terminate"]
    assert ends == ([("b0", "past_deadline")] if ended else [])
