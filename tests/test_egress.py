"""The shared envelope in the store: moto's DynamoDB over real HTTP, the production store client,
the store's clock made virtual through its Date header (the only thing a test moves)."""

from __future__ import annotations

import threading
import uuid
from typing import Iterator

import pytest

from rayito_constructs.egress import BudgetClient, Deferral, Envelope, Granted, RateError, TargetError

from .egress_support import Clock, conforms, counting_store, ddb, hung_store, new_client, virtual_store_time

API = "https://api.example.com"
SEARCH = f"{API}/v1/search?region"


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


@pytest.fixture
def table(store) -> str:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), name)
    return name


def tries(client, url, n, clock, step=0.002) -> list[bool]:
    """``n`` acquires a few milliseconds apart (the store's time is known to a millisecond)."""
    out = []
    for _ in range(n):
        out.append(isinstance(client.acquire(url), Granted))
        clock.now += step
    return out


def drive(clients, clock, url, seconds, tick=0.05, grants=None) -> int:
    """Every client tries once per tick for ``seconds``; returns the grants (times in ``grants``)."""
    count = 0
    for _ in range(round(seconds / tick)):
        for c in clients:
            if isinstance(c.acquire(url), Granted):
                count += 1
                if grants is not None:
                    grants.append((clock.now, clock.now))
        clock.now += tick
    return count


def test_processes_sharing_a_target_stay_within_the_envelope_and_use_it(store, table) -> None:
    clock = Clock()
    clients = [new_client(store, table, clock, envelopes=[Envelope(API, 10, 5)]) for _ in range(4)]
    grants: list[tuple[float, float]] = []
    window = 6.0
    total = drive(clients, clock, f"{API}/v1/items", window, grants=grants)
    assert conforms(grants, rate=10, burst=5) is None
    assert total <= 10 * window + 5
    # The envelope is used, not wasted: after the first second (the store's clock is then known
    # to a tick), every refill interval has its grant.
    late = [t for t, _ in grants if t >= grants[0][0] + 1.0]
    assert len(late) >= 0.9 * 10 * (window - 1.0)
    left = clients[0].remaining([API])[API]
    assert left is not None and left <= 5


def test_other_targets_are_unaffected(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 1, 1)], default_rate=5, default_burst=5)
    assert isinstance(c.acquire(API), Granted)
    assert isinstance(c.acquire(API), Deferral)
    assert sum(isinstance(c.acquire("https://other.example.org/x"), Granted) for _ in range(5)) >= 4


def test_a_deferral_is_structured_and_cached(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 2, 1)])
    first = c.acquire(API, step="plan-3")
    assert isinstance(first, Granted) and first.envelope_version == 0 and first.step == "plan-3"
    assert first.charged == (API,) and first.rate_per_second == 2.0 and first.burst == 1
    before = store.total()
    denied = [c.acquire(API, step="plan-4") for _ in range(20)]
    assert all(isinstance(d, Deferral) and d.reason == "budget_empty" for d in denied)
    assert denied[0].step == "plan-4" and denied[0].belongs == (API,)
    assert 0.0 < denied[0].retry_after_seconds <= 0.5 + 1.0 + 0.5  # next token, the store clock's doubt, the spread
    assert store.total() - before <= 2  # one denial (two branches at most), then the local cache
    clock.now += denied[-1].retry_after_seconds + 1.0
    assert isinstance(c.acquire(API), Granted)


def test_every_version_is_recorded_version_0_included(store, table) -> None:
    clock = Clock()
    a = new_client(store, table, clock, envelopes=[Envelope(API, 10, 10)])
    b = new_client(store, table, clock, envelopes=[Envelope(API, 10, 10)])
    assert drive([a, b], clock, API, 1.0) <= 20
    version = a.put_envelope(f"{API}/any/path", rate_per_second="2/s", burst=1, reason="the API answered 429 at 10/s")
    assert version == 1
    clock.now += 10
    grants: list[tuple[float, float]] = []
    drive([a, b], clock, API, 3.0, grants=grants)
    assert conforms(grants, rate=2, burst=1) is None
    last = b.acquire(API)
    assert last.envelope_version == 1  # b learned the new version from the store, no restart
    history = a.envelopes(API)
    assert [(h["version"], h["rate_per_second"], h["burst"], h["source"]) for h in history] == [
        (0, 10.0, 10, "declared"), (1, 2.0, 1, "operator")]
    assert history[1]["reason"] == "the API answered 429 at 10/s"
    assert history[0]["effective_from"] <= history[1]["effective_from"]


