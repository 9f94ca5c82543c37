"""The chokepoint: real ``requests``/``httpx`` clients against a local HTTP target, every request
that reaches it paid for (counted on the target's side), through a real BudgetClient on moto."""

from __future__ import annotations

import asyncio
import uuid
from email.utils import formatdate
from typing import Iterator

import httpx
import pytest
import requests
from urllib3.util.retry import Retry

from rayito_constructs.egress import (
    AsyncBudgetTransport,
    BudgetAdapter,
    BudgetClient,
    BudgetTransport,
    Deferral,
    EgressDeferred,
    Envelope,
    budget_session,
    retry_after_seconds,
)

from .egress_support import Clock, Upstream, counting_store, ddb, virtual_store_time


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


@pytest.fixture
def table(store) -> str:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), name)
    return name


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def upstream(clock) -> Iterator[Upstream]:
    server = Upstream()
    server.respond = script({}, clock)
    yield server
    server.close()


def budget(store, table, clock, decisions=None, **kwargs) -> BudgetClient:
    client = ddb(store.endpoint)
    virtual_store_time(client, clock)
    b = BudgetClient(table, client, clock=clock, calibrate=False, seed=3,
                     on_decision=decisions.append if decisions is not None else None, **kwargs)
    now = clock.now
    clock.now = float(int(now)) - 0.001
    b.sync_clock()
    clock.now = float(int(now)) + 1.0
    b.sync_clock()
    return b


def script(responses: dict[str, list[tuple[int, dict[str, str]]]], clock: Clock):
    """Answers per path, in order (the last one repeats). Each request takes 10 ms of the
    virtual clock: time passes between requests as it does for real."""
    counts: dict[str, int] = {}

    def respond(path: str, _: int) -> tuple[int, dict[str, str]]:
        clock.now += 0.01
        path = path.split("?")[0]
        answers = responses.get(path, [(200, {})])
        i = counts.get(path, 0)
        counts[path] = i + 1
        return answers[min(i, len(answers) - 1)]

    return respond


# ---------------------------------------------------------------------------------- Retry-After

NOW = 1_790_000_000.0


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({}, 30.0),
        ({"Retry-After": "7"}, 7.0),
        ({"Retry-After": " 120 "}, 120.0),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "1000000000"}, 900.0),
        ({"Retry-After": "9" * 5000}, 900.0),
        ({"Retry-After": "-5"}, 30.0),
        ({"Retry-After": "1e9"}, 30.0),
        ({"Retry-After": "inf"}, 30.0),
        ({"Retry-After": "nan"}, 30.0),
        ({"Retry-After": "3.5"}, 30.0),
        ({"Retry-After": "soon"}, 30.0),
        ({"Retry-After": ""}, 30.0),
        ({"Retry-After": formatdate(NOW + 42, usegmt=True)}, 42.0),
        ({"Retry-After": formatdate(NOW - 42, usegmt=True)}, 0.0),
        ({"Retry-After": formatdate(NOW + 10**7, usegmt=True)}, 900.0),
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, 900.0),
        ({"Retry-After": "Sun, 06 Nov 1994 08:49:37"}, 30.0),  # no zone: not an HTTP-date
        # The date is read against the server's own Date: its clock compared with itself.
        ({"Retry-After": formatdate(NOW + 3600 + 20, usegmt=True), "Date": formatdate(NOW + 3600, usegmt=True)}, 20.0),
        ({"Retry-After": formatdate(NOW + 20, usegmt=True), "Date": "garbage"}, 20.0),
    ],
)
def test_retry_after_in_both_forms_capped(headers, seconds) -> None:
    assert retry_after_seconds(headers, default=30.0, cap=900.0, now=NOW) == pytest.approx(seconds)


# ---------------------------------------------------------------------------------- requests

def test_requests_pays_for_every_request_on_both_schemes(store, table, upstream, clock) -> None:
    decisions: list = []
    b = budget(store, table, clock, decisions, envelopes=[Envelope(upstream.url, 1, 2)])
    session = budget_session(b, step="tool-call-1")
    assert isinstance(session.get_adapter("https://example.org"), BudgetAdapter)
    assert session.get(f"{upstream.url}/a", timeout=10).status_code == 200
    clock.now += 0.01
    assert session.get(f"{upstream.url}/b", timeout=10).status_code == 200
    with pytest.raises(EgressDeferred) as info:
        session.get(f"{upstream.url}/c", timeout=10)
    assert info.value.deferral.reason == "budget_empty" and info.value.deferral.step == "tool-call-1"
    assert upstream.paths() == ["/a", "/b"]  # the deferred request never left
    assert [type(d).__name__ for d in decisions] == ["Granted", "Granted", "Deferral"]


