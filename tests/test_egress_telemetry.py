"""From template to telemetry: the example fleet's recipe and alarms, a real BudgetClient made
from that recipe on moto, EmfRecorder attached; asserted on the EMF records as written (what
CloudWatch would read), not on the recorder's counters."""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from aws_cdk.assertions import Template

from rayito_constructs import AgentFleet, AgentProject
from rayito_constructs.model.options import egress_declaration
from rayito_constructs.egress import BudgetClient, Deferral, EmfRecorder, Granted

from .cdk_helpers import new_app, new_stack
from .conftest import EXAMPLE
from .egress_support import Clock, counting_store, ddb, virtual_store_time

API = "https://api.example.com"


@pytest.fixture(scope="module")
def fleet() -> tuple[dict[str, Any], dict[str, Any]]:
    """The example fleet as synthesized: (its recipe, its egress alarms)."""
    app = new_app()
    stack = new_stack(app, "MiAgente")
    # The fleet as AgentFleet builds it (its image and reconciler aside: they add nothing here).
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), reconciler=False, build_image=False,
                       metrics=True)
    template = Template.from_stack(stack)
    (resource,) = template.find_resources("Custom::RayitoRecipe").values()
    # The recipe document is an asset of the stack; the template names it by its hash.
    staged = (Path(app.synth().directory) / fleet.recipe.document.asset_path).read_bytes()
    assert hashlib.sha256(staged).hexdigest() == resource["Properties"]["DocumentSha256"]
    # the envelopes as the fleet declares them to its agents (the image's RAYITO_EGRESS_ENVELOPES)
    recipe = {"name": json.loads(staged)["name"], "egress": egress_declaration(fleet.project.egress)}
    alarms = {k: a for k, a in template.find_resources("AWS::CloudWatch::Alarm").items()
              if any(ns == "Rayito/Egress" for ns, _, _ in watched(a))}
    assert len(alarms) == 5  # two per declared envelope (one of them metric math), one for the store
    return recipe, alarms


def watched(alarm: dict[str, Any]) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """(namespace, metric name, dimensions) of every metric an alarm reads: its own, or each
    metric of its math expression."""
    props = alarm["Properties"]
    stats = [props] if "MetricName" in props else [
        m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
    return [(m["Namespace"], m["MetricName"], tuple(sorted((d["Name"], d["Value"]) for d in m.get("Dimensions", []))))
            for m in stats]


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


def store_down(request, **_: Any) -> None:
    from botocore.exceptions import EndpointConnectionError

    raise EndpointConnectionError(endpoint_url=request.url)


def emf(out: io.StringIO) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in out.getvalue().splitlines()) if "_aws" in r]


def logs(out: io.StringIO) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in out.getvalue().splitlines()) if "event" in r]


def metric_points(records: list[dict[str, Any]]) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, str]]]:
    """(metric name, dimensions) -> [(value, unit)], read the way CloudWatch reads EMF."""
    points: dict = {}
    for record in records:
        for directive in record["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Rayito/Egress"
            for dims in directive["Dimensions"]:
                key_dims = tuple(sorted((d, record[d]) for d in dims))
                for metric in directive["Metrics"]:
                    points.setdefault((metric["Name"], key_dims), []).append((record[metric["Name"]], metric["Unit"]))
    return points


def test_every_alarm_watches_a_metric_the_recorder_emits(fleet, store) -> None:
    recipe, alarms = fleet
    table = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), table)
    clock = Clock()
    client = ddb(store.endpoint)
    virtual_store_time(client, clock)
    out = io.StringIO()
    recorder = EmfRecorder(recipe["name"], out=out, clock=clock, background=False, metrics=True)
    budget = BudgetClient.from_declaration(recipe["egress"], table_name=table, dynamodb=client, clock=clock, on_decision=recorder,
                                      calibrate=False)
    budget.sync_clock()
    clock.now += 1.0
    for i in range(12):
        budget.acquire(f"{API}/v1/search?region={'eu' if i % 2 else 'us'}", step=f"step-{i}")
        budget.acquire(f"{API}/v1/items", step=f"items-{i}")
        clock.now += 0.05
    budget.backoff(f"{API}/v1/items", 30, "http_429")
    budget.acquire(f"{API}/v1/items", step="after-429")
    client.meta.events.register("before-send.dynamodb.*", store_down)  # the store goes away
    clock.now += 100
    down = budget.acquire(f"{API}/v1/items", step="store-down")
    assert isinstance(down, Deferral) and down.reason == "limiter_unavailable"
    recorder.close()  # the last window is written
    points = metric_points(emf(out))
    for alarm in alarms.values():
        for _, name, dims in watched(alarm):
            key = (name, dims)
            assert key in points, f"alarm {alarm['Properties']['AlarmDescription']!r} watches {key}, never emitted"
            assert all(unit in ("Count", "Percent") for _, unit in points[key])
    # Both regions of the class count under the class's envelope, the one its alarms watch.
    class_key = f"{API}/v1/search?region"
    (requests,) = [v for v, _ in points[("Requests", (("fleet", "mi-agente"), ("target", class_key)))]]
    assert requests == 12
    # The origin counts every request that paid it, the class's included.
    (origin_requests,) = points[("Requests", (("fleet", "mi-agente"), ("target", API)))]
    assert origin_requests[0] == 12 + 12 + 1 + 1
    # Deferrals by reason, the store's outage apart from the targets' refusals.
    by_reason = {dict(k[1])["reason"]: sum(v for v, _ in vs) for k, vs in points.items()
                 if k[0] == "Deferrals" and dict(k[1]).keys() == {"fleet", "reason"}}
    assert by_reason["limiter_unavailable"] == 1 and by_reason["backoff"] == 1 and by_reason["budget_empty"] >= 1
    # An outage is not an exhausted envelope: the remaining tokens are from answered decisions.
    (remaining,) = points[("RemainingAtDecision", (("fleet", "mi-agente"), ("target", API)))]
    assert remaining[0] == min(d["remaining"] for d in logs(out) if d["target"] == API and d["remaining"] is not None)
    # The envelope in force is recorded beside the traffic.
    assert points[("EnvelopeRate", (("fleet", "mi-agente"), ("target", API)))][0] == (1.0, "Count/Second")
    assert points[("EnvelopeBurst", (("fleet", "mi-agente"), ("target", class_key)))][0] == (2, "Count")
    # Every decision's log line names the trajectory step that asked.
    lines = logs(out)
    assert {line["step"] for line in lines} >= {"step-0", "items-11", "after-429", "store-down"}
    assert [line["reason"] for line in lines if line["step"] == "store-down"] == ["limiter_unavailable"]


