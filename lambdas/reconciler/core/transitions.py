"""Every change of a slot, as a pure function of the slot, what was seen or answered, and the clock.

Each function takes a slot and returns a :class:`Change`: the slot after (a copy: the argument is
never changed), the timeline events it tells, and what it asks for (intents, waits, members). The
plan (:mod:`.plan`) applies the ones that come from looking at the service; the shell applies the
ones that come from answers to its calls (a run's answer or failure, a suspend sent, answered or
lost, an end asked for), writing each slot before and after its call.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .model import (
    BASE,
    DEAD,
    MEMBER,
    PARKED,
    PARKING,
    QUEUED,
    RUNNING,
    SERVING,
    STARTING,
    WARM,
    DeadKind,
    FleetSpec,
    Intent,
    IntentKind,
    Observed,
    Ready,
    Reason,
    Slot,
    Wait,
    event,
    note,
    noted,
    since,
)
from .shape import first_lifetime

#: How long after its start a VM may be missing from lists and gets without that meaning anything
#: (measured: GetMicrovm said PENDING 0.5 s after a resume; lists lag new VMs).
CONSISTENCY_SECONDS = 60.0
#: After the service accepted a SuspendMicrovm, a VM still seen RUNNING this much later was resumed
#: by a client (it took the parked slot), not merely slow to suspend or slow to list.
PARK_GRACE_SECONDS = 30.0
#: A suspended VM reads RUNNING again only after the suspend (measured 1.01-1.49 s to SUSPENDED)
#: and a client's resume (RUNNING 1.2 s after the call): a RUNNING read made less than this after a
#: suspend whose answer was lost proves the suspend did not land.
SUSPEND_THEN_RESUME_SECONDS = 2.2
#: A VM that ends within this much of its ``maximumDurationInSeconds`` ended normally (clock skew
#: between the function and the service included); earlier, it ended early (a crash).
EXPIRY_MARGIN_SECONDS = 90.0
#: Backoff of a slot after a failed RunMicrovm: base * 4^(errors-1), at most the cap.
RETRY_BASE_SECONDS = 2.0
RETRY_CAP_SECONDS = 900.0
#: A slot dead-lettered for the service's failures is probed this long after, then twice as long
#: after each failed probe, at most once per DEAD_PROBE_SECONDS: a two-hour outage costs a slot
#: about 14 calls, and a minute of 500s (three attempts in 42 s) leaves the fleet empty 60 s.
DEAD_PROBE_SECONDS = 900.0
DEAD_PROBE_FIRST_SECONDS = 60.0
#: Words of the ``stateReason`` of ends that are no crash: a TerminateMicrovm (measured:
#: "Success."), the end of the lifetime ("MicroVM exceeded maximum lifetime.") or of an idle
#: policy's suspended duration ("MicroVM exceeded suspended duration.").
REQUESTED_END_REASONS = ("success", "exceeded maximum lifetime", "exceeded suspended duration",
                         "terminated_by_request", "idle_timeout", "maximum_duration")
#: How soon a step looks again at our own resume or suspend (a base slot's handed-over VM).
TRANSITION_POLL_SECONDS = 5.0
#: The server's answer about a VM is looked for this long after the ask (measured: RunMicrovm to
#: the product's agent ready, p50 2.33 s; the agent host's start and a warm slot's settling cell
#: add about a second), then every ``SERVE_POLL_SECONDS`` while the tick lasts.
SERVE_EXPECTED_SECONDS = 3.0
SERVE_POLL_SECONDS = 2.0
#: An ask the server has not answered this long after is asked again (the server's own timeout is
#: two minutes: a VM not ready by then is a failure it writes down).
SERVE_RETRY_SECONDS = 150.0

# RunMicrovm errors, by what they prove (docs/reconciler.md "Ownership").
THROTTLED = "ThrottlingException"
CONFLICT = "ConflictException"
#: The request was refused before any VM was made: a slot error of kind ``request``.
REQUEST_FAILURES = frozenset({"ValidationException", "ResourceNotFoundException", "AccessDeniedException"})
#: The account has no room for another VM now (the memory quota's 402, InsufficientCapacity). The
#: service weighed a new VM for the token and made none (one an earlier call had made would have
#: been returned), so these are the only refusals that prove a token in doubt holds no VM.
REFUSED_FOR_ROOM = frozenset({"ServiceQuotaExceededException", "InsufficientCapacityException"})
#: Errors every reconciler backs off from together (the shared budget's ``backoff``).
SHARED_BACKOFFS = frozenset({THROTTLED, *REFUSED_FOR_ROOM})


@dataclass
class Change:
    """A slot after one transition (None: the ledger forgets it) and what the transition says."""

    slot: Optional[Slot]
    events: list[dict[str, Any]] = field(default_factory=list)
    intents: list[Intent] = field(default_factory=list)
    members: list[Slot] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    pending: Optional[Observed] = None  # a parked slot's VM still PENDING (parked once it runs)


@dataclass(frozen=True)
class Failure:
    """A call that did not succeed, as the shell read it: the error code, the HTTP status (0: no
    answer came back) and, for a Conflict, the VM the service named."""

    code: str
    status: int = 0
    message: str = ""
    named_vm: Optional[str] = None
    retry_after: Optional[float] = None  # a 429's retryAfterSeconds
    connected: bool = True  # False: the request never left (a connect timeout, no endpoint)

    @property
    def lost(self) -> bool:
        """Whether the call may have been carried out: a 5xx, or no answer after the request may
        have gone out (a read timeout, a dropped connection). A throttle, a 4xx or a connection
        that was never made proves it was not."""
        if not self.connected:
            return False
        return self.status >= 500 or (self.status == 0 and self.code not in REQUEST_FAILURES | SHARED_BACKOFFS
                                      and self.code != CONFLICT)


def _copy(slot: Slot) -> Slot:
    return copy.copy(slot)


# ------------------------------------------------------------------------------ waiting for a VM


def requeue(slot: Slot, reason: str, now: float) -> Slot:
    """The slot wants a new VM: a new generation (a new client token), nothing pinned."""
    slot = _copy(slot)
    slot.generation += 1
    slot.phase, slot.microvm_id, slot.queued_at, slot.requested_at = QUEUED, None, now, None
    slot.vm_started_at, slot.reason, slot.noted, slot.parking_since = None, reason, None, None
    slot.park_doubt_since = None
    slot.request, slot.lifetime, slot.in_doubt_since, slot.ending, slot.handover_from = None, None, None, None, None
    slot.end_requested_at = slot.room_asked_at = None
    _forget_serving(slot)
    return slot


def _forget_serving(slot: Slot) -> None:
    slot.auto_resume, slot.ready_at, slot.serve_asked_at, slot.serve_asks, slot.serve_failures = False, None, None, 0, 0


def redrive(slot: Slot, now: float, why: str) -> Change:
    """A dead-lettered slot tried again (a redrive, or a spec that changed): queued from now, its
    counts cleared; a slot that was in doubt keeps its token, so a VM its last call made is found,
    not doubled; any other one moves to a new generation."""
    slot = _copy(slot)
    slot.phase, slot.errors, slot.crashes, slot.dead_kind, slot.retry_at = QUEUED, 0, 0, None, None
    slot.noted, slot.queued_at, slot.reason = None, now, why
    if slot.in_doubt_since is None:
        slot.generation += 1
        slot.request = None
    return Change(slot, [event("slot_redriven", slot, reason=why)])


def probe(slot: Slot) -> Change:
    """A slot dead-lettered for the service's failures whose probe is due: one run; a failure
    dead-letters it again (:func:`run_failed`)."""
    slot = _copy(slot)
    slot.phase = QUEUED
    return Change(slot, [event("dead_slot_probed", slot)])


def note_wait(slot: Slot, reason: str) -> Optional[Slot]:
    """The slot with ``reason`` noted (None: told already for this wait)."""
    if noted(slot, reason):
        return None
    slot = _copy(slot)
    note(slot, reason)
    return slot


def refused_for_room(slot: Slot) -> bool:
    """A slot waiting for a VM whose last RunMicrovm the account refused for room (402 or
    InsufficientCapacity): a run now would most likely be refused too."""
    return (slot.microvm_id is None and slot.phase == QUEUED
            and (slot.reason or "").split(":", 1)[0] in REFUSED_FOR_ROOM)


def member_of(vm_id: str, started: Optional[float], now: float) -> Slot:
    """A VM that left its slot (a client took it, a spec dropped the slot): counted, never touched."""
    return Slot(f"member-{vm_id}", MEMBER, phase=RUNNING, microvm_id=vm_id, vm_started_at=started, queued_at=now)


# ------------------------------------------------------------------------------ what a look shows


def retiring_seen(slot: Slot, retiring: Optional[Observed], now: float) -> Change:
    """The VM a slot is replacing: forgotten once it ended; a parked slot's one a client resumed
    (seen running ``PARK_GRACE_SECONDS`` after its successor was queued) becomes a member."""
    if retiring is not None and retiring.ended:
        slot = _copy(slot)
        told = event("vm_retired", slot, retired_id=slot.retiring_id)
        slot.retiring_id = slot.retiring_ends_at = slot.retiring_end_asked_at = None
        return Change(slot, [told])
    if (slot.role == WARM and retiring is not None and retiring.state in ("PENDING", "RUNNING")
            and now - (slot.queued_at or now) > PARK_GRACE_SECONDS):
        slot = _copy(slot)
        told = event("warm_slot_taken", slot, taken_id=retiring.microvm_id)
        slot.retiring_id = slot.retiring_ends_at = None
        return Change(slot, [told], members=[member_of(retiring.microvm_id, retiring.started_at, now)])
    return Change(slot)


def member_seen(slot: Slot, vm: Optional[Observed]) -> Change:
    """A member is forgotten once its VM ended (it ends by itself: it may serve a session)."""
    if vm is not None and vm.ended:
        return Change(None, [event("member_released", slot, state=vm.state)])
    return Change(slot)


def vm_ended(spec: FleetSpec, slot: Slot, vm: Observed, now: float) -> Change:
    """The slot's VM ended: at its lifetime or at our request, a new VM; before its time, a crash,
    and ``max_start_attempts`` crashes in a row dead-letter the slot (a crash at 601 s counts as
    much as one at 20 s; a VM that reaches its normal end clears the count)."""
    started = slot.vm_started_at if slot.vm_started_at is not None else vm.started_at
    life = slot.lifetime or spec.max_lifetime_seconds
    reason = (vm.reason or "").strip().lower()
    not_serving = slot.ending == "not_serving"  # ended by us because it never served: a crash
    if not not_serving and (started + life <= now + EXPIRY_MARGIN_SECONDS or slot.ending
                            or any(w in reason for w in REQUESTED_END_REASONS)):
        told = event("vm_expired" if not slot.ending else "vm_ended", slot, state=vm.state, end_reason=vm.reason)
        after = requeue(slot, "expired" if not slot.ending else slot.ending, now)
        after.crashes = 0
        return Change(after, [told])
    crashes = slot.crashes + 1
    told = event("vm_ended_unexpectedly", slot, state=vm.state, crashes=crashes,
                 end_reason=slot.reason if not_serving else vm.reason, lived=round(now - started, 3))
    if crashes < spec.max_start_attempts:
        after = requeue(slot, "replaced_after_early_end", now)
        after.crashes = crashes
        return Change(after, [told])
    after = requeue(slot, "crash_loop", now)
    after.crashes, after.phase, after.dead_kind = crashes, DEAD, DeadKind.CRASH
    after.reason = f"ended early {crashes} times in a row (last: {(slot.reason if not_serving else vm.reason) or vm.state})"
    letter = event("slot_dead_lettered", after, reason=after.reason, kind=DeadKind.CRASH, errors=crashes,
                   last_vm=slot.microvm_id)
    after.letter = dict(letter)  # written with the DEAD slot; sent after the write
    return Change(after, [told, letter])


def base_seen(spec: FleetSpec, slot: Slot, vm: Observed, now: float) -> Change:
    """A base slot's VM, live. Served (the server said its agent host is ready), RUNNING or
    suspended by its idle policy (a request wakes it) is the slot running; not served yet, the
    slot is SERVING and the server is asked (again, :func:`serve_due`). A parked VM handed to the
    slot and still SUSPENDED is resumed again after the park grace (a resume waits for the VM's
    ``/resume`` hook; a step may have died after the handover)."""
    slot = _copy(slot)
    slot.vm_started_at = vm.started_at
    idle_suspended = (vm.state in ("SUSPENDING", "SUSPENDED") and (bool(spec.idle_seconds) or slot.auto_resume)
                      and not slot.handover_from)
    if (vm.state == "RUNNING" or idle_suspended) and slot.ready_at is None and spec.serve:
        change = Change(slot)  # the server is asked about it (:func:`ask_about`)
        if slot.phase in (STARTING, QUEUED):
            slot.phase, slot.handover_from = SERVING, None
            change.events.append(event("vm_started", slot, claim_to_complete=since(slot.requested_at, now)))
        return change
    if (vm.state == "RUNNING" or idle_suspended) and slot.phase in (STARTING, SERVING, QUEUED):
        slot.phase, slot.handover_from = RUNNING, None
        return Change(slot, [event("vm_running", slot, claim_to_complete=since(slot.requested_at, now))])
    if vm.state == "SUSPENDED" and not idle_suspended:
        change = Change(slot, waits=[Wait(now + TRANSITION_POLL_SECONDS, Reason.TRANSITION)])
        if slot.parking_since is None or now - slot.parking_since > PARK_GRACE_SECONDS:
            change.intents.append(Intent(IntentKind.RESUME, slot.slot_id, vm.microvm_id, role=BASE))
        return change
    return Change(slot)


def warm_seen(spec: FleetSpec, slot: Slot, vm: Observed, now: float) -> Change:
    """A parked slot's VM, live: RUNNING is suspended (PARKING), SUSPENDED is PARKED; RUNNING again
    after our suspend was accepted (past the park grace) or after it was parked is a client's: the
    VM becomes a member and the slot is refilled. A suspend whose answer was lost is settled first
    by this read (:func:`settle_park_doubt`)."""
    slot = _copy(slot)
    slot.vm_started_at = vm.started_at
    events: list[dict[str, Any]] = []
    if slot.park_doubt_since is not None:
        settled = settle_park_doubt(slot, vm.state, now)
        slot, events = settled.slot or slot, settled.events
    since_parking = slot.parking_since
    awake = vm.state in ("PENDING", "RUNNING")
    if awake and slot.phase == PARKING and since_parking is not None and now - since_parking <= PARK_GRACE_SECONDS:
        return Change(slot, events)  # our suspend was accepted; the look has not caught up yet
    if awake and (slot.phase == PARKED or (slot.phase == PARKING and since_parking is not None)):
        events.append(event("warm_slot_taken", slot, taken_id=vm.microvm_id))
        return Change(requeue(slot, "taken_by_client", now), events,
                      members=[member_of(vm.microvm_id, vm.started_at, now)])
    if vm.state == "RUNNING" and slot.ready_at is None and slot.phase == STARTING and spec.serve:
        return Change(slot, events)  # warmed by the server (:func:`ask_about`) before it is parked
    if vm.state == "RUNNING":
        if slot.phase != PARKING:
            slot.phase, slot.parking_since = PARKING, None  # set when the service accepts it
        return Change(slot, events, [Intent(IntentKind.SUSPEND, slot.slot_id, vm.microvm_id)])
    if vm.state == "SUSPENDING":
        slot.phase = PARKING
    elif vm.state == "SUSPENDED" and slot.phase != PARKED:
        slot.phase = PARKED
        events.append(event("vm_parked", slot, claim_to_complete=since(slot.requested_at, now)))
    elif vm.state == "PENDING":
        return Change(slot, events, waits=[Wait(now + TRANSITION_POLL_SECONDS, Reason.TRANSITION)], pending=vm)
    return Change(slot, events)


# ------------------------------------------------------------------------------ a run


def run_lifetime(spec: FleetSpec, slot: Slot, intent: Intent) -> int:
    """The lifetime a run of the slot asks for: a slot's first VM (its id asked for again starts
    where it left off: ``first_generation``) gets the staggered one, every later VM the whole."""
    first = slot.generation == slot.first_generation and not intent.successor
    return first_lifetime(spec, slot.slot_id, slot.role) if first else spec.max_lifetime_seconds


def admit_run(spec: FleetSpec, slot: Slot, intent: Intent, now: float,
              request: Optional[Callable[[Slot], dict[str, Any]]] = None) -> Slot:
    """The ledger change written *before* RunMicrovm is called, so a step killed right after the
    call leaves a slot the next step finishes with the same client token and parameters.

    :param request: the RunMicrovm parameters of the slot's generation, from the slot as it is
        about to run (its role, its ``lifetime``): pinned for the generation, because a retry with
        the token must send the same parameters (else the service answers Conflict, and the VM
        the first call made belongs to nobody). The shell's per-role parameters
        (:mod:`..run_requests`); without it, only ``maximumDurationInSeconds``.
    """
    slot = _copy(slot)
    if intent.successor:
        slot.retiring_ends_at = slot.ends_at(spec.max_lifetime_seconds, now)
        slot.retiring_id, slot.microvm_id = slot.microvm_id, None
        slot.generation += 1
        slot.queued_at = now
        slot.request = None
        slot.in_doubt_since = None
        # The end asked of the VM it replaces (core.paid_successor's) is the retiring VM's, not
        # the new one's: not asked again before a list could show it (CONSISTENCY_SECONDS).
        slot.retiring_end_asked_at = slot.end_requested_at
        slot.ending = slot.end_requested_at = slot.room_asked_at = None
    if slot.request is None:
        slot.lifetime = run_lifetime(spec, slot, intent)
        slot.request = request(slot) if request else {"maximumDurationInSeconds": slot.lifetime}
    slot.lifetime = serving_life(slot.request, spec.max_lifetime_seconds)
    slot.auto_resume = bool((slot.request.get("idlePolicy") or {}).get("autoResumeEnabled"))
    slot.phase = STARTING
    slot.requested_at = now
    # What was told of this wait is forgotten, except that it passed the admission deadline: a run
    # refused again and again (30 minutes of InsufficientCapacity) told it on every attempt.
    slot.noted = "deadline" if noted(slot, "deadline") and not intent.successor else None
    slot.retry_at = None
    slot.parking_since = None  # of the previous VM: never of this one
    return slot


def serving_life(request: Mapping[str, Any], default: int) -> int:
    """How long a VM started with ``request`` serves: its ``maximumDurationInSeconds``, or the
    product's logical deadline when one comes first (the run hook payload's ``lifecycle.timeout_s``
    with ``on_timeout="kill"``: rayd ends the VM then, 60 s before the cap the product asks the
    service for)."""
    life = int(request.get("maximumDurationInSeconds") or default)
    payload = request.get("runHookPayload")
    try:
        lifecycle = json.loads(payload).get("lifecycle") if isinstance(payload, str) else None
    except ValueError:
        return life
    if isinstance(lifecycle, dict) and lifecycle.get("on_timeout") == "kill":
        timeout = lifecycle.get("timeout_s")
        if isinstance(timeout, (int, float)) and 0 < timeout < life:
            return int(timeout)
    return life


def run_requested(spec: FleetSpec, slot: Slot, intent: Intent, now: float) -> dict[str, Any]:
    """What a run admitted by :func:`admit_run` tells when it goes out."""
    return event("run_requested", slot, successor=intent.successor or None,
                 reason=intent.reason if intent.successor else None, retry=intent.retry or None,
                 image_version=spec.image_version, wait_time=since(slot.queued_at, now), lifetime=slot.lifetime)


def run_answered(slot: Slot, vm_id: str, started_at: Optional[float], state: str, reason: Optional[str] = None) -> Change:
    """The service answered the slot's token with a VM (or a Conflict naming the VM the token made,
    ``reason="token_already_used"``): the slot holds it (ownership comes from the token only)."""
    slot = _copy(slot)
    slot.microvm_id = vm_id
    if started_at is not None:
        slot.vm_started_at = started_at
    slot.in_doubt_since, slot.errors, slot.retry_at = None, 0, None
    return Change(slot, [event("run_accepted", slot, state=state, reason=reason)])


def token_collision(slot: Slot, vm_id: str, holder: str) -> Change:
    """A run's answer (or a Conflict) names a VM another slot of the ledger holds (a token sent
    before, for a VM the ledger already holds): never attached to a second slot (it may serve a
    client's session); the slot moves to a new generation, a new token."""
    told = event("token_collision", slot, taken_id=vm_id, holder=holder,
                 reason="the answer names a VM another slot holds: a new token")
    slot = _copy(slot)
    slot.generation += 1
    slot.request, slot.phase, slot.in_doubt_since = None, QUEUED, None
    return Change(slot, [told])


def run_failed(spec: FleetSpec, slot: Slot, intent: Intent, failure: Failure, now: float) -> Change:
    """A RunMicrovm that failed, by what its error proves (docs/reconciler.md "Ownership").

    * A throttle made no VM and is the rate's fault, not the slot's: back to the queue (in doubt:
      the same token later), no error counted.
    * A Conflict naming a VM: the token made it (the answer, late): see :func:`run_answered`.
    * The account's "no room" (402, InsufficientCapacity): no VM for this token (a doubt ends);
      the account's state, never a slot error.
    * A 5xx or no answer: the VM may exist: *in doubt* (counted live, the same token again).
    * A retry of a token in doubt refused before the service looks at the token (AccessDenied,
      Validation, NotFound, or a Conflict naming no VM: the parameters are pinned) proves nothing:
      still in doubt, never a new token while a VM of the old one may run.
    * Any other refusal (a first call): a slot error; a Conflict there is a token used before with
      other parameters: a new generation.

    Every counted error backs the slot off (2, 8, 32 s ...); ``max_start_attempts`` in a row
    dead-letter it, with its letter (sent once the DEAD slot is written); a dead slot of kind
    ``service`` is probed later (:func:`dead_probe_delay`).
    """
    code = failure.code
    retried = intent.retry or slot.in_doubt_since is not None
    slot = _copy(slot)
    events: list[dict[str, Any]] = []
    if code == THROTTLED:
        if retried:
            slot.in_doubt_since = slot.in_doubt_since or now
        else:
            slot.phase = QUEUED
        return Change(slot)
    ambiguous = (code not in REQUEST_FAILURES and code not in REFUSED_FOR_ROOM and code != CONFLICT
                 and (failure.status >= 500 or failure.status == 0))
    request_error = code in REQUEST_FAILURES or code == CONFLICT or (
        400 <= failure.status < 500 and code not in SHARED_BACKOFFS)
    kind = DeadKind.REQUEST if request_error else DeadKind.SERVICE
    counted = code not in REFUSED_FOR_ROOM
    slot.errors += 1 if counted else 0
    slot.reason = f"{code}: {failure.message}"[:500]
    if code in REFUSED_FOR_ROOM:
        if retried:
            events.append(event("run_doubt_resolved", slot, reason=f"no_vm:{code}"))
        slot.in_doubt_since = None
        slot.phase = QUEUED
    elif ambiguous or retried:
        slot.in_doubt_since = slot.in_doubt_since or now
    else:
        slot.phase = QUEUED
        if code == CONFLICT:
            slot.generation += 1  # a first call's token used before with other parameters: a new token
            slot.request = None
    if counted and slot.errors >= spec.max_start_attempts:
        slot.phase, slot.dead_kind = DEAD, kind
        probes_failed = slot.errors - spec.max_start_attempts
        slot.retry_at = now + dead_probe_delay(probes_failed) if kind == DeadKind.SERVICE else None
        letter = event("slot_dead_lettered", slot, reason=slot.reason, kind=kind, errors=slot.errors,
                       in_doubt=slot.in_doubt_since is not None or None, probe=probes_failed or None)
        events.append(letter)
        if not probes_failed:
            # One message a dead-lettering: a failed probe says so in the timeline only.
            slot.letter = dict(letter)
    elif counted:
        slot.retry_at = now + retry_delay(slot.errors)
    return Change(slot, events)


def retry_delay(errors: int) -> float:
    """Backoff of a slot after ``errors`` failed RunMicrovm calls in a row."""
    return min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 4.0 ** max(0, errors - 1))


