"""The place in line of the shared control-plane budget (lambdas/reconciler/budget.py): the first
asker refused while it is free reserves NEXT_IN_LINE_BONUS_SECONDS further until one of its asks is
granted; nobody else is held back by it. The same rules for the in-process store (the benchmark's)
and the DynamoDB one (moto in server mode, the construct's table)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from lambdas.reconciler.budget import (
    NEXT_IN_LINE_BONUS_SECONDS,
    NEXT_IN_LINE_GRACE_SECONDS,
    Deferral,
    DynamoDBBudget,
    Granted,
    MemoryBudget,
)

from .harness import aws_client

SHAPE = {"RunMicrovm": (2.0, 2.0)}  # a token every 0.5 s, 2 at once
NOW = 1_790_000_000.0



@pytest.fixture(params=["memory", "dynamodb"])
def make(request: Any) -> Any:
    """A factory of budgets on one bucket (two calls: two processes)."""
    if request.param == "memory":
        shared = MemoryBudget(SHAPE)
        return lambda: shared
    aws = request.getfixturevalue("aws")
    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    return lambda: DynamoDBBudget(ddb, table, SHAPE)


def _fill(budget: Any, now: float) -> None:
    """Reserve every token up to the 2 s horizon: the next plain ask is refused."""
    while isinstance(budget.acquire("RunMicrovm", now, cost=1, horizon=2.0), Granted):
        pass


def test_the_first_refused_asker_goes_first_and_nobody_else_is_held_back(make) -> None:
    a, b = make(), make()
    _fill(a, NOW)
    first = a.acquire("RunMicrovm", NOW, horizon=2.0, asker="fleet-a")
    second = b.acquire("RunMicrovm", NOW, horizon=2.0, asker="fleet-b")
    assert isinstance(first, Deferral) and isinstance(second, Deferral)
    # fleet-a took the place in line: its next ask reserves up to 2 s further, fleet-b's does not.
    assert first.retry_after_seconds < second.retry_after_seconds
    assert isinstance(b.acquire("RunMicrovm", NOW + 0.1, horizon=2.0, asker="fleet-b"), Deferral)
    granted = a.acquire("RunMicrovm", NOW + 0.1, horizon=2.0, asker="fleet-a")
    assert isinstance(granted, Granted)
    assert 2.0 < granted.wait_seconds <= 2.0 + NEXT_IN_LINE_BONUS_SECONDS + 1e-6
    # Granted: the place is free again, and fleet-b (refused next) takes it.
    assert isinstance(b.acquire("RunMicrovm", NOW + 0.2, horizon=2.0, asker="fleet-b"), Deferral)
    assert isinstance(b.acquire("RunMicrovm", NOW + 0.3, horizon=2.0, asker="fleet-b"), Granted)
    assert isinstance(a.acquire("RunMicrovm", NOW + 0.3, horizon=2.0, asker="fleet-a"), Deferral)
    # A plain ask (no asker) is admitted whenever its own line allows, place in line or not.
    later = NOW + 30
    assert isinstance(a.acquire("RunMicrovm", later, horizon=2.0, asker="fleet-a"), Granted)


def test_an_asker_that_goes_away_holds_the_place_only_past_its_retry_and_grace(make) -> None:
    a, b = make(), make()
    _fill(a, NOW)
    taken = a.acquire("RunMicrovm", NOW, horizon=2.0, asker="gone")
    assert isinstance(taken, Deferral)
    # "gone" never asks again. Until its retry and the grace pass, fleet-b cannot take the place...
    soon = NOW + taken.retry_after_seconds + NEXT_IN_LINE_GRACE_SECONDS - 0.5
    _fill(b, soon)
    assert isinstance(b.acquire("RunMicrovm", soon, horizon=2.0, asker="fleet-b"), Deferral)
    assert isinstance(b.acquire("RunMicrovm", soon, horizon=2.0 + 0.3, asker="fleet-b"), Deferral)
    # ...afterwards it does, and reserves on the later line.
    late = NOW + taken.retry_after_seconds + NEXT_IN_LINE_GRACE_SECONDS + 1.0
    _fill(b, late)
    assert isinstance(b.acquire("RunMicrovm", late, horizon=2.0, asker="fleet-b"), Deferral)
    # "gone" comes back: the place is fleet-b's now; "gone" asks on its own line (refused).
    assert isinstance(a.acquire("RunMicrovm", late, horizon=2.0, asker="gone"), Deferral)
    assert isinstance(b.acquire("RunMicrovm", late, horizon=2.0, asker="fleet-b"), Granted)


def test_a_place_taken_between_the_refusal_and_the_taking_is_not_taken(aws) -> None:
    """Two processes refused at once both see the place free; the second write loses (DynamoDB's
    condition), and its refusal stands as it was."""
    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    a, b = DynamoDBBudget(ddb, table, SHAPE), DynamoDBBudget(ddb, table, SHAPE)
    _fill(a, NOW)
    assert isinstance(b.acquire("RunMicrovm", NOW, horizon=2.0, asker="fleet-b"), Deferral)  # b's place
    refused = Deferral("RunMicrovm", 1.5, "budget_empty")
    interval, burst = a.shape("RunMicrovm")
    # a saw the place free before b took it: a's write of the place is refused.
    assert a._take_line("RunMicrovm", NOW, 1, interval, burst, "fleet-a", 4.0, NOW + 3.0, refused) is refused
    assert ("RunMicrovm", "fleet-a") not in a._in_line


def test_the_later_line_stays_within_the_callers_cap_and_asks_without_a_reservation_never_queue(make) -> None:
    a = make()
    _fill(a, NOW)
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="capped", horizon_cap=2.6), Deferral)
    granted = a.acquire("RunMicrovm", NOW, horizon=2.0, asker="capped", horizon_cap=2.6)
    assert isinstance(granted, Granted) and granted.wait_seconds <= 2.6 + 1e-6
    _fill(a, NOW)
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="capped", horizon_cap=2.6), Deferral)
    # Capped at what the bucket already holds: refused on the later line too, in line all the same.
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="capped", horizon_cap=2.6), Deferral)
    # No horizon: a token that conforms now or none, never a place in line.
    assert isinstance(a.acquire("RunMicrovm", NOW, asker="now-only"), Deferral)
    # "capped" still holds the place ("now-only" took none): "other" is refused on its own line.
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="other"), Deferral)
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="other"), Deferral)


def test_in_line_an_idle_bucket_or_a_backoff_answer_as_for_anyone(make) -> None:
    a = make()
    _fill(a, NOW)
    assert isinstance(a.acquire("RunMicrovm", NOW, horizon=2.0, asker="fleet-a"), Deferral)
    a.backoff("RunMicrovm", NOW + 20, "throttled")
    held = a.acquire("RunMicrovm", NOW + 1, horizon=2.0, asker="fleet-a")
    assert isinstance(held, Deferral) and held.reason == "backoff:throttled"
    # Long after: the bucket is idle; the ask is granted at once, as anyone's.
    idle = a.acquire("RunMicrovm", NOW + 60, horizon=2.0, asker="fleet-a")
    assert isinstance(idle, Granted) and idle.wait_seconds == 0.0