def test_an_operators_change_survives_restarts_and_a_changed_declaration_is_written_once(store, table) -> None:
    clock = Clock()
    declared_20 = [Envelope(API, 20, 5)]
    first = new_client(store, table, clock, envelopes=declared_20)
    assert isinstance(first.acquire(API), Granted)
    first.put_envelope(API, 2, 1, "lowered by the operator")
    clock.now += 60
    # Processes restart (VMs do, at least every 8 hours) with the same recipe: 2/s stays.
    for _ in range(3):
        restarted = new_client(store, table, clock, envelopes=declared_20)
        decision = restarted.acquire(API)
        assert decision.envelope_version == 1 and decision.rate_per_second == 2.0
        clock.now += 5
    # A redeploy with a changed declaration is written once, by whichever process comes first.
    redeployed = [new_client(store, table, clock, envelopes=[Envelope(API, 4, 2)]) for _ in range(3)]
    for c in redeployed:
        c.acquire(API)
    assert [(h["version"], h["source"]) for h in redeployed[0].envelopes(API)] == [
        (0, "declared"), (1, "operator"), (2, "declared")]
    # An old process restarting during the rollout does not flip it back.
    clock.now += 60
    late_old = new_client(store, table, clock, envelopes=declared_20)
    assert late_old.acquire(API).envelope_version == 2
    assert len(late_old.envelopes(API)) == 3
    left = first.remaining([API])[API]
    assert left is not None and left <= 2  # the new burst, seen by the first process too


def test_a_changed_default_keeps_an_operators_envelope_and_replaces_a_dropped_declaration(store, table) -> None:
    """A redeploy that changes only the fleet's default envelope leaves an operator's envelope on
    an undeclared target as it is (no version written), and every restart after it reads it; a
    declaration dropped from the recipe is another matter: the target falls to the default."""
    clock = Clock()
    flaky, dropped = "https://flaky.example.com", "https://dropped.example.com"
    old = new_client(store, table, clock, envelopes=[Envelope(dropped, 20, 5)], default_rate=1.0, default_burst=5)
    assert isinstance(old.acquire(flaky), Granted) and isinstance(old.acquire(dropped), Granted)
    old.put_envelope(flaky, 0.5, 1, "operator lowered it")
    clock.now += 5
    for _ in range(2):  # the redeploy, then a restart of it
        new = new_client(store, table, clock, default_rate=2.0, default_burst=10)
        d = new.acquire(flaky)
        assert isinstance(d, Granted) and (d.rate_per_second, d.burst, d.envelope_version) == (0.5, 1, 1), d
        clock.now += 5
    assert [(h["version"], h["source"]) for h in new.envelopes(flaky)] == [(0, "default"), (1, "operator")]
    # A recipe that declares the target again is a declaration of it: written over the operator's.
    redeclared = new_client(store, table, clock, envelopes=[Envelope(flaky, 3, 3)], default_rate=2.0, default_burst=10)
    d = redeclared.acquire(flaky)
    assert isinstance(d, Granted) and (d.rate_per_second, d.burst, d.envelope_version) == (3.0, 3, 2), d
    # The dropped declaration: the new default is written over it.
    d = new.acquire(dropped)
    assert isinstance(d, Granted) and (d.rate_per_second, d.burst, d.envelope_version) == (2.0, 10, 1), d
    assert [h["source"] for h in new.envelopes(dropped)] == ["declared", "default"]


def test_query_classes_do_not_multiply_the_origins_envelope(store, table) -> None:
    clock = Clock()
    envelopes = [Envelope(API, 1, 5), Envelope(SEARCH, 1, 2)]
    clients = [new_client(store, table, clock, envelopes=envelopes) for _ in range(2)]
    grants = 0
    for region in range(50):
        for c in clients:
            grants += isinstance(c.acquire(f"{API}/v1/search?region=r{region}"), Granted)
    # The origin's burst at one instant, whatever the regions (the last token of a burst comes
    # once the store's time is surely past the first grant's: a few milliseconds later).
    assert 4 <= grants <= 5
    clock.now += 100
    decision = clients[0].acquire(f"{API}/v1/search?region=eu")
    assert isinstance(decision, Granted) and decision.charged == (f"{API}/v1/search?region=eu", API)


