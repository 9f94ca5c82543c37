"""Round 4 attack (#11): bad input, skew and kills against the round-4 changes (the shared
budget's single admission line, reserve-before-list, skip-instead-of-takeover, in-doubt
refusals), through ``index.handler`` against the emulator and moto where the break shows there."""

from __future__ import annotations

import json
import math
from typing import Iterator

import pytest

from lambdas.reconciler.budget import DEFAULT_BUDGETS, DEFAULT_SHARE, DynamoDBBudget, Granted, MemoryBudget

from .moto_server import client as aws_client
from .moto_server import moto_server
from .reconciler_harness import deployed_fleet


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


#: Budgets a hand-edited or mis-generated BUDGETS environment can hold (json.loads takes NaN and
#: Infinity): a zero rate divided by zero on every tick, a negative or NaN rate admitted every
#: call (the stored arrival time never grows), a burst under 1 never admitted one token by the
#: DynamoDB store (the fleet never listed), a string crashed ``index.build``.
BAD_BUDGETS = ('{"RunMicrovm": [0, 5], "ListMicrovms": [NaN, 10], "GetMicrovm": [-100, 100],'
               ' "SuspendMicrovm": [2, 0.5], "ResumeMicrovm": [Infinity, 5], "TerminateMicrovm": "x",'
               ' "CreateMicrovmAuthToken": [50, -1]}')


def test_a_bad_budgets_environment_keeps_the_documented_quotas_and_says_so(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"BUDGETS": BAD_BUDGETS}) as fleet:
        first = fleet.invoke(monkeypatch)
        assert "skipped" not in first.result
        assert len(fleet.ours()) == 2  # it still converges (min 1, warm 1)
        rejected = first.events("budgets_rejected")
        assert rejected and set(rejected[0]["operations"]) == {
            "RunMicrovm", "ListMicrovms", "GetMicrovm", "SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm",
            "CreateMicrovmAuthToken"}
        # Each bad entry fell back to the documented quota's share, not to "no limit".
        budget = fleet._environment.budget
        for operation, (rate, burst) in DEFAULT_BUDGETS.items():
            assert budget.budgets[operation] == (rate * DEFAULT_SHARE, max(1.0, burst - 1))


@pytest.mark.parametrize("store", ["memory", "dynamodb"])
@pytest.mark.parametrize("cost", [0, -3, math.nan, 1.5])
def test_an_ask_of_no_tokens_is_refused_loudly(aws, store, cost) -> None:
    """A cost of 0 took no token, a negative one gave tokens back (the stored arrival time went
    down): a caller's bug, raised, nothing written."""
    budget = _budget(aws, store)
    with pytest.raises(ValueError, match="cost"):
        budget.acquire("RunMicrovm", 1000.0, cost=cost, horizon=2.0)
    assert budget.remaining("RunMicrovm", 1000.0) == 4.0


@pytest.mark.parametrize("store", ["memory", "dynamodb"])
def test_a_reservation_larger_than_the_burst_is_never_granted(aws, store) -> None:
    """With a horizon, the memory store granted 10 tokens on a burst of 4, all usable at one
    instant (10 calls at once against a quota of 4 + rate x 0); DynamoDB refused them. Both now
    refuse (as without a horizon), and the bucket is untouched."""
    budget = _budget(aws, store)
    refused = budget.acquire("RunMicrovm", 1000.0, cost=10, horizon=2.0)
    assert not isinstance(refused, Granted) and refused.reason == "budget_empty"
    assert budget.remaining("RunMicrovm", 1000.0) == 4.0
    assert budget.acquire("RunMicrovm", 1000.0, cost=4, horizon=2.0) == Granted("RunMicrovm", 4, 0.0)


def _budget(aws, store):
    shape = {"RunMicrovm": (4.75, 4)}
    if store == "memory":
        return MemoryBudget(shape)
    import uuid

    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    return DynamoDBBudget(ddb, table, shape)


@pytest.mark.parametrize("raw", ["not json", "[5, 5]", "5"])
def test_a_budgets_environment_that_is_no_object_keeps_every_default(raw, monkeypatch) -> None:
    from lambdas.reconciler import index
    from lambdas.reconciler.telemetry import MemoryTelemetry

    env = {"BUDGETS": raw, "FLEET_NAME": "f", "IMAGE_ARN": "arn:aws:lambda:us-east-1:123456789012:microvm-image:f",
           "MIN_VMS": "1", "MAX_VMS": "2", "LEDGER_TABLE": "l", "BUDGET_TABLE": "b"}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    telemetry = MemoryTelemetry()
    reconciler = index.build(env, telemetry=telemetry)
    assert reconciler.budget.rejected == {"BUDGETS": repr(raw)}
    assert [e["event"] for e in telemetry.events] == ["budgets_rejected"]
    assert reconciler.budget.budgets["RunMicrovm"] == (5 * DEFAULT_SHARE, 4.0)
