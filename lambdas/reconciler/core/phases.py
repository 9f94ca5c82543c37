"""The plan: the ledger reconciled with what the service shows, as named phases over one draft.

``plan()`` runs, in order: :func:`settle_slots` (each slot against its VM), :func:`track`
(foreign VMs), :func:`shape` (the slot set the spec asks for), :func:`count_live` (what counts
toward ``max_vms``), :func:`trim_parked` (parked VMs above ``max_vms`` or ``warm_vms``),
:func:`schedule_runs` (slots without a VM, successors, rollouts) and :func:`allocate_room` (base
slots first: headroom, handovers, successors that wait for an end). Each phase reads and adds to a
:class:`Draft`; the transitions of single slots are :mod:`.transitions`.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional

from .lifetimes import EXPIRY_WAKE_SECONDS, SUCCESSOR_START_SECONDS, look_in_time
from .model import (
    BASE,
    DEAD,
    LIVE,
    MEMBER,
    PARKED,
    RUNNING,
    STARTING,
    WARM,
    FleetSpec,
    Intent,
    IntentKind,
    Observed,
    Plan,
    Ready,
    Reason,
    Slot,
    Wait,
    ended,
    event,
    note,
    noted,
    own_vm_ids,
)
from .observe import foreign_vms, track_strays
from .shape import desired_slot_ids, retiring_end, slot_order, successor_lead
from .transitions import (
    CONSISTENCY_SECONDS,
    PARK_GRACE_SECONDS,
    Change,
    ask_about,
    base_seen,
    member_of,
    member_seen,
    probe,
    ready_seen,
    redrive,
    refused_for_room,
    retiring_seen,
    vm_ended,
    warm_seen,
    young_donor,
)

#: How soon a step looks again at a parked slot's PENDING VM (measured PENDING: p50 1.85 s, p95
#: 2.13 s; reads lag 0.5 s).
PENDING_POLL_SECONDS = 2.6
#: A base successor without headroom takes a parked VM this long before the old VM's end.
HANDOVER_LEAD_SECONDS = 120.0
#: A VM still listed after its expected end (a list that lags, a clock a little off) is looked at
#: again this long after, not at once.
LATE_END_POLL_SECONDS = 0.5
#: How long the account's refusal of a run for room (402, InsufficientCapacity) keeps base slots
#: first (their runs before any parked slot's, parked VMs handed to them). The shared backoff after
#: a 402 is 60 s, one schedule period: a refusal remembered that long was forgotten by the next
#: tick, whose freed room went to a parked slot (base VMs 58-74 s below min_vms).
ROOM_REFUSED_SECONDS = 600.0


@dataclass
class Draft:
    """What a plan builds, phase by phase."""

    spec: FleetSpec
    now: float
    slots: dict[str, Slot]
    seen: dict[str, Observed]
    events: list[dict[str, Any]] = field(default_factory=list)
    intents: list[Intent] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    pending: list[Observed] = field(default_factory=list)  # parked slots' VMs still PENDING
    strays: dict[str, dict[str, Any]] = field(default_factory=dict)
    foreign: dict[str, Observed] = field(default_factory=dict)
    live: int = 0  # VMs that count toward max_vms
    in_doubt: int = 0  # slots whose run may have made a VM nobody has the ID of
    others_live: int = 0  # VMs of the image that are not our slots' (they free room when they end)
    parked: list[Slot] = field(default_factory=list)  # SUSPENDED parked slots, to be ended first
    runs: list[Intent] = field(default_factory=list)
    successors: list[Intent] = field(default_factory=list)
    retiring_waits: list[float] = field(default_factory=list)  # due successors held by their own retiring VM
    handovers: list[Intent] = field(default_factory=list)
    facts: Mapping[str, Ready] = field(default_factory=dict)  # the server's answers, by VM

    def apply(self, change: Change) -> None:
        """One transition's result into the draft."""
        if change.slot is not None:
            self.slots[change.slot.slot_id] = change.slot
        self.events += change.events
        self.intents += change.intents
        self.waits += change.waits
        for member in change.members:
            self.slots[member.slot_id] = member
        if change.pending is not None:
            self.pending.append(change.pending)

    def wake(self, at: float, reason: Reason = Reason.REPLACE) -> None:
        self.waits.append(Wait(at, reason))

    def life(self, slot: Slot) -> float:
        """When the slot's current VM ends by itself."""
        return slot.ends_at(self.spec.max_lifetime_seconds, self.now)


