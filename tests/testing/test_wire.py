"""The wire: every operation routed as botocore's model says, errors shaped as its error shapes,
malformed requests answered (never a dropped connection), the Date header on the emulator's clock."""

from __future__ import annotations

import email.utils
import http.client
import json
import queue
import re
import subprocess
import sys
import threading
import urllib.request

import pytest
from botocore.awsrequest import prepare_request_dict
from botocore.serialize import create_serializer

from rayito_constructs.testing import MicrovmsBackend, MicrovmsEmulator, VirtualClock, _wire
from rayito_constructs.testing.microvms import IMPLEMENTED

from ..emulator_helpers import assert_fits_model, microvms_client
from .helpers import BASE, ROLE, error, run

ARN = "arn:aws:lambda:us-east-1:123456789012:microvm-image:x"
SAMPLE_INPUTS = {
    "RunMicrovm": {"imageIdentifier": ARN, "clientToken": "t"},
    "ListMicrovms": {"imageIdentifier": ARN, "maxResults": 5, "nextToken": "n"},
    "GetMicrovm": {"microvmIdentifier": "microvm-1"},
    "SuspendMicrovm": {"microvmIdentifier": "microvm-1"},
    "ResumeMicrovm": {"microvmIdentifier": "microvm-1"},
    "TerminateMicrovm": {"microvmIdentifier": "microvm-1"},
    "CreateMicrovmAuthToken": {"microvmIdentifier": "microvm-1", "expirationInMinutes": 5, "allowedPorts": [{"port": 8080}]},
    "CreateMicrovmImage": {"name": "x", "baseImageArn": BASE, "buildRoleArn": ROLE, "codeArtifact": {"uri": "s3://b/k"}},
    "UpdateMicrovmImage": {"imageIdentifier": ARN, "baseImageArn": BASE, "buildRoleArn": ROLE, "codeArtifact": {"uri": "s3://b/k"}},
    "DeleteMicrovmImage": {"imageIdentifier": ARN},
    "GetMicrovmImage": {"imageIdentifier": ARN},
    "ListMicrovmImages": {"nameFilter": "x"},
    "GetMicrovmImageVersion": {"imageIdentifier": ARN, "imageVersion": "1.0"},
    "ListMicrovmImageBuilds": {"imageIdentifier": ARN, "imageVersion": "1.0"},
    "GetMicrovmImageBuild": {"imageIdentifier": ARN, "imageVersion": "1.0", "buildId": "build-1.0"},
    "ListMicrovmImageVersions": {"imageIdentifier": ARN, "maxResults": 2},
    "UpdateMicrovmImageVersion": {"imageIdentifier": ARN, "imageVersion": "1.0", "status": "INACTIVE"},
    "DeleteMicrovmImageVersion": {"imageIdentifier": ARN, "imageVersion": "1.0"},
    "TagResource": {"Resource": ARN, "Tags": {"a": "b"}},
    "UntagResource": {"Resource": ARN, "TagKeys": ["a"]},
    "ListTags": {"Resource": ARN},
    "ListManagedMicrovmImages": {"maxResults": 5},
    "ListManagedMicrovmImageVersions": {"imageIdentifier": BASE, "maxResults": 5},
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


def test_the_bundled_model_is_the_model_the_emulator_speaks() -> None:
    """Without botocore>=1.43.35 the emulator falls back to the model the reconciler Lambda ships."""
    bundled = _wire.bundled_service_model()
    installed = _wire.service_model()
    assert set(bundled.operation_names) == set(installed.operation_names)
    for name in bundled.operation_names:
        assert bundled.operation_model(name).http == installed.operation_model(name).http


def test_unimplemented_operations_say_which(client, image) -> None:
    response = error(lambda: client.create_microvm_shell_auth_token(microvmIdentifier="microvm-0", expirationInMinutes=5))
    assert response["Error"]["Code"] == "NotImplementedException"
    assert "CreateMicrovmShellAuthToken is not implemented" in response["Error"]["Message"]
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 501


def test_validation_of_what_botocore_lets_through(client, image) -> None:
    cases = [
        (lambda: client.list_microvms(maxResults=51),
         "Value '51' at 'maxResults' failed to satisfy constraint: Member must have value less than or equal to 50"),
        (lambda: run(client, image, maximumDurationInSeconds=28801), "Member must have value less than or equal to 28800"),
        (lambda: run(client, image, idlePolicy={"maxIdleDurationSeconds": 28801, "suspendedDurationSeconds": 0,
                                                "autoResumeEnabled": False}),  # [docs] (GT §5), not in the model
         "Value '28801' at 'idlePolicy.maxIdleDurationSeconds' failed to satisfy constraint: "
         "Member must have value less than or equal to 28800"),
        (lambda: run(client, image, clientToken="x" * 129), "Member must have length less than or equal to 128"),
        (lambda: run(client, image, executionRoleArn="arn:aws:iam::1:role/x"), "does not match"),
        (lambda: run(client, image, logging={"cloudWatch": {"logGroup": "bad group!"}}), "logGroup"),
        (lambda: run(client, image, runHookPayload="x" * 4097),  # [M 2026-09-15] Q11, the value not echoed
         "Value at 'runHookPayload' failed to satisfy constraint: Member must have length less than or equal to 4096"),
    ]
    for call, text in cases:
        response = error(call)
        assert response["Error"]["Code"] == "ValidationException", text
        assert text in response["Error"]["Message"]
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_measured_validation_messages(client, image) -> None:
    """[M 2026-09-15] the image is always named by its ARN ("Invalid ARN format", GT §7);
    [M 2026-10-02] logging without an execution role (Q108); [M 2026-09-22] NO_EGRESS is not a
    managed connector (Q60)."""
    assert error(lambda: run(client, "mi-agente"))["Error"]["Message"] == "Invalid ARN format"
    assert error(lambda: client.list_microvms(imageIdentifier="mi-agente"))["Error"]["Message"] == "Invalid ARN format"
    logs = error(lambda: run(client, image, logging={"cloudWatch": {"logGroup": "/rayito/x"}}))
    assert logs["Error"]["Message"] == "Logging cannot be enabled without providing executionRoleArn"
    egress = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:NO_EGRESS"
    assert "Unrecognized managed network connector ARN" in error(lambda: run(client, image, egressNetworkConnectors=[egress]))["Error"]["Message"]
    hook = error(lambda: run(client, image, runHookPayload="{}"))
    assert hook["Error"]["Message"] == "The run hook must be enabled in the MicroVM image to pass the run hook payload"


def test_not_found(client, image) -> None:
    response = error(lambda: client.get_microvm(microvmIdentifier="microvm-nope"))
    assert response["Error"]["Code"] == "ResourceNotFoundException"
    assert response["resourceId"] == "microvm-nope" and response["ResponseMetadata"]["HTTPStatusCode"] == 404
    missing = image.replace("mi-agente", "otro")
    response = error(lambda: run(client, missing))
    assert response["Error"]["Message"] == f"No active version found for MicroVM image {missing}"


def _raw(emulator: MicrovmsEmulator, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", int(emulator.endpoint_url.rsplit(":", 1)[1]), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    "method, path, body, status, code",
    [
        ("POST", "/2025-09-09/microvms", b"{not json", 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b"[1, 2]", 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b'{"imageIdentifier": 7}', 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b'{"imageIdentifier": "arn:x", "maximumDurationInSeconds": NaN}', 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b'{"imageIdentifier": "arn:x", "maximumDurationInSeconds": 1e400}', 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b'{"imageIdentifier": "arn:x", "maximumDurationInSeconds": true}', 400, "ValidationException"),
        ("POST", "/2025-09-09/microvms", b"\xff\xfe", 400, "ValidationException"),
        ("GET", "/2025-09-09/microvms?maxResults=abc", b"", 400, "ValidationException"),
        ("GET", "/2025-09-09/microvms?nextToken=%00%ff", b"", 400, "ValidationException"),
        ("GET", "/2025-09-09/microvms/microvm-%E2%9C%93", b"", 404, "ResourceNotFoundException"),
        ("PATCH", "/2025-09-09/microvms", b"", 405, "ValidationException"),
        ("GET", "/nowhere", b"", 404, "UnknownOperationException"),
    ],
)
def test_malformed_requests_are_answered(emulator, method, path, body, status, code) -> None:
    got, headers, payload = _raw(emulator, method, path, body, {"Content-Type": "application/json"})
    assert got == status
    assert headers["x-amzn-ErrorType"] == code and json.loads(payload)["message"]


def test_bad_content_length_and_huge_bodies(emulator) -> None:
    port = int(emulator.endpoint_url.rsplit(":", 1)[1])
    for length in ("-5", "abc", str(10 << 20)):
        with __import__("socket").create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"POST /2025-09-09/microvms HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            reply = sock.recv(4096).decode()
        assert reply.split()[1] in ("400", "413"), reply
    # The server still answers afterwards.
    assert _raw(emulator, "GET", "/2025-09-09/microvms")[0] == 200


def test_the_date_header_follows_the_virtual_clock(emulator, clock, client) -> None:
    clock.advance(86_400 * 400)
    _, headers, _ = _raw(emulator, "GET", "/2025-09-09/microvms")
    assert email.utils.parsedate_to_datetime(headers["Date"]).timestamp() == int(clock.now())
    listed = client.list_microvms()
    date = listed["ResponseMetadata"]["HTTPHeaders"]["date"]
    assert email.utils.parsedate_to_datetime(date).timestamp() == int(clock.now())
    in_process = emulator.client(in_process=True).list_microvms()["ResponseMetadata"]["HTTPHeaders"]["date"]
    assert email.utils.parsedate_to_datetime(in_process).timestamp() == int(clock.now())


def test_every_request_is_logged_with_its_caller(emulator, image) -> None:
    """The request log is what benchmarks count from: who called, what, and how it was answered."""
    alice = microvms_client(emulator.endpoint_url)
    bob = emulator.client(in_process=True, access_key="bob")
    vm = run(alice, image)["microvmId"]
    bob.terminate_microvm(microvmIdentifier=vm)
    error(lambda: bob.get_microvm(microvmIdentifier="microvm-x"))
    records = list(emulator.requests)
    assert [(r.operation, r.caller, r.status, r.error, r.microvm_id) for r in records] == [
        ("RunMicrovm", "testing", 200, None, vm),
        ("TerminateMicrovm", "bob", 200, None, vm),
        ("GetMicrovm", "bob", 404, "ResourceNotFoundException", "microvm-x"),
    ]
    assert records[0].client_token  # boto3 fills one in
    assert emulator.microvms()[0]["caller"] == "testing"
    seen = []
    emulator.subscribe(seen.append)
    error(lambda: alice.list_microvms(maxResults=99))  # malformed: still logged and counted
    assert [(r.operation, r.status) for r in seen] == [("ListMicrovms", 400)]


def test_the_backend_is_callable_without_http(clock) -> None:
    backend = MicrovmsBackend(clock=clock, seed=1, consistency_seconds=0)
    image = backend.create_image("directo")
    vm = backend.call("RunMicrovm", {"imageIdentifier": image}, caller="me")
    assert vm["state"] == "PENDING" and backend.microvms()[0]["caller"] == "me"
    with pytest.raises(_wire.WireError) as info:
        backend.call("RunMicrovm", {"imageIdentifier": image, "maximumDurationInSeconds": 0})
    assert info.value.code == "ValidationException" and info.value.status == 400


def test_direct_client_has_every_operation(emulator, image) -> None:
    direct = emulator.direct_client(caller="sim")
    assert direct.get_microvm_image(imageIdentifier=image)["state"] == "CREATED"
    vm = direct.run_microvm(imageIdentifier=image)["microvmId"]
    assert [r.caller for r in emulator.requests] == ["sim", "sim"]
    with pytest.raises(Exception) as info:
        direct.get_microvm(microvmIdentifier="microvm-x")
    assert info.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert vm.startswith("microvm-")


def test_many_threads_at_once_over_http(emulator, image) -> None:
    """Concurrent requests over real sockets: every one answered, state consistent."""
    emulator.remove_rate_limit("RunMicrovm")
    results: list[str] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        c = microvms_client(emulator.endpoint_url)
        for i in range(10):
            vm = c.run_microvm(imageIdentifier=image, clientToken=f"t-{n}-{i % 5}")["microvmId"]
            with lock:
                results.append(vm)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 80 and len(set(results)) == 40  # 5 tokens per thread, each one VM
    assert len(emulator.microvms()) == 40


def _lines_of(stream) -> "queue.Queue[str]":
    """``stream``'s lines, read in a thread: ``get(timeout=...)`` fails a test instead of hanging it."""
    lines: "queue.Queue[str]" = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_command_line_server() -> None:
    # --port 0: the server binds a free port itself and prints it (no probe-then-bind race).
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayito_constructs.testing.microvms", "--port", "0", "--virtual-clock",
         "--pending-seconds", "5", "--consistency-seconds", "0", "--image", "cli-agente:1024"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        lines = _lines_of(proc.stdout)
        image = lines.get(timeout=60).strip()
        announced = re.fullmatch(r"MicroVMs emulator on http://127\.0\.0\.1:(\d+)", lines.get(timeout=60).strip())
        assert announced, "the emulator did not say where it listens"
        port = int(announced.group(1))
        assert port > 0
        client = microvms_client(f"http://127.0.0.1:{port}")
        vm_id = client.run_microvm(imageIdentifier=image)["microvmId"]

        def admin(method: str, path: str, data: object = None) -> tuple[int, dict]:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/_emulator/{path}", method=method,
                                             data=None if data is None else json.dumps(data).encode())
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert admin("POST", "clock/advance", {"seconds": 5})[0] == 200
        assert client.get_microvm(microvmIdentifier=vm_id)["state"] == "RUNNING"
        assert admin("POST", "clock/advance", {"seconds": -1}) == (400, {"message": "seconds: -1.0 is not allowed: time only moves forward"})
        assert admin("POST", "clock/advance", {"seconds": "nan"})[0] == 400
        assert admin("POST", "clock/advance", {})[0] == 400
        assert admin("POST", "images", {"name": "otra", "memory_mib": 3000})[0] == 400
        assert admin("POST", "images/cli-agente/versions", {})[1] == {"imageVersion": "2.0"}
        assert admin("POST", f"microvms/{vm_id}/exit", {"code": 3}) == (200, {})
        assert admin("POST", "microvms/microvm-x/exit", {})[0] == 404
        assert admin("POST", "faults", {"operation": "GetMicrovm", "kind": "nope"})[0] == 400
        assert admin("POST", f"traffic/{vm_id}")[1] == {"status": 502}  # the app exited
        assert admin("GET", "requests")[1]["items"][0]["operation"] == "RunMicrovm"
        assert admin("GET", "nowhere")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_command_line_refuses_bad_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rayito_constructs.testing.microvms", "--pending-seconds", "-1"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "pending" in result.stderr and "Traceback" not in result.stderr


