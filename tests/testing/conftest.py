"""Fixtures for the MicroVMs emulator's contract tests: a virtual clock, the emulator on a socket,
and a real boto3 client (one attempt, so every error surfaces)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from ..emulator_helpers import microvms_client


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def emulator(clock) -> Iterator[MicrovmsEmulator]:
    """The measured defaults, reads made current (``consistency_seconds=0``) so that timings can be
    asserted to the second; test_consistency.py covers late reads with the measured default."""
    with MicrovmsEmulator(clock=clock, seed=7, consistency_seconds=0) as emu:
        yield emu


@pytest.fixture
def client(emulator) -> Any:
    return microvms_client(emulator.endpoint_url)


@pytest.fixture
def image(emulator) -> str:
    return emulator.create_image("mi-agente", memory_mib=2048)


# ---------------------------------------------------------------------------------------------
# The stand-in rayd (host_vms=True): moto for STS, SSM and Secrets Manager, the product's client
# pointed at both through the endpoint variables it reads, and an agent project it scaffolds.


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from ..moto_server import moto_server

    with moto_server() as url:
        yield url


@pytest.fixture
def product_env(moto_endpoint, monkeypatch) -> dict[str, str]:
    """The environment of a process that runs the product's client against moto (the MicroVMs
    endpoint is the emulator's: ``hosted`` sets it)."""
    env = {
        "AWS_ENDPOINT_URL_STS": moto_endpoint,
        "AWS_ENDPOINT_URL_SSM": moto_endpoint,
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "RAYITO_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def session(product_env) -> Any:
    """A boto3 session of its own: the product caches one control plane per (session, region) and
    process, so a test that shared the default one would keep the first test's endpoint."""
    import boto3

    return boto3.Session()


@pytest.fixture
def hosted(product_env, monkeypatch) -> Iterator[MicrovmsEmulator]:
    """An emulator whose VMs run here (the real clock): launches of 0.5 s (the measured 2 s is
    test_rayd.py's own), reads current, an exited app reported after 1 s (15 s measured)."""
    with MicrovmsEmulator(host_vms=True, pending_seconds=0.5, consistency_seconds=0, app_exit_report_seconds=1.0,
                          terminating_seconds=1.0) as emu:
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA_MICROVMS", emu.endpoint_url)
        yield emu


@pytest.fixture
def agent_project(tmp_path) -> Path:
    """A ``custom`` runtime project scaffolded by the product, made to answer without a model."""
    from .helpers import scaffold_agent

    return scaffold_agent(tmp_path / "eco")
