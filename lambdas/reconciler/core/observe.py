"""What the reconciler makes of a look, before it plans: which VMs of ours need a GetMicrovm, which
parked slots' VMs a look missed, and the foreign VMs (strays) it tracks."""

from __future__ import annotations

from typing import Any, Collection, Mapping

from .model import ENDED, LIVE, MEMBER, PARKING, STARTING, WARM, FleetSpec, Intent, IntentKind, Observed, Slot, event
from .transitions import CONSISTENCY_SECONDS, EXPIRY_MARGIN_SECONDS

#: How far before a look a VM of ours may have started and still be the look's lag (clock error).
LOOK_CLOCK_SLACK_SECONDS = 1.0


def to_confirm(slots: Mapping[str, Slot], observed: Mapping[str, Observed], now: float) -> list[str]:
    """VMs of ours GetMicrovm should be asked about before the plan: those a list did not show that
    are old enough for the answer to mean something (a younger one is live until seen: lists lag
    new VMs), and those that ended before their time (the answer has the reason)."""
    out = set()
    for slot in slots.values():
        for vm_id in (slot.microvm_id, slot.retiring_id):
            if not vm_id:
                continue
            vm = observed.get(vm_id)
            current = vm_id == slot.microvm_id
            started = slot.vm_started_at if current else None
            missed = vm is None and (started is None or now - started >= CONSISTENCY_SECONDS)
            early = (vm is not None and vm.state in ENDED and vm.reason is None and current and slot.role != MEMBER
                     and not slot.ending
                     and (started or vm.started_at) + (slot.lifetime or 0) > now + EXPIRY_MARGIN_SECONDS)
            if missed or early:
                out.add(vm_id)
    return sorted(out)


def unlisted_warm(slots: Mapping[str, Slot], shown: Collection[str], listed_at: float, now: float,
                  mine: Collection[str] = ()) -> list[str]:
    """VMs of parked slots, started and not parked yet (no suspend of ours accepted), that a look
    did not show, young enough for that to be the list's lag (older ones are confirmed). A VM this
    tick started (``mine``) after the list, or within the clock slack before it, is waited for by
    the step that started it; one another tick started is this tick's to look at whenever it
    started (that tick may have lost the lease to this one between its run and its look)."""
    return sorted(s.microvm_id for s in slots.values()
                  if s.role == WARM and s.microvm_id and s.microvm_id not in shown
                  and (s.phase == STARTING or (s.phase == PARKING and s.parking_since is None))
                  and s.vm_started_at is not None
                  and (s.vm_started_at < listed_at - LOOK_CLOCK_SLACK_SECONDS or s.microvm_id not in mine)
                  and now - s.vm_started_at < CONSISTENCY_SECONDS)


def stray_is_idle(entry: Mapping[str, Any], vm: Observed, now: float, grace: float) -> bool:
    """The sign that a foreign VM serves nobody: SUSPENDED at every observation for at least
    ``grace`` seconds (a client's session resumes it; a suspended VM nobody resumed for that long
    has no client), and never seen RUNNING or PENDING since it was first seen unowned."""
    return (vm.state == "SUSPENDED" and entry.get("suspended_since") is not None
            and now - float(entry["suspended_since"]) >= grace and int(entry.get("seen", 0)) >= 2)


def track_strays(spec: FleetSpec, foreign: Mapping[str, Observed], known: Mapping[str, Mapping[str, Any]],
                 now: float) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[Intent]]:
    """Foreign VMs of the image (no slot of ours, nor of a sharing fleet, holds them): what the
    ledger remembers of each (first seen, times seen, suspended since), the first sighting told,
    and (opt-in) an end for one that shows no sign of serving."""
    tracked: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    intents: list[Intent] = []
    for vm_id, vm in sorted(foreign.items()):
        entry = dict(known.get(vm_id) or {})
        if not entry:
            entry = {"first_seen": now, "seen": 0, "started_at": vm.started_at}
            events.append(event("stray_vm", microvm_id=vm_id, state=vm.state, age=round(now - vm.started_at, 3),
                                first_seen=now))
        entry["seen"] = int(entry.get("seen", 0)) + 1
        if vm.state == "SUSPENDED":
            if entry.get("suspended_since") is None:
                entry["suspended_since"] = now
        else:
            entry["suspended_since"] = None
        entry["state"] = vm.state
        tracked[vm_id] = entry
        if spec.terminate_strays and stray_is_idle(entry, vm, now, spec.stray_grace_seconds):
            intents.append(Intent(IntentKind.TERMINATE, f"stray-{vm_id}", vm_id, reason="idle_stray"))
    return tracked, events, intents


def foreign_vms(seen: Mapping[str, Observed], own: Collection[str], others: Collection[str]) -> dict[str, Observed]:
    """Live VMs of the image no slot of ours and no sharing fleet's holds."""
    return {i: o for i, o in seen.items() if o.state in LIVE and i not in own and i not in others}


def stray_keys(strays: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """What of the strays is worth a write: which VMs, how often seen (capped), suspended since."""
    return tuple(sorted((k, min(int(v.get("seen", 0)), 2), v.get("suspended_since") is None, v.get("state"))
                        for k, v in strays.items()))