def test_responses_fit_the_model_for_each_implemented_read(emulator, client, image) -> None:
    vm = run(client, image)["microvmId"]
    assert_fits_model("ListMicrovms", client.list_microvms(imageIdentifier=image))
    assert_fits_model("GetMicrovmImage", client.get_microvm_image(imageIdentifier=image))
    assert_fits_model("ListMicrovmImages", client.list_microvm_images())
    assert_fits_model("ListMicrovmImageVersions", client.list_microvm_image_versions(imageIdentifier=image))
    assert_fits_model("GetMicrovmImageVersion", client.get_microvm_image_version(imageIdentifier=image, imageVersion="1.0"))
    assert_fits_model("CreateMicrovmAuthToken", client.create_microvm_auth_token(
        microvmIdentifier=vm, expirationInMinutes=60, allowedPorts=[{"port": 8080}, {"allPorts": {}}]))
    assert error(lambda: client.create_microvm_auth_token(microvmIdentifier=vm, expirationInMinutes=61,
                                                          allowedPorts=[{"port": 1}]))["Error"]["Code"] == "ValidationException"


def test_virtual_clock_refuses_what_the_wire_cannot_show() -> None:
    clock = VirtualClock()
    for bad in (-1, float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError):
            clock.advance(bad)
    with pytest.raises(ValueError):
        VirtualClock(start=-5)
    before = clock.now()
    assert clock.advance_to(before - 100) == before  # never backwards


