"""moto in server mode on 127.0.0.1: the Lambdas talk to it over real HTTP with real boto3 clients."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator

import boto3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server() -> Iterator[str]:
    """Start a moto server; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def client(service: str, endpoint: str) -> object:
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
