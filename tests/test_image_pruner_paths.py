"""The image pruner when the service is not kind, through its deployed entry point
(``pruner.handler`` with the example stack's environment, its own client, the MicroVMs emulator,
tests/lifecycle_harness.py): more live VMs than a list page, a throttle asking longer than the run
has, a refused image read, a run with no time left, a version someone else made INACTIVE and a VM
on it listed late, a version someone else deleted just before ours. Assertions come from the
emulator (versions, their status, VMs, the request log) and the report the run returns and logs.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from lambdas.reconciler import pruner
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from .lifecycle_harness import pruner_world

SCHEDULE = {"source": "schedule", "image": "mi-agente"}
PRUNER_CALLER = "testing"  # the access key the pruner's client signs with (the world's environment)


@pytest.fixture
def emulator() -> Iterator[MicrovmsEmulator]:
    with MicrovmsEmulator(clock=VirtualClock(), seed=13, pending_seconds=2) as emulator:
        yield emulator


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    pruner._CLIENT = None
    yield
    pruner._CLIENT = None


def image_with(emulator: MicrovmsEmulator, versions: int) -> None:
    emulator.create_image("mi-agente", memory_mib=2048)
    for _ in range(versions - 1):
        emulator.publish_version("mi-agente", fresh=False)


def statuses(emulator: MicrovmsEmulator) -> dict[str, tuple[str, str]]:
    items = emulator.client(access_key="observer").list_microvm_image_versions(
        imageIdentifier=emulator.image_arn("mi-agente"))["items"]
    return {v["imageVersion"]: (v["state"], v["status"]) for v in items}


def live_versions(emulator: MicrovmsEmulator) -> list[str]:
    return sorted(k for k, (state, _) in statuses(emulator).items() if state not in ("DELETING", "DELETED"))


def pruner_calls(emulator: MicrovmsEmulator, operation: str) -> list[Any]:
    return [r for r in emulator.requests if r.operation == operation and r.caller == PRUNER_CALLER]


def test_a_version_held_by_more_vms_than_a_list_page_is_counted_whole(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 8)
    emulator.remove_rate_limit("RunMicrovm")
    client = emulator.client(access_key="client")
    sessions = [client.run_microvm(imageIdentifier=emulator.image_arn("mi-agente"), imageVersion="2.0",
                                   clientToken=f"session-{i}")["microvmId"] for i in range(55)]
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert report["Held"] == "2.0:55" and report["DeletedVersions"] == "1.0,3.0"
    assert len(pruner_calls(emulator, "ListMicrovms")) >= 2  # every page of the first list
    assert live_versions(emulator) == ["2.0", "4.0", "5.0", "6.0", "7.0", "8.0"]
    assert statuses(emulator)["2.0"][1] == "ACTIVE"  # a held version is never made INACTIVE
    assert {emulator.state_of(vm) for vm in sessions} <= {"PENDING", "RUNNING"}


def test_a_throttle_asking_longer_than_the_run_has_is_reported_without_waiting(emulator, cfn, monkeypatch) -> None:
    """ListMicrovmImageVersions throttled with a retryAfterSeconds past the run's time (another
    caller used the account's token): the run does not sleep past its deadline; it reports the
    throttle and deletes nothing."""
    image_with(emulator, 8)
    emulator.set_rate_limit("ListMicrovmImageVersions", 0.001, 1, surge=0)
    emulator.client(access_key="someone-else").list_microvm_image_versions(
        imageIdentifier=emulator.image_arn("mi-agente"))
    world = pruner_world(emulator, emulator.clock, cfn)
    started = emulator.clock.now()
    report, _, records = world.invoke(monkeypatch, SCHEDULE, timeout=120)
    assert emulator.clock.now() - started <= 120
    emulator.remove_rate_limit("ListMicrovmImageVersions")  # for the test's own reads below
    assert report["Outcome"] == "error:ThrottlingException" and report["Deleted"] == 0
    assert len(pruner_calls(emulator, "ListMicrovmImageVersions")) == 1  # not asked again in a loop
    assert not pruner_calls(emulator, "UpdateMicrovmImageVersion") and len(live_versions(emulator)) == 8
    (line,) = [r for r in records if r.get("event") == "image_pruned"]
    assert line["Outcome"] == "error:ThrottlingException"


def test_an_image_read_refused_is_reported_and_nothing_is_touched(emulator, cfn, monkeypatch) -> None:
    """GetMicrovmImage refused (a role edited by hand): an error outcome, not a crash, and the
    deploy goes on (CloudFormation gets SUCCESS with the reason)."""
    image_with(emulator, 8)
    emulator.inject("GetMicrovmImage", "AccessDenied", times=None, caller=PRUNER_CALLER)
    world = pruner_world(emulator, emulator.clock, cfn)
    result, answered, _ = world.invoke(monkeypatch, world.event("Update", old_digest="5" * 64))
    assert result is None and answered["Status"] == "SUCCESS"
    assert answered["Data"]["Outcome"] == "error:AccessDeniedException"
    assert not pruner_calls(emulator, "UpdateMicrovmImageVersion") and len(live_versions(emulator)) == 8


def test_a_run_with_no_time_left_changes_nothing(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 8)
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE, timeout=pruner.RESERVE_SECONDS)
    assert report["Outcome"] == "nothing_pruned"
    assert report["Skipped"] == "1.0:out_of_time,2.0:out_of_time,3.0:out_of_time"
    assert not pruner_calls(emulator, "UpdateMicrovmImageVersion")
    assert not pruner_calls(emulator, "DeleteMicrovmImageVersion")
    assert {status for _, status in statuses(emulator).values()} == {"ACTIVE"}


def test_a_version_made_inactive_by_someone_else_keeps_its_status_when_a_late_listed_vm_holds_it(
        emulator, cfn, monkeypatch) -> None:
    """1.0 was made INACTIVE by someone else; a VM started on it before is missing from the
    pruner's first list (eventually consistent) and found by the list by version: 1.0 is held and
    left INACTIVE (the pruner restores only the status it changed); 2.0 goes."""
    image_with(emulator, 7)
    vm = emulator.client(access_key="client").run_microvm(imageIdentifier=emulator.image_arn("mi-agente"),
                                                          imageVersion="1.0", clientToken="session-old")["microvmId"]
    emulator.client(access_key="client").update_microvm_image_version(
        imageIdentifier=emulator.image_arn("mi-agente"), imageVersion="1.0", status="INACTIVE")
    emulator.inject("ListMicrovms", "list_lag", seconds=3600, times=1, caller=PRUNER_CALLER)
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert report["Held"] == "1.0:1" and report["DeletedVersions"] == "2.0"
    assert statuses(emulator)["1.0"][1] == "INACTIVE"
    # One status change: 2.0 to INACTIVE. 1.0 was not the pruner's to set back ACTIVE.
    assert len(pruner_calls(emulator, "UpdateMicrovmImageVersion")) == 1
    assert emulator.state_of(vm) in ("PENDING", "RUNNING")


def test_a_version_someone_else_deleted_just_before_ours_counts_as_gone(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 7)
    world = pruner_world(emulator, emulator.clock, cfn)
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    client = pruner.client()
    other = emulator.client(access_key="someone-else")
    done: list[str] = []

    def someone_deletes_it_first(params: dict[str, Any], **_: Any) -> None:
        if not done and params.get("imageVersion") == "2.0":
            done.append("2.0")
            other.delete_microvm_image_version(imageIdentifier=world.image_arn, imageVersion="2.0")
            emulator.clock.advance(60)  # and it is gone by the time ours arrives

    client.meta.events.register("before-parameter-build.lambda-microvms.DeleteMicrovmImageVersion",
                                     someone_deletes_it_first)
    monkeypatch.setattr(pruner, "client", lambda: client)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert done
    # Deleting a version already DELETED is idempotent (the service model): no error, no retry.
    answered = [r.error for r in pruner_calls(emulator, "DeleteMicrovmImageVersion")]
    assert answered == [None, None]
    assert report["Outcome"] == "pruned" and report["DeletedVersions"] == "1.0,2.0"
    assert live_versions(emulator) == ["3.0", "4.0", "5.0", "6.0", "7.0"]
