"""The MicroVMs emulator against real boto3 clients: every operation, error shape and lifecycle edge."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest
from botocore.awsrequest import prepare_request_dict
from botocore.serialize import create_serializer

from rayito_constructs.testing import MicrovmsEmulator, VirtualClock
from rayito_constructs.testing import _wire
from rayito_constructs.testing.microvms import IMPLEMENTED

from .emulator_helpers import assert_fits_model, microvms_client
from .moto_server import free_port

BASE = "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1"
ROLE = "arn:aws:iam::123456789012:role/agent"


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def emulator(clock) -> Iterator[MicrovmsEmulator]:
    with MicrovmsEmulator(clock=clock, seed=7, pending_seconds=12, suspending_seconds=1, terminating_seconds=3,
                          terminated_linger_seconds=600) as emu:
        yield emu


@pytest.fixture
def client(emulator) -> Any:
    return microvms_client(emulator.endpoint_url)


@pytest.fixture
def image(emulator) -> str:
    return emulator.create_image("mi-agente", memory_mib=2048)


def run(client, image, **kw) -> dict[str, Any]:
    response = client.run_microvm(imageIdentifier=image, **kw)
    assert_fits_model("RunMicrovm", response)
    return response


def state(client, vm_id) -> str:
    response = client.get_microvm(microvmIdentifier=vm_id)
    assert_fits_model("GetMicrovm", response)
    return response["state"]


# ------------------------------------------------------------------------------- the wire

SAMPLE_INPUTS = {
    "RunMicrovm": {"imageIdentifier": "arn:aws:lambda:us-east-1:1:microvm-image:x", "clientToken": "t"},
    "ListMicrovms": {"imageIdentifier": "x", "maxResults": 5, "nextToken": "n"},
    "GetMicrovm": {"microvmIdentifier": "microvm-1"},
    "SuspendMicrovm": {"microvmIdentifier": "microvm-1"},
    "ResumeMicrovm": {"microvmIdentifier": "microvm-1"},
    "TerminateMicrovm": {"microvmIdentifier": "microvm-1"},
    "CreateMicrovmAuthToken": {"microvmIdentifier": "microvm-1", "expirationInMinutes": 5, "allowedPorts": [{"port": 8080}]},
    "CreateMicrovmImage": {"name": "x", "baseImageArn": BASE, "buildRoleArn": ROLE, "codeArtifact": {"uri": "s3://b/k"}},
    "GetMicrovmImage": {"imageIdentifier": "arn:aws:lambda:us-east-1:1:microvm-image:x"},
    "ListMicrovmImages": {"nameFilter": "x"},
    "TagResource": {"Resource": "arn:aws:lambda:us-east-1:123456789012:microvm-image:x", "Tags": {"a": "b"}},
    "UntagResource": {"Resource": "arn:aws:lambda:us-east-1:123456789012:microvm-image:x", "TagKeys": ["a"]},
    "ListTags": {"Resource": "arn:aws:lambda:us-east-1:123456789012:microvm-image:x"},
}


@pytest.mark.parametrize("operation", sorted(IMPLEMENTED))
def test_botocore_serialized_requests_reach_their_route(operation) -> None:
    """What botocore's own serializer sends for each operation lands on that operation."""
    model = _wire.service_model().operation_model(operation)
    request = create_serializer("rest-json").serialize_to_request(SAMPLE_INPUTS[operation], model)
    prepare_request_dict(request, endpoint_url="http://127.0.0.1")
    path = request["url_path"].split("?")[0]
    found = _wire.match(request["method"], re.sub(r"^http://127\.0\.0\.1", "", path))
    assert found is not None and found[0].operation == operation
    assert found[0].method == model.http["method"]
    assert found[0].status == model.http.get("responseCode", 200)


def test_every_operation_of_the_model_has_a_route() -> None:
    names = {r.operation for r in _wire.routes()}
    assert names == set(_wire.service_model().operation_names) and len(names) == 24


def test_unimplemented_operations_say_which(client, image) -> None:
    with pytest.raises(client.exceptions.ClientError) as info:
        client.list_microvm_image_builds(imageIdentifier=image, imageVersion="1.0")
    error = info.value.response["Error"]
    assert error["Code"] == "NotImplementedException"
    assert "ListMicrovmImageBuilds is not implemented" in error["Message"]
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501


# ------------------------------------------------------------------------------- operations


