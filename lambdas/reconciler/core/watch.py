"""The parked-slot watch's decisions: which VMs it looks at, when the next look is due, in which
order, and what a look means. Plain values in, plain answers out (the shell, :mod:`..tick` and
:mod:`..looks`, acts).

A tick lives ``tick_seconds`` (50 s) of a one-minute schedule; a take in the ten seconds after it
waited for the next tick's list (a third of the refills measured at 10-37 fleets over 10 s came
from there). So the watch goes on past ``tick_seconds``, into the invocation's overtime, until
the last moment a take it sees can still be acted on (a list and a run before the invocation's
hard bound): the next tick's list covers the rest.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from .model import PARKED, PARKING, WARM, FleetSpec, Observed, Slot
from .transitions import PARK_GRACE_SECONDS, Change, warm_seen

#: The last watch of a tick is not worth a step closer than this to the one before it.
MIN_WATCH_GAP_SECONDS = 1.0
#: A watched VM read in one of these states is where our suspend left it: no client took it.
AT_REST = frozenset({"SUSPENDING", "SUSPENDED"})


def watched_vms(slots: Iterable[Slot]) -> dict[str, Slot]:
    """The VMs the watch looks at, by VM id (in id order), with their slots: every parked slot's
    VM, and every one whose suspend the service accepted (PARKING, ``parking_since`` set, no
    doubt) -- a client can take it as soon as it lands. Left to the next plan, a refill parked by
    a step of the tick went unwatched for the rest of it (up to 55 s; measured at 100 fleets: 15%
    of the seconds a take waited for its first look)."""
    chosen = [s for s in slots if s.role == WARM and s.microvm_id
              and (s.phase == PARKED or (s.phase == PARKING and s.parking_since is not None
                                         and s.park_doubt_since is None))]
    return {s.microvm_id: s for s in sorted(chosen, key=lambda s: s.microvm_id or "") if s.microvm_id}


def watch_news(slot: Slot, vm: Observed, now: float) -> bool:
    """Whether a watch's read of ``slot``'s VM is worth a fresh list and a plan: any state but
    :data:`AT_REST`, except a parking VM read awake within the park grace (a read that has not
    caught up with our suspend: the plan (:func:`.transitions.warm_seen`) would wait for the grace too)."""
    if vm.state in AT_REST:
        return False
    return not (slot.phase == PARKING and vm.state in ("PENDING", "RUNNING") and slot.parking_since is not None
                and now - slot.parking_since <= PARK_GRACE_SECONDS)


def parked_by_watch(spec: FleetSpec, slot: Slot, vm: Observed, now: float) -> Optional[Change]:
    """A watch's read that shows a parking slot's VM SUSPENDED: our suspend landed, and the slot is
    parked (``vm_parked``), written at once: a client's take after it is then a take to the next
    read, not a suspend the reads have not caught up with for the park grace (30 s). None: the
    read changes nothing."""
    if slot.phase != PARKING or vm.state != "SUSPENDED" or vm.microvm_id != slot.microvm_id:
        return None
    return warm_seen(spec, slot, vm, now)


def next_watch(looked: float, now: float, period: float, last: float) -> Optional[float]:
    """When the next look at the parked slots' VMs is due: ``period`` after the last one that read
    them (``looked``: a watch or a fresh list; a step that read nothing new does not put it off),
    at ``now`` if that is past, or ``last`` (the latest moment a watch can still act on a take:
    the tick's hard bound less a step's reserve) when the period would pass it and ``last`` is
    at least :data:`MIN_WATCH_GAP_SECONDS` after the last look; None: no more watches in this
    tick (or no watch at all, ``period`` 0)."""
    if period <= 0 or now >= last:
        return None
    due = max(looked + period, now)
    if due <= last:
        return due
    if last - looked >= MIN_WATCH_GAP_SECONDS:
        return last
    return None


def watch_order(vm_ids: Iterable[str], last_read: Mapping[str, float]) -> list[str]:
    """The parked VMs in the order the watch looks at them: the one read longest ago first (never
    read: first of all), ties in the order given. When the shared bucket runs dry in the middle of
    a watch, the next one starts with the VMs this one did not reach, so every parked VM is looked
    at in turn instead of the first ones again and again."""
    return sorted(vm_ids, key=lambda vm: last_read.get(vm, float("-inf")))
