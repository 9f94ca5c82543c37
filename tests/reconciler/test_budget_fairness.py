"""The place in line of the shared control-plane budget (lambdas/reconciler/budget.py): the rate bound with several processes, skewed clocks, costs 1-4 and horizon
caps; a holder refused forever; a clock far ahead writing the bucket while someone holds the place;
bad clocks (NaN); the in-process store against the DynamoDB one for the same sequence. Every
assertion is on ground truth: the grants' use times (``now + wait_seconds`` on the asker's clock,
minus its skew: true time), never the store's own counters."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

import pytest

from lambdas.reconciler.budget import (
    NEXT_IN_LINE_GRACE_SECONDS,
    Deferral,
    DynamoDBBudget,
    Granted,
    MemoryBudget,
)

from .harness import aws_client

NOW = 1_790_000_000.0
OP = "RunMicrovm"



def _ddb(aws: str, shape: dict) -> Any:
    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    return lambda: DynamoDBBudget(ddb, table, shape)


def _factory(kind: str, request: Any, shape: dict) -> Any:
    if kind == "memory":
        shared = MemoryBudget(shape)
        return lambda: shared
    return _ddb(request.getfixturevalue("aws"), shape)


def _worst_window(uses: list[tuple[float, int]], window: float) -> float:
    """The most tokens used in any window of ``window`` seconds (true time)."""
    uses = sorted(uses)
    worst = 0
    for i, (at, _) in enumerate(uses):
        worst = max(worst, sum(c for u, c in uses[i:] if u < at + window - 1e-6))
    return worst


def _simulate(make: Any, shape: tuple[float, float], skews: list[float], askers: int, seconds: float,
              seed: int, cap: bool, step: float = 0.1) -> tuple[list[tuple[float, int]], Counter]:
    """``len(skews)`` processes (one budget object each, its clock ``skew`` off) and ``askers``
    askers spread over them, asks of 1-burst tokens with a 2 s horizon (some capped) in a shuffled
    order: the grants' true use times and the grants per asker."""
    rate, burst = shape
    processes = [make() for _ in skews]
    rng = random.Random(seed)
    people = [(f"f{i}", i % len(skews), 1 + i % int(burst)) for i in range(askers)]
    busy = {name: NOW for name, _, _ in people}
    served: Counter = Counter()
    uses: list[tuple[float, int]] = []
    t = NOW
    while t < NOW + seconds:
        rng.shuffle(people)
        for name, p, cost in people:
            if busy[name] > t:
                continue
            skew = skews[p]
            horizon_cap = rng.choice([None, 2.0, 2.5, 3.3]) if cap else None
            d = processes[p].acquire(OP, t + skew, cost=cost, horizon=2.0, asker=name, horizon_cap=horizon_cap)
            if isinstance(d, Granted):
                at = t + d.wait_seconds  # its own clock's now + wait, minus its skew
                uses.append((at, cost))
                served[name] += 1
                busy[name] = at + 0.01
        t = round(t + step, 6)
    return uses, served


# --- what held -----------------------------------------------------------------------------------


STARVES_TWO_SECONDS_BEHIND = pytest.mark.xfail(strict=True, reason=(
    "found: with clocks at -2, 0 and +2 s (the brief's skew range, a spread of 4 s, twice "
    "NEXT_IN_LINE_BONUS_SECONDS) the process 2 s behind starves: its 3 askers get 0-1 grants in 20 s "
    "while the process 2 s ahead's get 13-15 each and the one at 0 s 2-5 (seeds 1-3). The place in line gives 2 s more of "
    "reach (budget.py NEXT_IN_LINE_BONUS_SECONDS); a process behind by more than that loses every "
    "refill to the one ahead, whose plain line is already further. The rate bound itself holds. "
    "(test_reconciler_attack.py's docstring reports the same at 2.5 s between two processes; it is "
    "safe only if the skew left after learning the service's clock stays under ~2 s in all.)"))


