"""The fleet teardown when the world around it misbehaves, through its deployed entry point
(``teardown.handler``, the example stack's environment and properties, its own clients; moto,
the MicroVMs emulator and CloudFormation's response endpoint: tests/lifecycle_harness.py).

Each test is a situation a real delete meets: the MicroVMs endpoint or the scheduler unreachable,
a VM that ended so long ago the service no longer knows it, a re-asked lost run that is throttled
or whose token now names a VM with other parameters, a 429 asking for longer than the function
has left, an image with more VMs than one list page, a stack whose status cannot be read, a
ledger that is gone, a delete of a resource that no longer serves this ledger or no longer holds
the fleet. What is asserted comes from the emulator (VMs, requests), moto (the ledger, the
schedule) and what CloudFormation received, within the function's time on the virtual clock.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError

from lambdas.reconciler import index, teardown
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from .lifecycle_harness import aws_client, teardown_world
from .moto_server import untraced_requests
from .reconciler.harness import deployed_fleet
from .contract_support import refusing_port

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")


@pytest.fixture(autouse=True)
def fresh_environment() -> Iterator[None]:
    teardown._CLIENTS = None
    yield
    teardown._CLIENTS = None
    index._RECONCILER = None


def states(fleet, ids) -> dict[str, str]:
    return {vm: fleet.emulator.state_of(vm) for vm in ids}


def converged(fleet, monkeypatch, minutes: int = 2) -> list[str]:
    fleet.every_minute(monkeypatch, minutes)
    return sorted(vm["microvmId"] for vm in fleet.ours())


def in_doubt(fleet, monkeypatch, fault: str = "lost_response") -> int:
    """One tick whose every RunMicrovm answer is lost: its slots are in doubt."""
    armed = fleet.emulator.inject("RunMicrovm", fault, times=None)
    fleet.invoke(monkeypatch, timeout=10)
    fleet.emulator.remove_fault(armed)
    return len([s for s in fleet.ledger_slots().values() if s["in_doubt_since"]])


# --------------------------------------------------------------------------- the MicroVMs service


def test_an_unreachable_microvms_endpoint_is_reported_and_nothing_is_forgotten(aws, cfn, monkeypatch) -> None:
    """Every terminate, list and get fails to connect (a VPC endpoint removed first, a proxy
    down): the fleet is off, nothing is taken as ended, the answer comes within the function's
    time and the ledger keeps every VM for the next delete."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        before = dict(fleet.emulator.calls)
        started = fleet.clock.now()
        with refusing_port() as closed:
            deleted = world.invoke(monkeypatch, world.event("Delete"), timeout=60, cold=True,
                                   env={"AWS_ENDPOINT_URL_LAMBDA_MICROVMS": closed})
        assert fleet.clock.now() - started <= 60
        assert fleet.emulator.calls == before  # nothing reached the service
        assert deleted.status == "SUCCESS"  # teardown_failure="warn"
        data = deleted.data
        assert (data["Outcome"], data["NotEnded"], data["Ended"]) == ("not_all_ended", "2", "0")
        assert set(data["NotEndedIds"].split(",")) == set(ours)
        report = deleted.report()
        assert set(report["errors"].values()) == {"EndpointConnectionError"}
        assert report["calls"]["TerminateMicrovm"] >= 2 and report["calls"]["ListMicrovms"] >= 1
        assert report["calls"].get("GetMicrovm", 0) >= 1  # the list failed: each VM asked on its own
        assert set(states(fleet, ours).values()) == {"RUNNING"}
        assert {s["microvm_id"] for s in fleet.ledger_slots().values()} == set(ours)
        assert "off" in world.tick_item() and world.schedule_state() == "DISABLED"
        # Reachable again: the user's retry ends them.
        again = world.invoke(monkeypatch, world.event("Delete"), cold=True)
        assert again.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


