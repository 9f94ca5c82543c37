"""Control-plane rate budgets shared by every fleet's reconciler in an account and region.

One token bucket per MicroVMs operation, kept as a GCRA "theoretical arrival time" (``tat``) so
that acquiring is one conditional ``UpdateItem`` with no read before the write: the refill is
computed from the stored time. An empty bucket is a structured :class:`Deferral` with the seconds
until a token; it never raises and never retries blindly. A 429 (``retryAfterSeconds``), a 402
quota or InsufficientCapacity puts the operation in a *backoff* state (``backoff_until``) that
every reconciler sharing the table sees.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping, Optional, Union

#: Documented default quotas (per second, burst); ListMicrovms is not published: assumed.
DEFAULT_BUDGETS: dict[str, tuple[float, float]] = {
    "RunMicrovm": (5, 5),
    "ResumeMicrovm": (5, 5),
    "SuspendMicrovm": (2, 2),
    "TerminateMicrovm": (10, 10),
    "GetMicrovm": (100, 100),
    "CreateMicrovmAuthToken": (50, 50),
    "ListMicrovms": (10, 10),
}

#: The GetMicrovm calls of the parked-slot watches (``FleetSpec.watch_seconds``) have a bucket of
#: their own, shared by every reconciler of the account: at most this many a second (a third of
#: GetMicrovm's documented 100), so the watches never take what the fleets' clients and the
#: reconcilers' other looks need; a watch that finds no token is skipped.
WATCH_OPERATION = "GetMicrovm:watch"
WATCH_BUDGET = (30.0, 30.0)

EPSILON = 1e-6  # float sums of 1/rate must not lose a token at the edge of the burst
#: The shortest retry a refusal names (a refusal that just took the place in line may be admitted
#: on its next ask at once).
MIN_RETRY_SECONDS = 0.05
#: A stored arrival time further ahead than a reservation can reach (burst, the reservation
#: horizon and this slack) was written by a clock that runs ahead: it is treated as idle, so one
#: skewed reconciler cannot stall every other one for the length of its skew.
SKEW_SLACK_SECONDS = 5.0
#: The asker next in line for an operation (one per bucket, ``acquire``'s ``asker``) reserves on a
#: line this much later than the others. Under saturation the line is ``now + horizon``, and the
#: asks of a process whose clock runs even 0.1 s ahead were admitted on a later line and took every
#: refill while the other process starved (0-1 grants in 15 s). The place in line
#: goes to the first asker refused while it is free and ends with its grant: an order no clock
#: decides. Others are never held back by it, so an asker that goes away costs nothing.
NEXT_IN_LINE_BONUS_SECONDS = 2.0
#: A place in line is kept this long past the retry its refusal named (then another asker may take
#: it), judged on each asker's own clock: more than the skew that learning the service's clock
#: leaves (under a second).
NEXT_IN_LINE_GRACE_SECONDS = 3.0
#: The furthest a reservation reaches: the reconciler's horizon (2 s) and the bonus of the next in line.
MAX_HORIZON_SECONDS = 2.0 + NEXT_IN_LINE_BONUS_SECONDS


#: The longest backoff a reconciler writes (a 429's ``retryAfterSeconds`` is capped at 60 s, the
#: memory quota's 402 backs off 60 s, InsufficientCapacity 5 s). A stored ``backoff_until``
#: further ahead than this and SKEW_SLACK_SECONDS was written by a clock that runs ahead (past the
#: 300 s the service's Date corrects) and is not believed: one fleet whose clock ran 400 s ahead
#: held every fleet's runs back 400 s after one InsufficientCapacity.
MAX_BACKOFF_SECONDS = 60.0


def backoff_believed(until: float, now: float) -> bool:
    """Whether a stored backoff still holds at ``now``: ahead, and not implausibly far ahead."""
    return now < until <= now + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS


def implausible(now: float, interval: float, burst: float) -> float:
    """The arrival time past which the bucket's state comes from a skewed clock: past what an ask
    admitted on the furthest line (horizon, bonus and ``burst - 1`` tokens) of up to ``burst``
    tokens leaves, and the slack. With ``burst * interval`` alone, a slow bucket (0.2/s, burst 3)
    asked for 3 tokens at a time resets itself: 81 tokens in 20 s instead of 7."""
    return now + 2 * burst * interval + MAX_HORIZON_SECONDS + SKEW_SLACK_SECONDS


def admission_limit(now: float, horizon: float, interval: float, burst: float, cost: int) -> float:
    """The latest stored arrival time at which an ask of ``cost`` tokens is admitted.

    Without a reservation (``horizon`` 0) the tokens must conform now: ``tat <= now + (burst -
    cost) * interval`` (GCRA). A reservation is admitted on the same line for every ask,
    ``tat <= now + horizon + (burst - 1) * interval``, whatever its cost; a larger ask's tokens
    are then due up to ``(cost - 1) * interval`` later (``Granted.wait_seconds`` says when). With
    a cost-dependent line, a fleet asking for 4 tokens was refused whenever the bucket held fewer
    than 4 below the horizon, and asks of 1-3 took every refill first: at 37 fleets one fleet's
    first starts came 35 s late. The rate is the same either way: a grant never starts before its
    last token conforms."""
    return now + horizon + (burst - (1 if horizon > 0 else cost)) * interval + EPSILON


@dataclass(frozen=True)
class Granted:
    """``cost`` tokens, usable after ``wait_seconds`` (0 unless a reservation was asked for)."""

    operation: str
    cost: int
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class Deferral:
    """No token now: come back in ``retry_after_seconds``; ``reason`` is ``budget_empty`` or
    ``backoff:<why>``."""

    operation: str
    retry_after_seconds: float
    reason: str


Decision = Union[Granted, Deferral]


#: The share of each documented quota the reconcilers use by default: calls admitted by the budget
#: reach the service a little later than admitted (a step lists first), and late calls bunch up;
#: 90% of the rate and one token less of burst absorb that, and leave room for the fleet clients.
DEFAULT_SHARE = 0.95


def valid_shape(value: Any) -> Optional[tuple[float, float]]:
    """``(rate, burst)`` when ``value`` is a usable bucket: a finite rate above 0 and a finite burst
    of at least 1 token; None otherwise. A zero rate divided by zero on every tick; a negative,
    NaN or infinite one admitted every call; a burst under 1 was never admitted one token by the
    DynamoDB store (the fleet never listed)."""
    # A pair of numbers and nothing else: a string ("55" read as 5, 5), a mapping (its keys) or a
    # boolean (True read as 1) is no bucket.
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        return None
    rate, burst = float(value[0]), float(value[1])
    if not (math.isfinite(rate) and rate > 0 and math.isfinite(burst) and burst >= 1):
        return None
    return rate, burst


class _Gcra:
    def __init__(self, budgets: Mapping[str, Any], share: float = DEFAULT_SHARE) -> None:
        defaults = {op: (rate * share, max(1.0, burst - 1)) for op, (rate, burst) in DEFAULT_BUDGETS.items()}
        defaults[WATCH_OPERATION] = WATCH_BUDGET
        #: Entries of ``budgets`` that are no bucket (see :func:`valid_shape`), with their value:
        #: the operation keeps its documented default (the reconciler tells, ``budgets_rejected``).
        self.rejected: dict[str, str] = {}
        valid = {}
        for operation, value in budgets.items():
            shape = valid_shape(value)
            if shape is None:
                self.rejected[operation] = repr(value)[:100]
            else:
                valid[operation] = shape
        self.budgets = {**defaults, **valid}

    @staticmethod
    def _check(operation: str, cost: Any, interval: float, burst: float, now: float = 0.0,
               horizon: float = 0.0) -> Optional[Deferral]:
        """A cost of no tokens is a caller's bug (0 took none, a negative one gave tokens back):
        raised. More tokens than the burst never conform at once: refused, whatever the horizon
        (the memory store granted them with a reservation, all usable at one instant: a burst
        above the quota; DynamoDB never did)."""
        if not isinstance(cost, int) or isinstance(cost, bool) or cost < 1:
            raise ValueError(f"cost: {cost!r} is not a whole number of tokens of at least 1")
        if not (math.isfinite(now) and math.isfinite(horizon)):
            # A NaN clock or horizon compares False everywhere: it would be granted at once, and a
            # NaN stored in the memory store would grant every later ask. A caller's bug.
            raise ValueError(f"now: {now!r}, horizon: {horizon!r}: not finite numbers of seconds")
        if cost > burst:
            return Deferral(operation, interval, "budget_empty")
        return None

    @staticmethod
    def _bonus(horizon: float, horizon_cap: Optional[float]) -> float:
        """The horizon of the asker next in line: NEXT_IN_LINE_BONUS_SECONDS more, never past
        ``horizon_cap`` (the caller's own limit: a tick reserves nothing due after its deadline)."""
        longer = horizon + NEXT_IN_LINE_BONUS_SECONDS
        return longer if horizon_cap is None else max(horizon, min(longer, horizon_cap))

    @staticmethod
    def _line_free(asker: str, holder: Optional[str], until: float, now: float) -> bool:
        """Whether ``asker`` may take the place in line (free, its own, or kept past its time)."""
        return holder is None or holder == asker or until < now - NEXT_IN_LINE_GRACE_SECONDS

    def shape(self, operation: str) -> tuple[float, float]:
        rate, burst = self.budgets.get(operation, (10.0, 10.0))
        return 1.0 / rate, float(burst)


class MemoryBudget(_Gcra):
    """The same buckets in one process (tests, the benchmark, a single reconciler)."""

    def __init__(self, budgets: Mapping[str, tuple[float, float]] = {}) -> None:  # noqa: B006
        super().__init__(budgets)
        self._lock = threading.Lock()
        self._tat: dict[str, float] = {}
        self._backoff: dict[str, tuple[float, str]] = {}
        self._line: dict[str, tuple[str, float]] = {}  # operation -> (asker next in line, until)

    def acquire(self, operation: str, now: float, cost: int = 1, horizon: float = 0.0,
                asker: Optional[str] = None, horizon_cap: Optional[float] = None) -> Decision:
        """``cost`` tokens now, or (``horizon`` > 0) a reservation of them at most that far ahead.
        An ``asker`` refused while the place in line is free takes it, and its asks reserve
        NEXT_IN_LINE_BONUS_SECONDS further (never past ``horizon_cap``) until one is granted."""
        interval, burst = self.shape(operation)
        too_many = self._check(operation, cost, interval, burst, now, horizon)
        if too_many is not None:
            return too_many
        queued = asker is not None and horizon > 0
        with self._lock:
            until, why = self._backoff.get(operation, (0.0, ""))
            if backoff_believed(until, now):
                return Deferral(operation, until - now, f"backoff:{why}")
            tat = max(self._tat.get(operation, now), now)
            if tat > implausible(now, interval, burst):
                tat = now
            holder, held_until = self._line.get(operation, (None, 0.0))
            first = queued and holder == asker
            limit = admission_limit(now, self._bonus(horizon, horizon_cap) if first else horizon, interval, burst, cost)
            if tat > limit:
                if asker is not None and queued and not first and self._line_free(asker, holder, held_until, now):
                    limit = admission_limit(now, self._bonus(horizon, horizon_cap), interval, burst, cost)
                    self._line[operation] = (asker, now + max(0.0, tat - limit))
                return Deferral(operation, max(MIN_RETRY_SECONDS, tat - limit), "budget_empty")
            if first:
                del self._line[operation]
            self._tat[operation] = tat + cost * interval
            return Granted(operation, cost, max(0.0, tat - (burst - cost) * interval - now))

    def backoff(self, operation: str, until: float, reason: str) -> None:
        with self._lock:
            held = self._backoff.get(operation, (0.0, ""))[0]
            if held < until or held > until + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS:
                self._backoff[operation] = (until, reason)

    def remaining(self, operation: str, now: float) -> float:
        interval, burst = self.shape(operation)
        with self._lock:
            tat = max(self._tat.get(operation, now), now)
        return max(0.0, burst - (tat - now) / interval)


class DynamoDBBudget(_Gcra):
    """Buckets in a DynamoDB table (partition key ``operation``), shared by every reconciler."""

    @staticmethod
    def create_table(dynamodb: Any, table_name: str) -> None:
        """Create the table as the construct does (for local runs and tests)."""
        dynamodb.create_table(
            TableName=table_name,
            KeySchema=[{"AttributeName": "operation", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "operation", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )

    def __init__(self, dynamodb: Any, table_name: str, budgets: Mapping[str, tuple[float, float]] = {}) -> None:  # noqa: B006
        super().__init__(budgets)
        self._ddb = dynamodb
        self._table = table_name
        self._last_tat: dict[str, float] = {}
        self._in_line: set[tuple[str, str]] = set()  # (operation, asker) this process put next in line

    def acquire(self, operation: str, now: float, cost: int = 1, horizon: float = 0.0,
                asker: Optional[str] = None, horizon_cap: Optional[float] = None) -> Decision:
        """``cost`` tokens now, or (``horizon`` > 0) a reservation of them at most that far ahead:
        one conditional UpdateItem when the guess of idle or busy is right, two otherwise. An
        ``asker`` refused while the place in line is free takes it (one write more), and its asks
        reserve NEXT_IN_LINE_BONUS_SECONDS further (never past ``horizon_cap``) until one is granted."""
        interval, burst = self.shape(operation)
        too_many = self._check(operation, cost, interval, burst, now, horizon)
        if too_many is not None:
            return too_many
        queued = asker is not None and horizon > 0
        if queued and (operation, asker) in self._in_line:
            decision = self._as_first(operation, now, cost, interval, burst, str(asker), self._bonus(horizon, horizon_cap))
            if decision is not None:
                return decision
        decision, old = self._acquire(operation, now, cost, interval, burst, horizon)
        if (queued and isinstance(decision, Deferral) and decision.reason == "budget_empty" and old is not None
                and self._line_free(str(asker), old.get("next_asker", {}).get("S"),
                                    float(old.get("next_until", {}).get("N", 0)), now)):
            return self._take_line(operation, now, cost, interval, burst, str(asker), self._bonus(horizon, horizon_cap),
                                   float(old.get("tat", {}).get("N", now)), decision)
        return decision

    def _as_first(self, operation: str, now: float, cost: int, interval: float, burst: float, asker: str,
                  horizon: float) -> Optional[Decision]:
        """The ask of the asker next in line, on its later line (on an idle bucket, or one a clock
        far ahead wrote: ``_as_first_reset``); None: it is not (any more) next in line, or a backoff
        holds (the plain ask follows)."""
        limit = admission_limit(now, horizon, interval, burst, cost)
        try:
            result = self._ddb.update_item(
                TableName=self._table,
                Key={"operation": {"S": operation}},
                UpdateExpression="SET tat = tat + :step REMOVE next_asker, next_until",
                ConditionExpression=("tat > :now AND tat <= :limit AND next_asker = :me AND "
                                     "(attribute_not_exists(backoff_until) OR backoff_until <= :now OR backoff_until > :far)"),
                ExpressionAttributeValues={":now": _n(now), ":step": _n(cost * interval), ":limit": _n(limit),
                                           ":me": {"S": asker}, ":far": _n(now + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS)},
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except self._ddb.exceptions.ConditionalCheckFailedException as exc:
            old = exc.response.get("Item") or {}
            until = float(old.get("backoff_until", {}).get("N", 0))
            tat = float(old.get("tat", {}).get("N", now))
            backed_off = backoff_believed(until, now)
            if (old.get("next_asker", {}).get("S") == asker and not backed_off
                    and (tat <= now or tat > implausible(now, interval, burst))):
                return self._as_first_reset(operation, now, cost, interval, burst, asker)
            if old.get("next_asker", {}).get("S") != asker or backed_off:
                self._in_line.discard((operation, asker))
                return None  # another asker's place now, or a backoff: the plain ask says
            self._last_tat[operation] = tat
            return Deferral(operation, max(MIN_RETRY_SECONDS, tat - limit), "budget_empty")
        self._in_line.discard((operation, asker))
        return self._granted(operation, cost, float(result["Attributes"]["tat"]["N"]), interval, burst, now)

    def _granted(self, operation: str, cost: int, new_tat: float, interval: float, burst: float, now: float) -> Granted:
        """A grant that left the bucket at ``new_tat``: its tokens are usable when the first conforms."""
        self._last_tat[operation] = new_tat
        start = new_tat - cost * interval - (burst - cost) * interval
        return Granted(operation, cost, max(0.0, start - now))

    def _as_first_reset(self, operation: str, now: float, cost: int, interval: float, burst: float,
                        asker: str) -> Optional[Decision]:
        """The asker next in line on an idle bucket, or one a clock far ahead wrote: granted at once
        as the plain ask would be, and the place freed with it (the memory store frees it on any
        grant of its holder; a plain write left it held until its grace ran out). None: the bucket
        moved meanwhile (the plain ask follows)."""
        self._in_line.discard((operation, asker))
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"operation": {"S": operation}},
                UpdateExpression="SET tat = :new REMOVE next_asker, next_until",
                ConditionExpression=("(tat <= :now OR tat > :skewed) AND next_asker = :me AND "
                                     "(attribute_not_exists(backoff_until) OR backoff_until <= :now OR backoff_until > :far)"),
                ExpressionAttributeValues={":now": _n(now), ":new": _n(now + cost * interval), ":me": {"S": asker},
                                           ":skewed": _n(implausible(now, interval, burst)),
                                           ":far": _n(now + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS)},
            )
        # uncovered: the bucket moved between the refused ask of the place's holder and this write (another process's grant); no single-process test makes that race
        except self._ddb.exceptions.ConditionalCheckFailedException:
            return None
        self._last_tat[operation] = now + cost * interval
        return Granted(operation, cost, 0.0)

    def _take_line(self, operation: str, now: float, cost: int, interval: float, burst: float, asker: str,
                   horizon: float, tat: float, refused: Deferral) -> Decision:
        """Take the place in line after a refusal (if no other asker took it first): the retry is
        then the one the later line gives."""
        limit = admission_limit(now, horizon, interval, burst, cost)
        retry = max(MIN_RETRY_SECONDS, tat - limit)
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"operation": {"S": operation}},
                UpdateExpression="SET next_asker = :me, next_until = :until",
                ConditionExpression="attribute_not_exists(next_asker) OR next_asker = :me OR next_until < :stale",
                ExpressionAttributeValues={":me": {"S": asker}, ":until": _n(now + retry),
                                           ":stale": _n(now - NEXT_IN_LINE_GRACE_SECONDS)},
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            return refused  # another asker took the place first
        self._in_line.add((operation, asker))
        return Deferral(operation, retry, "budget_empty")

    def _acquire(self, operation: str, now: float, cost: int, interval: float, burst: float,
                 horizon: float) -> tuple[Decision, Optional[dict[str, Any]]]:
        """The plain ask (no place in line), and the item a refused write returned."""
        key = {"operation": {"S": operation}}
        not_in_backoff = "(attribute_not_exists(backoff_until) OR backoff_until <= :now OR backoff_until > :far)"
        idle_first = self._last_tat.get(operation, 0.0) <= now
        attempts = ("idle", "busy") if idle_first else ("busy", "idle")
        old: Optional[dict[str, Any]] = None
        for attempt in attempts:
            values = {":now": _n(now), ":far": _n(now + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS)}
            if attempt == "idle":
                update = "SET tat = :new"
                condition = f"(attribute_not_exists(tat) OR tat <= :now OR tat > :skewed) AND {not_in_backoff}"
                values[":new"] = _n(now + cost * interval)
                values[":skewed"] = _n(implausible(now, interval, burst))
            else:
                update = "SET tat = tat + :step"
                condition = f"tat > :now AND tat <= :limit AND {not_in_backoff}"
                values.update({":step": _n(cost * interval), ":limit": _n(admission_limit(now, horizon, interval, burst, cost))})
            try:
                result = self._ddb.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeValues=values,
                    ReturnValues="UPDATED_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return self._granted(operation, cost, float(result["Attributes"]["tat"]["N"]), interval, burst, now), None
            except self._ddb.exceptions.ConditionalCheckFailedException as exc:
                old = exc.response.get("Item") or old
                # uncovered: a failed write that returns no item (the bucket deleted between a
                # tick's two attempts, by hand or a table restore); no test deletes it mid-call
                if old is None:
                    continue
                until = float(old.get("backoff_until", {}).get("N", 0))
                if backoff_believed(until, now):
                    return Deferral(operation, until - now, f"backoff:{old.get('backoff_reason', {}).get('S', '')}"), old
                tat = float(old.get("tat", {}).get("N", now))
                self._last_tat[operation] = tat
                if tat > implausible(now, interval, burst) and attempt == "busy":
                    continue  # the idle attempt (next) resets a bucket a skewed clock wrote
                limit = admission_limit(now, horizon, interval, burst, cost)
                if tat > limit:
                    return Deferral(operation, tat - limit, "budget_empty"), old
        # uncovered: both conditional writes refused while the item each returned says the ask
        # fits (another process moved the bucket between them); a race no single-process test makes
        tat = self._last_tat.get(operation, now)
        return Deferral(operation, max(interval, tat - admission_limit(now, horizon, interval, burst, cost)), "budget_empty"), old

    def backoff(self, operation: str, until: float, reason: str) -> None:
        # A longer backoff already in force is kept (the condition refuses the write).
        with contextlib.suppress(self._ddb.exceptions.ConditionalCheckFailedException):
            self._ddb.update_item(
                TableName=self._table,
                Key={"operation": {"S": operation}},
                UpdateExpression="SET backoff_until = :until, backoff_reason = :why",
                # A longer backoff in force stays, unless a clock far ahead wrote it (not believed).
                ConditionExpression="attribute_not_exists(backoff_until) OR backoff_until < :until OR backoff_until > :far",
                ExpressionAttributeValues={":until": _n(until), ":why": {"S": reason},
                                           ":far": _n(until + MAX_BACKOFF_SECONDS + SKEW_SLACK_SECONDS)},
            )

    def remaining(self, operation: str, now: float) -> float:
        interval, burst = self.shape(operation)
        item = self._ddb.get_item(TableName=self._table, Key={"operation": {"S": operation}}).get("Item", {})
        tat = max(float(item.get("tat", {}).get("N", now)), now)
        return max(0.0, burst - (tat - now) / interval)


def _n(value: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(round(value, 6))))}
