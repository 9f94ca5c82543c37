"""A monthly cost estimate from the product page's list prices (us-east-1), dated as the page dates them.

What the page prices ("Cost and activation"; checked 2026-10-06 for the fleet, 2026-10-22 for
the recipe):

* a running VM: about $0.126 an hour with 2 GB, $0.25 with 4 GB. The page prices no other size,
  so 512, 1024 and 8192 MiB are "not priced" here rather than extrapolated (the per-vCPU and
  per-GB prices behind them are in docs/options.md#cost, with why they are not used);
* a parked slot: only its snapshot storage, about $0.011 a day; "a suspended VM, the same": a VM
  that ``idle`` suspended bills no compute while suspended, only that;
* the recipe: a standard parameter is free; each write or read is one KMS request, 20,000 free a
  month, then $0.03 per 10,000.

How the fleet spends its month, with no traffic (the "idle fleet"): every VM lives at most
``vm_lifetime_seconds`` (8 hours, suspended time included); the reconciler starts a base VM's
successor ``successor_lead_seconds`` (15 minutes) before its end, so a base slot starts a VM every
7 h 45 min and two overlap for 15 minutes. With ``idle``, each new base VM runs ``idle`` seconds
and is suspended for the rest of its life; without it, it runs all its life. Parked slots are
suspended all month (the seconds a slot runs before it is parked are not counted). "All max_vms
busy" is every VM running all month. Every assumption is listed in docs/options.md#cost and in
``CostEstimate.assumptions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .._lambdas.reconciler.core import lifetimes
from .options import MICROVM_MAX_LIFETIME_SECONDS

if TYPE_CHECKING:
    from .project import AgentProject

HOURS_PER_MONTH = 730
#: The reconciler's schedule the estimate assumes (the construct's default: every minute).
DEFAULT_SCHEDULE_SECONDS = 60.0
DAYS_PER_MONTH = HOURS_PER_MONTH / 24
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600

#: Price per running VM-hour by memory size: only the sizes the page prices.
VM_HOUR_USD = {2048: 0.126, 4096: 0.25}
#: A parked slot or a suspended VM: its snapshot storage, per day (the page gives one price).
SUSPENDED_DAY_USD = 0.011
PARKED_SLOT_DAY_USD = SUSPENDED_DAY_USD
KMS_FREE_REQUESTS = 20_000
KMS_USD_PER_10K = 0.03
FLEET_PRICES_CHECKED = "2026-10-06"
RECIPE_PRICES_CHECKED = "2026-10-22"
REGION = "us-east-1"
DEFAULT_RECIPE_READS_PER_DAY = 24
DEFAULT_SUCCESSOR_LEAD_SECONDS = 900


def vm_hour_usd(memory_mib: int) -> Optional[float]:
    """The hourly price of one running VM, or None for a size the page does not price."""
    return VM_HOUR_USD.get(memory_mib)


def kms_usd(requests_per_month: int) -> float:
    """KMS requests beyond the free tier."""
    billable = max(0, requests_per_month - KMS_FREE_REQUESTS)
    return round(billable / 10_000 * KMS_USD_PER_10K, 2)


@dataclass(frozen=True)
class CostEstimate:
    """Monthly list-price estimate of a fleet. A ``None`` amount is "not priced": the page gives
    no price for this memory size (and the amount is not zero)."""

    memory_mib: int
    vm_hour_usd: Optional[float]
    base_vm_hours: float
    """Running hours of the base VMs in a month with no traffic."""
    base_suspended_vm_days: float
    """Days of suspended base VMs (snapshot storage) in a month with no traffic."""
    base_vms_monthly_usd: Optional[float]
    base_vms_without_idle_monthly_usd: Optional[float]
    """The base VMs if they never suspended (what ``idle`` saves)."""
    warm_slots_monthly_usd: Optional[float]
    peak_monthly_usd: Optional[float]
    recipe_parameter_monthly_usd: float
    recipe_kms_requests_per_month: int
    recipe_kms_monthly_usd: float
    assumptions: dict[str, Any] = field(default_factory=dict)

    @property
    def priced(self) -> bool:
        """False when the page prices no VM of this size."""
        return self.vm_hour_usd is not None

    @property
    def baseline_monthly_usd(self) -> Optional[float]:
        """What the fleet costs idle: base VMs, parked slots and the recipe (None: not priced)."""
        if self.base_vms_monthly_usd is None or self.warm_slots_monthly_usd is None:
            return None
        return round(self.base_vms_monthly_usd + self.warm_slots_monthly_usd + self.recipe_kms_monthly_usd, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "currency": "USD",
            "region": REGION,
            "checked": {"fleet": FLEET_PRICES_CHECKED, "recipe": RECIPE_PRICES_CHECKED},
            "priced": self.priced,
            "memory_mib": self.memory_mib,
            "vm_hour_usd": self.vm_hour_usd,
            "suspended_vm_day_usd": SUSPENDED_DAY_USD if self.priced else None,
            "base_vm_hours": round(self.base_vm_hours, 2),
            "base_suspended_vm_days": round(self.base_suspended_vm_days, 2),
            "base_vms_monthly_usd": self.base_vms_monthly_usd,
            "base_vms_without_idle_monthly_usd": self.base_vms_without_idle_monthly_usd,
            "warm_slots_monthly_usd": self.warm_slots_monthly_usd,
            "baseline_monthly_usd": self.baseline_monthly_usd,
            "peak_monthly_usd": self.peak_monthly_usd,
            "recipe_parameter_monthly_usd": self.recipe_parameter_monthly_usd,
            "recipe_kms_requests_per_month": self.recipe_kms_requests_per_month,
            "recipe_kms_monthly_usd": self.recipe_kms_monthly_usd,
            "assumptions": dict(self.assumptions),
        }


def _money(count: float, unit_price: Optional[float]) -> Optional[float]:
    """``count * unit_price`` rounded to cents; zero of anything is free, priced or not."""
    if count == 0:
        return 0.0
    return None if unit_price is None else round(count * unit_price, 2)


def base_vm_seconds(
    min_vms: int,
    idle: Optional[int],
    *,
    vm_lifetime_seconds: int = MICROVM_MAX_LIFETIME_SECONDS,
    successor_lead_seconds: int = DEFAULT_SUCCESSOR_LEAD_SECONDS,
) -> tuple[float, float]:
    """``(running, suspended)`` VM-seconds of ``min_vms`` base slots in a month with no traffic."""
    # A new VM per slot this often: a successor starts the reconciler's lead before its VM's end.
    cycle = lifetimes.replacement_cycle(vm_lifetime_seconds, successor_lead_seconds, DEFAULT_SCHEDULE_SECONDS)
    vms = min_vms * SECONDS_PER_MONTH / cycle
    running = min(idle, vm_lifetime_seconds) if idle else vm_lifetime_seconds
    return vms * running, vms * (vm_lifetime_seconds - running)


def estimate(
    project: "AgentProject",
    *,
    has_recipe: bool,
    recipe_reads_per_day: int = DEFAULT_RECIPE_READS_PER_DAY,
    vm_lifetime_seconds: int = MICROVM_MAX_LIFETIME_SECONDS,
    successor_lead_seconds: int = DEFAULT_SUCCESSOR_LEAD_SECONDS,
    kept: bool = True,
) -> CostEstimate:
    """Estimate a month of the project's fleet at list prices.

    ``recipe_reads_per_day`` counts processes that reconnect by name and read the recipe.
    ``kept``: the stack's reconciler keeps ``min_vms`` and ``warm_vms``; without it the stack
    keeps no VM (an idle fleet runs none, and parks none) and only clients start them.
    """
    memory = project.image.memory_mib
    hourly = vm_hour_usd(memory)
    suspended_day = SUSPENDED_DAY_USD if hourly is not None else None
    scaling = project.scaling
    lifetimes = dict(vm_lifetime_seconds=vm_lifetime_seconds, successor_lead_seconds=successor_lead_seconds)
    base_slots, warm_slots = (scaling.min_vms, scaling.warm_vms) if kept else (0, 0)
    running, suspended = base_vm_seconds(base_slots, scaling.idle, **lifetimes)
    running_without_idle, _ = base_vm_seconds(base_slots, None, **lifetimes)
    warm_days = warm_slots * DAYS_PER_MONTH
    peak_hours = running_without_idle / 3600 + (scaling.max_vms - base_slots) * HOURS_PER_MONTH
    base_running = _money(running / 3600, hourly)
    base_parked = _money(suspended / 86400, suspended_day)
    base = None if base_running is None or base_parked is None else round(base_running + base_parked, 2)
    requests = (1 + round(recipe_reads_per_day * DAYS_PER_MONTH)) if has_recipe else 0
    return CostEstimate(
        memory_mib=memory,
        vm_hour_usd=hourly,
        base_vm_hours=running / 3600,
        base_suspended_vm_days=suspended / 86400,
        base_vms_monthly_usd=base,
        base_vms_without_idle_monthly_usd=_money(running_without_idle / 3600, hourly),
        warm_slots_monthly_usd=_money(warm_days, suspended_day),
        peak_monthly_usd=_money(peak_hours, hourly),
        recipe_parameter_monthly_usd=0.0,
        recipe_kms_requests_per_month=requests,
        recipe_kms_monthly_usd=kms_usd(requests),
        assumptions={
            "hours_per_month": HOURS_PER_MONTH,
            "vm_lifetime_seconds": vm_lifetime_seconds,
            "successor_lead_seconds": successor_lead_seconds,
            "idle_seconds": project.scaling.idle,
            "recipe_reads_per_day": recipe_reads_per_day if has_recipe else 0,
            "kept_by_the_stack": kept,
            "traffic": "none for the idle fleet; every VM busy all month for the peak",
        },
    )
