"""A tick's time: its deadline on a monotonic clock, and the one reducer of its waits to one sleep.

The invocation's remaining time (``context.get_remaining_time_in_millis()``, read once when the
tick starts) is measured on a monotonic clock from then on: a step of the wall clock (NTP) neither
ends a tick early nor runs it past the invocation. Two bounds:

* **soft**: ``tick_seconds`` after the start (or the hard bound, if sooner). A step is worth taking
  before it for any wait.
* **hard**: the invocation's end less :data:`.core.lifetimes.CALL_MARGIN_SECONDS`. Past the soft
  bound, only a wait whose reason is worth overtime (:attr:`.core.Reason.overtime`: a slot without
  a VM, a VM ending with nothing to replace it, a parked slot's VM to park, the parked slots'
  watch) wakes a step, and no call starts past the hard bound, nor an intent expected to end
  past it.

Waits are :class:`.core.Wait` pairs ``(at, reason)`` on the shared (service's) clock, reduced by
:func:`next_sleep`; nothing tells waits apart by their value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from .core import Reason, Wait

#: The shortest sleep between steps: float edges of the buckets must not turn into a busy loop.
MIN_WAIT_SECONDS = 0.05
#: Steps a tick may take past its soft bound that list (ListMicrovms is shared by every fleet: a
#: list that still shows an ended VM, a refused run), and that do not list (they wait for tokens
#: they booked, or run and park on the step's list): cost bounds of the overtime. Measured: at 36
#: fleets the last runs' tokens come due just past a fleet's deadline; three steps that waited,
#: then five runs and the parking, fill the fleet in its overtime.
MAX_OVERTIME_LISTS = 3
MAX_OVERTIME_QUIET_STEPS = 10
#: Overtime steps come at least this far apart, unless tokens the tick booked come due sooner.
OVERTIME_SPACING_SECONDS = 0.5
#: In the overtime a step's own waits and its reservations of the shared budget reach no closer
#: than this to the hard bound: a token due there is left unused by a tick that ends first
#: (measured: reaching the hard bound itself made 100 fleets converge 1.3 s later, seed 3).
STEP_RESERVE_SECONDS = 2.0
#: Reasons that wake a step. The others only make a step worth taking past the soft bound, when
#: the step's own waits come later than it.
_WAKES = frozenset(set(Reason) - {Reason.SHORT, Reason.PARK_DUE, Reason.OWED})
#: Waits a step past the soft bound does not wait for: a list the service refused is asked again
#: at the overtime's spacing (the overtime's lists are bounded apart).
_NOT_BINDING = frozenset({Reason.LIST})


@dataclass
class Deadline:
    """One invocation's bounds on the monotonic ``clock``, and how long an intent takes."""

    clock: Callable[[], float]
    soft: float
    hard: float
    start: float = 0.0
    overtime: bool = False  # a step past the soft bound was scheduled: reservations may reach hard
    lists: int = 0  # overtime steps that listed
    quiet: int = 0  # overtime steps that did not
    estimate: float = 0.0  # how long the next intent may take: the tick's second slowest
    slowest: float = 0.0

    @classmethod
    def starting(cls, clock: Callable[[], float], tick_seconds: float, overtime_seconds: float) -> Deadline:
        start = clock()
        return cls(clock, start + tick_seconds, start + tick_seconds + max(0.0, overtime_seconds), start)

    @property
    def last(self) -> float:
        """The latest a step may still begin and act: the hard bound less a step's reserve (never
        before the soft bound)."""
        return max(self.soft, self.hard - STEP_RESERVE_SECONDS)

    @property
    def bound(self) -> float:
        """What a wait, a reservation or a page may reach now: the soft bound, or in the overtime
        :attr:`last`."""
        return self.last if self.overtime else self.soft

    def left(self) -> float:
        return self.bound - self.clock()

    def reaches(self, seconds: float) -> bool:
        """Whether something ``seconds`` from now still comes before the bound."""
        return self.clock() + seconds < self.bound

    def allows_intent(self) -> bool:
        """Whether an intent expected to take as long as the tick's second slowest ends by the hard
        bound: a store answering every call 2.5 s late slows every intent (intents of 10 s,
        stopped in time), one slow answer stands for no other."""
        return self.clock() + self.estimate <= self.hard

    def took(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.estimate = max(self.estimate, min(seconds, self.slowest))
        self.slowest = max(self.slowest, seconds)

    def hard_left(self) -> float:
        return self.hard - self.clock()


@dataclass
class StepResult:
    """What a step leaves: its waits (``(at, reason)`` on the shared clock, at ``now``) and whether
    it listed (overtime steps that list and steps that do not are bounded apart)."""

    now: float
    waits: list[Wait] = field(default_factory=list)
    listed: bool = False
    booked: bool = False  # tokens of the shared budget reserved for a later step

    def add(self, at: float, reason: Reason) -> None:
        self.waits.append(Wait(at, reason))


def wakes(reason: Reason) -> bool:
    """Whether a wait for ``reason`` wakes a step (the others only make one worth overtime)."""
    return reason in _WAKES


def soonest(waits: Iterable[Wait], overtime: bool = False) -> Optional[float]:
    """The first wait that wakes a step (``overtime``: that is worth a step past the soft bound)."""
    ats = [w.at for w in waits if (w.reason.overtime if overtime else w.reason in _WAKES)]
    return min(ats) if ats else None


@dataclass(frozen=True)
class Sleep:
    """The sleep before the next step; ``overtime``: that step comes past the soft bound."""

    seconds: float
    overtime: bool = False


def next_sleep(result: StepResult, deadline: Deadline, now: float) -> Optional[Sleep]:
    """The sleep before the next step, or None: the tick is done.

    Before the soft bound: until the soonest wait. Past it: until the soonest wait worth overtime,
    not before the step's own soonest wait (a refused run's backoff, the shared budget), at most
    :data:`MAX_OVERTIME_LISTS` steps that list and :data:`MAX_OVERTIME_QUIET_STEPS` that do not,
    :data:`OVERTIME_SPACING_SECONDS` apart (unless tokens this tick booked come due sooner), and
    never past the hard bound."""
    if deadline.overtime:
        if result.listed:
            deadline.lists += 1
        else:
            deadline.quiet += 1
    wake = soonest(result.waits)
    sleep = None if wake is None else max(MIN_WAIT_SECONDS, wake - now)
    if sleep is not None and deadline.clock() + sleep <= deadline.soft:
        return Sleep(sleep)
    due = soonest(result.waits, overtime=True)
    if due is None or deadline.lists >= MAX_OVERTIME_LISTS or deadline.quiet >= MAX_OVERTIME_QUIET_STEPS:
        return None
    first = not (deadline.lists or deadline.quiet)
    spacing = MIN_WAIT_SECONDS if first or result.booked else OVERTIME_SPACING_SECONDS
    binding = soonest(w for w in result.waits if w.reason not in _NOT_BINDING)
    sleep = max(spacing, due - now, binding - now if binding is not None else 0.0)
    if deadline.clock() + sleep > deadline.hard:
        return None
    deadline.overtime = True
    return Sleep(sleep, overtime=True)
