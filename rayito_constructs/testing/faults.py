"""Faults a test arms on an operation: errors, latency, lost responses, crashing apps, failing hooks."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from .exceptions import WireError, internal

KINDS = frozenset(
    {"InsufficientCapacity", "InternalServer", "AccessDenied", "Validation", "Conflict", "latency", "crash",
     "lost_response", "suspend_hook_failure", "list_lag"}
)
#: Error faults: the request is refused before anything is done (status, code, default message).
ERRORS = {
    "InsufficientCapacity": (500, "InsufficientCapacityException", "Insufficient capacity. Retry the request later."),
    "InternalServer": (500, "InternalServerException", "An internal error occurred."),
    # As IAM answers a role without the action on the image (GT section 1, Notes Q90).
    "AccessDenied": (403, "AccessDeniedException",
                     "User: {caller} is not authorized to perform: lambda:{operation} on resource: {resource}"),
    "Validation": (400, "ValidationException", "1 validation error detected"),
    # A client token reused with other parameters, where the service does not name the VM.
    "Conflict": (409, "ConflictException", "The client token was already used with different parameters."),
}


@dataclass(eq=False)
class Fault:
    """A fault armed on one operation.

    ``kind``:

    * ``InternalServer``: the call is answered 500 and does nothing (a RunMicrovm makes no VM);
    * ``InsufficientCapacity``: 500 ``InsufficientCapacityException``, nothing done;
    * ``AccessDenied``: 403 ``AccessDeniedException`` with the measured message (a role without
      the action on the image, GT section 1 Q90), nothing done;
    * ``Validation``: 400 ``ValidationException`` (``message``), nothing done;
    * ``Conflict``: 409 ``ConflictException`` that names no VM (no ``resourceId``), nothing done;
    * ``list_lag`` (on ListMicrovms): the list omits VMs younger than ``seconds`` (a replica that
      lags; the measured default lag is per read, this one is for a test's "not listed yet");
    * ``lost_response``: the operation is carried out, then answered 500, as when a response is
      lost on the way back;
    * ``latency``: ``seconds`` of real time before answering (for client timeouts);
    * ``crash``: the app of the VM a RunMicrovm starts exits ``after_seconds`` later (``reason``,
      default the measured ``Container Stopped with Exit Code: 1``);
    * ``suspend_hook_failure`` (on SuspendMicrovm): the VM's ``/suspend`` hook answers ``status``
      (default 500), which terminates the VM as measured.

    ``times`` (None: every call), ``probability`` (seeded by the emulator's ``seed``),
    ``caller`` (the access key id a request is signed with) and, for ``crash``, ``image`` (an
    image ARN) narrow which calls it hits. ``message`` replaces an error's default message.
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
    message: Optional[str] = None
    caller: Optional[str] = None

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
        if self.kind == "list_lag" and self.operation != "ListMicrovms":
            raise ValueError(f"operation: list_lag is a fault of ListMicrovms, not {self.operation!r}")
        for name in ("message", "caller"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: {value!r} must be a string or None")


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

    def before(self, operation: str, caller: Optional[str] = None, resource: str = "*") -> float:
        """Raise the first error fault armed on ``operation`` (for this caller); return any latency
        to add."""
        delay = 0.0
        for fault in list(self._faults):
            if fault.operation != operation or (fault.kind != "latency" and fault.kind not in ERRORS):
                continue
            if fault.caller not in (None, caller) or not self._fires(fault):
                continue
            if fault.kind == "latency":
                delay += fault.seconds
            elif fault.kind == "InternalServer":
                error = internal(fault.retry_after)
                if fault.message:
                    error = WireError(error.code, fault.message, retryAfterSeconds=fault.retry_after)
                raise error
            else:
                status, code, message = ERRORS[fault.kind]
                text = fault.message or message.format(caller=caller or "unknown", operation=operation, resource=resource)
                raise WireError(code, text, status=status)
        return delay

    def take(self, operation: str, kind: str, image: Optional[str] = None,
             caller: Optional[str] = None) -> Optional[Fault]:
        """The first armed fault of this kind that fires on this call (using up one of its times)."""
        for fault in list(self._faults):
            if (fault.operation == operation and fault.kind == kind and fault.image in (None, image)
                    and fault.caller in (None, caller) and self._fires(fault)):
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
