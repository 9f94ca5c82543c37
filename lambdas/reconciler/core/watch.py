"""The parked-slot watch's decisions: when the next look is due, and which parked VMs it looks at
first. Plain numbers in, plain answers out (the shell, :mod:`..tick` and :mod:`..looks`, acts).

A tick lives ``tick_seconds`` (50 s) of a one-minute schedule; a take in the ten seconds after it
waited for the next tick's list (a third of the refills measured at 10-37 fleets over 10 s came
from there). So the watch goes on past ``tick_seconds``, into the invocation's overtime, until
the last moment a take it sees can still be acted on (a list and a run before the invocation's
hard bound): the next tick's list covers the rest.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

#: The last watch of a tick is not worth a step closer than this to the one before it.
MIN_WATCH_GAP_SECONDS = 1.0


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
