"""The metrics benchmark (benchmarks/metrics.py, the numbers of docs/operations.md) counts what the
code prints: a few minutes of each part, end to end, and its bound against the dashboard.
(How long it runs is the benchmark's business, not the tests'.)"""

from __future__ import annotations

import logging

import pytest

from benchmarks import metrics as bench
from rayito_constructs import AgentProject, FleetStack
from rayito_constructs.egress.client import REASONS
from rayito_constructs.reconciler import OPERATIONS

from ..cdk_helpers import new_app, stack_props
from ..conftest import EXAMPLE


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)


def test_the_reconciler_counts_from_its_output_and_stays_in_its_bound() -> None:
    on = bench.reconciler(0.05, True)  # three ticks
    off = bench.reconciler(0.05, False)
    assert on["ticks"] == 3 and on["emf_records"] >= 3
    assert 0 < on["custom_metrics"] <= on["bound"] == 17 + 2 * len(OPERATIONS)
    assert on["metric_months"] == on["custom_metrics_every_hour"] == on["custom_metrics"]  # one clock hour
    assert off["emf_records"] == off["custom_metrics"] == off["emf_bytes_per_month"] == 0
    assert off["records"] == on["records"] - on["emf_records"] > 0  # the same log lines, without the EMF


def test_egress_and_recipe_counts() -> None:
    out = bench.egress(2, throttled_at=60)  # past the 429 (the benchmark: 11 minutes, 429 at 600 s)
    assert len(out["targets"]) == 3 and len(out["per_target_names"]) == 8
    assert out["steady_metrics"] == 8 * 3
    assert out["bound_per_target"] == 8 + len(REASONS) and out["bound_per_fleet"] == len(REASONS)
    assert out["custom_metrics"] == out["steady_metrics"] + len(out["by_reason"]) and out["by_reason"]
    assert bench.recipe()["names"] == ["RecipeNotSaved", "RecipeSaved"]


def test_every_fleet_metric_of_the_dashboard_is_within_the_bound() -> None:
    from ..cdk_helpers import dashboard_body, widget_metrics
    from aws_cdk.assertions import Template

    stack = FleetStack(new_app(), "MiAgente", project=AgentProject.load(EXAMPLE), metrics=True, **stack_props())
    shapes = bench.reconciler_bound()["shapes"]
    graphed = [m for m in widget_metrics(dashboard_body(Template.from_stack(stack).to_json()))
               if m.get("namespace") == "Rayito/Fleet" and "service" in m["dims"]]
    assert len(graphed) > 20
    for metric in graphed:
        assert (metric["name"], tuple(sorted(metric["dims"]))) in shapes, metric


def test_the_docs_state_the_bound_and_every_metric_name() -> None:
    """docs/operations.md states the count the code gives (not a number left behind by a change to
    the metric table or the operations), and every metric the reconciler can send is documented."""
    from lambdas.reconciler.telemetry import METRICS

    from ..conftest import ROOT

    doc = (ROOT / "docs" / "operations.md").read_text()
    bound = bench.reconciler_bound()
    single = bound["count"] - 2 * bound["operations"]
    assert f"up to {bound['count']} per fleet" in doc
    assert f"{single} names" in doc and f"({single} + 2 × {bound['operations']})" in doc
    documented = doc + (ROOT / "docs" / "reconciler.md").read_text()
    for name in METRICS:
        assert f"`{name}`" in documented, name
    assert f"up to {len(REASONS)} per target" in doc and f"up to {len(REASONS)} per fleet" in doc
