"""The operations surface against the code that runs in AWS: the reconciler's ``index.handler``
with the environment the construct synthesizes (Powertools, and its fallback), the recipe writer's
handler with the properties the template holds, and ``EmfRecorder`` driven by a real
``BudgetClient`` on moto. Everything is read from what they print, the way CloudWatch reads it:

* metrics off (the default) prints not one EMF line, and the same decisions are logged;
* every custom metric the dashboard graphs and every alarm watches is one the emitters really
  send, with the same dimensions, and its statistic fits what it is (a level, a count, a time);
* the saved Logs Insights queries run (tests/logs_insights.py) over the lines really printed and
  give the timeline, the problems and the per-target counts; every field they read is printed.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections import Counter
from typing import Any, Iterator

import pytest
from aws_cdk.assertions import Template

from rayito_constructs import AgentProject, FleetStack
from rayito_constructs.egress import BudgetClient, Deferral, EmfRecorder
from rayito_constructs.egress.client import REASONS
from rayito_constructs.queries import (
    PROBLEM_EVENTS,
    admission_timeline,
    egress_deferrals,
    egress_per_target,
    reconciler_problems,
)
from rayito_constructs.reconciler import OPERATIONS

from .cdk_helpers import dashboard_body, new_app, resources, stack_props, widget_metrics
from .conftest import EXAMPLE, ROOT
from .egress_support import Clock, counting_store, ddb, virtual_store_time
from .logs_insights import events_from_lines, parse
from .moto_server import moto_server
from .reconciler.harness import deployed_fleet

API = "https://api.example.com"
FLEET = "mi-agente"
#: What each reconciler metric is, from the code that sends it (core.plan's gauges, tick's counts
#: and times), and the statistics that make sense for it on a graph or an alarm.
LEVELS = {"DesiredBaseVMs", "LiveBaseVMs", "DesiredParkedSlots", "ParkedSlots", "Members", "LiveVMs", "InDoubtRuns",
          "Deficit", "DeadLetteredSlots", "StrayVMs", "OldestStrayAge", "RetryAmplification",
          "RemainingAtDecision", "EnvelopeRate", "EnvelopeBurst", "EnvelopeVersion", "DeferralRate"}
COUNTS = {"RunMicrovmAttempts", "SlotsFilled", "Deferrals", "Throttles", "StraysTerminated", "RecipeSaved",
          "RecipeNotSaved", "Requests", "Granted"}
TIMES = {"WaitTime", "ClaimToComplete"}
FITS = {"level": {"Minimum", "Maximum", "Average"}, "count": {"Sum", "Maximum"},
        "time": {"p50", "p90", "p99", "Maximum", "Average"}}


@pytest.fixture(scope="module")
def template_on() -> dict:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), metrics=True, **stack_props())
    return Template.from_stack(stack).to_json()


def emf_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "_aws" in r]


def identities(records: list[dict[str, Any]]) -> dict[tuple[str, str, tuple], set[str]]:
    """(namespace, metric, dimensions with values) -> units, as CloudWatch makes metrics of EMF."""
    found: dict[tuple[str, str, tuple], set[str]] = {}
    for record in emf_records(records):
        for directive in record["_aws"]["CloudWatchMetrics"]:
            for dims in directive["Dimensions"]:
                key_dims = tuple(sorted((d, record[d]) for d in dims))
                for metric in directive["Metrics"]:
                    assert metric["Name"] in record, metric
                    found.setdefault((directive["Namespace"], metric["Name"], key_dims), set()).add(metric.get("Unit", "None"))
    return found


def reconciler_day(aws: str, monkeypatch, *, metrics: bool, powertools: bool = True) -> list[list[dict[str, Any]]]:
    """The example fleet's reconciler through scenarios that make it say everything it can: a
    start, a 500, throttles (429), an exhausted budget, a foreign VM, an idle stray ended, a crash
    loop to the dead letters. One list of printed records per scenario."""
    runs: list[list[dict[str, Any]]] = []
    with deployed_fleet(aws, metrics=metrics, seed=11) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=1)
        for _ in range(3):
            runs.append(fleet.invoke(monkeypatch, powertools=powertools).records)
            fleet.clock.advance(60)
        fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken="someone-else")
        for invocation in fleet.every_minute(monkeypatch, 2, powertools=powertools):
            runs.append(invocation.records)
    with deployed_fleet(aws, metrics=metrics, seed=12, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3",
                                                            "BUDGETS": json.dumps({"RunMicrovm": [0.05, 1]})}) as fleet:
        runs.append(fleet.invoke(monkeypatch, timeout=20, powertools=powertools).records)  # budget deferrals
    with deployed_fleet(aws, metrics=metrics, seed=13, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.emulator.set_rate_limit("RunMicrovm", 0.1, 1, surge=0)  # 429s
        runs.append(fleet.invoke(monkeypatch, timeout=20, powertools=powertools).records)
    with deployed_fleet(aws, metrics=metrics, seed=17, env={"MIN_VMS": "1", "WARM_VMS": "0", "TERMINATE_STRAYS": "1",
                                                            "STRAY_GRACE_SECONDS": "60"}) as fleet:
        idle = fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken="idle-one")["microvmId"]
        fleet.clock.advance(13)
        fleet.emulator.client().suspend_microvm(microvmIdentifier=idle)
        for invocation in fleet.every_minute(monkeypatch, 4, powertools=powertools):
            runs.append(invocation.records)
        assert fleet.emulator.state_of(idle) in ("TERMINATING", "TERMINATED")  # an idle stray, ended
    with deployed_fleet(aws, metrics=metrics, seed=14, env={"MIN_VMS": "1", "WARM_VMS": "0"}) as fleet:
        fleet.emulator.inject("RunMicrovm", "crash", after_seconds=30, reason="Container Stopped with Exit Code: 1",
                              times=None)
        for invocation in fleet.every_minute(monkeypatch, 6, powertools=powertools):
            runs.append(invocation.records)
    return runs


@pytest.fixture(scope="module")
def day_on(aws) -> list[list[dict[str, Any]]]:
    monkeypatch = pytest.MonkeyPatch()
    try:
        return reconciler_day(aws, monkeypatch, metrics=True)
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def day_off(aws) -> list[list[dict[str, Any]]]:
    monkeypatch = pytest.MonkeyPatch()
    try:
        return reconciler_day(aws, monkeypatch, metrics=False)
    finally:
        monkeypatch.undo()


def decisions(runs: list[list[dict[str, Any]]]) -> list[tuple]:
    return [(r["message"], r.get("slot"), r.get("microvm_id")) for run in runs for r in run
            if "_aws" not in r and "message" in r]


# --------------------------------------------------------------------------- metrics off: nothing


def test_metrics_off_prints_no_emf_and_tells_the_same(day_off, day_on) -> None:
    printed = [r for run in day_off for r in run]
    assert printed and emf_records(printed) == []
    assert not any("CloudWatchMetrics" in json.dumps(r) for r in printed)
    # The same decisions, in the same order, with metrics on and off (same seeds, same faults).
    assert decisions(day_off) == decisions(day_on)
    assert {m for m, _, _ in decisions(day_off)} >= {"slot_queued", "run_requested", "api_error", "slot_dead_lettered",
                                                      "stray_vm", "run_deferred"}


def test_metrics_off_without_the_powertools_layer_too(aws, monkeypatch) -> None:
    with deployed_fleet(aws, metrics=False, seed=15) as fleet:
        run = fleet.invoke(monkeypatch, powertools=False)
        assert run.events("run_requested") and emf_records(run.records) == []
    with deployed_fleet(aws, metrics=True, seed=15) as fleet:
        assert emf_records(fleet.invoke(monkeypatch, powertools=False).records)


def test_the_powertools_layer_and_its_fallback_send_the_same_metrics(aws, monkeypatch) -> None:
    """Where the Powertools layer is missing the handler falls back to EMF of its own: CloudWatch
    must make the same metrics of it (namespace, name, dimensions with values, unit), or the
    dashboard and the alarms go blank in that region. Same seed, same faults, both ways."""
    sent = {}
    for powertools in (True, False):
        with deployed_fleet(aws, metrics=True, seed=18, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
            fleet.emulator.set_rate_limit("RunMicrovm", 0.1, 1, surge=0)  # throttles: the per-operation ones
            printed = [r for invocation in fleet.every_minute(monkeypatch, 3, powertools=powertools)
                       for r in invocation.records]
        sent[powertools] = identities(printed)
    assert sent[True] and sent[True] == sent[False]
    assert any(dict(d).get("operation") for (_, _, d) in sent[True])


def test_the_switch_reads_only_on(aws, monkeypatch) -> None:
    """``RAYITO_METRICS`` is on only when it says so: a typo or an empty value sends nothing."""
    for value, sends in (("on", True), ("ON ", True), ("true", True), ("off", False), ("", False), ("no", False),
                         ("0", False), ("onn", False)):
        with deployed_fleet(aws, metrics=True, seed=16, env={"RAYITO_METRICS": value}) as fleet:
            assert bool(emf_records(fleet.invoke(monkeypatch).records)) is sends, value


# --------------------------------------------------------------------------- what the dashboard and alarms read


def test_every_graphed_or_alarmed_fleet_metric_is_sent(day_on, template_on) -> None:
    sent = identities([r for run in day_on for r in run])
    names = {name for (_, name, _) in sent}
    assert names >= {"Deficit", "WaitTime", "ClaimToComplete", "RetryAmplification", "Throttles", "Deferrals",
                     "StrayVMs", "OldestStrayAge", "DeadLetteredSlots", "RunMicrovmAttempts", "SlotsFilled"}
    operations_sent = {dict(d)["operation"] for (_, n, d) in sent if n in ("Deferrals", "Throttles")}
    assert operations_sent and operations_sent <= set(OPERATIONS)
    graphed = [m for m in widget_metrics(dashboard_body(template_on)) if m.get("namespace") == "Rayito/Fleet"
               and m["name"] not in ("RecipeSaved", "RecipeNotSaved")]
    alarmed = [{"namespace": p["Namespace"], "name": p["MetricName"], "stat": p["Statistic"],
                "dims": {d["Name"]: d["Value"] for d in p["Dimensions"]}}
               for p in (a["Properties"] for a in resources(template_on, "AWS::CloudWatch::Alarm").values())
               if p.get("Namespace") == "Rayito/Fleet" and p["MetricName"] != "RecipeNotSaved"]
    assert graphed and len(alarmed) == 4
    sent_shapes = {(ns, n, tuple(k for k, _ in d)): d for (ns, n, d) in sent}
    for metric in graphed + alarmed:
        dims = tuple(sorted(metric["dims"].items()))
        shape = (metric["namespace"], metric["name"], tuple(k for k, _ in dims))
        assert shape in sent_shapes, f"{metric} is never sent with these dimensions"
        if "operation" in metric["dims"]:  # one line per operation the reconciler budgets
            assert metric["dims"]["operation"] in OPERATIONS
        else:
            assert (metric["namespace"], metric["name"], dims) in sent, metric
        kind = "level" if metric["name"] in LEVELS else "count" if metric["name"] in COUNTS else "time"
        assert metric["name"] in LEVELS | COUNTS | TIMES, metric["name"]
        assert metric["stat"] in FITS[kind], (metric["name"], metric["stat"])
    # Units as sent fit the kind too (seconds for times).
    for (ns, name, _), units in sent.items():
        if name in TIMES:
            assert units == {"Seconds"}, name


def _reconciler_source() -> str:
    """The reconciler's code (its shell and its core), not the teardown's or the pruner's."""
    folder = ROOT / "lambdas" / "reconciler"
    return "".join(p.read_text() for p in sorted(folder.rglob("*.py")) if p.name not in ("teardown.py", "pruner.py"))


