"""The reconciler's vocabulary: the fleet spec, a slot of the ledger, a VM as the service shows it,
an intent (a call the plan wants made), a wait (a reason to wake, and when) and the plan itself.

Plain data, no I/O. The values of :class:`Role`, :class:`Phase` and :class:`DeadKind` are the
strings the ledger stores (``"base"``, ``"parked"``, ...): they are ``str`` enums, so a slot
written by any version reads back the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any, Mapping, Optional

#: VM states that count toward ``max_vms`` (ours, members and foreign ones alike).
LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
ENDED = ("TERMINATING", "TERMINATED")
GONE = "GONE"
"""Pseudo-state: GetMicrovm says the VM does not exist, and it is older than the consistency
window (a VM listed TERMINATED for its linger and then forgotten)."""


class Role(StrEnum):
    """What a slot is for."""

    BASE = "base"  # keeps one of min_vms live
    WARM = "warm"  # keeps one of warm_vms parked (run, then suspended once RUNNING)
    MEMBER = "member"  # a VM a slot of ours started that left its slot: counted, never touched


class Phase(StrEnum):
    """Where a slot is in its life. A base slot's VM is STARTING until it runs, SERVING while the
    reconciler's server starts the product's agent host on it, and RUNNING once the host is ready
    (only then does it count toward ``min_vms``); a parked slot's VM is STARTING until the server
    warmed it, PARKING while it is suspended, PARKED once SUSPENDED."""

    QUEUED = "queued"
    STARTING = "starting"
    SERVING = "serving"
    RUNNING = "running"
    PARKING = "parking"
    PARKED = "parked"
    DEAD = "dead"


class DeadKind(StrEnum):
    """Why a slot was dead-lettered: the service's failures are probed again, the others wait."""

    SERVICE = "service"
    REQUEST = "request"
    CRASH = "crash"


class IntentKind(StrEnum):
    """The calls a plan asks for. ``HANDOVER`` moves a parked slot's VM that is not suspended
    (PENDING, RUNNING, or parking) to a base slot: a fenced write, no call. ``SERVE`` asks the
    fleet's server (a function of its own) to serve a base slot's VM or warm a parked slot's: its
    answer comes back as a :class:`Ready` fact in the ledger."""

    RUN = "run"
    SERVE = "serve"
    SUSPEND = "suspend"
    TERMINATE = "terminate"
    RESUME = "resume"
    HANDOVER = "handover"


