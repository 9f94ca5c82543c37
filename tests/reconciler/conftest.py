"""The reconciler's tests share one moto server per worker (every fleet gets tables of its own)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from ..moto_server import moto_server
from .harness import STORES


@pytest.fixture(scope="session")
def aws() -> Iterator[str]:
    """moto in server mode: DynamoDB (ledger, budget) and SQS (dead letters), over real HTTP."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(autouse=True)
def _stores(request: pytest.FixtureRequest) -> Iterator[None]:
    """The stores the test's fleets get: its closest ``stores`` mark (harness.py's docstring)."""
    mark = request.node.get_closest_marker("stores")
    token = STORES.set(mark.args[0] if mark else "dynamodb")
    yield
    STORES.reset(token)


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """Contexts a scenario opens (deployed fleets), closed when the test ends."""
    with contextlib.ExitStack() as s:
        yield s
