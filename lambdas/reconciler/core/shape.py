"""The fleet's slots as the spec asks for them: their ids, their start order, their first lifetimes,
their tokens, and what the ledger alone says about them (runs due, slots short, VMs retiring)."""

from __future__ import annotations

import hashlib
from typing import Mapping, Optional

from .lifetimes import first_lifetime as lifetime_at_rank
from .lifetimes import successor_lead as lead_of
from .model import BASE, DEAD, MEMBER, WARM, FleetSpec, Observed, Role, Slot


def client_token(epoch: str, fleet: str, slot_id: str, generation: int) -> str:
    """The RunMicrovm ``clientToken`` of one slot generation (1–128 characters)."""
    digest = hashlib.sha256(f"{epoch}\0{fleet}\0{slot_id}\0{generation}".encode()).hexdigest()
    return f"rz1-{digest[:48]}"


def desired_slot_ids(spec: FleetSpec) -> list[tuple[str, Role]]:
    return [(f"base-{i}", BASE) for i in range(spec.min_vms)] + [(f"warm-{i}", WARM) for i in range(spec.warm_vms)]


def successor_lead(spec: FleetSpec) -> float:
    """:func:`.lifetimes.successor_lead` of the spec's lifetime, lead and schedule period."""
    return lead_of(spec.max_lifetime_seconds, spec.successor_lead_seconds, spec.look_period_seconds)


def slot_order(slot_id: str, role: str, spec: Optional[FleetSpec] = None) -> tuple[float, bool, str]:
    """Parked slots spread evenly over the fleet's starts from the first one on (with 6 base and
    2 parked slots: warm-0, base-0, base-1, base-2, warm-1, base-3...), so parking
    (SuspendMicrovm, the tightest quota: 2 a second) runs beside the starts instead of trailing
    them. Without a spec, or for a role the spec asks none of: base-0, warm-0, base-1, warm-1..."""
    tail = slot_id.rsplit("-", 1)[-1]
    rank = int(tail) if tail.isdigit() else 0
    count = (spec.warm_vms if role == WARM else spec.min_vms) if spec is not None else 0
    if count <= 0:
        return (float(rank), role != BASE, slot_id)
    return (rank / count if role == WARM else (rank + 0.5) / count, role != BASE, slot_id)


def first_lifetime(spec: FleetSpec, slot_id: str, role: str) -> int:
    """The lifetime of a slot's first VM (:func:`.lifetimes.first_lifetime` by its rank in the
    start order), so VMs started together (a fleet from empty) do not all expire together."""
    life = spec.max_lifetime_seconds
    ids = [s for s, r in sorted(desired_slot_ids(spec), key=lambda s: slot_order(s[0], s[1], spec))]
    if not spec.stagger or slot_id not in ids:
        return life
    return lifetime_at_rank(life, successor_lead(spec), ids.index(slot_id), len(ids))


def ledger_demand(spec: FleetSpec, slots: Mapping[str, Slot], now: float) -> int:
    """How many RunMicrovm calls the ledger alone says are due: wanted slots with no VM and no
    backoff (missing ones included), at most the headroom the ledger's own VMs leave under
    ``max_vms``. A tick reserves that many tokens of the shared budget *before* its first list, so
    a fleet that must wait for them lists once, when they come due (at 300 fleets, listing first
    and again after the wait was a quarter of all calls). An estimate: the list and the plan still
    decide every call."""
    due = 0
    for slot_id, _role in desired_slot_ids(spec):
        slot = slots.get(slot_id)
        if slot is None or (slot.microvm_id is None and slot.phase != DEAD and not slot.draining
                            and (slot.retry_at is None or slot.retry_at <= now)):
            due += 1
    held = sum(1 for s in slots.values() if s.microvm_id is not None or s.in_doubt)
    return max(0, min(due, spec.max_vms - held))


def short_slot_due(slots: Mapping[str, Slot], now: float) -> Optional[float]:
    """When the first wanted slot (base or parked) without a VM can start one: now, or its
    backoff's end (None: none is short). A base slot is below ``min_vms`` until then; a fleet's
    first fills are its convergence (left to the next scheduled tick, up to a minute late)."""
    dues = [max(now, s.retry_at or now) for s in slots.values()
            if s.role in (BASE, WARM) and s.microvm_id is None and s.phase != DEAD and not s.draining]
    return min(dues) if dues else None


def retired_generations(before: Mapping[str, Slot], after: Mapping[str, Slot],
                        retired: Optional[Mapping[str, int]] = None) -> Optional[dict[str, int]]:
    """The ledger's ``retired`` map once the slots of ``before`` missing from ``after`` are gone:
    each slot id's next generation (None: nothing dropped, nothing to write). A slot id the spec
    drops (``warm_vms`` or ``min_vms`` lowered) and asks for again (raised back) must not start at
    generation 0 again: its first run would send the token of its first VM, and the service
    answers that VM (a client's session, a member)."""
    dropped = [s for k, s in before.items() if k not in after and s.role != MEMBER]
    if not dropped:
        return None
    out = {k: int(v) for k, v in (retired or {}).items()}
    for slot in dropped:
        out[slot.slot_id] = max(out.get(slot.slot_id, 0), slot.generation + 1)
    return out


def retiring_end(slot: Slot, seen: Mapping[str, Observed], spec: FleetSpec) -> Optional[float]:
    """When the VM a slot is replacing ends by itself (None: it has none, or its end is unknown):
    its expected end, or, for a ledger written before that was kept, its start plus a whole
    lifetime (a later end than the real one: the successor waits longer, never too little)."""
    if not slot.retiring_id:
        return None
    if slot.retiring_ends_at is not None:
        return slot.retiring_ends_at
    vm = seen.get(slot.retiring_id)
    return vm.started_at + spec.max_lifetime_seconds if vm is not None else None