BASE, WARM, MEMBER = Role.BASE, Role.WARM, Role.MEMBER
QUEUED, STARTING, SERVING, RUNNING, PARKING, PARKED, DEAD = (
    Phase.QUEUED, Phase.STARTING, Phase.SERVING, Phase.RUNNING, Phase.PARKING, Phase.PARKED, Phase.DEAD)


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
    max_starts_per_step: int = 10
    admission_deadline_seconds: float = 300.0
    image_version: Optional[str] = None
    """The version new VMs run; VMs on another one are rolled (``None``: no rollout)."""
    base_rollout: str = "on_expiry"
    """``on_expiry``: base VMs move to a new image version when they reach their end (no extra
    VMs); ``rolling``: a successor starts now (within ``max_vms`` headroom)."""
    stagger: bool = True
    """First VMs of a fleet get lifetimes spread over half a lifetime, so their successors never
    all need headroom at the same moment."""
    shared_image: bool = False
    """Other fleets run this image too: VMs their ledgers own are neither counted nor strays."""
    terminate_strays: bool = False
    """End foreign VMs that show no sign of serving (:func:`.strays.stray_is_idle`)."""
    stray_grace_seconds: float = 3600.0
    """How long a foreign VM must stay SUSPENDED, unowned, before it may be ended."""
    look_period_seconds: float = 60.0
    """How often the schedule invokes a tick (the longest a due successor may wait for a look)."""
    serve: bool = False
    """The fleet's VMs are the product's: a base VM counts toward ``min_vms`` only once the fleet's
    server says its agent host serves, and a parked slot's VM is suspended only once the server
    warmed it (:class:`Ready`). False: a VM counts once RUNNING (a fleet with no server)."""
    watch_seconds: float = 0.0
    """While a tick lives, its parked slots' VMs are looked at this often (GetMicrovm each) for a
    client's take, so the slot is refilled within seconds, not at the next scheduled tick (0: no
    watch; a take is then seen by the next tick's list, up to a schedule period later)."""
    rayd_deadline: bool = False
    """The VMs' run payload sets a lifecycle: ``rayd`` ends their agents at the lifetime, before
    the maximum duration the service enforces, and the service lists them RUNNING ~15 s more (a
    fleet that scales in; the product sends none for one whose ``max_vms`` is ``min_vms``)."""

    def fingerprint(self) -> str:
        """Changes when a deploy changes what the fleet runs (dead slots are then tried again)."""
        data = {k: v for k, v in asdict(self).items()
                if k not in ("max_starts_per_step", "admission_deadline_seconds", "watch_seconds")}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Slot:
    """One lease of the ledger."""

    slot_id: str
    role: Role
    generation: int = 0
    phase: Phase = QUEUED
    microvm_id: Optional[str] = None
    retiring_id: Optional[str] = None
    queued_at: Optional[float] = None
    requested_at: Optional[float] = None
    vm_started_at: Optional[float] = None
    lifetime: Optional[int] = None  # maximumDurationInSeconds of the slot's current VM
    request: Optional[dict[str, Any]] = None  # RunMicrovm parameters pinned for this generation
    in_doubt_since: Optional[float] = None  # an ambiguous RunMicrovm: a VM may exist
    errors: int = 0  # failed RunMicrovm attempts in a row
    crashes: int = 0  # early ends in a row
    retry_at: Optional[float] = None
    dead_kind: Optional[DeadKind] = None
    reason: Optional[str] = None
    noted: Optional[str] = None
    parking_since: Optional[float] = None  # when the service accepted our SuspendMicrovm (or resume)
    ending: Optional[str] = None  # a VM of this slot we asked to end (not a crash when it ends)
    draining: bool = False  # a parked slot above warm_vms or max_vms: end its VM once parked
    handover_from: Optional[str] = None  # the warm slot whose parked VM a base slot took
    end_requested_at: Optional[float] = None  # when the service accepted our TerminateMicrovm
    park_doubt_since: Optional[float] = None  # a SuspendMicrovm sent then, its answer lost
    retiring_ends_at: Optional[float] = None  # the retiring VM's expected end (its start + lifetime)
    retiring_end_asked_at: Optional[float] = None  # a served fleet's retiring VM ended past its deadline
    room_asked_at: Optional[float] = None  # when a plan last asked to end this parked VM for room
    first_generation: int = 0  # the generation this slot id (asked for again) started at
    letter: Optional[dict[str, Any]] = None  # its dead letter, until the queue took it (sent again)
    auto_resume: bool = False  # the VM's idle policy suspends it when idle and wakes it on a request
    ready_at: Optional[float] = None  # when the server said the VM serves (base) or is warmed (parked)
    serve_asked_at: Optional[float] = None  # the server's last ask for this VM that has no answer yet
    serve_asks: int = 0  # asks made for this VM
    serve_failures: int = 0  # asks the server answered with a failure

    def __post_init__(self) -> None:
        # A slot read from the ledger has strings here; one made in code, the enums already.
        if type(self.role) is not Role:
            self.role = Role(self.role)
        if type(self.phase) is not Phase:
            self.phase = Phase(self.phase)
        if self.dead_kind is not None and type(self.dead_kind) is not DeadKind:
            self.dead_kind = DeadKind(self.dead_kind)

    def to_dict(self) -> dict[str, Any]:
        """The slot as the ledger stores it: plain JSON values (enums as their strings)."""
        data = asdict(self)
        for key in ("role", "phase", "dead_kind"):
            if data[key] is not None:
                data[key] = str(data[key])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Slot:
        return cls(**{k: v for k, v in data.items() if k in _SLOT_FIELDS})

    @property
    def in_doubt(self) -> bool:
        """A RunMicrovm of the slot's generation may have made a VM nobody has the ID of: its
        answer was lost (an ambiguous error), or the tick that sent it died or lost its lease
        before writing the answer down (the slot is still STARTING). Such a slot counts as live
        and asks again with the same token, which returns that VM if it exists."""
        return self.in_doubt_since is not None or (self.phase == STARTING and self.requested_at is not None)

    def ends_at(self, default_lifetime: float, now: float) -> float:
        """When the slot's current VM ends by itself (its start, or now, plus its lifetime)."""
        start = self.vm_started_at if self.vm_started_at is not None else now
        return start + (self.lifetime or default_lifetime)


_SLOT_FIELDS = frozenset(f.name for f in fields(Slot))


@dataclass(frozen=True)
class Observed:
    """One VM as ListMicrovms (or GetMicrovm) shows it."""

    microvm_id: str
    state: str
    started_at: float
    image_version: Optional[str] = None
    reason: Optional[str] = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED or self.state == GONE


def ended(vm: Optional[Observed]) -> bool:
    """Whether a look shows the VM ended (absence is not an end)."""
    return vm is not None and vm.ended


@dataclass(frozen=True)
class Ready:
    """What the fleet's server wrote of one VM it was asked about (a *fact* of the ledger):
    ``ready`` (a base VM's agent host serves, a parked slot's VM is warmed, both RUNNING then) or
    ``failed`` (``reason`` says why), at ``at`` on the shared clock, for ask number ``attempt``."""

    microvm_id: str
    outcome: str
    at: float
    attempt: int = 0
    reason: Optional[str] = None
    role: str = "member"
    """What the server was asked: ``member`` (serve it) or ``warm`` (warm it for a parked slot): a
    parked VM handed to a base slot is warmed, not served, until the server serves it."""

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ready:
        return cls(str(data["microvm_id"]), str(data["outcome"]), float(data["at"]), int(data.get("attempt") or 0),
                   data.get("reason"), str(data.get("role") or "member"))


