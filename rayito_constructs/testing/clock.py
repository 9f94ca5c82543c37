"""Time for the emulator: the wall clock, or a virtual clock that moves only when told to.

Everything in the emulator reads its clock: lifecycles, idle policies, rate-limit refills,
lingering, page tokens, the HTTP ``Date`` header, and the time a throttled request is held.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from typing import Iterator

#: The last second ``datetime`` can show (9999-12-31T23:59:59Z): timestamps on the wire must fit.
LATEST = 253_402_300_799.0


class RealClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep_until(self, when: float) -> None:
        """Block the calling thread until ``when`` (a request the service holds)."""
        wait = when - time.time()
        if wait > 0:
            time.sleep(wait)


class VirtualClock:
    """Time that moves only when told to: ``advance(seconds)``. Thread-safe.

    ``sleep_until(when)`` (what a held request does) moves the clock forward to ``when`` unless it
    is already later: on one timeline, a call the service holds for a second takes a second, and
    twenty calls held together until the same moment move the clock once, not twenty times.
    A simulation with its own scheduler (``benchmarks/reconciler.py``) overrides ``sleep_until``
    so that only the held caller waits.
    """

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        start = float(start)
        if not 0 <= start <= LATEST:
            raise ValueError(f"start: {start} is not between 0 and {LATEST:.0f} (year 9999)")
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (finite, >= 0); returns the new time."""
        seconds = float(seconds)
        if math.isnan(seconds) or seconds < 0:
            raise ValueError(f"seconds: {seconds} is not allowed: time only moves forward")
        with self._lock:
            if self._now + seconds > LATEST:
                raise ValueError(f"seconds: {seconds} would move the clock past year 9999 (the wire's timestamps end there)")
            self._now += seconds
            return self._now

    def advance_to(self, when: float) -> float:
        """Move time forward to ``when`` if it is later than now; returns the new time."""
        when = float(when)
        if math.isnan(when) or when > LATEST:
            raise ValueError(f"when: {when} is not a time the clock can reach")
        with self._lock:
            if when > self._now:
                self._now = when
            return self._now

    def sleep_until(self, when: float) -> None:
        self.advance_to(when)


@contextmanager
def sdk_sleeps_on(clock: RealClock | VirtualClock) -> Iterator[None]:
    """While in this block, botocore's retry back-off sleeps on ``clock`` (``sleep_until``) instead
    of the wall clock: a client with the SDK's standard retries then backs off in virtual time, as
    it would in real time against the service. Process-wide (botocore has one ``endpoint.time``)."""
    import botocore.endpoint as endpoint

    real = endpoint.time

    class _Time:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            clock.sleep_until(clock.now() + seconds)

    endpoint.time = _Time()  # type: ignore[assignment]
    try:
        yield
    finally:
        endpoint.time = real