def test_a_class_refusal_gives_the_origins_token_back(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 1, 3), Envelope(SEARCH, 1, 1)])
    assert isinstance(c.acquire(f"{API}/v1/search?region=eu"), Granted)
    refused = c.acquire(f"{API}/v1/search?region=eu")
    assert isinstance(refused, Deferral) and refused.target == f"{API}/v1/search?region=eu"
    assert refused.belongs == (f"{API}/v1/search?region=eu", API)
    # The origin's token is not taken by a request the class refused: two are left for others.
    assert tries(c, f"{API}/other", 3, clock) == [True, True, False]


def test_an_operator_envelope_on_an_origin_makes_its_classes_pay_it(store, table) -> None:
    clock = Clock()
    # The origin has no envelope of its own; another origin's class is declared too.
    envelopes = [Envelope(SEARCH, 10, 10), Envelope("https://other.example.org/v1", 1, 1)]
    a = new_client(store, table, clock, envelopes=envelopes, default_rate=100, default_burst=100)
    b = new_client(store, table, clock, envelopes=envelopes, default_rate=100, default_burst=100)
    assert b.acquire(f"{API}/v1/search?region=eu").charged == (f"{API}/v1/search?region=eu",)
    a.put_envelope(API, 1, 2, "the whole API is slow")
    clock.now += 1
    grants = 0
    for i in range(10):
        grants += isinstance(b.acquire(f"{API}/v1/search?region=r{i}"), Granted)
        clock.now += 0.002
    assert grants == 2  # b follows on its next acquire
    history = a.envelopes(SEARCH)
    assert "pay it too" in history[-1]["reason"]


def test_put_envelope_on_a_class_reaches_every_value(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(SEARCH, 10, 10)])
    for region in ("eu", "us"):
        assert c.acquire(f"{API}/v1/search?region={region}").envelope_version == 0
    other = new_client(store, table, clock, envelopes=[Envelope(SEARCH, 10, 10)])
    assert other.put_envelope(f"{API}/v1/search?region=eu", 1, 1, "per region, slower") == 1  # the class, not one value
    clock.now += 20
    for region in ("eu", "us", "ap"):
        d = c.acquire(f"{API}/v1/search?region={region}")
        assert isinstance(d, Granted) and d.envelope_version == 1 and d.burst == 1
        assert isinstance(c.acquire(f"{API}/v1/search?region={region}"), Deferral)


def test_put_envelope_validates_everything(store, table) -> None:
    c = new_client(store, table, Clock(), envelopes=[Envelope(SEARCH, 10, 10)])
    for rate, burst in [(-1, 1), (0, 1), (float("nan"), 1), (float("inf"), 1), ("1e400/s", 1), ("nan/second", 1),
                        (1, 0), (1, -2), (1, 1.5), (1, True)]:
        with pytest.raises(RateError):
            c.put_envelope(API, rate, burst, "bad")
    with pytest.raises(TargetError, match="not a declared query class"):
        c.put_envelope(f"{API}/v1/other?x", 1, 1, "an undeclared class")
    with pytest.raises(TargetError):
        c.put_envelope("ftp://x.org", 1, 1, "bad")
    assert c.envelopes(API) == []  # nothing was written


@pytest.mark.parametrize("cost", [0, -1, -100, 3, 1.5, True, float("nan")])
def test_acquire_refuses_costs_no_envelope_can_pay(store, table, cost) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 1, 2)])
    decision = c.acquire(API, cost=cost)
    assert isinstance(decision, Deferral) and decision.reason == "invalid_cost" and decision.remaining is None
    assert str(cost) in decision.detail or repr(cost) in decision.detail
    # Nothing was taken nor given back: the burst is exactly there.
    assert tries(c, API, 3, clock) == [True, True, False]


def test_a_cost_of_the_whole_burst(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 1, 3)])
    assert isinstance(c.acquire(API, cost=3), Granted)
    assert isinstance(c.acquire(API), Deferral)


def test_bad_targets_are_deferred_not_raised(store, table) -> None:
    c = new_client(store, table, Clock())
    for url in ["", "ftp://x.org", "http://256.1.1.1/", "https://exa mple.com", None]:
        d = c.acquire(url)  # type: ignore[arg-type]
        assert isinstance(d, Deferral) and d.reason == "invalid_target" and d.remaining is None
        assert d.target == "(invalid)" and d.detail  # one fixed target, never the URL
    d = c.acquire("https://bot:hunter2@api.example.com:99999/v1?api_key=sk-live")
    assert d.target == "(invalid)" and "hunter2" not in d.detail and "sk-live" not in d.detail, d
    assert "'https://***@api.example.com:99999/v1?api_key=***'" in d.detail and "99999" in d.detail
    many = "&".join(f"region={i}" for i in range(10))
    c2 = new_client(store, table, Clock(), envelopes=[Envelope(SEARCH, 1, 1)])
    assert c2.acquire(f"{API}/v1/search?{many}").reason == "invalid_target"