def plan(spec: FleetSpec, ledger: Mapping[str, Slot], observed: Iterable[Observed], now: float, *,
         others: Iterable[str] = (), strays: Optional[Mapping[str, Mapping[str, Any]]] = None,
         redrive: bool = False, retired: Optional[Mapping[str, int]] = None, no_room: bool = False,
         facts: Optional[Mapping[str, Ready]] = None) -> Plan:
    """Reconcile the ledger with what the service shows; return the new ledger and the intents.

    :param observed: ListMicrovms items of the image, and GetMicrovm answers for VMs of ours the
        list missed (``state=GONE`` when the VM provably no longer exists).
    :param others: VM IDs the ledgers of other fleets sharing the image hold.
    :param strays: what the ledger remembers of foreign VMs (``first_seen``, ``suspended_since``).
    :param redrive: the spec changed since the last step: dead-lettered slots are tried again.
    :param retired: the next generation of each slot id an earlier spec dropped: a slot asked for
        again starts there, never at 0, so its client tokens are not those of its earlier VMs.
    :param no_room: the account refuses new VMs for room now (a shared backoff for the memory
        quota or capacity, whichever fleet met it): base slots take parked VMs, parked slots wait.
    :param facts: what the fleet's server answered about VMs it was asked to serve or warm.
    """
    draft = Draft(spec, now, {k: copy.copy(v) for k, v in ledger.items()}, {o.microvm_id: o for o in observed},
                  facts=facts or {})
    settle_slots(draft, redrive)
    ask_server(draft)
    track(draft, strays or {}, set(others))
    shape(draft, retired or {})
    count_live(draft)
    trim_parked(draft)
    schedule_runs(draft)
    allocate_room(draft, no_room)
    return finish(draft)


# ------------------------------------------------------------------------------ 1. settle slots


def settle_slots(d: Draft, redriven: bool) -> None:
    """Each slot against what the service shows of its VMs (in slot id order)."""
    for slot_id in sorted(d.slots):
        slot = d.slots[slot_id]
        if slot.retiring_id:
            d.apply(retiring_seen(slot, d.seen.get(slot.retiring_id), d.now))
            slot = d.slots[slot_id]
        change = settle(d, slot, redriven)
        if change.slot is None:
            del d.slots[slot_id]
        d.apply(change)


def settle(d: Draft, slot: Slot, redriven: bool) -> Change:
    """The one transition a slot's own VM (or its dead letter) calls for."""
    if slot.role == MEMBER:
        return member_seen(slot, d.seen.get(slot.microvm_id or ""))
    if slot.phase == DEAD:
        if redriven:
            return redrive(slot, d.now, "spec_changed")
        if slot.dead_kind == "service" and (slot.retry_at or 0) <= d.now:
            return probe(slot)
        return Change(slot)
    vm = d.seen.get(slot.microvm_id or "") if slot.microvm_id else None
    if vm is None:
        return Change(slot)  # no VM, or not shown and not provably gone: live, state unknown
    if vm.ended:
        return vm_ended(d.spec, slot, vm, d.now)
    fact = d.facts.get(slot.microvm_id or "")
    told: list[dict[str, Any]] = []
    if fact is not None:
        answered = ready_seen(slot, fact, d.now)
        slot, told = answered.slot or slot, answered.events
    change = base_seen(d.spec, slot, vm, d.now) if slot.role == BASE else warm_seen(d.spec, slot, vm, d.now)
    change.events[:0] = told
    return change


def ask_server(d: Draft) -> None:
    """A served fleet's slots whose VM does not serve (base) or is not warmed (parked) yet: the
    server is asked about it (in any state the VM has but ended: it waits for the VM itself), and
    the step wakes for its answer."""
    if not d.spec.serve:
        return
    for slot_id in sorted(d.slots):
        slot = d.slots[slot_id]
        if (slot.role not in (BASE, WARM) or slot.microvm_id is None or slot.ready_at is not None
                or slot.phase == DEAD or slot.draining or ended(d.seen.get(slot.microvm_id))):
            continue
        if slot.ending and slot.ending != "not_serving":
            continue
        if slot.role == WARM and slot.phase != STARTING:
            continue  # parked (or parking) already: a client's take serves it
        d.apply(ask_about(d.spec, slot, d.now))


