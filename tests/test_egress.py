"""Per-target egress budgets: normalization, the shared store (moto DynamoDB over HTTP), adapters."""

from __future__ import annotations

import io
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterator

import httpx
import pytest
import requests

from rayito_constructs.egress import (
    BudgetAdapter,
    BudgetClient,
    BudgetTransport,
    Deferral,
    EgressDeferred,
    EmfRecorder,
    Envelope,
    Granted,
    declared_target,
    normalize,
)

from .moto_server import client as aws_client
from .moto_server import moto_server

API = "https://api.example.com"


class Clock:
    def __init__(self, now: float = 1_790_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def table(aws) -> str:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(aws_client("dynamodb", aws), name)
    return name


def new_client(aws, table, clock, **kwargs) -> BudgetClient:
    return BudgetClient(table, aws_client("dynamodb", aws), clock=clock, **kwargs)


# ---------------------------------------------------------------------------------- targets

@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://API.example.com:443/a?b=1", API),
        ("https://api.example.com/c", API),
        ("api.example.com", API),
        ("HTTP://Example.COM:80/x", "http://example.com"),
        ("http://example.com:8080/x", "http://example.com:8080"),
        ("https://example.com:80", "https://example.com:80"),
        ("https://bücher.de/buch", "https://xn--bcher-kva.de"),
        ("https://EXAMPLE.com./", "https://example.com"),
        ("https://user:pw@example.com/x", "https://example.com"),
        ("https://[::1]:8443/x", "https://[::1]:8443"),
        ("wss://stream.example.com:443/socket", "wss://stream.example.com"),
    ],
)
def test_normalization(url, target) -> None:
    assert normalize(url) == target


def test_path_and_query_classes() -> None:
    declared = [declared_target("https://api.example.com/v1/chat/"), declared_target(f"{API}/v1/chat?model")]
    assert declared == [f"{API}/v1/chat", f"{API}/v1/chat?model"]
    assert normalize(f"{API}/v1/chat/completions?model=big&x=1", declared) == f"{API}/v1/chat?model=big"
    assert normalize(f"{API}/v1/chat?stream=1", declared) == f"{API}/v1/chat"
    assert normalize(f"{API}/v1/chatter", declared) == API  # a prefix is a path segment, not characters
    assert normalize("https://API.example.com:443/v2", declared) == API


# ---------------------------------------------------------------------------------- the store

def drive(clients: list[BudgetClient], clock: Clock, url: str, seconds: float, tick: float = 0.05) -> int:
    """Every client tries once per tick for ``seconds``; returns the grants."""
    grants = 0
    for _ in range(int(seconds / tick)):
        for c in clients:
            if isinstance(c.acquire(url), Granted):
                grants += 1
        clock.now += tick
    return grants


def test_processes_sharing_a_target_stay_within_the_envelope_and_use_it(aws, table) -> None:
    clock = Clock()
    envelope = Envelope(API, rate_per_second=10, burst=5)
    clients = [new_client(aws, table, clock, envelopes=[envelope]) for _ in range(4)]
    window = 3.0
    grants = drive(clients, clock, f"{API}/v1/items", window)
    assert grants <= 10 * window + 5
    assert grants >= 0.9 * 10 * window  # the envelope is used, not wasted
    # Local buckets would have let 4x through; the stored arrival time says where we are.
    assert clients[0].remaining([API])[API] <= 5


def test_other_targets_are_unaffected(aws, table) -> None:
    clock = Clock()
    c = new_client(aws, table, clock, envelopes=[Envelope(API, 1, 1)], default_rate=5, default_burst=5)
    assert isinstance(c.acquire(API), Granted)
    assert isinstance(c.acquire(API), Deferral)
    assert all(isinstance(c.acquire("https://other.example.org/x"), Granted) for _ in range(5))


def test_deferral_is_structured_and_cached(aws, table) -> None:
    clock = Clock()
    c = new_client(aws, table, clock, envelopes=[Envelope(API, 2, 1)])
    first = c.acquire(API, step="plan-3")
    assert isinstance(first, Granted) and first.envelope_version == 0 and first.step == "plan-3"
    calls = c.stats.calls
    denied = [c.acquire(API, step="plan-4") for _ in range(20)]
    assert all(isinstance(d, Deferral) and d.reason == "budget_empty" for d in denied)
    assert denied[0].retry_after_seconds == pytest.approx(0.5, abs=1e-3)
    assert c.stats.calls - calls <= 2  # one denial (two branches at most) per refill interval, then the cache
    clock.now += 0.5
    assert isinstance(c.acquire(API), Granted)


def test_an_envelope_change_takes_effect_mid_run_and_keeps_history(aws, table) -> None:
    clock = Clock()
    a = new_client(aws, table, clock, envelopes=[Envelope(API, 10, 10)])
    b = new_client(aws, table, clock, envelopes=[Envelope(API, 10, 10)])
    assert drive([a, b], clock, API, 1.0) <= 20
    version = a.put_envelope(API, rate_per_second=2, burst=1, reason="the API answered 429 at 10/s")
    assert version == 1
    clock.now += 10
    granted = drive([a, b], clock, API, 2.0)
    assert granted <= 2 * 2 + 1
    last = b.acquire(API)
    assert last.envelope_version == 1  # b learned the new version from the store, no restart
    history = a.envelopes(API)
    assert [(h["version"], h["rate_per_second"], h["reason"]) for h in history] == [(1, 2.0, "the API answered 429 at 10/s")]


