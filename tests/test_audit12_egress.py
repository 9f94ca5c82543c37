"""Audit round 12 (fresh eyes): the egress budget (#14) tests of tests/test_audit12_front.py
(branch audit14), copied verbatim. Each test states what a user or the spec expects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from rayito_constructs.egress import BudgetClient, Granted

from .egress_support import Clock, counting_store, ddb
from .test_egress import new_client

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