def test_every_operation_on_the_dashboard_is_one_the_reconciler_calls() -> None:
    source = _reconciler_source()
    from lambdas.reconciler.budget import DEFAULT_BUDGETS

    for operation in OPERATIONS:
        assert operation in DEFAULT_BUDGETS and f'"{operation}"' in source, operation


def test_the_problem_events_are_ones_the_reconciler_emits() -> None:
    source = _reconciler_source()
    for event in PROBLEM_EVENTS:
        assert f'"{event}"' in source, event


# --------------------------------------------------------------------------- the recipe writer


def test_the_recipe_writer_sends_its_metrics_only_when_on(monkeypatch, capsys, tmp_path, template_on) -> None:
    """The writer's handler with the environment and the properties the default template holds
    (``Metrics: off``), then with the property a ``metrics=True`` fleet synthesizes."""
    import boto3

    from . import recipe_writer_world as rw

    synthesized = rw.Synthesized()
    assert synthesized.properties["Metrics"] == "off"
    with moto_server() as endpoint:
        proxy = rw.FaultProxy(int(endpoint.rsplit(":", 1)[1]))
        cfn = rw.CloudFormationEndpoint(tmp_path)
        try:
            world = rw.Aws(endpoint, proxy, cfn, synthesized)
            for key, value in {**synthesized.environment, **cfn.environ(), "AWS_ENDPOINT_URL": proxy.endpoint,
                               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                               "AWS_SESSION_TOKEN": "testing", "AWS_REGION": "us-east-1",
                               "AWS_DEFAULT_REGION": "us-east-1"}.items():
                monkeypatch.setenv(key, value)
            monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
            world.reset()
            capsys.readouterr()
            rw.run(world.event("Create"))
            off = capsys.readouterr().out
            assert world.answer["Data"]["Outcome"] == "saved"
            assert '"_aws"' not in off and "CloudWatchMetrics" not in off
            rw.run(world.event("Update", physical=rw.NAME, Metrics="on"))
            on = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
            assert world.answer["Data"]["Outcome"] == "saved"
        finally:
            cfn.close()
            proxy.close()
    sent = identities(on)
    assert set(sent) == {("Rayito/Fleet", "RecipeSaved", (("fleet", FLEET),)),
                         ("Rayito/Fleet", "RecipeNotSaved", (("fleet", FLEET),))}
    graphed = [m for m in widget_metrics(dashboard_body(template_on)) if m.get("name") in ("RecipeSaved", "RecipeNotSaved")]
    alarmed = [a["Properties"] for a in resources(template_on, "AWS::CloudWatch::Alarm").values()
               if a["Properties"].get("MetricName") == "RecipeNotSaved"]
    assert len(graphed) == 2 and len(alarmed) == 1
    for metric in graphed:
        assert ("Rayito/Fleet", metric["name"], tuple(sorted(metric["dims"].items()))) in sent
    assert {d["Name"]: d["Value"] for d in alarmed[0]["Dimensions"]} == {"fleet": FLEET}


