"""``BudgetClient``: take a token from every envelope a request belongs to before it leaves.

The store is one DynamoDB table (partition key ``target``, sort key ``item``). Per envelope
(partition ``target`` = the envelope's key: an origin, a path class or a query class):

- ``item = "bucket"``: the envelope in force (``rate``, ``burst``, ``version``, ``own``: declared
  or set by an operator, ``declared``: the hashes of every declaration ever written), and for an
  origin or a path class the bucket itself (GCRA arrival time ``tat``, ``backoff_until``);
- ``item = "bucket=<value>"``: a query class's bucket for one value, with a copy of the envelope's
  ``rate``/``burst``/``version``;
- ``item = "envelope#000000"``...: every version of the envelope, version 0 included (rate,
  burst, effective from, reason, source), so traffic can be read against the envelope in force.

Acquiring is one conditional ``UpdateItem`` per bucket with no read before the write; the
envelope version is part of the condition, so a change takes effect on the next acquire of every
process. Time is the store's: each response's ``Date`` header bounds the offset between this
process's clock and the store's (:class:`StoreTime`), a token is only taken when it is there at
the earliest the store's time can be, and a fresh bucket is started at the latest it can be, so a
process whose clock is off by 30 s (or a VM resumed with a stale clock) takes no token that is
not there.

Nothing raises out of :meth:`BudgetClient.acquire`: it returns :class:`Granted` or
:class:`Deferral` with a ``reason`` (:data:`REASONS`); a store that fails, refuses or does not
answer within the client's timeouts gives ``limiter_unavailable`` (fail closed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from ..model.egress_targets import (Bucket, Declared, TargetError, Url, declared, envelope_of, parse, redact, redacted_error,
                      route)
from ..model.rates import RateError, check_burst, check_cost, parse_rate

log = logging.getLogger(__name__)

EPSILON = 1e-6
BUDGET_EMPTY = "budget_empty"
BACKOFF = "backoff"
LIMITER_UNAVAILABLE = "limiter_unavailable"
INVALID_TARGET = "invalid_target"
INVALID_COST = "invalid_cost"
#: Every ``Deferral.reason`` (the ``reason`` dimension of the ``Deferrals`` metric).
#: What ``AgentFleet`` sets in the image for the agents: the envelope table and the declaration.
TABLE_ENV = "RAYITO_EGRESS_BUDGET_TABLE"
ENVELOPES_ENV = "RAYITO_EGRESS_ENVELOPES"
REASONS = (BUDGET_EMPTY, BACKOFF, LIMITER_UNAVAILABLE, INVALID_TARGET, INVALID_COST)
#: The ``target`` of a deferral for a URL that is not a target (the ``target`` dimension of its
#: metrics): one fixed value, never the URL, which may carry a password or an API key and would
#: make new custom metrics of every bad URL. Its ``detail`` quotes the URL redacted.
INVALID_TARGET_KEY = "(invalid)"

#: Store client defaults: a short connect and read timeout and one attempt, so a hung or slow
#: store costs a request at most about two seconds before it is deferred (botocore's defaults
#: are 60 s and several attempts). Change them with ``store_client(read_timeout=...)``.
STORE_CONNECT_TIMEOUT = 1.0
STORE_READ_TIMEOUT = 1.0
STORE_MAX_ATTEMPTS = 1

# ``parse_rate`` is imported here for code that imported it from this module; parsing a rate is
# an option's concern and lives in rayito_constructs.model.rates.


def store_client(*, endpoint_url: Optional[str] = None, region_name: Optional[str] = None,
                 connect_timeout: float = STORE_CONNECT_TIMEOUT, read_timeout: float = STORE_READ_TIMEOUT,
                 max_attempts: int = STORE_MAX_ATTEMPTS, session: Any = None, **kwargs: Any) -> Any:
    """A boto3 DynamoDB client for the budget: short timeouts and one attempt by default (a
    budget that waits a minute for its store is no chokepoint; a retry is the next acquire)."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=connect_timeout, read_timeout=read_timeout,
                    retries={"total_max_attempts": max_attempts, "mode": "standard"})
    return (session or boto3).client("dynamodb", endpoint_url=endpoint_url, region_name=region_name,
                                     config=config, **kwargs)


@dataclass(frozen=True)
class Envelope:
    """A rate envelope: ``rate_per_second`` sustained, ``burst`` at once. Validated: a finite rate
    above 0 (:func:`rayito_constructs.model.rates.parse_rate`), a whole burst of at least 1."""

    target: str
    rate_per_second: float
    burst: int
    version: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_per_second", parse_rate(self.rate_per_second))
        object.__setattr__(self, "burst", check_burst(self.burst))

    @property
    def interval(self) -> float:
        return 1.0 / self.rate_per_second


@dataclass(frozen=True)
class Granted:
    """The request may leave: every bucket in ``charged`` paid for it."""

    target: str
    remaining: float
    envelope_version: int
    step: Optional[str] = None
    charged: tuple[str, ...] = ()
    rate_per_second: Optional[float] = None
    burst: Optional[int] = None


@dataclass(frozen=True)
class Deferral:
    """The request must not leave now: come back after ``retry_after_seconds``. ``target`` is the
    bucket that refused; ``belongs`` every bucket the request belongs to; ``remaining`` is None
    when the store did not say (an outage is not an exhausted envelope)."""

    target: str
    retry_after_seconds: float
    reason: str
    remaining: Optional[float] = 0.0
    envelope_version: int = 0
    step: Optional[str] = None
    detail: str = ""
    belongs: tuple[str, ...] = ()
    rate_per_second: Optional[float] = None
    burst: Optional[int] = None


Decision = Union[Granted, Deferral]


@dataclass
class StoreStats:
    """What this process asked of the store (for the benchmark and metrics)."""

    calls: int = 0
    writes: int = 0
    grants: int = 0
    denials: int = 0
    cache_denials: int = 0
    refunds: int = 0
    failures: int = 0


