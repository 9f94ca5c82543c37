"""Pruning through the deployed entry point: ``pruner.handler`` with the example stack's synthesized
environment and properties, its own client (one attempt per call, the bundled model), the MicroVMs
emulator's image versions (as measured: a version delete leaves the image UPDATING 5.4 s, and a
change meanwhile is a ConflictException; at most 50 versions) and CloudFormation's response
endpoint over TLS. Assertions come from the emulator (versions, VMs, the request log) and what
CloudFormation received.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from lambdas.reconciler import pruner
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from .lifecycle_harness import pruner_world

SCHEDULE = {"source": "schedule", "image": "mi-agente"}


@pytest.fixture
def emulator() -> Iterator[MicrovmsEmulator]:
    with MicrovmsEmulator(clock=VirtualClock(), seed=5, pending_seconds=2) as emulator:
        yield emulator


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    pruner._CLIENT = None
    yield
    pruner._CLIENT = None


def image_with(emulator: MicrovmsEmulator, versions: int, name: str = "mi-agente") -> str:
    """An image with ``versions`` ACTIVE versions, 1.0 ... N.0, published one by one."""
    arn = emulator.create_image(name, memory_mib=2048)
    for _ in range(versions - 1):
        emulator.publish_version(name, fresh=False)
    return arn


def live_versions(emulator: MicrovmsEmulator, name: str = "mi-agente") -> list[str]:
    client = emulator.client()
    items = client.list_microvm_image_versions(imageIdentifier=emulator.image_arn(name))["items"]
    return [v["imageVersion"] for v in items if v["state"] not in ("DELETING", "DELETED")]


def requests(emulator: MicrovmsEmulator, operation: str) -> list[Any]:
    return [r for r in emulator.requests if r.operation == operation]


def vm_on(emulator: MicrovmsEmulator, version: str, token: str) -> str:
    return emulator.client().run_microvm(imageIdentifier=emulator.image_arn("mi-agente"), imageVersion=version,
                                         clientToken=token)["microvmId"]


def assert_one_at_a_time(emulator: MicrovmsEmulator) -> None:
    """No delete was sent while the image was still UPDATING from the one before (5.4 s), and
    none conflicted."""
    deletes = requests(emulator, "DeleteMicrovmImageVersion")
    ours = [r for r in deletes if r.error is None]
    assert all(b.time - a.time >= 5.4 for a, b in zip(ours, ours[1:])), [r.time for r in ours]
    assert not [r for r in deletes if r.error == "ConflictException"]


# --------------------------------------------------------------------------- the schedule


def test_versions_beyond_keep_are_deleted_oldest_first_one_at_a_time(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 12)
    world = pruner_world(emulator, emulator.clock, cfn, metrics=True)  # the fleet sends custom metrics
    assert world.env["KEEP_VERSIONS"] == "5" and world.env["RAYITO_METRICS"] == "on"
    report, answered, records = world.invoke(monkeypatch, SCHEDULE)
    assert answered is None  # a scheduled run answers nobody
    assert report["Outcome"] == "pruned" and report["Deleted"] == 7
    assert live_versions(emulator) == ["8.0", "9.0", "10.0", "11.0", "12.0"]
    order = [r for r in requests(emulator, "DeleteMicrovmImageVersion")]
    assert len(order) == 7
    assert report["DeletedVersions"] == "1.0,2.0,3.0,4.0,5.0,6.0,7.0"
    assert_one_at_a_time(emulator)
    # Made INACTIVE first (no VM can start from them), then deleted.
    assert len(requests(emulator, "UpdateMicrovmImageVersion")) == 7
    assert emulator.client().get_microvm_image(imageIdentifier=world.image_arn)["state"] == "UPDATED"
    (line,) = [r for r in records if "_aws" in r]
    assert (line["ImageVersionsDeleted"], line["ImageVersions"], line["image"]) == (7.0, 5.0, "mi-agente")


def test_a_version_with_a_live_vm_is_kept_and_a_lingering_terminated_one_is_not(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 9)
    client = emulator.client()
    running = vm_on(emulator, "2.0", "client-a")  # a client's session on an old version
    parked = vm_on(emulator, "3.0", "client-b")
    ended = vm_on(emulator, "4.0", "client-c")
    emulator.clock.advance(3)
    client.suspend_microvm(microvmIdentifier=parked)
    client.terminate_microvm(microvmIdentifier=ended)
    emulator.clock.advance(10)
    assert (emulator.state_of(running), emulator.state_of(parked), emulator.state_of(ended)) == (
        "RUNNING", "SUSPENDED", "TERMINATED")  # TERMINATED VMs stay listed for 20 minutes
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert live_versions(emulator) == ["2.0", "3.0", "5.0", "6.0", "7.0", "8.0", "9.0"]
    assert report["Held"] == "2.0:1,3.0:1" and report["DeletedVersions"] == "1.0,4.0"
    assert emulator.state_of(running) == "RUNNING" and emulator.state_of(parked) == "SUSPENDED"
    # The held versions were never made INACTIVE: the VMs on them can still be joined by more.
    statuses = {v["imageVersion"]: v["status"] for v in client.list_microvm_image_versions(
        imageIdentifier=world.image_arn)["items"]}
    assert statuses["2.0"] == statuses["3.0"] == "ACTIVE"
    # Once the VM ends, the next run deletes the version.
    client.terminate_microvm(microvmIdentifier=running)
    emulator.clock.advance(30)
    again, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert again["DeletedVersions"] == "2.0" and "2.0" not in live_versions(emulator)


def test_the_latest_active_version_is_kept_even_beyond_keep(emulator, cfn, monkeypatch) -> None:
    """The newest versions failed to build: the fleet runs (and new VMs start from) the latest
    ACTIVE one, older than the newest ``keep``: it is kept."""
    image_with(emulator, 8)
    image = emulator._images["mi-agente"]  # the service's side: versions 7.0 and 8.0 failed to build
    for name in ("7.0", "8.0"):
        image.versions[name].failed = True
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE, env={"KEEP_VERSIONS": "2"})
    assert report["LatestActive"] == "6.0"
    assert live_versions(emulator) == ["6.0", "7.0", "8.0"]
    assert "6.0:latest_active" in report["Skipped"]


def test_a_vm_started_just_before_the_version_went_inactive_keeps_it(emulator, cfn, monkeypatch) -> None:
    """The first list did not show a VM started a moment before (eventually consistent lists):
    the version is made INACTIVE, the list by version is asked again after the settle time, the VM
    is there, the version is kept and made ACTIVE again."""
    image_with(emulator, 7)
    world = pruner_world(emulator, emulator.clock, cfn)
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    client = pruner.client()
    late: list[str] = []

    def start_a_vm_unseen(parsed: Any, model: Any = None, **_: Any) -> None:
        if not late:  # after the first list of the image: a client starts a VM on 1.0 meanwhile
            late.append(vm_on(emulator, "1.0", "client-late"))

    client.meta.events.register("after-call.lambda-microvms.ListMicrovms", start_a_vm_unseen)
    monkeypatch.setattr(pruner, "client", lambda: client)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert late and emulator.state_of(late[0]) in ("PENDING", "RUNNING")
    assert report["Held"] == "1.0:1" and report["DeletedVersions"] == "2.0"
    versions = {v["imageVersion"]: v["status"] for v in emulator.client().list_microvm_image_versions(
        imageIdentifier=world.image_arn)["items"]}
    assert versions["1.0"] == "ACTIVE"


def test_a_conflict_waits_for_the_image_and_never_loops_hot(emulator, cfn, monkeypatch) -> None:
    """Someone else deletes a version (or a build starts) just before ours: ConflictException;
    the pruner waits until the image is idle, then goes on."""
    image_with(emulator, 9)
    world = pruner_world(emulator, emulator.clock, cfn)
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    client = pruner.client()
    other = emulator.client(access_key="someone-else")
    done: list[str] = []

    def someone_deletes_first(**_: Any) -> None:
        if not done:
            done.append("9.0")
            other.delete_microvm_image_version(imageIdentifier=world.image_arn, imageVersion="3.0")

    client.meta.events.register("before-call.lambda-microvms.DeleteMicrovmImageVersion", someone_deletes_first)
    monkeypatch.setattr(pruner, "client", lambda: client)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert live_versions(emulator) == ["5.0", "6.0", "7.0", "8.0", "9.0"]
    conflicts = [r for r in requests(emulator, "DeleteMicrovmImageVersion") if r.error == "ConflictException"]
    assert len(conflicts) == 1
    polls = requests(emulator, "GetMicrovmImage")
    assert len(polls) <= 4 * 5  # a few looks per delete, never a hot loop
    # 3.0 went by someone else's hand; deleting a deleting version again succeeds (idempotent).
    assert report["DeletedVersions"] in ("1.0,2.0,3.0,4.0", "1.0,2.0,4.0")


def test_a_build_under_way_is_waited_for_and_never_touched(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 8)
    built_at = emulator.clock.now() + 180
    emulator.publish_version("mi-agente", fresh=True, build_seconds=180)  # 9.0 IN_PROGRESS, image UPDATING
    world = pruner_world(emulator, emulator.clock, cfn)
    busy, _, _ = world.invoke(monkeypatch, SCHEDULE, timeout=60)
    assert busy["Outcome"] == "image_busy" and not requests(emulator, "DeleteMicrovmImageVersion")
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)  # a longer run waits the build out
    assert report["Outcome"] == "pruned" and live_versions(emulator) == ["5.0", "6.0", "7.0", "8.0", "9.0"]
    deletes = requests(emulator, "DeleteMicrovmImageVersion")
    assert deletes and all(r.time >= built_at for r in deletes)  # nothing while it built
    assert not [r for r in requests(emulator, "UpdateMicrovmImageVersion") if r.time < built_at]


def test_throttled_image_calls_wait_as_told(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 8)
    emulator.set_rate_limit("ListMicrovmImageVersions", 0.2, 1, surge=0)
    emulator.set_rate_limit("DeleteMicrovmImageVersion", 0.1, 1, surge=0)
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, _ = world.invoke(monkeypatch, SCHEDULE)
    assert report["Outcome"] == "pruned" and live_versions(emulator) == ["4.0", "5.0", "6.0", "7.0", "8.0"]
    assert emulator.throttled.get("DeleteMicrovmImageVersion", 0) >= 1


def test_service_errors_are_reported_not_raised(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 8)
    fault = emulator.inject("ListMicrovmImageVersions", "InternalServer", times=None)
    world = pruner_world(emulator, emulator.clock, cfn)
    report, _, records = world.invoke(monkeypatch, SCHEDULE)
    emulator.remove_fault(fault)
    assert report["Outcome"] == "error:InternalServerException" and len(live_versions(emulator)) == 8
    assert [r for r in records if r.get("event") == "image_pruned"][0]["Outcome"] == report["Outcome"]


# --------------------------------------------------------------------------- the deploy


def test_a_deploy_that_builds_makes_room_first_even_at_the_quota(emulator, cfn, monkeypatch) -> None:
    """50 versions (the quota): an update of the image would fail. The pruner runs first (the image
    depends on it), keeps ``keep - 1``, and answers only once the image is idle, so the build
    CloudFormation starts next is neither refused for the quota nor for a conflict."""
    image_with(emulator, 50)
    client = emulator.client()
    arn = emulator.image_arn("mi-agente")
    update = dict(baseImageArn="arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1", baseImageVersion="1",
                  buildRoleArn="arn:aws:iam::123456789012:role/build", codeArtifact={"uri": "s3://bucket-b/new.zip"})
    with pytest.raises(client.exceptions.ServiceQuotaExceededException):
        client.update_microvm_image(imageIdentifier=arn, **update)
    world = pruner_world(emulator, emulator.clock, cfn)
    assert "ImageDigest" in world.properties
    started = emulator.clock.now()
    _, answer, _ = world.invoke(monkeypatch, world.event("Update", old_digest="0" * 64), timeout=660)
    assert answer["Status"] == "SUCCESS" and answer["Data"]["Outcome"] == "pruned"
    assert answer["Data"]["Target"] == "4" and answer["Data"]["Deleted"] == "46"
    assert live_versions(emulator) == ["47.0", "48.0", "49.0", "50.0"]
    assert emulator.clock.now() - started <= 480 + 30  # the deploy budget
    assert_one_at_a_time(emulator)
    # CloudFormation's update of the image, right after the answer: no conflict, room for one.
    client.update_microvm_image(imageIdentifier=arn, **update)
    emulator.clock.advance(200)
    assert len(live_versions(emulator)) == 5


def test_a_deploy_that_does_not_build_keeps_keep(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 7)
    world = pruner_world(emulator, emulator.clock, cfn)
    _, answer, _ = world.invoke(monkeypatch, world.event("Update"))
    assert answer["Data"]["Target"] == "5" and live_versions(emulator) == ["3.0", "4.0", "5.0", "6.0", "7.0"]


def test_create_before_the_image_exists_and_delete_do_nothing(emulator, cfn, monkeypatch) -> None:
    world = pruner_world(emulator, emulator.clock, cfn)
    _, created, _ = world.invoke(monkeypatch, world.event("Create"))
    assert created["Status"] == "SUCCESS" and created["Data"]["Outcome"] == "no_image"
    image_with(emulator, 9)
    _, deleted, _ = world.invoke(monkeypatch, world.event("Delete"))
    assert deleted["Status"] == "SUCCESS" and deleted["Data"] == {"Outcome": "nothing"}
    assert len(live_versions(emulator)) == 9


def test_a_deploy_is_never_failed_by_pruning(emulator, cfn, monkeypatch) -> None:
    image_with(emulator, 9)
    emulator.inject("DeleteMicrovmImageVersion", "InternalServer", times=None)
    world = pruner_world(emulator, emulator.clock, cfn)
    _, answer, _ = world.invoke(monkeypatch, world.event("Update", old_digest="1" * 64))
    assert answer["Status"] == "SUCCESS" and answer["Data"]["Deleted"] == "0"
    assert "delete:InternalServerException" in answer["Data"]["Skipped"]


@pytest.mark.parametrize("forgery", ["stack", "token", "image"])
def test_forged_requests_delete_nothing(emulator, cfn, monkeypatch, forgery) -> None:
    image_with(emulator, 9)
    world = pruner_world(emulator, emulator.clock, cfn)
    event = world.event("Update", old_digest="2" * 64)
    env = None
    if forgery == "stack":
        event["StackId"] = event["StackId"].replace("MiAgente", "Otra")
    elif forgery == "token":
        event["ServiceToken"] = "arn:aws:lambda:us-east-1:123456789012:function:other"
    else:
        env = {"IMAGE_NAME": "otra"}
    _, answer, _ = world.invoke(monkeypatch, event, env=env)
    assert answer["Status"] == "FAILED" and answer["Reason"].startswith("refused")
    assert len(live_versions(emulator)) == 9


def test_with_metrics_off_the_report_is_a_plain_log_line(emulator, cfn, monkeypatch) -> None:
    """A fleet's metrics are off by default (docs/operations.md): the pruner makes no custom metric,
    its numbers stay in the log line."""
    image_with(emulator, 7)
    world = pruner_world(emulator, emulator.clock, cfn)
    assert world.env["RAYITO_METRICS"] == "off"
    report, _, records = world.invoke(monkeypatch, SCHEDULE)
    assert report["Deleted"] == 2
    assert not [r for r in records if "_aws" in r]
    (line,) = [r for r in records if "ImageVersionsDeleted" in r]
    assert (line["ImageVersionsDeleted"], line["ImageVersions"], line["image"]) == (2.0, 5.0, "mi-agente")