def test_a_window_is_written_without_another_decision() -> None:
    out = io.StringIO()
    recorder = EmfRecorder("f", out=out, window_seconds=0.2, metrics=True)
    recorder(Granted(API, 4.0, 0, "s", (API,), 1.0, 5))
    deadline = time.monotonic() + 20
    while not emf(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    (record,) = emf(out)
    assert record["Granted"] == 1 and record["target"] == API
    recorder.close()
    assert len(emf(out)) == 1  # nothing new to write: an empty window writes nothing


def test_emf_per_envelope_with_steps() -> None:
    out = io.StringIO()
    clock = Clock()
    with EmfRecorder("mi-agente", out=out, window_seconds=3600, clock=clock, background=False, metrics=True) as recorder:
        recorder(Granted(API, 4.0, 2, "step-1"))
        recorder(Deferral(API, 0.5, "budget_empty", 0.0, 2, "step-2"))
        recorder(Deferral(API, 1.0, "limiter_unavailable", None, 0, "step-3", "ReadTimeoutError"))
        clock.now += 3600  # the next decision closes the window
        recorder(Granted("https://other.org", 1.0, 0, "step-4"))
    records = emf(out)
    first = [r for r in records if r["target"] == API and "Requests" in r]
    assert first[0]["Granted"] == 1 and first[0]["Deferrals"] == 2 and first[0]["DeferralRate"] == pytest.approx(66.667)
    assert first[0]["RemainingAtDecision"] == 0.0
    assert {r["reason"]: r["Deferrals"] for r in records if "reason" in r} == {"budget_empty": 1, "limiter_unavailable": 1}
    assert [r["target"] for r in records if "Requests" in r] == [API, "https://other.org"]
    lines = logs(out)
    assert [line["step"] for line in lines] == ["step-1", "step-2", "step-3", "step-4"]
    assert lines[1]["event"] == "egress_deferred" and lines[1]["retry_after"] == 0.5
    assert lines[2]["detail"] == "ReadTimeoutError"


def test_a_closed_stream_does_not_break_the_recorder() -> None:
    out = io.StringIO()
    recorder = EmfRecorder("f", out=out, background=False, metrics=True)
    out.close()
    recorder(Granted(API, 1.0, 0))
    assert recorder.close()[0]["Granted"] == 1


def test_an_outage_only_window_has_no_remaining_and_logging_can_be_off() -> None:
    out = io.StringIO()
    recorder = EmfRecorder("f", out=out, log_decisions=False, background=False, metrics=True)
    recorder(Deferral(API, 1.0, "limiter_unavailable", None, 0, None, "EndpointConnectionError"))
    (record, by_reason) = recorder.close()
    assert "RemainingAtDecision" not in record and record["Deferrals"] == 1 and record["DeferralRate"] == 100.0
    assert by_reason["reason"] == "limiter_unavailable" and logs(out) == []


def test_metrics_off_write_decision_lines_only_and_a_bad_url_shows_no_secret(store) -> None:
    """Metrics off: no EMF record, the decision lines stay; a URL that is not a target is the
    line's target `(invalid)`, its detail quoting the URL without user info or query values."""
    out = io.StringIO()
    recorder = EmfRecorder("f", out=out, background=False, metrics=False)
    table = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), table)
    budget = BudgetClient(table, ddb(store.endpoint), store_clock=False, calibrate=False, on_decision=recorder)
    budget.acquire("https://bot:hunter2@api.example.com:99999/v1?api_key=sk-live", step="s1")
    assert recorder.close() == []
    (line,) = logs(out)
    assert line["target"] == line["envelope"] == "(invalid)" and line["reason"] == "invalid_target"
    assert "hunter2" not in out.getvalue() and "sk-live" not in out.getvalue()
    assert "https://***@api.example.com:99999/v1?api_key=***" in line["detail"]
