"""A stand-in ``rayd``: the ``rayito.v1`` gRPC services a VM of the product's base answers.

The messages and service stubs are the product's own (``rayito.v1.*_pb2``, shipped in the wheel);
what each RPC does is read from how the product's client (``rayito`` 0.17.1) calls it and what it
expects back (docs/testing.md lists each RPC, what it does here and what it does not). One gRPC
server per VM on ``127.0.0.1:<a port it binds itself>``, plaintext; the VM's front
(``front.py``) relays the endpoint's HTTP/2 to it.

The access token: every RPC but ``HealthService.Health`` must carry ``x-access-token`` whose
base64url-decoded bytes hash (sha256) to the ``token_sha256`` of the VM's ``runHookPayload`` (the
product's rule, ``_payload.py``); otherwise ``UNAUTHENTICATED``. Before ``/run`` there is no
hash, so only ``Health`` answers (without a ``sandbox_id``). RPCs the client does not use on the
fleet paths answer ``UNIMPLEMENTED`` (the generated servicers' default).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent import futures
from typing import TYPE_CHECKING, Any, Iterator

import grpc

from .secret_gateway import Route
from .guest_error import GuestError

if TYPE_CHECKING:
    from .vm_host import Guest, Lifecycle, RpcRecord

#: Read chunks of ``FilesystemService.Read`` (the product writes in 1 MiB chunks too).
CHUNK_BYTES = 1 << 20
#: What ``Health.agent_version`` says: the product's version the stand-in follows, marked.
AGENT_VERSION_SUFFIX = "+standin"
WORKERS = 32


def serve(guest: "Guest") -> tuple[grpc.Server, int]:
    """Start the VM's rayd: ``(server, port on 127.0.0.1)``."""
    from rayito.v1 import (code_pb2_grpc, configure_pb2_grpc, filesystem_pb2_grpc, health_pb2_grpc,
                           lifecycle_pb2_grpc, network_pb2_grpc, process_pb2_grpc)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"rayd-{guest.vm_id[-6:]}"),
                         options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServiceServicer_to_server(_servicer(health_pb2_grpc.HealthServiceServicer, Health)(guest), server)
    filesystem_pb2_grpc.add_FilesystemServiceServicer_to_server(
        _servicer(filesystem_pb2_grpc.FilesystemServiceServicer, Filesystem)(guest), server)
    process_pb2_grpc.add_ProcessServiceServicer_to_server(_servicer(process_pb2_grpc.ProcessServiceServicer, Process)(guest), server)
    configure_pb2_grpc.add_ConfigureServiceServicer_to_server(
        _servicer(configure_pb2_grpc.ConfigureServiceServicer, Configure)(guest), server)
    network_pb2_grpc.add_NetworkServiceServicer_to_server(_servicer(network_pb2_grpc.NetworkServiceServicer, Network)(guest), server)
    lifecycle_pb2_grpc.add_LifecycleServiceServicer_to_server(
        _servicer(lifecycle_pb2_grpc.LifecycleServiceServicer, Lifecycle_)(guest), server)
    code_pb2_grpc.add_CodeServiceServicer_to_server(_servicer(code_pb2_grpc.CodeServiceServicer, Code)(guest), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _servicer(base: type, implementation: type) -> type:
    """The implementation over the product's generated servicer base (its other RPCs answer
    ``UNIMPLEMENTED``)."""
    return type(implementation.__name__, (implementation, base), {})


class _Rpcs:
    def __init__(self, guest: "Guest") -> None:
        self.guest = guest

    def _enter(self, context: grpc.ServicerContext, rpc: str, detail: str = "", *, token: bool = True) -> "RpcRecord":
        """Bring the VM up to date, refuse when rayd no longer runs, check the token, log."""
        guest = self.guest
        state = guest.sync()
        metadata = {k: v for k, v in context.invocation_metadata()}
        checked = guest.token_state(metadata.get("x-access-token")) if token else "-"
        record = guest.record(rpc, detail, checked)
        if guest.halted or state in ("TERMINATING", "TERMINATED"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "rayd is not running")
        if token and checked != "ok":
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing access token" if checked == "missing" else "invalid access token")
        return record


def _abort(context: grpc.ServicerContext, error: GuestError) -> None:
    context.abort(getattr(grpc.StatusCode, error.code), error.details)


# ====================================================================== HealthService


def lifecycle_proto(lifecycle: "Lifecycle | None") -> Any:
    from rayito.v1 import lifecycle_pb2

    if lifecycle is None:
        return lifecycle_pb2.LifecycleState(phase=lifecycle_pb2.LIFECYCLE_PHASE_UNMANAGED)
    phases = {"active": lifecycle_pb2.LIFECYCLE_PHASE_ACTIVE, "resume_grace": lifecycle_pb2.LIFECYCLE_PHASE_RESUME_GRACE,
              "expired": lifecycle_pb2.LIFECYCLE_PHASE_EXPIRED}
    actions = {"kill": lifecycle_pb2.TIMEOUT_ACTION_KILL, "pause": lifecycle_pb2.TIMEOUT_ACTION_PAUSE}
    return lifecycle_pb2.LifecycleState(
        phase=phases[lifecycle.phase], deadline_unix_ms=lifecycle.deadline_ms, cap_unix_ms=lifecycle.cap_ms,
        timeout_ms=lifecycle.timeout_ms, on_timeout=actions.get(lifecycle.on_timeout, lifecycle_pb2.TIMEOUT_ACTION_UNSPECIFIED),
        auto_resume=lifecycle.auto_resume, extensions=lifecycle.extensions,
    )


class Health(_Rpcs):
    def Health(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        import rayito
        from rayito.v1 import features_pb2, health_pb2, network_pb2

        self._enter(context, "Health", token=False)
        guest = self.guest
        payload = guest.payload
        response = health_pb2.HealthResponse(
            agent_ready=True,
            kernel_ready=True,
            agent_version=f"{rayito.__version__}{AGENT_VERSION_SUFFIX}",
            uptime_ms=int((time.time() - guest.booted_at) * 1000),
            # Before /run: no sandbox_id (the product's health_ready waits for one, Q78).
            sandbox_id=guest.vm_id if payload is not None else "",
            resume_generation=guest.resume_generation,
            imds_blocked=True,
            egress_enforcement=network_pb2.EGRESS_ENFORCEMENT_GUEST_ROUTES,
            # [M] the guest sees 4x the nominal memory and memory/512 vCPUs (GT §7, Q88).
            cpu_count=max(1, guest.memory_mib // 512),
            memory_total_bytes=guest.memory_mib * 4 * 1024 * 1024,
            features=features_pb2.AgentFeatures(configure=True, secret_gateway=True),
        )
        if payload is not None:
            labels = payload.get("metadata")
            if isinstance(labels, dict):
                response.metadata.update({str(k): str(v) for k, v in labels.items()})
            # A 0.3+ rayd always reports its lifecycle once it has had /run: UNMANAGED without a
            # block (the product reads a missing field as "an agent older than 0.3.0").
            response.lifecycle.CopyFrom(lifecycle_proto(guest.lifecycle))
        return response


# ====================================================================== FilesystemService


def _entry(guest: "Guest", vm_path: str) -> Any:
    from rayito.v1 import common_pb2

    real = guest.path(vm_path)
    st = real.lstat()
    kind = (common_pb2.FILE_TYPE_SYMLINK if real.is_symlink() else
            common_pb2.FILE_TYPE_DIRECTORY if real.is_dir() else common_pb2.FILE_TYPE_FILE)
    return common_pb2.EntryInfo(name=real.name, type=kind, path=vm_path, size=st.st_size, mode=st.st_mode & 0o7777,
                                permissions=oct(st.st_mode & 0o777)[2:], owner="user", group="user",
                                modified_time_unix_ms=int(st.st_mtime * 1000))


class Filesystem(_Rpcs):
    def Write(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import filesystem_pb2

        record = self._enter(context, "Filesystem.Write")
        files: list[list[Any]] = []
        for request in request_iterator:
            if request.path:
                files.append([request.path, bytearray(), request.mode or 0o644])
            elif not files:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first WriteRequest must carry a path")
            files[-1][1] += request.chunk
        record.detail = ", ".join(f"{p} ({len(d)} B, {oct(m)})" for p, d, m in files)
        entries = []
        for path, data, mode in files:
            real = self.guest.path(path)
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_bytes(bytes(data))
            os.chmod(real, mode & 0o7777)
            entries.append(_entry(self.guest, path))
        return filesystem_pb2.WriteResponse(entries=entries)

    def Stat(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import filesystem_pb2

        self._enter(context, "Filesystem.Stat", request.path)
        if not os.path.lexists(self.guest.path(request.path)):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such file or directory: {request.path}")
        return filesystem_pb2.StatResponse(entry=_entry(self.guest, request.path))

    def Read(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        from rayito.v1 import filesystem_pb2

        self._enter(context, "Filesystem.Read", request.path)
        real = self.guest.path(request.path)
        if not real.exists():
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such file or directory: {request.path}")
        if real.is_dir():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"is a directory: {request.path}")
        with open(real, "rb") as handle:
            while True:
                chunk = handle.read(CHUNK_BYTES)
                if not chunk:
                    break
                yield filesystem_pb2.ReadResponse(chunk=chunk)

    def MakeDir(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import filesystem_pb2

        self._enter(context, "Filesystem.MakeDir", request.path)
        real = self.guest.path(request.path)
        if real.exists():
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"already exists: {request.path}")
        real.mkdir(parents=True)
        return filesystem_pb2.MakeDirResponse(entry=_entry(self.guest, request.path))

    def Remove(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        import shutil

        from rayito.v1 import filesystem_pb2

        self._enter(context, "Filesystem.Remove", request.path)
        real = self.guest.path(request.path)
        if not os.path.lexists(real):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such file or directory: {request.path}")
        if real.is_dir() and not real.is_symlink():
            if request.recursive:
                shutil.rmtree(real)
            else:
                real.rmdir()
        else:
            real.unlink()
        return filesystem_pb2.RemoveResponse()

    def ListDir(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import filesystem_pb2

        self._enter(context, "Filesystem.ListDir", request.path)
        real = self.guest.path(request.path)
        if not real.is_dir():
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such directory: {request.path}")
        base = "/" + request.path.strip("/")
        entries = [_entry(self.guest, f"{base.rstrip('/')}/{name}") for name in sorted(os.listdir(real))]
        return filesystem_pb2.ListDirResponse(entries=entries)


# ====================================================================== ProcessService


class Process(_Rpcs):
    def Start(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        from rayito.v1 import process_pb2

        config = request.process
        argv = [config.cmd, *config.args]
        script = config.args[-1] if len(config.args) >= 2 and config.args[-2] == "-c" else ""
        self._enter(context, "Process.Start",
                    f"tag={request.tag!r} user={request.user.username!r} timeout_ms={request.timeout_ms} "
                    f"kill_tree={request.kill_tree} envs={sorted(config.envs)} cmd={script or ' '.join(argv)!r}")
        proc = self.guest.start(argv, script, env=dict(config.envs), cwd=config.cwd, tag=request.tag,
                                timeout_ms=int(request.timeout_ms))
        yield process_pb2.ProcessEvent(start=process_pb2.StartEvent(pid=proc.pid))
        for kind, item in proc.events(context.is_active):
            if kind == "data":
                seq, out, err = item  # type: ignore[misc]
                # stdout and stderr are one oneof: a chunk is one or the other.
                data = process_pb2.DataEvent(stdout=out, seq=seq) if out else process_pb2.DataEvent(stderr=err, seq=seq)
                yield process_pb2.ProcessEvent(data=data)
            else:
                yield process_pb2.ProcessEvent(end=_end_event(proc))
        # A client that cancelled the stream (a background start) leaves the process running.

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import process_pb2

        self._enter(context, "Process.List")
        processes = [process_pb2.ProcessInfo(pid=pid, tag=proc.tag, config=process_pb2.ProcessConfig(cmd=proc.description))
                     for pid, proc in sorted(self.guest.processes.items()) if proc.running]
        return process_pb2.ListResponse(processes=processes)

    def SendSignal(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import process_pb2

        from .guest_process import signal_trees

        self._enter(context, "Process.SendSignal", f"pid={request.pid} signal={request.signal}")
        proc = self.guest.processes.get(int(request.pid))
        if proc is None or not proc.running:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no process {request.pid}")
        signal_trees([proc.pid], int(request.signal) or 9)
        return process_pb2.SendSignalResponse()


def _end_event(proc: Any) -> Any:
    from rayito.v1 import process_pb2

    if proc.timed_out:
        return process_pb2.EndEvent(exit_code=proc.exit_code or 124, exited=True, status="timeout",
                                    signal=proc.signal or 0)
    if proc.signal:
        return process_pb2.EndEvent(exit_code=proc.exit_code, exited=True, status="signaled", signal=proc.signal)
    return process_pb2.EndEvent(exit_code=proc.exit_code, exited=True, status="exited")


# ====================================================================== ConfigureService


class Configure(_Rpcs):
    def Configure(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import configure_pb2

        sections = [name for name in ("s3_mounts", "efs_volumes", "lifecycle_events", "telemetry_export", "secret_gateway")
                    if request.HasField(name)]
        routes = list(request.secret_gateway.routes)
        # Never the header values: they are the resolved secrets.
        self._enter(context, "Configure.Configure", f"sections={sections} routes=" + str(
            [(r.name, r.upstream, sorted(r.headers), [(a.method, a.path) for a in r.allow], r.rate_per_minute) for r in routes]))
        results = []
        for name in sections:
            section = getattr(configure_pb2, f"CONFIG_SECTION_{name.upper()}")
            if name != "secret_gateway":
                results.append(configure_pb2.SectionResult(section=section, code=configure_pb2.SECTION_CODE_UNSUPPORTED,
                                                           error_class="standin_unsupported"))
                continue
            self.guest.gateway.configure([
                Route(r.name, r.upstream, dict(r.headers), [(a.method, a.path) for a in r.allow], int(r.rate_per_minute))
                for r in routes])
            results.append(configure_pb2.SectionResult(section=section, code=configure_pb2.SECTION_CODE_APPLIED))
        self.guest.config_generation += 1
        return configure_pb2.ConfigureResponse(results=results, config_generation=self.guest.config_generation)

    def ConfigureStatus(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import configure_pb2, secret_gateway_pb2

        self._enter(context, "Configure.ConfigureStatus")
        routes = [secret_gateway_pb2.SecretGatewayRouteStatus(
            name=route.name, port=route.port, state=secret_gateway_pb2.SECRET_GATEWAY_ROUTE_STATE_LISTENING)
            for route in self.guest.gateway.routes()]
        return configure_pb2.ConfigureStatusResponse(secret_gateway=secret_gateway_pb2.SecretGatewayStatus(routes=routes))


# ====================================================================== NetworkService


class Network(_Rpcs):
    def UpdateNetwork(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        policy = request.policy
        self._enter(context, "Network.UpdateNetwork",
                    f"allow_out={list(policy.allow_out)} deny_out={list(policy.deny_out)} "
                    f"egress_proxy={bool(policy.egress_proxy.address)}")
        self.guest.network = {"allow_out": list(policy.allow_out), "deny_out": list(policy.deny_out),
                              "egress_proxy": bool(policy.egress_proxy.address)}
        return self._state()

    def GetNetwork(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._enter(context, "Network.GetNetwork")
        return self._state()

    def _state(self) -> Any:
        from rayito.v1 import network_pb2

        network = self.guest.network
        if network is None:
            # Before any UpdateNetwork: /run's policy (Q1, assumed: deny all out when the payload
            # says network.enforce, nothing otherwise).
            enforce = bool(((self.guest.payload or {}).get("network") or {}).get("enforce"))
            network = {"allow_out": [], "deny_out": ["0.0.0.0/0"] if enforce else [], "egress_proxy": False}
        return network_pb2.NetworkState(allow_out=network["allow_out"], deny_out=network["deny_out"],
                                        egress_proxy_configured=network["egress_proxy"],
                                        enforcement=network_pb2.EGRESS_ENFORCEMENT_GUEST_ROUTES)


# ====================================================================== LifecycleService


class Lifecycle_(_Rpcs):  # noqa: N801 - not vm_host.Lifecycle
    def SetTimeout(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        from rayito.v1 import lifecycle_pb2

        mode = lifecycle_pb2.TimeoutMode.Name(request.mode)
        self._enter(context, "Lifecycle.SetTimeout", f"timeout_ms={request.timeout_ms} mode={mode}")
        if request.mode not in (lifecycle_pb2.TIMEOUT_MODE_EXACT, lifecycle_pb2.TIMEOUT_MODE_AT_LEAST):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"mode {mode} is not EXACT or AT_LEAST")
        try:
            state = self.guest.set_timeout(int(request.timeout_ms), request.mode == lifecycle_pb2.TIMEOUT_MODE_EXACT)
        except GuestError as error:
            _abort(context, error)
        return lifecycle_proto(state)


# ====================================================================== CodeService


class Code(_Rpcs):
    def Execute(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        from rayito.v1 import code_pb2

        self._enter(context, "Code.Execute", repr(request.code[:200]))
        count = len(self.guest.calls("Code.Execute"))
        seq = 1
        yield code_pb2.ExecuteEvent(started=code_pb2.ExecutionStarted(execution_id=f"exec-{count}", execution_count=count), seq=seq)
        if request.code.strip() not in ("", "pass"):
            # No kernel: each cell is a fresh `python -c` in the VM's workdir (no state kept).
            try:
                done = subprocess.run([sys.executable, "-c", request.code], capture_output=True, text=True,
                                      cwd=self.guest.path((self.guest.payload or {}).get("workdir") or "/home/user"),
                                      timeout=(request.timeout_ms / 1000) if request.timeout_ms else 300)
            except subprocess.TimeoutExpired:
                seq += 1
                yield code_pb2.ExecuteEvent(error=code_pb2.ExecutionError(name="TimeoutError", value="execution timed out"), seq=seq)
            else:
                if done.stdout:
                    seq += 1
                    yield code_pb2.ExecuteEvent(stdout=code_pb2.OutputChunk(text=done.stdout), seq=seq)
                if done.returncode != 0:
                    lines = done.stderr.strip().splitlines() or ["error"]
                    name, _, value = lines[-1].partition(":")
                    seq += 1
                    yield code_pb2.ExecuteEvent(error=code_pb2.ExecutionError(name=name.strip(), value=value.strip(),
                                                                              traceback=lines), seq=seq)
                elif done.stderr:
                    seq += 1
                    yield code_pb2.ExecuteEvent(stderr=code_pb2.OutputChunk(text=done.stderr), seq=seq)
        seq += 1
        yield code_pb2.ExecuteEvent(end=code_pb2.ExecutionEnd(execution_count=count), seq=seq)