def dead_probe_delay(probes_failed: int) -> float:
    """When a slot dead-lettered for the service's failures is tried again: 60 s after it was
    dead-lettered, then twice as long after each failed probe, at most DEAD_PROBE_SECONDS."""
    return min(DEAD_PROBE_SECONDS, DEAD_PROBE_FIRST_SECONDS * 2.0 ** max(0, min(probes_failed, 16)))


# ------------------------------------------------------------------------------ serving


def serve_due(spec: FleetSpec, slot: Slot, now: float) -> Optional[str]:
    """Whether the server should be asked about the slot's VM now: ``ask`` (never asked, its last
    failure written down, or no answer ``SERVE_RETRY_SECONDS`` after the ask), ``wait`` (an ask
    may still be answered), ``give_up`` (``max_start_attempts`` asks without the VM serving: it is
    ended and replaced, counted as a crash)."""
    if slot.ready_at is not None or slot.microvm_id is None:
        return None
    if slot.serve_asked_at is not None and now - slot.serve_asked_at < SERVE_RETRY_SECONDS:
        return "wait"
    if slot.serve_asks >= spec.max_start_attempts:
        return "give_up"
    return "ask"


def ask_about(spec: FleetSpec, slot: Slot, now: float) -> Change:
    """What a served fleet's slot holding a VM that does not serve yet asks of the server (its VM
    in any state but ended: the server waits for it to be ready), per :func:`serve_due`: an ask, a
    wake for the answer, or, every ask spent, the VM's end."""
    slot = _copy(slot)
    change = Change(slot)
    due = serve_due(spec, slot, now)
    if due == "ask":
        change.intents.append(Intent(IntentKind.SERVE, slot.slot_id, slot.microvm_id, role=slot.role))
    elif due == "wait":
        expected = (slot.serve_asked_at or now) + SERVE_EXPECTED_SECONDS
        change.waits.append(Wait(expected if expected > now else now + SERVE_POLL_SECONDS, answer_reason(slot)))
    elif due == "give_up" and not slot.ending:
        slot.ending = "not_serving"
        change.events.append(event("vm_not_serving", slot, asks=slot.serve_asks, failures=slot.serve_failures,
                                   reason=slot.reason))
        change.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.microvm_id, reason="not_serving"))
    return change


