"""The stand-in rayd against the product's unmodified client (``rayito`` 0.17.1), in-process.

The client reaches the emulated VMs only through the seams it offers for tests: ``transport=``
(``TransportSettings`` with local credentials, on the plaintext port every VM shares) and the
endpoint variables its boto3 clients read. What is asserted is what the client sees and what the
stand-in saw (the RPCs it answered, the processes it runs, the VM's state in the emulator).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import grpc
import pytest

from rayito_constructs.testing import MicrovmsEmulator, VirtualClock
from rayito_constructs.testing.guest_process import descendants, frozen, kill_trees, process_state, stop_trees
from rayito_constructs.testing.secret_gateway import Route, SecretGateway

from .helpers import host_request, raw_health, wait_until


def _token() -> str:
    from rayito._payload import generate_access_token

    return generate_access_token()


def _create(hosted: MicrovmsEmulator, session: Any, image: str, token: str, **options: Any) -> Any:
    from rayito.sandbox_sync import Sandbox

    return Sandbox.create(image, access_token=token, transport=hosted.vm_host.seams.transport, session=session,
                          request_timeout=15, **options)


# ------------------------------------------------------------------ create, token, labels


def test_create_with_a_token_reads_its_labels_and_the_run_payload(hosted, session) -> None:
    from rayito._payload import access_token_sha256

    image = hosted.create_image("eco", rayd=True)
    token = _token()
    sandbox = _create(hosted, session, image, token, metadata={"rayito.agent.deployment": "eco", "equipo": "a"})
    try:
        guest = hosted.vm_host.guest(sandbox.sandbox_id)
        assert sandbox.endpoint == guest.endpoint and sandbox.endpoint.startswith("127.")  # a bare IP, no port
        assert sandbox.metadata == {"rayito.agent.deployment": "eco", "equipo": "a"}
        assert guest.payload["token_sha256"] == access_token_sha256(token)  # what /run delivered
        assert [c.token for c in guest.calls("Health")] == ["-"] * len(guest.calls("Health"))  # anonymous
        # Connecting again: anonymous Health, then an authenticated ConfigureStatus? No gateways: none.
        from rayito.sandbox_sync import Sandbox

        again = Sandbox.connect(sandbox.sandbox_id, access_token=token, transport=hosted.vm_host.seams.transport,
                                session=session)
        assert again.metadata == sandbox.metadata and again.commands.run("echo $USER").stdout == "user\n"
        again.close()
    finally:
        sandbox.kill()


def test_every_rpc_but_health_needs_the_fleet_token(hosted, session) -> None:
    from rayito.exceptions import AuthenticationException
    from rayito.sandbox_sync import Sandbox

    image = hosted.create_image("eco", rayd=True)
    sandbox = _create(hosted, session, image, _token())
    try:
        stranger = Sandbox.connect(sandbox.sandbox_id, access_token=_token(), transport=hosted.vm_host.seams.transport,
                                   session=session)  # connect needs Health; its ConfigureStatus is let go
        with pytest.raises(AuthenticationException):
            stranger.commands.run("true")
        with pytest.raises(AuthenticationException):
            stranger.files.exists("/home/user")
        guest = hosted.vm_host.guest(sandbox.sandbox_id)
        assert [(c.rpc, c.token) for c in guest.calls() if c.token == "bad"] == [
            ("Configure.ConfigureStatus", "bad"), ("Process.Start", "bad"), ("Filesystem.Stat", "bad")]
        stranger.close()
    finally:
        sandbox.kill()


def _health_until_run(emulator: MicrovmsEmulator, vm: dict[str, Any]) -> list[tuple[float, Any]]:
    """Every Health answer (with the time it came) until one carries a sandbox_id."""
    answers: list[tuple[float, Any]] = []
    deadline = time.monotonic() + 60
    while not answers or not answers[-1][1].sandbox_id:
        assert time.monotonic() < deadline, "no Health with a sandbox_id in 60 s"
        answer = raw_health(vm["endpoint"], emulator.vm_host.seams.port)
        if not isinstance(answer, grpc.RpcError):
            answers.append((time.time(), answer))
        time.sleep(0.05)
    return answers


def test_health_has_no_sandbox_id_until_the_run_hook_at_the_measured_launch_time(product_env, session) -> None:
    """PENDING -> RUNNING takes the measured 2 s (``measured.PENDING_SECONDS``) and ``/run`` is
    delivered then; rayd answers Health before it (Q78) without a sandbox_id, labels or lifecycle,
    and with them after it."""
    from rayito.v1 import lifecycle_pb2

    from rayito_constructs.testing import measured

    with MicrovmsEmulator(host_vms=True, consistency_seconds=0) as emulator:
        image = emulator.create_image("eco", rayd=True)
        payload = {"v": 1, "token_sha256": "0" * 64, "user": "user", "workdir": "/home/user",
                   "metadata": {"rayito.agent.deployment": "eco", "rayito.agent.port": "8088"},
                   "lifecycle": {"timeout_s": 600, "cap_s": 660, "on_timeout": "kill", "auto_resume": False}}
        vm = emulator.client().run_microvm(imageIdentifier=image, runHookPayload=json.dumps(payload))
        answers = _health_until_run(emulator, vm)
        guest = emulator.vm_host.guest(vm["microvmId"])
        (started,) = [v["startedAt"] for v in emulator.microvms()]
        assert guest.ran_at - started == pytest.approx(measured.PENDING_SECONDS)  # /run when it turns RUNNING
        # A launch long enough for an answer before /run, whatever this machine's load (6 s).
        emulator.pending_seconds = 6.0
        slow = emulator.client().run_microvm(imageIdentifier=image, runHookPayload=json.dumps(payload))
        slow_answers = _health_until_run(emulator, slow)
        ran_at = emulator.vm_host.guest(slow["microvmId"]).ran_at
        early = [a for at, a in slow_answers if at < ran_at]
        assert early, "no Health answered during a 6 s launch"
        assert {(a.agent_ready, a.sandbox_id, len(a.metadata), a.HasField("lifecycle")) for a in early} == {(True, "", 0, False)}
        late = answers[-1][1]
        assert late.sandbox_id == vm["microvmId"] and dict(late.metadata) == payload["metadata"]
        assert late.lifecycle.phase == lifecycle_pb2.LIFECYCLE_PHASE_ACTIVE
        assert late.lifecycle.cap_unix_ms == late.lifecycle.deadline_unix_ms  # cap = /run + 660 - 60 s
        assert late.features.configure and late.features.secret_gateway
        assert (late.cpu_count, late.memory_total_bytes) == (4, 4 * 2048 * 1024 * 1024)  # [M] Q88


# ------------------------------------------------------------------ images without rayd or hooks


def test_an_image_whose_run_hook_is_off_refuses_the_payload(hosted, session) -> None:
    from botocore.exceptions import ClientError

    off = hosted.create_image("sin-hooks", rayd=True, hooks=False)
    with pytest.raises(ClientError) as refused:
        hosted.client().run_microvm(imageIdentifier=off, runHookPayload="{}")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert refused.value.response["Error"] == {
        "Code": "ValidationException",
        "Message": "The run hook must be enabled in the MicroVM image to pass the run hook payload"}
    with pytest.raises(Exception, match="The run hook must be enabled"):  # the product's client always sends one
        _create(hosted, session, off, _token())
    assert hosted.microvms() == []
    run_off = hosted.create_image("run-off", rayd=True, hooks={"port": 9000, "microvmHooks": {"run": "DISABLED"}})
    with pytest.raises(ClientError):
        hosted.client().run_microvm(imageIdentifier=run_off, runHookPayload="{}")
    # Without a payload it runs, but rayd never gets /run: no sandbox_id, never ready for the client.
    vm = hosted.client().run_microvm(imageIdentifier=off)
    wait_until(lambda: hosted.state_of(vm["microvmId"]) == "RUNNING")
    health = wait_until(lambda: not isinstance(h := raw_health(vm["endpoint"], hosted.vm_host.seams.port), grpc.RpcError) and h)
    assert health.agent_ready and health.sandbox_id == "" and not health.HasField("lifecycle")


def test_a_vm_of_an_image_without_rayd_answers_nothing(hosted, session) -> None:
    from rayito.exceptions import SandboxNotReadyException

    plain = hosted.create_image("dockerfile", hooks=True)  # hooks on, no rayd: the user's app as PID 1
    vm = hosted.client().run_microvm(imageIdentifier=plain, runHookPayload="{}")
    time.sleep(1)
    assert hosted.state_of(vm["microvmId"]) == "RUNNING"
    answer = raw_health(vm["endpoint"], hosted.vm_host.seams.port, timeout=2)
    assert isinstance(answer, grpc.RpcError) and answer.code() is grpc.StatusCode.UNAVAILABLE
    status = host_request_or_refused(vm["endpoint"], hosted.vm_host.seams.port)
    assert status == "refused"
    with pytest.raises(SandboxNotReadyException):
        _create(hosted, session, plain, _token(), ready_timeout=3)
    launched = [v for v in hosted.microvms_ever() if v["microvmId"] != vm["microvmId"]]
    assert [v["history"][-1][1] for v in launched] in (["TERMINATING"], ["TERMINATED"])  # the client ended it


def host_request_or_refused(endpoint: str, port: int) -> Any:
    try:
        return host_request(endpoint, port, "jwe", "GET", "/ping", timeout=2)[0]
    except ConnectionRefusedError:
        return "refused"


def test_the_admin_api_makes_rayd_images_and_shows_a_vms_rpcs(hosted, tmp_path) -> None:
    import urllib.request

    def admin(method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(f"{hosted.endpoint_url}/_emulator/{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    (tmp_path / "app").mkdir()
    image = admin("POST", "images", {"name": "eco", "rayd": True, "app_dir": str(tmp_path / "app")})["imageArn"]
    vm = hosted.client().run_microvm(imageIdentifier=image, runHookPayload=json.dumps({"v": 1}))
    wait_until(lambda: not isinstance(raw_health(vm["endpoint"], hosted.vm_host.seams.port), grpc.RpcError))
    shown = admin("GET", f"microvms/{vm['microvmId']}/rpcs")
    assert shown["items"][0]["rpc"] == "Health" and shown["rewrites"][0][:2] == ["path", "/opt/agents/app"]


def test_the_default_emulator_is_unchanged() -> None:
    with MicrovmsEmulator(consistency_seconds=0) as emulator:
        assert emulator.vm_host is None
        image = emulator.create_image("eco")
        vm = emulator.client().run_microvm(imageIdentifier=image)
        assert vm["endpoint"].endswith(".lambda-microvm.us-east-1.on.aws")
        with pytest.raises(ValueError, match="host_vms=True"):
            emulator.create_image("con-rayd", rayd=True)
    with pytest.raises(ValueError, match="RealClock"):
        MicrovmsEmulator(host_vms=True, clock=VirtualClock())
    with pytest.raises(ValueError, match="host_vms"):
        MicrovmsEmulator(tls_front=True)


# ------------------------------------------------------------------ files, processes, lifecycle


def test_files_and_foreground_and_background_processes(hosted, session) -> None:
    image = hosted.create_image("eco", rayd=True)
    sandbox = _create(hosted, session, image, _token())
    try:
        guest = hosted.vm_host.guest(sandbox.sandbox_id)
        sandbox.files.write("/home/user/notas/a.txt", "hola")
        assert sandbox.files.read("/home/user/notas/a.txt") == "hola"
        assert (guest.root / "home/user/notas/a.txt").read_text() == "hola"  # under the VM's root
        assert not sandbox.files.exists("/home/user/notas/b.txt")  # NOT_FOUND
        assert sandbox.files.exists("/home/user/notas")
        result = sandbox.commands.run("cat /home/user/notas/a.txt; echo; pwd; echo err >&2")
        assert result.stdout == f"hola\n{guest.root}/home/user\n" and result.stderr == "err\n"
        from rayito.exceptions import CommandExitException

        with pytest.raises(CommandExitException):
            sandbox.commands.run("exit 3")
        handle = sandbox.commands.run("while true; do date +%s%N >> /home/user/latido; sleep 0.1; done",
                                      background=True, timeout=None)
        handle.disconnect()  # the stream is cancelled; the process keeps running
        beat = guest.root / "home/user/latido"
        size = wait_until(lambda: beat.exists() and beat.stat().st_size)
        wait_until(lambda: beat.stat().st_size > size)
        assert guest.processes[handle.pid].running
    finally:
        sandbox.kill()
    wait_until(lambda: not guest.processes[handle.pid].running)  # terminate ends the VM's processes
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size


def test_suspend_freezes_the_processes_and_a_new_connection_resumes_them(hosted, session) -> None:
    from rayito.sandbox_sync import Sandbox

    image = hosted.create_image("eco", rayd=True)
    token = _token()
    sandbox = _create(hosted, session, image, token)  # the default idle policy: auto-resume on
    guest = hosted.vm_host.guest(sandbox.sandbox_id)
    try:
        handle = sandbox.commands.run("sleep 300", background=True, timeout=None)
        handle.disconnect()
        pids = wait_until(lambda: [p for p in guest.processes if guest.processes[p].running])
        sandbox.pause(wait=True)
        assert hosted.state_of(sandbox.sandbox_id) == "SUSPENDED"
        assert all(frozen(pid) for pid in pids)  # SIGSTOP
        sandbox.close()
        again = Sandbox.connect(sandbox.sandbox_id, access_token=token, transport=hosted.vm_host.seams.transport,
                                session=session)  # no ResumeMicrovm: Health through the endpoint wakes it
        assert not [r for r in hosted.requests if r.operation == "ResumeMicrovm"]
        assert again.resume_generation == 1 and guest.resume_generation == 1
        assert {process_state(pid) for pid in pids} <= {"S", "R"}
        assert again.commands.run("echo despierto").stdout == "despierto\n"
        again.close()
    finally:
        Sandbox.kill(sandbox.sandbox_id, session=session)


def _guest_tree(script: str) -> Any:
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", script])


@pytest.mark.parametrize("script, spawns", [
    # a busy loop and a sleeping child: the race showed as R right after a suspend on a loaded CI
    ("import collections, subprocess; subprocess.Popen(['sleep', '300']); collections.deque(iter(int, 1), maxlen=0)",
     False),
    # a parent forever spawning: caught between vfork and exec, it waits in the kernel (D)
    ("import subprocess\nwhile True: subprocess.run(['true'])", True),
    # a parent starting children it leaves running: one born while the trees are read is stopped too
    ("import subprocess, time\nfor _ in range(400): subprocess.Popen(['sleep', '1000'])\ntime.sleep(1000)", True),
], ids=["busy-and-sleeping", "spawning", "forking"])
def test_a_freeze_returns_only_once_every_process_of_the_trees_is_frozen(script: str, spawns: bool) -> None:
    """``kill(SIGSTOP)`` only queues the signal; a suspended VM runs nothing, so the emulator's
    freeze waits until ``/proc`` shows every process it signalled frozen, and no longer than it
    takes (a parent caught in ``vfork`` stops only once its child execs, which a stopped child
    never does: it counts as frozen with SIGSTOP pending). A tree that spawns nothing any more is
    all stopped (T); a spawning parent may be that ``D``. Twenty freezes each."""
    import signal

    root = _guest_tree(script)
    try:
        wait_until(lambda: len(descendants([root.pid])) > 1)
        for _ in range(20):
            started = time.monotonic()
            stopped = stop_trees([root.pid])
            assert time.monotonic() - started < 2.0 and root.pid in stopped
            assert all(frozen(pid) for pid in stopped)
            assert all(frozen(pid) for pid in descendants([root.pid])), "a process of the tree still runs"
            if not spawns:
                assert {process_state(pid) for pid in stopped} == {"T"}
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):  # a spawned `true` that ended
                    os.kill(pid, signal.SIGCONT)
            wait_until(lambda: not any(process_state(pid) == "T" for pid in stopped), every=0.01)
    finally:
        kill_trees([root.pid])
        root.wait(timeout=10)


def test_without_auto_resume_a_suspended_vm_answers_nothing_until_resumed(hosted, session) -> None:
    from rayito import IdlePolicy
    from rayito.sandbox_sync import Sandbox

    image = hosted.create_image("eco", rayd=True)
    token = _token()
    sandbox = _create(hosted, session, image, token, timeout=600, idle=IdlePolicy(max_idle_seconds=60, auto_resume=False))
    try:
        sandbox.pause(wait=True)
        sandbox.close()
        answer = raw_health(sandbox.endpoint, hosted.vm_host.seams.port, timeout=2)
        assert isinstance(answer, grpc.RpcError) and answer.code() is grpc.StatusCode.UNAVAILABLE
        assert hosted.state_of(sandbox.sandbox_id) == "SUSPENDED"  # the connection did not wake it
        again = Sandbox.connect(sandbox.sandbox_id, access_token=token, transport=hosted.vm_host.seams.transport,
                                session=session)  # the client resumes it explicitly
        assert [r.operation for r in hosted.requests if r.operation == "ResumeMicrovm"] == ["ResumeMicrovm"]
        assert again.resume_generation == 1
        again.close()
    finally:
        Sandbox.kill(sandbox.sandbox_id, session=session)


def test_idle_counts_requests_not_http2_pings() -> None:
    """The front notes activity for HEADERS and DATA frames only: the product's channels ping
    every 30 s when idle, and an open but silent stream did not keep a VM awake (Q15)."""
    from rayito_constructs.testing.front import H2_PREFACE, _Frames

    def frame(kind: int, size: int) -> bytes:
        return size.to_bytes(3, "big") + bytes([kind, 0]) + b"\0\0\0\1" + b"x" * size

    client = _Frames(preface=True)
    assert not client.feed(H2_PREFACE + frame(0x4, 6) + frame(0x6, 8))  # SETTINGS, PING
    stream = frame(0x6, 8) + frame(0x1, 20) + frame(0x0, 100)  # PING, HEADERS, DATA, cut anywhere
    assert [client.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)].count(True) == 2
    assert not client.feed(frame(0x8, 4))  # WINDOW_UPDATE


def test_set_timeout_kill_ends_the_vm_at_its_deadline(hosted, session) -> None:
    from rayito._agent._fleet_base import rayd_cap  # noqa: F401 - the rule the stand-in follows
    from rayito._lifecycle_base import LifetimeBeyondCapException

    image = hosted.create_image("eco", rayd=True)
    sandbox = _create(hosted, session, image, _token(), timeout=600, max_lifetime=660, on_timeout="kill")
    guest = hosted.vm_host.guest(sandbox.sandbox_id)
    lifecycle = sandbox.get_info().lifecycle
    assert lifecycle.phase == "active" and lifecycle.on_timeout == "kill"
    deadline = guest.lifecycle.deadline_ms
    from rayito.sandbox_sync import Sandbox

    Sandbox.connect(sandbox.sandbox_id, access_token=sandbox.access_token, timeout=30,
                    transport=hosted.vm_host.seams.transport, session=session).close()
    assert guest.calls("Lifecycle.SetTimeout")[-1].detail == "timeout_ms=30000 mode=TIMEOUT_MODE_AT_LEAST"
    assert (guest.lifecycle.deadline_ms, guest.lifecycle.extensions) == (deadline, 0)  # never shortened
    with pytest.raises(LifetimeBeyondCapException) as beyond:
        sandbox.set_timeout(700)
    assert beyond.value.cap_unix_ms == guest.lifecycle.cap_ms  # /run + 660 - 60 s
    sandbox.set_timeout(1)
    assert [c.detail for c in guest.calls("Lifecycle.SetTimeout")][1:] == [
        "timeout_ms=700000 mode=TIMEOUT_MODE_EXACT", "timeout_ms=1000 mode=TIMEOUT_MODE_EXACT"]
    wait_until(lambda: guest.halted)  # rayd exits at the deadline: the endpoint stops answering
    assert isinstance(raw_health(guest.endpoint, hosted.vm_host.seams.port, timeout=1), grpc.RpcError)
    wait_until(lambda: hosted.state_of(sandbox.sandbox_id) == "TERMINATED", timeout=10)
    (vm,) = [v for v in hosted.microvms() if v["microvmId"] == sandbox.sandbox_id]
    from rayito._models import TIMEOUT_STATE_REASON

    assert vm["stateReason"] == TIMEOUT_STATE_REASON  # what the product reads as "timed out" (124)
    sandbox.close()


def test_a_vm_without_a_lifecycle_block_is_unmanaged(hosted, session) -> None:
    from rayito.exceptions import InvalidArgumentException

    image = hosted.create_image("eco", rayd=True)
    sandbox = _create(hosted, session, image, _token())
    try:
        assert sandbox.get_info().lifecycle.phase == "unmanaged"
        with pytest.raises(InvalidArgumentException):  # FAILED_PRECONDITION lifecycle_unmanaged
            sandbox.set_timeout(30)
    finally:
        sandbox.kill()


def test_network_policy_code_and_gateways(hosted, session) -> None:
    from rayito._secret_gateway._domain import SecretGateway as Gateway

    session.client("secretsmanager").create_secret(Name="rayito/upstream-key", SecretString="s3cr3t")  # the product prefixes rayito/
    image = hosted.create_image("eco", rayd=True)
    sandbox = _create(hosted, session, image, _token(), allow_internet_access=False, gateways={
        "up": Gateway(upstream="https://127.0.0.1:1", headers={"x-api-key": "upstream-key"}, allow=[("POST", "/v1/*")])})
    try:
        guest = hosted.vm_host.guest(sandbox.sandbox_id)
        assert guest.network == {"allow_out": [], "deny_out": ["0.0.0.0/0"], "egress_proxy": False}
        assert sandbox.get_network().deny_out == ("0.0.0.0/0",)
        assert sandbox.run_code("pass") is not None
        assert "2" in str(sandbox.run_code("print(1 + 1)").logs)
        (route,) = guest.gateway.routes()
        assert sandbox.gateways["up"].url == f"http://127.0.0.1:{route.port}"
        assert route.headers == {"x-api-key": "s3cr3t"}
        assert "s3cr3t" not in json.dumps([c.detail for c in guest.calls()])  # never logged
        import urllib.error
        import urllib.request

        for method, path, status in (("POST", "/v2/x", 403), ("GET", "/v1/x", 403), ("POST", "/v1/x", 502)):
            request = urllib.request.Request(f"{sandbox.gateways['up'].url}{path}", data=b"{}" if method == "POST" else None,
                                             method=method)
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(request, timeout=10)
            assert answer.value.code == status, (method, path)
    finally:
        sandbox.kill()


def test_the_gateway_forwards_with_the_route_headers() -> None:
    import http.server
    import threading
    import urllib.request

    seen: list[dict[str, str]] = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            seen.append({"path": self.path, "key": self.headers.get("x-api-key", "")})
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    gateway = SecretGateway()
    try:
        gateway.configure([Route("up", f"http://127.0.0.1:{upstream.server_address[1]}", {"x-api-key": "k1"},
                                 [("POST", "/v1/*")], rate_per_minute=2)])
        (route,) = gateway.routes()
        url = f"http://127.0.0.1:{route.port}/v1/messages"

        def post() -> int:
            request = urllib.request.Request(url, data=b"{}", method="POST", headers={"x-api-key": "the app's own"})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as error:
                return error.code

        import urllib.error

        assert [post(), post(), post()] == [200, 200, 429]  # rate_per_minute=2
        assert seen == [{"path": "/v1/messages", "key": "k1"}] * 2  # the route's header replaced the app's
        gateway.configure([Route("up", route.upstream, {"x-api-key": "k2"}, [("POST", "/v1/*")])])  # a rotation
        assert gateway.routes()[0].port == route.port
        assert post() == 200 and seen[-1]["key"] == "k2"
    finally:
        gateway.close()
        upstream.shutdown()
        upstream.server_close()
