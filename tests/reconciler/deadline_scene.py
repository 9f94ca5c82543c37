"""A base VM's end at max_vms, staged through the handler: min 1 / warm 1 / max 2 with the parked
VM taken by a client before a tick that starts shortly before the base VM's end, and what the
emulator saw of it (shared by the overtime, paid-successor and deadline-step scenarios)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

from .harness import RECONCILER_CALLER, deployed_fleet

ENDED = ("TERMINATING", "TERMINATED")
NO_HEADROOM = {"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2", "IDLE_SECONDS": ""}


def first_in(vm: dict[str, Any], states: tuple[str, ...]) -> float:
    return next(at for at, state, _ in vm["history"] if state in states)


def taken_before_a_base_end(aws: str, stack: contextlib.ExitStack, monkeypatch: Any, before: float,
                            arm: Optional[Callable[[Any], None]] = None) -> tuple[Any, dict[str, Any], float, Any]:
    """min 1, warm 1, max 2, the parked VM taken by a client 3 minutes before a tick that starts
    ``before`` s ahead of the base VM's end as the reconciler counts it (its lifetime from the VM's
    start; rayd counts it from its ``/run``, when the VM runs): (fleet, the base VM, the tick's
    start, its invocation)."""
    fleet = stack.enter_context(deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "2",
                                                         "IDLE_SECONDS": ""}, pending_seconds=2))
    fleet.every_minute(monkeypatch, 3)
    suspended = fleet.live(("SUSPENDED",))
    assert len(suspended) == 1 and len(fleet.live(("RUNNING",))) == 1
    running = fleet.live(("RUNNING",))[0]["microvmId"]
    (base,) = [vm for vm in fleet.emulator.microvms_ever() if vm["microvmId"] == running]
    fleet.clock.advance(counted_end(base) - before - 180.0 - fleet.clock.now())
    client_of(fleet).resume_microvm(microvmIdentifier=suspended[0]["microvmId"])
    fleet.every_minute(monkeypatch, 3)
    assert fleet.emulator.state_of(suspended[0]["microvmId"]) == "RUNNING"  # still the client's
    if arm is not None:
        arm(fleet)
    start = fleet.clock.now()
    invocation = fleet.invoke(monkeypatch)
    (base,) = [vm for vm in fleet.emulator.microvms_ever() if vm["microvmId"] == base["microvmId"]]
    return fleet, base, start, invocation


def client_of(fleet: Any) -> Any:
    """A client of the fleet's image that is not the reconciler (the product's client, a session)."""
    return fleet.emulator.direct_client(caller="client")


def counted_end(base: dict[str, Any]) -> float:
    """A base VM's end as the reconciler counts it: its lifetime from the VM's start, where rayd
    counts it from its ``/run``, when the VM runs."""
    return float(base["servesUntil"]) - (first_in(base, ("RUNNING",)) - base["startedAt"])


def runs_since(fleet: Any, since: float, ok: Optional[bool] = None) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == "RunMicrovm" and r.caller == RECONCILER_CALLER
            and r.time >= since and (ok is None or (r.status < 300) == ok)]


def terminates(fleet: Any, since: float) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.operation == "TerminateMicrovm"
            and r.time >= since]


def lists_since(fleet: Any, since: float, until: float = float("inf")) -> list[Any]:
    return [r for r in fleet.emulator.requests if r.operation == "ListMicrovms" and r.caller == RECONCILER_CALLER
            and since <= r.time <= until]


def settle(fleet: Any, monkeypatch: Any, tick_start: float) -> None:
    """The schedule's next tick (60 s after ``tick_start``) and one more."""
    fleet.clock.advance(max(0.0, tick_start + 60 - fleet.clock.now()))
    fleet.every_minute(monkeypatch, 2)


def gone_at(vm: dict[str, Any]) -> float:
    return next((at for at, state, _ in vm["history"] if state in ENDED), float("inf"))


def live_at(fleet: Any, at: float, but: str = "") -> int:
    """VMs of the fleet's image alive (born, not ending) at ``at``, ``but`` one."""
    return sum(1 for vm in fleet.emulator.microvms_ever() if vm["imageArn"] == fleet.image and vm["microvmId"] != but
               and vm["history"][0][0] <= at < gone_at(vm))


def no_headroom_fleet(aws: str, stack: contextlib.ExitStack, monkeypatch: Any,
                      before: Optional[Callable[[Any], None]] = None,
                      env: Optional[dict[str, str]] = None, minutes: int = 2) -> Any:
    fleet = stack.enter_context(deployed_fleet(aws, env={**NO_HEADROOM, **(env or {})}, pending_seconds=2))
    if before is not None:
        before(fleet)
    fleet.every_minute(monkeypatch, minutes)
    assert len(fleet.live(("RUNNING",))) == int(fleet.env["MIN_VMS"])
    return fleet


def ends_ahead(fleet: Any) -> list[tuple[float, str]]:
    live = {vm["microvmId"] for vm in fleet.live()}
    return sorted((vm["servesUntil"], vm["microvmId"])
                  for vm in fleet.emulator.microvms_ever() if vm["microvmId"] in live)


def to_before_end(fleet: Any, before: float) -> tuple[float, str, float]:
    """Move the clock to ``before`` seconds ahead of the next end: (end, its VM, the tick's start)."""
    end, vm_id = ends_ahead(fleet)[0]
    fleet.clock.advance(end - before - fleet.clock.now())
    return end, vm_id, fleet.clock.now()


def runs_over_max(fleet: Any, since: float) -> list[tuple[float, int]]:
    """Our RunMicrovm calls since ``since`` that went out with ``MAX_VMS`` others of the image
    already live (ground truth): (seconds after ``since``, others live)."""
    top = int(fleet.env["MAX_VMS"])
    return [(round(r.time - since, 2), others) for r in runs_since(fleet, since, ok=True)
            if (others := live_at(fleet, r.time + 1e-6, but=r.microvm_id)) >= top]


def take_parked(fleet: Any, n: int) -> None:
    """A client resumes (takes) every parked VM at each look (``support._drive``'s ``each``)."""
    for vm in fleet.live(("SUSPENDED",)):
        client_of(fleet).resume_microvm(microvmIdentifier=vm["microvmId"])
