"""What the egress tests and benchmark run against: moto's DynamoDB over real HTTP (counting what
it was asked), a store that accepts and never answers, an upstream HTTP target that records what
reached it, and a virtual store clock. Every server binds port 0 once and hands its port over."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

from rayito_constructs.egress import BudgetClient, store_client
from .moto_server import untraced


class CountingStore:
    """moto in server mode (DynamoDB and the rest) on 127.0.0.1, counting the calls it answers per
    operation (the ground truth for store calls per grant), one request at a time."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        app = untraced(DomainDispatcherApplication(create_backend_app))

        serial = threading.Lock()

        def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            operation = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2] or environ.get("PATH_INFO", "")
            with self._lock:
                self.calls[operation] += 1
            # DynamoDB applies each write to an item atomically, conditions included; moto's
            # server runs requests in threads with no lock, so two conditional updates of one
            # item can interleave (and a read can see an item half written). One request at a
            # time makes it as atomic as the service.
            with serial:
                return list(app(environ, start_response))

        class Quiet(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        self._server = make_server("127.0.0.1", 0, counting, threaded=True, request_handler=Quiet)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.calls)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def counting_store() -> Iterator[CountingStore]:
    store = CountingStore()
    try:
        yield store
    finally:
        store.close()


def ddb(endpoint: str, **kwargs: Any) -> Any:
    """The production store client (one attempt) pointed at a test endpoint. Its read timeout is
    10 s rather than 1 s by default: this machine's two cores are shared, and a slow answer from
    moto is not the fault a test means (the hung-store tests set their own)."""
    kwargs.setdefault("read_timeout", 10.0)
    kwargs.setdefault("connect_timeout", 5.0)
    return store_client(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", **kwargs)


@contextmanager
def hung_store() -> Iterator[str]:
    """A socket that accepts connections and never answers: a store that hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def virtual_store_time(client: Any, clock: Callable[[], float]) -> None:
    """Make the store's ``Date`` header come from a virtual clock (the store's clock is the one a
    test moves); the client, its serializer and its parser stay real."""

    def stamp(response_dict: dict[str, Any], **_: Any) -> None:
        response_dict["headers"]["date"] = formatdate(clock(), usegmt=True)

    client.meta.events.register("before-parse.dynamodb.*", stamp)


class Clock:
    """A virtual clock (seconds), for a process and, with ``virtual_store_time``, its store."""

    def __init__(self, now: float = 1_790_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TickingClock(Clock):
    """A virtual clock that moves ``step`` seconds each time it is read: time passes between
    calls, as it does for real, without a test waiting for it."""

    def __init__(self, now: float = 1_790_000_000.0, step: float = 0.0005) -> None:
        super().__init__(now)
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Upstream:
    """An HTTP target on 127.0.0.1 that records each request that reached it (method, path,
    arrival time) and answers what ``respond(path, count)`` says: (status, headers)."""

    def __init__(self, respond: Optional[Callable[[str, int], tuple[int, dict[str, str]]]] = None) -> None:
        self.respond = respond or (lambda path, n: (200, {}))
        self.seen: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                with outer._lock:
                    outer.seen.append((self.command, self.path, time.time()))
                    count = len(outer.seen)
                status, headers = outer.respond(self.path, count)
                body = b"ok"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_HEAD = _any

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def paths(self) -> list[str]:
        with self._lock:
            return [p for _, p, _ in self.seen]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def conforms(intervals: list[tuple[float, float]], rate: float, burst: int, slack: float = 0.0) -> Optional[str]:
    """Whether grants, each known only to have happened within ``(start, end)``, can be those of a
    token bucket of ``rate`` and ``burst``: for every run of grants, those that surely happened
    between the earliest start and the latest end are at most ``burst + rate x span``. Returns
    the first violation, or None."""
    import bisect

    spans = sorted(intervals)
    for i in range(len(spans)):
        a = spans[i][0]
        ends = sorted(e for s, e in spans[i:] if s >= a)
        for k, b in enumerate(ends):
            inside = bisect.bisect_right(ends, b)
            if inside > burst + rate * (b - a) + slack:
                return f"{inside} grants within {b - a:.3f} s, the envelope allows {burst + rate * (b - a):.2f}"
    return None


# ------------------------------------------------------------------------------------ processes

def hammer(endpoint: str, table: str, target: str, rate: float, burst: int, skew: float, barrier: Any,
           start: Any, seconds: float, results: Any, go: Any = None, granted: Any = None, enough: int = 0) -> None:
    """A worker process: its clock is ``skew`` seconds off; after the barrier (and ``go``, when
    given: a process that starts mid-window) it acquires as fast as it can until ``start +
    seconds`` (or until the workers' shared ``granted`` count reaches ``enough``) and sends each
    grant's (sent, answered) in true time as it happens."""
    from rayito_constructs.egress import BudgetClient, Envelope, Granted

    barrier.wait(timeout=300)
    if go is not None:
        go.wait(timeout=300)
    client = BudgetClient(table, ddb(endpoint, read_timeout=5.0), envelopes=[Envelope(target, rate, burst)],
                          clock=lambda: time.time() + skew)
    while time.time() < start.value:
        time.sleep(0.001)
    end = start.value + seconds
    while time.time() < end and not (granted is not None and granted.value >= enough):
        sent = time.time()
        decision = client.acquire(f"{target}/work")
        answered = time.time()
        if isinstance(decision, Granted):
            results.put(("grant", sent, answered))
            if granted is not None:
                with granted.get_lock():
                    granted.value += 1
        elif decision.reason == "limiter_unavailable":
            results.put(("outage", sent, answered))
        else:
            time.sleep(min(decision.retry_after_seconds, 0.05))
    results.put(("done", skew, client.stats.calls))


_SEED = 0


def new_client(store, table, clock, *, local=None, warm=True, **kwargs) -> BudgetClient:
    """A client whose store runs on ``clock``; its own clock is ``local`` (default: the same).
    ``warm``: it has seen the store's clock turn a second (as the background calibration does)."""
    client = ddb(store.endpoint)
    virtual_store_time(client, clock)
    global _SEED
    _SEED += 1
    budget = BudgetClient(table, client, clock=local or clock, seed=_SEED, calibrate=False, **kwargs)
    if warm:
        now = clock.now
        clock.now = float(int(now)) - 0.001
        budget.sync_clock()
        clock.now = float(int(now)) + 1.0
        budget.sync_clock()
        clock.now = max(now, clock.now)
    return budget
