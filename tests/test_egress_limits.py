"""The egress budget (#14) at its limits. Each test states what a user or the spec expects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from rayito_constructs.egress import BudgetClient, Deferral, Envelope, Granted

from .egress_support import Clock, counting_store, ddb
from .egress_support import new_client

API = "https://api.example.com"


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


@pytest.fixture
def table(store) -> str:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), name)
    return name


def test_clear_backoff_on_a_target_never_used_does_not_brick_it(store, table) -> None:
    """An operator (or an adapter) clearing a backoff on a target no process has used yet must
    not leave that target deferred as `limiter_unavailable` for ever."""
    clock = Clock()
    a = new_client(store, table, clock)
    assert a.clear_backoff("https://fresh.example.com") is True
    b = new_client(store, table, clock)
    decision = b.acquire("https://fresh.example.com/x")
    assert isinstance(decision, Granted), decision


def test_a_changed_default_envelope_does_not_undo_an_operators_envelope_on_a_target(store, table) -> None:
    """An operator lowered one undeclared target to 0.5/s with put_envelope (it has an envelope
    of its own now). A redeploy that only changes the fleet's *default* envelope (for targets
    nobody declared) must not write the default over it: the issue (#14) says a restart or
    redeploy never undoes an operator's change unless that target's own declaration changed."""
    clock = Clock()
    flaky = "https://flaky.example.com"
    old = new_client(store, table, clock, default_rate=1.0, default_burst=5)
    assert isinstance(old.acquire(flaky), Granted)
    old.put_envelope(flaky, 0.5, 1, "target struggles: operator lowered it")
    clock.now += 5
    new = new_client(store, table, clock, default_rate=2.0, default_burst=10)  # redeploy: new default only
    decision = new.acquire(flaky)
    assert isinstance(decision, Granted)
    assert (decision.rate_per_second, decision.burst) == (0.5, 1), decision
    history = new.envelopes(flaky)
    assert history[-1]["source"] == "operator", history


def test_a_malformed_url_puts_neither_its_credentials_nor_itself_in_a_metric_dimension(store, table) -> None:
    """A request URL that is not a target (here a port out of range) is deferred as
    ``invalid_target``. Its deferral's ``target`` is the raw URL, and EmfRecorder emits it as the
    ``target`` dimension: the user info and query (a password, an API key) become a CloudWatch
    dimension value (readable with cloudwatch:ListMetrics, kept 15 months, no customer key), and
    every distinct bad URL becomes new custom metrics (docs: "8 custom metrics per target").
    Expected: the dimension holds no credential, and bad URLs share bounded dimension values."""
    import io
    import json

    from rayito_constructs.egress import EmfRecorder

    clock = Clock()
    out = io.StringIO()
    recorder = EmfRecorder("leaky", out=out, clock=clock, background=False, metrics=True)
    budget = new_client(store, table, clock, on_decision=recorder)
    for i in range(3):
        decision = budget.acquire(f"https://bot:hunter2-{i}@api.example.com:99999/v1/items/{i}?api_key=sk-live-{i}")
        assert isinstance(decision, Deferral) and decision.reason == "invalid_target"
    recorder.close()
    dims = {r["target"] for r in (json.loads(line) for line in out.getvalue().splitlines()) if "_aws" in r}
    assert not [d for d in dims if "hunter2" in d or "sk-live" in d], dims
    assert len(dims) == 1, dims


def test_a_dot_dot_segment_with_a_parameter_does_not_dodge_a_path_class(store, table) -> None:
    """``/v1/x/..;/search`` is ``/v1/search`` on servers that drop ``;parameters`` before they
    resolve dot segments (Tomcat, Jetty, Spring: the well-known ``..;`` path bypass). The target
    rules say ``;parameters`` are dropped "because servers are lenient in ways a budget must not
    be dodged by", but they are dropped after dot segments are removed, so ``..;`` stays a
    literal segment and the request falls outside the class: a class of burst 1 granted 5
    requests at one instant (1 on the class, 4 more on the origin's default envelope)."""
    from rayito_constructs.egress.targets import normalize

    search = f"{API}/v1/search"
    clock = Clock()
    budget = new_client(store, table, clock, envelopes=[Envelope(search, 1, 1)])
    grants = sum(isinstance(budget.acquire(url), Granted)
                 for url in [search] + [f"{API}/v1/x{i}/..;/search" for i in range(5)])
    assert grants <= 1, f"{grants} grants at one instant against the class's burst of 1"
    assert normalize(f"{API}/v1/x/..;/search", [search]) == search