class _Reroute(Exception):
    """An envelope changed under a request: work out its buckets again."""


class StoreClockError(RuntimeError):
    """The store's time is not known (its responses carry no ``Date``)."""


class StoreTime:
    """Bounds on the store's clock from the ``Date`` headers of its responses.

    A response sent at local ``s`` and received at local ``r`` with ``Date: D`` (whole seconds)
    says the store's clock minus ours is in ``[D - r, D + 1 - s]``; the intersection of every
    response's interval narrows to about a round trip as responses fall on either side of a
    second. An interval that contradicts the others (a local clock step, a resumed VM) starts the
    estimate again. Past ``max_age`` seconds without a response the estimate is not trusted.
    """

    DRIFT = 1e-4  # clocks may drift apart by 100 ppm between two responses

    def __init__(self, *, max_age: float = 10.0) -> None:
        self.max_age = max_age
        self.low: Optional[float] = None
        self.high: Optional[float] = None
        self.last: Optional[float] = None
        self.round_trip = 0.0

    def observe(self, sent: float, received: float, headers: Any) -> bool:
        date = headers.get("date") if headers else None
        if not date:
            return False
        try:
            server = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return False
        low, high = server - received, server + 1.0 - sent
        self.round_trip = received - sent
        if self.low is None or self.high is None or self.last is None:
            self.low, self.high = low, high
        else:
            slack = self.DRIFT * abs(received - self.last)
            if low > self.high + slack or high < self.low - slack:
                self.low, self.high = low, high
            else:
                self.low, self.high = max(self.low - slack, low), min(self.high + slack, high)
        self.last = received
        return True

    def bounds(self, local: float) -> Optional[tuple[float, float]]:
        if self.low is None or self.high is None or self.last is None:
            return None
        if local < self.last or local - self.last > self.max_age:
            return None
        # A request is processed after it is sent: a bucket started at the latest time "now" can
        # be started earlier than the store processes it by the request's time in flight (a few
        # milliseconds; adding the slowest round trip instead cost whole seconds under load).
        return local + self.low, local + self.high


@dataclass
class _Env:
    key: str
    rate: float
    burst: int
    version: int
    own: bool

    @property
    def interval(self) -> float:
        return 1.0 / self.rate


@dataclass
class _Taken:
    bucket: Bucket
    env: _Env
    remaining: float
    cost: int


@dataclass
class _Denied:
    until: float
    deferral: Deferral


@dataclass
class _State:
    envs: dict[str, _Env] = field(default_factory=dict)
    tat: dict[str, float] = field(default_factory=dict)
    denied: dict[str, _Denied] = field(default_factory=dict)
    streak: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    unavailable: Optional[_Denied] = None


