"""What the reconciler decides: a pure function of the fleet spec, the slot ledger, what
ListMicrovms (and GetMicrovm, for VMs a list missed) shows, and the clock. No AWS call happens
here; :mod:`..tick` wires the I/O.

Vocabulary (docs/reconciler.md):

* a **slot** is a lease in the ledger: a role (``base``, ``warm`` or ``member``), a generation,
  a phase, the MicroVM that fills it, counters and timestamps. The ledger, not tags, says which VM
  fills which slot: MicroVMs cannot be tagged.
* ``base`` slots keep ``min_vms`` VMs live; ``warm`` slots keep ``warm_vms`` VMs parked (run,
  then suspended once RUNNING); ``member`` slots record VMs a slot of ours started that left their
  slot (a parked VM a client resumed, a base VM above a lowered ``min_vms``): they count toward
  ``max_vms`` and are never touched again, since they may serve a session.
* **Ownership comes from the client token only.** Every RunMicrovm of a slot generation carries
  ``client_token(epoch, fleet, slot, generation)`` and the parameters pinned for that generation;
  the VM ID in its answer is the only way a VM enters a slot. A VM the ledger did not start (a
  client's, a killed deploy's, another fleet's) is *foreign*: never suspended, resumed,
  terminated or put in a slot (unless the opt-in stray policy ends a provably idle one).
* **Absence is not an end.** Lists and gets are eventually consistent: a slot's VM missing from a
  list stays live until GetMicrovm shows it ended (or says it does not exist once it is older than
  :data:`CONSISTENCY_SECONDS`); a RunMicrovm whose answer was lost (an ambiguous error) leaves the
  slot *in doubt*: counted live and retried with the same token, which returns the VM it made.

The modules, bottom up: :mod:`.model` (the vocabulary), :mod:`.lifetimes` (successor lead and
first lifetimes: plain numbers, shared with the construct and the cost estimate), :mod:`.shape`
(the slots the spec asks for), :mod:`.transitions` (every change of one slot), :mod:`.observe`
(what a look says before a plan), :mod:`.phases` (the phases of a plan).
"""

from .lifetimes import (
    EXPIRY_WAKE_SECONDS,
    MIN_STAGGER_STEP_SECONDS,
    SLOW_START_SECONDS,
    SUCCESSOR_START_SECONDS,
    look_in_time,
)
from .watch import next_watch, parked_by_watch, watch_news, watch_order, watched_vms
from .model import (
    BASE,
    DEAD,
    ENDED,
    GONE,
    LIVE,
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
    Phase,
    Plan,
    Ready,
    Reason,
    Role,
    Slot,
    Wait,
    ended,
    event,
    note,
    noted,
    own_vm_ids,
    since,
)
from .observe import foreign_vms, stray_is_idle, stray_keys, to_confirm, track_strays, unlisted_warm
from .phases import (
    HANDOVER_LEAD_SECONDS,
    LATE_END_POLL_SECONDS,
    PENDING_POLL_SECONDS,
    ROOM_REFUSED_SECONDS,
    Draft,
    allocate_room,
    count_live,
    plan,
    schedule_runs,
    settle_slots,
    shape,
    track,
    trim_parked,
)
from .shape import (
    client_token,
    desired_slot_ids,
    first_lifetime,
    ledger_demand,
    retired_generations,
    retiring_end,
    short_slot_due,
    slot_order,
    successor_lead,
)
from .transitions import (
    CONSISTENCY_SECONDS,
    DEAD_PROBE_FIRST_SECONDS,
    DEAD_PROBE_SECONDS,
    EXPIRY_MARGIN_SECONDS,
    PARK_GRACE_SECONDS,
    REFUSED_FOR_ROOM,
    REQUEST_FAILURES,
    SERVE_EXPECTED_SECONDS,
    SERVE_POLL_SECONDS,
    SERVE_RETRY_SECONDS,
    SHARED_BACKOFFS,
    SUSPEND_THEN_RESUME_SECONDS,
    TRANSITION_POLL_SECONDS,
    Change,
    Failure,
    admit_run,
    answer_reason,
    ask_about,
    base_seen,
    dead_probe_delay,
    end_accepted,
    end_requested,
    retiring_end_requested,
    handed_over,
    handover,
    member_of,
    member_seen,
    note_wait,
    park_answered,
    park_sent,
    parked_donor,
    probe,
    ready_seen,
    redrive,
    refused_for_room,
    requeue,
    retiring_seen,
    retry_delay,
    run_answered,
    run_failed,
    run_lifetime,
    run_requested,
    serve_ask_failed,
    serve_asked,
    serve_due,
    serving_life,
    settle_park_doubt,
    token_collision,
    vm_ended,
    warm_seen,
    young_donor,
)

__all__ = [
    "BASE", "CONSISTENCY_SECONDS", "Change", "DEAD", "DEAD_PROBE_FIRST_SECONDS", "DEAD_PROBE_SECONDS",
    "DeadKind", "Draft", "ENDED", "EXPIRY_MARGIN_SECONDS", "EXPIRY_WAKE_SECONDS", "Failure", "FleetSpec",
    "GONE", "HANDOVER_LEAD_SECONDS", "Intent", "IntentKind", "LATE_END_POLL_SECONDS", "LIVE", "MEMBER",
    "MIN_STAGGER_STEP_SECONDS", "Observed", "PARKED", "PARKING", "PARK_GRACE_SECONDS", "PENDING_POLL_SECONDS",
    "Phase", "Plan", "QUEUED", "REFUSED_FOR_ROOM", "REQUEST_FAILURES", "ROOM_REFUSED_SECONDS", "RUNNING",
    "Ready", "Reason", "Role", "SERVE_EXPECTED_SECONDS", "SERVE_POLL_SECONDS", "SERVE_RETRY_SECONDS", "SERVING", "SHARED_BACKOFFS", "SLOW_START_SECONDS", "STARTING", "SUCCESSOR_START_SECONDS",
    "SUSPEND_THEN_RESUME_SECONDS", "Slot", "TRANSITION_POLL_SECONDS", "WARM", "Wait", "admit_run",
    "allocate_room", "answer_reason", "ask_about", "base_seen", "client_token", "count_live", "dead_probe_delay", "desired_slot_ids",
    "end_accepted", "end_requested", "retiring_end_requested", "ended", "event", "first_lifetime", "foreign_vms", "handed_over",
    "handover", "ledger_demand", "look_in_time", "member_of", "next_watch", "member_seen", "note", "note_wait",
    "noted", "own_vm_ids", "park_answered", "parked_by_watch", "park_sent", "parked_donor", "plan", "probe", "redrive",
    "refused_for_room", "requeue", "retired_generations", "retiring_end", "retiring_seen", "retry_delay",
    "ready_seen", "run_answered", "run_failed", "run_lifetime", "run_requested", "serve_ask_failed",
    "serve_asked", "serve_due", "serving_life", "schedule_runs", "settle_park_doubt",
    "settle_slots", "shape", "short_slot_due", "since", "slot_order", "stray_is_idle", "stray_keys",
    "successor_lead", "to_confirm", "token_collision", "track", "track_strays", "trim_parked",
    "unlisted_warm", "vm_ended", "warm_seen", "watch_news", "watch_order", "watched_vms", "young_donor",
]
