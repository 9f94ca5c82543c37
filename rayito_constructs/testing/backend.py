"""The service's state and rules, callable directly (no HTTP): ``MicrovmsBackend``.

    backend = MicrovmsBackend(clock=VirtualClock())
    image = backend.create_image("mi-agente")
    vm = backend.call("RunMicrovm", {"imageIdentifier": image})

The wire (``_wire.py`` and ``server.py``) turns HTTP requests into :meth:`MicrovmsBackend.call`;
the behaviours measured on the service each have a home of their own: ``throttling.py`` (held
bursts, 429), ``consistency.py`` (late reads, page tokens), ``images.py`` (versions),
``lifecycle.py`` (states and timings), ``faults.py``; their defaults and the measurements behind
them are in ``measured.py``.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import copy
import datetime as dt
import hashlib
import json
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from . import _wire, measured
from .clock import RealClock, VirtualClock
from .consistency import Consistency, page, page_token, read_page_token
from .exceptions import WireError, conflict, internal, not_found, validation
from .faults import Fault, Faults
from .images import NO_RAYD, PLACEHOLDER_REQUEST, Image, ImageRuntime, ImageVersion, product_hooks, version_number
from .lifecycle import ENDED, LIVE, Microvm, advance
from .measured import Timings
from .throttling import RateLimiter

IMPLEMENTED = frozenset(
    {
        "RunMicrovm",
        "ListMicrovms",
        "GetMicrovm",
        "SuspendMicrovm",
        "ResumeMicrovm",
        "TerminateMicrovm",
        "CreateMicrovmAuthToken",
        "CreateMicrovmImage",
        "UpdateMicrovmImage",
        "DeleteMicrovmImage",
        "GetMicrovmImage",
        "ListMicrovmImages",
        "GetMicrovmImageVersion",
        "ListMicrovmImageVersions",
        "ListManagedMicrovmImages",
        "ListManagedMicrovmImageVersions",
        "ListMicrovmImageBuilds",
        "GetMicrovmImageBuild",
        "UpdateMicrovmImageVersion",
        "DeleteMicrovmImageVersion",
        "TagResource",
        "UntagResource",
        "ListTags",
    }
)
#: Operations IAM authorizes on ``*`` (GT §1): List* [docs], CreateMicrovmImage [M 2026-10-02] Q114.
_ON_ANY_RESOURCE = frozenset({"ListMicrovms", "ListMicrovmImages", "ListManagedMicrovmImages",
                              "ListManagedMicrovmImageVersions", "CreateMicrovmImage"})
MANAGED_CONNECTORS = ("ALL_INGRESS", "NO_INGRESS", "SHELL_INGRESS", "INTERNET_EGRESS", "HTTP_INGRESS")
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]/.+$")
_MAJOR = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the service saw it (``MicrovmsBackend.requests``, ``subscribe``)."""

    time: float
    operation: str
    caller: Optional[str]
    status: int
    error: Optional[str]
    microvm_id: Optional[str]
    client_token: Optional[str]
    held_seconds: float


def _rayd_deadline(params: Mapping[str, Any], version: Mapping[str, Any], run_at: float) -> Optional[float]:
    """When the product's rayd would end a VM not hosted here: its run payload's logical deadline
    (``lifecycle.timeout_s`` with ``on_timeout="kill"``, from the ``/run`` hook, when it runs), on
    an image whose run hook is on."""
    if ((version.get("hooks") or {}).get("microvmHooks") or {}).get("run") != "ENABLED":
        return None
    try:
        lifecycle = json.loads(params.get("runHookPayload") or "{}").get("lifecycle")
    except (ValueError, AttributeError):
        return None
    if not isinstance(lifecycle, dict) or lifecycle.get("on_timeout") != "kill":
        return None
    timeout = lifecycle.get("timeout_s")
    return run_at + float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None