def answer_reason(slot: Slot) -> Reason:
    """Why a step wakes for the server's answer about ``slot``'s VM: a parked slot's VM, to park it
    (worth overtime: it runs unparked until then); a base slot's, to count it (not worth overtime:
    the VM serves whether the ledger says so yet or not)."""
    return Reason.SERVE if slot.role == WARM else Reason.SERVED


def serve_asked(slot: Slot, now: float) -> Slot:
    """Written (fenced) before the server is asked: the ask's number goes with it, so its answer
    is known for this ask and no later one."""
    slot = _copy(slot)
    slot.serve_asked_at, slot.serve_asks = now, slot.serve_asks + 1
    return slot


def serve_ask_failed(slot: Slot, now: float) -> Slot:
    """The ask could not be handed to the server (an Invoke refused or lost): asked again after
    ``SERVE_POLL_SECONDS``, not counted."""
    slot = _copy(slot)
    slot.serve_asks = max(0, slot.serve_asks - 1)
    slot.serve_asked_at = now - SERVE_RETRY_SECONDS + SERVE_POLL_SECONDS
    return slot


def ready_seen(slot: Slot, fact: Ready, now: float) -> Change:
    """The server's answer about the slot's VM, once the shared clock reached it. Ready: the VM
    serves (base) or is warmed (parked), RUNNING then; the base slot counts it from now. Failed
    (for the slot's last ask): written down, and the next plan asks again (or gives up)."""
    if fact.at > now or slot.microvm_id != fact.microvm_id or fact.role != ("warm" if slot.role == WARM else "member"):
        return Change(slot)
    if fact.ready:
        if slot.ready_at is not None:
            return Change(slot)
        slot = _copy(slot)
        slot.ready_at, slot.serve_asked_at = fact.at, None
        name = "vm_serving" if slot.role == BASE else "vm_warmed"
        return Change(slot, [event(name, slot, after=since(slot.requested_at, fact.at), asks=slot.serve_asks)])
    if fact.attempt != slot.serve_asks or slot.serve_asked_at is None:
        return Change(slot)  # an earlier ask's failure, already counted
    slot = _copy(slot)
    slot.serve_failures += 1
    slot.serve_asked_at = None
    slot.reason = f"not_serving: {fact.reason or 'unknown'}"[:500]
    return Change(slot, [event("serve_failed", slot, attempt=fact.attempt, reason=fact.reason)])