def test_run_get_list(client, image, clock) -> None:
    vm = run(client, image, executionRoleArn=ROLE, maximumDurationInSeconds=3600)
    assert re.fullmatch(r"microvm-[0-9a-f-]{36}", vm["microvmId"])
    assert vm["state"] == "PENDING" and vm["imageArn"] == image and vm["imageVersion"] == "1.0"
    assert vm["endpoint"] == f"https://{vm['microvmId']}.lambda-microvm.us-east-1.on.aws"
    assert vm["maximumDurationInSeconds"] == 3600 and vm["executionRoleArn"] == ROLE
    assert vm["startedAt"] == dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc)
    assert vm["ingressNetworkConnectors"][0].endswith(":aws-network-connector:HTTP_INGRESS")
    assert vm["ResponseMetadata"]["HTTPStatusCode"] == 200
    listed = client.list_microvms(imageIdentifier=image)
    assert_fits_model("ListMicrovms", listed)
    assert [i["microvmId"] for i in listed["items"]] == [vm["microvmId"]]
    assert "nextToken" not in listed


def test_list_filters_by_image_and_paginates(emulator, client, image) -> None:
    other = emulator.create_image("otro", 1024)
    ours = [run(client, image)["microvmId"] for _ in range(3)]
    client_unthrottled = client
    for _ in range(2):
        run(client_unthrottled, other)
    assert {i["microvmId"] for i in client.list_microvms(imageIdentifier=image)["items"]} == set(ours)
    assert len(client.list_microvms()["items"]) == 5
    pages = list(client.get_paginator("list_microvms").paginate(PaginationConfig={"PageSize": 2}))
    assert [len(p["items"]) for p in pages] == [2, 2, 1]
    assert len({i["microvmId"] for p in pages for i in p["items"]}) == 5
    with pytest.raises(client.exceptions.ValidationException):
        client.list_microvms(nextToken="garbage")