class MicrovmsBackend:
    """A Lambda MicroVMs account in one region: images, versions, MicroVMs, quotas and faults.

    :param clock: ``RealClock()`` (default) or ``VirtualClock()``.
    :param region: Default: ``us-east-1``.
    :param account_id: Default: ``123456789012``.
    :param profile: ``"measured"`` (default: as measured on the service) or ``"documented"``
        (strictly as documented: 429 at once above a quota, 409 for suspend/resume outside
        RUNNING/SUSPENDED, 409 for RunMicrovm while the image is CREATING/UPDATING). See
        ``measured.Profile``.
    :param pending_seconds: PENDING -> RUNNING. Default: 2.0 (measured first 200, p50 1.85 s).
    :param fresh_launch_seconds: PENDING -> RUNNING for the first launches of a freshly published
        version, drawn from this range. Default: (26, 65) (measured).
    :param fresh_launches: how many first launches of a fresh version are slow. Default: 5.
    :param suspending_seconds: SUSPENDING -> SUSPENDED. Default: 1.4 (measured).
    :param resume_seconds: ResumeMicrovm -> the VM serves (SUSPENDED meanwhile). Default: 1.2 (measured).
    :param resume_pending_seconds: then PENDING (serving) until RUNNING. Default: 0.5 (measured:
        GetMicrovm said PENDING 0.1-0.5 s after the ``/resume`` hook returned).
    :param terminating_seconds: TERMINATING -> TERMINATED. Default: 3.
    :param terminated_linger_seconds: how long TERMINATED VMs stay listed. Default: 1200 (measured
        "at least about 20 minutes").
    :param app_exit_report_seconds: how long a VM whose app exited still reads RUNNING. Default: 15.
    :param image_build_seconds: CREATING/UPDATING while a version builds. Default: 180.
    :param consistency_seconds: how late a read may be (drawn per read). Default: 0.5 (measured).
    :param new_vms_listed_late: a VM started within a read's lag is missing from that list.
        Default: True (eventual consistency); False lists new VMs at once, with late states.
    :param hold_seconds: how long a request above the documented rate is held. Default: the
        profile's (measured 1.0; documented 0, never held).
    :param memory_quota_mib: account memory quota over live VMs. Default: by ``region``, 1,048,576
        (1,024 GB) in us-east-1, us-east-2, us-west-2 and ap-northeast-1, 409,600 (400 GB)
        elsewhere (documented). An explicit value wins.
    :param suspended_counts_toward_quota: Default: True (documented: SUSPENDED VMs count).
    :param rate_limits: ``{operation: (rate_per_second, burst)}`` over the documented defaults;
        ``None`` as a value turns an operation's limit off; ``rate_limits=False`` turns them off.
    :param client_token_ttl_seconds: how long a RunMicrovm ``clientToken`` is remembered, even after
        its VM is gone. Default: None (for the emulator's lifetime; the service's window is not
        documented).
    :param seed: seeds ids, fresh-launch times, late reads and fault probabilities. Default: random.
    :param request_log_size: how many requests ``requests`` keeps. Default: 100,000.
    :param host_vms: run the VMs on this machine (``vm_host.py``): each VM's endpoint is a loopback
        IP of its own; a VM of an image made with ``create_image(rayd=True)`` answers there with a
        stand-in ``rayd`` and the product's agent host, any other VM answers nothing. Needs the
        real clock. Default: False (endpoints are hostnames nobody answers on, nothing runs).
    :param tls_front: with ``host_vms``, also serve TLS on ``<endpoint>:443`` (needs root or a
        lowered ``net.ipv4.ip_unprivileged_port_start``), for the product's unmodified CLI.
    """

    def __init__(
        self,
        *,
        clock: Optional[RealClock | VirtualClock] = None,
        region: str = "us-east-1",
        account_id: str = "123456789012",
        profile: str | measured.Profile = "measured",
        pending_seconds: float = measured.PENDING_SECONDS,
        fresh_launch_seconds: tuple[float, float] = measured.FRESH_VERSION_LAUNCH_SECONDS,
        fresh_launches: int = measured.FRESH_VERSION_LAUNCHES,
        suspending_seconds: float = measured.SUSPENDING_SECONDS,
        resume_seconds: float = measured.RESUME_SECONDS,
        resume_pending_seconds: float = measured.RESUME_PENDING_SECONDS,
        terminating_seconds: float = measured.TERMINATING_SECONDS,
        terminated_linger_seconds: float = measured.TERMINATED_LINGER_SECONDS,
        app_exit_report_seconds: float = measured.APP_EXIT_REPORT_SECONDS,
        image_build_seconds: float = measured.IMAGE_BUILD_SECONDS,
        consistency_seconds: float = measured.CONSISTENCY_SECONDS,
        new_vms_listed_late: bool = True,
        hold_seconds: Optional[float] = None,
        memory_quota_mib: Optional[int] = None,
        suspended_counts_toward_quota: bool = True,
        rate_limits: Mapping[str, Optional[tuple[float, float]]] | bool = True,
        client_token_ttl_seconds: Optional[float] = None,
        seed: Optional[int] = None,
        request_log_size: int = 100_000,
        host_vms: bool = False,
        tls_front: bool = False,
    ) -> None:
        self.clock = clock or RealClock()
        if tls_front and not host_vms:
            raise ValueError("tls_front=True needs host_vms=True (the front is the hosted VMs' endpoint)")
        if host_vms and not isinstance(self.clock, RealClock):
            raise ValueError("host_vms=True runs real processes (the stand-in rayd, the agent host) in real time: "
                             "it needs RealClock, not VirtualClock")
        self.host_vms = host_vms
        self.tls_front = tls_front
        self._vm_host: Any = None
        self._auth_tokens: dict[str, tuple[str, float, tuple[Any, ...]]] = {}
        self.region = region
        self.account_id = account_id
        chosen = measured.profile(profile)
        if hold_seconds is not None:
            if not isinstance(hold_seconds, (int, float)) or hold_seconds != hold_seconds or not 0 <= hold_seconds <= 60:
                raise ValueError(f"hold_seconds: {hold_seconds!r} is not between 0 and 60")
            chosen = chosen.but(hold_seconds=float(hold_seconds))
        self.profile = chosen
        if not isinstance(fresh_launches, int) or fresh_launches < 0:
            raise ValueError(f"fresh_launches: {fresh_launches!r} must be a whole number >= 0")
        self.timings = Timings(
            pending=pending_seconds,
            fresh_launch=tuple(fresh_launch_seconds),  # type: ignore[arg-type]
            fresh_launches=fresh_launches,
            suspending=suspending_seconds,
            resume=resume_seconds,
            resume_pending=resume_pending_seconds,
            terminating=terminating_seconds,
            linger=terminated_linger_seconds,
            app_exit_report=app_exit_report_seconds,
            image_build=image_build_seconds,
        )
        self.timings.check()
        if memory_quota_mib is None:
            memory_quota_mib = measured.memory_quota_mib(region)
        if not isinstance(memory_quota_mib, int) or memory_quota_mib < 0:
            raise ValueError(f"memory_quota_mib: {memory_quota_mib!r} must be a whole number of MiB >= 0")
        self.memory_quota_mib = memory_quota_mib
        self.suspended_counts_toward_quota = suspended_counts_toward_quota
        self.client_token_ttl_seconds = client_token_ttl_seconds
        self._consistency = Consistency(consistency_seconds, seed, new_vms_listed_late=new_vms_listed_late)
        self._limiter = RateLimiter(self.profile, rate_limits)
        self._faults = Faults(seed)
        self._rng = random.Random(seed)
        self._launch_rng = random.Random(None if seed is None else seed * 13 + 5)
        self._lock = threading.RLock()
        self._images: dict[str, Image] = {}
        self._vms: dict[str, Microvm] = {}
        # VMs still listed, each list sorted by (startedAt, id): the key page tokens point into.
        self._by_image: dict[str, list[Microvm]] = {}
        self._listed: list[Microvm] = []
        self._ever: list[Microvm] = []
        self._pruned_at = float("-inf")
        self._memory_upper = 0
        self._tokens: dict[str, tuple[str, Microvm, float]] = {}
        self._image_tokens: dict[str, tuple[str, str]] = {}
        self._build_runtimes: dict[str, ImageRuntime] = {}
        self._subscribers: list[Callable[[RequestRecord], None]] = []
        self.requests: collections.deque[RequestRecord] = collections.deque(maxlen=request_log_size)
        """The last requests answered, oldest first (``request_log_size`` of them)."""
        self.calls: dict[str, int] = {}
        """Requests answered, by operation (throttled ones included)."""
        self.throttled: dict[str, int] = {}
        """429s answered, by operation."""
        self.held: dict[str, int] = {}
        """Requests held (slowed down) above the documented rate, by operation."""

    # ================================================================== configuration

    @property
    def pending_seconds(self) -> float:
        return self.timings.pending

    @pending_seconds.setter
    def pending_seconds(self, value: float) -> None:
        self._set_timing("pending", value)

    @property
    def suspending_seconds(self) -> float:
        return self.timings.suspending

    @suspending_seconds.setter
    def suspending_seconds(self, value: float) -> None:
        self._set_timing("suspending", value)

    @property
    def terminating_seconds(self) -> float:
        return self.timings.terminating

    @terminating_seconds.setter
    def terminating_seconds(self, value: float) -> None:
        self._set_timing("terminating", value)

    @property
    def terminated_linger_seconds(self) -> float:
        return self.timings.linger

    @terminated_linger_seconds.setter
    def terminated_linger_seconds(self, value: float) -> None:
        self._set_timing("linger", value)

    @property
    def image_build_seconds(self) -> float:
        return self.timings.image_build

    @image_build_seconds.setter
    def image_build_seconds(self, value: float) -> None:
        self._set_timing("image_build", value)

    def _set_timing(self, name: str, value: float) -> None:
        with self._lock:
            old = getattr(self.timings, name)
            setattr(self.timings, name, value)
            try:
                self.timings.check()
            except ValueError:
                setattr(self.timings, name, old)
                raise

    @property
    def stale_seconds(self) -> float:
        """Every read is at least this late (on top of ``consistency_seconds``)."""
        return self._consistency.stale_seconds

    @stale_seconds.setter
    def stale_seconds(self, value: float) -> None:
        with self._lock:
            self._consistency = _replace_consistency(self._consistency, stale_seconds=value)

    @property
    def new_vms_listed_late(self) -> bool:
        """Whether a VM started within a read's lag is missing from that list."""
        return self._consistency.new_vms_listed_late

    @new_vms_listed_late.setter
    def new_vms_listed_late(self, value: bool) -> None:
        with self._lock:
            self._consistency.new_vms_listed_late = bool(value)

    @property
    def consistency_seconds(self) -> float:
        """How late a read may be, drawn per read (0: every read is current)."""
        return self._consistency.window

    @consistency_seconds.setter
    def consistency_seconds(self, value: float) -> None:
        with self._lock:
            self._consistency = _replace_consistency(self._consistency, window=value)

    def set_rate_limit(self, operation: str, rate: float, burst: float, *, surge: Optional[float] = None) -> None:
        """Change one operation's limit now (a throttling storm, an applied quota). ``surge``: how
        many requests above it may be held at once (default: the profile's, and then the
        profile's unheld slack too: twice ``burst`` answered at once when measured; given
        explicitly, exactly ``burst`` is answered at once and ``surge=0`` is a 429 right above it)."""
        with self._lock:
            self._limiter.set_limit(operation, rate, burst, surge)

    def remove_rate_limit(self, operation: str) -> None:
        with self._lock:
            self._limiter.remove_limit(operation)

    def subscribe(self, callback: Callable[[RequestRecord], None]) -> None:
        """Call ``callback(record)`` after every request (from the thread that made it)."""
        with self._lock:
            self._subscribers.append(callback)

    # ================================================================== Python API for tests

    def image_arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account_id}:microvm-image:{name}"

    def create_image(self, name: str, memory_mib: int = 2048, *, version: str = "1.0", fresh: bool = False,
                     rayd: bool = False, hooks: Any = None, app_dir: Any = None,
                     environment: Optional[Mapping[str, str]] = None) -> str:
        """Create an image with an ACTIVE version right away; returns its ARN. ``fresh=True``: its
        first launches are slow, as those of a freshly published version (default: an image
        published long ago, whose first launches are behind it).

        What its VMs run: ``rayd=True`` is the product's base (rayd as PID 1, every hook ENABLED
        unless ``hooks`` says otherwise; needs ``host_vms=True``), with ``app_dir`` (a folder) as
        its ``/opt/agents/app``. ``hooks``: the API's ``hooks`` member (None: the product's hooks
        with ``rayd``, none without; True: the product's; False: none). ``environment``: its
        ``environmentVariables``."""
        _check_memory(memory_mib)
        runtime, request = self._image_contents(memory_mib, rayd, hooks, app_dir, environment)
        now = self.clock.now()
        with self._lock:
            existing = self._images.get(name)
            if existing is not None and not existing.gone(now):
                raise ValueError(f"image {name!r} already exists")
            image = Image(name, self.image_arn(name), now, busy_until=now)
            image.add_version(now, request, memory_mib, 0.0, fresh=fresh, version=version, runtime=runtime)
            self._images[name] = image
            return image.arn

    def _image_contents(self, memory_mib: int, rayd: bool, hooks: Any, app_dir: Any,
                        environment: Optional[Mapping[str, str]]) -> tuple[ImageRuntime, dict[str, Any]]:
        if rayd and not self.host_vms:
            raise ValueError("rayd=True: a VM that runs rayd needs an emulator made with host_vms=True")
        if app_dir is not None:
            import pathlib

            app_dir = pathlib.Path(app_dir).resolve()
            if not app_dir.is_dir():
                raise ValueError(f"app_dir: {app_dir} is not a folder")
        request = dict(PLACEHOLDER_REQUEST, resources=[{"minimumMemoryInMiB": memory_mib}])
        if hooks is True or (hooks is None and rayd):
            hooks = product_hooks()
        if hooks:
            request["hooks"] = copy.deepcopy(dict(hooks))
        if environment:
            request["environmentVariables"] = {str(k): str(v) for k, v in environment.items()}
        return (ImageRuntime(rayd=True, app_dir=app_dir) if rayd else
                ImageRuntime(app_dir=app_dir) if app_dir is not None else NO_RAYD), request

    def builds_run(self, name: str, *, rayd: bool = True, app_dir: Any = None) -> None:
        """What the versions of image ``name`` built through the API (CreateMicrovmImage,
        UpdateMicrovmImage) run from now on. The emulator cannot read a build's code artifact (an
        S3 URI), so a test says what it holds: the product's agent image (``rayito agent build``,
        ``deploy``) is its base's rayd with the project as ``/opt/agents/app``. Without it such a
        version runs nothing (its endpoint answers nothing), as before."""
        runtime, _ = self._image_contents(2048, rayd, None, app_dir, None)
        with self._lock:
            self._build_runtimes[name] = runtime

    def has_image(self, name: str) -> bool:
        with self._lock:
            image = self._images.get(name)
            return image is not None and not image.gone(self.clock.now())

    def publish_version(self, name: str, version: Optional[str] = None, *, memory_mib: Optional[int] = None,
                        fresh: bool = True, build_seconds: float = 0.0, rayd: Optional[bool] = None,
                        hooks: Any = None, app_dir: Any = None,
                        environment: Optional[Mapping[str, str]] = None) -> str:
        """A deploy published a new version of image ``name``: ACTIVE once built (``build_seconds``,
        default at once), the latest, so new VMs run it; its first launches are slow (``fresh``).
        What it runs is :meth:`create_image`'s (``rayd``, ``hooks``, ``app_dir``,
        ``environment``); ``rayd=None`` keeps the latest version's runtime and hooks. Returns the
        version."""
        now = self.clock.now()
        with self._lock:
            image = self._image_by_name(name, now)
            latest = image.live_versions(now)
            memory = memory_mib or (latest[-1].memory_mib if latest else 2048)
            _check_memory(memory)
            if version is not None and version in image.versions:
                raise ValueError(f"image {name!r} already has a version {version!r}")
            previous = latest[-1].runtime if latest else NO_RAYD
            if rayd is None:
                rayd = previous.rayd
                app_dir = previous.app_dir if app_dir is None else app_dir
                if hooks is None and latest:  # the same image, rebuilt: its hooks too
                    hooks = latest[-1].request.get("hooks") or False
            runtime, request = self._image_contents(memory, rayd, hooks, app_dir, environment)
            made = image.add_version(now, request, memory, build_seconds, fresh=fresh, version=version, runtime=runtime)
            if build_seconds:
                image.busy_until, image.busy_since_create = now + build_seconds, False
            return made.version

    @property
    def vm_host(self) -> Any:
        """The machine the VMs run on (``vm_host.VmHost``; ``host_vms=True`` only, else None),
        started on first use: ``vm_host.seams`` are the product's seams set to reach it,
        ``vm_host.guest(id)`` one VM's processes, files, RPCs and rewrites."""
        if not self.host_vms:
            return None
        with self._lock:
            if self._vm_host is None:
                from .vm_host import VmHost

                self._vm_host = VmHost(self, tls=self.tls_front)
            return self._vm_host

    def vm_status(self, microvm_id: str) -> Optional[tuple[str, bool]]:
        """The true state (applying what is due) and whether its app (PID 1) has exited; None
        when the VM is unknown or gone. For ``vm_host.py``."""
        with self._lock:
            now = self.clock.now()
            vm = self._current(microvm_id, now)
            if vm is None or self._gone(vm, now):
                return None
            return vm.state, vm.exit_at is not None and vm.exit_at <= now

    def _current(self, microvm_id: str, now: float) -> Optional[Microvm]:
        """The VM with what is due at ``now`` applied (hold the lock); None when never known."""
        vm = self._vms.get(microvm_id)
        if vm is not None:
            advance(vm, now, self.timings)
        return vm

    def auth_token_allows(self, microvm_id: str, token: Optional[str], port: int) -> bool:
        """Whether the proxy lets ``token`` (``x-aws-proxy-auth``) reach ``port`` of the VM: minted
        by CreateMicrovmAuthToken for it, unexpired, the port in its ``allowedPorts``."""
        with self._lock:
            minted = self._auth_tokens.get(token or "")
            if minted is None:
                return False
            owner, expires, ports = minted
            if owner != microvm_id or self.clock.now() >= expires:
                return False
            return any(_port_allowed(spec, port) for spec in ports)

    def close(self) -> None:
        """End what runs on this machine for the emulated VMs (``host_vms``); the state stays."""
        with self._lock:
            host, self._vm_host = self._vm_host, None
        if host is not None:
            host.close()

    def inject(self, operation: str, kind: str, **options: Any) -> Fault:
        """Arm a fault on an operation; see :class:`Fault`. Returns it (``remove_fault`` disarms)."""
        fault = Fault(operation=operation, kind=kind, **options)
        with self._lock:
            return self._faults.arm(fault)

    def remove_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.disarm(fault)

    def crash(self, microvm_id: str, reason: Optional[str] = None, after_seconds: float = 0.0, *, exit_code: int = 1) -> None:
        """The VM's app exits ``after_seconds`` from now: its endpoint answers 502 at once, GetMicrovm
        reads RUNNING for ``app_exit_report_seconds`` more, then TERMINATING/TERMINATED with
        ``reason`` (default the measured ``Container Stopped with Exit Code: <exit_code>``)."""
        if after_seconds != after_seconds or after_seconds < 0:
            raise ValueError(f"after_seconds: {after_seconds!r} is not a number of seconds >= 0")
        with self._lock:
            vm = self._vms.get(microvm_id)
            if vm is None:
                raise KeyError(f"no MicroVM {microvm_id}")
            now = self.clock.now()
            advance(vm, now, self.timings)
            if vm.state not in ENDED and vm.exit_at is None:
                vm.exit_at = now + after_seconds
                vm.exit_reason = reason or measured.REASON_APP_EXIT.format(code=exit_code)

    def exit_app(self, microvm_id: str, code: int = 0) -> None:
        """The VM's app (PID 1) exits now with ``code`` (see :meth:`crash`)."""
        self.crash(microvm_id, exit_code=code)

    def traffic(self, microvm_id: str) -> int:
        """An inbound request through the VM's endpoint; returns the HTTP status a client sees:
        200; 502 while PENDING, once its app exited, or suspended without auto-resume; 504 (no
        answer, a client timeout) while TERMINATING/TERMINATED; 404 for an unknown VM. A suspended
        VM with ``autoResumeEnabled`` is resumed: the proxy holds the request until ``/resume``
        returns (the clock's ``sleep_until``), as measured."""
        with self._lock:
            now = self.clock.now()
            vm = self._vms.get(microvm_id)
            if vm is None or self._gone(vm, now):
                return 404
            advance(vm, now, self.timings)
            if vm.state in ENDED:
                return 504
            if vm.exit_at is not None and vm.exit_at <= now:
                return 502
            if vm.state == "PENDING" and not vm.resumed:
                return 502
            if vm.state == "RUNNING" or (vm.state == "PENDING" and vm.resumed):
                vm.last_activity = now
                return 200
            if not (vm.idle and vm.idle.get("autoResumeEnabled")):
                return 502
            if vm.resume_at is None:
                # A VM still SUSPENDING finishes suspending first; then the proxy resumes it.
                suspended = vm.since + self.timings.suspending if vm.state == "SUSPENDING" else now
                vm.resume_at = max(now, suspended) + self.timings.resume
            ready = vm.resume_at
        self.clock.sleep_until(ready)
        with self._lock:
            now = self.clock.now()
            advance(vm, now, self.timings)
            if vm.state == "RUNNING" or (vm.state == "PENDING" and vm.resumed):
                vm.last_activity = now
                return 200
            return 502

    def state_of(self, microvm_id: str) -> Optional[str]:
        """The true current state (no lag), or None when the VM is unknown or gone."""
        with self._lock:
            now = self.clock.now()
            vm = self._vms.get(microvm_id)
            if vm is None:
                return None
            advance(vm, now, self.timings)
            return None if self._gone(vm, now) else vm.state

    def microvms(self) -> list[dict[str, Any]]:
        """Every VM the service still knows, with its true state: for assertions."""
        with self._lock:
            now = self.clock.now()
            self._prune(now)
            out = []
            for vm in self._vms.values():
                advance(vm, now, self.timings)
                if not self._gone(vm, now):
                    out.append(self._truth(vm))
            return out

    def microvms_ever(self) -> list[dict[str, Any]]:
        """Every VM ever started, gone ones included, with who started it, its client token and
        its history of ``(time, state, reason)``: ground truth for benchmarks."""
        with self._lock:
            now = self.clock.now()
            out = []
            for vm in self._ever:
                advance(vm, now, self.timings)
                item = self._truth(vm)
                item["history"] = list(vm.history)
                item["idleSuspendedAt"] = list(vm.idle_suspended_at)
                # When its PID 1 exited (its endpoint answers 502 from then: it serves no more), and
                # when it serves until at most (its rayd's deadline, else its maximum duration).
                item["exitedAt"] = vm.exit_at if vm.exit_at is not None and vm.exit_at <= now else None
                item["servesUntil"] = min(vm.rayd_deadline or float("inf"), vm.started_at + vm.max_duration)
                item["wasSuspended"] = any(h[1] == "SUSPENDED" for h in vm.history)
                item["maximumDurationInSeconds"] = vm.max_duration
                item["idlePolicy"] = copy.deepcopy(vm.idle)
                out.append(item)
            return out

    def running_at(self, microvm_id: str) -> Optional[float]:
        """When the VM (first) runs: the time its history says, or the time its launch ends while
        it is PENDING; None once it is ending or ended, or when the service does not know it."""
        with self._lock:
            now = self.clock.now()
            vm = self._current(microvm_id, now)
            if vm is None or vm.state in ("TERMINATING", "TERMINATED"):
                return None
            ran = next((at for at, state, _ in vm.history if state == "RUNNING"), None)
            if ran is not None:
                return float(ran)
            return float(vm.since + vm.launch_seconds) if vm.state == "PENDING" else None

    def memory_in_use_mib(self) -> int:
        with self._lock:
            return self._memory_exact(self.clock.now())

    # ================================================================== requests

    def call(self, operation: str, params: Mapping[str, Any], *, caller: Optional[str] = None,
             validate: bool = True) -> dict[str, Any]:
        """Carry out one operation as the service does (quota, faults, rules); returns its output
        members or raises :class:`WireError`. ``caller`` names who calls (the access key id on
        the wire); ``validate=False`` skips the model's input checks (for simulations)."""
        params = dict(params)
        held = 0.0
        outcome: Optional[dict[str, Any]] = None
        error: Optional[WireError] = None
        try:
            if validate:
                shape = _wire.service_model().operation_model(operation).input_shape
                if shape is not None:
                    _wire.check(shape, params, "")
            held = self._admit(operation)
            outcome = self._carry_out(operation, params, caller)
            return outcome
        except WireError as exc:
            error = exc
            raise
        finally:
            self._log(operation, params, caller, outcome, error, held)

    def count_rejected(self, operation: str, params: Mapping[str, Any], caller: Optional[str], error: WireError) -> None:
        """A request rejected before :meth:`call` (malformed on the wire) still spends a request
        of the quota and is logged."""
        with contextlib.suppress(WireError):
            self._admit(operation)
        self._log(operation, dict(params), caller, None, error, 0.0)

    def _admit(self, operation: str) -> float:
        with self._lock:
            self.calls[operation] = self.calls.get(operation, 0) + 1
            now = self.clock.now()
            try:
                hold = self._limiter.admit(operation, now)
            except WireError:
                self.throttled[operation] = self.throttled.get(operation, 0) + 1
                raise
            if hold:
                self.held[operation] = self.held.get(operation, 0) + 1
        if hold:
            self.clock.sleep_until(now + hold)
        return hold

    def _carry_out(self, operation: str, params: dict[str, Any], caller: Optional[str]) -> dict[str, Any]:
        with self._lock:
            delay = self._faults.before(operation, caller, self._iam_resource(operation, params)) if self._faults else 0.0
        if delay:
            time.sleep(delay)  # latency faults are real time: they are for client timeouts
        if operation not in IMPLEMENTED:
            raise WireError(
                "NotImplementedException",
                f"{operation} is not implemented by rayito_constructs.testing.MicrovmsEmulator",
                status=501,
            )
        with self._lock:
            now = self.clock.now()
            result = getattr(self, f"_op_{operation}")(params, now, caller)
            if self._faults and self._faults.take(operation, "lost_response", caller=caller) is not None:
                raise internal()
        return result

    def _iam_resource(self, operation: str, params: Mapping[str, Any]) -> str:
        """The resource IAM evaluates a request against, as an AccessDenied message names it (GT §1):
        the unversioned image ARN for the instance operations (a MicroVM is authorized through its
        image, [docs + aws-samples]) and for RunMicrovm even when given a versioned ARN
        ([M 2026-10-02] Q119, the message [M 2026-09-30] Q90); the image ARN for the image
        operations ([M 2026-10-02] UpdateMicrovmImage on the image ARN); ``*`` for the List*
        operations ([docs]) and CreateMicrovmImage ([M 2026-10-02] Q114)."""
        if operation in _ON_ANY_RESOURCE:
            return "*"
        if "Resource" in params:  # TagResource, UntagResource, ListTags
            return str(params["Resource"])
        if "microvmIdentifier" in params:
            vm = self._vms.get(str(params["microvmIdentifier"]))
            # An unknown VM has no image to name; what the service then says was not measured.
            return vm.image.arn if vm is not None else "*"
        identifier = params.get("imageIdentifier")
        if isinstance(identifier, str) and ":microvm-image:" in identifier:
            base, _, rest = identifier.partition(":microvm-image:")
            return f"{base}:microvm-image:{rest.split(':')[0]}"
        return str(identifier or "*")

    def _log(self, operation: str, params: Mapping[str, Any], caller: Optional[str],
             outcome: Optional[Mapping[str, Any]], error: Optional[WireError], held: float) -> None:
        vm_id = params.get("microvmIdentifier") or (outcome or {}).get("microvmId")
        record = RequestRecord(
            self.clock.now(), operation, caller, error.status if error else _status(operation),
            error.code if error else None, vm_id, params.get("clientToken"), held,
        )
        with self._lock:
            self.requests.append(record)
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback(record)

    # ================================================================== state helpers

    def _truth(self, vm: Microvm) -> dict[str, Any]:
        return {
            "microvmId": vm.id,
            "state": vm.state,
            "imageArn": vm.image.arn,
            "imageVersion": vm.image_version,
            "stateReason": vm.reason,
            "clientToken": vm.client_token,
            "startedAt": vm.started_at,
            "terminatedAt": vm.terminated_at,
            "caller": vm.caller,
            "memoryMiB": vm.memory_mib,
            # Ground truth: suspended by its idle policy (not a SuspendMicrovm) and not woken since.
            "idleSuspended": vm.state in ("SUSPENDING", "SUSPENDED") and bool(vm.idle_suspended_at)
            and not any(state not in ("SUSPENDING", "SUSPENDED") for at, state, _ in vm.history
                        if at > vm.idle_suspended_at[-1]),
        }

    def _gone(self, vm: Microvm, now: float) -> bool:
        return vm.state == "TERMINATED" and now >= (vm.terminated_at or now) + self.timings.linger

    def _prune(self, now: float) -> None:
        """Forget VMs no longer listed anywhere, so long simulations stay fast (``_ever`` keeps
        them, and their client tokens stay remembered)."""
        if now - self._pruned_at < 60 and now >= self._pruned_at:
            return
        self._pruned_at = now
        for vm_id, vm in list(self._vms.items()):
            advance(vm, now, self.timings)
            if self._gone(vm, now):
                del self._vms[vm_id]
        for name, vms in list(self._by_image.items()):
            kept = [vm for vm in vms if vm.id in self._vms]
            if kept:
                self._by_image[name] = kept
            else:
                del self._by_image[name]
        self._listed = [vm for vm in self._listed if vm.id in self._vms]
        for token, (owner, _, _) in list(self._auth_tokens.items()):
            if owner not in self._vms:
                del self._auth_tokens[token]
        for name, image in list(self._images.items()):
            if image.gone(now):
                del self._images[name]
        if self.client_token_ttl_seconds is not None:
            for token, (_, _, at) in list(self._tokens.items()):
                if now - at > self.client_token_ttl_seconds:
                    del self._tokens[token]

    def _counted_states(self) -> tuple[str, ...]:
        return LIVE if self.suspended_counts_toward_quota else ("PENDING", "RUNNING", "SUSPENDING")

    def _memory_exact(self, now: float) -> int:
        self._prune(now)
        counted = self._counted_states()
        total = 0
        for vm in self._vms.values():
            advance(vm, now, self.timings)
            if vm.state in counted:
                total += vm.memory_mib
        self._memory_upper = total
        return total

    def _memory_check(self, need: int, now: float) -> None:
        # An upper bound (every VM started since the last exact count still counted) saves a scan
        # of every VM on every RunMicrovm; the exact count is taken only near the quota.
        if self._memory_upper + need <= self.memory_quota_mib:
            return
        used = self._memory_exact(now)
        if used + need > self.memory_quota_mib:
            raise WireError(
                "ServiceQuotaExceededException",
                f"Max allocated memory quota reached ({used} of {self.memory_quota_mib} MiB in use)",
                resourceType="Microvm",
                serviceCode="lambda",
                quotaCode=measured.MEMORY_QUOTA_CODE,
            )

    def _builds_in_progress(self, now: float) -> int:
        return sum(1 for image in self._images.values() for v in image.versions.values() if v.state(now) == "IN_PROGRESS")

    def _image_by_name(self, name: str, now: float) -> Image:
        image = self._images.get(name)
        if image is None or image.gone(now):
            raise KeyError(f"no image {name!r}")
        return image

    def _image(self, identifier: str, now: float) -> Image:
        """The image an ``imageIdentifier`` names: it must be the ARN ([M 2026-09-15] the bare name
        is ``ValidationException: Invalid ARN format``)."""
        if not identifier.startswith("arn:") or ":microvm-image:" not in identifier:
            raise validation("Invalid ARN format")
        base, _, rest = identifier.partition(":microvm-image:")
        name = rest.split(":")[0]
        image = self._images.get(name)
        if image is None or image.gone(now) or image.arn != f"{base}:microvm-image:{name}":
            raise not_found(f"MicroVM image {identifier} not found", "MicrovmImage", identifier)
        return image

    def _vm(self, identifier: str, now: float) -> Microvm:
        vm = self._vms.get(identifier)
        if vm is not None:
            advance(vm, now, self.timings)  # an end nobody saw yet is dated first: then "gone" is right
        if vm is None or self._gone(vm, now):
            raise not_found(f"MicroVM {identifier} not found", "Microvm", identifier)
        return vm

    def _conflict(self, vm: Microvm, message: str) -> WireError:
        return conflict(message, "Microvm", vm.id)

    def _describe(self, vm: Microvm, now: float, *, lag: float = 0.0) -> dict[str, Any]:
        state, reason, ended = vm.seen_at(now - lag)
        req = vm.request
        return {
            "microvmId": vm.id,
            "state": state,
            "endpoint": vm.endpoint,
            "imageArn": vm.image.arn,
            "imageVersion": vm.image_version,
            "executionRoleArn": req.get("executionRoleArn"),
            "idlePolicy": vm.idle,
            "maximumDurationInSeconds": vm.max_duration,
            "startedAt": _ts(vm.started_at),
            "terminatedAt": _ts(ended),
            "stateReason": reason,
            "kmsKeyIdentifier": req.get("kmsKeyIdentifier"),
            "ingressNetworkConnectors": req.get("ingressNetworkConnectors")
            or [self._connector("HTTP_INGRESS")],
            "egressNetworkConnectors": req.get("egressNetworkConnectors")
            or [self._connector("INTERNET_EGRESS")],
        }

    def _connector(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:aws:network-connector:aws-network-connector:{name}"

    def _uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    # ================================================================== MicroVM operations

    def _op_RunMicrovm(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        _check_run_request(params)
        identifier = params["imageIdentifier"]
        token = params.get("clientToken")
        fingerprint = _fingerprint(params)
        replayed = self._replayed(token, fingerprint, now) if token is not None else None
        if replayed is not None:
            return self._describe(replayed, now)
        image = self._image_or_inactive(identifier, now)
        busy = image.state(now)
        if busy in ("CREATING", "UPDATING") and not self.profile.run_while_image_busy:
            # [docs] the image must be CREATED|UPDATED to launch (GT §7; not measured: the measured
            # profile launches, see measured.RUN_WHILE_IMAGE_BUSY). ConflictException: of the errors
            # the model gives RunMicrovm, the one for a resource in a state that forbids the call,
            # with the wording the service uses for the image being busy ([M 2026-09-15]). Not
            # ResourceNotFound: the image and an ACTIVE version exist.
            raise conflict(f"MicroVM Image is already in state: {busy}", "MicrovmImage", image.arn)
        version = image.runnable_version(params.get("imageVersion"), now)
        if "runHookPayload" in params and ((version.request.get("hooks") or {}).get("microvmHooks") or {}).get("run") != "ENABLED":
            raise validation("The run hook must be enabled in the MicroVM image to pass the run hook payload")
        self._memory_check(version.memory_mib, now)
        if version.fresh and version.launches < self.timings.fresh_launches:
            launch = self._launch_rng.uniform(*self.timings.fresh_launch)
        else:
            launch = self.timings.pending
        version.launches += 1
        vm = Microvm(
            id=f"microvm-{self._uuid()}",
            # [M 2026-09-15] a bare hostname, no scheme; its uuid is not the id's (GT §8, Q14/Q23).
            endpoint=f"{self._uuid()}.lambda-microvm.{self.region}.on.aws",
            image=image,
            version=version,
            started_at=now,
            max_duration=int(params.get("maximumDurationInSeconds") or measured.MAX_DURATION_SECONDS),
            request=copy.deepcopy(params),
            launch_seconds=launch,
            caller=caller,
            idle=copy.deepcopy(params.get("idlePolicy")),
        )
        vm.record(now, "PENDING")
        if not self.host_vms:
            vm.rayd_deadline = _rayd_deadline(params, version.request, now + launch)
        if self.host_vms:
            try:
                vm.endpoint = self.vm_host.attach(vm, version.runtime)
            except OSError as exc:
                raise internal() from exc
        crash = self._faults.take("RunMicrovm", "crash", image.arn, caller=caller) if self._faults else None
        if crash is not None:
            vm.exit_at = now + crash.after_seconds
            vm.exit_reason = crash.reason or measured.REASON_APP_EXIT.format(code=1)
        self._vms[vm.id] = vm
        bisect.insort(self._by_image.setdefault(image.name, []), vm, key=_list_key)
        bisect.insort(self._listed, vm, key=_list_key)
        self._ever.append(vm)
        self._memory_upper += vm.memory_mib
        if token is not None:
            self._tokens[token] = (fingerprint, vm, now)
        return self._describe(vm, now)

    def _replayed(self, token: str, fingerprint: str, now: float) -> Optional[Microvm]:
        """The VM a remembered ``clientToken`` started (brought up to ``now``), or None when the
        token is new or has expired; the same token with other parameters is a conflict."""
        remembered = self._tokens.get(token)
        if remembered is None:
            return None
        seen, vm, at = remembered
        if self.client_token_ttl_seconds is not None and now - at > self.client_token_ttl_seconds:
            del self._tokens[token]
            return None
        if seen != fingerprint:
            raise conflict("The clientToken was already used with different parameters", "Microvm", vm.id)
        advance(vm, now, self.timings)
        return vm

    def _image_or_inactive(self, identifier: str, now: float) -> Image:
        try:
            return self._image(identifier, now)
        except WireError as exc:
            if exc.code != "ResourceNotFoundException":
                raise
            # [3rd] an unknown image ARN: "No active version found for MicroVM image <arn>".
            raise not_found(f"No active version found for MicroVM image {identifier}", "MicrovmImage", identifier) from None

    def _op_GetMicrovm(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        return self._describe(vm, now, lag=self._consistency.lag())

    def _op_ListMicrovms(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        wanted = params.get("imageIdentifier")
        version = params.get("imageVersion")
        size = params.get("maxResults") or 50
        filters = {"image": wanted, "version": version}
        after = read_page_token(params.get("nextToken"), "microvms", filters, (float, str))
        self._prune(now)
        candidates: list[Microvm] = self._listed
        if wanted:
            if not wanted.startswith("arn:") or ":microvm-image:" not in wanted:
                raise validation("Invalid ARN format")
            base, _, rest = wanted.partition(":microvm-image:")
            name = rest.split(":")[0]
            candidates = self._by_image.get(name, []) if f"{base}:microvm-image:{name}" == self.image_arn(name) else []
        seen_at = now - self._consistency.lag()
        late = self._consistency.new_vms_listed_late
        lagging = self._faults.take("ListMicrovms", "list_lag", caller=caller) if self._faults else None
        hidden_after = now - lagging.seconds if lagging is not None else float("inf")
        start = bisect.bisect_right(candidates, tuple(after), key=_list_key) if after is not None else 0
        items: list[dict[str, Any]] = []
        last: Optional[Microvm] = None
        more = False
        for vm in candidates[start:]:
            if late and vm.started_at > seen_at:
                continue  # not in this replica yet: a new VM may be missing from a list for a while
            if vm.started_at > hidden_after:
                continue  # an injected list lag: younger than its seconds
            if version and vm.image_version != version:
                continue
            advance(vm, now, self.timings)
            if self._gone(vm, now):
                continue
            if len(items) == size:
                more = True
                break
            items.append({
                "microvmId": vm.id,
                "state": vm.seen_at(seen_at)[0],
                "imageArn": vm.image.arn,
                "imageVersion": vm.image_version,
                "startedAt": _ts(vm.started_at),
            })
            last = vm
        token = page_token("microvms", filters, _list_key(last)) if more and last is not None else None
        return {"items": items, "nextToken": token}

    def _op_SuspendMicrovm(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if vm.state == "SUSPENDING":
            return {}
        if vm.state == "SUSPENDED" and self.profile.idempotent_suspend_resume:
            return {}  # [M 2026-09-16] suspend on a SUSPENDED VM: 200, three times in a row (Q38)
        if vm.state != "RUNNING":
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}; only a RUNNING MicroVM can be suspended")
        vm.record(now, "SUSPENDING")
        hook = self._faults.take("SuspendMicrovm", "suspend_hook_failure", vm.image.arn, caller=caller) if self._faults else None
        if hook is not None:
            vm.suspend_hook_status = hook.status
        return {}

    def _op_ResumeMicrovm(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if (vm.state == "RUNNING" or vm.resumed) and self.profile.idempotent_suspend_resume:
            return {}  # [M 2026-09-16] resume on a RUNNING VM: 200, no new generation (Q38); so on one resumed
        if vm.state != "SUSPENDED":
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}; only a SUSPENDED MicroVM can be resumed")
        if vm.resume_at is None:
            # SUSPENDED until the /resume hook returns (Q4/Q40), then PENDING a moment, serving (GT §3).
            vm.resume_at = now + self.timings.resume
        return {}

    def _op_TerminateMicrovm(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if vm.state not in ENDED:
            vm.record(now, "TERMINATING", measured.REASON_TERMINATED)
        return {}  # idempotent (model): terminating an ended VM succeeds

    def _op_CreateMicrovmAuthToken(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        minutes = params["expirationInMinutes"]
        if minutes > 60:  # [M 2026-09-15] Notes §0/§3: 61 -> this message, word for word
            raise validation(f"ExpirationMinutes {minutes} exceeded max allowed of 60.")
        if vm.state in ENDED:
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}")
        for port in params["allowedPorts"]:
            if len([k for k in ("port", "range", "allPorts") if k in port]) != 1:
                raise validation("each allowedPorts entry sets exactly one of port, range, allPorts")
        token = _token_text(self._rng)
        if self.host_vms:  # the hosted VMs' front checks them (front.py); nobody else reads them
            self._auth_tokens[token] = (vm.id, now + minutes * 60, tuple(copy.deepcopy(params["allowedPorts"])))
        return {"authToken": {"X-aws-proxy-auth": token}}

    # ================================================================== image operations

    def _check_image_request(self, params: dict[str, Any], *, create: bool) -> int:
        resources = params.get("resources") or [{"minimumMemoryInMiB": 2048}]
        memory = resources[0]["minimumMemoryInMiB"]
        if memory not in measured.MEMORY_SIZES_MIB:  # [M 2026-09-30] Q87
            sizes = ", ".join(str(s) for s in measured.MEMORY_SIZES_MIB)
            raise validation(f"resources.minimumMemoryInMiB: {memory} is not one of {sizes}")
        uri = (params.get("codeArtifact") or {}).get("uri")
        if uri is not None and not _S3_URI.match(uri):  # [M 2026-09-30] Q84
            raise validation(f"codeArtifact.uri: '{uri}' is not an S3 URI (s3://bucket/key)")
        base = params.get("baseImageVersion")
        if base is not None:
            if create and not _MAJOR.match(base):  # [M 2026-10-02] Q115
                raise validation("Expected a single major version number (e.g., 1)")
            if not create and not re.match(r"^[0-9]+(\.0)?$", base):
                raise validation("Expected a major version number (e.g., 1)")
        return memory

    def _build_room(self, now: float) -> None:
        limit = measured.MAX_CONCURRENT_BUILDS if self.region in measured.LARGE_REGIONS else 5
        if self._builds_in_progress(now) >= limit:  # [M 2026-09-30] Q83
            raise WireError(
                "ServiceQuotaExceededException",
                f"The maximum number of concurrent builds ({limit}) has been reached",
                resourceType="MicrovmImage", serviceCode="lambda", quotaCode="L-72E0D058",
            )

    def _idempotent_image(self, params: dict[str, Any], key: str) -> Optional[str]:
        token = params.get("clientToken")
        if token is None:
            return None
        seen = self._image_tokens.get(token)
        if seen is None:
            return None
        fingerprint, name = seen
        if fingerprint != _fingerprint(params):
            raise conflict("The clientToken was already used with different parameters", "MicrovmImage", name)
        return name

    def _image_response(self, image: Image, version: ImageVersion, now: float) -> dict[str, Any]:
        result = version.view(image, now, full=True)
        for key in ("state", "status", "createdAt", "updatedAt", "stateReason"):
            result.pop(key, None)
        result.update(image.view(now, full=True))
        result["imageVersion"] = version.version
        if result.get("baseImageVersion") and "." not in result["baseImageVersion"]:
            result["baseImageVersion"] += ".0"  # [M 2026-09-16] update accepts "1" and echoes "1.0"
        return result

    def _op_CreateMicrovmImage(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        replay = self._idempotent_image(params, "create")
        if replay is not None and replay in self._images:
            image = self._images[replay]
            return self._image_response(image, image.versions[min(image.versions, key=version_number)], now)
        name = params["name"]
        existing = self._images.get(name)
        if existing is not None and not existing.gone(now):
            raise conflict(f"MicroVM image {name} already exists", "MicrovmImage", self.image_arn(name))
        if sum(1 for i in self._images.values() if not i.gone(now)) >= measured.MAX_IMAGES:
            raise WireError("ServiceQuotaExceededException", f"The maximum number of MicroVM images ({measured.MAX_IMAGES}) has been reached",
                            resourceType="MicrovmImage", serviceCode="lambda", quotaCode="L-942E56BE")
        memory = self._check_image_request(params, create=True)
        self._build_room(now)
        image = Image(name, self.image_arn(name), now, tags=dict(params.get("tags") or {}),
                      busy_until=now + self.timings.image_build)
        request = {k: copy.deepcopy(v) for k, v in params.items() if k not in ("name", "tags", "clientToken")}
        version = image.add_version(now, request, memory, self.timings.image_build, fresh=True,
                                    runtime=self._build_runtimes.get(name, NO_RAYD))
        self._images[name] = image
        if params.get("clientToken"):
            self._image_tokens[params["clientToken"]] = (_fingerprint(params), name)
        return self._image_response(image, version, now)

    def _op_UpdateMicrovmImage(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        replay = self._idempotent_image(params, "update")
        if replay is not None:
            return self._image_response(image, image.live_versions(now)[-1], now)
        image.ensure_idle(now)
        if len(image.live_versions(now)) >= measured.MAX_VERSIONS_PER_IMAGE:
            raise WireError("ServiceQuotaExceededException",
                            f"The maximum number of versions per MicroVM image ({measured.MAX_VERSIONS_PER_IMAGE}) has been reached",
                            resourceType="MicrovmImage", resourceId=image.arn, serviceCode="lambda", quotaCode="L-F8BECE9C")
        memory = self._check_image_request(params, create=False)
        self._build_room(now)
        request = {k: copy.deepcopy(v) for k, v in params.items() if k not in ("imageIdentifier", "clientToken")}
        if request.get("baseImageVersion") and "." not in request["baseImageVersion"]:
            request["baseImageVersion"] += ".0"
        version = image.add_version(now, request, memory, self.timings.image_build, fresh=True,
                                    runtime=self._build_runtimes.get(image.name, NO_RAYD))
        image.busy_until, image.busy_since_create = now + self.timings.image_build, False
        if params.get("clientToken"):
            self._image_tokens[params["clientToken"]] = (_fingerprint(params), image.name)
        return self._image_response(image, version, now)

    def _op_DeleteMicrovmImage(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        if image.deleting_at is None:
            # [M 2026-09-16] DELETING at once, ACTIVE versions or not.
            image.deleting_at, image.deleted_at = now, now + self.timings.image_delete
        return {"imageIdentifier": params["imageIdentifier"], "state": image.state(now)}

    def _op_GetMicrovmImage(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        return self._image(params["imageIdentifier"], now).view(now, full=True)

    def _op_ListMicrovmImages(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        needle = params.get("nameFilter") or ""
        filters = {"name": needle}
        after = read_page_token(params.get("nextToken"), "images", filters, (str,))
        self._prune(now)
        keyed = [((i.name,), i.view(now, full=False)) for i in sorted(self._images.values(), key=lambda i: i.name)
                 if needle in i.name and not i.gone(now)]
        items, last = page(keyed, after, params.get("maxResults") or 50)
        return {"items": items, "nextToken": page_token("images", filters, last) if last else None}

    def _op_GetMicrovmImageVersion(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        return image.version(params["imageVersion"], now).view(image, now, full=True)

    def _op_ListMicrovmImageVersions(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        filters = {"image": image.arn}
        after = read_page_token(params.get("nextToken"), "versions", filters, (float, str))
        keyed = [((version_number(v.version), v.version), v.view(image, now, full=False)) for v in image.live_versions(now)]
        items, last = page(keyed, after, params.get("maxResults") or 50)
        return {"items": items, "nextToken": page_token("versions", filters, last) if last else None}

    def _build_view(self, image: Image, version: Any, now: float) -> dict[str, Any]:
        """One build per version (the model's ``MicrovmImageBuildSummary``): PENDING... while the
        version builds, then SUCCESSFUL or FAILED as the version ends. Architecture and chipset are
        the only ones this emulator builds for (ARM_64, the product's), not measured values."""
        state = version.state(now)
        build_state = {"IN_PROGRESS": "IN_PROGRESS", "SUCCESSFUL": "SUCCESSFUL", "FAILED": "FAILED"}.get(state, "SUCCESSFUL")
        return {"imageArn": image.arn, "imageVersion": version.version, "buildId": f"build-{version.version}",
                "buildState": build_state, "architecture": "ARM_64", "chipset": "GRAVITON",
                "chipsetGeneration": "3", "createdAt": _ts(version.created_at)}

    def _op_ListMicrovmImageBuilds(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        version = image.version(params["imageVersion"], now)
        return {"items": [self._build_view(image, version, now)]}

    def _op_GetMicrovmImageBuild(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        version = image.version(params["imageVersion"], now)
        view = self._build_view(image, version, now)
        if params["buildId"] != view["buildId"]:
            raise not_found(f"MicroVM image build {params['buildId']} not found", "MicrovmImageBuild", params["buildId"])
        return view

    # ================================================================== managed (AWS) images

    def _managed_arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:aws:microvm-image:{name}"

    def _op_ListManagedMicrovmImages(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        after = read_page_token(params.get("nextToken"), "managed-images", {}, (str,))
        at = _ts(measured.MANAGED_IMAGES_CREATED_AT)
        keyed = [((arn,), {"imageArn": arn, "createdAt": at, "updatedAt": at})
                 for arn in sorted(self._managed_arn(name) for name in measured.MANAGED_IMAGES)]
        items, last = page(keyed, after, params.get("maxResults") or 50)
        return {"items": items, "nextToken": page_token("managed-images", {}, last) if last else None}

    def _op_ListManagedMicrovmImageVersions(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        """[M 2026-09-15/16] lists versions ``0`` and ``1`` of ``al2023-1`` (GT §7)."""
        identifier = params["imageIdentifier"]
        if not identifier.startswith("arn:") or ":microvm-image:" not in identifier:
            raise validation("Invalid ARN format")  # [M 2026-09-15] an imageIdentifier is an ARN
        name = identifier.rsplit(":microvm-image:", 1)[1]
        versions = measured.MANAGED_IMAGES.get(name)
        if versions is None or identifier != self._managed_arn(name):
            raise not_found(f"Managed MicroVM image {identifier} not found", "MicrovmImage", identifier)
        filters = {"image": identifier}
        after = read_page_token(params.get("nextToken"), "managed-versions", filters, (float, str))
        at = _ts(measured.MANAGED_IMAGES_CREATED_AT)
        keyed = [((version_number(version), version),
                  {"imageArn": identifier, "imageVersion": version, "status": status, "createdAt": at, "updatedAt": at})
                 for version, status in sorted(versions, key=lambda v: version_number(v[0]))]
        items, last = page(keyed, after, params.get("maxResults") or 50)
        return {"items": items, "nextToken": page_token("managed-versions", filters, last) if last else None}

    def _op_UpdateMicrovmImageVersion(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        version = image.version(params["imageVersion"], now)
        image.ensure_idle(now)  # [M 2026-09-15] "MicroVM Image is already in state: UPDATING"
        if version.deleting_at is not None:
            raise conflict(f"MicroVM image version {version.version} is {version.state(now)}", "MicrovmImageVersion", image.arn)
        version.status, version.updated_at = params["status"], now
        return version.view(image, now, full=True)

    def _op_DeleteMicrovmImageVersion(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._image(params["imageIdentifier"], now)
        version = image.delete_version(params["imageVersion"], now, self.timings.version_delete)
        return {"imageIdentifier": params["imageIdentifier"], "imageVersion": version.version, "state": version.state(now)}

    # ================================================================== tags (images only)

    def _taggable(self, arn: str, now: float) -> Image:
        name = arn.rsplit(":microvm-image:", 1)[-1] if ":microvm-image:" in arn else None
        image = self._images.get(name or "")
        if image is None or image.gone(now) or image.arn != arn:
            # MicroVMs cannot be tagged (model/docs, GT §8).
            raise WireError("ResourceNotFoundException", f"Resource {arn} not found", resourceId=arn)
        return image

    def _op_TagResource(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        self._taggable(params["Resource"], now).tags.update(params["Tags"])
        return {}

    def _op_UntagResource(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        image = self._taggable(params["Resource"], now)
        for key in params["TagKeys"]:
            image.tags.pop(key, None)
        return {}

    def _op_ListTags(self, params: dict[str, Any], now: float, caller: Optional[str]) -> dict[str, Any]:  # noqa: N802
        return {"Tags": dict(self._taggable(params["Resource"], now).tags)}


# ====================================================================== helpers


def _list_key(vm: Microvm) -> tuple[float, str]:
    return (vm.started_at, vm.id)


def _ts(seconds: Optional[float]) -> Optional[dt.datetime]:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


def _check_run_request(params: Mapping[str, Any]) -> None:
    """What the service refuses in a RunMicrovm request before it looks at the image."""
    identifier = params["imageIdentifier"]
    if not identifier.startswith("arn:") or ":microvm-image:" not in identifier:
        raise validation("Invalid ARN format")  # [M 2026-09-15]
    idle = params.get("idlePolicy") or {}
    max_idle = idle.get("maxIdleDurationSeconds")
    if isinstance(max_idle, int) and max_idle > measured.MAX_IDLE_SECONDS:  # [docs] (GT §5)
        raise _wire.constraint("idlePolicy.maxIdleDurationSeconds",
                               f"Member must have value less than or equal to {measured.MAX_IDLE_SECONDS}", max_idle)
    logging_ = params.get("logging") or {}
    if logging_.get("cloudWatch") and not params.get("executionRoleArn"):
        raise validation("Logging cannot be enabled without providing executionRoleArn")  # [M 2026-10-02] Q108
    for key in ("ingressNetworkConnectors", "egressNetworkConnectors"):
        for arn in params.get(key) or []:
            managed = arn.rsplit(":aws-network-connector:", 1)
            if len(managed) == 2 and managed[1] not in MANAGED_CONNECTORS:
                raise validation(f"Unrecognized managed network connector ARN: {arn}")  # [M 2026-09-22] Q60


def _fingerprint(params: Mapping[str, Any]) -> str:
    data = {k: v for k, v in params.items() if k != "clientToken"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _status(operation: str) -> int:
    try:
        return int(_wire.service_model().operation_model(operation).http.get("responseCode", 200))
    except Exception:  # noqa: BLE001
        return 200


def _check_memory(memory_mib: int) -> None:
    if memory_mib not in measured.MEMORY_SIZES_MIB:
        sizes = ", ".join(str(s) for s in measured.MEMORY_SIZES_MIB)
        raise ValueError(f"memory_mib: {memory_mib!r} is not one of {sizes} (the sizes the service accepts)")


def _port_allowed(spec: Mapping[str, Any], port: int) -> bool:
    if "allPorts" in spec:
        return True
    if "port" in spec:
        return int(spec["port"]) == port
    bounds = spec.get("range") or {}
    return int(bounds.get("startPort", -1)) <= port <= int(bounds.get("endPort", -1))


def _token_text(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(64))


def _replace_consistency(current: Consistency, **changes: float) -> Consistency:
    window = changes.get("window", current.window)
    stale = changes.get("stale_seconds", current.stale_seconds)
    fresh = Consistency(window, None, stale, current.new_vms_listed_late)
    fresh._rng = current._rng  # keep the seeded sequence
    return fresh
