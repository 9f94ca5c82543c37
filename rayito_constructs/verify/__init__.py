"""``rayito-constructs verify``: check a deployed fleet against the real account (docs/verify.md).

Read what the stack deployed (its outputs and resources, found by type and logical id), then check
account and region, quotas, image, IAM (simulated), recipe, reconciler and egress budgets, each
OK / WARN / FAIL with one line on how to fix it; ``--launch`` starts one VM and terminates it.
Every call is a read except the launch's.

    from rayito_constructs.verify import Options, verify
    report = verify(Options("mi-agente", region="us-east-1"))
    print(report.summary_line())
"""

from .report import Finding, Report, Status
from .run import BadInput, Options, TargetNotFound, verify

__all__ = ["BadInput", "Finding", "Options", "Report", "Status", "TargetNotFound", "verify"]