def test_images_and_tags(client, clock) -> None:
    created = client.create_microvm_image(
        name="publicado", baseImageArn=BASE, buildRoleArn=ROLE, codeArtifact={"uri": "s3://b/k.zip"},
        resources=[{"minimumMemoryInMiB": 4096}], tags={"team": "ia"},
    )
    assert created["ResponseMetadata"]["HTTPStatusCode"] == 201
    assert_fits_model("CreateMicrovmImage", created)
    assert created["state"] == "CREATING"
    arn = created["imageArn"]
    assert arn == "arn:aws:lambda:us-east-1:123456789012:microvm-image:publicado"
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.run_microvm(imageIdentifier=arn)  # no active version while building
    clock.advance(180)
    got = client.get_microvm_image(imageIdentifier=arn)
    assert_fits_model("GetMicrovmImage", got)
    assert got["state"] == "CREATED" and got["latestActiveImageVersion"] == "1.0"
    assert client.run_microvm(imageIdentifier=arn)["state"] == "PENDING"
    listed = client.list_microvm_images(nameFilter="publi")
    assert_fits_model("ListMicrovmImages", listed)
    assert [i["name"] for i in listed["items"]] == ["publicado"]
    tagged = client.tag_resource(Resource=arn, Tags={"env": "dev"})
    assert tagged["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert client.list_tags(Resource=arn)["Tags"] == {"team": "ia", "env": "dev"}
    client.untag_resource(Resource=arn, TagKeys=["team"])
    assert client.list_tags(Resource=arn)["Tags"] == {"env": "dev"}
    with pytest.raises(client.exceptions.ConflictException):
        client.create_microvm_image(name="publicado", baseImageArn=BASE, buildRoleArn=ROLE, codeArtifact={"uri": "s3://b/k"})


def test_auth_token(client, image, clock) -> None:
    vm = run(client, image)
    token = client.create_microvm_auth_token(
        microvmIdentifier=vm["microvmId"], expirationInMinutes=60, allowedPorts=[{"port": 8080}, {"allPorts": {}}]
    )
    assert_fits_model("CreateMicrovmAuthToken", token)
    assert len(token["authToken"]["X-aws-proxy-auth"]) > 40
    with pytest.raises(client.exceptions.ValidationException, match="60"):
        client.create_microvm_auth_token(microvmIdentifier=vm["microvmId"], expirationInMinutes=61, allowedPorts=[{"port": 1}])
    with pytest.raises(client.exceptions.ValidationException, match="65535"):
        client.create_microvm_auth_token(microvmIdentifier=vm["microvmId"], expirationInMinutes=5, allowedPorts=[{"port": 70000}])


# ------------------------------------------------------------------------------- errors


def test_validation_of_what_botocore_lets_through(client, image) -> None:
    cases = [
        (lambda: client.list_microvms(maxResults=51), "maxResults: 51 is above the maximum of 50"),
        (lambda: client.run_microvm(imageIdentifier=image, maximumDurationInSeconds=28801), "28800"),
        (lambda: client.run_microvm(imageIdentifier="mi-agente"), "Malformed ARN - doesn't start with 'arn:'"),
        (lambda: client.run_microvm(imageIdentifier=image, clientToken="x" * 129), "at most 128"),
        (lambda: client.run_microvm(imageIdentifier=image, executionRoleArn="arn:aws:iam::1:role/x"), "does not match"),
        (lambda: client.run_microvm(imageIdentifier=image, logging={"cloudWatch": {"logGroup": "bad group!"}}), "logGroup"),
    ]
    for call, text in cases:
        with pytest.raises(client.exceptions.ValidationException) as info:
            call()
        assert text in info.value.response["Error"]["Message"]
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_not_found(client, image) -> None:
    with pytest.raises(client.exceptions.ResourceNotFoundException) as info:
        client.get_microvm(microvmIdentifier="microvm-nope")
    assert info.value.response["resourceId"] == "microvm-nope"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    missing = image.replace("mi-agente", "otro")
    with pytest.raises(client.exceptions.ResourceNotFoundException, match="No active version found"):
        client.run_microvm(imageIdentifier=missing)


def test_throttling_is_429_with_retry_after(client, image) -> None:
    for _ in range(5):
        run(client, image)  # the burst of 5
    with pytest.raises(client.exceptions.ThrottlingException) as info:
        run(client, image)
    response = info.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["retryAfterSeconds"] == 1
    assert response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "1"
    assert response["quotaCode"] == "L-535CA9B6" and response["serviceCode"] == "lambda"


def test_memory_quota_is_402(clock) -> None:
    with MicrovmsEmulator(clock=clock, memory_quota_mib=4096, rate_limits=False) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("grande", memory_mib=2048)
        first, _ = run(client, image), run(client, image)
        with pytest.raises(client.exceptions.ServiceQuotaExceededException) as info:
            run(client, image)
        response = info.value.response
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 402
        assert response["quotaCode"] == "L-CD1C0CC4"
        client.terminate_microvm(microvmIdentifier=first["microvmId"])
        run(client, image)  # TERMINATING VMs no longer count
        assert emu.memory_in_use_mib() == 4096


def test_injected_faults(emulator, client, image) -> None:
    emulator.inject("RunMicrovm", "InsufficientCapacity", times=1)
    with pytest.raises(client.exceptions.InsufficientCapacityException) as info:
        run(client, image)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    run(client, image)  # the fault was armed once
    emulator.inject("GetMicrovm", "InternalServer", times=2, retry_after=3)
    with pytest.raises(client.exceptions.InternalServerException) as info:
        client.get_microvm(microvmIdentifier="microvm-x")
    assert info.value.response["retryAfterSeconds"] == 3
    latency = emulator.inject("ListMicrovms", "latency", seconds=0.2, times=None)
    start = time.perf_counter()
    client.list_microvms()
    assert time.perf_counter() - start >= 0.2
    emulator.remove_fault(latency)


def test_sdk_retries_recover_from_a_transient_fault(emulator, image) -> None:
    emulator.inject("ListMicrovms", "InternalServer", times=1)
    patient = microvms_client(emulator.endpoint_url, retries=3)
    assert patient.list_microvms()["items"] == []
    assert emulator.calls["ListMicrovms"] == 2


# ------------------------------------------------------------------------------- lifecycle


def test_pending_running_suspend_resume_terminate(emulator, client, image, clock) -> None:
    vm_id = run(client, image)["microvmId"]
    with pytest.raises(client.exceptions.ConflictException):
        client.suspend_microvm(microvmIdentifier=vm_id)  # still PENDING
    clock.advance(11.9)
    assert state(client, vm_id) == "PENDING"
    clock.advance(0.1)
    assert state(client, vm_id) == "RUNNING"
    with pytest.raises(client.exceptions.ConflictException) as info:
        client.resume_microvm(microvmIdentifier=vm_id)  # not SUSPENDED
    assert info.value.response["resourceId"] == vm_id and info.value.response["resourceType"] == "Microvm"
    assert client.suspend_microvm(microvmIdentifier=vm_id)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert state(client, vm_id) == "SUSPENDING"
    client.suspend_microvm(microvmIdentifier=vm_id)  # idempotent
    clock.advance(1)
    assert state(client, vm_id) == "SUSPENDED"
    client.resume_microvm(microvmIdentifier=vm_id)
    assert state(client, vm_id) == "RUNNING"
    client.terminate_microvm(microvmIdentifier=vm_id)
    assert state(client, vm_id) == "TERMINATING"
    client.terminate_microvm(microvmIdentifier=vm_id)  # idempotent
    clock.advance(3)
    got = client.get_microvm(microvmIdentifier=vm_id)
    assert got["state"] == "TERMINATED" and "terminatedAt" in got
    client.terminate_microvm(microvmIdentifier=vm_id)  # still idempotent
    with pytest.raises(client.exceptions.ConflictException):
        client.suspend_microvm(microvmIdentifier=vm_id)


def test_terminated_vms_linger_then_vanish(client, image, clock) -> None:
    vm_id = run(client, image)["microvmId"]
    client.terminate_microvm(microvmIdentifier=vm_id)
    clock.advance(3 + 599)
    assert [i["state"] for i in client.list_microvms(imageIdentifier=image)["items"]] == ["TERMINATED"]
    clock.advance(1)
    assert client.list_microvms(imageIdentifier=image)["items"] == []
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.get_microvm(microvmIdentifier=vm_id)


def test_maximum_duration_ends_a_vm(client, image, clock) -> None:
    vm_id = run(client, image, maximumDurationInSeconds=100)["microvmId"]
    clock.advance(99)
    assert state(client, vm_id) == "RUNNING"
    clock.advance(1)
    got = client.get_microvm(microvmIdentifier=vm_id)
    assert got["state"] == "TERMINATING" and got["stateReason"] == "maximum_duration_reached"
    clock.advance(3)
    assert state(client, vm_id) == "TERMINATED"


def test_default_maximum_duration_is_eight_hours(client, image, clock) -> None:
    vm = run(client, image)
    assert vm["maximumDurationInSeconds"] == 28_800
    clock.advance(28_800)
    assert state(client, vm["microvmId"]) == "TERMINATING"


def test_idle_policy_suspends_and_ends(emulator, client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 300, "autoResumeEnabled": True}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    clock.advance(12 + 59)
    assert state(client, vm_id) == "RUNNING"
    assert emulator.traffic(vm_id) == 200  # activity pushes the idle deadline
    clock.advance(59)
    assert state(client, vm_id) == "RUNNING"
    clock.advance(1)
    assert state(client, vm_id) == "SUSPENDING"
    clock.advance(1)
    assert state(client, vm_id) == "SUSPENDED"
    assert emulator.traffic(vm_id) == 200  # auto-resume
    assert state(client, vm_id) == "RUNNING"
    clock.advance(60 + 1 + 300)
    got = client.get_microvm(microvmIdentifier=vm_id)
    assert got["state"] == "TERMINATING" and got["stateReason"] == "idle_timeout"


def test_no_auto_resume_means_502(emulator, client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 100, "autoResumeEnabled": False}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    assert emulator.traffic(vm_id) == 502  # PENDING
    clock.advance(12 + 60 + 1)
    assert state(client, vm_id) == "SUSPENDED"
    assert emulator.traffic(vm_id) == 502
    assert state(client, vm_id) == "SUSPENDED"


def test_zero_suspended_duration_ends_on_suspend(client, image, clock) -> None:
    policy = {"maxIdleDurationSeconds": 60, "suspendedDurationSeconds": 0, "autoResumeEnabled": True}
    vm_id = run(client, image, idlePolicy=policy)["microvmId"]
    clock.advance(12 + 60 + 1)
    got = client.get_microvm(microvmIdentifier=vm_id)
    assert (got["state"], got["stateReason"]) == ("TERMINATING", "idle_timeout")


def test_client_token_idempotency(emulator, client, image) -> None:
    first = run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=3600)
    again = run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=3600)
    assert again["microvmId"] == first["microvmId"]
    with pytest.raises(client.exceptions.ConflictException) as info:
        run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=60)
    assert info.value.response["resourceId"] == first["microvmId"]
    assert len(emulator.microvms()) == 1