# ------------------------------------------------------------------------------ 2. strays


def track(d: Draft, known: Mapping[str, Mapping[str, Any]], others: set[str]) -> None:
    """VMs of the image no slot of ours holds: foreign. Never touched, never put in a slot."""
    d.foreign = foreign_vms(d.seen, own_vm_ids(d.slots), others)
    d.strays, events, intents = track_strays(d.spec, d.foreign, known, d.now)
    d.events += events
    d.intents += intents


# ------------------------------------------------------------------------------ 3. shape


def shape(d: Draft, retired: Mapping[str, int]) -> None:
    """The slot set the spec asks for: missing slots queued (from their next generation), slots
    the spec dropped drained (a parked one: parked first, then ended) or let go (a VM that may
    serve a session becomes a member and ends by itself; never terminated here)."""
    wanted = dict(desired_slot_ids(d.spec))
    for slot_id, role in wanted.items():
        if slot_id not in d.slots:
            generation = int(retired.get(slot_id, 0))
            d.slots[slot_id] = Slot(slot_id, role, generation=generation, first_generation=generation, queued_at=d.now)
            d.events.append(event("slot_queued", d.slots[slot_id]))
        elif d.slots[slot_id].draining:
            d.slots[slot_id].draining = False
    for slot in list(d.slots.values()):
        if slot.role == MEMBER or slot.slot_id in wanted:
            continue
        if slot.role == WARM and slot.microvm_id and not ended(d.seen.get(slot.microvm_id)) and slot.phase != DEAD:
            if not slot.draining:
                slot.draining = True
                d.events.append(event("slot_draining", slot, reason="spec_shrank"))
            continue
        if slot.microvm_id is None and slot.in_doubt:
            continue  # a VM may exist for it: the same token must still be asked before forgetting it
        del d.slots[slot.slot_id]
        for vm_id in (slot.microvm_id, slot.retiring_id):
            if vm_id and not ended(d.seen.get(vm_id)):
                vm = d.seen.get(vm_id)
                d.slots[f"member-{vm_id}"] = member_of(vm_id, vm.started_at if vm else None, d.now)
                d.events.append(event("slot_released_to_member", slot, taken_id=vm_id))


# ------------------------------------------------------------------------------ 4. count live


def count_live(d: Draft) -> None:
    """How many VMs count toward max_vms: ours that are not provably ended (in-doubt runs
    included), and foreign ones (a client's VM of the fleet's image is part of the fleet)."""
    live_ids = {i for i in own_vm_ids(d.slots) if not ended(d.seen.get(i))} | set(d.foreign)
    d.in_doubt = sum(1 for s in d.slots.values() if s.microvm_id is None and s.in_doubt)
    d.live = len(live_ids) + d.in_doubt
    d.others_live = len(d.foreign) + sum(1 for s in d.slots.values() if s.role == MEMBER and s.microvm_id
                                         and not ended(d.seen.get(s.microvm_id)))


# ------------------------------------------------------------------------------ 5. trim parked


def trim_parked(d: Draft) -> None:
    """Parked VMs are ended first when there are more VMs than max_vms (youngest first) or more
    parked slots than warm_vms (draining ones); never a VM that may serve."""
    excess = d.live - d.spec.max_vms
    d.parked = sorted((s for s in d.slots.values() if s.role == WARM and s.phase == PARKED and s.microvm_id
                       and (d.seen.get(s.microvm_id) or Observed("", "", 0)).state == "SUSPENDED"),
                      key=lambda s: (not s.draining, -(s.vm_started_at or 0)))
    for slot in d.parked:
        if slot.ending and slot.end_requested_at is not None and d.now - slot.end_requested_at < CONSISTENCY_SECONDS:
            excess -= 0 if slot.draining else 1  # asked already; the list has not caught up
            continue
        if slot.draining or excess > 0:
            reason = "surplus_parked_slot" if slot.draining else "above_max_vms"
            slot.ending = reason
            d.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.microvm_id, reason=reason))
            if not slot.draining:
                excess -= 1


# ------------------------------------------------------------------------------ 6. schedule runs