# ---------------------------------------------------------------------------------- clocks

@pytest.mark.parametrize("skews", [(0.0, 30.0, -30.0), (30.0, 29.0, 0.5), (-30.0, -5.0, 12.0)])
def test_clock_skew_does_not_add_tokens(store, table, skews) -> None:
    truth = Clock()  # the store's clock
    clients = [new_client(store, table, truth, local=(lambda s=s: truth.now + s), envelopes=[Envelope(API, 4, 5)])
               for s in skews]
    at_once = sum(isinstance(c.acquire(API), Granted) for c in clients for _ in range(5))
    assert at_once <= 5  # one instant, one burst, whatever the processes' clocks say
    grants: list[tuple[float, float]] = []
    drive(clients, truth, API, 10.0, grants=grants)
    assert conforms(grants, rate=4, burst=5 - at_once if at_once else 5) is None or conforms(grants, rate=4, burst=5) is None
    assert len(grants) >= 4 * 5  # and the envelope is still used


def test_a_clock_that_jumps_is_caught_at_the_next_response(store, table) -> None:
    truth = Clock()
    offset = [0.0]
    c = new_client(store, table, truth, local=lambda: truth.now + offset[0], envelopes=[Envelope(API, 1, 1)])
    assert isinstance(c.acquire(API), Granted)
    offset[0] = 3600.0  # a VM resumed, its clock an hour ahead
    truth.now += 0.2
    assert isinstance(c.acquire(API), Deferral)  # the estimate is stale past 10 s: asked again first
    offset[0] = -3600.0
    assert isinstance(c.acquire(API), Deferral)


def test_a_store_without_a_date_header_is_an_outage(store, table) -> None:
    client = ddb(store.endpoint)
    client.meta.events.register("before-parse.dynamodb.*", lambda response_dict, **_: response_dict["headers"].pop("date", None))
    c = BudgetClient(table, client)
    d = c.acquire(API)
    assert isinstance(d, Deferral) and d.reason == "limiter_unavailable" and d.detail == "StoreClockError"
    trusting = BudgetClient(table, client, store_clock=False)
    assert isinstance(trusting.acquire(API), Granted) and trusting.sync_clock() is None


def test_restarting_mid_window_gives_no_fresh_burst(store, table) -> None:
    clock = Clock()
    grants: list[tuple[float, float]] = []
    for _ in range(6):  # a process that restarts every half second of the window
        c = new_client(store, table, clock, envelopes=[Envelope(API, 2, 3)])
        drive([c], clock, API, 0.5, grants=grants)
    assert conforms(grants, rate=2, burst=3) is None


# ---------------------------------------------------------------------------------- store faults

def test_a_store_that_refuses_connections_fails_closed() -> None:
    c = BudgetClient("t", ddb("http://127.0.0.1:9"))
    decision = c.acquire(f"{API}/x")
    assert isinstance(decision, Deferral) and decision.reason == "limiter_unavailable"
    assert decision.remaining is None and decision.detail  # an outage is not an exhausted envelope


def test_a_hung_store_fails_closed_within_the_client_timeouts() -> None:
    with hung_store() as endpoint:
        c = BudgetClient("t", ddb(endpoint, read_timeout=0.5, connect_timeout=0.5))
        results: list = []
        worker = threading.Thread(target=lambda: results.extend([c.acquire(API), c.acquire(f"{API}/y"), c.remaining([API]),
                                                                 c.backoff(API, 5, "http_429")]))
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "acquire blocked on a hung store"
    first, second, remaining, backed_off = results
    assert isinstance(first, Deferral) and first.reason == "limiter_unavailable" and first.detail == "ReadTimeoutError"
    assert isinstance(second, Deferral) and second.reason == "limiter_unavailable"
    assert c.stats.calls == 1 + 2 + 1  # the second acquire did not wait again: the outage is cached
    assert remaining == {API: None} and backed_off is False


