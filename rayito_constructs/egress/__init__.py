"""Per-target egress rate budgets for agents: one shared envelope per external target, enforced
at the egress chokepoint (docs/egress-budgets.md). Plain Python and boto3: an agent imports it
without aws-cdk-lib."""

from typing import TYPE_CHECKING, Any

from ..model.rates import RateError, parse_rate
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

if TYPE_CHECKING:
    from .adapters import (
        AsyncBudgetTransport,
        BudgetAdapter,
        BudgetTransport,
        EgressDeferred,
        budget_session,
        retry_after_seconds,
    )

#: The adapters load on first use: they import requests and httpx, which the constructs (reading
#: the constants of ``.client`` at synth) never need.
_ADAPTERS = frozenset({"AsyncBudgetTransport", "BudgetAdapter", "BudgetTransport", "EgressDeferred",
                       "budget_session", "retry_after_seconds"})

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


def __getattr__(name: str) -> Any:
    if name in _ADAPTERS:
        from . import adapters

        return getattr(adapters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
