"""``BudgetClient``: take a token from a target's shared envelope before a request leaves.

One DynamoDB table (partition key ``target``, sort key ``item``) holds, per target, the bucket
(``item = "bucket"``: GCRA arrival time ``tat``, the envelope's ``rate``/``burst``/``version``,
an optional ``backoff_until``) and the envelope history (``item = "envelope#000001"``...: rate,
burst, effective from, reason). Acquiring is one conditional ``UpdateItem`` computed from the
stored time, with no read before the write; the envelope version is part of the condition, so an
envelope change takes effect on the next acquire of every process.

Nothing raises for an empty bucket: ``acquire`` returns :class:`Granted` or :class:`Deferral`
(``budget_empty``, ``backoff:<why>``, ``limiter_unavailable`` when the store does not answer:
fail closed).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from .targets import declared_target, envelope_of, normalize

EPSILON = 1e-6


@dataclass(frozen=True)
class Envelope:
    """A rate envelope: ``rate_per_second`` sustained, ``burst`` at once."""

    target: str
    rate_per_second: float
    burst: float
    version: int = 0

    @property
    def interval(self) -> float:
        return 1.0 / self.rate_per_second


@dataclass(frozen=True)
class Granted:
    target: str
    remaining: float
    envelope_version: int
    step: Optional[str] = None


@dataclass(frozen=True)
class Deferral:
    target: str
    retry_after_seconds: float
    reason: str
    remaining: float = 0.0
    envelope_version: int = 0
    step: Optional[str] = None


Decision = Union[Granted, Deferral]


def parse_rate(text: Union[str, float, int]) -> float:
    """``"60/minute"`` → 1.0 per second; a number is per second."""
    if isinstance(text, (int, float)):
        return float(text)
    amount, _, unit = str(text).partition("/")
    try:
        count = float(amount)
    except ValueError:
        raise ValueError("is not a rate such as 60/minute or 10/second") from None
    seconds = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600,
               "d": 86400, "day": 86400}.get(unit.strip().lower() or "second")
    if seconds is None:
        raise ValueError("is not a rate such as 60/minute or 10/second")
    return count / seconds


@dataclass
class StoreStats:
    """What this process asked of the store (for the benchmark and metrics)."""

    calls: int = 0
    writes: int = 0
    grants: int = 0
    denials: int = 0
    cache_denials: int = 0


class BudgetClient:
    """Acquire tokens from shared per-target envelopes.

    :param table_name: the EgressBudget table.
    :param dynamodb: a boto3 DynamoDB client (``boto3.client("dynamodb")``).
    :param envelopes: the declared envelopes (from the recipe); their targets define the path and
        query classes.
    :param default_rate: envelope for targets nobody declared, per second. Default: 1 (60/minute).
    :param default_burst: Default: 5.
    :param clock: wall clock. Default: ``time.time``.
    :param on_decision: called with every decision (metrics, logs). Default: none.
    """

    def __init__(
        self,
        table_name: str,
        dynamodb: Any,
        *,
        envelopes: Sequence[Envelope] = (),
        default_rate: float = 1.0,
        default_burst: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_decision: Optional[Callable[[Decision], None]] = None,
    ) -> None:
        self._ddb = dynamodb
        self._table = table_name
        self._declared = {declared_target(e.target): e for e in envelopes}
        self.default_rate = default_rate
        self.default_burst = default_burst
        self._clock = clock
        self._on_decision = on_decision
        self._lock = threading.Lock()
        self._known: dict[str, Envelope] = {}  # envelope in force, as last seen in the store
        self._tat: dict[str, float] = {}
        self._denied_until: dict[str, tuple[float, Deferral]] = {}
        self._checked: set[str] = set()
        self.stats = StoreStats()

    # ------------------------------------------------------------------ table

    @staticmethod
    def create_table(dynamodb: Any, name: str) -> None:
        """Create the table as ``EgressBudget`` does (local runs and tests)."""
        dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "target", "KeyType": "HASH"}, {"AttributeName": "item", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "target", "AttributeType": "S"},
                {"AttributeName": "item", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )

    # ------------------------------------------------------------------ targets and envelopes

    def target_of(self, url_or_target: str) -> str:
        """The normalized target a URL draws on."""
        return normalize(url_or_target, self._declared)

    def _declared_for(self, target: str) -> Envelope:
        key = envelope_of(target)
        declared = self._declared.get(key)
        if declared is not None:
            return Envelope(target, declared.rate_per_second, declared.burst, 0)
        return Envelope(target, self.default_rate, self.default_burst, 0)

    def put_envelope(self, target: str, rate_per_second: float, burst: float, reason: str) -> int:
        """Write a new version of a target's envelope (history kept); returns the version."""
        target = self.target_of(target) if "?" not in target else target
        now = self._clock()
        item = self._get(target)
        old = int(float(item.get("version", {}).get("N", 0)))
        new = old + 1
        self.stats.calls += 1
        self._ddb.transact_write_items(TransactItems=[
            {"Update": {
                "TableName": self._table,
                "Key": {"target": {"S": target}, "item": {"S": "bucket"}},
                "UpdateExpression": "SET #v = :new, rate = :rate, burst = :burst",
                "ConditionExpression": "attribute_not_exists(#v) OR #v = :old",
                "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {":new": _i(new), ":old": _i(old), ":rate": _n(rate_per_second), ":burst": _n(burst)},
            }},
            {"Put": {
                "TableName": self._table,
                "Item": {"target": {"S": target}, "item": {"S": f"envelope#{new:06d}"}, "rate": _n(rate_per_second),
                         "burst": _n(burst), "effective_from": _n(now), "reason": {"S": reason[:500]}},
                "ConditionExpression": "attribute_not_exists(target)",
            }},
        ])
        self.stats.writes += 2
        with self._lock:
            self._known[target] = Envelope(target, rate_per_second, burst, new)
            self._denied_until.pop(target, None)
        return new

    def envelopes(self, target: str) -> list[dict[str, Any]]:
        """The envelope history of a target, oldest first: read past traffic against it."""
        target = self.target_of(target) if "?" not in target else target
        page = self._ddb.query(
            TableName=self._table,
            KeyConditionExpression="target = :t AND begins_with(item, :p)",
            ExpressionAttributeValues={":t": {"S": target}, ":p": {"S": "envelope#"}},
        )
        return [
            {"version": int(i["item"]["S"].split("#")[1]), "rate_per_second": float(i["rate"]["N"]),
             "burst": float(i["burst"]["N"]), "effective_from": float(i["effective_from"]["N"]), "reason": i["reason"]["S"]}
            for i in page.get("Items", [])
        ]

    # ------------------------------------------------------------------ acquiring

    def acquire(self, url_or_target: str, cost: int = 1, step: Optional[str] = None) -> Decision:
        """Take ``cost`` tokens for the request's target now, or say when to come back."""
        try:
            target = self.target_of(url_or_target)
        except ValueError as exc:
            return self._tell(Deferral(url_or_target, 0.0, f"invalid_target: {exc}", step=step))
        now = self._clock()
        with self._lock:
            denied = self._denied_until.get(target)
        if denied and denied[0] > now:
            # The local negative cache may refuse, never grant: one store call per refill interval.
            self.stats.cache_denials += 1
            d = denied[1]
            return self._tell(Deferral(target, denied[0] - now, d.reason, 0.0, d.envelope_version, step))
        try:
            return self._tell(self._acquire(target, cost, step, now))
        except Exception as exc:  # noqa: BLE001 - fail closed on anything the store does
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            return self._tell(Deferral(target, 1.0, f"limiter_unavailable: {code}", step=step))

    def _acquire(self, target: str, cost: int, step: Optional[str], now: float) -> Decision:
        self._sync_declared(target)
        envelope = self._known.get(target) or self._declared_for(target)
        # Guess idle or busy from the last arrival time seen; a wrong guess is answered with the
        # item as it is, which says which branch applies: at most one more call.
        branch = "busy" if self._tat.get(target, 0.0) > now else "idle"
        for _ in range(3):
            ok, old = self._update(target, envelope, cost, now, branch)
            if ok and old is not None:
                tat = float(old["tat"]["N"])
                self._tat[target] = tat
                self.stats.grants += 1
                self.stats.writes += 1
                remaining = max(0.0, (now + envelope.burst * envelope.interval - tat) / envelope.interval)
                return Granted(target, round(remaining, 3), envelope.version, step)
            if old is None:
                branch = "idle"  # no bucket yet: only the idle branch creates it
                continue
            version = int(float(old.get("version", {}).get("N", 0)))
            if "rate" in old and version != envelope.version:
                envelope = Envelope(target, float(old["rate"]["N"]), float(old["burst"]["N"]), version)
                with self._lock:
                    self._known[target] = envelope
                continue
            until = float(old.get("backoff_until", {}).get("N", 0))
            if until > now:
                return self._deny(target, Deferral(target, until - now, f"backoff:{old.get('backoff_reason', {}).get('S', '')}",
                                                   0.0, envelope.version, step), until)
            tat = float(old.get("tat", {}).get("N", now))
            self._tat[target] = tat
            limit = now + (envelope.burst - cost) * envelope.interval + EPSILON
            if tat > limit:
                wait = tat - limit
                return self._deny(target, Deferral(target, wait, "budget_empty", 0.0, envelope.version, step), now + wait)
            branch = "idle" if tat <= now else "busy"
        return self._deny(target, Deferral(target, envelope.interval, "budget_empty", 0.0, envelope.version, step),
                          now + envelope.interval)

    def _update(self, target: str, envelope: Envelope, cost: int, now: float,
                branch: str) -> tuple[bool, Optional[dict[str, Any]]]:
        """One conditional UpdateItem: (True, new attributes) or (False, the item as it was)."""
        names = {"#v": "version"}
        values = {":now": _n(now), ":v": _i(envelope.version)}
        version_ok = "(attribute_not_exists(#v) OR #v = :v)"
        not_backoff = "(attribute_not_exists(backoff_until) OR backoff_until <= :now)"
        if branch == "idle":
            update = "SET tat = :new, #v = if_not_exists(#v, :v), rate = if_not_exists(rate, :rate), burst = if_not_exists(burst, :burst)"
            condition = f"(attribute_not_exists(tat) OR tat <= :now) AND {version_ok} AND {not_backoff}"
            values[":new"] = _n(now + cost * envelope.interval)
            values[":rate"] = _n(envelope.rate_per_second)
            values[":burst"] = _n(envelope.burst)
        else:
            update = "SET tat = tat + :step"
            condition = f"tat > :now AND tat <= :limit AND {version_ok} AND {not_backoff}"
            values[":step"] = _n(cost * envelope.interval)
            values[":limit"] = _n(now + (envelope.burst - cost) * envelope.interval + EPSILON)
        self.stats.calls += 1
        try:
            response = self._ddb.update_item(
                TableName=self._table,
                Key={"target": {"S": target}, "item": {"S": "bucket"}},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except self._ddb.exceptions.ConditionalCheckFailedException as exc:
            return False, exc.response.get("Item")
        return True, response["Attributes"]

    def _sync_declared(self, target: str) -> None:
        """Once per process and target: if the declared envelope differs from the one in force,
        write it as a new version (the conditional write lets one process of many win)."""
        if target in self._checked:
            return
        self._checked.add(target)
        declared = self._declared.get(envelope_of(target))
        if declared is None:
            return
        item = self._get(target)
        if not item.get("rate"):
            return  # the first acquire seeds the bucket with the declared envelope
        stored = (float(item["rate"]["N"]), float(item["burst"]["N"]))
        self._known[target] = Envelope(target, stored[0], stored[1], int(float(item.get("version", {}).get("N", 0))))
        if stored != (declared.rate_per_second, declared.burst):
            try:
                self.put_envelope(target, declared.rate_per_second, declared.burst, "declared in the recipe")
            except Exception:  # noqa: BLE001 - another process wrote it first: fine
                pass

    def _deny(self, target: str, deferral: Deferral, until: float) -> Deferral:
        self.stats.denials += 1
        with self._lock:
            self._denied_until[target] = (until, deferral)
        return deferral

    def _tell(self, decision: Decision) -> Decision:
        if self._on_decision is not None:
            self._on_decision(decision)
        return decision

    def _get(self, target: str) -> dict[str, Any]:
        self.stats.calls += 1
        return self._ddb.get_item(
            TableName=self._table, Key={"target": {"S": target}, "item": {"S": "bucket"}}, ConsistentRead=True
        ).get("Item", {})

    # ------------------------------------------------------------------ what a scheduler sees

    def remaining(self, targets: Iterable[str]) -> dict[str, float]:
        """Tokens left now per target (0 while a target is in backoff): run steps against targets
        with budget now, push the others later."""
        now = self._clock()
        out = {}
        for url in targets:
            target = self.target_of(url)
            item = self._get(target)
            envelope = self._declared_for(target)
            rate = float(item.get("rate", {}).get("N", envelope.rate_per_second))
            burst = float(item.get("burst", {}).get("N", envelope.burst))
            if float(item.get("backoff_until", {}).get("N", 0)) > now:
                out[target] = 0.0
                continue
            tat = max(float(item.get("tat", {}).get("N", now)), now)
            out[target] = round(max(0.0, burst - (tat - now) * rate), 3)
        return out

    def backoff(self, url_or_target: str, seconds: float, reason: str) -> None:
        """Put a target in backoff for every holder of its envelope (it answered 429 or 503)."""
        target = self.target_of(url_or_target)
        until = self._clock() + seconds
        self.stats.calls += 1
        try:
            self._ddb.update_item(
                TableName=self._table,
                Key={"target": {"S": target}, "item": {"S": "bucket"}},
                UpdateExpression="SET backoff_until = :until, backoff_reason = :why",
                ConditionExpression="attribute_not_exists(backoff_until) OR backoff_until < :until",
                ExpressionAttributeValues={":until": _n(until), ":why": {"S": reason}},
            )
            self.stats.writes += 1
        except self._ddb.exceptions.ConditionalCheckFailedException:
            pass
        with self._lock:
            self._denied_until.pop(target, None)


def _n(value: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(round(float(value), 6))))}


def _i(value: int) -> dict[str, str]:
    return {"N": str(int(value))}