def test_a_missing_table_fails_closed(store) -> None:
    c = BudgetClient("no-such-table", ddb(store.endpoint))
    d = c.acquire(API)
    assert isinstance(d, Deferral) and d.reason == "limiter_unavailable" and d.detail == "ResourceNotFoundException"


def test_telemetry_that_fails_does_not_decide(store, table) -> None:
    def broken(decision) -> None:
        raise RuntimeError("metrics are down")

    c = new_client(store, table, Clock(), on_decision=broken)
    assert isinstance(c.acquire(API), Granted)


# ---------------------------------------------------------------------------------- backoff

def test_backoff_is_seen_by_every_holder_capped_and_clearable(store, table) -> None:
    clock = Clock()
    a = new_client(store, table, clock, envelopes=[Envelope(API, 10, 10)], max_backoff_seconds=120)
    b = new_client(store, table, clock, envelopes=[Envelope(API, 10, 10)])
    assert a.backoff(f"{API}/anything", 30, "http_429") is True
    decision = b.acquire(API)
    assert isinstance(decision, Deferral) and decision.reason == "backoff" and decision.detail == "http_429"
    assert 30 <= decision.retry_after_seconds <= 30 + 1 + 10 * 0.1  # the store clock's doubt and the spread
    assert b.remaining([API]) == {API: 0.0}
    assert a.backoff(API, float("inf"), "http_503") is True  # capped at max_backoff_seconds
    clock.now += 121.5
    assert isinstance(b.acquire(API), Granted)
    assert a.backoff(API, 1e9, "http_503") and a.backoff(API, float("nan"), "x") and a.backoff(API, "soon", "x")  # type: ignore[arg-type]
    assert isinstance(a.acquire(API), Deferral)
    assert a.clear_backoff(API) is True
    clock.now += 0.01
    assert isinstance(a.acquire(API), Granted)
    assert a.backoff(API, -5, "negative") is True  # 0 s: nothing held
    assert isinstance(a.acquire(API), Granted)


def test_backoff_and_clear_report_a_store_outage_instead_of_raising(caplog) -> None:
    c = BudgetClient("t", ddb("http://127.0.0.1:9"))
    assert c.backoff(API, 5, "http_429") is False
    assert c.clear_backoff(API) is False
    assert c.backoff("not a url", 5, "x") is False
    # What the warnings show of a URL: no user info, no query values.
    from rayito_constructs.egress.targets import parse

    secret = "https://bot:hunter2@api.example.com:99999/x?api_key=sk-live"
    caplog.clear()
    assert c.backoff(secret, 5, "x") is False and c.clear_backoff(secret) is False
    assert c.clear_backoff(parse(f"{API}/x?api_key=sk-live")) is False
    assert c.remaining([secret]) == {secret: None}
    shown = [r.getMessage() for r in caplog.records]
    assert len(shown) == 4 and not [m for m in shown if "hunter2" in m or "sk-live" in m], shown
    assert "backoff of https://***@api.example.com:99999/x?api_key=*** not stored" in shown[0], shown
    assert f"backoff of {API} not cleared" in shown[2], shown
    with pytest.raises(ValueError):
        BudgetClient("t", ddb("http://127.0.0.1:9"), max_backoff_seconds=float("inf"))


# ---------------------------------------------------------------------------------- contention

def test_waiting_processes_spread_their_wake_ups(store, table) -> None:
    def calls_per_grant(max_spread: int) -> float:
        name = f"spread-{uuid.uuid4().hex[:6]}"
        BudgetClient.create_table(ddb(store.endpoint), name)
        clock = Clock()
        clients = [new_client(store, name, clock, envelopes=[Envelope(API, 5, 1)], max_spread=max_spread) for _ in range(8)]
        for c in clients:
            c.sync_clock()
        before = store.snapshot()
        grants: list[tuple[float, float]] = []
        drive(clients, clock, API, 8.0, tick=0.02, grants=grants)
        assert conforms(grants, rate=5, burst=1) is None
        updates = store.snapshot()["UpdateItem"] - before["UpdateItem"]
        return updates / len(grants)

    spread, herd = calls_per_grant(64), calls_per_grant(1)
    print(f"store calls per grant, 8 processes: spread {spread:.2f}, herd {herd:.2f}")
    assert spread < herd
    assert spread <= 3.0  # about one store call per token, not one per waiting process (8)


# ---------------------------------------------------------------------------------- corners

