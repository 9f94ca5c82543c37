"""The benchmark's stores behave as the deployed ones: the same operations on ``MemoryLedger`` /
``MemoryBudget`` (what ``benchmarks/reconciler.py`` measures with) and on ``DynamoDBLedger`` /
``DynamoDBBudget`` (what the reconciler and the teardown use in AWS), the latter through real
boto3 clients against moto in server mode, give the same answers: the lease and its fence, off
and on, what a peek sees before anything was written, unfenced writes, forgetting, and the
shared rate buckets' edge cases (a cost above the burst, a bucket a skewed clock wrote, a
shorter backoff after a longer one). Each answer is also asserted on its own, so a bug shared by
both stores fails too. The DynamoDB side is checked against the items moto holds.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from lambdas.reconciler.budget import Deferral, DynamoDBBudget, Granted, MemoryBudget
from lambdas.reconciler.core import BASE, WARM, Slot
from lambdas.reconciler.ledger import DynamoDBLedger, FencedOut, FleetOff, MemoryLedger

from ..moto_server import client as aws_client
from ..moto_server import moto_server


@pytest.fixture(scope="module")
def ddb() -> Iterator[Any]:
    with moto_server() as endpoint:
        yield aws_client("dynamodb", endpoint)


def dynamodb_ledger(ddb: Any) -> DynamoDBLedger:
    table = f"ledger-{uuid.uuid4().hex[:8]}"
    DynamoDBLedger.create_table(ddb, table)
    return DynamoDBLedger(ddb, table)


def dynamodb_budget(ddb: Any, budgets: dict[str, tuple[float, float]]) -> tuple[DynamoDBBudget, str]:
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    return DynamoDBBudget(ddb, table, budgets), table


def _raises(call: Any) -> str:
    try:
        call()
    except (FencedOut, FleetOff) as exc:
        return type(exc).__name__
    return "ok"


def lease_story(ledger: Any) -> list[Any]:
    """What a fleet's ledger goes through: two ticks, a teardown, a fleet made again."""
    fleet = "mi-agente"
    seen: list[Any] = [("peek_empty", ledger.peek(fleet))]
    first = ledger.acquire_tick(fleet, "tick-a", 100.0, 55.0, tick_until=150.0)
    ledger.load(fleet)  # a tick's first read: the fleet's epoch
    seen.append(("busy_until", ledger.busy_until(fleet)))
    ledger.save(fleet, Slot("base-0", BASE, microvm_id="vm-1", vm_started_at=101.0), first)
    second = ledger.acquire_tick(fleet, "tick-b", 110.0, 55.0)  # the newest tick takes the lease
    seen.append(("fences", second - first))
    seen.append(("busy_until_unsaid", ledger.busy_until(fleet)))  # tick-b said no end
    seen.append(("old_fence", _raises(lambda: ledger.save(fleet, Slot("base-1", BASE), first))))
    ledger.release_tick(fleet, "tick-a")  # not the holder: nothing changes, no error
    seen.append(("still_held_by_b", _raises(lambda: ledger.save(fleet, Slot("warm-0", WARM, retiring_id="vm-2"),
                                                                    second))))
    ledger.add_stats(fleet)  # nothing to add: no write
    ledger.add_stats(fleet, run_attempts=3, slots_filled=2)
    ledger.write(fleet, second, meta={"spec": "abc", "strays": {"vm-9": "RUNNING"}})
    ledger.release_tick(fleet, "tick-b")
    seen.append(("released", ledger.busy_until(fleet)))
    # Unfenced writes (no tick holds the lease): what local tools and tests write.
    ledger.save(fleet, Slot("member-0", "member", microvm_id="vm-3"))
    ledger.delete(fleet, "warm-0")
    ledger.write(fleet, None, puts=[Slot("member-1", "member", microvm_id="vm-4")], deletes=["member-0"],
                 meta={"spec": "def", "retired": {"warm-0": 1}})
    slots, stats = ledger.peek(fleet)
    seen.append(("slots", sorted((s.slot_id, s.microvm_id, s.retiring_id) for s in slots.values())))
    seen.append(("stats", {k: v for k, v in stats.items() if k != "epoch"}))
    seen.append(("vm_ids", sorted(ledger.load_vm_ids([fleet, "another-fleet"]))))
    epoch = stats["epoch"]
    # The teardown: off fences out the last tick and refuses new ones.
    fence = ledger.acquire_tick(fleet, "tick-c", 120.0, 55.0)
    off = ledger.turn_off(fleet, "teardown:req-1", 130.0)
    seen.append(("off_fence", off - fence))
    seen.append(("is_off", ledger.is_off(fleet)))
    seen.append(("fenced_by_off", _raises(lambda: ledger.delete(fleet, "base-0", fence))))
    seen.append(("acquire_when_off", _raises(lambda: ledger.acquire_tick(fleet, "tick-d", 140.0, 55.0))))
    seen.append(("busy_when_off", ledger.busy_until(fleet)))
    ledger.forget(fleet, ["base-0"])
    seen.append(("after_forget", sorted(ledger.peek(fleet)[0])))
    ledger.forget(fleet, ["member-1"], stats=True)
    seen.append(("forgot_all", ledger.peek(fleet)))
    # Made again: on, a new epoch, ticks take the lease.
    ledger.turn_on(fleet)
    seen.append(("is_off_again", ledger.is_off(fleet)))
    again = ledger.acquire_tick(fleet, "tick-e", 200.0, 55.0)
    seen.append(("fence_goes_on", again > off))
    slots, stats = ledger.load(fleet)
    seen.append(("new_epoch", (slots, stats["epoch"] != epoch, stats["run_attempts"], stats["strays"])))
    ledger.turn_on("another-fleet")  # a teardown created before its fleet ever ticked: nothing to clear
    seen.append(("other_fleet", (ledger.peek("another-fleet"), ledger.is_off("another-fleet"))))
    return seen