def schedule_runs(d: Draft) -> None:
    """Runs for slots without a VM (after their backoff), successors before expiry (expiring base
    VMs first: they keep min_vms live) and for a new image version (parked slots first)."""
    lead = successor_lead(d.spec)
    for slot in sorted(d.slots.values(), key=lambda s: slot_order(s.slot_id, s.role, d.spec)):
        if slot.role == MEMBER or slot.phase == DEAD or slot.draining:
            continue
        if slot.microvm_id is None:
            queue_run(d, slot)
            continue
        current = d.seen.get(slot.microvm_id)
        expires = d.life(slot)
        ready = slot.phase in (RUNNING, PARKED)
        if d.spec.rayd_deadline and slot.role == BASE and d.live >= d.spec.max_vms:
            end_past_deadline(d, slot, current, expires)
        if ready and slot.retiring_id is not None and slot.role == BASE and expires - d.now <= lead:
            # A VM so short-lived that its successor is due while the VM it replaced still runs
            # (two VMs a slot at most): the successor runs when that one ends, woken for it.
            end = retiring_end(slot, d.seen, d.spec)
            if end is not None and not look_in_time(d.spec.look_period_seconds, end, expires):
                d.retiring_waits.append(end)
        if ready and slot.retiring_id is None:
            successor(d, slot, current, expires, lead)
        if slot.role == WARM and slot.retiring_id and slot.phase == PARKED:
            retiring = d.seen.get(slot.retiring_id)
            if retiring is not None and retiring.state in ("SUSPENDING", "SUSPENDED"):  # uncovered: its replaced VM missing from the look, or not suspended
                d.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.retiring_id,
                                        reason="replaced_parked_slot"))
    # The VM closest to its end first: room under max_vms freed by one end goes to the next.
    d.successors.sort(key=lambda i: (i.priority, i.expires))


def end_past_deadline(d: Draft, slot: Slot, current: Optional[Observed], expires: float) -> None:
    """A base VM at its end when ``rayd`` ends it (the run payload's lifecycle) and the fleet has
    no room left under ``max_vms``: rayd stops its agents there, yet the service lists the VM
    RUNNING ~15 s more while its app exits, holding the room a successor waits for. It is ended
    then (``past_deadline``), the slot's VM or the one it is replacing, and the step wakes for
    that end. The end is reckoned from the VM's start, rayd's from ``/run``: a launch (about 2 s)
    earlier, a cut accepted only when the room is needed (with room, rayd ends it)."""
    if current is not None and not current.ended and slot.phase == RUNNING and not slot.ending:
        if expires <= d.now:
            d.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.microvm_id, reason="past_deadline"))
        else:
            d.wake(expires, Reason.REPLACE)
    retiring = d.seen.get(slot.retiring_id or "")
    end = slot.retiring_ends_at
    if retiring is None or retiring.ended or end is None:
        return
    if end > d.now:
        d.wake(end, Reason.REPLACE)
    elif slot.retiring_end_asked_at is None or d.now - slot.retiring_end_asked_at >= CONSISTENCY_SECONDS:
        d.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.retiring_id, reason="past_deadline"))


def queue_run(d: Draft, slot: Slot) -> None:
    """A slot without a VM runs one once its backoff ends; a wait past the admission deadline is
    told once."""
    if slot.retry_at is not None and slot.retry_at > d.now:
        d.wake(slot.retry_at, Reason.BACKOFF)
        return
    d.runs.append(Intent(IntentKind.RUN, slot.slot_id, role=slot.role, retry=slot.in_doubt))
    waited = d.now - slot.queued_at if slot.queued_at is not None else 0.0
    if waited > d.spec.admission_deadline_seconds and not noted(slot, "deadline"):
        d.events.append(event("admission_deadline_exceeded", slot, waited=round(waited, 3)))
        note(slot, "deadline")


def successor(d: Draft, slot: Slot, current: Optional[Observed], expires: float, lead: float) -> None:
    """A successor for a ready slot whose VM is within the lead of its end, or on an old image
    version (parked slots always, base slots with ``base_rollout="rolling"``)."""
    if expires - d.now <= lead:
        d.successors.append(Intent(IntentKind.RUN, slot.slot_id, slot.microvm_id, role=slot.role, successor=True,
                                   reason="expiring", priority=0 if slot.role == BASE else 1, expires=expires))
        return
    wanted = d.spec.image_version
    if not (wanted and current and current.image_version and current.image_version != wanted):
        return
    if slot.role == WARM or d.spec.base_rollout == "rolling":
        d.successors.append(Intent(IntentKind.RUN, slot.slot_id, slot.microvm_id, role=slot.role, successor=True,
                                   reason="image_version", priority=2 if slot.role == WARM else 3))
        if not noted(slot, "outdated"):
            d.events.append(event("vm_outdated", slot, version=current.image_version, wanted=wanted))
            note(slot, "outdated")