# --------------------------------------------------------------------------- the agents' egress recorder


def _egress_traffic(store_endpoint: str, recipe: dict[str, Any], out: io.StringIO, *, metrics: Any) -> EmfRecorder:
    """A real BudgetClient from the example's recipe on moto: grants, an exhausted class, a 429's
    backoff and a store outage, each request with its trajectory step."""
    table = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store_endpoint), table)
    clock = Clock()
    client = ddb(store_endpoint)
    virtual_store_time(client, clock)
    recorder = EmfRecorder(FLEET, out=out, clock=clock, background=False, **({} if metrics is None else {"metrics": metrics}))
    budget = BudgetClient.from_declaration(recipe["egress"], table_name=table, dynamodb=client, clock=clock, on_decision=recorder,
                                      calibrate=False)
    budget.sync_clock()
    clock.now += 1.0
    for i in range(12):
        budget.acquire(f"{API}/v1/search?region={'eu' if i % 2 else 'us'}", step=f"search-{i % 3}")
        budget.acquire(f"{API}/v1/items", step=f"items-{i % 2}")
        clock.now += 0.05
    budget.backoff(f"{API}/v1/items", 30, "http_429")
    budget.acquire(f"{API}/v1/items", step="after-429")

    def down(request, **_: Any) -> None:
        from botocore.exceptions import EndpointConnectionError

        raise EndpointConnectionError(endpoint_url=request.url)

    client.meta.events.register("before-send.dynamodb.*", down)
    clock.now += 100
    assert isinstance(budget.acquire(f"{API}/v1/items", step="store-down"), Deferral)
    recorder.close()
    return recorder


