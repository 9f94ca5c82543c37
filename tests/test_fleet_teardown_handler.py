"""Off means off, through the deployed entry point: ``teardown.handler`` with the example stack's
synthesized environment and properties, its own clients, CloudFormation's response endpoint over
TLS, moto (ledger, schedule, stack) and the MicroVMs emulator, next to the fleet's real reconciler
(``index.handler``, tests/reconciler/harness.py). Every assertion comes from the emulator (VMs and
their states, calls), moto (ledger items, the schedule) or what CloudFormation received.

Each way issue #13's teardown could go wrong is a test: a delete while a tick runs, a tick that started
before and writes after, VMs in every state, lost RunMicrovm answers, throttled terminates, a list
that misses a VM, a second delete, a delete of a failed create, rollbacks, moved and renamed
resources, forged requests.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import pytest

from lambdas.reconciler import core, index, teardown
from lambdas.reconciler.ledger import FencedOut
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from .lifecycle_harness import teardown_world
from .moto_server import untraced_requests
from .recipe_writer_helpers import CFN_HOST
from .reconciler.harness import deployed_fleet

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
ENDED = ("TERMINATING", "TERMINATED")


@pytest.fixture(autouse=True)
def fresh_environment() -> Iterator[None]:
    teardown._CLIENTS = None
    yield
    teardown._CLIENTS = None
    index._RECONCILER = None


def client_vm(fleet, token: str = "client-session-1") -> str:
    return fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken=token)["microvmId"]


def states(fleet, ids) -> dict[str, str]:
    return {vm: fleet.emulator.state_of(vm) for vm in ids}


def converged(fleet, monkeypatch, minutes: int = 2) -> list[str]:
    """The fleet as the reconciler keeps it; the ids of the VMs its ledger holds."""
    fleet.every_minute(monkeypatch, minutes)
    return sorted(vm["microvmId"] for vm in fleet.ours())


# --------------------------------------------------------------------------- the whole path


def test_deleting_the_fleet_ends_every_vm_it_holds_and_nothing_else(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "2", "MAX_VMS": "6"}) as fleet:
        world = teardown_world(fleet, cfn, aws, metrics=True)  # the fleet sends custom metrics
        created = world.invoke(monkeypatch, world.event("Create"))
        assert created.status == "SUCCESS" and created.data["Outcome"] == "armed"
        assert created.body["PhysicalResourceId"] == teardown.physical_id("mi-agente", fleet.env["LEDGER_TABLE"])
        ours = converged(fleet, monkeypatch)
        session = client_vm(fleet)
        assert Counter(fleet.emulator.state_of(vm) for vm in ours) == {"RUNNING": 2, "SUSPENDED": 2}
        fleet.clock.advance(5)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.status == "SUCCESS", deleted.body
        assert set(states(fleet, ours).values()) == {"TERMINATED"}
        assert fleet.emulator.state_of(session) in ("PENDING", "RUNNING")  # a client's VM is never touched
        data = deleted.data
        assert (data["Outcome"], data["VMs"], data["Ended"], data["NotEnded"]) == ("ended", "4", "4", "0")
        assert data["OtherVms"] == "1" and data["OtherVmIds"] == session
        assert data["ScheduleDisabled"] == "disabled" and world.schedule_state() == "DISABLED"
        assert "off" in world.tick_item()
        assert not fleet.ledger_slots()  # what ended is forgotten, and the epoch with it
        # Terminated through the service, not by anything else: one TerminateMicrovm per VM.
        terminated = {r.microvm_id for r in fleet.emulator.requests if r.operation == "TerminateMicrovm"}
        assert terminated == set(ours)
        # The reconciler is off: its next invocation calls nothing.
        before = dict(fleet.emulator.calls)
        tick = fleet.invoke(monkeypatch)
        assert tick.result == {"fleet": "mi-agente", "skipped": "fleet_off"}
        assert fleet.emulator.calls == before
        # Reported where it outlives the stack: the metrics, extracted from the log line.
        (emf,) = [r for r in deleted.records if "_aws" in r]
        assert (emf["TeardownVMsEnded"], emf["TeardownVMsNotEnded"], emf["TeardownOtherVMs"]) == (4.0, 0.0, 1.0)
        assert world.cfn.tunnels[-1] == f"{CFN_HOST}:443"


def test_vms_in_every_state_are_ended(aws, cfn, monkeypatch) -> None:
    """PENDING, RUNNING, SUSPENDING and SUSPENDED VMs of the fleet, at the moment of the delete."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "8"}, suspending_seconds=1) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        converged(fleet, monkeypatch)  # base RUNNING, parked SUSPENDED
        fleet.emulator.suspending_seconds = 600
        fleet.env.update(WARM_VMS="2")
        fleet.invoke(monkeypatch, timeout=30)  # a new parked slot: RUNNING at 12 s, then SUSPENDING
        fleet.env.update(MIN_VMS="2")
        fleet.invoke(monkeypatch, timeout=10)  # a new base VM: PENDING when the tick ends
        ours = sorted(vm["microvmId"] for vm in fleet.ours())
        assert set(states(fleet, ours).values()) == {"PENDING", "RUNNING", "SUSPENDING", "SUSPENDED"}
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Outcome"] == "ended" and deleted.data["Ended"] == str(len(ours))
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_delete_while_a_tick_runs_stops_the_tick_before_its_next_call(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        running = fleet.reconciler(monkeypatch)
        assert running.begin_tick(120, 50)  # a tick holds the lease when the delete comes
        world.invoke(monkeypatch, world.event("Delete"))
        assert set(states(fleet, ours).values()) == {"TERMINATED"}
        runs = fleet.emulator.calls.get("RunMicrovm", 0)
        fleet.clock.advance(5)
        with pytest.raises(FencedOut):
            running.step()  # it sees its slots' VMs ended and would replace them: its write is refused
        assert fleet.emulator.calls.get("RunMicrovm", 0) == runs
        assert not [vm for vm in fleet.ours()]


def test_a_tick_that_wrote_before_the_delete_and_calls_after_it_makes_no_vm_that_survives(aws, cfn, monkeypatch) -> None:
    """The tick wrote its slot (STARTING, the token's generation) before the teardown fenced the
    ledger; its RunMicrovm reaches the service only after the teardown. The teardown sends the
    token first: whichever call comes first makes the VM, the other gets the same one, and the
    teardown ends it."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        tick = fleet.reconciler(monkeypatch)
        assert tick.refresh() is None  # the fleet as its recipe says, as the handler takes it before a tick
        assert tick.begin_tick(120, 50)
        slots, stats = tick.ledger.load("mi-agente")
        slot = core.admit_run(tick.spec, core.Slot("base-0", core.BASE, queued_at=fleet.clock.now()),
                              core.Intent("run", "base-0", role=core.BASE), fleet.clock.now(), tick.run_requests)
        assert slot.request and slot.request.get("runHookPayload")  # the product's own request, pinned
        tick.ledger.write("mi-agente", tick.fence, puts=[slot])  # written before the call, as _run does
        token = core.client_token(stats["epoch"], "mi-agente", "base-0", slot.generation)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["InDoubtResolved"] == "1" and deleted.data["Ended"] == "1"
        late = tick.microvms.run_microvm(clientToken=token, **slot.request)  # the tick's call, arriving late
        made = [vm for vm in fleet.emulator.microvms() if vm["clientToken"] == token]
        assert [vm["microvmId"] for vm in made] == [late["microvmId"]]  # one VM for the token, not two
        assert fleet.emulator.state_of(late["microvmId"]) in ENDED
        slot.microvm_id = late["microvmId"]
        with pytest.raises(FencedOut):
            tick.ledger.write("mi-agente", tick.fence, puts=[slot])


@pytest.mark.parametrize("fault", ["lost_response", "InternalServer"])
def test_lost_run_answers_are_resolved_by_their_token(aws, cfn, monkeypatch, fault) -> None:
    """A slot whose RunMicrovm answer was lost (the VM exists) or whose call made nothing (500):
    the teardown asks the token again; no VM of the fleet's tokens is left live either way."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        armed = fleet.emulator.inject("RunMicrovm", fault, times=None)
        fleet.invoke(monkeypatch, timeout=10)  # every answer lost: the slots are in doubt
        fleet.emulator.remove_fault(armed)
        doubtful = [s for s in fleet.ledger_slots().values() if s["in_doubt_since"]]
        assert len(doubtful) == 2
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Outcome"] == "ended" and deleted.data["InDoubtResolved"] == "2"
        assert deleted.data["Ended"] == "2"
        assert not [vm for vm in fleet.emulator.microvms()
                    if (vm["clientToken"] or "").startswith("rz1-") and vm["state"] in LIVE]
        report = deleted.report()
        assert set(report["in_doubt"].values()) == {"token_returned_vm"}


def test_throttled_terminates_wait_and_every_vm_still_ends(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "6"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.set_rate_limit("TerminateMicrovm", 0.5, 1, surge=0)  # 429 at once above it
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert fleet.emulator.throttled.get("TerminateMicrovm", 0) >= 1
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}
        # Throttled calls were spaced by the service's retryAfterSeconds, not retried in a burst.
        sent = [r.time for r in fleet.emulator.requests if r.operation == "TerminateMicrovm"]
        assert len(sent) <= 2 * len(ours) + 2


def test_terminates_are_paced_under_the_quota(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "30", "WARM_VMS": "0", "MAX_VMS": "30"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch, 3)
        assert len(ours) == 30
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Ended"] == "30" and not fleet.emulator.throttled.get("TerminateMicrovm")
        sent = sorted(r.time for r in fleet.emulator.requests if r.operation == "TerminateMicrovm")
        # TERMINATE_RATE (5/s): never more than 5 in any second, half the quota of 10.
        assert max(sum(1 for t in sent if a <= t < a + 1) for a in sent) <= 5


def test_a_list_that_misses_a_vm_asks_get_microvm(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        for key, value in world.env.items():
            monkeypatch.setenv(key, value)
        teardown._CLIENTS = teardown.clients()  # the environment's clients, with a list that lags

        def hide(parsed, **_) -> None:
            parsed["items"] = [i for i in parsed.get("items", []) if i["microvmId"] != ours[0]]

        teardown._CLIENTS.microvms.meta.events.register("after-call.lambda-microvms.ListMicrovms", hide)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Outcome"] == "ended"
        assert deleted.calls.get("GetMicrovm", 0) >= 1
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_second_delete_finds_nothing_left_and_keeps_the_fleet_off(aws, cfn, monkeypatch) -> None:
    """CloudFormation sends the delete again (after a failure or a lost answer)."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        converged(fleet, monkeypatch)
        first = world.invoke(monkeypatch, world.event("Delete"))
        assert first.data["Ended"] == "3"
        second = world.invoke(monkeypatch, world.event("Delete"))
        assert second.status == "SUCCESS" and second.data["Outcome"] == "ended" and second.data["VMs"] == "0"
        assert second.calls.get("TerminateMicrovm", 0) == 0 and second.calls.get("RunMicrovm", 0) == 0
        assert fleet.invoke(monkeypatch).result["skipped"] == "fleet_off"


def test_a_delete_of_a_create_that_failed_touches_nothing(aws, cfn, monkeypatch) -> None:
    """A create refused (here: the ledger it must write does not exist) answers FAILED with a
    physical id no delete acts on: the rollback's delete leaves the fleet alone."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        ours = converged(fleet, monkeypatch)
        missing = {"LEDGER_TABLE": "no-such-table"}
        created = world.invoke(monkeypatch, world.event("Create", LedgerTable="no-such-table"), env=missing, cold=True)
        assert created.status == "FAILED" and "ResourceNotFoundException" in created.body["Reason"]
        physical = created.body["PhysicalResourceId"]
        assert physical.startswith("rayito-teardown-failed:")
        deleted = world.invoke(monkeypatch, world.event("Delete", physical=physical, LedgerTable="no-such-table"),
                               env=missing, cold=True)
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "skipped"
        assert set(states(fleet, ours).values()) <= set(LIVE)
        assert "off" not in world.tick_item() and world.schedule_state() == "ENABLED"


def test_retain_vms_on_delete_is_the_old_behaviour(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws, retain_vms_on_delete=True)
        assert world.properties["RetainVms"] == "true"
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "retained"
        assert set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        assert deleted.calls == {}


@pytest.mark.parametrize("mode", ["warn", "fail"])
def test_what_cannot_be_ended_is_reported_within_the_time_limit(aws, cfn, monkeypatch, mode) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws, teardown_failure=mode)
        assert world.properties["FailureMode"] == mode
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.inject("TerminateMicrovm", "InternalServer", times=None)
        started = fleet.clock.now()
        deleted = world.invoke(monkeypatch, world.event("Delete"), timeout=120)
        assert fleet.clock.now() - started <= 120  # answered within the function's time
        assert deleted.data["NotEnded"] == "2" and set(deleted.data["NotEndedIds"].split(",")) == set(ours)
        assert deleted.status == ("FAILED" if mode == "fail" else "SUCCESS")
        assert "not confirmed ended" in deleted.body["Reason"]
        # Metrics off (the default): the numbers are in the log line, and no custom metric is made.
        (line,) = [r for r in deleted.records if "TeardownVMsNotEnded" in r]
        assert line["TeardownVMsNotEnded"] == 2.0 and line["TeardownFailed"] == 1.0
        assert not [r for r in deleted.records if "_aws" in r]
        # Not forgotten: a second delete (the user's retry) tries them again.
        assert {s["microvm_id"] for s in fleet.ledger_slots().values()} == set(ours)
        assert "off" in world.tick_item()


# --------------------------------------------------------------------------- updates and rollbacks


def test_an_update_rollback_keeps_a_fleet_that_was_there_before(aws, cfn, monkeypatch) -> None:
    """The teardown resource is new in an update (a library upgrade) that fails and rolls back:
    its delete must not end the fleet, which stays."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        ours = converged(fleet, monkeypatch)
        world.age_schedule(7 * 86400)  # the fleet's schedule is a week old
        world.set_stack_status("UPDATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create"))
        assert world.claim_item()["fleet_new"] == {"BOOL": False}
        world.set_stack_status("UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "kept"
        assert set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        assert "off" not in world.tick_item() and world.schedule_state() == "ENABLED"
        assert "skipped" not in fleet.invoke(monkeypatch).result


def test_an_update_rollback_ends_a_fleet_the_update_added(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)  # its schedule was just made
        world.set_stack_status("UPDATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create"))
        assert world.claim_item()["fleet_new"] == {"BOOL": True}
        ours = converged(fleet, monkeypatch)
        world.set_stack_status("UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_fleet_moved_to_another_logical_id_is_not_torn_down_by_the_old_one(aws, cfn, monkeypatch) -> None:
    """The construct moved in the tree: a new resource (L2) is created and claims the fleet; the
    old one (L1) is deleted in the update's cleanup and leaves the fleet to L2. When the update
    rolls back instead, L2's delete hands the fleet back to L1."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        l1, l2 = world.logical_id, "MovedTeardownMiAgente0A1B2C3D"
        as_l2 = {"RESOURCES": f'{{"{l2}":"mi-agente"}}'}  # the new resource's own function
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        world.set_stack_status("UPDATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create", logical_id=l2), env=as_l2)
        assert world.claim_item()["owner"] == {"S": l2} and world.claim_item()["previous"] == {"S": l1}
        # 1. Rolled back: L2 goes, L1 holds the fleet again, nothing ended.
        world.set_stack_status("UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
        back = world.invoke(monkeypatch, world.event("Delete", logical_id=l2), env=as_l2)
        assert back.data["Outcome"] == "handed_back" and world.claim_item()["owner"] == {"S": l1}
        assert set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        # 2. Done again and completed: L1 is deleted in the cleanup and leaves the fleet to L2.
        world.set_stack_status("UPDATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create", logical_id=l2), env=as_l2)
        world.set_stack_status("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
        old = world.invoke(monkeypatch, world.event("Delete"))
        assert old.data["Outcome"] == "handed_over" and "previous" not in world.claim_item()
        assert set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        assert "skipped" not in fleet.invoke(monkeypatch).result
        # 3. The stack is deleted: L2 ends the fleet.
        world.set_stack_status("DELETE_IN_PROGRESS")
        gone = world.invoke(monkeypatch, world.event("Delete", logical_id=l2), env=as_l2)
        assert gone.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_fleet_deleted_and_added_again_comes_back_with_new_tokens(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        first = converged(fleet, monkeypatch)
        tokens = {vm["clientToken"] for vm in fleet.emulator.microvms() if vm["microvmId"] in first}
        world.invoke(monkeypatch, world.event("Delete"))
        assert fleet.invoke(monkeypatch).result["skipped"] == "fleet_off"
        world.invoke(monkeypatch, world.event("Create"))  # the fleet is added to the stack again
        assert "off" not in world.tick_item()
        again = converged(fleet, monkeypatch)
        assert len(again) == 1 and not set(again) & set(first)
        assert {vm["clientToken"] for vm in fleet.ours()}.isdisjoint(tokens)  # a new epoch


def test_a_schedule_that_now_ticks_another_fleet_is_left_enabled(aws, cfn, monkeypatch) -> None:
    """A fleet renamed in place: the reconciler (and its schedule) now serve the new name; the old
    name's teardown ends the old fleet's VMs and leaves the schedule alone."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        from .moto_server import client as aws_client

        scheduler = aws_client("scheduler", aws)
        schedule = scheduler.get_schedule(Name=world.schedule_name)
        target = {**schedule["Target"], "Input": '{"source": "schedule", "fleet": "el-nuevo"}'}
        scheduler.update_schedule(Name=world.schedule_name, ScheduleExpression=schedule["ScheduleExpression"],
                                  FlexibleTimeWindow=schedule["FlexibleTimeWindow"], Target=target, State="ENABLED")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["ScheduleDisabled"] == "not_ours" and world.schedule_state() == "ENABLED"
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_two_fleets_on_one_image_each_end_only_their_own(aws, cfn, monkeypatch) -> None:
    clock = VirtualClock()
    with MicrovmsEmulator(clock=clock, seed=3, pending_seconds=5) as emulator:
        untraced_requests(emulator)  # coverage skips its request threads (tests/moto_server.py)
        emulator.create_image("compartida", memory_mib=2048, hooks=True)  # the product's image: its run hook takes the payload
        image = emulator.image_arn("compartida")
        base = {"IMAGE_ARN": image, "MAX_VMS": "2", "WARM_VMS": "0", "MIN_VMS": "2"}
        with deployed_fleet(aws, emulator=emulator, env={**base, "SHARED_WITH": '["dos"]'}) as uno:
            env = {**base, "SHARED_WITH": '["mi-agente"]', "FLEET_NAME": "dos", "LEDGER_TABLE": uno.env["LEDGER_TABLE"],
                   "BUDGET_TABLE": uno.env["BUDGET_TABLE"],
                   "ACCESS_TOKEN_SECRET": "rayito/agents/dos/access-token"}  # its own stack's token
            with deployed_fleet(aws, emulator=emulator, fleet="dos", env=env) as dos:
                for _ in range(2):
                    uno.invoke(monkeypatch)
                    dos.invoke(monkeypatch)
                    clock.advance(60)
                theirs = {s["microvm_id"] for s in dos.ledger_slots().values()}
                mine = {s["microvm_id"] for s in uno.ledger_slots().values()}
                assert len(theirs) == 2 and len(mine) == 2
                world = teardown_world(uno, cfn, aws)
                world.invoke(monkeypatch, world.event("Create"))
                deleted = world.invoke(monkeypatch, world.event("Delete"))
                assert deleted.data["Ended"] == "2" and deleted.data["OtherVms"] == "2"
                assert set(states(uno, mine).values()) == {"TERMINATED"}
                assert set(states(uno, theirs).values()) <= {"PENDING", "RUNNING"}
                assert "skipped" not in dos.invoke(monkeypatch).result  # the other fleet ticks on


# --------------------------------------------------------------------------- who may ask


@pytest.mark.parametrize("forgery", ["stack", "resource", "token", "url", "fleet"])
def test_forged_requests_end_nothing(aws, cfn, monkeypatch, forgery) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        event = world.event("Delete")
        if forgery == "stack":
            event["StackId"] = event["StackId"].replace("MiAgente", "Otra")
        elif forgery == "resource":
            event["LogicalResourceId"] = "SomethingElse"
        elif forgery == "token":
            event["ServiceToken"] = event["ResourceProperties"]["ServiceToken"] = "arn:aws:lambda:us-east-1:123456789012:function:other"
        elif forgery == "url":
            event["ResponseURL"] = "https://attacker.example/answer"
        received = len(cfn.received)
        answer = world.invoke(monkeypatch, event, env={"RESOURCES": '{"%s":"otra"}' % world.logical_id}
                              if forgery == "fleet" else None)
        if forgery == "url":
            assert len(cfn.received) == received  # never answered elsewhere, nothing done
        else:
            assert answer.status == "FAILED" and answer.body["Reason"].startswith("refused")
        assert answer.calls == {}
        assert set(states(fleet, ours).values()) == {"RUNNING"} and "off" not in world.tick_item()


# --------------------------------------------------------------------------- a fleet removed from its stack, updates


def test_a_fleet_removed_from_its_stack_by_an_update_ends_its_vms(aws, cfn, monkeypatch) -> None:
    """Not the whole stack: an update drops the fleet (``AgentFleet`` removed from the app), and
    CloudFormation deletes its resources in the update's cleanup. The stack stays; the fleet ends."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.age_schedule(7 * 86400)  # a fleet deployed a week ago, not new in this update
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        assert Counter(fleet.emulator.state_of(vm) for vm in ours) == {"RUNNING": 1, "SUSPENDED": 2}
        world.set_stack_status("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "ended"
        assert deleted.data["Ended"] == "3"
        assert set(states(fleet, ours).values()) == {"TERMINATED"}  # the parked ones too
        assert world.schedule_state() == "DISABLED"
        assert fleet.invoke(monkeypatch).result["skipped"] == "fleet_off"


def test_a_first_deploy_rolled_back_ends_the_vms_it_started(aws, cfn, monkeypatch) -> None:
    """The stack's create fails after the fleet started VMs (another resource failed): CloudFormation
    rolls the create back (ROLLBACK_IN_PROGRESS), and nothing of the fleet stays."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.set_stack_status("CREATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        world.set_stack_status("ROLLBACK_IN_PROGRESS")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["Outcome"] == "ended" and deleted.data["Ended"] == "3"
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_an_update_ends_nothing_and_the_latest_retain_setting_is_what_a_delete_follows(aws, cfn, monkeypatch) -> None:
    """UPDATE events (a changed option) only claim the fleet; the Delete carries the resource's
    properties as last deployed: turning retain_vms_on_delete on, then off again, is followed."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        for retain, failure in (("true", "warn"), ("false", "fail")):
            updated = world.invoke(monkeypatch, world.event("Update", RetainVms=retain, FailureMode=failure))
            assert updated.status == "SUCCESS" and updated.data["Outcome"] == "armed"
            assert updated.calls == {} and set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
            assert "skipped" not in fleet.invoke(monkeypatch).result
        kept = world.invoke(monkeypatch, world.event("Delete", RetainVms="true"))
        assert kept.data["Outcome"] == "retained" and set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        ended = world.invoke(monkeypatch, world.event("Delete", RetainVms="false", FailureMode="fail"))
        assert ended.status == "SUCCESS" and ended.data["Outcome"] == "ended"
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_rollback_whose_stack_status_is_throttled_still_keeps_the_fleet(aws, cfn, monkeypatch) -> None:
    """DescribeStacks throttled (past the client's own retries) while an update rolls back: read
    as a plain delete, it would end a fleet that stays. The teardown asks again, paced."""
    from botocore.exceptions import ClientError

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        ours = converged(fleet, monkeypatch)
        world.age_schedule(7 * 86400)
        world.set_stack_status("UPDATE_IN_PROGRESS")
        world.invoke(monkeypatch, world.event("Create"))
        world.set_stack_status("UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
        refused: list[float] = []

        def throttle(**_) -> None:
            if len(refused) < 3:
                refused.append(fleet.clock.now())
                raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeStacks")

        teardown._CLIENTS.cloudformation.meta.events.register("before-call.cloudformation.DescribeStacks", throttle)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert len(refused) == 3 and refused[-1] - refused[0] >= 6  # paced (2 s, then 4 s), not a burst
        assert deleted.data["Outcome"] == "kept"
        assert set(states(fleet, ours).values()) == {"RUNNING", "SUSPENDED"}
        assert world.schedule_state() == "ENABLED" and "off" not in world.tick_item()
        assert [r for r in deleted.records if r.get("event") == "stack_status_unknown"]


def test_a_terminate_whose_answer_is_lost_is_confirmed_not_sent_blindly_again(aws, cfn, monkeypatch) -> None:
    """TerminateMicrovm carried out, its answer lost (500): the teardown confirms the VM ended."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.inject("TerminateMicrovm", "lost_response", times=2)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "ended", deleted.body
        assert deleted.data["Ended"] == "3" and set(states(fleet, ours).values()) == {"TERMINATED"}
        assert not fleet.ledger_slots()
