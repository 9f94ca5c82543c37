"""Fixtures for the MicroVMs emulator's contract tests: a virtual clock, the emulator on a socket,
and a real boto3 client (one attempt, so every error surfaces)."""

from __future__ import annotations

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