@pytest.fixture(scope="module")
def recipe() -> dict[str, Any]:
    """The example's egress declaration, as the fleet puts it in the image (``egress``)."""
    from rayito_constructs.model.options import egress_declaration

    return {"egress": egress_declaration(AgentProject.load(EXAMPLE).egress)}


@pytest.fixture(scope="module")
def egress_store() -> Iterator:
    with counting_store() as store:
        yield store


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_recorder_follows_the_switch(egress_store, recipe, monkeypatch) -> None:
    outputs = {}
    for env, metrics in ((None, None), ("off", None), ("on", None), ("on", False), (None, True), ("yes please", None)):
        if env is None:
            monkeypatch.delenv("RAYITO_METRICS", raising=False)
        else:
            monkeypatch.setenv("RAYITO_METRICS", env)
        out = io.StringIO()
        _egress_traffic(egress_store.endpoint, recipe, out, metrics=metrics)
        outputs[(env, metrics)] = _lines(out)
    sends = {k: bool(emf_records(v)) for k, v in outputs.items()}
    assert sends == {(None, None): False, ("off", None): False, ("on", None): True, ("on", False): False,
                     (None, True): True, ("yes please", None): False}
    # The decision lines (what the per-target queries read) are the same either way.
    decisions_off = [r for r in outputs[(None, None)] if "event" in r]
    decisions_on = [r for r in outputs[("on", None)] if "event" in r]
    assert len(decisions_off) == 12 * 2 + 2 and decisions_off == decisions_on


