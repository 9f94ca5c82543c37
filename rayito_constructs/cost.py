"""A monthly cost estimate from the product page's list prices (us-east-1), dated as the page dates them.

The page prices a running VM at about $0.126 per hour with 2 GB and $0.25 with 4 GB, a parked slot
(or a suspended VM) at about $0.011 per day of snapshot storage (checked 2026-10-06), standard
parameters at no charge, and each parameter read or write at one KMS request: 20,000 free a month,
then $0.03 per 10,000 (checked 2026-10-22). Sizes the page does not price are scaled from the
per-GiB price of the nearest priced size and marked ``extrapolated``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .project import AgentProject

HOURS_PER_MONTH = 730
DAYS_PER_MONTH = 30.42

#: Price per running VM-hour by memory size, from the page.
VM_HOUR_USD = {2048: 0.126, 4096: 0.25}
PARKED_SLOT_DAY_USD = 0.011
KMS_FREE_REQUESTS = 20_000
KMS_USD_PER_10K = 0.03
FLEET_PRICES_CHECKED = "2026-10-06"
RECIPE_PRICES_CHECKED = "2026-10-22"
REGION = "us-east-1"


def vm_hour_usd(memory_mib: int) -> tuple[float, bool]:
    """The hourly price of one running VM and whether it is extrapolated."""
    if memory_mib in VM_HOUR_USD:
        return VM_HOUR_USD[memory_mib], False
    nearest = min(VM_HOUR_USD, key=lambda m: abs(m - memory_mib))
    return round(VM_HOUR_USD[nearest] * memory_mib / nearest, 4), True


def kms_usd(requests_per_month: int) -> float:
    """KMS requests beyond the free tier."""
    billable = max(0, requests_per_month - KMS_FREE_REQUESTS)
    return round(billable / 10_000 * KMS_USD_PER_10K, 2)


@dataclass(frozen=True)
class CostEstimate:
    """Monthly list-price estimate of a fleet."""

    vm_hour_usd: float
    extrapolated: bool
    base_vms_monthly_usd: float
    warm_slots_monthly_usd: float
    peak_monthly_usd: float
    recipe_parameter_monthly_usd: float
    recipe_kms_requests_per_month: int
    recipe_kms_monthly_usd: float

    @property
    def baseline_monthly_usd(self) -> float:
        """What the fleet costs idle: base VMs, parked slots and the recipe."""
        return round(
            self.base_vms_monthly_usd + self.warm_slots_monthly_usd + self.recipe_kms_monthly_usd, 2
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "currency": "USD",
            "region": REGION,
            "checked": {"fleet": FLEET_PRICES_CHECKED, "recipe": RECIPE_PRICES_CHECKED},
            "vm_hour_usd": self.vm_hour_usd,
            "vm_price_extrapolated": self.extrapolated,
            "base_vms_monthly_usd": self.base_vms_monthly_usd,
            "warm_slots_monthly_usd": self.warm_slots_monthly_usd,
            "baseline_monthly_usd": self.baseline_monthly_usd,
            "peak_monthly_usd": self.peak_monthly_usd,
            "recipe_parameter_monthly_usd": self.recipe_parameter_monthly_usd,
            "recipe_kms_requests_per_month": self.recipe_kms_requests_per_month,
            "recipe_kms_monthly_usd": self.recipe_kms_monthly_usd,
        }


def estimate(project: "AgentProject", *, has_recipe: bool, recipe_reads_per_day: int = 24) -> CostEstimate:
    """Estimate a month of the project's fleet at list prices.

    ``recipe_reads_per_day`` counts processes that reconnect by name and read the recipe.
    """
    hourly, extrapolated = vm_hour_usd(project.image.memory_mib)
    if not project.has_fleet:
        base = warm = peak = 0.0
    else:
        base = round(project.scaling.min_vms * hourly * HOURS_PER_MONTH, 2)
        warm = round(project.scaling.warm_vms * PARKED_SLOT_DAY_USD * DAYS_PER_MONTH, 2)
        peak = round(project.scaling.max_vms * hourly * HOURS_PER_MONTH, 2)
    requests = (1 + round(recipe_reads_per_day * DAYS_PER_MONTH)) if has_recipe else 0
    return CostEstimate(
        vm_hour_usd=hourly,
        extrapolated=extrapolated,
        base_vms_monthly_usd=base,
        warm_slots_monthly_usd=warm,
        peak_monthly_usd=peak,
        recipe_parameter_monthly_usd=0.0,
        recipe_kms_requests_per_month=requests,
        recipe_kms_monthly_usd=kms_usd(requests),
    )
