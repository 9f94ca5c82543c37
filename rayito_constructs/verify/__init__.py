"""``rayito-constructs verify``: check a deployed fleet against the real account (docs/verify.md).

Read what the stack deployed (its outputs and resources, found by type and logical id), then check
account and region, quotas, image, IAM (simulated), recipe, reconciler and egress budgets, each
OK / WARN / FAIL with one line on how to fix it; ``--launch`` starts one VM and terminates it.
Every call is a read except the launch's.

    from rayito_constructs.verify import Options, verify
    report = verify(Options("mi-agente", region="us-east-1"))
    print(report.summary_line())

The checks need boto3 and credentials; they are imported on first use, so that the argument
parser (``verify.parser``) loads without them.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names, by the module that defines them (loaded lazily: see the module docstring).
_EXPORTS = {
    "BadInput": "run",
    "Options": "run",
    "TargetNotFound": "run",
    "verify": "run",
    "Finding": "report",
    "Report": "report",
    "Status": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rayito_constructs.verify' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