# ------------------------------------------------------------------------------ 7. allocate room


@dataclass
class Room:
    """What the allocation of room under ``max_vms`` (and the account's) works with."""

    headroom: int
    donors: list[Slot]  # parked VMs (SUSPENDED) a base slot may take
    young: list[Slot]  # parked slots' VMs not parked yet, for a base slot the account refused room
    frees: list[float]  # when room comes back: ends of VMs of ours being replaced, parked VMs ended for room
    urgent: list[Intent]  # base successors within the handover lead of their VM's end


def allocate_room(d: Draft, no_room: bool) -> None:
    """Base slots before parked ones when there is not room for every run; a base slot with no
    room at all takes a parked VM (its own VM ended, or shortly before its VM ends): the parked
    pool dips for a moment instead of min_vms. Then each successor gets headroom, an end of ours
    to run at, a parked VM, or a wake for its VM's end."""
    room = Room(d.spec.max_vms - d.live, [s for s in d.parked if not s.ending and not s.draining and s.retiring_id is None],
                [s for s in d.slots.values() if young_donor(s)], ends_of_ours(d), [])
    room.urgent = [i for i in d.successors if i.role == BASE and i.reason == "expiring"
                   and i.expires - d.now <= HANDOVER_LEAD_SECONDS]
    for end in d.retiring_waits:
        d.wake(max(end + EXPIRY_WAKE_SECONDS, d.now + LATE_END_POLL_SECONDS))
    base_first(d, room, no_room)
    headroom_for_runs(d, room)
    room.headroom -= sum(1 for r in d.runs if not r.retry)
    for intent in list(d.successors):
        place_successor(d, room, intent)


def ends_of_ours(d: Draft) -> list[float]:
    """When room under max_vms comes back by itself: each VM of ours being replaced ends (one
    successor waiting for room each, the soonest-ending VM's first), and a parked VM we end for room
    shows gone. Accepted, that end is not asked again before a list could show it; refused (a 409
    may be a client's resume) or never sent, it is asked again once a list ``PARK_GRACE_SECONDS``
    after the ask still shows the VM SUSPENDED (a resumed VM shows RUNNING 1.2 s after, a member
    from then on)."""
    frees = [t for t in (retiring_end(s, d.seen, d.spec) for s in d.slots.values()) if t is not None]
    for slot in d.parked:
        if slot.ending == "room_for_successor":
            frees.append(d.now)
            if ((slot.end_requested_at is None or d.now - slot.end_requested_at >= CONSISTENCY_SECONDS)
                    and (slot.room_asked_at is None or d.now - slot.room_asked_at >= PARK_GRACE_SECONDS)):
                slot.room_asked_at = d.now
                d.intents.append(Intent(IntentKind.TERMINATE, slot.slot_id, slot.microvm_id, reason="room_for_successor"))
    return sorted(frees)


def room_refused(d: Draft, no_room: bool) -> bool:
    """Whether the account refuses new VMs for room: the shared backoff says so (another fleet met
    it), a base slot's last run was refused, or a parked slot's within ``ROOM_REFUSED_SECONDS``
    (it may come first in the start order and take every refusal)."""
    return no_room or any(
        refused_for_room(s) and (s.role == BASE or d.now - (s.requested_at or d.now) < ROOM_REFUSED_SECONDS)
        for s in d.slots.values() if s.role in (BASE, WARM) and not s.draining)


def base_first(d: Draft, room: Room, no_room: bool) -> None:
    """While the account refuses room, base slots' new runs take parked VMs (SUSPENDED ones, then
    parked slots' own VMs not parked yet) and no parked slot runs: a new parked VM would take the
    room a base slot needs."""
    refused = room_refused(d, no_room)
    full = [r for r in d.runs if not r.retry and r.role == BASE and (refused or refused_for_room(d.slots[r.slot_id]))]
    if not full:
        return
    d.runs = [r for r in d.runs if r.retry or r.role == BASE]
    for intent in full:
        if room.donors:
            take_parked(d, room, intent)
        elif room.young:
            take_young(d, room, intent)


