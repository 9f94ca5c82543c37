"""Per-target egress rate budgets for agents: one shared envelope per external target, enforced
at the egress chokepoint (docs/egress-budgets.md). Plain Python and boto3: an agent imports it
without aws-cdk-lib."""

from ..model.rates import RateError, parse_rate
from .adapters import (
    AsyncBudgetTransport,
    BudgetAdapter,
    BudgetTransport,
    EgressDeferred,
    budget_session,
    retry_after_seconds,
)
from .client import (
    REASONS,
    BudgetClient,
    Deferral,
    Envelope,
    Granted,
    StoreTime,
    store_client,
)
from ..model.egress_targets import TargetError, canonical_host, declared_target, normalize, origin
from .telemetry import EmfRecorder

__all__ = [
    "REASONS",
    "AsyncBudgetTransport",
    "BudgetAdapter",
    "BudgetClient",
    "BudgetTransport",
    "Deferral",
    "EgressDeferred",
    "EmfRecorder",
    "Envelope",
    "Granted",
    "RateError",
    "StoreTime",
    "TargetError",
    "budget_session",
    "canonical_host",
    "declared_target",
    "normalize",
    "origin",
    "parse_rate",
    "retry_after_seconds",
    "store_client",
]
