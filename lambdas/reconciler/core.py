"""What the reconciler decides: a pure function of the fleet spec, the slot ledger, what
ListMicrovms shows, and the clock. No AWS call happens here; :mod:`.tick` wires the I/O.

Vocabulary (docs/reconciler.md):

* a **slot** is a lease in the ledger: a role (``base``, ``warm`` or ``member``), a generation,
  a phase, the MicroVM that fills it, attempts and timestamps. The ledger, not tags, says which VM
  fills which slot: MicroVMs cannot be tagged.
* ``base`` slots keep ``min_vms`` VMs live; ``warm`` slots keep ``warm_vms`` VMs parked
  (run, then suspended once RUNNING); ``member`` slots record VMs the reconciler did not start for
  a base or warm slot (a client's, or a parked slot a client resumed): they count toward
  ``max_vms`` and are never terminated by the reconciler, since they may serve a session.
* every RunMicrovm carries ``client_token(epoch, fleet, slot, generation)``: a retried,
  duplicated or concurrent step never makes a second VM for one slot generation.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Optional

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
ENDED = ("TERMINATING", "TERMINATED")
BASE, WARM, MEMBER = "base", "warm", "member"
QUEUED, STARTING, RUNNING, PARKING, PARKED, DEAD = "queued", "starting", "running", "parking", "parked", "dead"


@dataclass(frozen=True)
class FleetSpec:
    """What one fleet must look like, and how hard the reconciler may try."""

    fleet: str
    image_arn: str
    min_vms: int
    max_vms: int
    warm_vms: int = 0
    max_lifetime_seconds: int = 28_800
    idle_seconds: Optional[int] = None
    execution_role_arn: Optional[str] = None
    successor_lead_seconds: float = 900.0
    max_start_attempts: int = 3
    crash_window_seconds: float = 600.0
    max_starts_per_step: int = 10
    admission_deadline_seconds: float = 300.0
    image_version: Optional[str] = None
    """The version new VMs run; VMs on another one are rolled (``None``: no rollout)."""
    base_rollout: str = "on_expiry"
    """``on_expiry``: base VMs move to a new image version when they reach their end (no extra
    VMs); ``rolling``: a successor starts now (within ``max_vms`` headroom)."""

    def run_parameters(self, role: str) -> dict[str, Any]:
        """RunMicrovm parameters for a slot of ``role`` (the client token aside)."""
        params: dict[str, Any] = {"imageIdentifier": self.image_arn, "maximumDurationInSeconds": self.max_lifetime_seconds}
        if self.image_version:
            params["imageVersion"] = self.image_version
        if self.execution_role_arn:
            params["executionRoleArn"] = self.execution_role_arn
        if role == BASE and self.idle_seconds:
            # A base VM the service suspends when idle is still a live base VM: it resumes when called.
            params["idlePolicy"] = {
                "maxIdleDurationSeconds": self.idle_seconds,
                "suspendedDurationSeconds": self.max_lifetime_seconds,
                "autoResumeEnabled": True,
            }
        return params


@dataclass
class Slot:
    """One lease of the ledger."""

    slot_id: str
    role: str
    generation: int = 0
    phase: str = QUEUED
    microvm_id: Optional[str] = None
    retiring_id: Optional[str] = None
    queued_at: Optional[float] = None
    requested_at: Optional[float] = None
    vm_started_at: Optional[float] = None
    attempts: int = 0
    reason: Optional[str] = None
    noted: Optional[str] = None
    parking_since: Optional[float] = None  # when the service accepted our SuspendMicrovm

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Slot":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Observed:
    """One item of ListMicrovms."""

    microvm_id: str
    state: str
    started_at: float
    image_version: Optional[str] = None


@dataclass(frozen=True)
class Intent:
    """A control-plane call the step wants to make, in priority order."""

    kind: str  # run | suspend | terminate | describe
    slot_id: str
    microvm_id: Optional[str] = None
    role: Optional[str] = None
    successor: bool = False
    reason: Optional[str] = None
    priority: int = 0


@dataclass
class Plan:
    slots: dict[str, Slot]
    intents: list[Intent]
    events: list[dict[str, Any]]
    gauges: dict[str, float]
    live_vms: int
    wake_soon: bool = False


#: After the service accepted a SuspendMicrovm, a VM still seen RUNNING this much later was
#: resumed by a client (it took the parked slot), not merely slow to suspend.
PARK_GRACE_SECONDS = 30.0


def client_token(epoch: str, fleet: str, slot_id: str, generation: int) -> str:
    """The RunMicrovm ``clientToken`` of one slot generation (1–128 characters)."""
    digest = hashlib.sha256(f"{epoch}\0{fleet}\0{slot_id}\0{generation}".encode()).hexdigest()
    return f"rz1-{digest[:48]}"


def _event(kind: str, slot: Optional[Slot] = None, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"event": kind}
    if slot is not None:
        event.update(slot=slot.slot_id, role=slot.role, generation=slot.generation, microvm_id=slot.microvm_id)
    event.update({k: v for k, v in fields.items() if v is not None})
    return event


def desired_slot_ids(spec: FleetSpec) -> list[tuple[str, str]]:
    return [(f"base-{i}", BASE) for i in range(spec.min_vms)] + [(f"warm-{i}", WARM) for i in range(spec.warm_vms)]


def plan(spec: FleetSpec, ledger: Mapping[str, Slot], observed: Iterable[Observed], now: float) -> Plan:
    """Reconcile the ledger with what the service shows; return the new ledger and the intents."""
    slots = {k: copy.copy(v) for k, v in ledger.items()}
    seen = {o.microvm_id: o for o in observed}
    events: list[dict[str, Any]] = []
    intents: list[Intent] = []
    describes: list[Intent] = []
    wake_soon = False  # a warm slot's VM is PENDING: it must be suspended as soon as it runs

    def requeue(slot: Slot, reason: str) -> None:
        slot.generation += 1
        slot.phase, slot.microvm_id, slot.queued_at, slot.requested_at = QUEUED, None, now, None
        slot.vm_started_at, slot.reason, slot.noted, slot.parking_since = None, reason, None, None

    # 1. Each slot against what the service shows.
    for slot in list(slots.values()):
        if slot.retiring_id:
            retiring = seen.get(slot.retiring_id)
            if retiring is None or retiring.state in ENDED:
                events.append(_event("vm_retired", slot, retired_id=slot.retiring_id))
                slot.retiring_id = None
            elif slot.role == WARM and retiring.state in ("PENDING", "RUNNING"):
                # A client resumed the parked VM being replaced: it is a member now.
                member = Slot(f"member-{retiring.microvm_id}", MEMBER, phase=RUNNING, microvm_id=retiring.microvm_id,
                              vm_started_at=retiring.started_at, queued_at=now)
                slots[member.slot_id] = member
                events.append(_event("warm_slot_taken", slot, taken_id=retiring.microvm_id))
                slot.retiring_id = None
        if slot.role == MEMBER:
            member = seen.get(slot.microvm_id or "")
            if member is None or member.state in ENDED:
                events.append(_event("member_released", slot, state=member.state if member else "vanished"))
                del slots[slot.slot_id]
            continue
        if slot.phase == DEAD or slot.microvm_id is None:
            continue
        vm = seen.get(slot.microvm_id)
        if vm is None or vm.state in ENDED:
            started = slot.vm_started_at if slot.vm_started_at is not None else (vm.started_at if vm else now)
            if started + spec.max_lifetime_seconds <= now + 1:
                events.append(_event("vm_expired", slot))
                requeue(slot, "expired")
                continue
            young = now - started < spec.crash_window_seconds
            slot.attempts = slot.attempts + 1 if young else 1
            events.append(_event("vm_ended_unexpectedly", slot, state=vm.state if vm else "vanished", attempts=slot.attempts))
            if vm is not None:
                describes.append(Intent("describe", slot.slot_id, slot.microvm_id))
            if slot.attempts >= spec.max_start_attempts:
                slot.phase, slot.reason = DEAD, f"ended unexpectedly {slot.attempts} times in a row"
                events.append(_event("slot_dead_lettered", slot, reason=slot.reason))
            else:
                requeue(slot, "replaced_after_unexpected_end")
            continue
        slot.vm_started_at = vm.started_at
        if slot.attempts and now - vm.started_at >= spec.crash_window_seconds:
            slot.attempts = 0
        if slot.role == BASE:
            ready = vm.state == "RUNNING" or (vm.state in ("SUSPENDING", "SUSPENDED") and spec.idle_seconds)
            if ready and slot.phase == STARTING:
                slot.phase = RUNNING
                events.append(_event("vm_running", slot, claim_to_complete=_since(slot.requested_at, now)))
            # A PENDING base VM needs nothing from us: it serves as soon as it runs. No polling.
        else:  # WARM
            suspended_then_resumed = (
                slot.phase == PARKING and slot.parking_since is not None and now - slot.parking_since > PARK_GRACE_SECONDS
            )
            if vm.state == "RUNNING" and slot.phase == PARKING and slot.parking_since is not None and not suspended_then_resumed:
                wake_soon = True  # our suspend was accepted; the list has not caught up yet
            elif vm.state == "RUNNING" and (slot.phase == PARKED or suspended_then_resumed):
                # A client resumed the parked slot: the VM is a member now; refill the pool.
                member = Slot(f"member-{vm.microvm_id}", MEMBER, phase=RUNNING, microvm_id=vm.microvm_id,
                              vm_started_at=vm.started_at, queued_at=now)
                slots[member.slot_id] = member
                events.append(_event("warm_slot_taken", slot))
                requeue(slot, "taken_by_client")
            elif vm.state == "RUNNING":
                intents.append(Intent("suspend", slot.slot_id, vm.microvm_id))
                slot.phase = PARKING
            elif vm.state == "SUSPENDING":
                slot.phase = PARKING
            elif vm.state == "SUSPENDED" and slot.phase != PARKED:
                slot.phase = PARKED
                events.append(_event("vm_parked", slot, claim_to_complete=_since(slot.requested_at, now)))
            elif vm.state == "PENDING":
                wake_soon = True

    # 2. VMs of the image the ledger does not know: attach or adopt.
    known = {s.microvm_id for s in slots.values() if s.microvm_id} | {s.retiring_id for s in slots.values() if s.retiring_id}
    for vm in sorted(seen.values(), key=lambda v: (v.started_at, v.microvm_id)):
        if vm.microvm_id in known or vm.state not in LIVE:
            continue
        waiting = [
            s for s in slots.values()
            if s.phase == STARTING and s.microvm_id is None and s.requested_at is not None and s.requested_at <= vm.started_at + 1
        ]
        if waiting:
            slot = min(waiting, key=lambda s: s.requested_at or 0)
            slot.microvm_id, slot.vm_started_at = vm.microvm_id, vm.started_at
            events.append(_event("vm_attached", slot))
        else:
            member = Slot(f"member-{vm.microvm_id}", MEMBER, phase=RUNNING, microvm_id=vm.microvm_id,
                          vm_started_at=vm.started_at, queued_at=now)
            slots[member.slot_id] = member
            events.append(_event("vm_adopted", member, state=vm.state))
        known.add(vm.microvm_id)

    # 3. The slot set the spec asks for.
    wanted = dict(desired_slot_ids(spec))
    for slot_id, role in wanted.items():
        if slot_id not in slots:
            slots[slot_id] = Slot(slot_id, role, queued_at=now)
            events.append(_event("slot_queued", slots[slot_id]))
    for slot in list(slots.values()):
        if slot.role == MEMBER or slot.slot_id in wanted:
            continue
        del slots[slot.slot_id]
        for vm_id in (slot.microvm_id, slot.retiring_id):
            vm = seen.get(vm_id or "")
            if vm is None or vm.state not in LIVE:
                continue
            if slot.role == WARM and vm.state in ("SUSPENDING", "SUSPENDED"):
                intents.append(Intent("terminate", slot.slot_id, vm_id, reason="surplus_parked_slot"))
            else:
                # A VM that may be serving a session ends by itself (scale-in); never terminated here.
                member = Slot(f"member-{vm_id}", MEMBER, phase=RUNNING, microvm_id=vm_id, vm_started_at=vm.started_at)
                slots[member.slot_id] = member
                events.append(_event("slot_released_to_member", member, reason="spec_shrank"))

    # 4. Rolling replacement, and retiring parked VMs once their successor is parked.
    runs: list[Intent] = []
    successors: list[Intent] = []
    def order(slot: Slot) -> tuple[int, int, str]:
        # base-0, warm-0, base-1, warm-1...: every fleet gets its first parked slot early, so
        # parking (SuspendMicrovm, the tightest quota) overlaps with the runs instead of trailing.
        index = int(slot.slot_id.rsplit("-", 1)[-1]) if slot.slot_id.rsplit("-", 1)[-1].isdigit() else 0
        return (index, slot.role != BASE, slot.slot_id)

    for slot in sorted(slots.values(), key=order):
        if slot.role == MEMBER or slot.phase == DEAD:
            continue
        if slot.phase in (QUEUED, STARTING) and slot.microvm_id is None:
            runs.append(Intent("run", slot.slot_id, role=slot.role))
            if slot.queued_at is not None and now - slot.queued_at > spec.admission_deadline_seconds and not noted(slot, "deadline"):
                events.append(_event("admission_deadline_exceeded", slot, waited=round(now - slot.queued_at, 3)))
                note(slot, "deadline")
            continue
        expires = (slot.vm_started_at or now) + spec.max_lifetime_seconds
        ready = slot.phase in (RUNNING, PARKED)
        current = seen.get(slot.microvm_id or "")
        outdated = bool(spec.image_version and current and current.image_version
                        and current.image_version != spec.image_version)
        if ready and slot.retiring_id is None:
            if expires - now <= spec.successor_lead_seconds:
                # Expiring base VMs first: they are what keeps min_vms live.
                successors.append(Intent("run", slot.slot_id, slot.microvm_id, role=slot.role, successor=True,
                                         reason="expiring", priority=0 if slot.role == BASE else 1))
            elif outdated and (slot.role == WARM or spec.base_rollout == "rolling"):
                # A new image version: parked slots are replaced first, base VMs after them.
                successors.append(Intent("run", slot.slot_id, slot.microvm_id, role=slot.role, successor=True,
                                         reason="image_version", priority=2 if slot.role == WARM else 3))
                if not noted(slot, "outdated"):
                    events.append(_event("vm_outdated", slot, version=current.image_version,
                                         wanted=spec.image_version))
                    note(slot, "outdated")
        if slot.role == WARM and slot.retiring_id and slot.phase == PARKED:
            retiring = seen.get(slot.retiring_id)
            if retiring is not None and retiring.state in ("SUSPENDING", "SUSPENDED"):
                intents.append(Intent("terminate", slot.slot_id, slot.retiring_id, reason="replaced_parked_slot"))
    successors.sort(key=lambda i: i.priority)
    intents = describes + intents + runs + successors

    live = sum(1 for o in seen.values() if o.state in LIVE)
    base = [s for s in slots.values() if s.role == BASE]
    warm = [s for s in slots.values() if s.role == WARM]
    gauges = {
        "DesiredBaseVMs": spec.min_vms,
        "LiveBaseVMs": sum(1 for s in base if _base_live(s, seen)),
        "DesiredParkedSlots": spec.warm_vms,
        "ParkedSlots": sum(1 for s in warm if s.phase == PARKED),
        "Members": sum(1 for s in slots.values() if s.role == MEMBER),
        "LiveVMs": live,
        "Deficit": len(runs) + sum(1 for s in slots.values() if s.phase == DEAD),
        "DeadLetteredSlots": sum(1 for s in slots.values() if s.phase == DEAD),
    }
    return Plan(slots, intents, events, gauges, live, wake_soon)


def noted(slot: Slot, reason: str) -> bool:
    """Whether ``reason`` was already told for this wait of the slot (told once, not every step)."""
    return reason in (slot.noted or "").split(",")


def note(slot: Slot, reason: str) -> None:
    slot.noted = ",".join(filter(None, [slot.noted, reason]))


def _base_live(slot: Slot, seen: Mapping[str, Observed]) -> bool:
    """A base slot is live while its VM is RUNNING (or idle-suspended), or while the VM it is
    replacing still runs."""
    current = seen.get(slot.microvm_id or "")
    retiring = seen.get(slot.retiring_id or "")
    return (slot.phase == RUNNING and current is not None and current.state in LIVE) or (
        retiring is not None and retiring.state in LIVE
    )


def admit_run(slot: Slot, intent: Intent, now: float) -> Slot:
    """The ledger change written *before* RunMicrovm is called, so a step killed right after the
    call leaves a slot the next step finishes with the same client token."""
    slot = copy.copy(slot)
    if intent.successor:
        slot.retiring_id, slot.microvm_id = slot.microvm_id, None
        slot.generation += 1
        slot.queued_at = now
    slot.phase = STARTING
    slot.requested_at = now
    slot.noted = None
    return slot


def _since(start: Optional[float], now: float) -> Optional[float]:
    return None if start is None else round(now - start, 3)
