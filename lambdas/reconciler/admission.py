"""Admission by the shared control-plane budget: one token per call, reservations for a batch ahead,
and the shared backoffs the service's refusals set for every reconciler of the account."""

from __future__ import annotations

from dataclasses import dataclass, field


from .budget import Deferral, Granted
from .core import REFUSED_FOR_ROOM, SHARED_BACKOFFS, Failure
from .ports import Decision, Shell
from .timing import Deadline

#: Tokens this close to due are due (float sums of 1/rate at the edge of a bucket).
EPSILON = 1e-6
#: The longest backoff a 429's ``retryAfterSeconds`` may set for every fleet (the service's value
#: was never measured; an artificial quota answered about 1,000 s).
MAX_RETRY_AFTER_SECONDS = 60.0
#: The memory quota's 402 backs every reconciler off this long; InsufficientCapacity (not
#: measured) is retried soon, by every reconciler together.
QUOTA_BACKOFF_SECONDS = 60.0
CAPACITY_BACKOFF_SECONDS = 5.0
#: The shared backoffs that say the account has no room for a new VM (their reasons).
ROOM_BACKOFFS = ("backoff:memory_quota", "backoff:insufficient_capacity")
#: A step that wakes for tokens it reserved acts on a look at most this old (Looks): reservations
#: reach no further than this (or the tick's bound).
RESERVE_HORIZON_SECONDS = 2.0


@dataclass
class Admission:
    """One tick's tokens: those granted for a later moment (reserved: operation -> [due, count]),
    the calls a step had no token for (asked first by the next step), and when the account's
    "no room" ends (it outlives the tick: ``Reconciler.no_room_until``)."""

    shell: Shell
    deadline: Deadline
    horizon: float = RESERVE_HORIZON_SECONDS
    held: dict[str, list[float]] = field(default_factory=dict)
    demand: dict[str, int] = field(default_factory=dict)
    no_room_until: float = float("-inf")

    def admit(self, operation: str, now: float, want: int = 1) -> Decision:
        """One token for ``operation``. When a batch of ``want`` calls is ahead and the budget is
        busy, they are reserved at a definite time instead of competing on every refill (with many
        reconcilers on one budget, that removes a thundering herd of ListMicrovms)."""
        held = self.held.get(operation)
        if held and held[1] >= 1:
            if held[0] <= now + EPSILON:
                held[1] -= 1
                return Granted(operation, 1)
            return Deferral(operation, held[0] - now, "reserved")  # uncovered: a step that runs before the RunMicrovm tokens it reserved come due; not timed by a test
        interval, burst_f = self.shell.budget.shape(operation)
        cost = max(1, min(want, int(burst_f)))
        # Never reserve past the tick's bound: the tick would end holding tokens nobody uses (a
        # batch's tokens are due up to (cost - 1) intervals after the horizon).
        reach = max(0.0, self.deadline.left() - 1 - (cost - 1) * interval)
        decision = self.shell.budget.acquire(operation, now, cost=cost, horizon=min(self.horizon, reach),
                                             asker=self.shell.spec.fleet, horizon_cap=reach)
        if isinstance(decision, Deferral):
            if decision.reason in ROOM_BACKOFFS:  # another fleet (or an earlier tick) met the refusal
                self.no_room_until = max(self.no_room_until, now + decision.retry_after_seconds)
            self.shell.metric("Deferrals", 1, operation=decision.operation)
            return decision
        if decision.wait_seconds <= EPSILON:
            if decision.cost > 1:
                self.held[operation] = [now, decision.cost - 1]
            return Granted(operation, 1)
        self.held[operation] = [now + decision.wait_seconds, decision.cost]
        return Deferral(operation, decision.wait_seconds, "reserved")

    def keep(self, operation: str, now: float) -> None:
        """A token :meth:`admit` handed out that the step does not spend now: held for it."""
        self.held.setdefault(operation, [now, 0])[1] += 1

    def ready(self, now: float) -> bool:
        """Whether reserved tokens are due now."""
        return any(due <= now + EPSILON and n >= 1 for due, n in self.held.values())

    def parking_only(self, now: float) -> bool:
        """Whether the only tokens due now are SuspendMicrovm's (parking VMs of our own)."""
        due = [op for op, (at, n) in self.held.items() if at <= now + EPSILON and n >= 1]
        return bool(due) and all(op == "SuspendMicrovm" for op in due)

    def booked(self) -> list[float]:
        """When reserved tokens come due."""
        return [at for at, n in self.held.values() if n >= 1]

    def drop_due(self, now: float) -> None:
        """Tokens that came due for this step and were not spent are given up: spent later they
        would land on top of other reconcilers' on-time calls, a burst above the service quota."""
        for operation in [op for op, (due, _) in self.held.items() if due <= now + EPSILON]:
            del self.held[operation]

    def refused(self, operation: str, failure: Failure, now: float) -> Deferral:
        """A service error about rate or room becomes a shared backoff every reconciler sees; told
        (``api_error``) either way."""
        code = failure.code
        retry_after = min(MAX_RETRY_AFTER_SECONDS, float(failure.retry_after or 1))
        if code in SHARED_BACKOFFS:
            self.held.pop(operation, None)  # reserved tokens are worthless once the service says no
        if code == "ThrottlingException":
            self.shell.metric("Throttles", 1, operation=operation)
            self.shell.budget.backoff(operation, now + retry_after, "throttled")
        elif code in REFUSED_FOR_ROOM:
            quota = code == "ServiceQuotaExceededException"
            retry_after = QUOTA_BACKOFF_SECONDS if quota else CAPACITY_BACKOFF_SECONDS
            self.shell.budget.backoff(operation, now + retry_after, "memory_quota" if quota else "insufficient_capacity")
            self.no_room_until = max(self.no_room_until, now + retry_after)
        self.shell.emit({"event": "api_error", "operation": operation, "code": code,
                         "error_message": failure.message or None, "retry_after": retry_after})
        return Deferral(operation, retry_after, f"error:{code}")
