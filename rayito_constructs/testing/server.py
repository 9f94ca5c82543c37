"""The wire: HTTP requests to :meth:`MicrovmsBackend.call` and back, over a socket or in process.

* :func:`handle` answers one request (method, path, query, headers, body) with status, headers and
  body, as the service's ``rest-json`` protocol does (routes and shapes from ``_wire.py``).
* :func:`http_handler` is the ``BaseHTTPRequestHandler`` of the emulator's socket server.
* :func:`install_in_process` makes a boto3 client hand its requests to :func:`handle` without a
  socket (its serializer, signer and parser stay real).
* :class:`DirectClient` has boto3's method names and error shapes and calls the backend with no
  serialization at all (simulations).
"""

from __future__ import annotations

import email.utils
import re
import socket
import uuid
from functools import lru_cache
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional
from urllib.parse import urlsplit

from . import _wire
from .exceptions import WireError

if TYPE_CHECKING:
    from .backend import MicrovmsBackend

#: Larger bodies are refused (413) before they are read: the largest valid request is far smaller.
MAX_BODY_BYTES = 1 << 20
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def caller_of(headers: Mapping[str, str]) -> Optional[str]:
    """The access key id a SigV4-signed request was signed with (who calls), if any."""
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    if isinstance(auth, bytes):
        auth = auth.decode("latin-1")
    found = _CREDENTIAL.search(auth)
    return found.group(1) if found else None


@lru_cache(maxsize=4)
def _http_date(second: int) -> str:
    return email.utils.formatdate(second, usegmt=True)


def http_date(seconds: float) -> str:
    return _http_date(int(seconds))


def handle(backend: "MicrovmsBackend", method: str, path: str, query: str, body: bytes,
           headers: Optional[Mapping[str, str]] = None) -> tuple[int, dict[str, str], bytes]:
    """Answer one HTTP request: status, headers, body. The ``Date`` header follows the backend's
    clock, virtual or not."""
    status, out, payload = _answer(backend, method, path, query, body, headers or {})
    out = {"x-amzn-RequestId": str(uuid.uuid4()), "Date": http_date(backend.clock.now()), **out}
    return status, out, payload


def _answer(backend: "MicrovmsBackend", method: str, path: str, query: str, body: bytes,
            headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
    found = _wire.match(method, path)
    if found is None:
        if _wire.path_exists(path):
            err = WireError("ValidationException", f"{method} is not allowed on {path}", status=405)
        else:
            err = WireError("UnknownOperationException", f"no operation at {method} {path}", status=404)
        return err.encode()
    route, labels = found
    op = _wire.service_model().operation_model(route.operation)
    caller = caller_of(headers)
    try:
        params = _wire.parse_input(op, labels, query, body)
    except WireError as err:
        backend.count_rejected(route.operation, {}, caller, err)
        return err.encode()
    try:
        result = backend.call(route.operation, params, caller=caller, validate=False)
    except WireError as err:
        return err.encode()
    except Exception as exc:  # noqa: BLE001 - a bug (or a test's subscriber) must not drop the connection
        return WireError("InternalServerException", f"emulator error: {type(exc).__name__}: {exc}").encode()
    return route.status, {"Content-Type": "application/json"}, _wire.encode_output(op, result)


def http_handler(backend: "MicrovmsBackend", admin: Callable[[str, str, bytes], tuple[int, dict[str, str], bytes]]) -> type[BaseHTTPRequestHandler]:
    """The request handler class of the socket server."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "MicrovmsEmulator/2"
        timeout = 60  # a client that opens a connection and sends nothing does not hold a thread forever

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; without this, Nagle's algorithm and the
            # client's delayed ACK add 40 ms to every keep-alive request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def date_time_string(self, timestamp: Optional[float] = None) -> str:
            # The Date header follows the emulator's clock (a virtual one too).
            return http_date(backend.clock.now() if timestamp is None else timestamp)

        def _serve(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length < 0:
                    raise ValueError
            except ValueError:
                self._reply(*WireError("ValidationException", "Content-Length is not a length").encode(), close=True)
                return
            if length > MAX_BODY_BYTES:
                self._reply(*WireError("ValidationException", f"the body is larger than {MAX_BODY_BYTES} bytes", status=413).encode(), close=True)
                return
            body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            if url.path.startswith("/_emulator/"):
                status, headers, payload = admin(self.command, url.path, body)
            else:
                status, headers, payload = handle(backend, self.command, url.path, url.query, body, dict(self.headers))
            self._reply(status, headers, payload)

        def _reply(self, status: int, headers: Mapping[str, str], payload: bytes, close: bool = False) -> None:
            self.send_response(status)
            out = {"x-amzn-RequestId": str(uuid.uuid4()), **headers, "Content-Length": str(len(payload))}
            out.pop("Date", None)  # send_response wrote it
            if close:
                out["Connection"] = "close"
                self.close_connection = True
            for key, value in out.items():
                self.send_header(key, value)
            self.end_headers()
            if payload:
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve  # noqa: N815

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    return Handler


class _Raw:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def install_in_process(client: Any, backend: "MicrovmsBackend") -> Any:
    """Hand a boto3 ``lambda-microvms`` client's requests to the backend without a socket (the way
    moto's stubber hooks ``before-send``): serialization, signing and parsing stay botocore's."""
    from botocore.awsrequest import AWSResponse

    def send(request: Any, **_: Any) -> Any:
        url = urlsplit(request.url)
        body = request.body or b""
        if hasattr(body, "read"):
            body = body.read()
        if isinstance(body, str):
            body = body.encode()
        status, headers, payload = handle(backend, request.method, url.path, url.query, body, dict(request.headers))
        return AWSResponse(request.url, status, headers, _Raw(payload))

    client.meta.events.register_first(f"before-send.{client.meta.service_model.service_name}", send)
    return client


class DirectClient:
    """boto3-shaped calls straight into a backend (see ``MicrovmsEmulator.direct_client``): the
    method names and ``ClientError`` shapes of boto3, no serialization and no input validation."""

    def __init__(self, backend: "MicrovmsBackend", caller: Optional[str] = None) -> None:
        from botocore import xform_name
        from botocore.exceptions import ClientError

        self._backend = backend
        self._caller = caller
        self._error = ClientError
        self._operations = {xform_name(name): name for name in _wire.service_model().operation_names}

    def __getattr__(self, method: str) -> Callable[..., dict[str, Any]]:
        operation = self._operations.get(method)
        if operation is None:
            raise AttributeError(method)

        def call(**params: Any) -> dict[str, Any]:
            try:
                result = self._backend.call(operation, dict(params), caller=self._caller, validate=False)
            except WireError as err:
                response = {
                    "Error": {"Code": err.code, "Message": err.message},
                    "ResponseMetadata": {"HTTPStatusCode": err.status},
                    **err.fields,
                }
                raise self._error(response, operation) from None
            return {k: v for k, v in result.items() if v is not None}

        return call
