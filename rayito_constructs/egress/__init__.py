"""Per-target egress rate budgets for agents: one shared envelope per external target, enforced
at the egress chokepoint (docs/egress-budgets.md). Plain Python and boto3: an agent imports it
without aws-cdk-lib."""

from .adapters import BudgetAdapter, BudgetTransport, EgressDeferred
from .client import BudgetClient, Deferral, Envelope, Granted, parse_rate
from .targets import TargetError, declared_target, normalize, origin
from .telemetry import EmfRecorder

__all__ = [
    "BudgetAdapter",
    "BudgetClient",
    "BudgetTransport",
    "Deferral",
    "EgressDeferred",
    "EmfRecorder",
    "Envelope",
    "Granted",
    "TargetError",
    "declared_target",
    "normalize",
    "origin",
    "parse_rate",
]
