"""The cost estimate: the page's prices, idle and suspended time, only the sizes the page prices."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayito_constructs import AgentProject
from rayito_constructs.cli import _render_cost
from rayito_constructs.model.cost import base_vm_seconds, estimate

from .projects import project_with

MONTH = 730 * 3600
CYCLE = 28_800 - 900  # a base slot starts a VM every 7 h 45 min: the successor starts 15 min early


def project(**overrides) -> AgentProject:
    """The example's shape (4096 MiB) with deploy flags; ``idle="none"``: no suspension."""
    tables = {"image": {"memory_mib": overrides.pop("memory_mib", 4096)},
              "scaling": {"min_vms": 1, "max_vms": 3, "warm_vms": 1}, "serve": {"idle_seconds": 600}}
    if overrides.get("idle") == "none":
        overrides["idle"] = None
    return project_with("mi-agente", tables=tables, dockerfile=False, **overrides)


def test_a_fleet_without_idle_runs_all_month() -> None:
    cost = estimate(project(idle="none", min_vms=2, warm_vms=0), has_recipe=True)
    vms = 2 * MONTH / CYCLE
    assert cost.base_vm_hours == pytest.approx(vms * 28_800 / 3600)
    assert cost.base_suspended_vm_days == 0
    assert cost.base_vms_monthly_usd == round(vms * 28_800 / 3600 * 0.25, 2)
    assert cost.base_vms_monthly_usd == cost.base_vms_without_idle_monthly_usd


def test_idle_prices_suspended_time_as_snapshot_storage() -> None:
    """A suspended VM bills no compute, only its snapshot storage (≈ $0.011 per day)."""
    cost = estimate(project(idle=600), has_recipe=True)
    vms = MONTH / CYCLE
    running_hours = vms * 600 / 3600
    suspended_days = vms * (28_800 - 600) / 86_400
    assert cost.base_vm_hours == pytest.approx(running_hours)
    assert cost.base_suspended_vm_days == pytest.approx(suspended_days)
    assert cost.base_vms_monthly_usd == pytest.approx(running_hours * 0.25 + suspended_days * 0.011, abs=0.01)
    # The "more than 100x" overstatement is gone: the idle fleet is a few dollars.
    assert cost.base_vms_without_idle_monthly_usd / cost.base_vms_monthly_usd > 40
    assert cost.baseline_monthly_usd == pytest.approx(
        cost.base_vms_monthly_usd + cost.warm_slots_monthly_usd + cost.recipe_kms_monthly_usd, abs=0.011
    )


@pytest.mark.parametrize("memory", [8192])  # 512 and 1024 are under the product's floor
def test_sizes_the_page_does_not_price_are_not_priced(memory) -> None:
    cost = estimate(project(memory_mib=memory, max_concurrency=1), has_recipe=True)
    assert not cost.priced and cost.vm_hour_usd is None
    assert cost.base_vms_monthly_usd is None and cost.peak_monthly_usd is None and cost.baseline_monthly_usd is None
    assert cost.recipe_kms_monthly_usd == 0.0
    out = io.StringIO()
    _render_cost(cost.to_dict(), out)
    assert f"not priced: the page prices 2048 and 4096 MiB, not {memory}" in out.getvalue()
    lines = {line.split("  ")[1].strip(): line for line in out.getvalue().splitlines() if line.startswith("  ")}
    for row in ("base VMs", "parked slots", "idle fleet", "all max_vms busy"):
        assert "not priced" in lines[row], lines[row]


def test_nothing_costs_nothing_whatever_the_size() -> None:
    cost = estimate(project(memory_mib=8192, max_concurrency=1, min_vms=0, warm_vms=0), has_recipe=False)
    assert cost.base_vms_monthly_usd == 0.0 and cost.warm_slots_monthly_usd == 0.0
    assert cost.baseline_monthly_usd == 0.0 and cost.peak_monthly_usd is None


