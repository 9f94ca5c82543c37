"""Lambda's ``Invoke`` on 127.0.0.1, for the functions a test names: what the reconciler's boto3
``lambda`` client reaches (``AWS_ENDPOINT_URL_LAMBDA``) when it hands a VM to the fleet's server.

An asynchronous invocation (``X-Amz-Invocation-Type: Event``) is answered 202 at once and the
function's handler runs in a thread of its own, as Lambda queues it; a ``RequestResponse`` one runs
and answers the handler's result. An unknown function is Lambda's 404 ``ResourceNotFoundException``.
A test double for AWS only: what runs behind it is the test's (the server's own handler in a
process of its own, or ``rayito_constructs.testing.serving.VirtualServer`` in virtual time).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, Callable, Iterator

from contextlib import contextmanager

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from .moto_server import untraced

_PATH = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")


class Functions:
    """The functions a test registers, by name or ARN's last part."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[dict[str, Any]], Any]] = {}
        self.invocations: list[dict[str, Any]] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def register(self, name: str, handler: Callable[[dict[str, Any]], Any]) -> None:
        self.handlers[name] = handler

    def wait(self, timeout: float = 300.0) -> None:
        """Until every asynchronous invocation so far returned."""
        for thread in list(self.threads):
            thread.join(timeout)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        request = Request(environ)
        match = _PATH.match(request.path)
        name = match.group(1).rsplit(":", 1)[-1] if match else ""
        handler = self.handlers.get(name)
        if request.method != "POST" or handler is None:
            body = {"Type": "User", "message": f"Function not found: {name}"}
            return Response(json.dumps(body), status=404, headers={"x-amzn-ErrorType": "ResourceNotFoundException"},
                            content_type="application/json")(environ, start_response)
        event = json.loads(request.get_data() or b"{}")
        kind = request.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        self.invocations.append({"function": name, "type": kind, "event": event})
        if kind == "Event":
            thread = threading.Thread(target=self._run, args=(handler, event), name=f"invoke-{name}", daemon=True)
            self.threads.append(thread)
            thread.start()
            return Response(b"", status=202)(environ, start_response)
        return Response(json.dumps(handler(event), default=str), status=200,
                        content_type="application/json")(environ, start_response)

    def _run(self, handler: Callable[[dict[str, Any]], Any], event: dict[str, Any]) -> None:
        try:
            handler(event)
        except BaseException as exc:  # what Lambda would log; the test reads it from here
            self.errors.append(exc)


@contextmanager
def lambda_functions() -> Iterator[tuple[str, Functions]]:
    """``(endpoint URL, Functions)``: register handlers, point ``AWS_ENDPOINT_URL_LAMBDA`` here."""
    functions = Functions()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server("127.0.0.1", 0, untraced(functions), threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", functions
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
