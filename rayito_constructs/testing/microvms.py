"""``MicrovmsEmulator``: a local AWS Lambda MicroVMs service that real boto3 clients talk to.

    with MicrovmsEmulator() as emulator:
        client = boto3.client("lambda-microvms", endpoint_url=emulator.endpoint_url,
                              region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        image = emulator.create_image("mi-agente", memory_mib=2048)
        vm = client.run_microvm(imageIdentifier=image)

It speaks the service's ``rest-json`` protocol as botocore's model describes it (routes, status
codes, members, error shapes) and behaves as the service was *measured* to behave (timings,
held bursts before 429, idempotent suspend/resume, late reads, lingering TERMINATED VMs, image
versions; every default and its measurement in ``measured.py`` and docs/testing.md);
``profile="documented"`` keeps the strictly documented behaviour. Time is real by default;
``clock=VirtualClock()`` lets a test advance it, so a day runs in seconds.

The state and rules live in :class:`~.backend.MicrovmsBackend` (callable without HTTP); this
class adds the socket server, boto3 clients and the admin API. Run it for other tools with
``python -m rayito_constructs.testing.microvms --port 4566``. See docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any, Optional

from . import measured
from .backend import IMPLEMENTED, MicrovmsBackend, RequestRecord
from .clock import RealClock, VirtualClock
from .exceptions import WireError
from .faults import Fault
from .measured import DOCUMENTED_RATE_LIMITS, MEMORY_QUOTA_CODE, QUOTA_CODES
from .server import DirectClient, handle, http_handler, install_in_process

#: The documented default quotas, ``{operation: (rate_per_second, burst)}`` (see ``measured.py``).
DEFAULT_RATE_LIMITS = DOCUMENTED_RATE_LIMITS
DEFAULT_OTHER_RATE_LIMIT = measured.OTHER_RATE_LIMIT
DEFAULT_MEMORY_QUOTA_MIB = measured.MEMORY_QUOTA_MIB
MAX_DURATION_SECONDS = measured.MAX_DURATION_SECONDS

__all__ = [
    "DEFAULT_RATE_LIMITS", "DirectClient", "Fault", "IMPLEMENTED", "MEMORY_QUOTA_CODE", "MicrovmsEmulator",
    "QUOTA_CODES", "RealClock", "RequestRecord", "VirtualClock", "WireError", "main",
]


class _Server(ThreadingHTTPServer):
    # socketserver's default backlog is 5: a burst of 20 clients connecting at once was reset.
    request_queue_size = 256
    daemon_threads = True


class MicrovmsEmulator(MicrovmsBackend):
    """A Lambda MicroVMs service on 127.0.0.1. Use it as a context manager, or ``start``/``stop``.

    :param port: port to listen on. Default: a free one.

    Every other parameter is :class:`~.backend.MicrovmsBackend`'s (the clock, the profile, the
    measured timings, quotas, consistency, seed).
    """

    def __init__(self, *, port: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self._port = port
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ the server

    def start(self) -> "MicrovmsEmulator":
        """Start listening on 127.0.0.1."""
        if self._server is not None:
            return self
        self._server = _Server(("127.0.0.1", self._port), http_handler(self, self.admin))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="microvms-emulator", daemon=True
        )
        self._thread.start()
        if self.tls_front:
            try:
                _ = self.vm_host  # bind 443 now: a front that cannot is an error at start, not at a VM's launch
            except PermissionError:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """Stop listening, and end what runs for the hosted VMs (``host_vms``)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.close()

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

    def handle(self, method: str, path: str, query: str, body: bytes,
               headers: Optional[dict[str, str]] = None) -> tuple[int, dict[str, str], bytes]:
        """Answer one HTTP request: status, headers, body."""
        return handle(self, method, path, query, body, headers)

    # ------------------------------------------------------------------ clients

    def client(self, *, in_process: bool = False, retries: int = 1, access_key: str = "testing",
               session: Any = None, **config: Any) -> Any:
        """A boto3 ``lambda-microvms`` client for this emulator.

        ``retries`` is botocore's ``total_max_attempts`` (standard mode); ``access_key`` names the
        caller in ``requests`` (who started which VM). ``in_process=True`` skips the socket:
        botocore still serializes, signs and parses everything, but hands the request to the
        emulator directly (the way moto's stubber hooks ``before-send``), several times faster.
        ``session``: a boto3 session to make it from (for instance the reconciler Lambda's).
        """
        import boto3
        from botocore.config import Config

        endpoint = self.endpoint_url if self._server else "http://emulator.invalid"
        config.setdefault("retries", {"total_max_attempts": retries, "mode": "standard"})
        client = (session or boto3).client(
            "lambda-microvms",
            endpoint_url=endpoint,
            region_name=self.region,
            aws_access_key_id=access_key,
            aws_secret_access_key="testing",
            config=Config(**config),
        )
        if in_process:
            install_in_process(client, self)
        return client

    def direct_client(self, caller: Optional[str] = None) -> DirectClient:
        """A client with boto3's method names and error shapes that calls the emulator without
        serializing anything. It skips input validation; use :meth:`client` to test code."""
        return DirectClient(self, caller)

    # ------------------------------------------------------------------ admin API (other tools)

    def admin(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """``/_emulator/...``: images and versions, the virtual clock, VMs, traffic, app exits,
        faults and the request log. Bad input is a 400 with a message, never a dropped connection."""
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            return self._admin(method, path.strip("/").split("/")[1:], data)
        except (ValueError, TypeError, KeyError) as exc:
            message = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            return _json(400, {"message": message})

    def _admin(self, method: str, parts: list[str], data: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        if method == "POST" and parts == ["images"]:
            arn = self.create_image(str(data["name"]), int(data.get("memory_mib", 2048)), fresh=bool(data.get("fresh", False)),
                                    rayd=bool(data.get("rayd", False)), app_dir=data.get("app_dir"))
            return _json(200, {"imageArn": arn})
        if method == "POST" and len(parts) == 3 and parts[0] == "images" and parts[2] == "versions":
            version = self.publish_version(parts[1], data.get("version"), fresh=bool(data.get("fresh", True)))
            return _json(200, {"imageVersion": version})
        if method == "POST" and parts == ["clock", "advance"]:
            if not isinstance(self.clock, VirtualClock):
                return _json(409, {"message": "the clock is real; start with --virtual-clock"})
            return _json(200, {"now": self.clock.advance(_number(data["seconds"]))})
        if method == "GET" and parts == ["clock"]:
            return _json(200, {"now": self.clock.now()})
        if method == "GET" and parts == ["microvms"]:
            return _json(200, {"items": self.microvms()})
        if method == "GET" and len(parts) == 3 and parts[0] == "microvms" and parts[2] == "rpcs":
            host = self.vm_host
            if host is None:
                return _json(409, {"message": "no VMs run here; start with --host-vms"})
            try:
                guest = host.guest(parts[1])
            except KeyError:
                return _json(404, {"message": f"no hosted MicroVM {parts[1]}"})
            return _json(200, {"items": [r.__dict__ for r in guest.calls()], "rewrites": guest.rewrites})
        if method == "POST" and len(parts) == 2 and parts[0] == "traffic":
            return _json(200, {"status": self.traffic(parts[1])})
        if method == "POST" and len(parts) == 3 and parts[0] == "microvms" and parts[2] == "exit":
            try:
                self.exit_app(parts[1], int(data.get("code", 0)))
            except KeyError:
                return _json(404, {"message": f"no MicroVM {parts[1]}"})
            return _json(200, {})
        if method == "POST" and parts == ["faults"]:
            options = {k: v for k, v in data.items() if k not in ("operation", "kind")}
            self.inject(str(data["operation"]), str(data["kind"]), **options)
            return _json(200, {})
        if method == "GET" and parts == ["requests"]:
            return _json(200, {"items": [r.__dict__ for r in list(self.requests)]})
        return _json(404, {"message": f"no admin route {method} /_emulator/{'/'.join(parts)}"})


def _number(value: Any) -> float:
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"seconds: {value!r} is not a finite number")
    return number


def _json(status: int, data: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m rayito_constructs.testing.microvms --port N``: run until interrupted."""
    parser = argparse.ArgumentParser(description="A local AWS Lambda MicroVMs service for tests")
    parser.add_argument("--port", type=int, default=4566)
    parser.add_argument("--virtual-clock", action="store_true", help="time moves only via POST /_emulator/clock/advance")
    parser.add_argument("--profile", choices=sorted(measured.PROFILES), default="measured")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--pending-seconds", type=float, default=measured.PENDING_SECONDS)
    parser.add_argument("--suspending-seconds", type=float, default=measured.SUSPENDING_SECONDS)
    parser.add_argument("--resume-seconds", type=float, default=measured.RESUME_SECONDS)
    parser.add_argument("--terminating-seconds", type=float, default=measured.TERMINATING_SECONDS)
    parser.add_argument("--terminated-linger-seconds", type=float, default=measured.TERMINATED_LINGER_SECONDS)
    parser.add_argument("--consistency-seconds", type=float, default=measured.CONSISTENCY_SECONDS)
    parser.add_argument("--memory-quota-mib", type=int, default=None,
                        help=f"default: the region's ({DEFAULT_MEMORY_QUOTA_MIB} MiB in us-east-1)")
    parser.add_argument("--no-rate-limits", action="store_true")
    parser.add_argument("--image", action="append", default=[], metavar="NAME[:MEMORY_MIB]", help="create an image at start")
    parser.add_argument("--host-vms", action="store_true",
                        help="run the VMs here: loopback endpoints, a stand-in rayd for rayd images")
    parser.add_argument("--tls-front", action="store_true", help="with --host-vms: TLS on <endpoint>:443 (root)")
    parser.add_argument("--rayd-image", action="append", default=[], metavar="NAME[:APP_DIR]",
                        help="with --host-vms: create an image of the product's base (rayd, every hook on)")
    args = parser.parse_args(argv)
    try:
        emulator = MicrovmsEmulator(
            port=args.port,
            clock=VirtualClock() if args.virtual_clock else RealClock(),
            profile=args.profile,
            seed=args.seed,
            pending_seconds=args.pending_seconds,
            suspending_seconds=args.suspending_seconds,
            resume_seconds=args.resume_seconds,
            terminating_seconds=args.terminating_seconds,
            terminated_linger_seconds=args.terminated_linger_seconds,
            consistency_seconds=args.consistency_seconds,
            memory_quota_mib=args.memory_quota_mib,
            rate_limits=not args.no_rate_limits,
            host_vms=args.host_vms or args.tls_front or bool(args.rayd_image),
            tls_front=args.tls_front,
        )
        images = []
        for spec in args.image:
            name, _, memory = spec.partition(":")
            images.append((name, int(memory or 2048)))
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    with emulator:
        for name, memory in images:
            try:
                print(emulator.create_image(name, memory), flush=True)
            except ValueError as exc:
                parser.exit(2, f"{parser.prog}: error: --image {name}:{memory}: {exc}\n")
        for spec in args.rayd_image:
            name, _, app_dir = spec.partition(":")
            try:
                print(emulator.create_image(name, rayd=True, app_dir=app_dir or None), flush=True)
            except ValueError as exc:
                parser.exit(2, f"{parser.prog}: error: --rayd-image {spec}: {exc}\n")
        if emulator.vm_host is not None and emulator.vm_host.ca_file is not None:
            print(f"test CA: {emulator.vm_host.ca_file}", flush=True)
        print(f"MicroVMs emulator on {emulator.endpoint_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
