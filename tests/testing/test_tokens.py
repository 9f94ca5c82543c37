"""RunMicrovm ``clientToken`` idempotency ([model] ``idempotencyToken``; reuse with other parameters
is a ConflictException [docs troubleshooting]; the service's window is not documented, so the
emulator remembers a token for its whole life unless told otherwise)."""

from __future__ import annotations

import re
import threading

from rayito_constructs.testing import MicrovmsEmulator

from ..emulator_helpers import microvms_client
from .helpers import error, run


def test_same_token_same_vm_other_parameters_conflict(emulator, client, image) -> None:
    first = run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=3600)
    again = run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=3600)
    assert again["microvmId"] == first["microvmId"]
    response = error(lambda: run(client, image, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=60))
    assert response["Error"]["Code"] == "ConflictException" and response["resourceId"] == first["microvmId"]
    other = emulator.create_image("otra")
    assert error(lambda: run(client, other, clientToken="fleet-a/slot-1/gen-1", maximumDurationInSeconds=3600))["Error"]["Code"] == "ConflictException"
    assert len(emulator.microvms()) == 1


def test_a_token_is_remembered_after_its_vm_is_pruned(emulator, client, image, clock) -> None:
    vm = run(client, image, clientToken="slot-0/gen-0")["microvmId"]
    client.terminate_microvm(microvmIdentifier=vm)
    clock.advance(3 + 1200 + 60)
    assert emulator.microvms() == []  # pruned
    replay = run(client, image, clientToken="slot-0/gen-0")
    assert replay["microvmId"] == vm and replay["state"] == "TERMINATED"  # no second VM for one token
    assert len(emulator.microvms_ever()) == 1
    assert error(lambda: run(client, image, clientToken="slot-0/gen-0", maximumDurationInSeconds=9))["Error"]["Code"] == "ConflictException"


def test_a_token_window_can_be_set(clock) -> None:
    with MicrovmsEmulator(clock=clock, client_token_ttl_seconds=3600, consistency_seconds=0) as emu:
        client = microvms_client(emu.endpoint_url)
        image = emu.create_image("ventana")
        vm = run(client, image, clientToken="t")["microvmId"]
        clock.advance(3599)
        assert run(client, image, clientToken="t")["microvmId"] == vm
        clock.advance(2)
        assert run(client, image, clientToken="t")["microvmId"] != vm


def test_boto3_fills_a_random_client_token(emulator, client, image) -> None:
    a, b = run(client, image), run(client, image)
    assert a["microvmId"] != b["microvmId"]
    tokens = [vm["clientToken"] for vm in emulator.microvms()]
    assert all(re.fullmatch(r"[0-9a-f-]{36}", t) for t in tokens) and len(set(tokens)) == 2


def test_one_token_from_many_threads_at_once_is_one_vm(emulator, image) -> None:
    emulator.remove_rate_limit("RunMicrovm")
    barrier = threading.Barrier(12)
    got: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        c = microvms_client(emulator.endpoint_url)
        barrier.wait(timeout=30)
        vm = c.run_microvm(imageIdentifier=image, clientToken="the-one")["microvmId"]
        with lock:
            got.append(vm)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 12 and len(set(got)) == 1 and len(emulator.microvms()) == 1


def test_a_lost_response_is_recovered_with_the_same_token(emulator, client, image) -> None:
    emulator.inject("RunMicrovm", "lost_response")
    response = error(lambda: run(client, image, clientToken="perdido"))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert len(emulator.microvms()) == 1  # it was made
    assert run(client, image, clientToken="perdido")["microvmId"] == emulator.microvms()[0]["microvmId"]


def test_a_500_that_makes_no_vm(emulator, client, image) -> None:
    emulator.inject("RunMicrovm", "InternalServer", retry_after=3)
    response = error(lambda: run(client, image, clientToken="nada"))
    assert response["retryAfterSeconds"] == 3 and emulator.microvms() == []
    emulator.inject("RunMicrovm", "InsufficientCapacity")
    assert error(lambda: run(client, image))["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert emulator.microvms() == []
    assert run(client, image, clientToken="nada")["state"] == "PENDING"


def test_sdk_retries_recover_from_a_transient_fault(emulator, image) -> None:
    emulator.inject("ListMicrovms", "InternalServer", times=1)
    patient = microvms_client(emulator.endpoint_url, retries=3)
    assert patient.list_microvms()["items"] == []
    assert emulator.calls["ListMicrovms"] == 2


def test_latency_fault_is_real_time(emulator, client, image) -> None:
    import time

    latency = emulator.inject("ListMicrovms", "latency", seconds=0.2, times=None)
    start = time.perf_counter()
    client.list_microvms()
    assert time.perf_counter() - start >= 0.2
    emulator.remove_fault(latency)