def test_store_time_from_date_headers() -> None:
    from rayito_constructs.egress import StoreTime

    t = StoreTime(max_age=10)
    assert t.bounds(100.0) is None
    assert not t.observe(100.0, 100.1, {"date": "not a date"}) and not t.observe(100.0, 100.1, {})
    assert t.observe(1000.2, 1000.3, {"date": "Thu, 01 Jan 1970 00:16:40 GMT"})  # 1000 s
    low, high = t.bounds(1000.3)
    assert (low, high) == pytest.approx((1000.0, 1001.1))  # one answer: a second of doubt, and its round trip
    t.observe(1000.95, 1000.96, {"date": "Thu, 01 Jan 1970 00:16:40 GMT"})  # just before the turn
    t.observe(1001.0, 1001.01, {"date": "Thu, 01 Jan 1970 00:16:41 GMT"})  # just after it
    low, high = t.bounds(1001.01)
    assert low <= 1001.01 <= high and high - low < 0.07
    assert t.bounds(999.0) is None and t.bounds(1020.0) is None  # a clock that went back, or stale
    t.observe(5000.0, 5000.1, {"date": "Thu, 01 Jan 1970 00:16:42 GMT"})  # a jump: start again
    low, high = t.bounds(5000.1)
    assert 1002.0 <= low + 0.1 and high - low <= 1.2


def test_the_background_calibration_narrows_the_store_clock(store, table) -> None:
    c = BudgetClient(table, ddb(store.endpoint))
    c._calibrating.join(timeout=30)
    low, high = c._time.bounds(c._clock())
    assert high - low < 0.9  # one response alone leaves a whole second of doubt
    still = Clock()
    frozen = ddb(store.endpoint)
    virtual_store_time(frozen, still)
    stuck = BudgetClient(table, frozen, clock=still, calibrate=False)
    stuck._calibrate(limit=0.1, pause=0.01)  # a store clock that never turns: it gives up in time
    nodate = ddb(store.endpoint)
    nodate.meta.events.register("before-parse.dynamodb.*", lambda response_dict, **_: response_dict["headers"].pop("date", None))
    BudgetClient(table, nodate, calibrate=False)._calibrate(limit=0.1)
    BudgetClient(table, ddb("http://127.0.0.1:9"), calibrate=False)._calibrate(limit=0.1)


def test_declarations_are_checked_and_a_recipe_makes_the_client(store, table, monkeypatch) -> None:
    with pytest.raises(ValueError, match="declared more than once"):
        BudgetClient(table, ddb(store.endpoint), envelopes=[Envelope(API, 1, 1), Envelope(f"{API}:443/", 2, 2)],
                     calibrate=False)
    recipe = {"egress": {"budgets": [{"target": SEARCH, "rate_per_second": 0.5, "burst": 2}],
                         "default": {"rate_per_second": 2.0, "burst": 3}}}
    monkeypatch.delenv("RAYITO_EGRESS_BUDGET_TABLE", raising=False)
    with pytest.raises(ValueError, match="RAYITO_EGRESS_BUDGET_TABLE"):
        BudgetClient.from_declaration(recipe["egress"], dynamodb=ddb(store.endpoint))
    monkeypatch.setenv("RAYITO_EGRESS_BUDGET_TABLE", table)
    c = BudgetClient.from_declaration(recipe["egress"], dynamodb=ddb(store.endpoint), calibrate=False)
    assert c.default_rate == 2.0 and c.default_burst == 3
    import json

    env = {"RAYITO_EGRESS_BUDGET_TABLE": table, "RAYITO_EGRESS_ENVELOPES": json.dumps(recipe["egress"])}
    from_env = BudgetClient.from_environment(env, dynamodb=ddb(store.endpoint), calibrate=False)
    assert (from_env.default_rate, from_env.default_burst) == (2.0, 3)
    assert BudgetClient.from_environment({"RAYITO_EGRESS_BUDGET_TABLE": table}, dynamodb=ddb(store.endpoint),
                                         calibrate=False).default_burst == 5  # no declaration: the defaults
    with pytest.raises(ValueError, match="RAYITO_EGRESS_ENVELOPES is not JSON"):
        BudgetClient.from_environment({**env, "RAYITO_EGRESS_ENVELOPES": "{"}, dynamodb=ddb(store.endpoint))
    assert c.buckets_of(f"{API}/v1/search?region=eu") == (f"{API}/v1/search?region=eu",)
    assert Envelope(API, 4, 1).interval == 0.25


