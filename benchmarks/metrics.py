"""What the example fleet's custom metrics cost, counted from what the code really prints.

    .venv/bin/python -m benchmarks.metrics [--hours 24] [--egress-minutes 60] [--json]

* **Reconciler**: ``index.handler`` with the environment the construct synthesizes for the example
  fleet (``examples/mi-agente``: min 1, max 3, warm 1, idle 10 minutes) with ``metrics=True`` and
  with the default ``metrics=False``, invoked once a minute on a virtual clock for ``--hours``
  against the MicroVMs emulator (its measured defaults) and moto, Powertools telemetry. Counted
  from stdout: every EMF record, its metrics (namespace, name, dimension values: what CloudWatch
  bills as one custom metric), the hours each metric had data in (custom metrics are billed
  pro rata per hour with data), and the EMF bytes (billed as log ingestion).
* **Recipe writer**: ``RecipeSaved`` and ``RecipeNotSaved`` (dimension ``fleet``), one point per
  deploy: 2 metrics for the hour of each deploy (counted by the tests from the handler's output).
* **Egress**: ``EmfRecorder`` fed by a real ``BudgetClient`` made from the example's recipe on moto,
  ``--egress-minutes`` of traffic (one request every 2 s to each of the two declared envelopes, a
  class with two regions, and one origin without an envelope of its own), one 429 backoff.

Prices: CloudWatch list prices, us-east-1, as mirrored on 2026-05-04 by api-evangelist/cloudwatch
(plans/cloudwatch-plans-pricing.yml, source https://aws.amazon.com/cloudwatch/pricing/): custom
metrics $0.30 per metric-month (first 10,000), log ingestion $0.50 per GB, alarms $0.10 per
standard-resolution alarm metric-month; dashboards $3.00 per dashboard-month past three free (the
2022 page, quoted in nishinoshake/aws-rough#37). Not checked against AWS's page from this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import time
import uuid
from collections import defaultdict
from typing import Any

#: Hours in the month CloudWatch prorates over, and the list prices above.
HOURS_PER_MONTH = 730
PRICE_METRIC_MONTH = 0.30
PRICE_LOG_GB = 0.50
PRICE_ALARM_MONTH = 0.10
PRICE_DASHBOARD_MONTH = 3.00
PRICE_SOURCE = ("CloudWatch list prices, us-east-1, as mirrored 2026-05-04 (api-evangelist/cloudwatch, from "
                "aws.amazon.com/cloudwatch/pricing); dashboard price from the 2022 page; not checked here")


def emf_metrics(record: dict[str, Any]) -> list[tuple[str, str, tuple]]:
    found = []
    for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
        for dims in directive["Dimensions"]:
            key = tuple(sorted((d, record[d]) for d in dims))
            for metric in directive["Metrics"]:
                found.append((directive["Namespace"], metric["Name"], key))
    return found


def reconciler_bound() -> dict[str, Any]:
    """Every custom metric the reconciler's code can send for one fleet: each name of its table
    (``lambdas/reconciler/telemetry.py`` ``METRICS``) with dimensions ``fleet, service``, and
    ``Deferrals`` and ``Throttles`` with ``operation`` too, once per operation it budgets."""
    from lambdas.reconciler.telemetry import METRICS
    from rayito_constructs.reconciler import OPERATIONS

    per_operation = ("Deferrals", "Throttles")
    shapes = {(n, ("fleet", "service")) for n in METRICS if n not in per_operation}
    shapes |= {(n, ("fleet", "operation", "service")) for n in per_operation}
    count = sum(1 for n in METRICS if n not in per_operation) + len(per_operation) * len(OPERATIONS)
    return {"count": count, "shapes": shapes, "operations": len(OPERATIONS)}


def recipe() -> dict[str, Any]:
    """The recipe writer's EMF for one deploy (its ``_emit``, the code the handler calls when the
    resource's ``Metrics`` is ``on``): one record, the metrics it names."""
    from lambdas.recipe_writer import index

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        index._emit("mi-agente", "Create", {"Saved": "true", "Outcome": "saved"})
    found = {i for line in out.getvalue().splitlines() for i in emf_metrics(json.loads(line))}
    return {"custom_metrics": len(found), "names": sorted(n for _, n, _ in found),
            "emf_bytes_per_deploy": len(out.getvalue())}


