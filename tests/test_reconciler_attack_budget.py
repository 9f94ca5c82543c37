"""Attack on the place in line of the shared control-plane budget (lambdas/reconciler/budget.py,
f453e22 and after): the rate bound with several processes, skewed clocks, costs 1-4 and horizon
caps; a holder refused forever; a clock far ahead writing the bucket while someone holds the place;
bad clocks (NaN); the in-process store against the DynamoDB one for the same sequence. Every
assertion is on ground truth: the grants' use times (``now + wait_seconds`` on the asker's clock,
minus its skew: true time), never the store's own counters."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any, Iterator

import pytest

from lambdas.reconciler.budget import (
    NEXT_IN_LINE_GRACE_SECONDS,
    Deferral,
    DynamoDBBudget,
    Granted,
    MemoryBudget,
)

from .moto_server import moto_server
from .reconciler_harness import aws_client

NOW = 1_790_000_000.0
OP = "RunMicrovm"


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


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


@pytest.mark.parametrize("seed", [1, 3])
def test_memory_three_processes_a_second_each_way_keep_the_rate_and_serve_everyone(seed) -> None:
    """Three processes at -1, 0, +1 s on one in-process bucket (4.75/s, burst 4), 9 askers of 1-4
    tokens, 20 s: every window holds burst + rate x (window + 2 s of skew spread) and every asker
    is served at least 3 times (measured: 4-8 each)."""
    shape = (4.75, 4.0)
    shared = MemoryBudget({OP: shape})
    uses, served = _simulate(lambda: shared, shape, [-1.0, 0.0, 1.0], 9, 20.0, seed, cap=False)
    for window in (0.5, 1.0, 5.0, 20.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * (window + 2.0) + 1e-6, window
    assert len(served) == 9 and min(served.values()) >= 3, served


@pytest.mark.xfail(strict=True, reason=(
    "found: with clocks at -2, 0 and +2 s (the brief's skew range, a spread of 4 s, twice "
    "NEXT_IN_LINE_BONUS_SECONDS) the process 2 s behind starves: its 3 askers get 0-1 grants in 20 s "
    "while the process 2 s ahead's get 13-15 each and the one at 0 s 2-5 (seeds 1-3). The place in line gives 2 s more of "
    "reach (budget.py NEXT_IN_LINE_BONUS_SECONDS); a process behind by more than that loses every "
    "refill to the one ahead, whose plain line is already further. The rate bound itself holds. "
    "(test_reconciler_attack.py's docstring reports the same at 2.5 s between two processes; it is "
    "safe only if the skew left after learning the service's clock stays under ~2 s in all.)"))
@pytest.mark.parametrize("seed", [1])
def test_memory_three_processes_two_seconds_each_way_serve_everyone(seed) -> None:
    shape = (4.75, 4.0)
    shared = MemoryBudget({OP: shape})
    uses, served = _simulate(lambda: shared, shape, [-2.0, 0.0, 2.0], 9, 20.0, seed, cap=False)
    for window in (0.5, 1.0, 5.0, 20.0):
        assert _worst_window(uses, window) <= 4 + 4.75 * (window + 4.0) + 1e-6, window
    assert len(served) == 9 and min(served.values()) >= 2, served


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


@pytest.mark.xfail(strict=True, reason=(
    "found: one process with no skew resets its own bucket. budget.implausible() allows a stored "
    "tat up to now + burst*interval + MAX_HORIZON_SECONDS(4) + SKEW_SLACK(5), but an admitted ask "
    "leaves tat up to admission_limit (now + horizon + bonus + (burst-1)*interval) + cost*interval, "
    "i.e. (cost-1)*interval more than burst*interval + horizon + bonus (budget.py admission_limit "
    "and the MemoryBudget/DynamoDB 'tat + cost * interval' updates). With a valid user budget of "
    "(0.2/s, burst 3) and asks of 3 tokens (tick._admit asks min(want, burst)) tat reaches "
    "now + 2 + 2 + 10 + 15 = now + 29 > now + 24: the next ask sees an 'implausible' tat, resets it "
    "to now and is granted the whole burst again; 27 grants (81 tokens) in 20 s instead of at most "
    "3 + 0.2 x 20 = 7 tokens. MAX_HORIZON/implausible must count (burst + cost - 1) * interval."))
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


@pytest.mark.xfail(strict=True, reason=(
    "found: a NaN clock poisons MemoryBudget for good. acquire() computes tat = max(stored, now): "
    "with now NaN and no stored tat it is NaN, 'tat > implausible(...)' and 'tat > limit' are both "
    "False, so the ask is granted and _tat becomes NaN + cost*interval = NaN; afterwards "
    "max(NaN, now) keeps NaN (max returns its first argument when the second is not greater) and "
    "every later ask with a sane clock is granted at once: unlimited calls. acquire() takes `now` "
    "unchecked (budget.py MemoryBudget.acquire, the `tat = max(self._tat.get(operation, now), now)` "
    "line); a non-finite now should be refused (or raise) before touching the bucket."))
def test_a_nan_clock_does_not_unlock_the_bucket_forever() -> None:
    budget = MemoryBudget({OP: (2.0, 2.0)})
    budget.acquire(OP, float("nan"), horizon=2.0, asker="nan-clock")
    granted = sum(isinstance(budget.acquire(OP, NOW, horizon=2.0, asker=f"a{i}"), Granted) for i in range(50))
    assert granted <= 2 + 2.0 * 2.0 + 1, granted


@pytest.mark.xfail(strict=True, reason=(
    "found: a NaN horizon is granted every time by MemoryBudget: admission_limit() returns NaN, "
    "'tat > limit' is False, so the ask is Granted (wait max(0.0, ...) = 0: at once); 50 asks at "
    "one instant all granted (the rate bound allows 7). horizon (and now) are not checked for "
    "being finite in acquire()."))
def test_a_nan_horizon_is_not_a_free_pass() -> None:
    budget = MemoryBudget({OP: (2.0, 2.0)})
    granted = sum(isinstance(budget.acquire(OP, NOW, horizon=float("nan")), Granted) for _ in range(50))
    assert granted <= 2 + 2.0 * 2.0 + 1, granted


@pytest.mark.xfail(strict=True, reason=(
    "found: the DynamoDB holder of the place is stalled by a bucket a clock far ahead wrote. "
    "DynamoDBBudget._as_first's refusal branch returns Deferral(tat - limit) whenever next_asker is "
    "still the asker and tat > now, without the implausible() check that _acquire does (the "
    "'tat > implausible(...) and attempt == \"busy\": continue' reset): a process 20 s ahead "
    "reserving on its own clock leaves tat ~20 s ahead, every other asker is granted at once by the "
    "reset, but the asker next in line is told to come back in ~18 s, again and again until its "
    "own clock catches up. MemoryBudget resets and grants it (the stores disagree). Being next in "
    "line makes it the only one starved."))
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
    # The holder: 30 asks over 3 s, none granted, each told to wait ~18 s...
    decisions = [here.acquire(OP, NOW + 0.1 + k * 0.1, horizon=2.0, asker="holder") for k in range(30)]
    held_back = [round(d.retry_after_seconds, 1) for d in decisions[:3] if isinstance(d, Deferral)]
    # ...while an asker that is not next in line resets the implausible bucket and is granted.
    assert isinstance(other.acquire(OP, NOW + 3.2, horizon=2.0, asker="anyone"), Granted)
    assert any(isinstance(d, Granted) for d in decisions), held_back


@pytest.mark.xfail(strict=True, reason=(
    "found: MemoryBudget and DynamoDBBudget disagree once the holder is granted on an idle bucket. "
    "MemoryBudget frees the place on any grant of its holder ('if first: del self._line'); "
    "DynamoDBBudget._as_first's condition 'tat > :now' fails on an idle bucket, it discards "
    "_in_line and the plain _acquire grants with 'SET tat = :new', which never REMOVEs next_asker/"
    "next_until: the place stays with the asker just served until next_until + GRACE, and the next "
    "asker refused cannot take it (DynamoDB: refused on the plain line; memory: granted on the later "
    "line). The same for a holder granted on its plain line after a cold start (_in_line is per "
    "process)."))
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


@pytest.mark.xfail(strict=True, reason=(
    "found: for one sequence of asks from one process (no skew) the two stores disagree "
    "(seeds 2, 5, 8 of 0-11 tried, 40 asks each, costs 1-2, horizons 0/0.1/2, caps, askers a/b/c/None): seed 2, "
    "ask 24 (asker 'a', horizon 0.1, cost 2) is granted by MemoryBudget on the later line (wait "
    "1.1 s) and refused by DynamoDBBudget (0.05 s). Root cause at ask 3: 'c', holder of the place, "
    "is granted on an idle bucket; memory frees the place, DynamoDB's idle write (_acquire's "
    "'SET tat = :new') leaves next_asker 'c'. So at ask 5 'a' takes the place in memory but not in "
    "DynamoDB (c's stale place is kept until next_until + GRACE), and from then on the stores "
    "hold different places (see test_both_stores_free_the_place_when_its_holder_is_granted_on_an_"
    "idle_bucket). The benchmark's store is not the production one's behaviour."))
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


@pytest.mark.parametrize("skew", [-1.7])
def test_two_fleets_on_one_budget_table_one_clock_skewed_end_to_end(aws, monkeypatch, skew) -> None:
    """The built reconcilers of two fleets (7 VMs each, no warm slots) on one budget table, their
    steps interleaved on the emulator's clock, the second fleet's clock ``skew`` off (what it learns
    from DynamoDB's Date, in whole seconds, leaves under a second): from the emulator's request log,
    RunMicrovm stays within the documented quota (5/s, burst 5) in every window, none is
    throttled, and both fleets converge within the tick."""
    from .reconciler_harness import deployed_fleet
    from .test_reconciler_attack import dynamodb_dates_on

    env = {"MIN_VMS": "7", "WARM_VMS": "0", "MAX_VMS": "7"}
    with deployed_fleet(aws, env=env) as a:
        with deployed_fleet(aws, emulator=a.emulator, fleet="otra",
                            env={**env, "BUDGET_TABLE": a.env["BUDGET_TABLE"]}) as b:
            ra, rb = a.reconciler(monkeypatch), b.reconciler(monkeypatch)
            rb.clock = lambda: a.clock.now() + skew
            for r in (ra, rb):
                dynamodb_dates_on(r, a.clock)
            start = a.clock.now()
            assert ra.begin_tick(120, 50) and rb.begin_tick(120, 50)
            wake = {0: start, 1: start}
            reconcilers = {0: ra, 1: rb}
            steps = 0
            while wake and a.clock.now() < start + 20:  # 14 runs at 4.75/s: converged well before
                steps += 1
                who = min(wake, key=wake.get)
                if wake[who] > a.clock.now():
                    a.clock.advance(wake[who] - a.clock.now())
                result = reconcilers[who].step()
                if result.wake_after is None:
                    del wake[who]
                else:
                    wake[who] = a.clock.now() + result.wake_after
            for r in (ra, rb):
                r.end_tick()
            runs = sorted(rec.time for rec in a.emulator.requests if rec.operation == "RunMicrovm")
            assert a.emulator.throttled.get("RunMicrovm", 0) == 0
            for i, at in enumerate(runs):
                for window in (0.5, 1.0, 3.0):
                    within = sum(1 for u in runs[i:] if u < at + window - 1e-6)
                    assert within <= 5 + 5 * window + 1e-6, (at - start, window, within)
            by_fleet = Counter(rec.caller for rec in a.emulator.requests if rec.operation == "RunMicrovm")
            assert len(runs) >= 14, (len(runs), by_fleet, steps)
            assert len(a.ours()) == 7 and len(b.ours()) == 7, (len(a.ours()), len(b.ours()))
