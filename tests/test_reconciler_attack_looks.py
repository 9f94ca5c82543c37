"""Round 5 attack (#11, API calls): rec's one look at the VMs a tick started for parked slots
(2.6 s after the runs; GetMicrovm for one VM, a list for more), suspends that act on that look
when their tokens come due after it (``suspends_only``: nothing ended or resumed on it), and
``parking_unseen`` (no look of its own for our suspends). Everything through ``index.handler``
(Powertools, one-attempt clients) against the emulator and moto on a virtual clock."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

import pytest

from .moto_server import moto_server
from .reconciler_harness import RECONCILER_CALLER, deployed_fleet, list_lag
from .test_reconciler_handler import assert_no_duplicates


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


def ours(fleet, operation: str, since: float = 0.0) -> list[Any]:
    return [r for r in fleet.emulator.requests
            if r.operation == operation and r.caller == RECONCILER_CALLER and r.time >= since]


#: SuspendMicrovm at one a 4 s (burst 1): the second parked slot's suspend comes due after the look
#: that saw both VMs RUNNING, so it is sent by a suspends-only step standing on that look.
SLOW_SUSPENDS = '{"SuspendMicrovm": [0.25, 1]}'


def test_a_client_resuming_a_parked_vm_before_a_suspends_only_step_keeps_its_session(aws, monkeypatch) -> None:
    """Both parked slots' VMs are seen RUNNING by one look; warm-0's is suspended at once, warm-1's
    4 s later on the same look. Between the two, a client resumes warm-0's VM (now SUSPENDED): the
    suspends-only step sees it RUNNING on the old look, within the park grace, and leaves it alone
    (never suspended again); the next tick makes it a member and refills the pool."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5", "BUDGETS": SLOW_SUSPENDS}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        resumed: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not resumed:
                vm = record.microvm_id
                fleet.clock.advance(1.5)  # SUSPENDING -> SUSPENDED (1 s here)
                fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=vm)
                resumed.append(vm)

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        suspends = ours(fleet, "SuspendMicrovm")
        assert len(suspends) == 2 and suspends[0].microvm_id == resumed[0] != suspends[1].microvm_id
        assert first.calls.get("ListMicrovms") == 2  # the second suspend stood on the look
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        # The client's session was never suspended again, and it is a member now.
        assert [r for r in ours(fleet, "SuspendMicrovm") if r.microvm_id == resumed[0]] == suspends[:1]
        assert fleet.emulator.state_of(resumed[0]) == "RUNNING"
        slots = fleet.ledger_slots()
        assert any(s["role"] == "member" and s["microvm_id"] == resumed[0] for s in slots.values())
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 2}
        assert_no_duplicates(fleet)


def test_a_vm_that_ends_between_the_look_and_its_suspend_is_replaced(aws, monkeypatch) -> None:
    """warm-1's VM, seen RUNNING by the look, ends (a client terminates it: a crash or expiry
    looks the same) before its suspend comes due: the suspend is refused (Conflict), told, and the
    next tick starts a new VM for the slot and parks it; no more than max_vms, no duplicate."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "4", "BUDGETS": SLOW_SUSPENDS}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ended: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not ended:
                slots = fleet.ledger_slots()
                other = [s["microvm_id"] for k, s in slots.items()
                         if s["role"] == "warm" and s["microvm_id"] and s["microvm_id"] != record.microvm_id]
                fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=other[0])
                ended.append(other[0])

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        refused = [r for r in ours(fleet, "SuspendMicrovm") if r.microvm_id == ended[0]]
        assert refused and {r.status for r in refused} == {409}
        assert [e for e in first.events("api_error") if e.get("microvm_id") == ended[0]]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}
        assert_no_duplicates(fleet)


@pytest.mark.parametrize("warm", [2, 3])
def test_parked_slots_vms_a_lagging_list_misses_are_still_parked_in_the_tick(aws, monkeypatch, warm) -> None:
    """Lists omit VMs younger than 6 s (#11.2's lagging lists): the one look at the VMs a tick
    started for its parked slots is a list when there are several, and that list misses them.
    They must still be looked at (GetMicrovm answers for each, lists do not lag them) and parked
    in the same tick, not left RUNNING until the next one."""
    env = {"MIN_VMS": "1", "WARM_VMS": str(warm), "MAX_VMS": str(warm + 2)}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        list_lag(fleet, 6)
        t0 = fleet.clock.now()
        fleet.invoke(monkeypatch)
        suspends = ours(fleet, "SuspendMicrovm")
        assert len(suspends) == warm, fleet.emulator.calls
        assert all(r.time <= t0 + 15 for r in suspends)
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": warm}
        assert_no_duplicates(fleet)


def test_a_throttled_peek_is_told_and_the_step_lists_instead(aws, monkeypatch) -> None:
    """The single GetMicrovm peek at a parked slot's PENDING VM is throttled (429): the step lists
    instead and still parks the VM, and the throttle is told (api_error, Throttles metric) like
    every other refused call, not swallowed."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"},
                        pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.set_rate_limit("GetMicrovm", 1 / 600, 1, surge=0)
        try:  # the one token of the bucket: taken by a client of the test
            fleet.emulator.direct_client(caller="client").get_microvm(microvmIdentifier="nope")
        except Exception:
            pass
        run = fleet.invoke(monkeypatch)
        assert [r.status for r in ours(fleet, "GetMicrovm")] == [429]
        assert len(ours(fleet, "SuspendMicrovm")) == 1
        assert [e for e in run.events("api_error") if e.get("operation") == "GetMicrovm"]
        assert run.metrics("Throttles")
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