def test_an_error_inside_the_emulator_is_a_500_not_a_dropped_connection(emulator, client, image) -> None:
    def broken(record) -> None:
        raise RuntimeError("a subscriber bug")

    emulator.subscribe(broken)
    response = error(lambda: client.list_microvms())
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert "a subscriber bug" in response["Error"]["Message"]


def test_names_with_underscores_and_unicode(emulator, client) -> None:
    image = emulator.create_image("mi_agente_2")
    assert run(client, image)["imageArn"].endswith(":microvm-image:mi_agente_2")
    unicode = "arn:aws:lambda:us-east-1:123456789012:microvm-image:agénte"
    assert error(lambda: run(client, unicode))["Error"]["Code"] == "ResourceNotFoundException"
    assert error(lambda: client.create_microvm_image(name="agénte", baseImageArn=BASE, buildRoleArn=ROLE,
                                                     codeArtifact={"uri": "s3://b/k"}))["Error"]["Code"] == "ValidationException"


def test_a_storm_of_mixed_calls_from_threads_keeps_the_books(clock) -> None:
    """Eight threads hammer every MicroVM operation at once while the clock moves: nothing is
    answered 500, and the memory quota's count equals the live VMs' memory."""
    import random as _random

    with MicrovmsEmulator(clock=clock, seed=9, rate_limits=False) as emu:
        image = emu.create_image("tormenta", memory_mib=512)
        seen: list[str] = []
        codes: list[int] = []
        lock = threading.Lock()

        def work(n: int) -> None:
            rng = _random.Random(n)
            c = microvms_client(emu.endpoint_url)
            for _ in range(40):
                op = rng.choice(["run", "run", "suspend", "resume", "terminate", "list", "get"])
                with lock:
                    target = rng.choice(seen) if seen else "microvm-none"
                try:
                    if op == "run":
                        vm = c.run_microvm(imageIdentifier=image, clientToken=f"t{rng.randrange(30)}")["microvmId"]
                        with lock:
                            seen.append(vm)
                    elif op == "list":
                        c.list_microvms(imageIdentifier=image, maxResults=3)
                    else:
                        getattr(c, {"suspend": "suspend_microvm", "resume": "resume_microvm", "terminate": "terminate_microvm",
                                    "get": "get_microvm"}[op])(microvmIdentifier=target)
                except c.exceptions.ClientError as exc:
                    with lock:
                        codes.append(exc.response["ResponseMetadata"]["HTTPStatusCode"])
                if n == 0:
                    clock.advance(rng.uniform(0, 3))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert all(code in (404, 409) for code in codes), codes
        live = [vm for vm in emu.microvms() if vm["state"] in ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")]
        assert emu.memory_in_use_mib() == 512 * len(live)
        assert len({vm["clientToken"] for vm in emu.microvms_ever()}) == len(emu.microvms_ever())  # one VM per token