def test_two_processes_redeployed_at_once_write_the_declaration_once(store, table) -> None:
    clock = Clock()
    new_client(store, table, clock, envelopes=[Envelope(API, 10, 5)]).acquire(API)
    a = new_client(store, table, clock, envelopes=[Envelope(API, 3, 2)])
    b = new_client(store, table, clock, envelopes=[Envelope(API, 3, 2)])
    raced = []

    def b_first(**_) -> None:  # b writes between a's read and a's write
        if not raced:
            raced.append(b.acquire(API))

    a._ddb.meta.events.register("before-call.dynamodb.TransactWriteItems", b_first)
    assert a.acquire(API).envelope_version == 1 and raced[0].envelope_version == 1
    assert [h["version"] for h in a.envelopes(API)] == [0, 1]
    # The same race for an operator: the later writer writes the next version, not over it.
    raced.clear()
    a._ddb.meta.events.unregister("before-call.dynamodb.TransactWriteItems", b_first)

    def b_puts(**_) -> None:
        if not raced:
            raced.append(b.put_envelope(API, 1, 1, "b first"))

    a._ddb.meta.events.register("before-call.dynamodb.TransactWriteItems", b_puts)
    assert a.put_envelope(API, 2, 2, "a second") == 3 and raced == [2]
    assert [h["reason"] for h in a.envelopes(API)][-2:] == ["b first", "a second"]


def test_a_burst_lowered_below_the_cost_is_an_invalid_cost(store, table) -> None:
    clock = Clock()
    a = new_client(store, table, clock, envelopes=[Envelope(API, 1, 3)])
    assert isinstance(a.acquire(API), Granted)
    new_client(store, table, clock, envelopes=[Envelope(API, 1, 3)]).put_envelope(API, 1, 1, "lowered")
    clock.now += 10
    d = a.acquire(API, cost=3)  # a still believes the burst is 3
    assert isinstance(d, Deferral) and d.reason == "invalid_cost" and "above the envelope's burst of 1" in d.detail


def test_an_origin_envelope_reaches_path_classes_too(store, table) -> None:
    clock = Clock()
    envs = [Envelope(f"{API}/v1", 10, 10)]
    c = new_client(store, table, clock, envelopes=envs, default_rate=100, default_burst=100)
    assert c.acquire(f"{API}/v1/x").charged == (f"{API}/v1",)
    new_client(store, table, clock, envelopes=envs).put_envelope(API, 1, 1, "the origin, now")
    clock.now += 1
    assert c.acquire(f"{API}/v1/x").charged == (f"{API}/v1", API)


def test_deleted_items_and_stale_value_buckets_heal(store, table) -> None:
    clock = Clock()
    raw = ddb(store.endpoint)
    c = new_client(store, table, clock, envelopes=[Envelope(SEARCH, 10, 10), Envelope(API, 10, 10)])
    assert isinstance(c.acquire(f"{API}/other"), Granted)
    raw.delete_item(TableName=table, Key={"target": {"S": API}, "item": {"S": "bucket"}})
    clock.now += 1
    assert isinstance(c.acquire(f"{API}/other"), Granted)  # created again, version 0 again
    assert isinstance(c.acquire(f"{API}/v1/search?region=eu"), Granted)
    # A value bucket deleted while this process believes it busy: created again.
    raw.delete_item(TableName=table, Key={"target": {"S": SEARCH}, "item": {"S": "bucket=eu"}})
    clock.now += 0.01
    assert isinstance(c.acquire(f"{API}/v1/search?region=eu"), Granted)
    c.put_envelope(SEARCH, 5, 5, "slower")
    # A value bucket the put did not reach (written between its query and its copy):
    raw.update_item(TableName=table, Key={"target": {"S": SEARCH}, "item": {"S": "bucket=eu"}},
                    UpdateExpression="SET #v = :v", ExpressionAttributeNames={"#v": "version"},
                    ExpressionAttributeValues={":v": {"N": "0"}})
    clock.now += 5
    d = c.acquire(f"{API}/v1/search?region=eu")
    assert isinstance(d, Granted) and d.envelope_version == 1
    item = raw.get_item(TableName=table, Key={"target": {"S": SEARCH}, "item": {"S": "bucket=eu"}})["Item"]
    assert item["version"]["N"] == "1" and item["burst"]["N"] == "5"


