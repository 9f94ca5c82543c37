"""A VM's endpoint, as the AWS proxy in front of it: one port, gRPC and HTTP/1.1.

The product's client reaches a VM at ``<endpoint>:443`` over TLS: gRPC (ALPN ``h2``) to rayd,
which the proxy maps to the VM's port 8080, and HTTP/1.1 (the agent's invoke, ``/ping``) to the
VM port named by ``x-aws-proxy-port`` (``_agent/_deployment.py``). The front does the same on
each VM's loopback address, on two listeners:

* **plaintext** on ``<endpoint>:<port>`` (one port for every VM of the emulator): HTTP/2 with
  prior knowledge (the ``PRI * HTTP/2.0`` preface) goes to rayd, anything else is HTTP/1.1. This
  is what ``TransportSettings(channel_credentials=grpc.local_channel_credentials(), port=<port>)``
  and ``HttpsTransport(host, port=<port>, secure=False)`` reach (``seams.py``);
* **TLS** on ``<endpoint>:443`` (``host_vms=True, tls_front=True``): a certificate for the VM's IP
  from the test CA (``pki.py``), ALPN ``h2`` to rayd, ``http/1.1`` (or none) to HTTP/1.1. This is
  what the unmodified CLI reaches, pointed at the CA by ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` and
  ``SSL_CERT_FILE``.

What the proxy does that is modelled here: every new connection is inbound traffic
(``MicrovmsBackend.traffic``: a SUSPENDED VM with ``autoResumeEnabled`` is resumed and the
connection held until ``/resume`` returns; requests and answers crossing an open connection keep
the VM from going idle, at most one note a second: HTTP/1.1 bytes, and HTTP/2 HEADERS and DATA
frames, not the PINGs the product's channels send every 30 s when idle, since an open but silent
stream did not keep a VM awake, measured Q15); a VM still PENDING from its launch answers (Q78: traffic
can reach the VM before ``/run``); a VM whose app exited or that is suspended without auto-resume
gets 502 on HTTP/1.1 and a closed connection on HTTP/2; an ended VM's listeners are closed
(connection refused; measured: the client times out). For HTTP/1.1, ``x-aws-proxy-auth`` must be
a token CreateMicrovmAuthToken minted for this VM, unexpired, whose ``allowedPorts`` include
``x-aws-proxy-port`` (else 403); the port must have a listener the stand-in knows (else 502). The
request is forwarded as sent (the proxy's headers included). gRPC is relayed as bytes, so its
``x-aws-proxy-*`` metadata is not checked here. When the VM starts suspending, its open
connections are closed (measured: an idle VM's silent stream was cut about 57 s after the
suspension; here at once).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .vm_host import Guest

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: How long a connection may take to say what it is (TLS handshake, first bytes, HTTP head).
FIRST_BYTES_SECONDS = 30.0
MAX_HEAD_BYTES = 64 * 1024
#: Bytes on an open connection count as activity at most this often.
ACTIVITY_EVERY_SECONDS = 1.0
RELAY_BUFFER = 65536


class GuestFront:
    """The listeners and open connections of one VM's endpoint."""

    def __init__(self, guest: "Guest", sockets: list[socket.socket]) -> None:
        self.guest = guest
        self.backend = guest.host.backend
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = False
        self.accepted = 0
        self._tls: Optional[ssl.SSLContext] = None
        if guest.host.tls:
            self._tls = guest.host.ca.server_context(guest.endpoint)
        for index, sock in enumerate(sockets):
            secure = index == 1
            threading.Thread(target=self._accept, args=(sock, secure), daemon=True,
                             name=f"rayd-front-{guest.endpoint}-{'tls' if secure else 'plain'}").start()

    def _accept(self, listener: socket.socket, secure: bool) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if self._closed:
                conn.close()
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn, secure), daemon=True,
                             name=f"rayd-conn-{self.guest.endpoint}").start()

    # ------------------------------------------------------------------ one connection

    def _serve(self, conn: socket.socket, secure: bool) -> None:
        opened: list[socket.socket] = []  # the upstream sockets, closed with the connection
        raw = conn
        self._register(raw)
        try:
            conn.settimeout(FIRST_BYTES_SECONDS)
            if secure:
                assert self._tls is not None
                conn = self._tls.wrap_socket(conn, server_side=True)
                self._register(conn)
                h2 = conn.selected_alpn_protocol() == "h2"  # type: ignore[attr-defined]
                first = b""
            else:
                first = _read_at_least(conn, len(H2_PREFACE), stop=lambda b: not H2_PREFACE.startswith(b[:len(H2_PREFACE)]))
                h2 = first.startswith(H2_PREFACE)
            admitted = self._admit()
            if h2:
                self._serve_h2(conn, first, admitted, opened)
            else:
                self._serve_http1(conn, first, admitted, opened)
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            self._unregister(raw)
            self._unregister(conn)
            for sock in (conn, *opened):
                with contextlib.suppress(OSError):
                    sock.close()

    def _serve_h2(self, conn: socket.socket, first: bytes, admitted: int, opened: list[socket.socket]) -> None:
        """HTTP/2 (rayd's gRPC): relayed to rayd when admitted, dropped otherwise."""
        if admitted != 200:
            return
        upstream = self._rayd()
        if upstream is None:
            return
        opened.append(upstream)
        conn.settimeout(None)
        self._relay(conn, upstream, first, h2=True)

    def _serve_http1(self, conn: socket.socket, first: bytes, admitted: int, opened: list[socket.socket]) -> None:
        """HTTP/1.1: relayed to the port ``x-aws-proxy-port`` names when the token allows it."""
        head = first
        while b"\r\n\r\n" not in head and len(head) < MAX_HEAD_BYTES:
            chunk = conn.recv(RELAY_BUFFER)
            if not chunk:
                return
            head += chunk
        if b"\r\n\r\n" not in head:
            return _reply(conn, 431, "request head too large")
        if admitted != 200:
            return _reply(conn, 502, "the MicroVM is not serving") if admitted == 502 else None
        headers = _headers(head)
        try:
            vm_port = int(headers.get("x-aws-proxy-port", ""))
        except ValueError:
            return _reply(conn, 400, "x-aws-proxy-port is missing or not a port")
        if not self.backend.auth_token_allows(self.guest.vm_id, headers.get("x-aws-proxy-auth"), vm_port):
            return _reply(conn, 403, "Forbidden")
        local = self.guest.ports.get(vm_port)
        if local is None:
            return _reply(conn, 502, f"nothing listens on port {vm_port} of the MicroVM")
        try:
            upstream = socket.create_connection(("127.0.0.1", local), timeout=10)
        except OSError:
            return _reply(conn, 502, f"nothing listens on port {vm_port} of the MicroVM")
        opened.append(upstream)
        conn.settimeout(None)
        upstream.settimeout(None)
        self._relay(conn, upstream, head)

    def _admit(self) -> int:
        """What the proxy does with a new connection: 200 (let through), 502 or 504."""
        guest = self.guest
        if not guest.ready.wait(FIRST_BYTES_SECONDS) or guest.halted or guest.rayd_port is None:
            return 504
        status = self.backend.traffic(guest.vm_id)
        if status == 502 and guest.ran_at is None and guest.state == "PENDING":
            return 200  # launching: rayd answers before /run (Q78)
        return status

    def _rayd(self) -> Optional[socket.socket]:
        port = self.guest.rayd_port
        if port is None:
            return None
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            return None

    def _relay(self, client: socket.socket, upstream: socket.socket, first: bytes, *, h2: bool = False) -> None:
        """Copy bytes both ways in one thread (an SSL socket is never used by two threads)."""
        scanners = {client: _Frames(preface=True), upstream: _Frames(preface=False)} if h2 else None
        if first:
            upstream.sendall(first)
            if scanners is not None:
                scanners[client].feed(first)
        self._register(upstream)
        noted = time.monotonic() - ACTIVITY_EVERY_SECONDS
        try:
            while True:
                pending = isinstance(client, ssl.SSLSocket) and client.pending()
                ready = [client] if pending else select.select([client, upstream], [], [], 5.0)[0]
                if not ready:
                    if self._closed or self.guest.halted:
                        return
                    continue
                active = False
                for sock in ready:
                    data = sock.recv(RELAY_BUFFER)
                    if not data:
                        return
                    (upstream if sock is client else client).sendall(data)
                    moved = True if scanners is None else scanners[sock].feed(data)
                    active = active or moved
                now = time.monotonic()
                if active and now - noted >= ACTIVITY_EVERY_SECONDS:
                    noted = now
                    self.backend.traffic(self.guest.vm_id)
        finally:
            self._unregister(upstream)

    # ------------------------------------------------------------------ bookkeeping

    def _register(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.add(sock)

    def _unregister(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.discard(sock)

    def drop_connections(self) -> None:
        """Cut every open connection (the VM is suspending)."""
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.drop_connections()


class _Frames:
    """Follows the HTTP/2 frames of one direction: ``feed`` says whether the bytes held a HEADERS
    or DATA frame (a request or an answer), not only PING, SETTINGS or WINDOW_UPDATE."""

    ACTIVE_TYPES = frozenset({0x0, 0x1})  # DATA, HEADERS

    def __init__(self, *, preface: bool) -> None:
        self._skip = len(H2_PREFACE) if preface else 0  # the client's connection preface
        self._header = b""

    def feed(self, data: bytes) -> bool:
        active = False
        view = memoryview(data)
        while view:
            if self._skip:
                taken = min(self._skip, len(view))
                self._skip -= taken
                view = view[taken:]
                continue
            needed = 9 - len(self._header)
            self._header += bytes(view[:needed])
            view = view[needed:]
            if len(self._header) < 9:
                break
            length = int.from_bytes(self._header[:3], "big")
            active = active or self._header[3] in self.ACTIVE_TYPES
            self._header, self._skip = b"", length
        return active


def _read_at_least(conn: socket.socket, size: int, *, stop: Any) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
        if stop(data):
            break
    return data


def _headers(head: bytes) -> dict[str, str]:
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _reply(conn: socket.socket, status: int, message: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    body = json.dumps({"message": message}).encode()
    conn.sendall(
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    )