def test_a_quiet_recorder_starts_no_thread() -> None:
    from rayito_constructs.egress import Granted

    quiet, loud = EmfRecorder(FLEET, out=io.StringIO(), metrics=False), EmfRecorder(FLEET, out=io.StringIO(), metrics=True)
    try:
        quiet(Granted(API, 1.0, 0))
        loud(Granted(API, 1.0, 0))
        assert quiet._thread is None and loud._thread is not None
        assert quiet.close() == [] and len(loud.close()) == 1
    finally:
        quiet.close()
        loud.close()


def test_every_graphed_or_alarmed_egress_metric_is_sent(egress_store, recipe, template_on) -> None:
    out = io.StringIO()
    _egress_traffic(egress_store.endpoint, recipe, out, metrics=True)
    sent = identities(_lines(out))
    graphed = [m for m in widget_metrics(dashboard_body(template_on)) if m.get("namespace") == "Rayito/Egress"]
    # An alarm's metric, or each metric of a metric math alarm (the deferral rate: two sums).
    alarmed = [{"namespace": m["Namespace"], "name": m["MetricName"], "stat": stat,
                "dims": {d["Name"]: d["Value"] for d in m["Dimensions"]}}
               for p in (a["Properties"] for a in resources(template_on, "AWS::CloudWatch::Alarm").values())
               for m, stat in ([(p, p.get("Statistic"))] if "MetricName" in p else
                               [(q["MetricStat"]["Metric"], q["MetricStat"]["Stat"]) for q in p.get("Metrics", [])
                                if "MetricStat" in q])
               if m.get("Namespace") == "Rayito/Egress"]
    assert len(graphed) == 2 * 7 + len(REASONS) and len(alarmed) == 3 + 2 * 2
    for metric in graphed + alarmed:
        dims = tuple(sorted(metric["dims"].items()))
        if "reason" in metric["dims"]:  # one line per reason the client has; this traffic had three
            assert metric["dims"]["reason"] in REASONS
            assert any(n == metric["name"] and tuple(k for k, _ in d) == tuple(k for k, _ in dims) for (_, n, d) in sent)
            if metric["dims"]["reason"] in ("budget_empty", "backoff", "limiter_unavailable"):
                assert ("Rayito/Egress", metric["name"], dims) in sent, metric
        else:
            assert ("Rayito/Egress", metric["name"], dims) in sent, metric
        kind = "level" if metric["name"] in LEVELS else "count" if metric["name"] in COUNTS else "time"
        assert metric["stat"] in FITS[kind], (metric["name"], metric["stat"])
    # The SEARCH graphs (every target, declared or not): their schema is a dimension set the
    # recorder sends, each key=value they filter on a value it sends, and they find lines here.
    expressions = [m["expression"] for m in widget_metrics(dashboard_body(template_on)) if "expression" in m]
    searches = [e for e in expressions if e.startswith("SEARCH(")]
    # The rest: each declared target's deferral rate, over ids of metrics checked above.
    assert sorted(set(expressions) - set(searches)) == ["100 * deferred / requests"]
    assert len(searches) == 3
    for expression in searches:
        schema, terms = re.fullmatch(r"SEARCH\('\{([^}]*)\} (.*)', 'Sum', 60\)", expression).groups()
        namespace, *dimensions = schema.split(",")
        wanted = dict(re.findall(r'(\w+)="([^"]*)"', terms))
        found = [(n, d) for (ns, n, d) in sent if ns == namespace and sorted(k for k, _ in d) == sorted(dimensions)
                 and n == wanted["MetricName"] and all(dict(d).get(k) == v for k, v in wanted.items() if k != "MetricName")]
        assert found, expression


