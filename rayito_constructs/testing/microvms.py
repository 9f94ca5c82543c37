"""``MicrovmsEmulator``: a local AWS Lambda MicroVMs service that real boto3 clients talk to.

    with MicrovmsEmulator(pending_seconds=0.2) as emulator:
        client = boto3.client("lambda-microvms", endpoint_url=emulator.endpoint_url,
                              region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        image = emulator.create_image("mi-agente", memory_mib=2048)
        vm = client.run_microvm(imageIdentifier=image)

It speaks the service's ``rest-json`` protocol as botocore's model describes it (routes, status
codes, members, error shapes), and behaves as the documented service does: the MicroVM lifecycle
with delays, TERMINATED VMs that linger in lists, ``maximumDurationInSeconds``, idle policies,
``clientToken`` idempotency, per-operation rate limits at the documented default quotas (429 with
``Retry-After``), the account memory quota (402), and injectable faults. Time is real by default;
``clock=VirtualClock()`` lets a test advance it, so a day runs in seconds.

Run it for other tools with ``python -m rayito_constructs.testing.microvms --port 4566``.
See docs/testing.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import hashlib
import json
import math
import random
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Mapping, Optional
from urllib.parse import urlsplit

from . import _wire
from ._wire import WireError, validation

# ---------------------------------------------------------------------------------------------
# Clocks


class RealClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """Time that moves only when told to: ``advance(seconds)``. Thread-safe."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward; returns the new time."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now += seconds
            return self._now


# ---------------------------------------------------------------------------------------------
# Quotas and rate limits

#: Documented default quotas (requests per second, burst) and their Service Quotas codes.
DEFAULT_RATE_LIMITS: dict[str, tuple[float, float]] = {
    "RunMicrovm": (5, 5),
    "ResumeMicrovm": (5, 5),
    "SuspendMicrovm": (2, 2),
    "TerminateMicrovm": (10, 10),
    "GetMicrovm": (100, 100),
    "CreateMicrovmAuthToken": (50, 50),
    "CreateMicrovmShellAuthToken": (5, 5),
    # Not published: an assumption, configurable like the others.
    "ListMicrovms": (10, 10),
}
#: Any operation not listed above.
DEFAULT_OTHER_RATE_LIMIT = (10.0, 10.0)
QUOTA_CODES = {
    "RunMicrovm": "L-535CA9B6",
    "ResumeMicrovm": "L-118C44B3",
    "SuspendMicrovm": "L-90045317",
    "TerminateMicrovm": "L-74787B8A",
    "GetMicrovm": "L-CE98C9E3",
    "CreateMicrovmAuthToken": "L-7712260B",
    "CreateMicrovmShellAuthToken": "L-B78D2ECC",
}
MEMORY_QUOTA_CODE = "L-CD1C0CC4"
DEFAULT_MEMORY_QUOTA_MIB = 1024 * 1024  # 1,024 GB in the large regions
MAX_DURATION_SECONDS = 28_800

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
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
        "GetMicrovmImage",
        "ListMicrovmImages",
        "TagResource",
        "UntagResource",
        "ListTags",
    }
)


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take`` returns 0 or the seconds to wait."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float) -> float:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else math.inf


# ---------------------------------------------------------------------------------------------
# Faults


@dataclass
class Fault:
    """A fault armed on one operation: ``kind`` is ``InsufficientCapacity``, ``InternalServer``,
    ``latency``, ``crash`` (the VM it starts ends after ``after_seconds`` with ``reason``) or
    ``lost_response`` (the operation is carried out, then answered with an InternalServerException,
    as when a response is lost on the way back)."""

    operation: str
    kind: str
    times: Optional[int] = 1
    probability: float = 1.0
    seconds: float = 0.0
    retry_after: int = 1
    after_seconds: float = 0.0
    reason: str = "app_crashloop"
    image: Optional[str] = None
    """Only VMs of this image ARN (``crash`` faults)."""


# ---------------------------------------------------------------------------------------------
# State


@dataclass
class Image:
    name: str
    arn: str
    memory_mib: int
    created_at: float
    ready_at: float
    version: str = "1.0"
    tags: dict[str, str] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)

    def state(self, now: float) -> str:
        return "CREATED" if now >= self.ready_at else "CREATING"


