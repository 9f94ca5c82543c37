"""moto in server mode on 127.0.0.1: the Lambdas talk to it over real HTTP with real boto3 clients.

The server binds port 0 itself and the test reads the port back from the bound socket: nothing
probes a port and binds it later (two xdist workers probing at once could be handed the same one).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import boto3

#: Seconds a stopping server may take to finish its requests before the test fails instead of hanging.
STOP_TIMEOUT_SECONDS = 30.0


@contextmanager
def moto_server() -> Iterator[str]:
    """Start a moto server on a port the OS picks; yields its endpoint URL."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    _lighter_moto()

    # What moto's ThreadedMotoServer does, minus its port argument and its unbounded wait for a
    # thread that may have failed to bind: the socket is bound here, in the caller's thread.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = make_server("127.0.0.1", 0, untraced(DomainDispatcherApplication(create_backend_app)), threaded=True,
                         request_handler=MotoRequestHandler)
    port = server.server_address[1]
    # A poll of 50 ms, not 0.5 s: shutdown() waits out one poll, once per test module.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"moto-{port}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=STOP_TIMEOUT_SECONDS)
        assert not thread.is_alive(), f"moto server on port {port} did not stop in {STOP_TIMEOUT_SECONDS} s"


def _lighter_moto() -> None:
    """Two lookups moto's server repeats on every request with the same answer, made once (moto
    5.2; measured with cProfile on its request threads, they were a third of its CPU time per
    request in tests/test_verify.py; 1,000 GetItem: 3.9-4.3 ms of CPU each before, 2.7-3.8 after):

    - the module named like the request's Host header (``127.0.0.1:port``: never one) is looked
      for twice a request, and each look lists moto's package folder and stats its ~170 entries;
    - the names of a response class's methods are read with ``inspect.getmembers`` each time.

    Neither the folder nor the classes change while the tests run."""
    from moto import backends
    from moto.core import responses

    if getattr(backends.list_of_moto_modules, "made_once", False):
        return
    modules = tuple(backends.list_of_moto_modules())
    names = functools.lru_cache(maxsize=None)(lambda cls, read=responses.method_names_from_class: frozenset(read(cls)))

    def list_of_moto_modules() -> tuple[str, ...]:
        return modules

    def method_names_from_class(cls: object) -> frozenset[str]:
        return names(cls)

    list_of_moto_modules.made_once = True  # type: ignore[attr-defined]
    backends.list_of_moto_modules = list_of_moto_modules
    responses.method_names_from_class = method_names_from_class  # type: ignore[assignment]


def untraced(app: Callable[..., Any]) -> Callable[..., Any]:
    """A WSGI app whose requests run without a trace function.

    ``make test`` measures coverage, and on Python 3.11 coverage's tracer is called for every line
    of every thread, moto's request threads included (werkzeug starts one per request; each gets
    coverage's tracer from ``threading.settrace``). No code of ours runs in them, so they drop it:
    on 2 workers ``make test`` took 470 s of pytest and about 750 CPU-s with them traced, 372 s and
    580 CPU-s without. The rest of the thread (the response written back) runs untraced too; the
    caller's threads keep theirs."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        sys.settrace(None)
        return app(environ, start_response)

    return serve


def untraced_requests(emulator: Any) -> Any:
    """A started MicrovmsEmulator whose request threads run without coverage's trace function,
    as moto's (``untraced``): on Python 3.11 the tracer is called for every function
    of every thread, and the reconciler's tests send thousands of requests (the handler's own
    code, which coverage measures, runs in the caller's thread). tests/reconciler/test_handler.py
    on its own: 54.7 CPU-s under coverage, 46.2 with these threads untraced, 37.7 without coverage. The
    emulator's own tests (tests/testing/) keep their threads traced. Returns the emulator."""
    server = emulator._server
    assert server is not None, "start the emulator first"
    handle = server.process_request_thread

    def process_request_thread(request: Any, client_address: Any) -> None:
        sys.settrace(None)
        handle(request, client_address)

    server.process_request_thread = process_request_thread  # type: ignore[method-assign]
    return emulator


def client(service: str, endpoint: str) -> object:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def put_secret(secrets: Any, name: str, value: str) -> str:
    """Create the secret ``name`` with ``value``, or give an existing one that value; its ARN.

    moto keeps one set of backends per process, whichever server serves them: a module that runs
    on the same xdist worker after another that made the same secret finds it there."""
    try:
        return str(secrets.create_secret(Name=name, SecretString=value)["ARN"])
    except secrets.exceptions.ResourceExistsException:
        return str(secrets.put_secret_value(SecretId=name, SecretString=value)["ARN"])
