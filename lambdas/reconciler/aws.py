"""The AWS clients of the reconciler, the fleet teardown and the image pruner: a boto3 session that
knows ``lambda-microvms`` whatever the runtime's botocore, and each client's retries and timeouts.

The Lambda Python runtime's bundled botocore may predate ``lambda-microvms`` (botocore 1.43.35):
the service model ships with these functions (``data/``) and is put first on botocore's search path.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import botocore.session
from botocore.config import Config

DATA_DIR = Path(__file__).resolve().parent / "data"
#: One attempt per MicroVMs call (botocore's ``total_max_attempts`` counts the first one): a 429 or
#: 500 comes back to the reconciler, which decides, under the shared budget.
MICROVMS_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=15)
#: The stores: a few quick attempts (throttling of the tables is rare and retrying it is safe:
#: every write is conditional), and timeouts so a hung store cannot hold the tick.
STORE_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=3, read_timeout=5)
#: The dead-letter queue: one quick attempt (a letter the queue does not take stays in the ledger
#: and is sent again by the next tick), so a queue that hangs costs a tick at most 5 s.
LETTER_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=3)


def session() -> boto3.Session:
    """A boto3 session whose botocore knows ``lambda-microvms`` whatever its version."""
    core_session = botocore.session.get_session()
    loader = core_session.get_component("data_loader")
    loader.search_paths.insert(0, str(DATA_DIR))  # a new session's loader never has it yet
    return boto3.Session(botocore_session=core_session)
