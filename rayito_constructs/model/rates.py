"""Rates and envelopes as options: parsing ``"60/minute"`` and checking rate, burst and cost.

One module for every entry that accepts an envelope (the ``[[egress.budgets]]`` options, the
recipe, ``BudgetClient.put_envelope`` and ``BudgetClient.acquire``), so the same value is refused
the same way everywhere (issue #14: a negative rate granted everything, ``"nan/second"`` and
``"1e400/s"`` passed the options check). Plain Python: the agent's runtime imports it without
aws-cdk-lib or pydantic.

Errors say what was wrong, the value and what is allowed (STYLE.md, "Errors"): a
:class:`RateError` carries ``reason`` (the text without the value, for the options, whose report
puts the value in front) and formats as ``'nan/second' is not finite: ...``.
"""

from __future__ import annotations

import math
import re
from typing import Union

#: Bounds of a rate, per second. Below one request in about 11.6 days an envelope is a ban; above
#: a million per second it is no limit. Both keep the bucket's numbers inside what DynamoDB stores.
MIN_RATE_PER_SECOND = 1e-6
MAX_RATE_PER_SECOND = 1e6
#: The largest burst (the options' limit since the first release).
MAX_BURST = 10_000

UNIT_SECONDS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")
_EXAMPLE = "such as 60/minute or 10/second"

Rate = Union[str, int, float]


class RateError(ValueError):
    """A rate, burst or cost that no envelope can have."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"{value!r} {reason}")


def _check_per_second(value: object, per_second: float) -> float:
    if math.isnan(per_second) or math.isinf(per_second):
        raise RateError(value, f"is not finite: a rate is a number above 0 {_EXAMPLE}")
    if per_second <= 0:
        raise RateError(value, f"is not above 0: a rate is a number above 0 {_EXAMPLE}")
    if per_second < MIN_RATE_PER_SECOND:
        raise RateError(value, f"is below the minimum of {MIN_RATE_PER_SECOND:g} per second")
    if per_second > MAX_RATE_PER_SECOND:
        raise RateError(value, f"is above the limit of {MAX_RATE_PER_SECOND:g} per second")
    return per_second


def parse_rate(value: object) -> float:
    """Requests per second of ``"60/minute"`` (1.0), ``"10/s"``, ``"1000/hour"``, ``"2/day"`` or a
    number (per second). Finite, above 0, between :data:`MIN_RATE_PER_SECOND` and
    :data:`MAX_RATE_PER_SECOND`; anything else raises :class:`RateError` naming the value."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RateError(value, f"is not a rate {_EXAMPLE}")
    if isinstance(value, (int, float)):
        try:
            per_second = float(value)
        except OverflowError:  # an int too large for a float
            raise RateError(value, f"is not finite: a rate is a number above 0 {_EXAMPLE}") from None
        return _check_per_second(value, per_second)
    amount, slash, unit = value.strip().partition("/")
    amount = amount.strip()
    seconds = UNIT_SECONDS.get(unit.strip().lower()) if slash else 1
    if not _NUMBER.match(amount) or seconds is None:
        raise RateError(value, f"is not a rate {_EXAMPLE}")
    count = float(amount)  # "1e400" gives inf, refused below
    return _check_per_second(value, count / seconds)


def check_burst(value: object) -> int:
    """A burst is a whole number of requests from 1 to :data:`MAX_BURST` (``2.0`` is 2)."""
    if isinstance(value, bool):
        raise RateError(value, "is not a whole number: a burst is a whole number of requests, at least 1")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise RateError(value, "is not a whole number: a burst is a whole number of requests, at least 1")
    if value < 1:
        raise RateError(value, "is below the minimum of 1")
    if value > MAX_BURST:
        raise RateError(value, f"is above the limit of {MAX_BURST}")
    return value


def check_cost(value: object, burst: int) -> int:
    """A request's cost in tokens: a whole number from 1 to the envelope's burst (a cost above the
    burst could never be granted without breaking the envelope; a negative one would give tokens
    back)."""
    if isinstance(value, bool):
        raise RateError(value, "is not a whole number: a cost is a whole number of tokens, at least 1")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise RateError(value, "is not a whole number: a cost is a whole number of tokens, at least 1")
    if value < 1:
        raise RateError(value, "is below the minimum of 1")
    if value > burst:
        raise RateError(value, f"is above the envelope's burst of {burst}")
    return value


def recipe_rate(per_second: float) -> float:
    """A rate as the recipe keeps it: 12 significant digits (``1/day`` stays 1.15740740741e-05,
    where rounding to 6 decimals made it 1.2e-05, 4% off)."""
    return float(f"{per_second:.12g}")