@dataclass(frozen=True)
class Intent:
    """A control-plane call the step wants to make, in priority order."""

    kind: IntentKind
    slot_id: str
    microvm_id: Optional[str] = None
    role: Optional[Role] = None
    successor: bool = False
    reason: Optional[str] = None
    priority: int = 0
    retry: bool = False  # a RunMicrovm with a token already sent (in doubt): needs no headroom
    donor: Optional[str] = None  # resume or handover: the warm slot giving its VM
    expires: float = 0.0  # a successor: when the VM it replaces ends
    paid_by: Optional[str] = None  # a successor that runs in the room of its VM, ended in the same step


class Reason(StrEnum):
    """Why a step wakes. ``overtime``: worth a step past the tick's deadline (a slot without a
    VM, a VM about to end with nothing to replace it, a parked slot's VM to park, the parked
    slots' watch until the next tick). ``SHORT``,
    ``PARK_DUE`` and ``OWED`` never wake a step before the deadline: they only make one worth taking
    past it."""


    BACKOFF = "backoff"  # a slot's backoff ends (it may run again)
    PENDING = "pending"  # a parked slot's PENDING VM, to park it once it runs (the plan's poll)
    LOOK = "look"  # a parked slot's VM the step started, or a look missed: looked at to park it
    REPLACE = "replace"  # a VM of ours ends that something waits for
    HANDOVER = "handover"  # a base VM comes within the handover lead of its end
    TRANSITION = "transition"  # our own resume or suspend, to see it land
    BUDGET = "budget"  # a RunMicrovm token of the shared budget comes due
    DEFERRED = "deferred"  # another call the shared budget deferred
    RETRY = "retry"  # a run answered ambiguously or refused, asked again
    LIST = "list"  # a list the service refused, asked again (no step past the deadline waits for it)
    ROOM = "room"  # the account said no room: a plan hands parked VMs to base slots
    SERVE = "serve"  # the server was asked to warm a parked slot's VM: parked once it answers
    SERVED = "served"  # ... to serve a base slot's VM: counted once it answers (no overtime for it)
    SHORT = "short"  # a wanted slot without a VM can run one
    PARK = "park"  # a parked slot's VM to suspend (its token, its look)
    PARK_DUE = "park_due"  # ... a look at one worth overtime, though the step sleeps for others first
    STEP = "step"  # the step left work its width or budget did not take
    OWED = "owed"  # what the last plan found worth overtime, carried by a step that did not plan
    WATCH = "watch"  # parked slots' VMs, looked at (GetMicrovm) for a client's take to refill (overtime too)

    @property
    def overtime(self) -> bool:
        return self in _OVERTIME

    @property
    def owed(self) -> bool:
        """Worth overtime for the fleet's own slots (what a step that does not plan carries, and
        what ``tick_overtime`` tells): every overtime reason but the watch."""
        return self in _OWED


_OWED = frozenset({Reason.REPLACE, Reason.SHORT, Reason.PARK, Reason.PARK_DUE, Reason.OWED, Reason.SERVE})
#: The watch goes on past ``tick_seconds`` too: a take in the rest of the schedule period would
#: otherwise wait for the next tick's list (:mod:`.watch`).
_OVERTIME = _OWED | {Reason.WATCH}


@dataclass(frozen=True, order=True)
class Wait:
    """A reason to take another step, and when (the shared clock)."""

    at: float
    reason: Reason = field(compare=False)


@dataclass
class Plan:
    """What one plan decided: the new ledger, the calls in order, what to tell and when to wake."""

    slots: dict[str, Slot]
    intents: list[Intent]
    events: list[dict[str, Any]]
    gauges: dict[str, float]
    live_vms: int
    strays: dict[str, dict[str, Any]] = field(default_factory=dict)
    waits: list[Wait] = field(default_factory=list)
    pending_warm: list[str] = field(default_factory=list)  # parked slots' VMs still PENDING

    def wake_at(self, *reasons: Reason) -> Optional[float]:
        """The soonest wait (of ``reasons``, or any)."""
        ats = [w.at for w in self.waits if not reasons or w.reason in reasons]
        return min(ats) if ats else None


def event(name: str, slot: Optional[Slot] = None, **details: Any) -> dict[str, Any]:
    """One timeline line: the event, the slot it is about, and the details that are set."""
    out: dict[str, Any] = {"event": name}
    if slot is not None:
        out.update(slot=slot.slot_id, role=str(slot.role), generation=slot.generation, microvm_id=slot.microvm_id)
    out.update({k: (str(v) if isinstance(v, Enum) else v) for k, v in details.items() if v is not None})
    return out


def since(start: Optional[float], now: float) -> Optional[float]:
    return None if start is None else round(now - start, 3)


def noted(slot: Slot, reason: str) -> bool:
    """Whether ``reason`` was already told for this wait of the slot (told once, not every step)."""
    return reason in (slot.noted or "").split(",")


def note(slot: Slot, reason: str) -> None:
    slot.noted = ",".join(filter(None, [slot.noted, reason]))


def own_vm_ids(slots: Mapping[str, Slot]) -> set[str]:
    """Every VM a slot of this ledger holds (current, retiring, members)."""
    return {i for s in slots.values() for i in (s.microvm_id, s.retiring_id) if i}