def test_each_retry_of_urllib3_pays(store, table, upstream, clock) -> None:
    upstream.respond = script({"/flaky": [(500, {}), (500, {}), (200, {})], "/down": [(500, {})]}, clock)
    decisions: list = []
    b = budget(store, table, clock, decisions, envelopes=[Envelope(upstream.url, 0.001, 5)])
    retries = Retry(total=3, status_forcelist=[500], backoff_factor=0, allowed_methods=None)
    session = budget_session(b, max_retries=retries)
    assert session.get(f"{upstream.url}/flaky", timeout=10).status_code == 200
    assert len(upstream.seen) == 3 and sum(type(d).__name__ == "Granted" for d in decisions) == 3
    # Two tokens left: the retries of /down stop where the budget does, not at the target.
    with pytest.raises(EgressDeferred) as info:
        session.get(f"{upstream.url}/down", timeout=10)
    assert info.value.deferral.reason == "budget_empty"
    assert upstream.paths().count("/down") == 2


def test_a_503_retry_with_retry_after_is_deferred_not_slept(store, table, upstream, clock) -> None:
    upstream.respond = script({"/busy": [(503, {"Retry-After": "120"}), (200, {})]}, clock)
    b = budget(store, table, clock, envelopes=[Envelope(upstream.url, 10, 10)])
    other = budget(store, table, clock, envelopes=[Envelope(upstream.url, 10, 10)])
    session = budget_session(b, max_retries=Retry(total=3, status_forcelist=[503], respect_retry_after_header=True))
    with pytest.raises(EgressDeferred) as info:
        session.get(f"{upstream.url}/busy", timeout=10)
    assert info.value.deferral.reason == "backoff" and info.value.deferral.retry_after_seconds == 120
    assert upstream.paths() == ["/busy"]
    d = other.acquire(upstream.url)  # every holder of the envelope waits
    assert isinstance(d, Deferral) and d.reason == "backoff" and 119 <= d.retry_after_seconds <= 122


def test_a_429_without_retries_backs_off_and_answers(store, table, upstream, clock) -> None:
    upstream.respond = script({"/limited": [(429, {"Retry-After": "7"})]}, clock)
    b = budget(store, table, clock, envelopes=[Envelope(upstream.url, 10, 10)])
    session = budget_session(b)
    assert session.get(f"{upstream.url}/limited", timeout=10).status_code == 429
    assert b.remaining([upstream.url]) == {upstream.url: 0.0}
    assert b.clear_backoff(upstream.url)
    clock.now += 0.01
    assert session.get(f"{upstream.url}/limited", timeout=10).status_code == 429


def test_every_redirect_hop_pays(store, table, upstream, clock) -> None:
    other_host = f"http://localhost:{upstream.port}"
    upstream.respond = script({"/start": [(302, {"Location": f"{other_host}/middle"})],
                               "/middle": [(307, {"Location": f"{upstream.url}/end"})]}, clock)
    decisions: list = []
    b = budget(store, table, clock, decisions, envelopes=[Envelope(upstream.url, 0.001, 2)], default_rate=0.001,
               default_burst=5)
    session = budget_session(b)
    assert session.get(f"{upstream.url}/start", timeout=10).status_code == 200
    assert upstream.paths() == ["/start", "/middle", "/end"]
    assert [d.target for d in decisions] == [upstream.url, other_host, upstream.url]
    # The target's budget is spent: the first hop is refused before anything leaves.
    with pytest.raises(EgressDeferred):
        session.get(f"{upstream.url}/start", timeout=10)
    assert len(upstream.seen) == 3


def test_a_store_outage_through_the_adapter_is_a_deferral(upstream) -> None:
    dead = BudgetClient("t", ddb("http://127.0.0.1:9", connect_timeout=1.0), calibrate=False)
    session = budget_session(dead)
    with pytest.raises(EgressDeferred) as info:
        session.get(f"{upstream.url}/x", timeout=10)
    assert info.value.deferral.reason == "limiter_unavailable" and info.value.deferral.remaining is None
    assert upstream.seen == []


def test_a_store_outage_after_the_answer_does_not_raise(store, table, upstream, clock) -> None:
    upstream.respond = script({"/limited": [(429, {"Retry-After": "5"})]}, clock)
    b = budget(store, table, clock, envelopes=[Envelope(upstream.url, 10, 10)])
    session = budget_session(b)
    b._ddb.meta.events.register("before-parameter-build.dynamodb.UpdateItem", _fail_backoff)
    assert session.get(f"{upstream.url}/limited", timeout=10).status_code == 429  # answered; the backoff is lost
    assert b.remaining([upstream.url])[upstream.url] > 0  # no backoff was stored
    assert b.backoff(upstream.url, 5, "http_429") is False


def _fail_backoff(params, **_):
    if "backoff_until" in params.get("UpdateExpression", "") and "SET backoff" in params["UpdateExpression"]:
        raise ConnectionError("the store went away")


def test_the_adapter_reads_the_host_it_connects_to(store, table, upstream, clock) -> None:
    b = budget(store, table, clock, envelopes=[Envelope(f"http://127.0.0.1:{upstream.port}", 0.001, 1)])
    session = budget_session(b)
    assert session.get(f"http://127.0.0.1:{upstream.port}/a", timeout=10).status_code == 200
    for spelling in (f"http://2130706433:{upstream.port}/b", f"http://0x7f.1:{upstream.port}/c",
                     f"http://127.0.0.1.:{upstream.port}/./d"):
        with pytest.raises(EgressDeferred):
            session.get(spelling, timeout=10)
    assert upstream.paths() == ["/a"]


