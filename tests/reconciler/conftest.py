"""The reconciler's tests share one moto server per worker (every fleet gets tables of its own)."""

from __future__ import annotations

from typing import Iterator

import pytest

from ..moto_server import moto_server


@pytest.fixture(scope="session")
def aws() -> Iterator[str]:
    """moto in server mode: DynamoDB (ledger, budget) and SQS (dead letters), over real HTTP."""
    with moto_server() as endpoint:
        yield endpoint