def test_a_key_only_bucket_item_heals_and_clear_backoff_creates_none(store, table) -> None:
    """An earlier release's unconditional clear_backoff left an item with a key and nothing else
    on a target nobody had used: a process loading it, and one that loaded the envelope before the
    item was emptied, both write an envelope into it instead of deferring for ever. Clearing a
    backoff now writes nothing where there is none."""
    clock = Clock()
    raw = ddb(store.endpoint)
    fresh = "https://fresh.example.com"
    key = {"target": {"S": fresh}, "item": {"S": "bucket"}}
    a = new_client(store, table, clock)
    assert a.clear_backoff(fresh) is True
    assert "Item" not in raw.get_item(TableName=table, Key=key)
    raw.update_item(TableName=table, Key=key, UpdateExpression="REMOVE backoff_until, backoff_reason")
    assert raw.get_item(TableName=table, Key=key)["Item"] == key  # what the earlier release wrote
    d = a.acquire(f"{fresh}/x")
    assert isinstance(d, Granted) and d.envelope_version == 0, d
    assert [h["version"] for h in a.envelopes(fresh)] == [0]
    # The item emptied again under a process that holds the envelope: written again.
    raw.delete_item(TableName=table, Key=key)
    raw.update_item(TableName=table, Key=key, UpdateExpression="REMOVE backoff_until, backoff_reason")
    clock.now += 1
    d = a.acquire(f"{fresh}/x")
    assert isinstance(d, Granted) and d.envelope_version == 1, d
    assert [h["version"] for h in a.envelopes(fresh)] == [0, 1]


def test_an_origin_refusal_gives_the_class_token_back(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 0.01, 1), Envelope(SEARCH, 0.01, 2)])
    other = new_client(store, table, clock, envelopes=[Envelope(API, 0.01, 1), Envelope(SEARCH, 0.01, 2)])
    assert isinstance(other.acquire(f"{API}/elsewhere"), Granted)  # the origin's only token
    refused = c.acquire(f"{API}/v1/search?region=eu")
    assert isinstance(refused, Deferral) and refused.target == API and c.stats.refunds == 1
    clock.now += 0.01
    left = c.remaining([f"{API}/v1/search?region=eu"])
    assert c._get(SEARCH, "bucket=eu")["tat"]["N"]  # the class bucket exists, its token given back:
    assert other.acquire(f"{API}/v1/search?region=eu").target == API  # still the origin that refuses
    assert left == {f"{API}/v1/search?region=eu": 0.0}


def test_an_origin_changed_under_a_request_re_routes_it(store, table) -> None:
    clock = Clock()
    envs = [Envelope(API, 10, 10), Envelope(SEARCH, 10, 10)]
    c = new_client(store, table, clock, envelopes=envs)
    assert isinstance(c.acquire(f"{API}/v1/search?region=eu"), Granted)
    new_client(store, table, clock, envelopes=envs).put_envelope(API, 5, 5, "slower origin")
    clock.now += 1
    d = c.acquire(f"{API}/v1/search?region=eu")  # the class pays, the origin says "version 1": again
    assert isinstance(d, Granted) and c.stats.refunds == 1
    assert c.acquire(f"{API}/x").envelope_version == 1


def test_a_grant_halves_the_spread_window(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 10, 10)])
    c._state.streak[API] = 3  # three store refusals in a row
    assert isinstance(c.acquire(API), Granted)
    assert c._state.streak[API] == 2


def test_a_token_that_cannot_be_given_back_is_left_unused(store, table) -> None:
    clock = Clock()
    c = new_client(store, table, clock, envelopes=[Envelope(API, 0.01, 1), Envelope(SEARCH, 1, 1)])
    other = new_client(store, table, clock, envelopes=[Envelope(API, 0.01, 1), Envelope(SEARCH, 1, 1)])
    assert isinstance(other.acquire(f"{API}/elsewhere"), Granted)

    def no_refund(params, **_) -> None:
        if "tat - :step" in params.get("UpdateExpression", ""):
            raise ConnectionError("the store went away")

    c._ddb.meta.events.register("before-parameter-build.dynamodb.UpdateItem", no_refund)
    refused = c.acquire(f"{API}/v1/search?region=eu")
    assert refused.reason == "budget_empty" and refused.target == API
    assert c.stats.refunds == 0


def test_error_codes() -> None:
    from rayito_constructs.egress.client import _error_code

    class Coded(Exception):
        response = {"Error": {"Code": "ThrottlingException"}}

    class Uncoded(Exception):
        response = {"Error": {}}

    assert _error_code(Coded()) == "ThrottlingException" and _error_code(Uncoded()) == "Uncoded"