def headroom_for_runs(d: Draft, room: Room) -> None:
    """Parked slots to refill wait while a base VM near its end has no room for its successor;
    with more new runs than headroom, base slots come first and those beyond it take parked VMs."""
    new_runs = [r for r in d.runs if not r.retry]
    base_runs = [r for r in new_runs if r.role == BASE]
    if room.urgent:
        late = {id(r) for r in [r for r in new_runs if r.role != BASE][max(0, room.headroom - len(base_runs) - len(room.urgent)):]}
        d.runs = [r for r in d.runs if id(r) not in late]
    if sum(1 for r in d.runs if not r.retry) <= room.headroom:
        return
    d.runs.sort(key=lambda r: (r.retry is False, r.role != BASE))
    for intent in [r for r in d.runs if not r.retry and r.role == BASE][max(0, room.headroom):]:
        if not room.donors or d.slots[intent.slot_id].phase == STARTING:
            break
        take_parked(d, room, intent)


def lasts(d: Draft, slot: Slot) -> float:
    """When a parked slot's VM ends (a donor that lasts longest is taken first)."""
    return (slot.vm_started_at or 0) + (slot.lifetime or d.spec.max_lifetime_seconds)


def take_parked(d: Draft, room: Room, intent: Intent) -> None:
    """The base slot of a run takes the parked VM that lasts longest (ResumeMicrovm), instead of
    the run."""
    donor = max(room.donors, key=lambda s: lasts(d, s))
    room.donors.remove(donor)
    d.runs.remove(intent)
    d.handovers.append(Intent(IntentKind.RESUME, intent.slot_id, donor.microvm_id, role=BASE, reason="handover",
                              donor=donor.slot_id))


def take_young(d: Draft, room: Room, intent: Intent) -> None:
    """The base slot of a run the account has no room for takes a parked slot's VM that is not
    parked yet (PENDING, RUNNING, parking): no call; its suspend, if planned, is not sent."""
    donor = max(room.young, key=lambda s: lasts(d, s))
    room.young.remove(donor)
    d.runs.remove(intent)
    d.intents = [i for i in d.intents if i.microvm_id != donor.microvm_id]
    d.handovers.append(Intent(IntentKind.HANDOVER, intent.slot_id, donor.microvm_id, role=BASE, reason="handover",
                              donor=donor.slot_id))


def place_successor(d: Draft, room: Room, intent: Intent) -> None:
    """A successor runs in the headroom left (its VM's end then frees room for a later one); a
    base one without headroom runs at an end of ours that comes in time, takes a parked VM within
    the handover lead of its VM's end, or is woken for that end."""
    if room.headroom > 0:
        room.headroom -= 1
        if intent.expires:
            bisect.insort(room.frees, intent.expires)
        return
    if intent.role != BASE or intent.reason != "expiring":
        return
    slot = d.slots[intent.slot_id]
    expires = d.life(slot)
    free = next((t for t in room.frees if t + EXPIRY_WAKE_SECONDS + SUCCESSOR_START_SECONDS <= expires), None)
    if free is not None:
        # A VM of ours ends in time for this successor to be RUNNING before its VM ends: woken for
        # that end when the next scheduled look after it could be too late.
        room.frees.remove(free)
        if not look_in_time(d.spec.look_period_seconds, free, expires):
            d.wake(max(free + EXPIRY_WAKE_SECONDS, d.now + LATE_END_POLL_SECONDS))
        return
    if expires - d.now > HANDOVER_LEAD_SECONDS:
        d.wake(expires - HANDOVER_LEAD_SECONDS, Reason.HANDOVER)
        return
    lead = successor_lead(d.spec)
    usable = [s for s in room.donors if (s.vm_started_at or d.now) + (s.lifetime or d.spec.max_lifetime_seconds) - d.now > lead]
    if usable:
        donor = max(usable, key=lambda s: lasts(d, s))
        room.donors.remove(donor)
        d.successors.remove(intent)
        d.handovers.append(Intent(IntentKind.RESUME, slot.slot_id, donor.microvm_id, role=BASE, successor=True,
                                  reason="handover", donor=donor.slot_id))
    elif room.donors:
        room_for_successor(d, room)
    elif any(i.kind == IntentKind.TERMINATE and i.reason == "past_deadline" and i.microvm_id == intent.microvm_id
             for i in d.intents):
        paid_successor(d, intent)
    else:
        no_room_at_all(d, expires)


