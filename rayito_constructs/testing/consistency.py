"""What readers see: eventually consistent GetMicrovm/ListMicrovms, and stable page tokens.

Each read (a GetMicrovm, or one page of a list) sees the service as it was ``lag`` seconds ago,
``lag`` drawn per read from ``[stale_seconds, stale_seconds + window]`` (seeded): so right after
TerminateMicrovm a VM can still read RUNNING, right after RunMicrovm a list can miss the new VM,
and two reads in a row need not agree (GT §3: "get-microvm is eventually consistent"; RUNNING
right after terminate, TERMINATING at 0.14 s; PENDING 0.1-0.5 s after ``/resume`` returned).

Page tokens are cursors, not offsets: a token names the last item of its page and the filters it
was made for, so a VM that is pruned between two pages never shifts another one off the list, and
a token replayed with other filters is a ValidationException.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
from typing import Any, Optional, Sequence

from .exceptions import validation


class Consistency:
    """How stale a read may be. ``window`` and ``stale_seconds`` are seconds, finite and >= 0."""

    def __init__(self, window: float, seed: Optional[int] = None, stale_seconds: float = 0.0,
                 new_vms_listed_late: bool = True) -> None:
        self.window = _seconds("consistency_seconds", window)
        self.stale_seconds = _seconds("stale_seconds", stale_seconds)
        self.new_vms_listed_late = bool(new_vms_listed_late)
        """False: a list shows a new VM at once (in its first state), only states are late."""
        self._rng = random.Random(None if seed is None else seed * 7 + 3)

    def lag(self) -> float:
        """The lag of one read."""
        if self.window <= 0:
            return self.stale_seconds
        return self.stale_seconds + self._rng.uniform(0.0, self.window)


def _seconds(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value < 0 or math.isinf(value):
        raise ValueError(f"{name}: {value!r} is not a finite number of seconds >= 0")
    return float(value)


# ------------------------------------------------------------------------------------- page tokens


def _filters_digest(filters: dict[str, Any]) -> str:
    data = json.dumps({k: v for k, v in sorted(filters.items()) if v is not None}, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def page_token(kind: str, filters: dict[str, Any], last_key: Sequence[Any]) -> str:
    """An opaque token: the list it belongs to, its filters, and the key of the last item given."""
    data = {"l": kind, "f": _filters_digest(filters), "k": list(last_key)}
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def read_page_token(
    token: Optional[str], kind: str, filters: dict[str, Any], key_types: Sequence[type]
) -> Optional[list[Any]]:
    """The last key a token names (None for no token); ValidationException for a bad or foreign
    token. ``key_types`` are the types of the key's parts (``float`` accepts integers)."""
    if token is None:
        return None
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        key = data["k"]
        ok = (
            data["l"] == kind
            and isinstance(key, list)
            and len(key) == len(key_types)
            and all(_is(part, kind_) for part, kind_ in zip(key, key_types, strict=True))
        )
    except Exception:  # noqa: BLE001 - anything a client can send
        ok, data = False, {}
    if not ok:
        raise validation("The nextToken is not valid")
    if data.get("f") != _filters_digest(filters):
        raise validation("The nextToken was issued for a request with other parameters")
    return key


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


def page(items: list[tuple[Any, dict[str, Any]]], after: Optional[list[Any]], size: int) -> tuple[list[dict[str, Any]], Optional[Any]]:
    """One page of ``(key, item)`` pairs sorted by key: the items after ``after``, and the key of the
    last one given when more remain."""
    if after is not None:
        bound = tuple(after)
        items = [(k, v) for k, v in items if tuple(k) > bound]
    chosen = items[:size]
    more = len(items) > size
    return [v for _, v in chosen], (chosen[-1][0] if more and chosen else None)