EXPECTED = [
    ("peek_empty", ({}, None)),
    ("busy_until", 150.0),
    ("fences", 1),
    ("busy_until_unsaid", None),
    ("old_fence", "FencedOut"),
    ("still_held_by_b", "ok"),
    ("released", None),
    ("slots", [("base-0", "vm-1", None), ("member-1", "vm-4", None)]),
    ("stats", {"run_attempts": 3, "slots_filled": 2, "spec": "def", "strays": {"vm-9": "RUNNING"}, "letters": {},
               "retired": {"warm-0": 1}}),
    ("vm_ids", ["vm-1", "vm-4"]),
    ("off_fence", 1),
    ("is_off", True),
    ("fenced_by_off", "FencedOut"),
    ("acquire_when_off", "FleetOff"),
    ("busy_when_off", None),
    ("after_forget", ["member-1"]),
    ("forgot_all", ({}, None)),
    ("is_off_again", False),
    ("fence_goes_on", True),
    ("new_epoch", ({}, True, 0, {})),
    ("other_fleet", (({}, None), False)),
]


def test_the_memory_ledger_answers_as_the_dynamodb_ledger(ddb) -> None:
    memory = lease_story(MemoryLedger())
    dynamodb = lease_story(dynamodb_ledger(ddb))
    assert memory == EXPECTED
    assert dynamodb == EXPECTED


def test_the_dynamodb_ledger_keeps_what_it_says_in_its_items(ddb) -> None:
    """The ``#tick`` item as the teardown leaves it, read from moto: off, fenced, no holder's end."""
    ledger = dynamodb_ledger(ddb)
    ledger.acquire_tick("uno", "tick-a", 10.0, 55.0, tick_until=60.0)
    ledger.turn_off("uno", "teardown:req-9", 20.0)
    item = ddb.get_item(TableName=ledger._table, Key={"fleet": {"S": "uno"}, "key": {"S": "#tick"}},
                        ConsistentRead=True)["Item"]
    assert (item["off"], item["holder"], item["fence"], item["tick_until"]) == (
        {"S": "teardown:req-9"}, {"S": "teardown:req-9"}, {"N": "2"}, {"N": "0"})
    ledger.turn_on("uno")
    item = ddb.get_item(TableName=ledger._table, Key={"fleet": {"S": "uno"}, "key": {"S": "#tick"}},
                        ConsistentRead=True)["Item"]
    assert "off" not in item and "off_at" not in item and item["fence"] == {"N": "2"}
    assert ledger.acquire_tick("uno", "tick-b", 30.0, 55.0) == 3


