"""Faults a test arms on an operation: errors, latency, lost responses, crashing apps, failing hooks."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from .exceptions import WireError, internal

KINDS = frozenset(
    {"InsufficientCapacity", "InternalServer", "latency", "crash", "lost_response", "suspend_hook_failure"}
)


@dataclass(eq=False)
class Fault:
    """A fault armed on one operation.

    ``kind``:

    * ``InternalServer``: the call is answered 500 and does nothing (a RunMicrovm makes no VM);
    * ``InsufficientCapacity``: 500 ``InsufficientCapacityException``, nothing done;
    * ``lost_response``: the operation is carried out, then answered 500, as when a response is
      lost on the way back;
    * ``latency``: ``seconds`` of real time before answering (for client timeouts);
    * ``crash``: the app of the VM a RunMicrovm starts exits ``after_seconds`` later (``reason``,
      default the measured ``Container Stopped with Exit Code: 1``);
    * ``suspend_hook_failure`` (on SuspendMicrovm): the VM's ``/suspend`` hook answers ``status``
      (default 500), which terminates the VM as measured.

    ``times`` (None: every call), ``probability`` (seeded by the emulator's ``seed``) and, for
    ``crash``, ``image`` (an image ARN) narrow which calls it hits.
    """

    operation: str
    kind: str
    times: Optional[int] = 1
    probability: float = 1.0
    seconds: float = 0.0
    retry_after: int = 1
    after_seconds: float = 0.0
    reason: Optional[str] = None
    image: Optional[str] = None
    status: int = 500

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {', '.join(sorted(KINDS))}")
        if self.times is not None and (not isinstance(self.times, int) or self.times < 1):
            raise ValueError(f"times: {self.times!r} must be a whole number >= 1 or None (every call)")
        if not (isinstance(self.probability, (int, float)) and 0 <= self.probability <= 1):
            raise ValueError(f"probability: {self.probability!r} is not between 0 and 1")
        for name in ("seconds", "after_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value != value or value < 0 or math.isinf(value):
                raise ValueError(f"{name}: {value!r} is not a finite number of seconds >= 0")
        if not isinstance(self.retry_after, int) or self.retry_after < 0:
            raise ValueError(f"retry_after: {self.retry_after!r} must be a whole number of seconds >= 0")
        if self.kind == "suspend_hook_failure" and not 400 <= self.status <= 599:
            raise ValueError(f"status: {self.status} is not an HTTP error status (400-599)")


class Faults:
    """The armed faults of one emulator. Not thread-safe: the backend holds its lock."""

    def __init__(self, seed: Optional[int]) -> None:
        self._faults: list[Fault] = []
        self._rng = random.Random(None if seed is None else seed * 31 + 17)

    def arm(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def disarm(self, fault: Fault) -> None:
        if fault in self._faults:
            self._faults.remove(fault)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def before(self, operation: str) -> float:
        """Raise the first error fault armed on ``operation``; return any latency to add."""
        delay = 0.0
        for fault in list(self._faults):
            if fault.operation != operation or fault.kind not in ("latency", "InsufficientCapacity", "InternalServer"):
                continue
            if not self._fires(fault):
                continue
            if fault.kind == "latency":
                delay += fault.seconds
            elif fault.kind == "InsufficientCapacity":
                raise WireError("InsufficientCapacityException", "Insufficient capacity. Retry the request later.")
            else:
                raise internal(fault.retry_after)
        return delay

    def take(self, operation: str, kind: str, image: Optional[str] = None) -> Optional[Fault]:
        """The first armed fault of this kind that fires on this call (using up one of its times)."""
        for fault in list(self._faults):
            if fault.operation == operation and fault.kind == kind and fault.image in (None, image) and self._fires(fault):
                return fault
        return None

    def _fires(self, fault: Fault) -> bool:
        if fault.probability < 1.0 and self._rng.random() >= fault.probability:
            return False
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                self.disarm(fault)
        return True