# ------------------------------------------------------------------------------ parking, handover, ends


def park_sent(slot: Slot, at: float) -> Slot:
    """Written (fenced) *before* a SuspendMicrovm goes out: a tick that dies (or loses its lease)
    after sending it leaves the doubt to the next one, which must not send it again on a session a
    client may have resumed since; a tick that lost its lease suspends nothing."""
    slot = _copy(slot)
    slot.park_doubt_since = at
    return slot


def park_answered(slot: Slot, accepted_at: Optional[float]) -> Slot:
    """The service answered our suspend (or resume): no doubt; accepted, the park grace (or the
    resume's) runs from ``accepted_at``."""
    slot = _copy(slot)
    slot.park_doubt_since = None
    if accepted_at is not None:
        slot.parking_since = accepted_at
    return slot


def settle_park_doubt(slot: Slot, state: str, read_at: float) -> Change:
    """What a read of the VM (its ``state``, read no later than ``read_at``) says of a suspend whose
    answer was lost (``park_doubt_since``: when it was sent). SUSPENDING or SUSPENDED: it landed.
    RUNNING (or PENDING) less than ``SUSPEND_THEN_RESUME_SECONDS`` after it was sent: it did not (no
    client could have resumed it yet), and may be sent again. RUNNING later: unknowable (a client
    may hold the session now): counted as accepted and never sent again. A read that lags only
    makes ``read_at`` later than the state it shows: the safe side."""
    sent = slot.park_doubt_since
    if sent is None:
        return Change(slot)
    slot = _copy(slot)
    slot.park_doubt_since = None
    if state in ("PENDING", "RUNNING") and read_at - sent < SUSPEND_THEN_RESUME_SECONDS:
        outcome = "not_landed"
        slot.parking_since = None
    else:
        outcome = "landed" if state in ("SUSPENDING", "SUSPENDED") else "unknown"
        slot.parking_since = sent
    return Change(slot, [event("park_doubt_settled", slot, outcome=outcome, state=state,
                               read_after=round(read_at - sent, 3))])