# --------------------------------------------------------------------------- the saved queries, run


def test_the_admission_timeline_over_what_the_handler_printed(day_on) -> None:
    lines = [json.dumps(r) for run in day_on for r in run]
    events = events_from_lines(lines)
    query = parse(admission_timeline(FLEET))
    rows = query.run(events)
    decided = [r for r in (json.loads(line) for line in lines) if "_aws" not in r and "message" in r]
    assert len(rows) == len(decided) and all(r["event"] for r in rows)  # every decision, no EMF line
    assert [r["event"] for r in rows] == [d["message"] for d in decided]  # oldest first
    base = [r["event"] for r in rows if r["slot"] == "base-0"]
    assert base[0] == "slot_queued" and "run_requested" in base
    assert base.index("slot_queued") < base.index("run_requested")
    # Every field the query reads is one the handler prints (some only on some events).
    printed = set().union(*(d.keys() for d in decided)) | {"@timestamp"}
    assert query.fields_read <= printed, query.fields_read - printed
    # Another fleet's lines in the same log group are not in it.
    stranger = [json.dumps({**decided[0], "fleet": "otra"})]
    assert len(query.run(events_from_lines(lines + stranger))) == len(rows)


def test_the_problems_query_over_what_the_handler_printed(day_on) -> None:
    lines = [json.dumps(r) for run in day_on for r in run]
    query = parse(reconciler_problems(FLEET))
    rows = query.run(events_from_lines(lines))
    kinds = Counter(r["event"] for r in rows)
    assert kinds["slot_dead_lettered"] >= 1 and kinds["api_error"] >= 1 and kinds["stray_vm"] >= 1
    assert set(kinds) <= set(PROBLEM_EVENTS)
    assert [r["@timestamp"] for r in rows] == sorted((r["@timestamp"] for r in rows), reverse=True)  # newest first
    printed = set().union(*(json.loads(line).keys() for line in lines)) | {"@timestamp"}
    assert query.fields_read <= printed, query.fields_read - printed


def test_the_egress_queries_over_what_the_recorder_printed(egress_store, recipe) -> None:
    out = io.StringIO()
    _egress_traffic(egress_store.endpoint, recipe, out, metrics=False)
    lines = out.getvalue().splitlines()
    decisions = [json.loads(line) for line in lines]
    # Two windows: the first half of the decisions in one minute, the rest in the next.
    stamps = [1_700_000_000_000 + (0 if i < len(lines) // 2 else 60_000) for i in range(len(lines))]
    events = events_from_lines(lines, stamps=stamps)
    per_target = parse(egress_per_target(FLEET))
    rows = per_target.run(events)
    assert sum(r["requests"] for r in rows) == len(decisions)
    expected = Counter((stamps[i] // 60_000 * 60_000, d["envelope"], d["step"]) for i, d in enumerate(decisions))
    assert {(r["window"], r["envelope"], r["step"]): r["requests"] for r in rows} == dict(expected)
    assert [r["window"] for r in rows] == sorted((r["window"] for r in rows), reverse=True)
    deferrals = parse(egress_deferrals(FLEET))
    rows = deferrals.run(events)
    deferred = [d for d in decisions if d["event"] == "egress_deferred"]
    assert sum(r["deferrals"] for r in rows) == len(deferred) > 0
    assert {r["reason"] for r in rows} == {d["reason"] for d in deferred} >= {"backoff", "limiter_unavailable"}
    groups: dict[tuple, list[float]] = {}
    for i, d in enumerate(decisions):
        if d["event"] == "egress_deferred":
            groups.setdefault((stamps[i] // 300_000 * 300_000, d["envelope"], d["reason"]), []).append(d["retry_after"])
    assert {(r["window"], r["envelope"], r["reason"]): (r["deferrals"], r["longest_retry_after"]) for r in rows} == {
        k: (len(v), max(v)) for k, v in groups.items()}
    printed = set().union(*(d.keys() for d in decisions)) | {"@timestamp"}
    assert per_target.fields_read <= printed and deferrals.fields_read <= printed