# ---------------------------------------------------------------------------------- httpx

def test_httpx_pays_for_requests_and_redirects(store, table, upstream, clock) -> None:
    upstream.respond = script({"/go": [(301, {"Location": "/there"})],
                               "/slow": [(429, {"Retry-After": formatdate(NOW + 3600, usegmt=True),
                                                "Date": formatdate(NOW, usegmt=True)})]}, clock)
    decisions: list = []
    b = budget(store, table, clock, decisions, envelopes=[Envelope(upstream.url, 0.001, 4)])
    with httpx.Client(transport=BudgetTransport(b, step=lambda: "step-9"), follow_redirects=True, timeout=10) as http:
        assert http.get(f"{upstream.url}/go").status_code == 200
        assert upstream.paths() == ["/go", "/there"]
        assert http.get(f"{upstream.url}/slow").status_code == 429
        with pytest.raises(EgressDeferred) as info:
            http.get(f"{upstream.url}/again")
    assert info.value.deferral.reason == "backoff" and info.value.deferral.detail == "http_429"
    assert 899 <= info.value.deferral.retry_after_seconds <= 902  # an hour asked, capped at 900 s
    assert decisions[0].step == "step-9" and len(upstream.seen) == 3


def test_httpx_async_client(store, table, upstream, clock) -> None:
    upstream.respond = script({"/busy": [(503, {})]}, clock)
    b = budget(store, table, clock, envelopes=[Envelope(upstream.url, 0.001, 3)])

    async def run() -> tuple[list[int], EgressDeferred]:
        async with httpx.AsyncClient(transport=AsyncBudgetTransport(b, step="async-1"), follow_redirects=True,
                                     timeout=10) as http:
            codes = [(await http.get(f"{upstream.url}/{i}")).status_code for i in range(2)]
            codes.append((await http.get(f"{upstream.url}/busy")).status_code)
            try:
                await http.get(f"{upstream.url}/late")
            except EgressDeferred as exc:
                return codes, exc
            raise AssertionError("the fourth request left")

    codes, deferred = asyncio.run(asyncio.wait_for(run(), timeout=60))
    assert codes == [200, 200, 503]
    assert deferred.deferral.reason == "backoff" and deferred.deferral.step == "async-1"
    assert 29 <= deferred.deferral.retry_after_seconds <= 32  # no Retry-After: the default 30 s
    assert len(upstream.seen) == 3


def test_httpx_store_outage_is_a_deferral(upstream) -> None:
    dead = BudgetClient("t", ddb("http://127.0.0.1:9", connect_timeout=1.0), calibrate=False)
    with httpx.Client(transport=BudgetTransport(dead), timeout=10) as http:
        with pytest.raises(EgressDeferred) as info:
            http.get(f"{upstream.url}/x")
    assert info.value.deferral.reason == "limiter_unavailable"
    assert upstream.seen == []


def test_requests_adapter_mounted_by_hand_still_works(store, table, upstream, clock) -> None:
    b = budget(store, table, clock, envelopes=[Envelope(upstream.url, 0.001, 1)])
    session = requests.Session()
    session.mount("http://", BudgetAdapter(b))
    assert session.get(f"{upstream.url}/a", timeout=10).status_code == 200
    with pytest.raises(EgressDeferred):
        session.get(f"{upstream.url}/b", timeout=10)


def test_connection_retries_pay_too(store, table, clock) -> None:
    decisions: list = []
    refused = "http://127.0.0.1:9"
    b = budget(store, table, clock, decisions, envelopes=[Envelope(refused, 0.001, 5)])
    session = budget_session(b, max_retries=Retry(total=2, connect=2, backoff_factor=0))
    with pytest.raises(requests.ConnectionError):
        session.get(f"{refused}/x", timeout=5)
    assert sum(type(d).__name__ == "Granted" for d in decisions) == 3  # the first try and two retries


def test_a_url_no_target_can_be_made_of_is_refused_by_the_adapters(store, table, clock, upstream) -> None:
    b = budget(store, table, clock)
    with httpx.Client(transport=BudgetTransport(b), timeout=10) as http:
        with pytest.raises(EgressDeferred) as info:
            http.get("http://a..b.com/x")
    assert info.value.deferral.reason == "invalid_target"
    with pytest.raises(EgressDeferred) as info:
        budget_session(b).get("http://0x100000000/x", timeout=10)
    assert info.value.deferral.reason == "invalid_target"
    assert upstream.seen == []


def test_a_503_retry_of_a_url_that_is_not_a_target_still_defers(store, table, clock) -> None:
    from rayito_constructs.egress.adapters import _Gate

    gate = _Gate(budget(store, table, clock), "s", 30.0)
    with pytest.raises(EgressDeferred) as info:
        gate.refuse("not a url", 12.0, 503)
    # A URL that is not a target is never the deferral's target (a metric dimension): see acquire.
    assert info.value.deferral.target == "(invalid)" and info.value.deferral.retry_after_seconds == 12.0
