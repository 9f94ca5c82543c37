"""When a VM's successor starts and how long a slot's first VM lives: one rule for the reconciler,
the construct's synth checks (``rayito_constructs.reconciler`` imports this module from the wheel,
``rayito_constructs._lambdas``) and the cost estimate (``rayito_constructs.model.cost``).

Plain numbers in, plain numbers out: this module imports nothing of the package, so the library
can load it without the Lambda's dependencies.
"""

from __future__ import annotations

#: A successor that runs this long before its VM's end is RUNNING before it (PENDING: about 2 s).
SUCCESSOR_START_SECONDS = 10.0
#: The longest PENDING measured: a new image version's first launches take 26-65 s.
SLOW_START_SECONDS = 65.0
#: First lifetimes are spread by at least this much a slot, or not at all: a successor that waits
#: for room under ``max_vms`` runs when the VM ending before its own ends, and is RUNNING a start
#: later (PENDING about 2 s; a step wakes 1 s after the end). Measured through the handler: min 10 /
#: max 11 with 1,200 s VMs spread 48 s a slot held; 400 s VMs (18 s a slot) fell 16 s below min_vms.
MIN_STAGGER_STEP_SECONDS = 20.0
#: A VM that cannot have a successor before its end is replaced this soon after it.
EXPIRY_WAKE_SECONDS = 1.0
#: The reconciler function's timeout is ``tick_seconds`` plus this (the construct sets it).
TIMEOUT_BEYOND_TICK_SECONDS = 15.0
#: No call of a tick starts in the invocation's last this many seconds: the last call's answer,
#: under the MicroVMs client's timeouts, and its fenced writes fit in them.
CALL_MARGIN_SECONDS = 6.0
#: How far past ``tick_seconds`` a tick may be woken for an end, a slot without a VM or a VM to
#: park (its overtime): the part of each schedule period a tick watches beyond ``tick_seconds``.
OVERTIME_SECONDS = TIMEOUT_BEYOND_TICK_SECONDS - CALL_MARGIN_SECONDS


def successor_lead(lifetime: float, lead: float, period: float) -> float:
    """How long before a VM's end its successor is due: ``lead``, at most half a lifetime (a
    longer one makes every VM's successor due the moment it runs: two VMs a slot, and a fleet of
    min 1 / max 2 with 600 s VMs fell to 0 RUNNING at each end), but never less than a look (the
    schedule's ``period``) and a start when ``lead`` is that long (a successor is run at the first
    look after it is due: 120 s VMs with 60 s leads fell 58-90 s below min_vms in 13 minutes)."""
    return max(min(lead, lifetime / 2), min(lead, period + SUCCESSOR_START_SECONDS))


def first_spread(lifetime: float, effective_lead: float) -> float:
    """The seconds a fleet's first lifetimes are spread over: half a lifetime, less when a first VM
    would otherwise live less than the lead and a stagger step (its successor is due after the
    fill)."""
    return min(lifetime / 2, lifetime - (effective_lead + MIN_STAGGER_STEP_SECONDS))


def first_lifetime(lifetime: int, effective_lead: float, rank: int, slots: int) -> int:
    """The lifetime of the first VM of the slot at ``rank`` of ``slots`` in the start order:
    ``lifetime - rank * spread / slots``, so VMs started together (a fleet from empty) expire a
    stagger step or more apart and successors that wait for room run one after the other; not
    spread at all when the spread leaves less than a stagger step a slot."""
    if slots < 2 or not 0 <= rank < slots:
        return lifetime
    spread = first_spread(lifetime, effective_lead)
    if spread / slots < MIN_STAGGER_STEP_SECONDS:
        return lifetime
    return int(lifetime - rank * spread / slots)


def look_in_time(period: float, free: float, expires: float) -> bool:
    """Whether the next scheduled look after ``free`` (at most a ``period`` later) still starts a
    successor that runs before ``expires``, even a new image version's slow first launch: no step
    needs to wake for that end. Each wake is a ListMicrovms shared by every fleet (1,800 s VMs woken
    at every end listed 39 % more); with a 10 s start allowed instead of the slowest, min 2 / max 3
    with 300 s VMs fell 5.4 s below min_vms during a new version's first launches."""
    return free + EXPIRY_WAKE_SECONDS + period + SLOW_START_SECONDS <= expires


def replacement_cycle(lifetime: float, lead: float, period: float) -> float:
    """Seconds between two successive VMs of a base slot at rest: a successor starts the effective
    lead before its predecessor's end (the cost estimate's VMs a month)."""
    return max(1.0, lifetime - successor_lead(lifetime, lead, period))