@dataclass
class Microvm:
    id: str
    image: Image
    image_version: str
    started_at: float
    max_duration: int
    request: dict[str, Any]
    endpoint: str
    idle: Optional[dict[str, Any]] = None
    state: str = "PENDING"
    since: float = 0.0  # when the current state began
    reason: Optional[str] = None
    terminated_at: Optional[float] = None
    last_activity: float = 0.0
    crash_at: Optional[float] = None
    crash_reason: str = "app_crashloop"
    history: list[tuple[float, str, Optional[str]]] = field(default_factory=list)

    def record(self, at: float, state: str, reason: Optional[str] = None) -> None:
        self.state, self.since = state, at
        if reason:
            self.reason = reason
        if state == "TERMINATED":
            self.terminated_at = at
        self.history.append((at, state, self.reason))


class MicrovmsEmulator:
    """A Lambda MicroVMs service on 127.0.0.1. Use it as a context manager, or ``start``/``stop``.

    :param port: port to listen on. Default: a free one.
    :param clock: ``RealClock()`` (default) or ``VirtualClock()``.
    :param region: Default: ``us-east-1``.
    :param account_id: Default: ``123456789012``.
    :param pending_seconds: PENDING → RUNNING. Default: 12 (as observed on the service).
    :param suspending_seconds: SUSPENDING → SUSPENDED. Default: 1.
    :param terminating_seconds: TERMINATING → TERMINATED. Default: 3.
    :param terminated_linger_seconds: how long TERMINATED VMs stay listed. Default: 600.
    :param image_build_seconds: CREATING → CREATED for images made through the API. Default: 180.
    :param memory_quota_mib: account memory quota over live VMs. Default: 1,048,576 (1,024 GB).
    :param suspended_counts_toward_quota: Default: True (unconfirmed on the service; conservative).
    :param rate_limits: ``{operation: (rate_per_second, burst)}`` over the defaults; ``None`` as a
        value turns an operation's limit off; ``rate_limits=False`` turns them all off.
    :param seed: seeds ids and fault probabilities, for reproducible runs. Default: random.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        clock: Optional[RealClock | VirtualClock] = None,
        region: str = "us-east-1",
        account_id: str = "123456789012",
        pending_seconds: float = 12.0,
        suspending_seconds: float = 1.0,
        terminating_seconds: float = 3.0,
        terminated_linger_seconds: float = 600.0,
        image_build_seconds: float = 180.0,
        memory_quota_mib: int = DEFAULT_MEMORY_QUOTA_MIB,
        suspended_counts_toward_quota: bool = True,
        rate_limits: Mapping[str, Optional[tuple[float, float]]] | bool = True,
        seed: Optional[int] = None,
    ) -> None:
        self.clock = clock or RealClock()
        self.region = region
        self.account_id = account_id
        self.pending_seconds = pending_seconds
        self.suspending_seconds = suspending_seconds
        self.terminating_seconds = terminating_seconds
        self.terminated_linger_seconds = terminated_linger_seconds
        self.image_build_seconds = image_build_seconds
        self.memory_quota_mib = memory_quota_mib
        self.suspended_counts_toward_quota = suspended_counts_toward_quota
        self.stale_seconds = 0.0
        self._port = port
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._images: dict[str, Image] = {}
        self._vms: dict[str, Microvm] = {}
        self._by_image: dict[str, list[Microvm]] = {}
        self._ever: list[Microvm] = []
        self._pruned_at = float("-inf")
        self._tokens: dict[str, tuple[str, str]] = {}  # clientToken -> (fingerprint, microvm id)
        self._faults: list[Fault] = []
        self._limits: dict[str, Optional[tuple[float, float]]] = {}
        if rate_limits is not False:
            self._limits.update(DEFAULT_RATE_LIMITS)
            if isinstance(rate_limits, Mapping):
                self._limits.update(rate_limits)
        self._rate_limits_on = rate_limits is not False
        self._buckets: dict[str, TokenBucket] = {}
        self.calls: dict[str, int] = {}
        """Requests answered, by operation (throttled ones included)."""
        self.throttled: dict[str, int] = {}
        """429s answered, by operation."""
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ lifecycle of the server

    def start(self) -> "MicrovmsEmulator":
        """Start listening on 127.0.0.1."""
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="microvms-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "MicrovmsEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``: pass it as boto3's ``endpoint_url``."""
        if self._server is None:
            raise RuntimeError("the emulator is not running: use it as a context manager or call start()")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------------ Python API for tests

    def client(self, *, in_process: bool = False, retries: int = 1, **config: Any) -> Any:
        """A boto3 ``lambda-microvms`` client for this emulator.

        ``in_process=True`` skips the socket: botocore still serializes every request and parses
        every response, but hands the request to the emulator directly (the way moto's stubber
        hooks ``before-send``), which is several times faster for long simulations.
        """
        import boto3
        from botocore.awsrequest import AWSResponse
        from botocore.config import Config

        endpoint = f"http://127.0.0.1:{self._server.server_address[1]}" if self._server else "http://emulator.invalid"
        client = boto3.client(
            "lambda-microvms",
            endpoint_url=endpoint,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"total_max_attempts": retries, "mode": "standard"}, **config),
        )
        if in_process:

            class _Raw:
                def __init__(self, data: bytes) -> None:
                    self._data = data

                def stream(self, **_: Any) -> Iterator[bytes]:
                    yield self._data

            def send(request: Any, **_: Any) -> Any:
                url = urlsplit(request.url)
                body = request.body or b""
                if hasattr(body, "read"):
                    body = body.read()
                if isinstance(body, str):
                    body = body.encode()
                status, headers, payload = self.handle(request.method, url.path, url.query, body)
                return AWSResponse(request.url, status, headers, _Raw(payload))

            client.meta.events.register_first("before-send.lambda-microvms", send)
        return client

    def image_arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account_id}:microvm-image:{name}"

    def create_image(self, name: str, memory_mib: int = 2048, *, version: str = "1.0") -> str:
        """Create an image with an active version right away; returns its ARN."""
        now = self.clock.now()
        with self._lock:
            image = Image(name, self.image_arn(name), memory_mib, now, now, version)
            self._images[name] = image
            return image.arn

    def has_image(self, name: str) -> bool:
        with self._lock:
            return name in self._images

    def set_rate_limit(self, operation: str, rate: float, burst: float) -> None:
        """Change one operation's limit now (a throttling storm, an applied quota)."""
        with self._lock:
            self._limits[operation] = (rate, burst)
            self._rate_limits_on = True
            self._buckets.pop(operation, None)

    def publish_version(self, name: str, version: str) -> None:
        """Make ``version`` the image's latest active version (new VMs run it)."""
        with self._lock:
            self._images[name].version = version

    def inject(self, operation: str, kind: str, **options: Any) -> Fault:
        """Arm a fault on an operation; see :class:`Fault`. Returns it (``remove_fault`` disarms)."""
        if kind not in {"InsufficientCapacity", "InternalServer", "latency", "crash", "lost_response"}:
            raise ValueError(f"unknown fault kind {kind!r}")
        fault = Fault(operation=operation, kind=kind, **options)
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove_fault(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def crash(self, microvm_id: str, reason: str = "app_crashloop", after_seconds: float = 0.0) -> None:
        """End a VM as the service does when its app dies: TERMINATED with a ``stateReason``."""
        with self._lock:
            vm = self._vms[microvm_id]
            vm.crash_at = self.clock.now() + after_seconds
            vm.crash_reason = reason

    def traffic(self, microvm_id: str) -> int:
        """Simulate an inbound request through the VM's endpoint; returns the HTTP status the
        proxy would give (200, 502 while PENDING or suspended without auto-resume, 404 gone)."""
        now = self.clock.now()
        with self._lock:
            vm = self._vms.get(microvm_id)
            if vm is None:
                return 404
            self._advance(vm, now)
            if vm.state in ("TERMINATING", "TERMINATED"):
                return 404
            if vm.state in ("SUSPENDING", "SUSPENDED"):
                if not (vm.idle and vm.idle.get("autoResumeEnabled")):
                    return 502
                if vm.state == "SUSPENDING":
                    vm.record(now, "SUSPENDED")
                vm.record(now, "RUNNING")
            if vm.state == "PENDING":
                return 502
            vm.last_activity = now
            return 200

    def state_of(self, microvm_id: str) -> Optional[str]:
        """The true current state (no staleness), or None when the VM is unknown or gone."""
        with self._lock:
            vm = self._vms.get(microvm_id)
            if vm is None:
                return None
            self._advance(vm, self.clock.now())
            return None if self._gone(vm, self.clock.now()) else vm.state

    def microvms(self) -> list[dict[str, Any]]:
        """Every VM the service still knows, with its true state: for assertions."""
        now = self.clock.now()
        with self._lock:
            out = []
            self._prune(now)
            for vm in self._vms.values():
                self._advance(vm, now)
                if not self._gone(vm, now):
                    out.append(
                        {
                            "microvmId": vm.id,
                            "state": vm.state,
                            "imageArn": vm.image.arn,
                            "imageVersion": vm.image_version,
                            "stateReason": vm.reason,
                            "clientToken": vm.request.get("clientToken"),
                            "startedAt": vm.started_at,
                        }
                    )
            return out

    def microvms_ever(self) -> list[dict[str, Any]]:
        """Every VM ever started, gone ones included, with its client token and history."""
        now = self.clock.now()
        with self._lock:
            out = []
            for vm in self._ever:
                self._advance(vm, now)
                states = [h[1] for h in vm.history]
                out.append({"microvmId": vm.id, "state": vm.state, "imageArn": vm.image.arn,
                            "clientToken": vm.request.get("clientToken"), "startedAt": vm.started_at,
                            "wasSuspended": "SUSPENDED" in states, "stateReason": vm.reason})
            return out

    def memory_in_use_mib(self) -> int:
        now = self.clock.now()
        with self._lock:
            return self._memory_in_use(now)

    # ------------------------------------------------------------------ the state machine

    def _advance(self, vm: Microvm, now: float) -> None:
        """Apply every transition due by ``now``, in time order."""
        for _ in range(16):
            event = self._next_event(vm)
            if event is None or event[0] > now:
                return
            at, state, reason = event
            vm.record(at, state, reason)
            if state == "RUNNING":
                vm.last_activity = at

    def _next_event(self, vm: Microvm) -> Optional[tuple[float, str, Optional[str]]]:
        candidates: list[tuple[float, str, Optional[str]]] = []
        if vm.state == "TERMINATED":
            return None
        if vm.state == "TERMINATING":
            return (vm.since + self.terminating_seconds, "TERMINATED", None)
        end = vm.started_at + vm.max_duration
        candidates.append((max(end, vm.since), "TERMINATING", "maximum_duration_reached"))
        if vm.crash_at is not None:
            candidates.append((max(vm.crash_at, vm.since), "TERMINATED", vm.crash_reason))
        if vm.state == "PENDING":
            candidates.append((vm.since + self.pending_seconds, "RUNNING", None))
        elif vm.state == "RUNNING" and vm.idle:
            candidates.append((vm.last_activity + vm.idle["maxIdleDurationSeconds"], "SUSPENDING", None))
        elif vm.state == "SUSPENDING":
            candidates.append((vm.since + self.suspending_seconds, "SUSPENDED", None))
        elif vm.state == "SUSPENDED" and vm.idle:
            candidates.append((vm.since + vm.idle["suspendedDurationSeconds"], "TERMINATING", "idle_timeout"))
        return min(candidates, key=lambda c: c[0])

    def _gone(self, vm: Microvm, now: float) -> bool:
        return vm.state == "TERMINATED" and now >= (vm.terminated_at or now) + self.terminated_linger_seconds

    def _prune(self, now: float) -> None:
        """Forget VMs no longer listed anywhere, so long simulations stay fast (``_ever`` keeps them)."""
        if now - self._pruned_at < 60:
            return
        self._pruned_at = now
        for vm_id in [i for i, vm in self._vms.items() if (self._advance(vm, now) or True) and self._gone(vm, now)]:
            del self._vms[vm_id]

    def _memory_in_use(self, now: float) -> int:
        counted = LIVE if self.suspended_counts_toward_quota else ("PENDING", "RUNNING", "SUSPENDING")
        total = 0
        self._prune(now)
        for vm in self._vms.values():
            self._advance(vm, now)
            if vm.state in counted:
                total += vm.image.memory_mib
        return total

    def _view(self, vm: Microvm, now: float) -> tuple[str, Optional[str], Optional[float]]:
        """State, reason and end time as a reader sees them: ``stale_seconds`` late."""
        if self.stale_seconds <= 0:
            return vm.state, vm.reason, vm.terminated_at
        seen_at = now - self.stale_seconds
        state, reason = vm.history[0][1], None
        for at, s, r in vm.history:
            if at <= seen_at:
                state, reason = s, r
        return state, reason, vm.terminated_at if state == "TERMINATED" else None

    # ------------------------------------------------------------------ request handling

    def handle(self, method: str, path: str, query: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Answer one HTTP request: status, headers, body."""
        found = _wire.match(method, path)
        if found is None:
            if _wire.path_exists(path):
                err = WireError("ValidationException", f"{method} is not allowed on {path}", status=405)
            else:
                err = WireError("UnknownOperationException", f"no operation at {method} {path}", status=404)
            return err.encode()
        route, labels = found
        name = route.operation
        op = _wire.service_model().operation_model(name)
        try:
            params = self._parse(name, op, labels, query, body)
            result = self._call(name, params)
        except WireError as err:
            return err.encode()
        return route.status, {"Content-Type": "application/json"}, _wire.encode_output(op, result)

    def _parse(self, name: str, op: Any, labels: Mapping[str, str], query: str, body: bytes) -> dict[str, Any]:
        try:
            return _wire.parse_input(op, labels, query, body)
        except WireError:
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
            self._admit(name)  # a malformed request still spends a request of the quota
            raise

    def _call(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """Carry out one operation: count it, admit it against the rate limit, apply faults."""
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        self._admit(name)
        delay = self._faults_for(name)
        if delay:
            time.sleep(delay)
        if name not in IMPLEMENTED:
            raise WireError(
                "NotImplementedException",
                f"{name} is not implemented by rayito_constructs.testing.MicrovmsEmulator",
                status=501,
            )
        with self._lock:
            result = getattr(self, f"_op_{name}")(params, self.clock.now())
            if self._take_fault(name, "lost_response") is not None:
                raise WireError("InternalServerException", "An internal error occurred.", retryAfterSeconds=1)
        return result

    def direct_client(self) -> "DirectClient":
        """A client with boto3's method names and error shapes that calls the emulator without
        serializing anything: for simulations of thousands of VMs-days (benchmarks). It skips
        input validation; use :meth:`client` to test code for real."""
        return DirectClient(self)

    def _admit(self, name: str) -> None:
        if not self._rate_limits_on:
            return
        limit = self._limits.get(name, DEFAULT_OTHER_RATE_LIMIT)
        if limit is None:
            return
        now = self.clock.now()
        with self._lock:
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._buckets[name] = TokenBucket(limit[0], limit[1], now)
            wait = bucket.take(now)
            if wait > 0:
                self.throttled[name] = self.throttled.get(name, 0) + 1
                raise WireError(
                    "ThrottlingException",
                    f"Rate exceeded for {name}",
                    serviceCode="lambda",
                    quotaCode=QUOTA_CODES.get(name),
                    retryAfterSeconds=max(1, math.ceil(wait)),
                )

    def _faults_for(self, name: str) -> float:
        """Raise the first armed error fault of this operation; return any latency to add."""
        delay = 0.0
        with self._lock:
            for fault in list(self._faults):
                if fault.operation != name or fault.kind in ("crash", "lost_response") or not self._fires(fault):
                    continue
                if fault.kind == "latency":
                    delay += fault.seconds
                elif fault.kind == "InsufficientCapacity":
                    raise WireError("InsufficientCapacityException", "Insufficient capacity. Retry the request later.")
                elif fault.kind == "InternalServer":
                    raise WireError(
                        "InternalServerException", "An internal error occurred.", retryAfterSeconds=fault.retry_after
                    )
        return delay

    def _take_fault(self, operation: str, kind: str, image: Optional[str] = None) -> Optional[Fault]:
        for fault in list(self._faults):
            if fault.operation == operation and fault.kind == kind and fault.image in (None, image) and self._fires(fault):
                return fault
        return None

    def _fires(self, fault: Fault) -> bool:
        """Whether an armed fault fires on this request (its probability), using up one of its times."""
        if fault.probability < 1.0 and self._rng.random() >= fault.probability:
            return False
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                self._faults.remove(fault)
        return True

    # ------------------------------------------------------------------ helpers for operations

    def _image_for(self, identifier: str, now: float) -> Image:
        if not identifier.startswith("arn:"):
            raise validation("Malformed ARN - doesn't start with 'arn:'")
        name = identifier.rsplit(":microvm-image:", 1)[-1].split(":")[0]
        image = self._images.get(name)
        known = image is not None and image.arn == identifier.split(":microvm-image:")[0] + f":microvm-image:{name}"
        if image is None or not known or image.state(now) != "CREATED":
            raise WireError(
                "ResourceNotFoundException",
                f"No active version found for MicroVM image {identifier}",
                resourceType="MicrovmImage",
                resourceId=identifier,
            )
        return image

    def _vm(self, identifier: str, now: float) -> Microvm:
        vm = self._vms.get(identifier)
        if vm is None or self._gone(vm, now):
            raise WireError(
                "ResourceNotFoundException",
                f"MicroVM {identifier} not found",
                resourceType="Microvm",
                resourceId=identifier,
            )
        self._advance(vm, now)
        return vm

    def _conflict(self, vm: Microvm, message: str) -> WireError:
        return WireError("ConflictException", message, resourceId=vm.id, resourceType="Microvm")

    def _describe(self, vm: Microvm, now: float) -> dict[str, Any]:
        state, reason, ended = self._view(vm, now)
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
            "startedAt": dt.datetime.fromtimestamp(vm.started_at, dt.timezone.utc),
            "terminatedAt": dt.datetime.fromtimestamp(ended, dt.timezone.utc) if ended else None,
            "stateReason": reason,
            "kmsKeyIdentifier": req.get("kmsKeyIdentifier"),
            "ingressNetworkConnectors": req.get("ingressNetworkConnectors")
            or [f"arn:aws:lambda:{self.region}:aws:network-connector:aws-network-connector:HTTP_INGRESS"],
            "egressNetworkConnectors": req.get("egressNetworkConnectors")
            or [f"arn:aws:lambda:{self.region}:aws:network-connector:aws-network-connector:INTERNET_EGRESS"],
        }

    def _new_id(self) -> str:
        return f"microvm-{uuid.UUID(int=self._rng.getrandbits(128), version=4)}"

    # ------------------------------------------------------------------ operations

    def _op_RunMicrovm(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        image = self._image_for(params["imageIdentifier"], now)
        token = params.get("clientToken")
        fingerprint_data = {k: v for k, v in params.items() if k != "clientToken"}
        fingerprint = hashlib.sha256(json.dumps(fingerprint_data, sort_keys=True).encode()).hexdigest()
        if token and token in self._tokens:
            seen, vm_id = self._tokens[token]
            if vm_id not in self._vms:
                # The token's VM ended long ago; the service's token window is unknown: a new VM.
                del self._tokens[token]
                return self._op_RunMicrovm(params, now)
            if seen != fingerprint:
                raise WireError(
                    "ConflictException",
                    "The clientToken was already used with different parameters",
                    resourceId=vm_id,
                    resourceType="Microvm",
                )
            vm = self._vms[vm_id]
            self._advance(vm, now)
            return self._describe(vm, now)
        version = params.get("imageVersion") or image.version
        if version != image.version:
            raise WireError(
                "ResourceNotFoundException",
                f"No active version {version} found for MicroVM image {image.arn}",
                resourceType="MicrovmImage",
                resourceId=image.arn,
            )
        if "runHookPayload" in params:
            raise validation("The run hook must be enabled in the MicroVM image to pass the run hook payload")
        used = self._memory_in_use(now)
        if used + image.memory_mib > self.memory_quota_mib:
            raise WireError(
                "ServiceQuotaExceededException",
                f"Max allocated memory quota reached ({used} of {self.memory_quota_mib} MiB in use)",
                resourceType="Microvm",
                serviceCode="lambda",
                quotaCode=MEMORY_QUOTA_CODE,
            )
        vm_id = self._new_id()
        vm = Microvm(
            id=vm_id,
            image=image,
            image_version=version,
            started_at=now,
            max_duration=int(params.get("maximumDurationInSeconds") or MAX_DURATION_SECONDS),
            request=copy.deepcopy(params),
            endpoint=f"https://{vm_id}.lambda-microvm.{self.region}.on.aws",
            idle=params.get("idlePolicy"),
        )
        vm.record(now, "PENDING")
        crash = self._take_fault("RunMicrovm", "crash", image.arn)
        if crash is not None:
            vm.crash_at, vm.crash_reason = now + crash.after_seconds, crash.reason
        self._vms[vm_id] = vm
        self._by_image.setdefault(image.name, []).append(vm)
        self._ever.append(vm)
        if token:
            self._tokens[token] = (fingerprint, vm_id)
        return self._describe(vm, now)

    def _op_GetMicrovm(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        return self._describe(self._vm(params["microvmIdentifier"], now), now)

    def _op_ListMicrovms(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        wanted = params.get("imageIdentifier")
        version = params.get("imageVersion")
        size = params.get("maxResults") or 50
        items = []
        if wanted:
            name = wanted.rsplit(":microvm-image:", 1)[-1]
            candidates = self._by_image.get(name, [])
            # Forget VMs that no longer show anywhere, so long simulations stay fast.
            self._by_image[name] = candidates = [v for v in candidates if not self._gone(v, now)]
        else:
            candidates = list(self._vms.values())
        for vm in sorted(candidates, key=lambda v: (v.started_at, v.id)):
            self._advance(vm, now)
            if self._gone(vm, now):
                continue
            if wanted and wanted not in (vm.image.arn, vm.image.name):
                continue
            if version and vm.image_version != version:
                continue
            state, _, _ = self._view(vm, now)
            items.append(
                {
                    "microvmId": vm.id,
                    "state": state,
                    "imageArn": vm.image.arn,
                    "imageVersion": vm.image_version,
                    "startedAt": dt.datetime.fromtimestamp(vm.started_at, dt.timezone.utc),
                }
            )
        offset = _wire.read_page_token(params.get("nextToken"))
        page = items[offset : offset + size]
        more = offset + size < len(items)
        return {"items": page, "nextToken": _wire.page_token(offset + size) if more else None}

    def _op_SuspendMicrovm(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if vm.state in ("SUSPENDING", "SUSPENDED"):
            return {}
        if vm.state != "RUNNING":
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}; only a RUNNING MicroVM can be suspended")
        vm.record(now, "SUSPENDING")
        return {}

    def _op_ResumeMicrovm(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if vm.state != "SUSPENDED":
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}; only a SUSPENDED MicroVM can be resumed")
        vm.record(now, "RUNNING")
        vm.last_activity = now
        return {}

    def _op_TerminateMicrovm(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if vm.state not in ("TERMINATING", "TERMINATED"):
            vm.record(now, "TERMINATING", "terminated_by_request")
        return {}

    def _op_CreateMicrovmAuthToken(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        vm = self._vm(params["microvmIdentifier"], now)
        if params["expirationInMinutes"] > 60:
            raise validation("expirationInMinutes: the maximum is 60 minutes")
        if vm.state in ("TERMINATING", "TERMINATED"):
            raise self._conflict(vm, f"MicroVM {vm.id} is {vm.state}")
        for port in params["allowedPorts"]:
            if len([k for k in ("port", "range", "allPorts") if k in port]) != 1:
                raise validation("each allowedPorts entry sets exactly one of port, range, allPorts")
        return {"authToken": {"X-aws-proxy-auth": secrets.token_urlsafe(48)}}

    def _image_view(self, image: Image, now: float, full: bool) -> dict[str, Any]:
        view = {
            "imageArn": image.arn,
            "name": image.name,
            "state": image.state(now),
            "latestActiveImageVersion": image.version if image.state(now) == "CREATED" else None,
            "createdAt": dt.datetime.fromtimestamp(image.created_at, dt.timezone.utc),
        }
        if full:
            view["tags"] = dict(image.tags) or None
        return view

    def _op_CreateMicrovmImage(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        name = params["name"]
        if name in self._images:
            raise WireError(
                "ConflictException",
                f"MicroVM image {name} already exists",
                resourceId=self.image_arn(name),
                resourceType="MicrovmImage",
            )
        resources = params.get("resources") or [{"minimumMemoryInMiB": 2048}]
        image = Image(
            name,
            self.image_arn(name),
            int(resources[0]["minimumMemoryInMiB"]),
            now,
            now + self.image_build_seconds,
            tags=dict(params.get("tags") or {}),
            request=copy.deepcopy(params),
        )
        self._images[name] = image
        result = {k: v for k, v in params.items() if k not in ("clientToken",)}
        result.update(self._image_view(image, now, full=True))
        result["imageVersion"] = image.version
        return result

    def _op_GetMicrovmImage(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        identifier = params["imageIdentifier"]
        name = identifier.rsplit(":microvm-image:", 1)[-1].split(":")[0]
        image = self._images.get(name)
        if image is None:
            raise WireError(
                "ResourceNotFoundException", f"MicroVM image {identifier} not found",
                resourceType="MicrovmImage", resourceId=identifier,
            )
        return self._image_view(image, now, full=True)

    def _op_ListMicrovmImages(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        needle = params.get("nameFilter") or ""
        items = [
            self._image_view(i, now, full=False)
            for i in sorted(self._images.values(), key=lambda i: i.name)
            if needle in i.name
        ]
        size = params.get("maxResults") or 50
        offset = _wire.read_page_token(params.get("nextToken"))
        more = offset + size < len(items)
        return {"items": items[offset : offset + size], "nextToken": _wire.page_token(offset + size) if more else None}

    def _taggable(self, arn: str) -> Image:
        name = arn.rsplit(":microvm-image:", 1)[-1] if ":microvm-image:" in arn else None
        image = self._images.get(name or "")
        if image is None or image.arn != arn:
            raise WireError("ResourceNotFoundException", f"Resource {arn} not found", resourceId=arn)
        return image

    def _op_TagResource(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        self._taggable(params["Resource"]).tags.update(params["Tags"])
        return {}

    def _op_UntagResource(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        image = self._taggable(params["Resource"])
        for key in params["TagKeys"]:
            image.tags.pop(key, None)
        return {}

    def _op_ListTags(self, params: dict[str, Any], now: float) -> dict[str, Any]:  # noqa: N802
        return {"Tags": dict(self._taggable(params["Resource"]).tags)}

    # ------------------------------------------------------------------ admin API (other tools)

    def admin(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """``/_emulator/...``: create images, move the virtual clock, read VMs, send traffic."""
        data = json.loads(body or b"{}")
        parts = path.strip("/").split("/")[1:]
        if method == "POST" and parts == ["images"]:
            arn = self.create_image(data["name"], int(data.get("memory_mib", 2048)))
            return _json(200, {"imageArn": arn})
        if method == "POST" and parts == ["clock", "advance"]:
            if not isinstance(self.clock, VirtualClock):
                return _json(409, {"message": "the clock is real; start with --virtual-clock"})
            return _json(200, {"now": self.clock.advance(float(data["seconds"]))})
        if method == "GET" and parts == ["microvms"]:
            return _json(200, {"items": self.microvms()})
        if method == "POST" and len(parts) == 2 and parts[0] == "traffic":
            return _json(200, {"status": self.traffic(parts[1])})
        return _json(404, {"message": f"no admin route {method} {path}"})


class DirectClient:
    """boto3-shaped calls straight into a :class:`MicrovmsEmulator` (see ``direct_client``)."""

    _OPERATIONS = {
        "run_microvm": "RunMicrovm",
        "list_microvms": "ListMicrovms",
        "get_microvm": "GetMicrovm",
        "suspend_microvm": "SuspendMicrovm",
        "resume_microvm": "ResumeMicrovm",
        "terminate_microvm": "TerminateMicrovm",
        "create_microvm_auth_token": "CreateMicrovmAuthToken",
    }

    def __init__(self, emulator: MicrovmsEmulator) -> None:
        from botocore.exceptions import ClientError

        self._emulator = emulator
        self._error = ClientError

    def __getattr__(self, method: str) -> Callable[..., dict[str, Any]]:
        operation = self._OPERATIONS.get(method)
        if operation is None:
            raise AttributeError(method)

        def call(**params: Any) -> dict[str, Any]:
            try:
                result = self._emulator._call(operation, dict(params))
            except WireError as err:
                response = {
                    "Error": {"Code": err.code, "Message": err.message},
                    "ResponseMetadata": {"HTTPStatusCode": err.status},
                    **err.fields,
                }
                raise self._error(response, operation) from None
            return {k: v for k, v in result.items() if v is not None}

        return call


def _json(status: int, data: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


def _handler_for(emulator: MicrovmsEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "MicrovmsEmulator/1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; without this, Nagle's algorithm and the
            # client's delayed ACK add 40 ms to every keep-alive request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            if url.path.startswith("/_emulator/"):
                status, headers, payload = emulator.admin(self.command, url.path, body)
            else:
                status, headers, payload = emulator.handle(self.command, url.path, url.query, body)
            self.send_response(status)
            headers = {"x-amzn-RequestId": str(uuid.uuid4()), **headers, "Content-Length": str(len(payload))}
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if payload:
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve  # noqa: N815

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    return Handler


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m rayito_constructs.testing.microvms --port N``: run until interrupted."""
    parser = argparse.ArgumentParser(description="A local AWS Lambda MicroVMs service for tests")
    parser.add_argument("--port", type=int, default=4566)
    parser.add_argument("--virtual-clock", action="store_true", help="time moves only via POST /_emulator/clock/advance")
    parser.add_argument("--pending-seconds", type=float, default=12.0)
    parser.add_argument("--suspending-seconds", type=float, default=1.0)
    parser.add_argument("--terminating-seconds", type=float, default=3.0)
    parser.add_argument("--terminated-linger-seconds", type=float, default=600.0)
    parser.add_argument("--memory-quota-mib", type=int, default=DEFAULT_MEMORY_QUOTA_MIB)
    parser.add_argument("--no-rate-limits", action="store_true")
    parser.add_argument("--image", action="append", default=[], metavar="NAME[:MEMORY_MIB]", help="create an image at start")
    args = parser.parse_args(argv)
    emulator = MicrovmsEmulator(
        port=args.port,
        clock=VirtualClock() if args.virtual_clock else RealClock(),
        pending_seconds=args.pending_seconds,
        suspending_seconds=args.suspending_seconds,
        terminating_seconds=args.terminating_seconds,
        terminated_linger_seconds=args.terminated_linger_seconds,
        memory_quota_mib=args.memory_quota_mib,
        rate_limits=not args.no_rate_limits,
    )
    with emulator:
        for spec in args.image:
            name, _, memory = spec.partition(":")
            print(emulator.create_image(name, int(memory or 2048)), flush=True)
        print(f"MicroVMs emulator on {emulator.endpoint_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