def reconciler(hours: float, metrics: bool) -> dict[str, Any]:
    import pytest

    from tests.moto_server import moto_server
    from tests.reconciler.harness import deployed_fleet

    monkeypatch = pytest.MonkeyPatch()
    hours_with_data: dict[tuple, set[int]] = defaultdict(set)
    emf_bytes = log_bytes = records = emf_records = 0
    started = time.monotonic()
    try:
        with moto_server() as aws, deployed_fleet(aws, metrics=metrics, seed=1) as fleet:
            start = fleet.clock.now()
            for _ in range(int(hours * 60)):
                tick_start = fleet.clock.now()
                invocation = fleet.invoke(monkeypatch)
                hour = int((tick_start - start) // 3600)
                for record in invocation.records:
                    size = len(json.dumps(record)) + 1
                    records += 1
                    if "_aws" in record:
                        emf_records += 1
                        emf_bytes += size
                        for identity in emf_metrics(record):
                            hours_with_data[identity].add(hour)
                    else:
                        log_bytes += size
                rest = tick_start + 60 - fleet.clock.now()
                if rest > 0:
                    fleet.clock.advance(rest)
    finally:
        monkeypatch.undo()
    metric_hours = sum(len(h) for h in hours_with_data.values())
    buckets = max(1, math.ceil(hours))  # the clock hours the run touched
    per_month = HOURS_PER_MONTH / (hours or 1)
    bound = reconciler_bound()
    outside = [i for i in hours_with_data if (i[1], tuple(k for k, _ in i[2])) not in bound["shapes"]]
    assert not outside, f"metrics the code table does not list: {outside}"
    return {
        "metrics": metrics, "hours": hours, "ticks": int(hours * 60), "records": records, "emf_records": emf_records,
        "custom_metrics": len(hours_with_data),
        "custom_metrics_every_hour": sum(1 for h in hours_with_data.values() if len(h) == buckets),
        # Billed pro rata per hour with data: a metric with data in k of the run's hours costs
        # k / hours of a metric-month, if every month looks like this run.
        "metric_months": round(metric_hours / buckets, 2),
        "bound": bound["count"],
        "emf_bytes_per_month": int(emf_bytes * per_month), "log_bytes_per_month": int(log_bytes * per_month),
        "names": sorted({f"{name}" + (f"[{dict(d)['operation']}]" if "operation" in dict(d) else "")
                         for (_, name, d) in hours_with_data}),
        "hours_per_metric": {f"{n}{dict(d).get('operation', '') and '[' + dict(d)['operation'] + ']'}": len(h)
                             for (_, n, d), h in sorted(hours_with_data.items())},
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def egress(minutes: int, throttled_at: int = 600) -> dict[str, Any]:
    """Custom metrics of an egress client over ``minutes`` of three targets, one of them told a
    429 at second ``throttled_at`` (so its deferral reasons appear too)."""
    from rayito_constructs import AgentProject
    from rayito_constructs.egress import BudgetClient, EmfRecorder
    from rayito_constructs.model.options import egress_declaration
    from tests.egress_support import Clock, counting_store, ddb, virtual_store_time

    recipe = {"name": "mi-agente", "egress": egress_declaration(AgentProject.load("examples/mi-agente").egress)}
    identities: set[tuple] = set()
    out = io.StringIO()
    with counting_store() as store:
        table = f"egress-{uuid.uuid4().hex[:8]}"
        BudgetClient.create_table(ddb(store.endpoint), table)
        clock = Clock()
        client = ddb(store.endpoint)
        virtual_store_time(client, clock)
        recorder = EmfRecorder(recipe["name"], out=out, clock=clock, background=False, metrics=True)
        budget = BudgetClient.from_declaration(recipe["egress"], table_name=table, dynamodb=client, clock=clock, on_decision=recorder,
                                          calibrate=False)
        budget.sync_clock()
        for second in range(0, minutes * 60, 2):
            clock.now += 2
            budget.acquire("https://api.example.com/v1/items", step=f"s{second}")
            budget.acquire(f"https://api.example.com/v1/search?region={'eu' if second % 4 else 'us'}", step=f"s{second}")
            budget.acquire("https://other.example.org/x", step=f"s{second}")
            if second == throttled_at:
                budget.backoff("https://api.example.com/v1/items", 30, "http_429")
        recorder.close()
    emf_bytes = 0
    for line in out.getvalue().splitlines():
        record = json.loads(line)
        if "_aws" in record:
            emf_bytes += len(line) + 1
            identities.update(emf_metrics(record))
    from rayito_constructs.egress.client import REASONS

    targets = sorted({dict(d).get("target") for (_, _, d) in identities if "target" in dict(d)})
    envelope_metrics = {n for (_, n, d) in identities if set(dict(d)) == {"fleet", "target"}}
    return {"minutes": minutes, "custom_metrics": len(identities), "targets": targets,
            "steady_metrics": sum(1 for (_, _, d) in identities if "reason" not in dict(d)),
            "per_target_names": sorted(envelope_metrics),
            # Up to: each target's own metrics, Deferrals per target and reason, per reason.
            "bound_per_target": len(envelope_metrics) + len(REASONS), "bound_per_fleet": len(REASONS),
            "per_target": {t: sorted(n for (_, n, d) in identities if dict(d).get("target") == t and "reason" not in dict(d))
                           for t in targets},
            "by_reason": sorted({(n, dict(d).get("target", "*"), dict(d)["reason"]) for (_, n, d) in identities
                                 if "reason" in dict(d)}),
            "emf_bytes_per_month": int(emf_bytes * HOURS_PER_MONTH * 60 / minutes)}


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--egress-minutes", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.hours > 0 and math.isfinite(args.hours)) or args.egress_minutes < 1:
        parser.error("--hours must be a positive number, --egress-minutes at least 1")
    on = reconciler(args.hours, True)
    off = reconciler(args.hours, False)
    out = egress(args.egress_minutes)
    writer = recipe()
    month = {
        "reconciler": on["metric_months"],
        # Traffic every hour: each target's own metrics every hour; the per-reason Deferrals only
        # in hours with such a deferral (counted apart, not in the month).
        "egress": out["steady_metrics"],
        "recipe": round(writer["custom_metrics"] / HOURS_PER_MONTH, 3),  # one deploy a month: one hour of data
    }
    metric_months = sum(month.values())
    emf_gb = (on["emf_bytes_per_month"] + out["emf_bytes_per_month"]) / 1e9
    alarms = 11  # the example fleet with metrics on (tests/test_monitoring.py counts them in the template)
    result = {
        "price_source": PRICE_SOURCE, "reconciler_on": on, "reconciler_off": off, "egress": out, "recipe": writer,
        "metric_months_by_part": month,
        "metric_months": round(metric_months, 2), "metrics_cost": round(metric_months * PRICE_METRIC_MONTH, 2),
        "emf_gb_per_month": round(emf_gb, 4), "emf_ingestion_cost": round(emf_gb * PRICE_LOG_GB, 4),
        "alarms_with_metrics": alarms, "alarms_cost": round(alarms * PRICE_ALARM_MONTH, 2),
        "dashboard_cost": PRICE_DASHBOARD_MONTH,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"reconciler, metrics on, {on['hours']} h ({on['ticks']} ticks): {on['custom_metrics']} custom metrics with data "
          f"of {on['bound']} the code can send ({on['custom_metrics_every_hour']} with data every hour), "
          f"{on['metric_months']} metric-months a month, {on['emf_records']} EMF records, "
          f"{on['emf_bytes_per_month'] / 1e6:.2f} MB EMF a month, {on['wall_seconds']} s")
    print(f"reconciler, metrics off, {off['hours']} h: {off['emf_records']} EMF records, "
          f"{off['custom_metrics']} custom metrics; log lines {off['log_bytes_per_month'] / 1e6:.2f} MB a month "
          f"(on: {on['log_bytes_per_month'] / 1e6:.2f} MB besides the EMF)")
    print(f"egress, {out['minutes']} min: {out['custom_metrics']} custom metrics over {len(out['targets'])} targets "
          f"{out['targets']}; per target {len(out['per_target_names'])} ({', '.join(out['per_target_names'])}), "
          f"up to {out['bound_per_target']} with deferrals of every reason, and up to {out['bound_per_fleet']} per fleet "
          f"(Deferrals per reason); deferral reasons seen: {out['by_reason']}")
    print(f"recipe writer: {writer['custom_metrics']} custom metrics ({', '.join(writer['names'])}), one point per deploy")
    print(f"month: {result['metric_months']} metric-months ({month}) = ${result['metrics_cost']}, "
          f"EMF {result['emf_gb_per_month']} GB = ${result['emf_ingestion_cost']}, {alarms} alarms ${result['alarms_cost']}, "
          f"dashboard ${PRICE_DASHBOARD_MONTH}")
    print(PRICE_SOURCE)


if __name__ == "__main__":
    main()
