"""A tick's time, pure: its bounds on a monotonic clock, how long an intent may take, and the one
reducer of a step's ``(at, reason)`` waits to one sleep (``lambdas/reconciler/timing.py``)."""

from __future__ import annotations

from typing import Optional

import pytest

from lambdas.reconciler.core import Reason, Wait
from lambdas.reconciler.timing import (
    MAX_OVERTIME_LISTS,
    MAX_OVERTIME_QUIET_STEPS,
    MIN_WAIT_SECONDS,
    OVERTIME_SPACING_SECONDS,
    STEP_RESERVE_SECONDS,
    Deadline,
    StepResult,
    next_sleep,
)


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.t = now

    def __call__(self) -> float:
        return self.t


def deadline(at: float = 0.0, soft: float = 50.0, hard: float = 59.0, **kw: float) -> tuple[Deadline, Clock]:
    clock = Clock(at)
    return Deadline(clock, soft, hard, **kw), clock  # type: ignore[arg-type]


def result(*waits: tuple[float, Reason], listed: bool = False, booked: bool = False, now: float = 0.0) -> StepResult:
    return StepResult(now, [Wait(at, reason) for at, reason in waits], listed=listed, booked=booked)


@pytest.mark.parametrize("now,waits,expect", [
    (0.0, [], None),  # nothing to wait for: the tick is done
    (0.0, [(3.0, Reason.BUDGET), (9.0, Reason.TRANSITION)], (3.0, False)),  # the soonest
    (10.0, [(10.01, Reason.LOOK)], (MIN_WAIT_SECONDS, False)),  # never a busy loop
    (40.0, [(60.0, Reason.HANDOVER)], None),  # past the soft bound and not worth overtime
    (49.0, [(52.0, Reason.REPLACE)], (3.0, True)),  # worth overtime: a step at 52 s
    (49.0, [(52.0, Reason.SHORT)], (3.0, True)),  # a slot without a VM: the same, though it wakes nothing before
    (49.0, [(52.0, Reason.SHORT), (55.0, Reason.BUDGET)], (6.0, True)),  # not before the step's own wait
    (49.0, [(52.0, Reason.SHORT), (55.0, Reason.LIST)], (3.0, True)),  # a refused list is asked again sooner
    (49.0, [(60.0, Reason.REPLACE)], None),  # past the hard bound
    (10.0, [(30.0, Reason.SHORT)], (20.0, True)),  # only an overtime reason: a step for it, even before
])
def test_waits_reduce_to_one_sleep(now, waits, expect) -> None:
    d, clock = deadline(now)
    clock.t = now
    sleep = next_sleep(result(*waits, now=now), d, now)
    assert (None if sleep is None else (round(sleep.seconds, 6), sleep.overtime)) == expect
    assert d.overtime == bool(expect and expect[1])


def test_overtime_steps_are_spaced_and_counted_apart_by_whether_they_listed() -> None:
    d, clock = deadline(50.5)
    due = [(50.5, Reason.REPLACE)]
    first = next_sleep(result(*due, now=50.5), d, 50.5)
    assert first is not None and first.seconds == MIN_WAIT_SECONDS  # the first one at once
    later = next_sleep(result(*due, listed=True, now=50.5), d, 50.5)
    assert later is not None and later.seconds == OVERTIME_SPACING_SECONDS and d.lists == 1
    booked = next_sleep(result(*due, booked=True, now=50.5), d, 50.5)
    assert booked is not None and booked.seconds == MIN_WAIT_SECONDS and d.quiet == 1  # tokens due sooner
    for _ in range(MAX_OVERTIME_LISTS - 1):
        next_sleep(result(*due, listed=True, now=50.5), d, 50.5)
    assert d.lists == MAX_OVERTIME_LISTS and next_sleep(result(*due, now=50.5), d, 50.5) is None
    quiet, _ = deadline(50.5, overtime=True, quiet=MAX_OVERTIME_QUIET_STEPS - 1)
    assert next_sleep(result(*due, now=50.5), quiet, 50.5) is None


def test_the_bounds_come_from_the_invocations_time_on_the_monotonic_clock() -> None:
    clock = Clock(1_000.0)
    d = Deadline.starting(clock, 50.0, 9.0)  # type: ignore[arg-type]
    assert (d.start, d.soft, d.hard, d.bound) == (1_000.0, 1_050.0, 1_059.0, 1_050.0)
    clock.t = 1_049.0
    assert d.reaches(0.5) and not d.reaches(1.0) and d.left() == 1.0
    d.overtime = True
    assert d.bound == d.hard - STEP_RESERVE_SECONDS and d.reaches(7.5) and not d.reaches(8.5) and d.hard_left() == 10.0


def test_an_intent_is_expected_to_take_as_long_as_the_ticks_second_slowest() -> None:
    d, clock = deadline(0.0, soft=5.0, hard=14.0)
    d.took(7.5)  # one slow answer (or a clock step) stands for no other
    assert d.estimate == 0.0 and d.slowest == 7.5
    clock.t = 13.9
    assert d.allows_intent()
    d.took(2.5)
    d.took(2.5)  # a slow store slows every intent
    assert d.estimate == 2.5 and not d.allows_intent()
    clock.t = 11.5
    assert d.allows_intent()
    d.took(-1.0)  # a clock that stepped back measures nothing
    assert d.estimate == 2.5


@pytest.mark.parametrize("reason,wakes,overtime", [
    (Reason.BACKOFF, True, False), (Reason.PENDING, True, False), (Reason.REPLACE, True, True),
    (Reason.HANDOVER, True, False), (Reason.SHORT, False, True), (Reason.PARK, True, True),
    (Reason.PARK_DUE, False, True), (Reason.OWED, False, True), (Reason.LOOK, True, False),
])
def test_what_each_reason_is_worth(reason, wakes, overtime) -> None:
    d, _ = deadline(0.0)
    sleep: Optional[object] = next_sleep(result((3.0, reason)), d, 0.0)
    assert reason.overtime is overtime
    assert (sleep is not None and not d.overtime) is wakes