def test_lost_runs_that_cannot_be_asked_again_stay_unresolved(aws, cfn, monkeypatch) -> None:
    """Slots whose RunMicrovm answer was lost, and a service that cannot be reached to ask their
    token again: whether a VM exists is unknown, so they are reported unresolved (never "no VM")
    and stay in the ledger; the delete answers within the function's time."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        assert in_doubt(fleet, monkeypatch) == 2
        made = [vm["microvmId"] for vm in fleet.ours()]
        assert len(made) == 2  # the lost calls made VMs
        started = fleet.clock.now()
        with refusing_port() as closed:
            deleted = world.invoke(monkeypatch, world.event("Delete", FailureMode="fail"), timeout=60, cold=True,
                                   env={"AWS_ENDPOINT_URL_LAMBDA_MICROVMS": closed})
        assert fleet.clock.now() - started <= 60
        assert deleted.status == "FAILED" and "lost run(s) unresolved" in deleted.body["Reason"]
        assert deleted.data["Unresolved"] == "2" and deleted.data["InDoubtResolved"] == "0"
        assert set(deleted.report()["unresolved"].values()) == {"EndpointConnectionError"}
        assert set(states(fleet, made).values()) <= set(LIVE)
        assert len([s for s in fleet.ledger_slots().values() if s["in_doubt_since"]]) == 2
        (line,) = [r for r in deleted.records if "TeardownVMsNotEnded" in r]
        assert line["TeardownVMsNotEnded"] == 2.0 and line["TeardownFailed"] == 1.0


def test_a_lost_run_the_service_keeps_refusing_does_not_keep_the_known_vms_alive(aws, cfn, monkeypatch) -> None:
    """RunMicrovm answers 500 through an outage (the very time answers get lost): a slot in doubt
    cannot be resolved. Found: its re-asks used the function's whole time and the fleet's
    RUNNING VMs were never terminated. The VMs the ledger names are ended first; each lost run
    gets a share of the time, and is reported unresolved."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.env.update(MIN_VMS="3")
        assert in_doubt(fleet, monkeypatch) == 1
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=None)
        started = fleet.clock.now()
        deleted = world.invoke(monkeypatch, world.event("Delete"), timeout=120)
        assert fleet.clock.now() - started <= 120
        assert set(states(fleet, ours).values()) == {"TERMINATED"}
        assert deleted.data["Outcome"] == "not_all_ended" and deleted.data["Ended"] == "2"
        assert deleted.report()["unresolved"] == {"base-2": "InternalServerException"}
        reasks = [r.time for r in fleet.emulator.requests if r.operation == "RunMicrovm" and r.time >= started]
        assert len(reasks) >= 2 and reasks[-1] - reasks[0] <= (120 - teardown.RESERVE_SECONDS) / 2 + 1