def end_requested(slot: Slot, reason: Optional[str]) -> Slot:
    """Written (fenced) before a TerminateMicrovm of the slot's VM: its end is ours, not a crash."""
    slot = _copy(slot)
    slot.ending = reason
    return slot


def retiring_end_requested(slot: Slot, at: float) -> Slot:
    """The VM the slot is replacing was asked to end (past its deadline: :func:`.phases.end_past_deadline`)."""
    slot = _copy(slot)
    slot.retiring_end_asked_at = at
    return slot


def end_accepted(slot: Slot, at: float) -> Slot:
    slot = _copy(slot)
    slot.end_requested_at = at
    return slot


def handover(base: Slot, donor: Slot, now: float) -> tuple[Slot, Slot]:
    """A base slot takes a warm slot's VM (written before any call): the only way a VM changes
    slots, always between two slots of this ledger, explicitly. A SUSPENDED VM is then resumed
    (ResumeMicrovm); one still PENDING, RUNNING or parking needs no call (a base slot resumes a VM
    it holds once it shows SUSPENDED: :func:`base_seen`)."""
    base, donor = _copy(base), _copy(donor)
    if base.microvm_id:
        base.retiring_id = base.microvm_id
        base.retiring_ends_at = base.ends_at(28_800, now)
    base.microvm_id = donor.microvm_id
    base.generation += 1
    base.request, base.in_doubt_since, base.errors = None, None, 0
    base.vm_started_at, base.lifetime = donor.vm_started_at, donor.lifetime
    base.phase, base.requested_at, base.handover_from, base.parking_since = STARTING, now, donor.slot_id, None
    base.park_doubt_since = None
    _forget_serving(base)  # warmed as a parked slot, it is served as a base one
    base.auto_resume = donor.auto_resume
    return base, requeue(donor, "handed_to_" + base.slot_id, now)


def handed_over(base: Slot, donor: Slot) -> dict[str, Any]:
    return event("vm_handed_over", base, donor=donor.slot_id, reason="no headroom for a successor")


def parked_donor(slot: Slot) -> bool:
    """A parked slot whose VM a base slot may take (it serves nobody and is ours)."""
    return (slot.role == WARM and slot.phase == PARKED and slot.microvm_id is not None and not slot.draining
            and not slot.ending)


def young_donor(slot: Slot) -> bool:
    """A parked slot's own VM not parked yet (PENDING, RUNNING, or its suspend on the way): a base
    slot the account refused room may take it too, with no call at all."""
    return (slot.role == WARM and slot.phase in (STARTING, PARKING) and slot.microvm_id is not None
            and not slot.draining and not slot.ending and slot.retiring_id is None)
