"""The reconciler through its deployed entry point (``index.handler``, the synthesized environment,
its own clients and Powertools telemetry: tests/reconciler_harness.py) on paths the other handler
tests do not take: a redrive that a teardown fences out midway, a MicroVMs endpoint that cannot be
reached, ListMicrovms throttled or refused. Assertions come from the emulator (calls, VMs), moto
(ledger items, dead letters) and what the handler printed (its events, EMF).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from lambdas.reconciler import index
from lambdas.reconciler.ledger import DynamoDBLedger

from .harness import RECONCILER_CALLER, deployed_fleet
from ..contract_support import refusing_port



@pytest.fixture(autouse=True)
def fresh_environment() -> Iterator[None]:
    index._RECONCILER = None
    yield
    index._RECONCILER = None


def test_a_redrive_fenced_out_by_a_teardown_midway_changes_nothing(aws, monkeypatch) -> None:
    """A redrive reads the ledger, and before it writes, the fleet's teardown turns the fleet off
    (a new fence): the redrive's write is refused, it says ``lease_lost`` and the dead slot stays
    dead; a redrive after the fleet is on again resets only the dead slot."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 1)
        (alive,) = [vm["microvmId"] for vm in fleet.ours()]
        fleet.env.update(MIN_VMS="2")
        refused = fleet.emulator.inject("RunMicrovm", "Validation", times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 2)
        fleet.emulator.remove_fault(refused)
        slots = fleet.ledger_slots()
        dead = sorted(k for k, s in slots.items() if s["phase"] == "dead")
        assert dead == ["base-1"] and slots["base-0"]["microvm_id"] == alive
        assert [letter["slot"] for letter in fleet.dead_letters()] == ["base-1"]

        racing = fleet.reconciler(monkeypatch)
        teardown_ledger = DynamoDBLedger(fleet.ddb, fleet.env["LEDGER_TABLE"])
        turned: list[int] = []

        def teardown_arrives(**_: Any) -> None:
            if not turned:
                turned.append(teardown_ledger.turn_off(fleet.fleet, "teardown:req-1", fleet.clock.now()))

        racing.ledger._ddb.meta.events.register("after-call.dynamodb.Query", teardown_arrives)
        index._RECONCILER = racing
        raced = fleet.invoke(monkeypatch, {"action": "redrive"}, cold=False)
        assert turned and raced.result == {"fleet": fleet.fleet, "skipped": "lease_lost"}
        assert fleet.ledger_slots()["base-1"]["phase"] == "dead"
        assert not raced.events("slots_redriven")

        teardown_ledger.turn_on(fleet.fleet)  # the fleet is added again
        index._RECONCILER = None
        again = fleet.invoke(monkeypatch, {"action": "redrive"}, cold=True)
        assert again.result == {"fleet": fleet.fleet, "redriven": ["base-1"]}
        assert fleet.ledger_slots()["base-1"]["phase"] == "queued"
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == alive  # a live slot is left as it is
        fleet.every_minute(monkeypatch, 1)
        assert len(fleet.ours()) == 2


def test_an_unreachable_microvms_endpoint_changes_nothing_and_is_told(aws, monkeypatch) -> None:
    """Every MicroVMs call fails to connect: the tick starts nothing, ends nothing and forgets
    nothing; it tells (api_error with the botocore error) and ends within its time."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        ours = sorted(vm["microvmId"] for vm in fleet.ours())
        before_slots = fleet.ledger_slots()
        before = dict(fleet.emulator.calls)
        with refusing_port() as closed:
            fleet.env.update(AWS_ENDPOINT_URL_LAMBDA_MICROVMS=closed)
            started = fleet.clock.now()
            run = fleet.invoke(monkeypatch, timeout=65)
        assert fleet.clock.now() - started <= 65
        assert fleet.emulator.calls == before
        errors = {(e["operation"], e["code"]) for e in run.events("api_error")}
        assert ("ListMicrovms", "EndpointConnectionError") in errors
        assert fleet.ledger_slots() == before_slots
        assert sorted(vm["microvmId"] for vm in fleet.ours()) == ours


@pytest.mark.parametrize("fault, retried", [("AccessDenied", False), ("InternalServer", True)])
def test_a_refused_list_defers_the_tick_and_starts_nothing_blind(aws, monkeypatch, fault, retried) -> None:
    """ListMicrovms refused: 403 (asking again in this tick will not help) or 500 (asked again a
    little later). Without a list the tick starts nothing: a VM it cannot see may exist."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        ours = sorted(vm["microvmId"] for vm in fleet.ours())
        fleet.emulator.client().terminate_microvm(microvmIdentifier=ours[0])  # a VM to replace
        fleet.clock.advance(5)
        armed = fleet.emulator.inject("ListMicrovms", fault, times=None, caller=RECONCILER_CALLER)
        run = fleet.invoke(monkeypatch)
        fleet.emulator.remove_fault(armed)
        lists = run.calls.get("ListMicrovms", 0)
        assert (lists > 1) == retried, lists
        assert run.calls.get("RunMicrovm", 0) == 0
        code = f"{fault}Exception"
        assert {e["code"] for e in run.events("api_error") if e["operation"] == "ListMicrovms"} == {code}
        after = fleet.invoke(monkeypatch)  # the list answers again: the VM is replaced
        assert after.calls.get("RunMicrovm", 0) == 1 and len(fleet.ours()) == 2