def test_a_declared_change_writes_a_new_version_once(aws, table) -> None:
    clock = Clock()
    old = new_client(aws, table, clock, envelopes=[Envelope(API, 10, 10)])
    assert isinstance(old.acquire(API), Granted)
    redeployed = [new_client(aws, table, clock, envelopes=[Envelope(API, 4, 2)]) for _ in range(3)]
    for c in redeployed:
        c.acquire(API)
    assert [h["version"] for h in redeployed[0].envelopes(API)] == [1]  # one write, not three
    clock.now += 60
    assert redeployed[0].acquire(API).envelope_version == 1
    assert old.acquire(API).envelope_version == 1  # the old process follows the store, too
    assert old.remaining([API])[API] <= 2  # the new burst


def test_store_outage_fails_closed() -> None:
    from botocore.config import Config
    import boto3

    dead = boto3.client("dynamodb", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"total_max_attempts": 1}, connect_timeout=1))
    decision = BudgetClient("t", dead).acquire(f"{API}/x")
    assert isinstance(decision, Deferral) and decision.reason.startswith("limiter_unavailable")


def test_clock_skew_does_not_mint_tokens(aws, table) -> None:
    truth = Clock()
    ahead = lambda: truth.now + 5.0  # noqa: E731
    behind = lambda: truth.now - 5.0  # noqa: E731
    clients = [new_client(aws, table, clock, envelopes=[Envelope(API, 4, 2)]) for clock in (truth, ahead, behind)]
    window = 10.0
    grants = drive(clients, truth, API, window)
    # A fast clock borrows from the future (the arrival time moves ahead of true time), it does not add:
    assert grants <= 4 * (window + 5.0) + 2
    later = drive(clients, truth, API, window)
    assert grants + later <= 4 * (2 * window + 5.0) + 2  # over two windows the borrowing is not repeated


def test_backoff_is_seen_by_every_holder(aws, table) -> None:
    clock = Clock()
    a = new_client(aws, table, clock, envelopes=[Envelope(API, 10, 10)])
    b = new_client(aws, table, clock, envelopes=[Envelope(API, 10, 10)])
    a.backoff(f"{API}/anything", 30, "http_429")
    decision = b.acquire(API)
    assert isinstance(decision, Deferral) and decision.reason == "backoff:http_429"
    assert decision.retry_after_seconds == pytest.approx(30, abs=0.01)
    assert b.remaining([API]) == {API: 0.0}
    clock.now += 30.01
    assert isinstance(b.acquire(API), Granted)


# ---------------------------------------------------------------------------------- adapters

class _Upstream(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(type(self).status)
        if type(self).status == 429:
            self.send_header("Retry-After", "7")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_requests_adapter_is_the_chokepoint(aws, table, upstream) -> None:
    clock = Clock()
    budget = new_client(aws, table, clock, envelopes=[Envelope(upstream, 1, 2)])
    session = requests.Session()
    session.mount("http://", BudgetAdapter(budget, step="tool-call-1"))
    _Upstream.status = 200
    assert session.get(f"{upstream}/a").status_code == 200
    assert session.get(f"{upstream}/b").status_code == 200
    with pytest.raises(EgressDeferred) as info:
        session.get(f"{upstream}/c")
    assert info.value.deferral.reason == "budget_empty" and info.value.deferral.step == "tool-call-1"
    clock.now += 1
    _Upstream.status = 429
    assert session.get(f"{upstream}/d").status_code == 429
    assert budget.remaining([upstream]) == {normalize(upstream): 0.0}  # backoff for everyone, Retry-After 7 s
    _Upstream.status = 200


def test_httpx_transport_is_the_chokepoint(aws, table) -> None:
    clock = Clock()
    budget = new_client(aws, table, clock, envelopes=[Envelope(API, 1, 1)])
    inner = httpx.MockTransport(lambda request: httpx.Response(503, headers={"Retry-After": "3"}))
    with httpx.Client(transport=BudgetTransport(budget, transport=inner)) as http:
        assert http.get(f"{API}/x").status_code == 503
        with pytest.raises(EgressDeferred) as info:
            http.get(f"{API}/y")
    assert info.value.deferral.reason == "backoff:http_503"


def test_emf_per_target_with_steps() -> None:
    out = io.StringIO()
    recorder = EmfRecorder("mi-agente", out=out, window_seconds=3600)
    recorder(Granted(API, 4.0, 2, "step-1"))
    recorder(Deferral(API, 0.5, "budget_empty", 0.0, 2, "step-2"))
    (record,) = recorder.flush()
    assert record["Granted"] == 1 and record["Deferrals"] == 1 and record["DeferralRate"] == 50.0
    assert record["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Rayito/Egress"
    lines = [json.loads(l) for l in out.getvalue().splitlines()]
    assert [l.get("step") for l in lines[:2]] == ["step-1", "step-2"]
    assert lines[1]["event"] == "egress_deferred" and lines[1]["retry_after"] == 0.5
