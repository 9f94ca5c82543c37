"""The in-memory stores the benchmark's numbers come from behave as the DynamoDB ones: the fenced
lease, slot writes refused to a tick that lost it, the GCRA budget (reservations, backoff, a
bucket a skewed clock wrote)."""

from __future__ import annotations

import pytest

from lambdas.reconciler.budget import Deferral, Granted, MemoryBudget, implausible
from lambdas.reconciler.core import Slot
from lambdas.reconciler.ledger import FencedOut, MemoryLedger


def test_the_newest_tick_holds_the_lease_and_the_older_is_fenced_out() -> None:
    ledger = MemoryLedger()
    old = ledger.acquire_tick("f", "a", 100.0, 60)
    new = ledger.acquire_tick("f", "b", 100.0 - 130, 60)  # a clock 130 s behind: no matter
    assert (old, new) == (1, 2)
    with pytest.raises(FencedOut):
        ledger.save("f", Slot("base-0", "base"), fence=old)
    ledger.save("f", Slot("base-0", "base", generation=3), fence=new)
    ledger.delete("f", "gone", fence=new)
    slots, stats = ledger.load("f")
    assert slots["base-0"].generation == 3 and len(stats["epoch"]) == 8
    ledger.release_tick("f", "a")  # not the holder: nothing happens
    ledger.write("f", new, meta={"spec": "x"})
    ledger.release_tick("f", "b")
    ledger.add_stats("f", run_attempts=2, slots_filled=1)
    assert ledger.load("f")[1]["run_attempts"] == 2 and ledger.load("f")[1]["spec"] == "x"
    ledger.save("g", Slot("base-0", "base", microvm_id="vm-1", retiring_id="vm-0"))
    assert ledger.load_vm_ids(["g", "h"]) == {"vm-1", "vm-0"}


def test_the_memory_budget_reserves_backs_off_and_resets_a_skewed_bucket() -> None:
    budget = MemoryBudget({"RunMicrovm": (2, 2)})
    now = 1000.0
    assert isinstance(budget.acquire("RunMicrovm", now, cost=2), Granted)
    empty = budget.acquire("RunMicrovm", now)
    assert isinstance(empty, Deferral) and empty.reason == "budget_empty"
    reserved = budget.acquire("RunMicrovm", now, cost=1, horizon=2)
    assert isinstance(reserved, Granted) and reserved.wait_seconds == pytest.approx(0.5)
    assert budget.remaining("RunMicrovm", now + 10) == 2
    budget.backoff("RunMicrovm", now + 30, "throttled")
    budget.backoff("RunMicrovm", now + 5, "shorter")  # a shorter backoff never shortens one in force
    held = budget.acquire("RunMicrovm", now + 10)
    assert isinstance(held, Deferral) and held.reason == "backoff:throttled" and held.retry_after_seconds == 20
    # A bucket whose arrival time only a clock far ahead could have written is treated as idle.
    budget._tat["ListMicrovms"] = now + 300
    assert implausible(now, 1 / 9.5, 9) < now + 300
    assert isinstance(budget.acquire("ListMicrovms", now), Granted)
    assert budget.shape("Unknown") == (0.1, 10.0)


def test_the_lease_tells_when_its_holders_tick_ends() -> None:
    ledger = MemoryLedger()
    assert ledger.busy_until("f") is None
    ledger.acquire_tick("f", "a", 100.0, 60, tick_until=150.0)
    assert ledger.busy_until("f") == 150.0
    ledger.acquire_tick("f", "b", 101.0, 60)  # a holder that does not say
    assert ledger.busy_until("f") is None
    ledger.acquire_tick("f", "c", 102.0, 60, tick_until=152.0)
    ledger.release_tick("f", "c")
    assert ledger.busy_until("f") is None