@pytest.mark.parametrize(("skew", "seed", "served_at_least"), [
    (1.0, 1, 3), (1.0, 3, 3),
    pytest.param(2.0, 1, 2, marks=STARVES_TWO_SECONDS_BEHIND),
])
def test_memory_three_processes_skewed_each_way_keep_the_rate_and_serve_everyone(skew, seed, served_at_least) -> None:
    """Three processes at -skew, 0, +skew on one in-process bucket (4.75/s, burst 4), 9 askers of
    1-4 tokens, 20 s: every window holds burst + rate x (window + the skews' spread) and every
    asker is served (measured at 1 s: 4-8 each)."""
    shape = (4.75, 4.0)
    shared = MemoryBudget({OP: shape})
    uses, served = _simulate(lambda: shared, shape, [-skew, 0.0, skew], 9, 20.0, seed, cap=False)
    for window in (0.5, 1.0, 5.0, 20.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * (window + 2 * skew) + 1e-6, window
    assert len(served) == 9 and min(served.values()) >= served_at_least, served


def test_dynamodb_two_processes_two_seconds_apart_with_caps_keep_the_rate(aws) -> None:
    """The same on the DynamoDB store (moto), 2 processes at -1 and +1 s, 6 askers, 8 s."""
    shape = (4.75, 4.0)
    make = _ddb(aws, {OP: shape})
    uses, served = _simulate(make, shape, [-1.0, 1.0], 6, 8.0, 5, cap=True, step=0.2)
    for window in (0.5, 1.0, 5.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * (window + 2.0) + 1e-6, window
    assert len(served) == 6, served


def test_memory_hundreds_of_churning_askers_keep_the_rate_and_the_place_moves_on() -> None:
    """300 askers, each asking a few times then going away for good (the holder of the place among
    them): the rate holds and askers arriving late are still served."""
    shape = (4.75, 4.0)
    budget = MemoryBudget({OP: shape})
    rng = random.Random(7)
    uses: list[tuple[float, int]] = []
    late_served = 0
    t = NOW
    for i in range(300):
        name = f"churn-{i}"
        cost = rng.randint(1, 4)
        for _ in range(rng.randint(1, 3)):
            d = budget.acquire(OP, t, cost=cost, horizon=2.0, asker=name)
            if isinstance(d, Granted):
                uses.append((t + d.wait_seconds, cost))
                if i >= 250:
                    late_served += 1
                break
            t = round(t + min(d.retry_after_seconds, 0.3), 6)
        t = round(t + 0.05, 6)
    for window in (0.5, 1.0, 5.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * window + 1e-6, window
    assert late_served >= 10


@pytest.mark.parametrize("kind", ["memory", "dynamodb"])
def test_a_holder_refused_forever_holds_nobody_back(kind, request) -> None:
    """The holder of the place asks every 0.1 s with a horizon it can never reach (capped at its
    horizon: no bonus) and a cost of the whole burst; another asker of one token keeps its pace."""
    shape = (2.0, 2.0)
    make = _factory(kind, request, {OP: shape})
    a, b = make(), make()
    while isinstance(a.acquire(OP, NOW, horizon=2.0), Granted):
        pass
    assert isinstance(a.acquire(OP, NOW, cost=2, horizon=0.05, asker="stuck", horizon_cap=0.05), Deferral)
    others: list[float] = []
    t = NOW
    while t < NOW + 10:
        a.acquire(OP, t, cost=2, horizon=0.05, asker="stuck", horizon_cap=0.05)
        d = b.acquire(OP, t, horizon=2.0, asker="other")
        if isinstance(d, Granted):
            others.append(t + d.wait_seconds)
        t = round(t + 0.25, 6)
    # 2/s over 10 s shared with "stuck" (which gets some tokens when the bucket idles): "other"
    # is served steadily, no gap of more than 3 s.
    assert len(others) >= 6, others
    gaps = [b2 - b1 for b1, b2 in zip([NOW] + others, others)]
    assert max(gaps) <= 3.5 + 1e-6, gaps


def test_an_asker_name_reused_by_two_processes_does_not_break_the_rate(aws) -> None:
    """Two processes ask under the same asker name (two fleets with one name on one table): they
    share the place; the rate holds."""
    shape = (4.75, 4.0)
    make = _ddb(aws, {OP: shape})
    p, q = make(), make()
    uses: list[tuple[float, int]] = []
    t = NOW
    while t < NOW + 6:
        for proc, skew in ((p, 0.5), (q, -0.5)):
            for cost in (1, 3):
                d = proc.acquire(OP, t + skew, cost=cost, horizon=2.0, asker="same")
                if isinstance(d, Granted):
                    uses.append((t + d.wait_seconds, cost))
        t = round(t + 0.2, 6)
    for window in (0.5, 1.0, 5.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * (window + 1.0) + 1e-6, window


@pytest.mark.parametrize("cap", [float("nan"), float("-inf"), -5.0, float("inf"), 0.0])
def test_bad_horizon_caps_never_reach_past_horizon_plus_bonus(cap) -> None:
    shape = (2.0, 2.0)
    budget = MemoryBudget({OP: shape})
    while isinstance(budget.acquire(OP, NOW, horizon=2.0), Granted):
        pass
    uses = []
    for k in range(40):
        d = budget.acquire(OP, NOW + k * 0.1, horizon=2.0, asker="x", horizon_cap=cap)
        if isinstance(d, Granted):
            assert d.wait_seconds <= 2.0 + 2.0 + 0.5 + 1e-6
            uses.append((NOW + k * 0.1 + d.wait_seconds, 1))
    assert _worst_window(uses, 1.0) <= 2 + 2.0 * 1.0 + 1e-6


def test_the_bucket_item_deleted_while_someone_holds_the_place(aws) -> None:
    """The DynamoDB item deleted (by hand, a restore) while "holder" holds the place and another
    process guesses the bucket busy: both are served from the fresh bucket, within its burst."""
    shape = {OP: (2.0, 2.0)}
    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    here, there = DynamoDBBudget(ddb, table, shape), DynamoDBBudget(ddb, table, shape)
    while isinstance(there.acquire(OP, NOW, horizon=2.0), Granted):
        pass
    assert isinstance(here.acquire(OP, NOW, horizon=2.0, asker="holder"), Deferral)
    ddb.delete_item(TableName=table, Key={"operation": {"S": OP}})
    first = here.acquire(OP, NOW + 0.1, horizon=2.0, asker="holder")
    second = there.acquire(OP, NOW + 0.1, horizon=2.0, asker="other")
    assert isinstance(first, Granted) and first.wait_seconds == 0.0
    assert isinstance(second, Granted) and second.wait_seconds <= 1e-6
    # the fresh bucket still limits: 2 + 2 s x 2/s at most, all asks at one instant
    more = sum(isinstance(there.acquire(OP, NOW + 0.1, horizon=2.0), Granted) for _ in range(20))
    assert 2 + more <= 2 + 2.0 * 2.0 + 1


# --- what broke ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "dynamodb"])
def test_a_slow_bucket_with_batch_asks_is_never_reset_by_its_own_reservations(kind, request) -> None:
    shape = (0.2, 3.0)
    budget = _factory(kind, request, {OP: shape})()
    uses: list[tuple[float, int]] = []
    for k in range(40):
        now = NOW + k * 0.5
        d = budget.acquire(OP, now, cost=3, horizon=2.0, asker="batch")
        if isinstance(d, Granted):
            uses.append((now + d.wait_seconds, 3))
    assert _worst_window(uses, 20.0) <= 3 + 0.2 * 20.0 + 1e-6, sorted(uses)


def test_a_nan_clock_does_not_unlock_the_bucket_forever() -> None:
    """A NaN clock compared False everywhere: granted, and a NaN stored in the memory store granted
    every later ask (found: 50 of 50 at one instant). Now refused as the caller's bug it is, with
    the bucket untouched."""
    budget = MemoryBudget({OP: (2.0, 2.0)})
    with pytest.raises(ValueError, match="not finite"):
        budget.acquire(OP, float("nan"), horizon=2.0, asker="nan-clock")
    granted = sum(isinstance(budget.acquire(OP, NOW, horizon=2.0, asker=f"a{i}"), Granted) for i in range(50))
    assert granted <= 2 + 2.0 * 2.0 + 1, granted


@pytest.mark.parametrize("horizon", [float("nan"), float("inf")])
def test_a_nan_horizon_is_not_a_free_pass(horizon) -> None:
    budget = MemoryBudget({OP: (2.0, 2.0)})
    with pytest.raises(ValueError, match="not finite"):
        budget.acquire(OP, NOW, horizon=horizon)
    assert budget.remaining(OP, NOW) == 2.0


def test_the_holder_of_the_place_is_not_stalled_by_a_clock_far_ahead(aws) -> None:
    shape = (2.0, 2.0)
    make = _ddb(aws, {OP: shape})
    here, ahead, other = make(), make(), make()
    while isinstance(here.acquire(OP, NOW, horizon=2.0), Granted):
        pass
    assert isinstance(here.acquire(OP, NOW, horizon=2.0, asker="holder"), Deferral)  # takes the place
    # A fleet whose clock runs 20 s ahead needs 5 tokens: all granted on its own clock (never
    # refused, so it never takes the place), tat left ~20 s ahead of the true clock.
    for _ in range(5):
        assert isinstance(ahead.acquire(OP, NOW + 20, horizon=2.0, asker="ahead"), Granted)
    # The holder (found: refused 30 times over 3 s, each told to wait ~18 s, while anyone else
    # reset the implausible bucket and was granted) resets it too, and the place is freed.
    first = here.acquire(OP, NOW + 0.1, horizon=2.0, asker="holder")
    assert isinstance(first, Granted) and first.wait_seconds == 0.0, first
    assert isinstance(other.acquire(OP, NOW + 0.2, horizon=2.0, asker="anyone"), Granted)


def test_both_stores_free_the_place_when_its_holder_is_granted_on_an_idle_bucket(request) -> None:
    shape = (2.0, 2.0)
    outcomes = {}
    for kind in ("memory", "dynamodb"):
        budget = _factory(kind, request, {OP: shape})()
        while isinstance(budget.acquire(OP, NOW, horizon=2.0), Granted):
            pass  # tat ~ NOW + 3
        # "x" asks with no room for a bonus (capped at its horizon): refused, takes the place,
        # told to come back in ~2.4 s (its place kept until then + GRACE: NOW + 5.4).
        first = budget.acquire(OP, NOW, horizon=0.1, asker="x", horizon_cap=0.1)
        assert isinstance(first, Deferral)
        assert NOW + first.retry_after_seconds + NEXT_IN_LINE_GRACE_SECONDS > NOW + 4.0
        # "x" comes back once the bucket is idle: granted at once (both stores).
        assert isinstance(budget.acquire(OP, NOW + 3.5, horizon=0.1, asker="x", horizon_cap=0.1), Granted)
        t = NOW + 3.5
        while isinstance(budget.acquire(OP, t, horizon=2.0), Granted):
            pass
        # "y", refused now, should take the free place and be granted on the later line next.
        budget.acquire(OP, t, horizon=2.0, asker="y")
        outcomes[kind] = type(budget.acquire(OP, t + 0.1, horizon=2.0, asker="y")).__name__
    assert outcomes["memory"] == outcomes["dynamodb"] == "Granted", outcomes


@pytest.mark.xfail(strict=True, reason=(
    "found (not new with the place in line: the same with asker=None): a clock 12-30 s ahead and "
    "one on true time ping-pong the bucket's reset, and the service sees about ten times the "
    "quota. The process ahead reserves on its own clock (tat ~ its now + 2 s + burst); the other "
    "finds tat past implausible() (budget.py: now + burst/rate + MAX_HORIZON_SECONDS + "
    "SKEW_SLACK_SECONDS), resets it to its now and takes a burst and a horizon's worth; the process "
    "ahead then finds tat far behind its clock (the 'idle' attempt / max(tat, now)) and takes its "
    "own burst and horizon again, on every 0.1 s round. Measured (4.75/s, burst 4, skew 20 s, "
    "memory store, 20 s): 276 calls in the worst 5 s window (true time) against a bound of "
    "4 + 4.75 x (5 + 20) = 123 even granting the whole skew. The reset keeps one skewed clock "
    "from stalling everyone, but nothing limits how often it may happen."))
@pytest.mark.parametrize("kind", ["memory", "dynamodb"])
def test_a_clock_far_ahead_does_not_multiply_the_rate(kind, request) -> None:
    shape = (4.75, 4.0)
    make = _factory(kind, request, {OP: shape})
    seconds = 20.0 if kind == "memory" else 6.0  # DynamoDB (moto): 273 calls in its 6 s
    uses, _ = _simulate(make, shape, [0.0, 20.0], 4, seconds, 1, cap=False)
    window = min(5.0, seconds)
    assert _worst_window(uses, window) <= 4 + 4.75 * (window + 20.0) + 1e-6


def test_memory_and_dynamodb_give_the_same_answers_for_the_same_asks(aws) -> None:
    shape = {OP: (2.0, 2.0)}
    differences = []
    for seed in (2, 5, 8):
        rng = random.Random(seed)
        mem, ddb = MemoryBudget(shape), _ddb(aws, shape)()
        t = NOW
        for k in range(40):
            t = round(t + rng.choice([0, 0.05, 0.1, 0.3, 1.0, 3.5]), 6)
            cost, horizon = rng.randint(1, 2), rng.choice([0.0, 0.1, 2.0])
            asker, cap = rng.choice([None, "a", "b", "c"]), rng.choice([None, horizon, 2.5])
            m = mem.acquire(OP, t, cost=cost, horizon=horizon, asker=asker, horizon_cap=cap)
            d = ddb.acquire(OP, t, cost=cost, horizon=horizon, asker=asker, horizon_cap=cap)
            if type(m) is not type(d) or (isinstance(m, Granted) and abs(m.wait_seconds - d.wait_seconds) > 1e-3):
                differences.append((seed, k, m, d))
                break
    assert not differences, differences