def test_a_throttled_re_ask_of_a_lost_run_waits_and_ends_its_vm(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        assert in_doubt(fleet, monkeypatch) == 3
        fleet.emulator.set_rate_limit("RunMicrovm", 0.25, 1, surge=0)  # 429 at once above it
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert fleet.emulator.throttled.get("RunMicrovm", 0) >= 1
        assert deleted.data["Outcome"] == "ended" and deleted.data["InDoubtResolved"] == "3"
        assert set(deleted.report()["in_doubt"].values()) == {"token_returned_vm"}
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm" and r.status == 429]
        ok = sorted(r.time for r in fleet.emulator.requests if r.operation == "RunMicrovm" and r.status == 200)
        assert runs and len(ok) >= 3
        assert not [vm for vm in fleet.emulator.microvms()
                    if (vm["clientToken"] or "").startswith("rz1-") and vm["state"] in LIVE]


def test_a_token_that_names_a_vm_made_with_other_parameters_is_ended(aws, cfn, monkeypatch) -> None:
    """The lost call's VM was made with other parameters than the ledger now pins (a ledger an
    earlier reconciler wrote): the service answers Conflict naming the VM; it is the slot's and ends."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        assert in_doubt(fleet, monkeypatch) == 1
        (made,) = [vm["microvmId"] for vm in fleet.ours()]
        ddb = world.ddb()
        ((key, doc),) = [(k, d) for k, d in fleet.ledger_slots().items() if d["in_doubt_since"]]
        doc["request"] = {**doc["request"], "maximumDurationInSeconds": int(doc["request"].get(
            "maximumDurationInSeconds") or 3600) - 60}
        ddb.put_item(TableName=fleet.env["LEDGER_TABLE"], Item={
            "fleet": {"S": fleet.fleet}, "key": {"S": f"slot#{key}"}, "doc": {"S": json.dumps(doc, sort_keys=True)}})
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        conflicts = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm" and r.status == 409]
        assert len(conflicts) == 1
        assert deleted.report()["in_doubt"] == {key: "token_named_vm"}
        assert deleted.data["Outcome"] == "ended" and fleet.emulator.state_of(made) == "TERMINATED"


def test_a_vm_that_ended_so_long_ago_the_service_forgot_it_is_taken_as_gone(aws, cfn, monkeypatch) -> None:
    """A slot's VM ended (here: a client ended it) while the reconciler did not tick, 25 minutes
    before the delete, longer than TERMINATED VMs stay listed: TerminateMicrovm answers
    ResourceNotFound, which for a VM that old means it is gone."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.client().terminate_microvm(microvmIdentifier=ours[0])
        fleet.clock.advance(10)
        assert fleet.emulator.state_of(ours[0]) == "TERMINATED"
        fleet.clock.advance(25 * 60)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        missing = [r for r in fleet.emulator.requests
                   if r.operation == "TerminateMicrovm" and r.error == "ResourceNotFoundException"]
        assert [r.microvm_id for r in missing] == [ours[0]]
        assert deleted.data["Outcome"] == "ended" and deleted.data["Ended"] == "2"
        assert fleet.emulator.state_of(ours[1]) == "TERMINATED"
        assert not fleet.ledger_slots()


def test_a_long_retry_after_never_holds_the_answer_past_the_functions_time(aws, cfn, monkeypatch) -> None:
    """TerminateMicrovm throttled with a retryAfterSeconds longer than the time the function has
    left: the teardown must answer CloudFormation before Lambda ends it (a function killed at its
    timeout never answers, and the stack waits an hour), reporting what it could not end."""
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.set_rate_limit("TerminateMicrovm", 0.005, 1, surge=0)  # retryAfterSeconds ~200
        started = fleet.clock.now()
        deleted = world.invoke(monkeypatch, world.event("Delete"), timeout=60)
        assert fleet.clock.now() - started <= 60, "answered after the function's timeout"
        assert deleted.status == "SUCCESS" and deleted.data["Outcome"] == "not_all_ended"
        assert deleted.data["Ended"] == "1" and deleted.data["NotEnded"] == "2"
        assert list(states(fleet, ours).values()).count("RUNNING") == 2  # one terminate got through
        assert set(deleted.report()["errors"].values()) == {"ThrottlingException"}


# --------------------------------------------------------------------------- lists


def test_other_vms_of_the_image_are_counted_across_list_pages(aws, cfn, monkeypatch) -> None:
    """More live VMs on the image than one ListMicrovms page (50): every page is read, the
    fleet's own are ended, the others counted whole and named up to MAX_IDS."""
    clock = VirtualClock()
    with MicrovmsEmulator(clock=clock, seed=11, pending_seconds=5) as emulator:
        untraced_requests(emulator)  # coverage skips its request threads (tests/moto_server.py)
        emulator.create_image("mi-agente", memory_mib=2048, hooks=True)  # the product's image: its run hook takes the payload
        emulator.remove_rate_limit("RunMicrovm")
        client = emulator.client()
        others = sorted(client.run_microvm(imageIdentifier=emulator.image_arn("mi-agente"),
                                           clientToken=f"client-{i}")["microvmId"] for i in range(55))
        with deployed_fleet(aws, emulator=emulator, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
            world = teardown_world(fleet, cfn, aws)
            world.invoke(monkeypatch, world.event("Create"))
            ours = converged(fleet, monkeypatch)
            deleted = world.invoke(monkeypatch, world.event("Delete"))
            assert deleted.data["Outcome"] == "ended" and deleted.data["Ended"] == "2"
            assert deleted.data["OtherVms"] == "55"
            assert deleted.data["OtherVmIds"].split(",") == others[:teardown.MAX_IDS]
            pages = [r for r in emulator.requests if r.operation == "ListMicrovms" and r.caller == "testing"
                     and r.time >= deleted_time(emulator)]
            assert len(pages) >= 2
            assert set(states(fleet, ours).values()) == {"TERMINATED"}
            assert set(states(fleet, others).values()) <= set(LIVE)


def deleted_time(emulator) -> float:
    """When the teardown's first TerminateMicrovm reached the service."""
    return min(r.time for r in emulator.requests if r.operation == "TerminateMicrovm")


def test_throttled_lists_fall_back_to_asking_each_vm(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.set_rate_limit("ListMicrovms", 0.05, 1, surge=0)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert fleet.emulator.throttled.get("ListMicrovms", 0) >= 1
        assert deleted.calls.get("GetMicrovm", 0) >= 1
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


# --------------------------------------------------------------------------- the schedule and the stack


def test_without_a_schedule_name_nothing_is_disabled_and_the_vms_end(aws, cfn, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        no_schedule = {"SCHEDULE_NAME": ""}
        world.invoke(monkeypatch, world.event("Create"), env=no_schedule)
        assert world.claim_item()["fleet_new"] == {"BOOL": False}  # unknown counts as not new
        ours = converged(fleet, monkeypatch)
        deleted = world.invoke(monkeypatch, world.event("Delete"), env=no_schedule)
        assert deleted.data["ScheduleDisabled"] == "none" and world.schedule_state() == "ENABLED"
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


def test_an_unreachable_scheduler_does_not_keep_the_vms_alive(aws, cfn, monkeypatch) -> None:
    """The scheduler's endpoint refuses connections: the create cannot tell whether the fleet is
    new (not new, so a rollback keeps it), the delete reports the schedule's error; the ledger's
    off flag still stops every tick and the VMs end."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        with refusing_port() as closed:
            unreachable = {"AWS_ENDPOINT_URL_SCHEDULER": closed}
            world.invoke(monkeypatch, world.event("Create"), env=unreachable, cold=True)
            assert world.claim_item()["fleet_new"] == {"BOOL": False}
            ours = converged(fleet, monkeypatch)
            deleted = world.invoke(monkeypatch, world.event("Delete"), env=unreachable)
        assert deleted.data["ScheduleDisabled"] == "error:EndpointConnectionError"
        assert world.schedule_state() == "ENABLED"
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}
        assert fleet.invoke(monkeypatch).result["skipped"] == "fleet_off"


@pytest.mark.parametrize("refusal, reported", [
    (ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "UpdateSchedule"),
     "error:AccessDeniedException"),
    (ConnectTimeoutError(endpoint_url="https://scheduler.us-east-1.amazonaws.com"), "error:ConnectTimeoutError"),
])
def test_a_schedule_that_cannot_be_disabled_is_reported_and_the_vms_still_end(aws, cfn, monkeypatch, refusal,
                                                                               reported) -> None:
    """UpdateSchedule refused (a role edited by hand) or timing out on the handler's own client."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)

        def refuse(**_) -> None:
            raise refusal

        teardown._CLIENTS.scheduler.meta.events.register("before-call.scheduler.UpdateSchedule", refuse)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["ScheduleDisabled"] == reported and world.schedule_state() == "ENABLED"
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}
        assert fleet.invoke(monkeypatch).result["skipped"] == "fleet_off"


def test_a_schedule_whose_input_is_not_json_is_still_disabled(aws, cfn, monkeypatch) -> None:
    """A schedule edited by hand to a plain-text input: it names no other fleet, so it is ours."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        scheduler = aws_client("scheduler", aws)
        schedule = scheduler.get_schedule(Name=world.schedule_name)
        scheduler.update_schedule(Name=world.schedule_name, ScheduleExpression=schedule["ScheduleExpression"],
                                  FlexibleTimeWindow=schedule["FlexibleTimeWindow"],
                                  Target={**schedule["Target"], "Input": "tick please"}, State="ENABLED")
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert deleted.data["ScheduleDisabled"] == "disabled" and world.schedule_state() == "DISABLED"
        assert set(states(fleet, ours).values()) == {"TERMINATED"}


def test_a_stack_status_that_cannot_be_read_at_all_still_ends_the_fleet(aws, cfn, monkeypatch) -> None:
    """DescribeStacks throttled on every attempt: paced retries, then off means off (the report
    says the status was unknown)."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        refused: list[float] = []

        def throttle(**_) -> None:
            refused.append(fleet.clock.now())
            raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeStacks")

        teardown._CLIENTS.cloudformation.meta.events.register("before-call.cloudformation.DescribeStacks", throttle)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert len(refused) == len(teardown.STATUS_RETRY_SECONDS) + 1
        assert refused[-1] - refused[0] == pytest.approx(sum(teardown.STATUS_RETRY_SECONDS))
        assert deleted.report()["stack_status"] == "unknown:Throttling"
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}


# --------------------------------------------------------------------------- which resource, which ledger


def test_a_delete_for_a_ledger_this_function_no_longer_serves_touches_nothing(aws, cfn, monkeypatch) -> None:
    """The ledger table was replaced (a new physical id): CloudFormation deletes the old resource,
    whose function now serves the new table. Nothing of the fleet is touched; the answer says the
    old ledger's VMs were not ended (FAILED with teardown_failure='fail')."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        old = world.event("Delete", LedgerTable="the-old-ledger", FailureMode="fail",
                          physical=teardown.physical_id(fleet.fleet, "the-old-ledger"))
        answer = world.invoke(monkeypatch, old)
        assert answer.status == "FAILED" and answer.data["Outcome"] == "not_reachable"
        assert "were not ended" in answer.body["Reason"]
        assert answer.calls == {} and set(states(fleet, ours).values()) == {"RUNNING"}
        assert "off" not in world.tick_item() and world.schedule_state() == "ENABLED"


def test_a_resource_two_moves_behind_leaves_the_claim_as_it_is(aws, cfn, monkeypatch) -> None:
    """L1 → L2 → L3 (the construct moved twice before the cleanups ran): L1's delete finds the
    fleet held by L3 with L2 before it, changes nothing and ends nothing."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        l1, l2, l3 = world.logical_id, "MovedOnce0A1B2C3D", "MovedTwice0A1B2C3D"
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        for logical in (l2, l3):
            world.invoke(monkeypatch, world.event("Create", logical_id=logical), env={"RESOURCES": f'{{"{logical}":"mi-agente"}}'})
        claim = world.claim_item()
        assert (claim["owner"], claim["previous"]) == ({"S": l3}, {"S": l2})
        answer = world.invoke(monkeypatch, world.event("Delete", logical_id=l1), env={"RESOURCES": f'{{"{l1}":"mi-agente"}}'})
        assert answer.data["Outcome"] == "handed_over" and world.claim_item() == claim
        assert answer.calls == {} and set(states(fleet, ours).values()) == {"RUNNING"}


@pytest.mark.parametrize("mode", ["warn", "fail"])
def test_a_ledger_that_is_gone_fails_the_delete_only_when_asked(aws, cfn, monkeypatch, mode) -> None:
    """The ledger table was deleted by hand before the stack: the teardown cannot read what the
    fleet holds; it says so (error outcome, TeardownFailed) and fails the delete only with
    teardown_failure='fail'."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        world = teardown_world(fleet, cfn, aws)  # teardown_failure is its FailureMode property
        gone = "a-ledger-deleted-by-hand"
        event = world.event("Delete", LedgerTable=gone, FailureMode=mode, physical=teardown.physical_id(fleet.fleet, gone))
        answer = world.invoke(monkeypatch, event, env={"LEDGER_TABLE": gone})
        assert answer.data["Outcome"] == "error"
        assert answer.data["Reason"] == "teardown failed: ResourceNotFoundException"
        assert answer.status == ("FAILED" if mode == "fail" else "SUCCESS")
        assert answer.calls == {}
        (line,) = [r for r in answer.records if "TeardownFailed" in r]
        assert line["TeardownFailed"] == 1.0
        assert [r for r in answer.records if r.get("event") == "teardown_error"]


# --------------------------------------------------------------------------- time, and ledgers written by others


def test_refused_lists_and_throttled_gets_still_confirm_every_end(aws, cfn, monkeypatch) -> None:
    """ListMicrovms answers 500 to the teardown and GetMicrovm is throttled: each VM is confirmed
    ended by its own GetMicrovm, paced by the service's retryAfterSeconds."""
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        fleet.emulator.inject("ListMicrovms", "InternalServer", times=None)
        fleet.emulator.set_rate_limit("GetMicrovm", 0.5, 1, surge=0)
        deleted = world.invoke(monkeypatch, world.event("Delete"))
        assert fleet.emulator.throttled.get("GetMicrovm", 0) >= 1
        gets = [r for r in fleet.emulator.requests if r.operation == "GetMicrovm" and r.status == 200]
        assert {r.microvm_id for r in gets} == set(ours)
        assert deleted.data["Outcome"] == "ended" and set(states(fleet, ours).values()) == {"TERMINATED"}
        assert deleted.data["OtherVms"] == "0"  # no whole list was read: nothing claimed about others


def test_a_delete_with_no_time_left_answers_at_once_and_forgets_nothing(aws, cfn, monkeypatch) -> None:
    """Invoked with no more than the answer's reserve left: the fleet is turned off (the ledger,
    one write) and CloudFormation is answered; no MicroVMs call goes out after the deadline."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        ours = converged(fleet, monkeypatch)
        deleted = world.invoke(monkeypatch, world.event("Delete"), timeout=teardown.RESERVE_SECONDS)
        assert deleted.calls == {}
        assert deleted.data["Outcome"] == "not_all_ended" and deleted.data["NotEnded"] == "2"
        assert "off" in world.tick_item() and set(states(fleet, ours).values()) == {"RUNNING"}
        assert {s["microvm_id"] for s in fleet.ledger_slots().values()} == set(ours)


def test_ledger_items_the_reconciler_never_writes_are_reported_not_crashed_on(aws, cfn, monkeypatch) -> None:
    """A slot STARTING with no pinned request (a ledger an earlier version wrote: no call can
    have gone out) is resolved as never sent; a slot in doubt whose fleet's ``#stats`` item (its
    epoch, part of every token) was deleted by hand cannot be asked again and is unresolved."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        world = teardown_world(fleet, cfn, aws)
        world.invoke(monkeypatch, world.event("Create"))
        (vm,) = converged(fleet, monkeypatch)
        ddb, table = world.ddb(), fleet.env["LEDGER_TABLE"]

        def put_slot(doc: dict) -> None:
            ddb.put_item(TableName=table, Item={"fleet": {"S": fleet.fleet}, "key": {"S": f"slot#{doc['slot_id']}"},
                                                "doc": {"S": json.dumps(doc, sort_keys=True)}})

        put_slot({"slot_id": "base-7", "role": "base", "phase": "starting", "requested_at": fleet.clock.now()})
        first = world.invoke(monkeypatch, world.event("Delete"))
        assert first.report()["in_doubt"] == {"base-7": "never_sent"}
        assert first.data["Outcome"] == "ended" and fleet.emulator.state_of(vm) == "TERMINATED"
        assert first.calls.get("RunMicrovm", 0) == 0 and not fleet.ledger_slots()

        request = {"imageIdentifier": fleet.image}
        put_slot({"slot_id": "base-8", "role": "base", "phase": "starting", "requested_at": fleet.clock.now(),
                  "in_doubt_since": fleet.clock.now(), "request": request})
        second = world.invoke(monkeypatch, world.event("Delete"))
        assert second.report()["unresolved"] == {"base-8": "no_epoch"}
        assert second.data["Outcome"] == "not_all_ended" and second.calls.get("RunMicrovm", 0) == 0
        assert list(fleet.ledger_slots()) == ["base-8"]  # kept for a look by hand
