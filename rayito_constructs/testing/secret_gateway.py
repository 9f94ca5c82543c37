"""The stand-in rayd's secret gateway: one local forwarder per route (``ConfigureService``).

The product's client sends ``Configure(secret_gateway.routes=[{name, upstream, headers{header:
resolved secret}, allow[{method, path}], rate_per_minute}])`` and then reads the routes' ports
with ``ConfigureStatus`` (``LISTENING``); the agent host is given ``http://127.0.0.1:<port>`` as
the model's base URL, so the secret never enters the app's environment. Here each route is an
HTTP server on ``127.0.0.1:<a port it binds itself>`` that:

* answers 403 ``{"error": "not_allowed"}`` to a method and path no ``allow`` rule names (a rule's
  path is matched with ``fnmatch`` against the request's path as sent, percent-encoding kept;
  an empty ``allow`` allows everything);
* answers 429 ``{"error": "rate_limited"}`` past ``rate_per_minute`` requests in the last 60 s;
* otherwise forwards the request to ``upstream`` + path with the route's headers set (replacing
  the app's own of the same name) and relays the answer; an upstream it cannot reach is 502
  ``{"error": "upstream_unreachable"}``.

Not known, so assumed: real rayd's matching rules (exact, prefix or glob), its rate window and
its error bodies. The route's port is a port of this machine (several VMs share it), which is the
port ``ConfigureStatus`` reports: the host's environment points at it unchanged.
"""

from __future__ import annotations

import collections
import fnmatch
import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

UPSTREAM_TIMEOUT_SECONDS = 60.0
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host",
                         "content-length", "te", "trailer"})


@dataclass
class Route:
    name: str
    upstream: str
    headers: dict[str, str]
    allow: list[tuple[str, str]]
    rate_per_minute: int = 0
    port: int = 0
    requests: collections.deque = field(default_factory=collections.deque)
    forwarded: int = 0
    refused: int = 0
    server: Optional[ThreadingHTTPServer] = None

    def allows(self, method: str, path: str) -> bool:
        if not self.allow:
            return True
        bare = path.split("?", 1)[0]
        return any(m.upper() in ("*", method.upper()) and fnmatch.fnmatchcase(bare, p) for m, p in self.allow)

    def admit(self, now: float) -> bool:
        if self.rate_per_minute <= 0:
            return True
        while self.requests and now - self.requests[0] >= 60.0:
            self.requests.popleft()
        if len(self.requests) >= self.rate_per_minute:
            return False
        self.requests.append(now)
        return True


class SecretGateway:
    """The routes of one VM, each with its forwarder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}

    def configure(self, routes: list[Route]) -> None:
        """Replace the route set: a route named again keeps its port (its headers, rules and
        upstream are replaced: a key rotation), one not named again is closed."""
        with self._lock:
            wanted = {route.name: route for route in routes}
            for name in list(self._routes):
                if name not in wanted:
                    self._close(self._routes.pop(name))
            for name, route in wanted.items():
                current = self._routes.get(name)
                if current is not None:
                    current.upstream, current.headers = route.upstream, route.headers
                    current.allow, current.rate_per_minute = route.allow, route.rate_per_minute
                    continue
                route.server = _serve(route)
                route.port = route.server.server_address[1]
                self._routes[name] = route

    def routes(self) -> list[Route]:
        with self._lock:
            return list(self._routes.values())

    def close(self) -> None:
        with self._lock:
            for route in self._routes.values():
                self._close(route)
            self._routes.clear()

    @staticmethod
    def _close(route: Route) -> None:
        if route.server is not None:
            route.server.shutdown()
            route.server.server_close()
            route.server = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def _serve(route: Route) -> ThreadingHTTPServer:
    server = _Server(("127.0.0.1", 0), _handler(route))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     name=f"rayd-gateway-{route.name}", daemon=True).start()
    return server


def _handler(route: Route) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if not route.allows(self.command, self.path):
                route.refused += 1
                return self._reply(403, {"error": "not_allowed", "route": route.name})
            if not route.admit(time.monotonic()):
                route.refused += 1
                return self._reply(429, {"error": "rate_limited", "route": route.name})
            target = urllib.parse.urlsplit(route.upstream)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            for name in route.headers:
                for existing in [k for k in headers if k.lower() == name.lower()]:
                    del headers[existing]
            headers.update(route.headers)
            headers["Host"] = target.netloc
            base = target.path.rstrip("/")
            connection_class = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
            try:
                connection = connection_class(target.hostname, target.port, timeout=UPSTREAM_TIMEOUT_SECONDS)
                connection.request(self.command, base + self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                return self._reply(502, {"error": "upstream_unreachable", "route": route.name})
            route.forwarded += 1
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            connection.close()

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any  # noqa: N815

    return Handler
