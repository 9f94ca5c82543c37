"""Per-operation rate limits as measured: held (slowed) bursts first, 429 past a bounded wait.

Each operation has its documented quota, a token bucket (``rate`` per second up to ``burst``).
A request that finds a token is served at once. With the ``measured`` profile the bucket holds
``unheld_bursts`` times the burst (twice it: the service answered ten of a raw burst of twenty
RunMicrovm at once, against a documented burst of 5), and a request that finds none is *held*: it waits ``hold_seconds`` and is then served, as long as the operation's surge
allowance (``surge_bursts`` times the burst, refilled at the documented rate) has room; past that
it is answered 429 ``ThrottlingException`` with ``retryAfterSeconds``. With the ``documented``
profile there is no surge: every request above the quota is a 429 at once. See ``measured.py``
for the measurements (GT §2, Q3/Q43/Q57).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from .exceptions import WireError
from .measured import DOCUMENTED_RATE_LIMITS, OTHER_RATE_LIMIT, QUOTA_CODES, Profile


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take`` returns 0 or the seconds until a token."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        # A clock that went back (a real clock stepped by NTP) neither refills nor drains.
        self.stamp = now

    def wait(self, now: float) -> float:
        """Seconds until a token (0: one is there)."""
        self._refill(now)
        if self.tokens >= 1:
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf

    def take(self, now: float) -> float:
        wait = self.wait(now)
        if wait == 0:
            self.tokens -= 1
        return wait


@dataclass
class Limit:
    rate: float
    burst: float
    surge: float  # how many requests may be held at once (0: none)
    unheld: float = 0.0  # how many are answered at once (the bucket's size; 0: the burst)

    def __post_init__(self) -> None:
        self.unheld = self.unheld or self.burst


def _checked(operation: str, rate: float, burst: float) -> tuple[float, float]:
    for name, value in (("rate", rate), ("burst", burst)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value < 0 or math.isinf(value):
            raise ValueError(f"{operation} {name}: {value!r} is not a finite number >= 0")
    if burst < 1 and rate > 0:
        raise ValueError(f"{operation} burst: {burst} is below 1: no request could ever pass")
    return float(rate), float(burst)


class RateLimiter:
    """The per-operation limits of one account. Not thread-safe: the backend holds its lock."""

    def __init__(
        self,
        profile: Profile,
        limits: Mapping[str, Optional[tuple[float, float]]] | bool = True,
    ) -> None:
        self.profile = profile
        self.enabled = limits is not False
        self._limits: dict[str, Optional[Limit]] = {}
        if self.enabled:
            merged: dict[str, Optional[tuple[float, float]]] = dict(DOCUMENTED_RATE_LIMITS)
            if isinstance(limits, Mapping):
                merged.update(limits)
            for operation, value in merged.items():
                self._limits[operation] = None if value is None else self._limit(operation, *value)
        self._buckets: dict[str, tuple[TokenBucket, Optional[TokenBucket]]] = {}

    def _limit(self, operation: str, rate: float, burst: float, surge: Optional[float] = None) -> Limit:
        """The profile's slack around a quota: ``unheld_bursts`` times the burst answered at once,
        ``surge_bursts`` times it held. An explicit ``surge`` (a test's storm) is the whole slack:
        then exactly ``burst`` is answered at once."""
        rate, burst = _checked(operation, rate, burst)
        unheld = burst
        if surge is None:
            slack = operation not in self.profile.not_held
            held = slack and self.profile.hold_seconds > 0
            surge = burst * self.profile.surge_bursts if held else 0.0
            if slack:
                unheld = burst * self.profile.unheld_bursts
        elif surge < 0 or surge != surge or math.isinf(surge):
            raise ValueError(f"{operation} surge: {surge!r} is not a finite number >= 0")
        return Limit(rate, burst, float(surge), unheld)

    def limit(self, operation: str) -> Optional[Limit]:
        if not self.enabled:
            return None
        if operation in self._limits:
            return self._limits[operation]
        return self._limits.setdefault(operation, self._limit(operation, *OTHER_RATE_LIMIT))

    def set_limit(self, operation: str, rate: float, burst: float, surge: Optional[float] = None) -> None:
        """Change one operation's limit now; ``surge`` defaults to the profile's."""
        self.enabled = True
        self._limits[operation] = self._limit(operation, rate, burst, surge)
        self._buckets.pop(operation, None)

    def remove_limit(self, operation: str) -> None:
        self._limits[operation] = None
        self._buckets.pop(operation, None)

    def admit(self, operation: str, now: float) -> float:
        """0 (served at once), the seconds the request is held, or a 429 ``WireError``."""
        limit = self.limit(operation)
        if limit is None:
            return 0.0
        buckets = self._buckets.get(operation)
        if buckets is None:
            surge = TokenBucket(limit.rate, limit.surge, now) if limit.surge >= 1 else None
            buckets = self._buckets[operation] = (TokenBucket(limit.rate, limit.unheld, now), surge)
        quota, surge = buckets
        wait = quota.take(now)
        if wait == 0:
            return 0.0
        if surge is not None:
            surge_wait = surge.take(now)
            if surge_wait == 0:
                return self.profile.hold_seconds
            wait = min(wait, surge_wait)
        raise WireError(
            "ThrottlingException",
            f"Rate exceeded for {operation}",
            serviceCode="lambda",
            quotaCode=QUOTA_CODES.get(operation),
            retryAfterSeconds=max(1, math.ceil(wait)) if math.isfinite(wait) else 3600,
        )