def paid_successor(d: Draft, intent: Intent) -> None:
    """Nothing parked, no headroom, and this plan ends the VM past its deadline: the successor
    runs in that VM's room in the same step, once the service accepts the end (a TERMINATING VM is
    not live), with no wake and no list to see the end first. At ``max_vms`` each base VM's end cost
    a ListMicrovms and a second below ``min_vms`` more (1 fleet, min 4 / max 7: 6 in 3 hours).
    Not accepted, the run waits as before (the shell wakes the step for it)."""
    d.successors[d.successors.index(intent)] = replace(intent, paid_by=intent.microvm_id)


def room_for_successor(d: Draft, room: Room) -> None:
    """Parked VMs too near their own end to take over (taken, each would need a successor within
    the lead): the soonest-ending one is ended for room, and the successor runs once the list shows
    it gone (the pool, not min_vms, dips for a moment; min 1 / warm 1 / max 2 with 600 s VMs fell
    3 s below min_vms at each end otherwise)."""
    donor = min(room.donors, key=lambda s: lasts(d, s))
    room.donors.remove(donor)
    donor.ending, donor.room_asked_at = "room_for_successor", d.now
    d.intents.append(Intent(IntentKind.TERMINATE, donor.slot_id, donor.microvm_id, reason="room_for_successor"))
    d.wake(d.now + LATE_END_POLL_SECONDS)


def no_room_at_all(d: Draft, expires: float) -> None:
    """No headroom, nothing parked (``max_vms == min_vms``, say): the successor runs the moment its
    VM ends. When clients' or other apps' VMs hold the room (they end when they end), one more look
    comes in time to start it before that end (a client's VM that ended 38 s before a base VM's end,
    after the tick's last look, cost 2 s below min_vms with room)."""
    d.wake(max(expires + EXPIRY_WAKE_SECONDS, d.now + LATE_END_POLL_SECONDS))
    if d.others_live and expires - SUCCESSOR_START_SECONDS > d.now + LATE_END_POLL_SECONDS:
        d.wake(expires - SUCCESSOR_START_SECONDS)


# ------------------------------------------------------------------------------ the plan


def finish(d: Draft) -> Plan:
    """The intents in order (handovers, ends and parks, runs, successors), the gauges, and the
    look at parked slots' PENDING VMs: as PENDING usually ends (about 2 s), then less often for
    slow starts (a fresh image version's first launches take up to a minute)."""
    if d.pending and not d.spec.serve:  # a served fleet's server waits for its VMs to run
        youngest = max(vm.started_at for vm in d.pending)
        d.wake(d.now + max(PENDING_POLL_SECONDS, (d.now - youngest) / 2), Reason.PENDING)
    base = [s for s in d.slots.values() if s.role == BASE]
    dead = sum(1 for s in d.slots.values() if s.phase == DEAD)
    stray_ages = [d.now - float(e["first_seen"]) for e in d.strays.values()]
    gauges = {
        "DesiredBaseVMs": d.spec.min_vms,
        "LiveBaseVMs": sum(1 for s in base if base_live(s, d.seen)),
        "DesiredParkedSlots": d.spec.warm_vms,
        "ParkedSlots": sum(1 for s in d.slots.values() if s.role == WARM and s.phase == PARKED and not s.draining),
        "Members": sum(1 for s in d.slots.values() if s.role == MEMBER),
        "LiveVMs": d.live,
        "InDoubtRuns": d.in_doubt,
        "Deficit": sum(1 for r in d.runs if not r.retry) + dead,
        "DeadLetteredSlots": dead,
        "StrayVMs": len(d.strays),
        "OldestStrayAge": round(max(stray_ages), 3) if stray_ages else 0.0,
    }
    intents = d.handovers + d.intents + d.runs + d.successors
    return Plan(d.slots, intents, d.events, gauges, d.live, d.strays, d.waits, [vm.microvm_id for vm in d.pending])


def base_live(slot: Slot, seen: Mapping[str, Observed]) -> bool:
    """A base slot is live while its VM is RUNNING (or idle-suspended), or while the VM it is
    replacing still runs."""
    current = seen.get(slot.microvm_id or "")
    retiring = seen.get(slot.retiring_id or "")
    return (slot.phase == RUNNING and (current is None or current.state in LIVE)) or (
        retiring is not None and retiring.state in LIVE)