def budget_story(budget: Any) -> list[Any]:
    """A bucket of rate 2/s, burst 2 (interval 0.5 s) through its edge cases."""
    seen: list[Any] = []
    # More tokens than the burst can ever hold: never granted, told to come back later.
    too_many = budget.acquire("RunMicrovm", 1000.0, cost=3)
    seen.append(("too_many", type(too_many).__name__, too_many.reason))
    seen.append(("remaining_untouched", budget.remaining("RunMicrovm", 1000.0)))
    seen.append(("first", budget.acquire("RunMicrovm", 1000.0)))
    seen.append(("second", budget.acquire("RunMicrovm", 1000.0)))
    empty = budget.acquire("RunMicrovm", 1000.0)
    seen.append(("empty", type(empty).__name__, round(empty.retry_after_seconds, 3), empty.reason))
    # A reservation within the horizon is granted with its wait.
    reserved = budget.acquire("RunMicrovm", 1000.0, horizon=1.0)
    seen.append(("reserved", type(reserved).__name__, round(getattr(reserved, "wait_seconds", -1), 3)))
    # A longer backoff holds; a shorter one asked later does not shorten it.
    budget.backoff("RunMicrovm", 1030.0, "throttled")
    budget.backoff("RunMicrovm", 1010.0, "capacity")
    held = budget.acquire("RunMicrovm", 1020.0)
    seen.append(("backoff", type(held).__name__, round(held.retry_after_seconds, 3), held.reason))
    seen.append(("after_backoff", budget.acquire("RunMicrovm", 1031.0)))
    return seen


BUDGET_EXPECTED = [
    ("too_many", "Deferral", "budget_empty"),
    ("remaining_untouched", 2.0),
    ("first", Granted("RunMicrovm", 1, 0.0)),
    ("second", Granted("RunMicrovm", 1, 0.0)),
    ("empty", "Deferral", 0.5, "budget_empty"),
    ("reserved", "Granted", 0.5),
    ("backoff", "Deferral", 10.0, "backoff:throttled"),
    ("after_backoff", Granted("RunMicrovm", 1, 0.0)),
]


def test_the_memory_budget_answers_as_the_dynamodb_budget(ddb) -> None:
    shape = {"RunMicrovm": (2.0, 2.0)}
    memory = budget_story(MemoryBudget(shape))
    dynamodb_side, table = dynamodb_budget(ddb, shape)
    dynamodb = budget_story(dynamodb_side)
    assert memory == BUDGET_EXPECTED
    assert dynamodb == BUDGET_EXPECTED
    item = ddb.get_item(TableName=table, Key={"operation": {"S": "RunMicrovm"}})["Item"]
    assert (float(item["backoff_until"]["N"]), item["backoff_reason"]) == (1030.0, {"S": "throttled"})


def test_a_bucket_a_skewed_clock_wrote_does_not_stall_a_reconciler_that_thought_it_busy(ddb) -> None:
    """Reconciler B took a token moments ago (so it guesses the bucket is busy); reconciler A,
    whose clock runs an hour ahead, then wrote an arrival time B's clock cannot reach. B's next
    acquire is granted at once (the bucket reset as idle), as the memory budget does."""
    shape = {"RunMicrovm": (2.0, 2.0)}
    b, table = dynamodb_budget(ddb, shape)
    a = DynamoDBBudget(ddb, table, shape)
    assert b.acquire("RunMicrovm", 1000.0) == Granted("RunMicrovm", 1, 0.0)
    assert a.acquire("RunMicrovm", 4600.0) == Granted("RunMicrovm", 1, 0.0)  # the skewed clock
    granted = b.acquire("RunMicrovm", 1000.1)
    assert granted == Granted("RunMicrovm", 1, 0.0)
    stored = float(ddb.get_item(TableName=table, Key={"operation": {"S": "RunMicrovm"}})["Item"]["tat"]["N"])
    assert stored == pytest.approx(1000.6)  # B's clock owns the bucket again
    memory = MemoryBudget(shape)
    memory.acquire("RunMicrovm", 4600.0)
    assert memory.acquire("RunMicrovm", 1000.1) == granted
    # Too many tokens asked while B guesses busy: refused, nothing written.
    refused = b.acquire("RunMicrovm", 1000.2, cost=5)
    assert isinstance(refused, Deferral) and refused.reason == "budget_empty"
    after = float(ddb.get_item(TableName=table, Key={"operation": {"S": "RunMicrovm"}})["Item"]["tat"]["N"])
    assert after == stored