def test_a_throttled_list_backs_off_as_told(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fleet.emulator.set_rate_limit("ListMicrovms", 0.02, 1, surge=0)  # retryAfterSeconds up to 50
        fleet.emulator.client(access_key="someone-else").list_microvms(imageIdentifier=fleet.image)
        run = fleet.invoke(monkeypatch)
        assert fleet.emulator.throttled.get("ListMicrovms", 0) >= 1
        assert run.calls.get("ListMicrovms", 0) <= 2  # waited as told, never a burst of retries
        assert {e["code"] for e in run.events("api_error") if e["operation"] == "ListMicrovms"} == {
            "ThrottlingException"}
        assert run.calls.get("RunMicrovm", 0) == 0 and len(fleet.ours()) == 2


def _fleet_queries(reconciler: Any, table: str, fleet: str, action: Any = None) -> list[int]:
    """Counts the ledger's whole-fleet Queries (the slots' read) the reconciler sends; runs
    ``action()`` right after the first one's answer."""
    seen: list[int] = []

    def on_query(params: dict, **_: Any) -> None:
        if params.get("TableName") == table and "begins_with" not in params.get("KeyConditionExpression", "") \
                and params["ExpressionAttributeValues"][":fleet"]["S"] == fleet:
            seen.append(1)

    def after(**_: Any) -> None:
        if action is not None and len(seen) == 1 and not getattr(after, "done", False):
            after.done = True  # type: ignore[attr-defined]
            action()

    reconciler.ledger._ddb.meta.events.register("provide-client-params.dynamodb.Query", on_query)
    reconciler.ledger._ddb.meta.events.register("after-call.dynamodb.Query", after)
    return seen


def test_a_tick_reads_the_fleets_slots_once(aws, monkeypatch) -> None:
    """The ledger read that sizes a tick's first demand is the one its first step plans on (a
    second Query before the first list read the same items: one DynamoDB call of about seven
    a tick). A tick with nothing to do reads the slots once; one that starts a VM once a step
    (each later step reads the server's answers, which come in the ledger)."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        assert len(fleet.ours()) == 3
        fleet.env.update(MIN_VMS="3")
        for expect_runs in (1, 0):
            reconciler = fleet.reconciler(monkeypatch)
            seen = _fleet_queries(reconciler, fleet.env["LEDGER_TABLE"], fleet.fleet)
            index._RECONCILER = reconciler
            done = fleet.invoke(monkeypatch, cold=False)
            assert done.calls.get("RunMicrovm", 0) == expect_runs
            assert len(seen) == (done.result["steps"] if expect_runs else 1), (expect_runs, len(seen), done.result)
            fleet.clock.advance(60)
        assert len(fleet.ours()) == 4


def test_a_takeover_after_the_first_read_stops_the_tick_before_it_acts(aws, monkeypatch) -> None:
    """The first step plans on the tick's first ledger read, taken right after the lease. A tick
    that takes the lease over just after that read (a newer invocation) leaves the first one's
    plan stale: its first fenced write (the run's slot, written before RunMicrovm) is refused,
    it says ``lease_lost`` and sends no RunMicrovm."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 1)
        fleet.env.update(MIN_VMS="2")
        reconciler = fleet.reconciler(monkeypatch)
        newer = DynamoDBLedger(fleet.ddb, fleet.env["LEDGER_TABLE"])
        taken: list[int] = []
        seen = _fleet_queries(reconciler, fleet.env["LEDGER_TABLE"], fleet.fleet, lambda: taken.append(
            newer.acquire_tick(fleet.fleet, "newer-tick", fleet.clock.now(), 120.0, tick_until=fleet.clock.now() + 50)))
        index._RECONCILER = reconciler
        raced = fleet.invoke(monkeypatch, cold=False)
        assert taken and taken[0] and seen
        assert raced.result.get("lease_lost") is True, raced.result
        assert "RunMicrovm" not in raced.calls
        assert len(fleet.ours()) == 1
