"""A SuspendMicrovm whose answer is lost (#11.1: never suspend a client's session): the suspend may
have landed and a client may have resumed the VM since. The reconciler writes the doubt down,
reads the VM once a read cannot predate the suspend (GetMicrovm 0.6 s after the failure) and
sends the suspend again only when that read proves it did not land (RUNNING less than
``core.SUSPEND_THEN_RESUME_SECONDS`` after it was sent: no client could have resumed it yet).
Otherwise the suspend counts as accepted; a VM still RUNNING after the park grace is a client's (a
member) and the pool is refilled. Through ``index.handler`` (Powertools, one-attempt clients)
against the emulator and moto on a virtual clock; the rule itself is also tested pure."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lambdas.reconciler import core
from lambdas.reconciler.answers import lost_answer as _lost_answer

from .harness import RECONCILER_CALLER, at_first_call, deployed_fleet, fail_the_next_read
from .support import members
from .support import assert_no_duplicates

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

ENV = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "4"}



def suspends_of(fleet: Any, vm_id: str) -> list[Any]:
    return [r for r in fleet.emulator.requests
            if r.operation == "SuspendMicrovm" and r.caller == RECONCILER_CALLER and r.microvm_id == vm_id]




def test_a_suspend_refused_with_a_500_is_read_and_sent_again(aws, monkeypatch) -> None:
    """A plain 500 (nothing done): the read 0.6 s later says RUNNING, too soon for any client's
    resume, so the suspend did not land: sent again in the same tick. No member, no surplus VM."""
    with deployed_fleet(aws, env=ENV, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.inject("SuspendMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        first = fleet.invoke(monkeypatch)
        settled = first.events("park_doubt_settled")
        assert [e["outcome"] for e in settled] == ["not_landed"] and settled[0]["read_after"] < 2.2
        vm = settled[0]["microvm_id"]
        assert [r.status for r in suspends_of(fleet, vm)] == [500, 200]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
        assert not members(fleet)
        assert_no_duplicates(fleet)


def test_a_lost_suspend_answer_nobody_resumes_is_parked_with_one_suspend(aws, monkeypatch) -> None:
    """The suspend landed, its answer lost: the read says SUSPENDING/SUSPENDED, the slot parks
    on it; the suspend is never sent twice and no VM is added."""
    with deployed_fleet(aws, env=ENV, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.inject("SuspendMicrovm", "lost_response", times=1)
        first = fleet.invoke(monkeypatch)
        settled = first.events("park_doubt_settled")
        assert [e["outcome"] for e in settled] == ["landed"]
        vm = settled[0]["microvm_id"]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert [r.status for r in suspends_of(fleet, vm)] == [500]
        assert fleet.emulator.state_of(vm) == "SUSPENDED"
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
        assert not members(fleet)
        assert_no_duplicates(fleet)


def test_a_lost_suspend_answered_late_after_a_clients_resume_is_left_to_the_client(aws, monkeypatch) -> None:
    """The suspend lands, a client resumes the VM and it is RUNNING again before the lost answer
    arrives (3 s after it was sent): the read says RUNNING, but too late to prove anything. The
    suspend counts as accepted, is never sent again, and the VM becomes a member after the grace."""
    with deployed_fleet(aws, env=ENV, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.suspending_seconds = 1.0
        fleet.emulator.inject("SuspendMicrovm", "lost_response", times=1)
        resumed: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not resumed:
                fleet.clock.advance(1.2)
                fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=record.microvm_id)
                resumed.append(record.microvm_id)
                fleet.clock.advance(1.8)  # RUNNING again (resume 1.2 s) before the answer

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        assert [e["outcome"] for e in first.events("park_doubt_settled")] == ["unknown"]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert len(suspends_of(fleet, resumed[0])) == 1
        assert fleet.emulator.state_of(resumed[0]) == "RUNNING"
        assert members(fleet) == [resumed[0]]
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 1}
        assert_no_duplicates(fleet)


def test_a_lost_suspend_whose_read_fails_is_settled_by_the_next_list_never_resent(aws, monkeypatch) -> None:
    """The suspend did not land (a 500 after nothing), and the GetMicrovm that would prove it fails
    too. The doubt is in the ledger; the next tick's list, a minute later, says RUNNING: too late to
    tell a suspend that never landed from a client's resume, so it is never sent again (a member
    after the grace, the pool refilled: one VM more than needed, the price of never suspending a
    session that may be a client's)."""
    with deployed_fleet(aws, env=ENV, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.inject("SuspendMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        armed = at_first_call(fleet, "SuspendMicrovm", fail_the_next_read(fleet))
        first = fleet.invoke(monkeypatch)
        assert not first.events("park_doubt_settled")
        doubt = [s for s in fleet.ledger_slots().values() if s["role"] == "warm"]
        assert doubt[0]["park_doubt_since"] is not None
        fleet.clock.advance(60)
        second = fleet.invoke(monkeypatch)
        assert [e["outcome"] for e in second.events("park_doubt_settled")] == ["unknown"]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert len(suspends_of(fleet, armed[0])) == 1
        assert members(fleet) == [armed[0]]
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 1}
        assert_no_duplicates(fleet)


# ---------------------------------------------------------------------------- the rule, pure

STATES = ["PENDING", "RUNNING", "SUSPENDING", "SUSPENDED"]


@given(state=st.sampled_from(STATES), sent=st.floats(0, 1e9), after=st.floats(0, 3600))
def test_a_read_proves_a_lost_suspend_did_not_land_only_before_a_client_could_resume(state, sent, after) -> None:
    change = core.settle_park_doubt(core.Slot("warm-0", core.WARM, phase=core.PARKING, microvm_id="vm",
                                              park_doubt_since=sent), state, sent + after)
    slot, events = change.slot, change.events
    assert slot is not None and slot.park_doubt_since is None and len(events) == 1
    if state in ("PENDING", "RUNNING") and (sent + after) - sent < core.SUSPEND_THEN_RESUME_SECONDS:
        assert slot.parking_since is None and events[0]["outcome"] == "not_landed"  # sent again
    else:
        assert slot.parking_since == sent  # accepted: never sent again
        assert events[0]["outcome"] == ("landed" if state.startswith("SUSPEND") else "unknown")


def test_a_read_later_than_the_resume_window_never_leads_to_a_second_suspend() -> None:
    """Through plan(): a slot whose suspend is in doubt, its VM listed RUNNING 3 s after the send
    (a client may hold it) gets no suspend intent; listed RUNNING 1 s after, it does."""
    spec = core.FleetSpec(fleet="f", image_arn="arn:aws:lambda:us-east-1:123456789012:microvm-image:f",
                          min_vms=0, warm_vms=1, max_vms=2)
    for after, suspends in ((3.0, 0), (1.0, 1)):
        slot = core.Slot("warm-0", core.WARM, phase=core.PARKING, microvm_id="vm-1", vm_started_at=100.0,
                         park_doubt_since=1000.0, lifetime=28_800)
        observed = [core.Observed("vm-1", "RUNNING", 100.0)]
        plan = core.plan(spec, {"warm-0": slot}, observed, 1000.0 + after)
        assert sum(1 for i in plan.intents if i.kind == "suspend") == suspends, (after, plan.intents)


class _Error(Exception):
    pass


@pytest.mark.parametrize("status, code, lost", [
    (500, "InternalServerException", True), (503, "ServiceUnavailable", True), (429, "ThrottlingException", False),
    (409, "ConflictException", False), (404, "ResourceNotFoundException", False), (400, "ValidationException", False),
])
def test_which_failures_may_have_been_carried_out(status, code, lost) -> None:
    from botocore.exceptions import ClientError

    exc = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "SuspendMicrovm")
    assert _lost_answer(exc) is lost


def test_a_read_timeout_may_have_been_carried_out_a_refused_connection_not() -> None:
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    assert _lost_answer(ReadTimeoutError(endpoint_url="http://x"))
    assert not _lost_answer(ConnectTimeoutError(endpoint_url="http://x"))
    assert not _lost_answer(EndpointConnectionError(endpoint_url="http://x"))