def test_boto3_fills_a_random_client_token(emulator, client, image) -> None:
    a, b = run(client, image), run(client, image)
    assert a["microvmId"] != b["microvmId"]
    tokens = [vm["clientToken"] for vm in emulator.microvms()]
    assert all(re.fullmatch(r"[0-9a-f-]{36}", t) for t in tokens) and len(set(tokens)) == 2


def test_crash_fault(emulator, client, image, clock) -> None:
    emulator.inject("RunMicrovm", "crash", after_seconds=20, reason="app_crashloop")
    crashing = run(client, image)["microvmId"]
    healthy = run(client, image)["microvmId"]
    clock.advance(20)
    got = client.get_microvm(microvmIdentifier=crashing)
    assert got["state"] == "TERMINATED" and got["stateReason"] == "app_crashloop"
    assert state(client, healthy) == "RUNNING"
    emulator.crash(healthy, reason="host_failure")
    assert client.get_microvm(microvmIdentifier=healthy)["stateReason"] == "host_failure"


def test_stale_state(emulator, client, image, clock) -> None:
    vm_id = run(client, image)["microvmId"]
    clock.advance(12)
    emulator.stale_seconds = 5
    assert state(client, vm_id) == "PENDING"  # readers lag 5 seconds
    assert emulator.state_of(vm_id) == "RUNNING"
    clock.advance(5)
    assert state(client, vm_id) == "RUNNING"
    assert client.list_microvms()["items"][0]["state"] == "RUNNING"


