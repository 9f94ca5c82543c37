"""Every slot transition of the core, alone: a slot, what was seen or answered, the clock in; the slot
after, what it tells and what it asks for out (``lambdas/reconciler/core/transitions.py``)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lambdas.reconciler import core
from lambdas.reconciler.core import BASE, DEAD, PARKED, PARKING, QUEUED, RUNNING, STARTING, WARM, Failure, Slot

SPEC = core.FleetSpec("f", "arn:aws:lambda:us-east-1:123456789012:microvm-image:f", min_vms=2, max_vms=4, warm_vms=1,
                      max_lifetime_seconds=1_000, idle_seconds=None, max_start_attempts=3)
IDLE = core.FleetSpec("f", SPEC.image_arn, min_vms=2, max_vms=4, warm_vms=1, idle_seconds=300)
NOW = 10_000.0


def slot(slot_id: str = "base-0", **fields: Any) -> Slot:
    return Slot(slot_id, BASE if slot_id.startswith("base") else WARM, **fields)


def vm(state: str, started: float = NOW - 100, reason: Optional[str] = None, vm_id: str = "vm-1") -> core.Observed:
    return core.Observed(vm_id, state, started, reason=reason)


def names(change: core.Change) -> list[str]:
    return [e["event"] for e in change.events]


def test_a_transition_never_changes_its_argument() -> None:
    before = slot(phase=RUNNING, microvm_id="vm-1", vm_started_at=NOW - 2_000, lifetime=1_000)
    kept = before.to_dict()
    core.vm_ended(SPEC, before, vm("TERMINATED", NOW - 2_000), NOW)
    core.run_failed(SPEC, before, core.Intent(core.IntentKind.RUN, "base-0"), Failure("InternalServerException", 500), NOW)
    core.requeue(before, "x", NOW)
    assert before.to_dict() == kept


def test_a_requeue_is_a_new_generation_with_nothing_pinned() -> None:
    after = core.requeue(slot(generation=4, phase=RUNNING, microvm_id="vm-1", request={"a": 1}, lifetime=9,
                              in_doubt_since=1.0, ending="x", handover_from="warm-0", parking_since=2.0,
                              park_doubt_since=3.0, end_requested_at=4.0, room_asked_at=5.0, noted="deadline",
                              crashes=2, errors=1), "expired", NOW)
    assert (after.generation, after.phase, after.queued_at, after.reason) == (5, QUEUED, NOW, "expired")
    assert all(getattr(after, f) is None for f in ("microvm_id", "request", "lifetime", "in_doubt_since", "ending",
                                                   "handover_from", "parking_since", "park_doubt_since",
                                                   "end_requested_at", "room_asked_at", "noted", "vm_started_at"))
    assert (after.crashes, after.errors) == (2, 1)  # counts belong to the slot, not to the VM


@pytest.mark.parametrize("in_doubt,generation,pinned", [(None, 3, None), (NOW - 5, 2, {"pinned": True})],
                         ids=["a new token", "in doubt: the same token"])
def test_a_redrive_queues_a_dead_slot_from_now(in_doubt, generation, pinned) -> None:
    """One rule for a redrive and for a spec that changed (index.redrive used to keep queued_at)."""
    dead = slot(generation=2, phase=DEAD, dead_kind="service", errors=5, crashes=1, retry_at=NOW + 60,
                noted="deadline", queued_at=NOW - 3_600, in_doubt_since=in_doubt, request={"pinned": True})
    change = core.redrive(dead, NOW, "redriven")
    after = change.slot
    assert after is not None
    assert (after.phase, after.errors, after.crashes, after.dead_kind, after.retry_at, after.noted) == (QUEUED, 0, 0, None, None, None)
    assert (after.queued_at, after.reason, after.generation, after.request) == (NOW, "redriven", generation, pinned)
    assert change.events == [core.event("slot_redriven", after, reason="redriven")]


def test_a_dead_service_slot_due_is_probed_once() -> None:
    change = core.probe(slot(phase=DEAD, dead_kind="service", retry_at=NOW))
    assert change.slot is not None and change.slot.phase == QUEUED and names(change) == ["dead_slot_probed"]


@pytest.mark.parametrize("lived,ending,reason,expect", [
    (1_000, None, None, ("vm_expired", "expired", 0, QUEUED)),  # at its lifetime
    (920, None, None, ("vm_expired", "expired", 0, QUEUED)),  # within the 90 s margin of it
    (500, "above_max_vms", None, ("vm_ended", "above_max_vms", 0, QUEUED)),  # ours to end
    (500, None, "Success.", ("vm_expired", "expired", 0, QUEUED)),  # a TerminateMicrovm's reason
    (500, None, "MicroVM exceeded suspended duration.", ("vm_expired", "expired", 0, QUEUED)),
    (500, None, "app exited", ("vm_ended_unexpectedly", "replaced_after_early_end", 2, QUEUED)),  # a crash
])
def test_an_end_is_a_replacement_or_a_crash(lived, ending, reason, expect) -> None:
    before = slot(generation=1, phase=RUNNING, microvm_id="vm-1", vm_started_at=NOW - lived, lifetime=1_000,
                  ending=ending, crashes=1)
    change = core.vm_ended(SPEC, before, vm("TERMINATED", NOW - lived, reason), NOW)
    told, why, crashes, phase = expect
    assert names(change) == [told]
    assert change.slot is not None and (change.slot.reason, change.slot.crashes, change.slot.phase) == (why, crashes, phase)
    assert change.slot.generation == 2 and change.slot.microvm_id is None


def test_max_start_attempts_early_ends_in_a_row_dead_letter_the_slot() -> None:
    before = slot(generation=4, phase=RUNNING, microvm_id="vm-1", vm_started_at=NOW - 601, lifetime=1_000, crashes=2)
    change = core.vm_ended(SPEC, before, vm("TERMINATED", NOW - 601, "oom"), NOW)
    after = change.slot
    assert after is not None and (after.phase, after.dead_kind, after.crashes) == (DEAD, "crash", 3)
    assert names(change) == ["vm_ended_unexpectedly", "slot_dead_lettered"]
    assert change.events[1]["last_vm"] == "vm-1" and change.events[1]["kind"] == "crash"
    assert after.letter == change.events[1] and "ended early 3 times in a row (last: oom)" == after.reason


@pytest.mark.parametrize("spec,state,phase,handover,parking,expect", [
    (SPEC, "RUNNING", STARTING, None, None, (RUNNING, ["vm_running"], [])),
    (SPEC, "RUNNING", RUNNING, None, None, (RUNNING, [], [])),
    (SPEC, "PENDING", STARTING, None, None, (STARTING, [], [])),
    (IDLE, "SUSPENDED", STARTING, None, None, (RUNNING, ["vm_running"], [])),  # idle-suspended: live
    (SPEC, "SUSPENDED", STARTING, "warm-0", None, (STARTING, [], ["resume"])),  # handed over, not resumed yet
    (SPEC, "SUSPENDED", STARTING, "warm-0", NOW - 10, (STARTING, [], [])),  # resume asked 10 s ago: wait
    (SPEC, "SUSPENDED", STARTING, "warm-0", NOW - 31, (STARTING, [], ["resume"])),  # past the park grace: again
    (IDLE, "SUSPENDED", STARTING, "warm-0", None, (STARTING, [], ["resume"])),  # a handed-over VM is resumed
])
def test_a_base_slot_sees_its_vm(spec, state, phase, handover, parking, expect) -> None:
    before = slot(phase=phase, microvm_id="vm-1", requested_at=NOW - 3, handover_from=handover, parking_since=parking)
    change = core.base_seen(spec, before, vm(state, NOW - 50), NOW)
    assert change.slot is not None and change.slot.vm_started_at == NOW - 50
    assert (change.slot.phase, names(change), [str(i.kind) for i in change.intents]) == expect
    if state == "SUSPENDED" and not (spec is IDLE and handover is None):
        assert [w.reason for w in change.waits] == [core.Reason.TRANSITION]


@pytest.mark.parametrize("state,phase,parking,expect", [
    ("RUNNING", STARTING, None, (PARKING, [], ["suspend"], False)),  # run: suspend it
    ("RUNNING", PARKING, None, (PARKING, [], ["suspend"], False)),  # our suspend not accepted yet
    ("RUNNING", PARKING, NOW - 10, (PARKING, [], [], False)),  # accepted; the look lags
    ("RUNNING", PARKING, NOW - 31, (QUEUED, ["warm_slot_taken"], [], True)),  # a client resumed it
    ("PENDING", PARKED, None, (QUEUED, ["warm_slot_taken"], [], True)),  # parked, then running: a client's
    ("SUSPENDING", PARKING, NOW - 1, (PARKING, [], [], False)),
    ("SUSPENDED", PARKING, NOW - 2, (PARKED, ["vm_parked"], [], False)),
    ("SUSPENDED", PARKED, NOW - 99, (PARKED, [], [], False)),
    ("PENDING", STARTING, None, (STARTING, [], [], False)),  # parked once it runs
])
def test_a_parked_slot_sees_its_vm(state, phase, parking, expect) -> None:
    before = slot("warm-0", generation=1, phase=phase, microvm_id="vm-1", parking_since=parking, requested_at=NOW - 5)
    change = core.warm_seen(SPEC, before, vm(state, NOW - 60), NOW)
    new_phase, told, intents, member = expect
    assert change.slot is not None and change.slot.phase == new_phase
    assert (names(change), [str(i.kind) for i in change.intents]) == (told, intents)
    assert [m.microvm_id for m in change.members] == (["vm-1"] if member else [])
    if member:
        assert change.slot.generation == 2 and change.slot.reason == "taken_by_client" and change.members[0].role == "member"
    assert (change.pending is not None) == (state == "PENDING" and not member)


@given(state=st.sampled_from(["PENDING", "RUNNING", "SUSPENDING", "SUSPENDED"]), sent=st.floats(0, 1e9),
       after=st.floats(0, 3600))
def test_a_read_proves_a_lost_suspend_did_not_land_only_before_a_client_could_resume(state, sent, after) -> None:
    change = core.settle_park_doubt(slot("warm-0", phase=PARKING, microvm_id="vm", park_doubt_since=sent), state, sent + after)
    settled, events = change.slot, change.events
    assert settled is not None and settled.park_doubt_since is None and len(events) == 1
    if state in ("PENDING", "RUNNING") and (sent + after) - sent < core.SUSPEND_THEN_RESUME_SECONDS:
        assert settled.parking_since is None and events[0]["outcome"] == "not_landed"  # sent again
    else:
        assert settled.parking_since == sent  # accepted: never sent again
        assert events[0]["outcome"] == ("landed" if state.startswith("SUSPEND") else "unknown")


def test_a_settle_without_a_doubt_changes_nothing() -> None:
    before = slot("warm-0", phase=PARKING, microvm_id="vm")
    assert core.settle_park_doubt(before, "RUNNING", NOW) == core.Change(before)


def test_a_suspend_is_written_in_doubt_first_and_answered_after() -> None:
    sent = core.park_sent(slot("warm-0", phase=PARKING, microvm_id="vm"), NOW)
    assert sent.park_doubt_since == NOW and sent.parking_since is None
    accepted = core.park_answered(sent, NOW + 0.1)
    assert (accepted.park_doubt_since, accepted.parking_since) == (None, NOW + 0.1)
    refused = core.park_answered(sent, None)
    assert (refused.park_doubt_since, refused.parking_since) == (None, None)


def test_an_end_we_ask_for_is_ours() -> None:
    asked = core.end_requested(slot("warm-0", microvm_id="vm"), "above_max_vms")
    assert asked.ending == "above_max_vms" and core.end_accepted(asked, NOW).end_requested_at == NOW


# ------------------------------------------------------------------------------ a run

RUN = core.Intent(core.IntentKind.RUN, "base-0", role=BASE)
RETRY = core.Intent(core.IntentKind.RUN, "base-0", role=BASE, retry=True)


def test_admit_run_pins_the_request_and_staggers_the_first_lifetime() -> None:
    first = core.admit_run(SPEC, slot(queued_at=NOW - 9), RUN, NOW, lambda s: {"maximumDurationInSeconds": s.lifetime,
                                                                                 "role": str(s.role)})
    assert first.lifetime == core.first_lifetime(SPEC, "base-0", BASE) < 1_000  # staggered
    assert first.request == {"maximumDurationInSeconds": first.lifetime, "role": "base"}
    assert (first.phase, first.requested_at, first.retry_at, first.noted) == (STARTING, NOW, None, None)
    again = core.admit_run(SPEC, first, RUN, NOW + 5, lambda s: {"changed": True})
    assert again.request == first.request  # pinned for the generation: a retry sends the same
    later = core.admit_run(SPEC, slot(generation=3, first_generation=0), RUN, NOW)
    assert later.lifetime == 1_000 and later.request == {"maximumDurationInSeconds": 1_000}


def test_admit_run_of_a_successor_retires_the_vm_it_replaces() -> None:
    running = slot(generation=2, phase=RUNNING, microvm_id="vm-1", vm_started_at=NOW - 800, lifetime=1_000,
                   request={"old": True}, noted="deadline")
    after = core.admit_run(SPEC, running, core.Intent(core.IntentKind.RUN, "base-0", "vm-1", role=BASE, successor=True), NOW)
    assert (after.retiring_id, after.retiring_ends_at, after.microvm_id) == ("vm-1", NOW + 200, None)
    assert (after.generation, after.queued_at, after.lifetime, after.noted) == (3, NOW, 1_000, None)


def test_a_deadline_told_stays_told_across_attempts() -> None:
    assert core.admit_run(SPEC, slot(noted="deadline,max_vms_reached"), RUN, NOW).noted == "deadline"


def test_a_run_answered_holds_its_vm() -> None:
    change = core.run_answered(slot(phase=STARTING, errors=2, in_doubt_since=NOW - 3, retry_at=NOW), "vm-9", NOW - 1, "PENDING")
    after = change.slot
    assert after is not None and (after.microvm_id, after.vm_started_at, after.errors, after.in_doubt_since,
                                  after.retry_at) == ("vm-9", NOW - 1, 0, None, None)
    assert change.events == [core.event("run_accepted", after, state="PENDING")]


def test_a_token_answered_with_another_slots_vm_moves_to_a_new_token() -> None:
    change = core.token_collision(slot(generation=1, phase=STARTING, request={"a": 1}, in_doubt_since=NOW), "vm-2", "member-vm-2")
    assert change.slot is not None and (change.slot.generation, change.slot.phase, change.slot.request,
                                        change.slot.in_doubt_since) == (2, QUEUED, None, None)
    assert change.events[0]["event"] == "token_collision" and change.events[0]["holder"] == "member-vm-2"


E500 = Failure("InternalServerException", 500, "boom")
LOST = Failure("ReadTimeoutError", 0, "read timeout")
QUOTA = Failure("ServiceQuotaExceededException", 402, "full")
CAPACITY = Failure("InsufficientCapacityException", 500, "none")
THROTTLE = Failure("ThrottlingException", 429, "slow down")
INVALID = Failure("ValidationException", 400, "bad")
DENIED = Failure("AccessDeniedException", 403, "no")
CONFLICT = Failure("ConflictException", 409, "other parameters")
TEAPOT = Failure("SomethingNew", 418, "?")


@pytest.mark.parametrize("failure,intent,doubt,expect", [
    # failure, intent, the slot in doubt before, (phase, in doubt after, errors, generation, retry in, events)
    (THROTTLE, RUN, None, (QUEUED, False, 0, 1, None, [])),  # the rate's fault: no error
    (THROTTLE, RETRY, None, (STARTING, True, 0, 1, None, [])),  # says nothing of the lost call
    (QUOTA, RUN, None, (QUEUED, False, 0, 1, None, [])),  # the account's state: never counted
    (CAPACITY, RETRY, NOW - 9, (QUEUED, False, 0, 1, None, ["run_doubt_resolved"])),  # no VM for the token
    (E500, RUN, None, (STARTING, True, 1, 1, 2.0, [])),  # the VM may exist
    (LOST, RUN, None, (STARTING, True, 1, 1, 2.0, [])),  # no answer: the same
    (INVALID, RUN, None, (QUEUED, False, 1, 1, 2.0, [])),  # a request error
    (INVALID, RETRY, None, (STARTING, True, 1, 1, 2.0, [])),  # refused before the token was looked at
    (DENIED, RUN, NOW - 9, (STARTING, True, 1, 1, 2.0, [])),  # in doubt: stays in doubt
    (CONFLICT, RUN, None, (QUEUED, False, 1, 2, 2.0, [])),  # used with other parameters: a new token
    (CONFLICT, RETRY, None, (STARTING, True, 1, 1, 2.0, [])),  # pinned parameters: proves nothing
    (TEAPOT, RUN, None, (QUEUED, False, 1, 1, 2.0, [])),  # another 4xx: a request error
])
def test_a_failed_run_by_what_its_error_proves(failure, intent, doubt, expect) -> None:
    before = slot(generation=1, phase=STARTING, requested_at=NOW, in_doubt_since=doubt, request={"pinned": 1})
    change = core.run_failed(SPEC, before, intent, failure, NOW)
    after = change.slot
    phase, doubted, errors, generation, retry_in, told = expect
    assert after is not None
    assert (after.phase, after.in_doubt_since is not None, after.errors, after.generation) == (phase, doubted, errors, generation)
    assert after.retry_at == (None if retry_in is None else NOW + retry_in) and names(change) == told
    assert (after.request is None) == (generation == 2)
    if failure is not THROTTLE:
        assert after.reason == f"{failure.code}: {failure.message}"


@pytest.mark.parametrize("failure,errors,doubt,expect", [
    (E500, 2, None, ("service", NOW + 60, True, 0)),  # dead-lettered, probed in 60 s, still in doubt
    (E500, 3, None, ("service", NOW + 120, False, 1)),  # a failed probe: twice as long, no letter
    (INVALID, 2, None, ("request", None, True, 0)),  # waits for a redrive
    (DENIED, 2, NOW - 5, ("request", None, True, 0)),
])
def test_max_start_attempts_errors_in_a_row_dead_letter_the_slot(failure, errors, doubt, expect) -> None:
    before = slot(generation=1, phase=STARTING, requested_at=NOW, errors=errors, in_doubt_since=doubt)
    change = core.run_failed(SPEC, before, RUN, failure, NOW)
    kind, retry_at, letter, probe = expect
    after = change.slot
    assert after is not None and (after.phase, after.dead_kind, after.retry_at) == (DEAD, kind, retry_at)
    assert names(change) == ["slot_dead_lettered"] and (after.letter is not None) == letter
    assert change.events[0].get("probe", 0) == probe and change.events[0]["errors"] == errors + 1
    assert change.events[0].get("in_doubt") == (True if after.in_doubt_since is not None else None)


def test_refusals_for_room_never_dead_letter() -> None:
    before = slot(phase=STARTING, requested_at=NOW, errors=2)
    for failure in (QUOTA, CAPACITY):
        after = core.run_failed(SPEC, before, RUN, failure, NOW).slot
        assert after is not None and after.phase == QUEUED and after.errors == 2 and core.refused_for_room(after)


def test_backoffs_and_probes_grow_and_stop_growing() -> None:
    assert [core.retry_delay(n) for n in range(1, 7)] == [2.0, 8.0, 32.0, 128.0, 512.0, 900.0]
    assert [core.dead_probe_delay(n) for n in range(6)] == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0]
    assert core.dead_probe_delay(-1) == 60.0 and core.dead_probe_delay(10_000) == 900.0


@pytest.mark.parametrize("failure,lost", [
    (E500, True), (Failure("ServiceUnavailable", 503), True), (THROTTLE, False), (CONFLICT, False),
    (Failure("ResourceNotFoundException", 404), False), (INVALID, False), (LOST, True),
    (Failure("ConnectTimeoutError", 0, connected=False), False),
])
def test_which_failures_may_have_been_carried_out(failure, lost) -> None:
    assert failure.lost is lost


# ------------------------------------------------------------------------------ handover, members


def test_a_handover_moves_a_parked_vm_between_two_slots_of_the_ledger() -> None:
    base = slot(generation=1, phase=RUNNING, microvm_id="vm-old", vm_started_at=NOW - 900, lifetime=1_000,
                request={"a": 1}, errors=1, in_doubt_since=1.0, park_doubt_since=2.0)
    donor = slot("warm-0", generation=5, phase=PARKED, microvm_id="vm-p", vm_started_at=NOW - 100, lifetime=1_000)
    took, gave = core.handover(base, donor, NOW)
    assert (took.microvm_id, took.retiring_id, took.retiring_ends_at) == ("vm-p", "vm-old", NOW + 100)
    assert (took.generation, took.phase, took.handover_from, took.vm_started_at, took.lifetime) == (2, STARTING, "warm-0", NOW - 100, 1_000)
    assert (took.request, took.errors, took.in_doubt_since, took.park_doubt_since) == (None, 0, None, None)
    assert (gave.microvm_id, gave.generation, gave.reason) == (None, 6, "handed_to_base-0")


@pytest.mark.parametrize("phase,vm_id,draining,ending,parked,young", [
    (PARKED, "vm", False, None, True, False),
    (STARTING, "vm", False, None, False, True),
    (PARKING, "vm", False, None, False, True),
    (PARKED, "vm", True, None, False, False),  # draining: ended, not handed over
    (PARKED, "vm", False, "room_for_successor", False, False),
    (STARTING, None, False, None, False, False),  # in doubt: nothing to hand over
])
def test_which_parked_slots_may_give_their_vm(phase, vm_id, draining, ending, parked, young) -> None:
    donor = slot("warm-0", phase=phase, microvm_id=vm_id, draining=draining, ending=ending)
    assert (core.parked_donor(donor), core.young_donor(donor)) == (parked, young)


def test_a_retiring_vm_ends_or_becomes_a_clients_member() -> None:
    base = slot(retiring_id="vm-r", retiring_ends_at=NOW, microvm_id="vm-1")
    change = core.retiring_seen(base, vm("TERMINATED", vm_id="vm-r"), NOW)
    assert change.slot is not None and change.slot.retiring_id is None and names(change) == ["vm_retired"]
    assert core.retiring_seen(base, vm("RUNNING", vm_id="vm-r"), NOW) == core.Change(base)  # a base slot's: it runs on
    warm = slot("warm-0", retiring_id="vm-r", microvm_id="vm-1", queued_at=NOW - 31)
    taken = core.retiring_seen(warm, vm("RUNNING", vm_id="vm-r"), NOW)
    assert taken.slot is not None and taken.slot.retiring_id is None and names(taken) == ["warm_slot_taken"]
    assert [m.slot_id for m in taken.members] == ["member-vm-r"]
    assert core.retiring_seen(slot("warm-0", retiring_id="vm-r", queued_at=NOW - 10), vm("RUNNING", vm_id="vm-r"), NOW).members == []


def test_a_member_is_forgotten_once_its_vm_ended() -> None:
    member = core.member_of("vm-m", NOW - 5, NOW)
    assert (member.slot_id, member.role, member.phase) == ("member-vm-m", "member", RUNNING)
    assert core.member_seen(member, vm("RUNNING", vm_id="vm-m")).slot is member
    assert core.member_seen(member, None).slot is member  # absence is not an end
    gone = core.member_seen(member, core.Observed("vm-m", core.GONE, 0.0))
    assert gone.slot is None and names(gone) == ["member_released"]


def test_a_wait_is_told_once() -> None:
    told = core.note_wait(slot(), "max_vms_reached")
    assert told is not None and core.noted(told, "max_vms_reached") and core.note_wait(told, "max_vms_reached") is None


# ------------------------------------------------------------------------------ serving (issue #33)

SERVED = core.FleetSpec("f", SPEC.image_arn, min_vms=2, max_vms=4, warm_vms=1, max_lifetime_seconds=1_000,
                        max_start_attempts=3, serve=True)


def ready(outcome: str = "ready", at: float = NOW - 1, attempt: int = 1, role: str = "member", vm_id: str = "vm-1",
          reason: Optional[str] = None) -> core.Ready:
    return core.Ready(vm_id, outcome, at, attempt, reason, role)


@pytest.mark.parametrize("state, before, expect", [
    # Running but not served: SERVING (the server is asked by :func:`ask_about`).
    ("RUNNING", dict(phase=STARTING), dict(phase=core.SERVING, events=["vm_started"])),
    # Served: RUNNING, it counts.
    ("RUNNING", dict(phase=core.SERVING, ready_at=NOW - 1), dict(phase=RUNNING, events=["vm_running"])),
    # Served and idle-suspended by its own policy (auto-resume): still serving.
    ("SUSPENDED", dict(phase=core.SERVING, ready_at=NOW - 1, auto_resume=True), dict(phase=RUNNING)),
    # Suspended by its idle policy before it was served (auto-resume): SERVING (an ask wakes it).
    ("SUSPENDED", dict(phase=STARTING, auto_resume=True), dict(phase=core.SERVING)),
    # Still PENDING: STARTING (the server waits for it).
    ("PENDING", dict(phase=STARTING), dict(phase=STARTING)),
])
def test_a_served_fleets_base_slot_counts_its_vm_once_it_serves(state, before, expect) -> None:
    change = core.base_seen(SERVED, slot(microvm_id="vm-1", requested_at=NOW - 30, **before), vm(state, NOW - 30), NOW)
    after = change.slot
    assert after is not None and after.phase == expect["phase"] and not change.intents
    for event in expect.get("events", []):
        assert event in names(change)


@pytest.mark.parametrize("before, expect", [
    # Never asked: asked.
    (dict(), dict(intents=["serve"])),
    # Asked, no answer yet: it waits for one (a wake), no second ask.
    (dict(serve_asked_at=NOW - 5, serve_asks=1), dict(waits=["served"])),
    # No answer long after the ask (the server timed out, an Invoke lost): asked again.
    (dict(serve_asked_at=NOW - core.SERVE_RETRY_SECONDS, serve_asks=1), dict(intents=["serve"])),
    # Its last ask failed (written down): asked again.
    (dict(serve_asked_at=None, serve_asks=1, serve_failures=1), dict(intents=["serve"])),
    # Every ask spent without it serving: ended (ours: not a client's), as a crash.
    (dict(serve_asked_at=None, serve_asks=3, serve_failures=3),
     dict(intents=["terminate"], events=["vm_not_serving"], ending="not_serving")),
    # Served: nothing to ask.
    (dict(ready_at=NOW - 1), dict()),
])
def test_what_a_served_fleet_asks_its_server(before, expect) -> None:
    change = core.ask_about(SERVED, slot(microvm_id="vm-1", phase=core.SERVING, **before), NOW)
    assert [i.kind for i in change.intents] == expect.get("intents", [])
    assert [str(w.reason) for w in change.waits] == expect.get("waits", [])  # a base slot: "served"
    assert names(change) == expect.get("events", [])
    if "ending" in expect:
        assert change.slot.ending == expect["ending"]


def test_an_unserved_fleet_counts_a_vm_once_it_runs() -> None:
    """``serve=False`` (no server): RUNNING is live, nothing is asked."""
    change = core.base_seen(SPEC, slot(microvm_id="vm-1", phase=STARTING), vm("RUNNING"), NOW)
    assert change.slot.phase == RUNNING and not change.intents


@pytest.mark.parametrize("before, expect", [
    (dict(phase=STARTING), dict(intents=[])),  # RUNNING, not warmed: warmed (asked) before it is parked
    (dict(phase=STARTING, ready_at=NOW - 1), dict(intents=["suspend"], phase=PARKING)),  # warmed: parked
])
def test_a_served_fleets_parked_slot_is_warmed_before_it_is_parked(before, expect) -> None:
    change = core.warm_seen(SERVED, slot("warm-0", microvm_id="vm-1", **before), vm("RUNNING", NOW - 10), NOW)
    assert [i.kind for i in change.intents] == expect["intents"]
    assert change.slot.phase == expect.get("phase", STARTING)


@pytest.mark.parametrize("fact, before, expect", [
    # Ready for the slot's role: served from the fact's time.
    (ready(), dict(serve_asked_at=NOW - 3, serve_asks=1), dict(ready_at=NOW - 1, events=["vm_serving"])),
    # Not yet (the answer's time is ahead of the clock, as a virtual server writes it).
    (ready(at=NOW + 2), dict(serve_asked_at=NOW - 3, serve_asks=1), dict(ready_at=None)),
    # A parked slot's warming is no serving: a base slot that took the VM must have it served.
    (ready(role="warm"), dict(serve_asks=0), dict(ready_at=None)),
    # Another VM's answer (the slot moved on).
    (ready(vm_id="vm-2"), dict(serve_asked_at=NOW - 3, serve_asks=1), dict(ready_at=None)),
    # The last ask failed: counted once, the next plan asks again.
    (ready("failed", reason="SandboxNotReadyException"), dict(serve_asked_at=NOW - 3, serve_asks=1),
     dict(serve_failures=1, serve_asked_at=None, events=["serve_failed"])),
    # An earlier ask's failure, already counted: nothing.
    (ready("failed", attempt=1), dict(serve_asked_at=NOW - 3, serve_asks=2, serve_failures=1),
     dict(serve_failures=1, serve_asked_at=NOW - 3)),
])
def test_the_servers_answer(fact, before, expect) -> None:
    change = core.ready_seen(slot(microvm_id="vm-1", requested_at=NOW - 30, **before), fact, NOW)
    after = change.slot
    for name in ("ready_at", "serve_failures", "serve_asked_at"):
        if name in expect:
            assert getattr(after, name) == expect[name], name
    assert names(change) == expect.get("events", [])


def test_a_vm_ended_because_it_never_served_is_a_crash() -> None:
    before = slot(microvm_id="vm-1", phase=core.SERVING, vm_started_at=NOW - 400, lifetime=1_000,
                  ending="not_serving", reason="not_serving: TimeoutException")
    change = core.vm_ended(SERVED, before, vm("TERMINATED", NOW - 400, reason="Success."), NOW)
    assert names(change) == ["vm_ended_unexpectedly"] and change.slot.crashes == 1
    assert change.slot.ready_at is None and change.slot.serve_asks == 0  # the next VM starts afresh


def test_a_handover_is_served_as_a_base_slot() -> None:
    base, donor = core.handover(slot(phase=QUEUED), slot("warm-0", phase=PARKED, microvm_id="vm-9", ready_at=NOW - 50,
                                                        serve_asks=1, auto_resume=True), NOW)
    assert base.microvm_id == "vm-9" and base.ready_at is None and base.serve_asks == 0 and base.auto_resume


@pytest.mark.parametrize("request_, life", [
    ({"maximumDurationInSeconds": 3660}, 3660),
    ({"maximumDurationInSeconds": 3660, "runHookPayload": '{"lifecycle": {"timeout_s": 3600, "on_timeout": "kill"}}'}, 3600),
    # A logical deadline that pauses instead of killing does not end the VM.
    ({"maximumDurationInSeconds": 3660, "runHookPayload": '{"lifecycle": {"timeout_s": 3600, "on_timeout": "pause"}}'}, 3660),
    ({"maximumDurationInSeconds": 900, "runHookPayload": "not json"}, 900),
    # The service's cap comes first when the logical deadline is later, or not a number of seconds.
    ({"maximumDurationInSeconds": 900, "runHookPayload": '{"lifecycle": {"timeout_s": 3600, "on_timeout": "kill"}}'}, 900),
    ({"maximumDurationInSeconds": 900, "runHookPayload": '{"lifecycle": {"timeout_s": "600", "on_timeout": "kill"}}'}, 900),
    ({}, 28_800),
])
def test_a_vm_serves_until_its_logical_deadline(request_, life) -> None:
    assert core.serving_life(request_, 28_800) == life
