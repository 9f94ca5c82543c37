"""The interfaces the reconciler's shell talks through: the ledger, the shared budget, what it tells,
and the MicroVMs client. Each has two implementations or more (DynamoDB and memory stores, Powertools
and plain EMF telemetry, the boto3 client and the emulator's), all of them structural: nothing
inherits from these classes."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Protocol, Union

from .budget import Deferral, Granted
from .core import FleetSpec, Ready, Slot

Decision = Union[Granted, Deferral]
Stats = dict[str, Any]
DeadLetters = Callable[[dict[str, Any]], None]


class Ledger(Protocol):
    """The slot ledger with its fenced tick lease (:mod:`.ledger`)."""

    def acquire_tick(self, fleet: str, holder: str, now: float, lease_seconds: float,
                     tick_until: Optional[float] = None) -> Optional[int]: ...

    def busy_until(self, fleet: str) -> Optional[float]: ...

    def release_tick(self, fleet: str, holder: str) -> None: ...

    def load(self, fleet: str) -> tuple[dict[str, Slot], Stats]: ...

    def load_vm_ids(self, fleets: Iterable[str]) -> set[str]: ...

    def write(self, fleet: str, fence: Optional[int], puts: Iterable[Slot] = (), deletes: Iterable[str] = (),
              meta: Optional[dict[str, Any]] = None, facts_gone: Iterable[str] = ()) -> None: ...

    def add_stats(self, fleet: str, **deltas: int) -> None: ...

    def put_fact(self, fleet: str, fact: Ready) -> None: ...


class Budget(Protocol):
    """The control-plane budget every reconciler of the account shares (:mod:`.budget`)."""

    def shape(self, operation: str) -> tuple[float, float]: ...

    def acquire(self, operation: str, now: float, cost: int = 1, horizon: float = 0.0,
                asker: Optional[str] = None, horizon_cap: Optional[float] = None) -> Decision: ...

    def backoff(self, operation: str, until: float, reason: str) -> None: ...


class Telemetry(Protocol):
    """The timeline and the metrics (:mod:`.telemetry`)."""

    def event(self, fleet: str, event: dict[str, Any]) -> None: ...

    def metric(self, fleet: str, name: str, value: float, operation: Optional[str] = None) -> None: ...

    def flush(self) -> None: ...


class MicrovmsApi(Protocol):
    """The ``lambda-microvms`` calls the reconciler makes (a boto3 client, or the emulator's)."""

    def run_microvm(self, **kwargs: Any) -> dict[str, Any]: ...

    def get_microvm(self, **kwargs: Any) -> dict[str, Any]: ...

    def list_microvms(self, **kwargs: Any) -> dict[str, Any]: ...

    def suspend_microvm(self, **kwargs: Any) -> dict[str, Any]: ...

    def resume_microvm(self, **kwargs: Any) -> dict[str, Any]: ...

    def terminate_microvm(self, **kwargs: Any) -> dict[str, Any]: ...


class Server(Protocol):
    """The fleet's server (:mod:`.server`, a function of its own): asked to serve a base slot's VM
    (the product's agent host started on it) or to warm a parked slot's, it answers in the ledger
    (:class:`.core.Ready`). ``ask`` only hands the request over; it raises when it could not."""

    def ask(self, request: dict[str, Any]) -> None: ...


class FleetState(Protocol):
    """What the fleet is at each tick (:mod:`.fleet_source`: the product's recipe): the spec the
    core plans with and the RunMicrovm parameters of a slot, or why there is none now."""

    def desired(self) -> Union[tuple[FleetSpec, Callable[[Slot], dict[str, Any]]], str]: ...


class Shell(Protocol):
    """What the shell's mechanisms (admission, looks, calls, letters) share: the fleet's stores and
    clients, the shared clock, and the calls that count, tell and write."""

    spec: FleetSpec
    ledger: Ledger
    budget: Budget
    telemetry: Telemetry
    fence: Optional[int]
    api_calls: int

    def now(self) -> float:
        """The service's time (VM start times are the service's)."""

    def api(self, method: str, **kwargs: Any) -> Any:
        """One MicroVMs call, counted."""

    def emit(self, event: dict[str, Any]) -> None:
        """One timeline line."""

    def metric(self, name: str, value: float, operation: Optional[str] = None) -> None: ...

    def write(self, slots: dict[str, Slot], changed: list[Slot], meta: Optional[dict[str, Any]] = None) -> None:
        """Changed slots into the ledger (fenced), and into ``slots``."""

    def pause(self, seconds: float) -> None:
        """Sleep within the tick."""
