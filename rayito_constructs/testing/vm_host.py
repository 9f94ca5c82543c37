"""The machine that runs the emulated MicroVMs: each VM's address, files, processes and state.

``MicrovmsBackend(host_vms=True)`` hands every VM it starts to a :class:`VmHost`. The VM gets an
endpoint of its own, a bare loopback IP (``127.x.y.z``: no scheme, no port, as the service gives a
bare hostname), and a :class:`Guest` that lives as long as the VM:

* a VM of an image **with rayd** (``create_image(rayd=True)``, the product's base) answers on its
  endpoint through the front (``front.py``): gRPC to a stand-in ``rayd`` (``rayd.py``) and HTTP/1.1
  to its agent host by ``x-aws-proxy-port``;
* a VM of an image **without rayd** answers nothing: its address and ports are bound but not
  listening, so a connection is refused (gRPC ``UNAVAILABLE``, as measured against an image
  without rayd: issue #33).

What happens to the guest follows the VM's true state in the backend (an observer on every
transition, ``lifecycle.Microvm.observer``): PENDING -> RUNNING delivers the ``runHookPayload``
(the ``/run`` hook); SUSPENDING closes the open connections; SUSPENDED freezes its processes
(``SIGSTOP``); the ``/resume`` hook's return thaws them (``SIGCONT``) and raises
``resume_generation``; TERMINATING ends them (``SIGKILL``) and stops answering. A ticker reads
every hosted VM's state 5 times a second, so the backend's lazily computed transitions (idle
suspension, maximum lifetime) happen on time, and enforces rayd's logical deadline
(``on_timeout=kill``: rayd exits with 124, the VM then ends as a VM whose PID 1 exited).

One machine hosts several VMs, so paths and ports are rewritten (every rewrite is listed in
docs/testing.md, and each VM keeps a list of its own in :attr:`Guest.rewrites`):

* every absolute VM path lives under ``<root>/<microvm id>/`` (:meth:`Guest.path`); the image's
  app folder is copied to ``<root>/<id>/opt/agents/app`` when the VM starts;
* in a command's text, ``/home/user``, ``/opt/agents`` and ``/tmp`` are rewritten to that root;
  ``bash -l`` loses its ``-l`` (a login shell would read this machine's profile);
* ``python3 /opt/agents/rayito/agent_host serve <host.json> --port N`` runs the installed
  product's agent host with this machine's Python, on a free local port in place of ``N``, with a
  copy of ``host.json`` whose VM paths are mapped and whose ``options.port`` (the app's port) is
  a free local port too (the host tells the app through ``port_env``);
* processes run as this machine's user (not uid 1000) with a clean environment: ``PATH`` (this
  Python's folder first), ``HOME`` (the mapped ``/home/user``), ``USER``, the platform's
  ``AWS_LAMBDA_MICROVM_IMAGE_NAME``/``_ARN``/``_VERSION`` and ``AWS_REGION``, the image's
  ``environmentVariables``, then the request's ``envs``.

It needs the real clock (processes run in real time): ``host_vms=True`` with a ``VirtualClock``
is refused.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import functools
import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .front import GuestFront
from .guest_error import GuestError
from .guest_process import GuestProcess, kill_trees, signal_trees, stop_trees
from .images import ImageRuntime
from .loopback import Loopback
from .rayd import serve
from .seams import ProductSeams
from .secret_gateway import SecretGateway

if TYPE_CHECKING:
    from .backend import MicrovmsBackend
    from .lifecycle import Microvm

#: The port the AWS proxy maps rayd's gRPC to (``x-aws-proxy-port: 8080``; the product's
#: ``DEFAULT_PORT``).
RAYD_PORT = 8080
#: The TLS front's port: what the product's client dials by default (``ENDPOINT_TLS_PORT``).
TLS_PORT = 443
#: How often the ticker reads every hosted VM's state.
TICK_SECONDS = 0.2
#: rayd's cap is ``/run + cap_s - 60 s`` (the product's ``LIFECYCLE_CAP_MARGIN_SECONDS``, "the
#: CAP_MARGIN of rayd-core", ``_fleet_base.rayd_cap``).
CAP_MARGIN_MS = 60_000
#: After a resume past its deadline, rayd waits this long for a client's ``SetTimeout`` before
#: acting (phase ``resume_grace``: the product's ``LIFECYCLE_RESUME_GRACE_SECONDS``).
RESUME_GRACE_MS = 30_000
#: rayd exits with this code at its deadline with ``on_timeout=kill`` (``LIFECYCLE_TIMEOUT_EXIT_CODE``;
#: the product reads ``Container Stopped with Exit Code: 124`` as "timed out"; measured Q63).
TIMEOUT_EXIT_CODE = 124
#: VM path prefixes rewritten in a command's text (and the VM paths of ``host.json``).
COMMAND_ROOTS = ("/home/user", "/opt/agents", "/tmp")
HOST_JSON_ROOTS = ("/home/user", "/opt/agents")
AGENT_HOST_VM_DIR = "/opt/agents/rayito/agent_host"
APP_VM_DIR = "/opt/agents/app"
#: Not copied from the image's app folder (what the product's default ``source.exclude`` leaves out).
APP_COPY_IGNORE = (".git", ".venv", "venv", "node_modules", "__pycache__", "*.pyc", ".rayito", ".env")
_COMMAND_PATH = re.compile(r"(?<![\w./-])(/home/user|/opt/agents|/tmp)(?=[/'\"\s;|&)]|$)")


@dataclass
class Lifecycle:
    """rayd's logical deadline (the payload's ``lifecycle`` block, moved by ``SetTimeout``)."""

    timeout_ms: int
    cap_ms: int
    deadline_ms: int
    on_timeout: str
    auto_resume: bool
    extensions: int = 0
    phase: str = "active"  # active | resume_grace | expired
    grace_until_ms: Optional[int] = None


@dataclass
class RpcRecord:
    time: float
    rpc: str
    detail: str
    token: str  # "ok", "missing", "bad", "-" (Health: not checked)


class Guest:
    """One VM as this machine runs it (see the module's docstring)."""

    def __init__(self, host: "VmHost", vm: "Microvm", endpoint: str, runtime: ImageRuntime,
                 sockets: list[Any]) -> None:
        self.host = host
        self.vm_id = vm.id
        self.endpoint = endpoint
        self.runtime = runtime
        self.memory_mib = vm.memory_mib
        self.image_arn = vm.image.arn
        self.image_name = vm.image.name
        self.image_version = vm.image_version
        self.image_env = dict((vm.version.request.get("environmentVariables") or {}))
        self.request = dict(vm.request)
        hooks = (vm.version.request.get("hooks") or {}).get("microvmHooks") or {}
        self.run_hook_enabled = hooks.get("run") == "ENABLED"
        self.root = host.root / vm.id
        self.booted_at = time.time()
        self._lock = threading.RLock()
        self.ready = threading.Event()
        self.payload: Optional[dict[str, Any]] = None
        self.ran_at: Optional[float] = None
        self.resume_generation = 0
        self.resumed_at: Optional[float] = None
        self.state = "PENDING"
        self.halted: Optional[str] = None
        self.frozen = False
        self.lifecycle: Optional[Lifecycle] = None
        self.network: Optional[dict[str, Any]] = None
        self.config_generation = 0
        self.ports: dict[int, int] = {}
        """VM port -> local port, for what the proxy can reach: the agent host (it binds 0.0.0.0)."""
        self.loopback_ports: dict[int, int] = {}
        """VM port -> local port, for what listens on the VM's loopback only (the app: the host
        polls it on 127.0.0.1, the proxy does not reach it)."""
        self.processes: dict[int, GuestProcess] = {}
        self.rpcs: list[RpcRecord] = []
        self.rewrites: list[tuple[str, str, str]] = []
        self.gateway = SecretGateway()
        self.rayd_port: Optional[int] = None
        self._server: Any = None
        self.front: Optional["GuestFront"] = None
        self.boot_error: Optional[BaseException] = None
        self._sockets = sockets
        if runtime.rayd:
            threading.Thread(target=self._boot, name=f"rayd-boot-{vm.id[-8:]}", daemon=True).start()

    # ------------------------------------------------------------------ boot and state

    def _boot(self) -> None:
        """rayd starts (PID 1): the files, the gRPC server, the front. Before ``/run`` it already
        answers ``Health`` without a ``sandbox_id`` (Q78)."""
        try:
            (self.root / "home/user").mkdir(parents=True, exist_ok=True)
            if self.runtime.app_dir is not None:
                shutil.copytree(self.runtime.app_dir, self.path(APP_VM_DIR), dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns(*APP_COPY_IGNORE))
                self.rewrites.append(("path", APP_VM_DIR, f"copy of {self.runtime.app_dir}"))
            with self._lock:
                if self.halted:
                    return
                self._server, self.rayd_port = serve(self)
                self.front = GuestFront(self, self._sockets)
        except Exception as exc:  # noqa: BLE001 - kept for the test to read; the VM answers nothing
            self.boot_error = exc
        finally:
            self.ready.set()

    def observe(self, vm: "Microvm", at: float, state: str) -> None:
        """A transition of the VM (called by the backend, under its lock: nothing here calls the
        backend back; the one wait is a suspend's, until the guest's processes are frozen, a few
        milliseconds, 5 s at most: a suspended VM runs nothing)."""
        with self._lock:
            previous, self.state = self.state, state
            if state == "RUNNING" and self.ran_at is None:
                self._run_hook(at)
            elif state == "PENDING" and vm.resumed:
                self._resume_hook(at)
            elif state == "SUSPENDED":
                self._freeze()
            elif state in ("TERMINATING", "TERMINATED") and previous not in ("TERMINATING", "TERMINATED"):
                self._halt_later(f"the VM is {state}")
        if state == "SUSPENDING" and self.front is not None:
            self.front.drop_connections()

    def _run_hook(self, at: float) -> None:
        """``/run``: rayd learns the token's hash, the labels, the user, the workdir and the
        lifecycle from ``runHookPayload`` (a VM run without one has no token: every RPC but
        Health is refused, Q4). An image whose run hook is off never gets it: its rayd never has a
        ``sandbox_id``, so the product's client never sees it ready."""
        self.ran_at = at
        if not self.run_hook_enabled:
            return
        raw = self.request.get("runHookPayload")
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {}
        self.payload = payload if isinstance(payload, dict) else {}
        block = self.payload.get("lifecycle")
        if isinstance(block, dict):
            run_ms = int(at * 1000)
            timeout_ms = int(block.get("timeout_s", 0)) * 1000
            self.lifecycle = Lifecycle(
                timeout_ms=timeout_ms,
                cap_ms=run_ms + int(block.get("cap_s", 0)) * 1000 - CAP_MARGIN_MS,
                deadline_ms=run_ms + timeout_ms,
                on_timeout=str(block.get("on_timeout", "kill")),
                auto_resume=bool(block.get("auto_resume", False)),
            )

    def _resume_hook(self, at: float) -> None:
        self.resume_generation += 1
        self.resumed_at = at
        self._thaw()
        lifecycle = self.lifecycle
        if lifecycle is not None and lifecycle.phase == "active" and lifecycle.deadline_ms <= at * 1000:
            # The deadline passed while frozen: rayd waits RESUME_GRACE for a client (Q5, assumed).
            lifecycle.phase = "resume_grace"
            lifecycle.grace_until_ms = int(at * 1000) + RESUME_GRACE_MS

    def sync(self) -> str:
        """Bring the VM's state up to date (the backend applies what is due) and return it."""
        status = self.host.backend.vm_status(self.vm_id)
        if status is None:
            return "TERMINATED"
        return status[0]

    def tick(self) -> None:
        status = self.host.backend.vm_status(self.vm_id)
        if status is None:
            self.halt("the VM is gone")
            return
        state, exited = status
        if exited:
            self.halt("its PID 1 exited")
            return
        if state in ("TERMINATING", "TERMINATED"):
            self.halt(f"the VM is {state}")
            return
        self._enforce_deadline(state)

    def _enforce_deadline(self, state: str) -> None:
        now_ms = int(time.time() * 1000)
        with self._lock:
            lifecycle = self.lifecycle
            if lifecycle is None or self.halted or state != "RUNNING":
                return
            if lifecycle.phase == "resume_grace":
                if lifecycle.grace_until_ms is not None and now_ms < lifecycle.grace_until_ms:
                    return
            elif lifecycle.phase != "active" or now_ms < lifecycle.deadline_ms:
                return
            if lifecycle.on_timeout != "kill":
                lifecycle.phase = "expired"  # pause mode: the client (or the idle policy) suspends
                return
        self.rayd_exit(TIMEOUT_EXIT_CODE, "rayd's deadline (on_timeout=kill)")

    def rayd_exit(self, code: int, why: str) -> None:
        """rayd (PID 1) exits: the endpoint stops answering at once and the service ends the VM
        as one whose app exited (``Container Stopped with Exit Code: <code>``, measured)."""
        self.halt(why)
        with contextlib.suppress(KeyError):
            self.host.backend.crash(self.vm_id, exit_code=code)

    # ------------------------------------------------------------------ processes

    def _roots(self) -> list[int]:
        return [pid for pid, proc in self.processes.items() if proc.running]

    def _freeze(self) -> None:
        if not self.frozen:
            self.frozen = True
            stop_trees(self._roots())

    def _thaw(self) -> None:
        if self.frozen:
            self.frozen = False
            signal_trees(self._roots(), signal.SIGCONT)

    def _halt_later(self, why: str) -> None:
        threading.Thread(target=self.halt, args=(why,), name=f"rayd-halt-{self.vm_id[-8:]}", daemon=True).start()

    def halt(self, why: str) -> None:
        """Everything the VM runs ends: processes (the whole trees), the gateway, rayd, the front."""
        with self._lock:
            if self.halted:
                return
            self.halted = why
            roots = self._roots()
            server, front = self._server, self.front
        kill_trees(roots)
        self.gateway.close()
        if front is not None:
            front.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        if server is not None:
            server.stop(0)
        self.ready.set()

    def start(self, argv: list[str], script: str, *, env: dict[str, str], cwd: str, tag: str,
              timeout_ms: int) -> GuestProcess:
        """Start what ``ProcessService.Start`` asks for (``argv`` = ``cmd`` + ``args``; ``script``
        the ``-c`` text, if any), with the rewrites of the module's docstring."""
        agent_host = _agent_host_command(script)
        env = self._environment(env)
        workdir = self.path(cwd or (self.payload or {}).get("workdir") or "/home/user")
        if agent_host is not None:
            command = self._agent_host(*agent_host)
            description = f"agent host ({script})"
        else:
            command = self._rewritten(argv, script)
            description = script or " ".join(argv)
        log = self.root / "var/log/rayd" / f"{int(time.time() * 1000)}-{len(self.processes)}.log"
        proc = GuestProcess(command, env=env, cwd=workdir, log=log, tag=tag, timeout_ms=timeout_ms,
                            description=description)
        with self._lock:
            self.processes[proc.pid] = proc
            frozen, halted = self.frozen, self.halted
        if frozen:
            stop_trees([proc.pid])
        if halted:
            kill_trees([proc.pid])
        return proc

    def _environment(self, requested: dict[str, str]) -> dict[str, str]:
        payload = self.payload or {}
        user = str(payload.get("user") or "user")
        env = {
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")]),
            "HOME": str(self.path("/home/user")),
            "USER": user,
            "LOGNAME": user,
            "LANG": "C.UTF-8",
            "AWS_LAMBDA_MICROVM_IMAGE_NAME": self.image_name,
            "AWS_LAMBDA_MICROVM_IMAGE_ARN": self.image_arn,
            "AWS_LAMBDA_MICROVM_IMAGE_VERSION": self.image_version,
            "AWS_REGION": self.host.backend.region,
        }
        env.update({str(k): str(v) for k, v in self.image_env.items()})
        env.update(requested)
        return env

    def _rewritten(self, argv: list[str], script: str) -> list[str]:
        args = [a for a in argv if a != "-l"] if argv and argv[0].endswith("bash") else list(argv)
        if script:
            mapped = self.map_command(script)
            if mapped != script:
                self.rewrites.append(("command", script, mapped))
            args = [mapped if a == script else a for a in args]
        return args

    def map_command(self, text: str) -> str:
        return _COMMAND_PATH.sub(lambda m: str(self.root) + m.group(1), text)

    def _agent_host(self, config_path: str, port: int) -> list[str]:
        """The product's agent host, as the module's docstring says."""
        document = json.loads(self.path(config_path).read_text(encoding="utf-8"))
        document = _map_strings(document, lambda s: str(self.path(s)) if _under(s, HOST_JSON_ROOTS) else s)
        options = document.get("options")
        if isinstance(options, dict) and isinstance(options.get("port"), int):
            app_port = self.host.loopback.local_port()
            self.loopback_ports[int(options["port"])] = app_port
            self.rewrites.append(("port", f"app {options['port']}", str(app_port)))
            options["port"] = app_port
        local = self.path(config_path + ".standin.json")
        local.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        self.rewrites.append(("path", config_path, str(local)))
        host_port = self.host.loopback.local_port()
        self.ports[port] = host_port
        self.rewrites.append(("port", f"agent host {port}", str(host_port)))
        return [sys.executable, str(agent_host_source()), "serve", str(local), "--port", str(host_port)]

    # ------------------------------------------------------------------ files and token

    def path(self, vm_path: str) -> Path:
        """Where a VM path lives on this machine (``..`` cannot leave the VM's root)."""
        normal = posixpath.normpath("/" + str(vm_path).lstrip("/"))
        return self.root / normal.lstrip("/")

    def token_state(self, token: Optional[str]) -> str:
        """``ok`` when ``token`` (base64url, the raw fleet token) hashes to the payload's
        ``token_sha256`` (the product's rule, ``_payload.access_token_sha256``), else
        ``missing`` or ``bad``."""
        if not token:
            return "missing"
        expected = (self.payload or {}).get("token_sha256")
        if not expected:
            return "bad"
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return "bad"
        return "ok" if hashlib.sha256(raw).hexdigest() == expected else "bad"

    def record(self, rpc: str, detail: str, token: str) -> RpcRecord:
        record = RpcRecord(time.time(), rpc, detail, token)
        with self._lock:
            self.rpcs.append(record)
        return record

    def calls(self, rpc: Optional[str] = None) -> list[RpcRecord]:
        with self._lock:
            return [r for r in self.rpcs if rpc is None or r.rpc == rpc]

    # ------------------------------------------------------------------ lifecycle RPC

    def set_timeout(self, timeout_ms: int, exact: bool) -> Lifecycle:
        """``LifecycleService.SetTimeout`` with the errors the product expects
        (``_lifecycle_base.translate_set_timeout_error``)."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            lifecycle = self.lifecycle
            if lifecycle is None:
                raise GuestError("FAILED_PRECONDITION", "lifecycle_unmanaged")
            if timeout_ms <= 0:
                raise GuestError("INVALID_ARGUMENT", "timeout_ms must be > 0")
            wanted = now_ms + timeout_ms
            if wanted > lifecycle.cap_ms:
                raise GuestError("INVALID_ARGUMENT",
                                 f"timeout beyond cap: deadline_unix_ms={wanted} cap_unix_ms={lifecycle.cap_ms}")
            deadline = wanted if exact else max(wanted, lifecycle.deadline_ms if lifecycle.phase == "active" else 0)
            if deadline != lifecycle.deadline_ms or lifecycle.phase != "active":
                lifecycle.extensions += 1
            lifecycle.deadline_ms, lifecycle.timeout_ms = deadline, timeout_ms
            lifecycle.phase, lifecycle.grace_until_ms = "active", None
            return Lifecycle(**lifecycle.__dict__)


def _agent_host_command(script: str) -> Optional[tuple[str, int]]:
    """``(host.json path, port)`` when ``script`` starts the agent host in serve mode
    (``exec <python> /opt/agents/rayito/agent_host serve <host.json> --port N``)."""
    try:
        words = shlex.split(script)
    except ValueError:
        return None
    if words[:1] == ["exec"]:
        words = words[1:]
    if len(words) == 6 and words[1] == AGENT_HOST_VM_DIR and words[2] == "serve" and words[4] == "--port":
        try:
            return words[3], int(words[5])
        except ValueError:
            return None
    return None


def _under(value: str, roots: tuple[str, ...]) -> bool:
    return any(value == root or value.startswith(root + "/") for root in roots)


def _map_strings(value: Any, mapper: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return mapper(value)
    if isinstance(value, list):
        return [_map_strings(item, mapper) for item in value]
    if isinstance(value, dict):
        return {key: _map_strings(item, mapper) for key, item in value.items()}
    return value


def agent_host_source() -> Path:
    """The installed product's agent host (``rayito/_agent/_runner/agent_host``)."""
    import rayito

    return Path(rayito.__file__).resolve().parent / "_agent" / "_runner" / "agent_host"


# ====================================================================== the machine

_hosts: "weakref.WeakSet[VmHost]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - a test process that never closed its emulator
    for host in list(_hosts):
        host.close()


class VmHost:
    """The VMs of one emulator on this machine. ``tls=True`` adds the TLS front on
    ``<endpoint>:443`` (root, or a lowered ``net.ipv4.ip_unprivileged_port_start``)."""

    def __init__(self, backend: "MicrovmsBackend", *, tls: bool = False, root: Optional[Path] = None) -> None:
        self.backend = backend
        self.tls = tls
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="rayd-vms-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.loopback = Loopback()
        self._lock = threading.Lock()
        self._guests: dict[str, Guest] = {}
        self._closed = False
        self.ca: Any = None
        ports: tuple[int, ...] = (0, TLS_PORT) if tls else (0,)
        # The plaintext port every VM shares: the first address's, bound here (port 0), so the
        # product's TransportSettings(port=...) can be made before any VM exists.
        try:
            address, sockets = self.loopback.address(ports, listen=(True,) * len(ports))
        except BaseException:
            if self._own_root:  # a front that cannot bind 443 leaves nothing behind
                shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.plain_port = sockets[0].getsockname()[1]
        self._spare: Optional[tuple[str, list[Any]]] = (address, sockets)
        if tls:
            from .pki import TestCa

            self.ca = TestCa(self.root / "pki")
        self._ticker = threading.Thread(target=self._tick, name="rayd-vm-host", daemon=True)
        self._ticker.start()
        _hosts.add(self)

    @property
    def ca_file(self) -> Optional[Path]:
        """The test CA's certificate (TLS front only): point ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``
        and ``SSL_CERT_FILE`` at it."""
        return None if self.ca is None else self.ca.ca_file

    def attach(self, vm: "Microvm", runtime: ImageRuntime) -> str:
        """Give a new VM its address and its guest; returns its endpoint (a bare IP). Called by
        RunMicrovm under the backend's lock: it binds sockets and starts a thread, nothing more."""
        listens = runtime.rayd
        with self._lock:
            if self._closed:
                raise RuntimeError("the VM host is closed")
            spare, self._spare = self._spare, None
        if spare is not None and listens:
            address, sockets = spare
        else:
            if spare is not None:
                for sock in spare[1]:
                    sock.close()
            ports = (self.plain_port, TLS_PORT) if self.tls else (self.plain_port,)
            address, sockets = self.loopback.address(ports, listen=(listens,) * len(ports))
        guest = Guest(self, vm, address, runtime, sockets)
        with self._lock:
            self._guests[vm.id] = guest
        vm.observer = guest.observe
        return address

    def guest(self, microvm_id: str) -> Guest:
        with self._lock:
            return self._guests[microvm_id]

    def guests(self) -> list[Guest]:
        with self._lock:
            return list(self._guests.values())

    def _tick(self) -> None:
        while not self._closed:
            for guest in self.guests():
                if guest.halted is None:
                    with contextlib.suppress(Exception):  # the ticker must outlive one guest's trouble
                        guest.tick()
            time.sleep(TICK_SECONDS)

    @functools.cached_property
    def seams(self) -> Any:
        """How the product's client reaches these VMs in-process (``seams.ProductSeams``)."""
        return ProductSeams(self)

    def close(self) -> None:
        """End every VM's processes and servers; remove the files (unless ``root`` was given)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            guests = list(self._guests.values())
            spare, self._spare = self._spare, None
        for guest in guests:
            guest.halt("the emulator stopped")
        if spare is not None:
            for sock in spare[1]:
                sock.close()
        if self.ca is not None:
            self.ca.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        _hosts.discard(self)