@pytest.mark.parametrize(("memory", "hourly"), [(2048, 0.126), (4096, 0.25)])
def test_the_pages_prices(memory, hourly) -> None:
    cost = estimate(project(memory_mib=memory, idle="none", min_vms=1, max_vms=1, warm_vms=0, max_concurrency=1), has_recipe=False)
    assert cost.vm_hour_usd == hourly
    assert cost.peak_monthly_usd == round(MONTH / CYCLE * 28_800 / 3600 * hourly, 2)


def test_recipe_reads_within_the_free_tier() -> None:
    cost = estimate(project(), has_recipe=True, recipe_reads_per_day=24)
    assert cost.recipe_kms_requests_per_month == 1 + round(24 * 730 / 24)
    assert cost.recipe_kms_monthly_usd == 0.0
    many = estimate(project(), has_recipe=True, recipe_reads_per_day=10_000)
    assert many.recipe_kms_monthly_usd == round((1 + round(10_000 * 730 / 24) - 20_000) / 10_000 * 0.03, 2)


@settings(max_examples=200, deadline=None)
@given(
    min_vms=st.integers(0, 64),
    idle=st.one_of(st.none(), st.integers(60, 28_800)),
    lifetime=st.integers(60, 28_800),
    lead=st.integers(0, 3_600),
)
def test_a_base_slot_is_running_or_suspended_all_its_life(min_vms, idle, lifetime, lead) -> None:
    running, suspended = base_vm_seconds(min_vms, idle, vm_lifetime_seconds=lifetime, successor_lead_seconds=lead)
    assert running >= 0 and suspended >= 0
    # The reconciler's lead (at most half a lifetime, at least a look and a start when asked for):
    # a VM a slot every half lifetime at most.
    effective = max(min(lead, lifetime / 2), min(lead, 60 + 10))
    assert running + suspended == pytest.approx(min_vms * MONTH / max(1, lifetime - effective) * lifetime)
    if idle is None or idle >= lifetime:
        assert suspended == 0


_NEVER = None


@settings(max_examples=50, deadline=None)
@given(idle=st.integers(60, 28_800))
def test_less_idle_costs_less(idle) -> None:
    global _NEVER
    if _NEVER is None:
        _NEVER = project(idle="none")
    shorter = estimate(_NEVER.with_flags(idle=idle), has_recipe=True).base_vms_monthly_usd
    never = estimate(_NEVER, has_recipe=True).base_vms_monthly_usd
    assert shorter <= never


@pytest.mark.parametrize("how", [["--no-save-recipe"], "reconciler-off"])
def test_a_fleet_no_reconciler_keeps_costs_nothing_idle(tmp_path, how) -> None:
    """Without the reconciler the stack keeps no VM: an idle month runs and parks nothing (the
    recipe aside), and the peak is every VM a client starts, as the plan prints it."""
    from rayito_constructs.cli import main

    from .projects import write_project

    tables = {"scaling": {"min_vms": 2, "max_vms": 3, "warm_vms": 1}, "serve": {"idle_seconds": 600}}
    if how == "reconciler-off":
        tables["stack"] = {"reconciler": False}
    folder = write_project(tmp_path / "kept", name="kept", tables=tables)
    out = io.StringIO()
    assert main(["plan", str(folder), "--json", *(how if isinstance(how, list) else [])], out=out) == 0
    import json

    cost = json.loads(out.getvalue())["cost"]
    assert cost["assumptions"]["kept_by_the_stack"] is False
    assert cost["base_vms_monthly_usd"] == cost["warm_slots_monthly_usd"] == 0
    assert cost["baseline_monthly_usd"] == cost["recipe_kms_monthly_usd"]
    kept = estimate(AgentProject.load(folder), has_recipe=True)
    assert kept.base_vms_monthly_usd > 0 and kept.warm_slots_monthly_usd > 0  # what the reconciler keeps
    assert cost["peak_monthly_usd"] == round(3 * 730 * cost["vm_hour_usd"], 2)
    text = io.StringIO()
    _render_cost(cost, text)
    assert "no reconciler: the stack keeps no VM" in text.getvalue()