def test_new_image_version_runs_for_new_vms(emulator, client, image) -> None:
    old = run(client, image)
    emulator.publish_version("mi-agente", "2.0")
    new = run(client, image)
    assert (old["imageVersion"], new["imageVersion"]) == ("1.0", "2.0")
    assert [i["microvmId"] for i in client.list_microvms(imageIdentifier=image, imageVersion="2.0")["items"]] == [new["microvmId"]]


# ------------------------------------------------------------------------------- rate limits, measured


def test_a_burst_above_the_quota_is_throttled_a_paced_client_never_is(clock) -> None:
    with MicrovmsEmulator(clock=clock, pending_seconds=0) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("ritmo")
        vm_ids = [run(client, image)["microvmId"] for _ in range(5)]
        clock.advance(1)
        # Burst: 20 SuspendMicrovm at once against 2/s, burst 2.
        outcomes = []
        for vm_id in vm_ids * 4:
            try:
                client.suspend_microvm(microvmIdentifier=vm_id)
                outcomes.append("ok")
            except client.exceptions.ThrottlingException as exc:
                outcomes.append(exc.response["retryAfterSeconds"])
        assert outcomes.count("ok") == 2 and outcomes[2:] == [1] * 18
        # Paced: 100 GetMicrovm at 100/s and 60 RunMicrovm at 5/s, over virtual time.
        before = sum(emu.throttled.values())
        for i in range(100):
            client.get_microvm(microvmIdentifier=vm_ids[i % 5])
            clock.advance(0.01)
        for _ in range(60):
            clock.advance(0.2)
            run(client, image)
        assert sum(emu.throttled.values()) == before


def test_real_clock_burst(image_name="real") -> None:
    with MicrovmsEmulator(pending_seconds=0.05, terminating_seconds=0.05) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image(image_name)
        throttled = 0
        for _ in range(12):
            try:
                run(client, image)
            except client.exceptions.ThrottlingException:
                throttled += 1
        assert throttled >= 5  # 12 calls in well under a second against 5/s, burst 5
        time.sleep(0.1)
        assert {vm["state"] for vm in emu.microvms()} == {"RUNNING"}


def test_rate_limits_are_configurable(clock) -> None:
    with MicrovmsEmulator(clock=clock, rate_limits={"RunMicrovm": (1, 1), "GetMicrovm": None}) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("lento")
        vm_id = run(client, image)["microvmId"]
        with pytest.raises(client.exceptions.ThrottlingException):
            run(client, image)
        for _ in range(300):
            client.get_microvm(microvmIdentifier=vm_id)  # unlimited


# ------------------------------------------------------------------------------- as a program


def test_command_line_server() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayito_constructs.testing.microvms", "--port", str(port), "--virtual-clock",
         "--pending-seconds", "5", "--image", "cli-agente:1024"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        image = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == f"MicroVMs emulator on http://127.0.0.1:{port}"
        client = microvms_client(f"http://127.0.0.1:{port}")
        vm_id = client.run_microvm(imageIdentifier=image)["microvmId"]
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/_emulator/clock/advance", data=json.dumps({"seconds": 5}).encode(), method="POST"
        )
        urllib.request.urlopen(request).read()
        assert client.get_microvm(microvmIdentifier=vm_id)["state"] == "RUNNING"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