class BudgetClient:
    """Acquire tokens from shared per-target envelopes.

    :param table_name: the EgressBudget table.
    :param dynamodb: a boto3 DynamoDB client. Default: :func:`store_client` (1 s timeouts, one
        attempt). A client of your own keeps its own timeouts and retries.
    :param envelopes: the declared envelopes (from the recipe); their targets define the path and
        query classes.
    :param default_rate: envelope for targets nobody declared, per second. Default: 1 (60/minute).
    :param default_burst: Default: 5.
    :param clock: this process's clock. Default: ``time.time``.
    :param store_clock: take the time from the store's ``Date`` headers (see :class:`StoreTime`).
        Default: True. False trusts this process's clock as the store's (then a process whose
        clock leads takes tokens that are not there yet).
    :param on_decision: called with every decision (metrics, logs). Default: none.
    :param max_backoff_seconds: the longest a ``Retry-After`` or ``backoff`` may hold a target.
        Default: 900.
    :param outage_seconds: how long a store failure defers this process's requests before the
        store is asked again. Default: 1.
    :param max_spread: waiting processes wake at a random time within up to this many refill
        intervals after the next token is due, doubling with each denial in a row, so a saturated
        target costs about one store call per token instead of one per waiting process. Default: 64.
    :param seed: seed of that randomness (tests). Default: none.
    :param calibrate: learn the store's time to a few hundredths of a second in the background at
        start (a cheap read every 40 ms until the store's clock turns a second, then dense reads
        around the next turns until the doubt is under 20 ms: at most 4 s and about 60 reads);
        until then the estimate is up to a second wide and the first burst smaller.
        Default: True.
    """

    def __init__(
        self,
        table_name: str,
        dynamodb: Any = None,
        *,
        envelopes: Sequence[Envelope] = (),
        default_rate: Union[float, str] = 1.0,
        default_burst: int = 5,
        clock: Callable[[], float] = time.time,
        store_clock: bool = True,
        on_decision: Optional[Callable[[Decision], None]] = None,
        max_backoff_seconds: float = 900.0,
        outage_seconds: float = 1.0,
        max_spread: int = 64,
        seed: Optional[int] = None,
        calibrate: bool = True,
    ) -> None:
        self._ddb = dynamodb if dynamodb is not None else store_client()
        self._table = table_name
        self.default_rate = parse_rate(default_rate)
        self.default_burst = check_burst(default_burst)
        self._declared: dict[str, tuple[Declared, Envelope]] = {}
        for e in envelopes:
            d = declared(e.target)
            if d.key in self._declared:
                raise ValueError(f"envelopes: {d.key!r} is declared more than once")
            self._declared[d.key] = (d, e)
        self._declarations = [d for d, _ in self._declared.values()]
        self._clock = clock
        self._time = StoreTime() if store_clock else None
        self._on_decision = on_decision
        if not (math.isfinite(max_backoff_seconds) and max_backoff_seconds > 0):
            raise ValueError(f"max_backoff_seconds: {max_backoff_seconds!r} is not a number of seconds above 0")
        self.max_backoff_seconds = float(max_backoff_seconds)
        self.outage_seconds = outage_seconds
        self.max_spread = max(1, int(max_spread))
        self._random = random.Random(seed)
        self._lock = threading.RLock()
        self._state = _State()
        self.stats = StoreStats()
        self._calibrating: Optional[threading.Thread] = None
        if calibrate and self._time is not None:
            self._calibrating = threading.Thread(target=self._calibrate, name="egress-store-clock", daemon=True)
            self._calibrating.start()

    @classmethod
    def from_declaration(cls, declaration: Any, *, table_name: Optional[str] = None, **kwargs: Any) -> "BudgetClient":
        """The client of a fleet's declared envelopes (``{"budgets": [{"target", "rate_per_second",
        "burst"}...], "default": {"rate_per_second", "burst"}}``, what ``AgentFleet`` puts in the
        image's ``RAYITO_EGRESS_ENVELOPES``), the table from ``RAYITO_EGRESS_BUDGET_TABLE`` unless
        ``table_name`` is given."""
        import os

        egress = dict(declaration or {})
        envelopes = [Envelope(b["target"], b["rate_per_second"], b["burst"]) for b in egress.get("budgets", [])]
        default = egress.get("default") or {}
        table = table_name or os.environ.get(TABLE_ENV)
        if not table:
            raise ValueError(f"{TABLE_ENV} is not set and no table_name was given")
        kwargs.setdefault("default_rate", default.get("rate_per_second", 1.0))
        kwargs.setdefault("default_burst", default.get("burst", 5))
        return cls(table, envelopes=envelopes, **kwargs)

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None, **kwargs: Any) -> "BudgetClient":
        """The client an agent of the fleet makes in its VM: the envelopes of
        ``RAYITO_EGRESS_ENVELOPES`` (JSON) and the table of ``RAYITO_EGRESS_BUDGET_TABLE``, both set
        in the image by ``AgentFleet``."""
        import os

        env = os.environ if environ is None else environ
        text = env.get(ENVELOPES_ENV)
        try:
            declaration = json.loads(text) if text else {}
        except ValueError:
            raise ValueError(f"{ENVELOPES_ENV} is not JSON") from None
        kwargs.setdefault("table_name", env.get(TABLE_ENV))
        return cls.from_declaration(declaration, **kwargs)

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

    # ------------------------------------------------------------------ targets

    def target_of(self, url_or_target: str) -> str:
        """The most specific target a URL draws on (without asking the store)."""
        return route(parse(url_or_target), self._declarations, charge_origin=False)[0].target

    def buckets_of(self, url_or_target: Union[str, Url]) -> tuple[str, ...]:
        """Every bucket a request to this URL pays (asks the store whether its origin has an
        envelope of its own, once per process)."""
        url = url_or_target if isinstance(url_or_target, Url) else parse(url_or_target)
        return tuple(b.target for b in self._route(url))

    def _route(self, url: Url) -> tuple[Bucket, ...]:
        classes = route(url, self._declarations, charge_origin=False)
        if classes[-1].envelope == url.origin:
            return classes  # no class takes it: the origin alone
        return route(url, self._declarations, charge_origin=self._env(url.origin).own)

    def _key(self, target: str) -> str:
        """The envelope a ``put_envelope``/``envelopes`` target names: a declared target as
        declared (``.../v1/search?region``), else the envelope a request to that URL draws on
        (its most specific class, else its origin). A class form nobody declared is refused: it
        would otherwise quietly become its origin."""
        query = target.partition("?")[2]
        if query and "=" not in query:
            d = declared(target)
            if d.key not in self._declared:
                raise TargetError(f"{target!r} is not a declared query class "
                                  f"(declared: {', '.join(sorted(self._declared)) or 'none'})")
            return d.key
        return route(parse(target), self._declarations, charge_origin=False)[0].envelope

    # ------------------------------------------------------------------ the store

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Every store call: counted, and its ``Date`` header read for the store's time."""
        sent = self._clock()
        with self._lock:
            self.stats.calls += 1
        if operation != "transact_write_items":
            kwargs["TableName"] = self._table
        try:
            response = getattr(self._ddb, operation)(**kwargs)
        except Exception as exc:
            answer = getattr(exc, "response", None)
            self._observe(sent, answer.get("ResponseMetadata", {}) if isinstance(answer, dict) else {})
            raise
        self._observe(sent, response.get("ResponseMetadata", {}))
        return response

    def _observe(self, sent: float, metadata: dict[str, Any]) -> None:
        if self._time is not None and metadata:
            with self._lock:
                self._time.observe(sent, self._clock(), metadata.get("HTTPHeaders"))

    def _now(self) -> tuple[float, float]:
        """(earliest, latest) the store's time can be now."""
        local = self._clock()
        if self._time is None:
            return local, local
        with self._lock:
            bounds = self._time.bounds(local)
        if bounds is None:
            self._call("get_item", Key={"target": {"S": "~clock"}, "item": {"S": "~clock"}})
            with self._lock:
                bounds = self._time.bounds(self._clock())
            if bounds is None:
                raise StoreClockError("the store's responses carry no Date header")
        return bounds

    def _calibrate(self, limit: float = 4.0, pause: float = 0.04, target: float = 0.02) -> None:
        """Read the store's time until its ``Date`` turns a second: the two responses either side
        of the turn bound the offset to about the pause plus a round trip. Then, while the doubt is
        wider than ``target``, probe more densely around the next predicted turns."""
        started = time.monotonic()
        last: Optional[str] = None
        dense = False
        while time.monotonic() - started < limit:
            try:
                response = self._call("get_item", Key={"target": {"S": "~clock"}, "item": {"S": "~clock"}})
            except Exception:  # noqa: BLE001 - an acquire will say the store is unavailable
                return
            date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            if date is None:
                return
            turned = last is not None and date != last
            last = date
            if not turned:
                time.sleep(pause / 4 if dense else pause)
                continue
            with self._lock:
                local = self._clock()
                bounds = self._time.bounds(local) if self._time else None
            if bounds is None or bounds[1] - bounds[0] <= target:  # pragma: no cover - the store answered within ~20 ms
                return
            # The store's next second turns at local time (store second + 1) - offset: wait until
            # just before the earliest it can, then probe four times as often across it.
            offset_high = bounds[1] - local
            next_turn = math.floor(bounds[0]) + 1.0 - offset_high
            time.sleep(max(0.0, next_turn - local - (bounds[1] - bounds[0]) - pause))
            dense = True

    def sync_clock(self) -> Optional[float]:
        """Ask the store for its time now (one cheap read); returns how uncertain this process's
        estimate of the store's time is, in seconds (None without a store clock). Optional: the
        first acquire does it, and every response refines it."""
        if self._time is None:
            return None
        self._call("get_item", Key={"target": {"S": "~clock"}, "item": {"S": "~clock"}})
        with self._lock:
            bounds = self._time.bounds(self._clock())
        return None if bounds is None else bounds[1] - bounds[0]

    def _get(self, key: str, item: str = "bucket") -> dict[str, Any]:
        return self._call("get_item", Key={"target": {"S": key}, "item": {"S": item}},
                          ConsistentRead=True).get("Item", {})

    # ------------------------------------------------------------------ envelopes

    def _declaration(self, key: str) -> tuple[float, int, bool, str]:
        """(rate, burst, own, source) this process declares for an envelope."""
        if key in self._declared:
            e = self._declared[key][1]
            return e.rate_per_second, e.burst, True, "declared"
        return self.default_rate, self.default_burst, False, "default"

    @staticmethod
    def _hash(key: str, rate: float, burst: int, own: bool) -> str:
        text = json.dumps([key, repr(float(rate)), int(burst), own])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _env(self, key: str) -> _Env:
        with self._lock:
            env = self._state.envs.get(key)
        if env is None:
            env = self._load(key)
            with self._lock:
                self._state.envs[key] = env
        return env

    def _forget(self, key: str) -> None:
        origin = declared(key).origin if key else key
        with self._lock:
            self._state.envs.pop(key, None)
            self._state.envs.pop(origin, None)

    def _load(self, key: str) -> _Env:
        """The envelope in force; creates it (version 0) or writes this process's declaration as a
        new version when that declaration was never written before (its hash is not in
        ``declared``), so a restart never undoes an operator's later change. The fleet's default
        envelope is never written over a version an operator set (``put_envelope``): a changed
        default is not a declaration of the target."""
        rate, burst, own, source = self._declaration(key)
        digest = self._hash(key, rate, burst, own)
        for _ in range(5):
            item = self._get(key)
            if "version" not in item:
                # Version 0, or, when the bucket item was deleted but its history was not, the
                # version after the last one recorded. An item without an envelope (only a key,
                # as an unconditional clear_backoff of an earlier release left on a target nobody
                # had used) is no envelope either: write one into it.
                new = self._last_version(key) + 1
                if self._write_version(key, None, rate, burst, own, digest,
                                       f"{source} envelope" if new == 0 else f"{source} envelope (bucket recreated)",
                                       source, new=new):
                    return _Env(key, rate, burst, new, own)
                continue  # pragma: no cover - another process created it between our read and write
            if digest in item.get("declared", {}).get("SS", []):
                return _env_of(key, item)
            version = int(item["version"]["N"])
            if not own and item.get("own", {}).get("BOOL", False) and self._source(key, version) == "operator":
                # A changed fleet default is no declaration of this target: it never replaces an
                # envelope an operator set on it (nothing is written, so the history still ends
                # with the operator's version; a declaration of the target in a recipe would).
                return _env_of(key, item)
            if self._write_version(key, version, rate, burst, own, digest,
                                   f"{source} envelope changed", source):
                return _Env(key, rate, burst, version + 1, own)
        # Five other writers in a row won the race: take what the store holds.
        return _env_of(key, self._get(key))  # pragma: no cover - needs five interleaved writers

    def _source(self, key: str, version: int) -> str:
        """Who wrote a version of an envelope (``declared``, ``default`` or ``operator``), from its
        history item."""
        return self._get(key, f"envelope#{version:06d}").get("source", {}).get("S", "")

    def _last_version(self, key: str) -> int:
        page = self._call("query", KeyConditionExpression="#t = :t AND begins_with(#i, :p)",
                          ExpressionAttributeNames={"#t": "target", "#i": "item"},
                          ExpressionAttributeValues={":t": {"S": key}, ":p": {"S": "envelope#"}},
                          ConsistentRead=True, ScanIndexForward=False, Limit=1, ProjectionExpression="#i")
        items = page.get("Items", [])
        return int(items[0]["item"]["S"].split("#", 1)[1]) if items else -1

    def _write_version(self, key: str, old: Optional[int], rate: float, burst: int, own: bool,
                       digest: Optional[str], reason: str, source: str, new: Optional[int] = None) -> bool:
        """Write version ``old + 1`` (or ``new`` for a new bucket item) of an envelope and its
        history item in one transaction; False when another process changed it first."""
        if new is None:
            new = 0 if old is None else old + 1
        _, latest = self._now()
        values: dict[str, Any] = {":new": _i(new), ":rate": _n(rate), ":burst": _i(burst), ":own": {"BOOL": own}}
        update = "SET #v = :new, rate = :rate, burst = :burst, #o = :own"
        names = {"#v": "version", "#o": "own"}
        if old is None:
            condition = "attribute_not_exists(#v)"
        else:
            condition = "#v = :old"
            values[":old"] = _i(old)
        if digest is not None:
            update += " ADD declared :h"
            values[":h"] = {"SS": [digest]}
            if old is not None:
                condition += " AND NOT contains(declared, :d)"
                values[":d"] = {"S": digest}
        history = {"target": {"S": key}, "item": {"S": f"envelope#{new:06d}"}, "version": _i(new),
                   "rate": _n(rate), "burst": _i(burst), "own": {"BOOL": own}, "effective_from": _n(latest),
                   "reason": {"S": reason[:500]}, "source": {"S": source}}
        if digest is not None:
            history["declared_hash"] = {"S": digest}
        try:
            self._call("transact_write_items", TransactItems=[
                {"Update": {"TableName": self._table, "Key": {"target": {"S": key}, "item": {"S": "bucket"}},
                            "UpdateExpression": update, "ConditionExpression": condition,
                            "ExpressionAttributeNames": names, "ExpressionAttributeValues": values}},
                {"Put": {"TableName": self._table, "Item": history, "ConditionExpression": "attribute_not_exists(#t)",
                         "ExpressionAttributeNames": {"#t": "target"}}},
            ])
        except self._ddb.exceptions.TransactionCanceledException:
            return False
        with self._lock:
            self.stats.writes += 2
        return True

    def put_envelope(self, target: str, rate_per_second: Union[float, str], burst: int, reason: str) -> int:
        """Write a new version of an envelope (an origin, or a declared path or query class) and
        keep the history; returns the version. Every process follows it on its next acquire, and
        a restart does not undo it (only a changed declaration in a recipe does).

        Raises :class:`rayito_constructs.model.rates.RateError` for a rate or burst no envelope may have,
        :class:`TargetError` for a target that is not an envelope, and the store's error when the
        write fails (an operator's call: it should know)."""
        rate = parse_rate(rate_per_second)
        burst = check_burst(burst)
        key = self._key(target)
        for _ in range(10):
            env = self._load(key)
            if self._write_version(key, env.version, rate, burst, True, None, str(reason), "operator"):
                break
        else:  # pragma: no cover - ten concurrent writers in a row won the race
            raise RuntimeError(f"{key}: the envelope kept changing under put_envelope; try again")
        new = env.version + 1
        d = declared(key)
        if d.query_name is not None:
            self._propagate(key, rate, burst, new)
        if key == d.origin and not env.own:
            # Requests of this origin's classes now pay the origin too: move every class's version
            # on so that each process reloads and learns it on its next acquire.
            for other, (od, _) in self._declared.items():
                if od.origin == key and other != key:
                    cls = self._load(other)
                    self._write_version(other, cls.version, cls.rate, cls.burst, cls.own, None,
                                        f"{key} has an envelope of its own now: requests of this class pay it too",
                                        "operator")
                    if od.query_name is not None:
                        self._propagate(other, cls.rate, cls.burst, cls.version + 1)
        with self._lock:
            for k in [k for k in self._state.envs if k == key or declared(k).origin == key]:
                del self._state.envs[k]
            for t in [t for t in self._state.denied if envelope_of(t) == key]:
                del self._state.denied[t]
        return new

    def _propagate(self, key: str, rate: float, burst: int, version: int) -> None:
        """Copy a query class's new envelope into its value buckets (an acquire that finds one not
        yet copied copies it itself)."""
        start: Optional[dict[str, Any]] = None
        while True:
            kwargs: dict[str, Any] = {"KeyConditionExpression": "#t = :t AND begins_with(#i, :p)",
                                      "ExpressionAttributeNames": {"#t": "target", "#i": "item"},
                                      "ExpressionAttributeValues": {":t": {"S": key}, ":p": {"S": "bucket="}},
                                      "ConsistentRead": True, "ProjectionExpression": "#i"}
            if start:  # pragma: no cover - a page is 1 MB: tens of thousands of values of one class
                kwargs["ExclusiveStartKey"] = start
            page = self._call("query", **kwargs)
            for item in page.get("Items", []):
                self._upgrade(Bucket(key, item["item"]["S"][len("bucket="):]), _Env(key, rate, burst, version, True))
            start = page.get("LastEvaluatedKey")
            if not start:  # pragma: no branch - see the 1 MB page above
                return

    def _upgrade(self, bucket: Bucket, env: _Env) -> None:
        # A failed condition: another process copied it first (two upgraders at once).
        with contextlib.suppress(self._ddb.exceptions.ConditionalCheckFailedException):
            self._call("update_item", Key={"target": {"S": bucket.envelope}, "item": {"S": bucket.item}},
                       UpdateExpression="SET #v = :v, rate = :rate, burst = :burst",
                       ConditionExpression="attribute_not_exists(#v) OR #v < :v",
                       ExpressionAttributeNames={"#v": "version"},
                       ExpressionAttributeValues={":v": _i(env.version), ":rate": _n(env.rate), ":burst": _i(env.burst)})

    def envelopes(self, target: str) -> list[dict[str, Any]]:
        """The envelope history of a target, oldest first (version 0 included): read past traffic
        against the envelope in force at the time."""
        key = self._key(target)
        out: list[dict[str, Any]] = []
        start: Optional[dict[str, Any]] = None
        while True:
            kwargs: dict[str, Any] = {"KeyConditionExpression": "#t = :t AND begins_with(#i, :p)",
                                      "ExpressionAttributeNames": {"#t": "target", "#i": "item"},
                                      "ExpressionAttributeValues": {":t": {"S": key}, ":p": {"S": "envelope#"}},
                                      "ConsistentRead": True}
            if start:  # pragma: no cover - a page is 1 MB: thousands of versions of one envelope
                kwargs["ExclusiveStartKey"] = start
            page = self._call("query", **kwargs)
            out.extend(
                {"version": int(i["version"]["N"]), "rate_per_second": float(i["rate"]["N"]),
                 "burst": int(i["burst"]["N"]), "effective_from": float(i["effective_from"]["N"]),
                 "reason": i["reason"]["S"], "source": i["source"]["S"]}
                for i in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:  # pragma: no branch - see the 1 MB page above
                return sorted(out, key=lambda h: h["version"])

    # ------------------------------------------------------------------ acquiring

    def acquire(self, url_or_target: Union[str, Url], cost: int = 1, step: Optional[str] = None) -> Decision:
        """Take ``cost`` tokens from every bucket the request belongs to now, or say when to come
        back. Never raises for a bad target, a bad cost or a store problem."""
        try:
            url = url_or_target if isinstance(url_or_target, Url) else parse(url_or_target)
        except TargetError as exc:
            return self._tell(Deferral(INVALID_TARGET_KEY, 0.0, INVALID_TARGET, None, step=step,
                                       detail=redacted_error(exc, url_or_target)))
        local = self._clock()
        with self._lock:
            outage = self._state.unavailable
        if outage is not None and outage.until > local:
            with self._lock:
                self.stats.cache_denials += 1
            d = outage.deferral
            return self._tell(Deferral(url.origin, outage.until - local, d.reason, None, step=step, detail=d.detail))
        try:
            return self._tell(self._acquire(url, cost, step, local))
        except TargetError as exc:
            return self._tell(Deferral(url.origin, 0.0, INVALID_TARGET, None, step=step, detail=str(exc)))
        except Exception as exc:  # noqa: BLE001 - fail closed on anything the store does
            detail = _error_code(exc)
            log.warning("egress budget store unavailable (%s); deferring requests for %.1f s", detail, self.outage_seconds,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            deferral = Deferral(url.origin, self.outage_seconds, LIMITER_UNAVAILABLE, None, step=step, detail=detail)
            with self._lock:
                self.stats.failures += 1
                self._state.unavailable = _Denied(self._clock() + self.outage_seconds, deferral)
            return self._tell(deferral)

    def _acquire(self, url: Url, cost: int, step: Optional[str], local: float) -> Decision:
        for _ in range(3):
            try:
                return self._acquire_once(url, cost, step, local)
            except _Reroute:
                continue
        # Three envelope changes during one request: decide with what the store says now.
        return self._acquire_once(url, cost, step, local, reroute=False)  # pragma: no cover - three changes in a row

    def _acquire_once(self, url: Url, cost: int, step: Optional[str], local: float, reroute: bool = True) -> Decision:
        buckets = self._route(url)
        envs = [self._env(b.envelope) for b in buckets]
        belongs = tuple(b.target for b in buckets)
        for env in envs:
            try:
                check_cost(cost, env.burst)
            except RateError as exc:
                return Deferral(buckets[0].target, 0.0, INVALID_COST, None, envs[0].version, step,
                                f"cost {exc} ({env.key})", belongs, envs[0].rate, envs[0].burst)
        with self._lock:
            for b in buckets:
                denied = self._state.denied.get(b.target)
                if denied is not None and denied.until > local:
                    # The local negative cache may refuse, never grant.
                    self.stats.cache_denials += 1
                    d = denied.deferral
                    return Deferral(d.target, denied.until - local, d.reason, d.remaining, d.envelope_version, step,
                                    d.detail, belongs, d.rate_per_second, d.burst)
        with self._lock:
            fresh = [b for b in buckets if b.value is not None and b.target not in self._state.seen]
        if fresh:
            # A query class's value bucket this process has not used yet may not exist, and its
            # creation cannot check the class's version: check the class (and its origin) first.
            for key in {b.envelope for b in fresh}:
                item = self._get(key)
                if int(item.get("version", {}).get("N", -1)) != self._env(key).version:
                    self._forget(key)
            buckets = self._route(url)
            belongs = tuple(b.target for b in buckets)
        taken: list[_Taken] = []
        for bucket in buckets:
            try:
                outcome = self._take(bucket, cost, step, belongs, reroute)
            except RateError as exc:  # pragma: no cover - the burst was lowered between the check above and now
                outcome = Deferral(bucket.target, 0.0, INVALID_COST, None, 0, step, f"cost {exc}", belongs)
            except _Reroute:
                for t in taken:
                    self._refund(t)
                raise
            if isinstance(outcome, Deferral):
                for t in taken:
                    self._refund(t)
                return outcome
            taken.append(outcome)
        with self._lock:
            self.stats.grants += 1
        first = taken[0]
        return Granted(first.bucket.target, round(min(t.remaining for t in taken), 3), first.env.version, step,
                       belongs, first.env.rate, first.env.burst)

    def _take(self, bucket: Bucket, cost: int, step: Optional[str], belongs: tuple[str, ...],
              reroute: bool = True) -> Union[_Taken, Deferral]:
        target = bucket.target
        branch = "idle"
        env = self._env(bucket.envelope)
        for attempt in range(6):
            env = self._env(bucket.envelope)
            check_cost(cost, env.burst)
            earliest, latest = self._now()
            if attempt == 0:
                with self._lock:
                    known = self._state.tat.get(target)
                branch = "idle" if known is None or known < latest else "busy"
                limit = earliest + (env.burst - cost) * env.interval + EPSILON
                if known is not None and known > limit:
                    # The arrival time only moves forward (a refund aside): what this process last
                    # saw already refuses, without asking the store.
                    with self._lock:
                        self.stats.cache_denials += 1
                    return self._deny(bucket, env, Deferral(target, known - limit, BUDGET_EMPTY, 0.0, env.version, step,
                                                            "", belongs, env.rate, env.burst), collided=False)
            ok, item = self._update(bucket, env, cost, earliest, latest, branch)
            if ok:
                tat = float(item["tat"]["N"])
                with self._lock:
                    self._state.tat[target] = tat
                    self._state.seen.add(target)
                    # Contention fades slowly: one grant halves the spread window, it does not
                    # drop it, or a process granted once would herd again at once.
                    streak = self._state.streak.get(target, 0) - 1
                    if streak > 0:
                        self._state.streak[target] = streak
                    else:
                        self._state.streak.pop(target, None)
                    self.stats.writes += 1
                remaining = max(0.0, (earliest + env.burst * env.interval - tat) / env.interval)
                return _Taken(bucket, env, remaining, cost)
            if not item or (bucket.value is None and "version" not in item):
                if bucket.value is None:
                    self._forget(bucket.envelope)  # the envelope item is gone (or empty): write it again
                branch = "idle"
                continue
            version = int(item.get("version", {}).get("N", env.version))
            if version != env.version:
                if bucket.value is not None and version < env.version:
                    self._upgrade(bucket, env)
                    continue
                self._forget(bucket.envelope)
                if reroute:
                    raise _Reroute()  # the change may add a bucket (its origin) to the request
                continue  # pragma: no cover - only after three re-routes (see _acquire)
            until = float(item.get("backoff_until", {}).get("N", 0))
            if until > earliest:
                why = item.get("backoff_reason", {}).get("S", "")
                return self._deny(bucket, env, Deferral(target, until - earliest, BACKOFF, 0.0, env.version, step,
                                                        why, belongs, env.rate, env.burst))
            tat_text = item.get("tat", {}).get("N")
            if tat_text is None:  # pragma: no cover - an item that lost its tat between two calls
                branch = "idle"
                continue
            tat = float(tat_text)
            with self._lock:
                self._state.tat[target] = tat
            limit = earliest + (env.burst - cost) * env.interval + EPSILON
            if tat > limit:
                left = max(0.0, (earliest + env.burst * env.interval - tat) / env.interval)
                return self._deny(bucket, env, Deferral(target, tat - limit, BUDGET_EMPTY, round(left, 3), env.version,
                                                        step, "", belongs, env.rate, env.burst))
            branch = "busy" if tat >= latest else "idle"
        # Six conditional writes in a row lost to other processes: defer rather than keep asking.
        return self._deny(bucket, env, Deferral(  # pragma: no cover - needs six interleaved writers
            target, env.interval, BUDGET_EMPTY, 0.0, env.version, step, "contended", belongs, env.rate, env.burst))

    def _update(self, bucket: Bucket, env: _Env, cost: int, earliest: float, latest: float,
                branch: str) -> tuple[bool, dict[str, Any]]:
        """One conditional UpdateItem: (True, new attributes) or (False, the item as it was)."""
        names = {"#v": "version"}
        values: dict[str, Any] = {":v": _i(env.version), ":early": _n(earliest)}
        version_ok = "#v = :v" if bucket.value is None else "(attribute_not_exists(#v) OR #v = :v)"
        not_backoff = "(attribute_not_exists(backoff_until) OR backoff_until <= :early)"
        values[":limit"] = _n(earliest + (env.burst - cost) * env.interval + EPSILON)
        values[":late"] = _n(latest)
        if branch == "idle":
            # The bucket's last arrival may be before the store's time now: the new one is counted
            # from the latest the store's time can be (never a token before it is due).
            update = "SET tat = :new"
            if bucket.value is not None:
                update += ", #v = :v, rate = :rate, burst = :burst"
                values[":rate"] = _n(env.rate)
                values[":burst"] = _i(env.burst)
            condition = f"(attribute_not_exists(tat) OR (tat < :late AND tat <= :limit)) AND {version_ok} AND {not_backoff}"
            values[":new"] = _n(latest + cost * env.interval)
        else:
            update = "SET tat = tat + :step"
            condition = f"tat >= :late AND tat <= :limit AND {version_ok} AND {not_backoff}"
            values[":step"] = _n(cost * env.interval)
        try:
            response = self._call(
                "update_item",
                Key={"target": {"S": bucket.envelope}, "item": {"S": bucket.item}},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except self._ddb.exceptions.ConditionalCheckFailedException as exc:
            return False, exc.response.get("Item") or {}
        return True, response["Attributes"]

    def _refund(self, taken: _Taken) -> None:
        """Give back a token taken from one bucket when another bucket of the request refused."""
        try:
            self._call("update_item",
                       Key={"target": {"S": taken.bucket.envelope}, "item": {"S": taken.bucket.item}},
                       UpdateExpression="SET tat = tat - :step",
                       ConditionExpression="#v = :v AND attribute_exists(tat)",
                       ExpressionAttributeNames={"#v": "version"},
                       ExpressionAttributeValues={":step": _n(taken.cost * taken.env.interval), ":v": _i(taken.env.version)})
            with self._lock:
                self.stats.refunds += 1
                self._state.tat.pop(taken.bucket.target, None)
        except Exception as exc:  # noqa: BLE001 - a token not given back only leaves the envelope unused
            log.info("egress budget: token of %s not given back (%s)", taken.bucket.target, _error_code(exc))

    def _deny(self, bucket: Bucket, env: _Env, deferral: Deferral, collided: bool = True) -> Deferral:
        """Cache a denial until a token is due, spread over the next tokens: a process denied
        ``k`` times in a row wakes at the due time of one of the next ``2^(k-1)`` tokens (at most
        ``max_spread``) picked at random, so about one waiting process wakes per token instead of
        every one of them, and a token that is due finds someone there."""
        target = bucket.target
        with self._lock:
            # Only the store's refusal is news of contention; a refusal this process predicted
            # from its own last grant is not, and must not widen the window.
            streak = self._state.streak.get(target, 0) + (1 if collided else 0)
            if collided:
                self._state.streak[target] = streak
                self.stats.denials += 1
            slots = min(2 ** min(max(streak, 1) - 1, 30), self.max_spread)
            # After a backoff every waiting process may go at once (the bucket has refilled):
            # spread them by up to a tenth of a second each, not by whole refill intervals.
            unit = env.interval if deferral.reason == BUDGET_EMPTY else min(env.interval, 0.1)
            wait = deferral.retry_after_seconds + self._random.randrange(slots) * unit + min(0.01 * env.interval, 0.01)
            spread = Deferral(deferral.target, wait, deferral.reason, deferral.remaining, deferral.envelope_version,
                              deferral.step, deferral.detail, deferral.belongs, deferral.rate_per_second, deferral.burst)
            self._state.denied[target] = _Denied(self._clock() + wait, spread)
        return spread

    def _tell(self, decision: Decision) -> Decision:
        if self._on_decision is not None:
            try:
                self._on_decision(decision)
            except Exception:  # noqa: BLE001 - telemetry must not decide whether a request leaves
                log.exception("egress budget: on_decision failed")
        return decision

    # ------------------------------------------------------------------ what a scheduler sees

    def remaining(self, targets: Iterable[str]) -> dict[str, Optional[float]]:
        """Tokens left now per target, the least of its buckets (0 while in backoff; None when the
        store does not answer): run steps against targets with budget now, push the others later."""
        out: dict[str, Optional[float]] = {}
        for text in targets:
            key = text
            try:
                key = self.target_of(text)
                url = parse(text)
                left = []
                for bucket in self._route(url):
                    env = self._env(bucket.envelope)
                    item = self._get(bucket.envelope, bucket.item)
                    earliest, _ = self._now()
                    if float(item.get("backoff_until", {}).get("N", 0)) > earliest:
                        left.append(0.0)
                        continue
                    rate = float(item["rate"]["N"]) if "rate" in item else env.rate
                    burst = int(item["burst"]["N"]) if "burst" in item else env.burst
                    tat = max(float(item.get("tat", {}).get("N", earliest)), earliest)
                    left.append(max(0.0, burst - (tat - earliest) * rate))
                out[key] = round(min(left), 3)
            except Exception as exc:  # noqa: BLE001 - unknown is not empty
                log.warning("egress budget: remaining of %s unknown (%s)", redact(key), _error_code(exc))
                out[key] = None
        return out

    def backoff(self, url_or_target: Union[str, Url], seconds: float, reason: str) -> bool:
        """Put every bucket of a request's target in backoff for every holder of the envelope (it
        answered 429 or 503). ``seconds`` is capped at ``max_backoff_seconds``; not finite or
        negative is ``max_backoff_seconds`` and 0. Returns False (and never raises) when the store
        could not be told."""
        try:
            seconds = float(seconds)
        except (TypeError, ValueError):
            seconds = self.max_backoff_seconds
        if math.isnan(seconds) or seconds > self.max_backoff_seconds:
            seconds = self.max_backoff_seconds
        seconds = max(0.0, seconds)
        if seconds == 0:
            return True  # nothing to hold: the target said now
        try:
            url = url_or_target if isinstance(url_or_target, Url) else parse(url_or_target)
            buckets = self._route(url)
            _, latest = self._now()
            until = latest + seconds
            for bucket in buckets:
                self._env(bucket.envelope)  # the envelope exists (version 0 in its history)
                try:
                    self._call("update_item", Key={"target": {"S": bucket.envelope}, "item": {"S": bucket.item}},
                               UpdateExpression="SET backoff_until = :until, backoff_reason = :why",
                               ConditionExpression="attribute_not_exists(backoff_until) OR backoff_until < :until",
                               ExpressionAttributeValues={":until": _n(until), ":why": {"S": str(reason)[:200]}})
                    with self._lock:
                        self.stats.writes += 1
                except self._ddb.exceptions.ConditionalCheckFailedException:
                    pass  # a longer backoff is already there
            self._clear_local(buckets)
            return True
        except Exception as exc:  # noqa: BLE001 - the response was answered already; say so, never raise
            log.warning("egress budget: backoff of %s not stored (%s)", _shown(url_or_target), _error_code(exc))
            return False

    def clear_backoff(self, url_or_target: Union[str, Url]) -> bool:
        """End a backoff now (the target recovered, or the Retry-After was wrong). False when the
        store could not be told."""
        try:
            url = url_or_target if isinstance(url_or_target, Url) else parse(url_or_target)
            buckets = self._route(url)
            for bucket in buckets:
                # Conditional: an unconditional REMOVE on a bucket nobody used yet would create
                # an item with a key and nothing else, which is not an envelope. A failed
                # condition: no backoff there (or no bucket at all), nothing to clear.
                with contextlib.suppress(self._ddb.exceptions.ConditionalCheckFailedException):
                    self._call("update_item", Key={"target": {"S": bucket.envelope}, "item": {"S": bucket.item}},
                               UpdateExpression="REMOVE backoff_until, backoff_reason",
                               ConditionExpression="attribute_exists(backoff_until)")
            self._clear_local(buckets)
            return True
        except Exception as exc:  # noqa: BLE001
            log.warning("egress budget: backoff of %s not cleared (%s)", _shown(url_or_target), _error_code(exc))
            return False

    def _clear_local(self, buckets: Iterable[Bucket]) -> None:
        with self._lock:
            for b in buckets:
                self._state.denied.pop(b.target, None)
                self._state.streak.pop(b.target, None)
                self._state.tat.pop(b.target, None)


def _env_of(key: str, item: dict[str, Any]) -> _Env:
    return _Env(key, float(item["rate"]["N"]), int(item["burst"]["N"]), int(item["version"]["N"]),
                bool(item.get("own", {}).get("BOOL", False)))


def _shown(url_or_target: Union[str, Url]) -> str:
    """A URL as a log line may show it: its origin, or the text redacted (no user info, no query
    values)."""
    return url_or_target.origin if isinstance(url_or_target, Url) else redact(url_or_target)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        if code:
            return str(code)
    return type(exc).__name__


def _n(value: float) -> dict[str, str]:
    return {"N": str(Decimal(repr(float(value))))}


def _i(value: int) -> dict[str, str]:
    return {"N": str(int(value))}
