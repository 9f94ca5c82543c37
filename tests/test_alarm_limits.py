"""Alarms and synth-time checks of the operations surface at their limits. Each test states what
a user or the spec expects.

The two egress alarm tests read the alarm from the template and compute what CloudWatch would
compute from the EMF records ``EmfRecorder`` really prints (``alarm_value``), whatever the alarm
watches (a metric, or metric math over several), so they test what the alarm says, not its
shape."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from rayito_constructs.egress import BudgetClient, Deferral, Envelope, Granted

from .egress_support import Clock, counting_store, ddb
from .egress_support import new_client

API = "https://api.example.com"


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


@pytest.fixture
def table(store) -> str:
    name = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), name)
    return name




def _stat(values: list[float], stat: str) -> Optional[float]:
    if not values:
        return None  # no datapoint: missing data
    return {"Sum": sum, "Minimum": min, "Maximum": max, "SampleCount": len,
            "Average": lambda v: sum(v) / len(v)}[stat](values)


def _metric_value(metric: dict[str, Any], stat: str, records: list[dict[str, Any]]) -> Optional[float]:
    """The statistic of one metric (namespace, name, dimensions with values) over the datapoints
    EMF ``records`` make of it, as CloudWatch makes metrics of EMF."""
    dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
    points = []
    for record in records:
        for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
            if directive["Namespace"] != metric["Namespace"]:
                continue
            if metric["MetricName"] not in {m["Name"] for m in directive["Metrics"]}:
                continue
            if any(set(ds) == set(dims) and all(record.get(k) == v for k, v in dims.items())
                   for ds in directive["Dimensions"]):
                points.append(float(record[metric["MetricName"]]))
    return _stat(points, stat)


def alarm_value(alarm: dict[str, Any], records: list[dict[str, Any]]) -> Optional[float]:
    """The value an alarm (its template properties) sees for one period whose datapoints are
    ``records``: its metric's statistic, or its math expression over its metrics' statistics."""
    if "MetricName" in alarm:
        return _metric_value(alarm, alarm["Statistic"], records)
    values: dict[str, Optional[float]] = {}
    (expression,) = [q["Expression"] for q in alarm["Metrics"] if q.get("ReturnData", True) and "Expression" in q]
    for query in alarm["Metrics"]:
        if "MetricStat" in query:
            values[query["Id"]] = _metric_value(query["MetricStat"]["Metric"], query["MetricStat"]["Stat"], records)
    assert re.fullmatch(r"[\w\s.*/+()-]+", expression), expression  # plain arithmetic: evaluated below
    if any(values.get(name) is None for name in re.findall(r"[a-z]\w*", expression)):
        return None
    try:
        return float(eval(expression, {"__builtins__": {}}, values))  # noqa: S307 - checked above
    except ZeroDivisionError:
        return None


def breaches(alarm: dict[str, Any], value: Optional[float]) -> bool:
    if value is None or math.isnan(value):  # missing data: the library's alarms treat it as not breaching
        assert alarm.get("TreatMissingData") == "notBreaching"
        return False
    threshold = alarm["Threshold"]
    return {"GreaterThanThreshold": value > threshold, "GreaterThanOrEqualToThreshold": value >= threshold,
            "LessThanThreshold": value < threshold, "LessThanOrEqualToThreshold": value <= threshold,
            }[alarm["ComparisonOperator"]]


def windows_of(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """EMF records grouped by the window they were written for (one flush, one timestamp)."""
    by_stamp: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if "_aws" in record:
            by_stamp.setdefault(record["_aws"]["Timestamp"], []).append(record)
    return [by_stamp[stamp] for stamp in sorted(by_stamp)]


def test_the_exhaustion_alarm_does_not_fire_on_a_target_used_at_one_percent_of_its_envelope(store, table) -> None:
    """An envelope of 10/s with a burst of 5; the agents fan out 4 requests at once, once a
    minute, for 10 minutes: 4 requests a minute against 600 allowed, none deferred. The
    `Exhausted` alarm (it watched ``RemainingAtDecision`` Minimum < 1 for 10 one-minute periods:
    tokens left after the grant, 0.93 here) must not call that envelope exhausted; the spec alarms
    on exhaustion (deferrals for an empty budget), and a team cannot run on an alarm that fires
    for 1% use. The same alarm does fire when the envelope refuses requests every minute."""
    import io
    import json

    from aws_cdk.assertions import Template

    from rayito_constructs.egress import EmfRecorder
    from rayito_constructs.egress_budget import EgressBudget
    from rayito_constructs.model.options import EgressBudgetOptions

    from .cdk_helpers import new_app, new_stack

    stack = new_stack(new_app(), "Budget")
    EgressBudget(stack, "Egress", fleet_name="fan", metrics=True,
                 envelopes=[EgressBudgetOptions(target=API, rate="10/second", burst=5)])
    alarms = Template.from_stack(stack).find_resources("AWS::CloudWatch::Alarm")
    (exhausted,) = [a["Properties"] for k, a in alarms.items() if k.startswith("EgressExhausted")]
    assert "exhausted" in exhausted["AlarmDescription"]
    periods = exhausted["EvaluationPeriods"]
    assert exhausted.get("Period", 60) == 60 and exhausted.get("DatapointsToAlarm", periods) == periods

    def minutes(budget_table: str, fan_out: int) -> tuple[int, list[list[dict[str, Any]]]]:
        clock = Clock()
        out = io.StringIO()
        recorder = EmfRecorder("fan", out=out, clock=clock, background=False, metrics=True)
        # A client that knows the store's time to a millisecond (as its background calibration does).
        budget = new_client(store, budget_table, clock, envelopes=[Envelope(API, 10, 5)], on_decision=recorder)
        deferred = 0
        for _minute in range(periods):
            for i in range(fan_out):
                deferred += isinstance(budget.acquire(f"{API}/v1/x{i}"), Deferral)
            clock.now += 60.0
        recorder.close()
        windows = windows_of([json.loads(line) for line in out.getvalue().splitlines()])
        return deferred, [w for w in windows if any(r.get("target") == API for r in w)]

    deferred, windows = minutes(table, 4)
    assert deferred == 0 and len(windows) == periods
    breaching = [alarm_value(exhausted, w) for w in windows if breaches(exhausted, alarm_value(exhausted, w))]
    assert len(breaching) < periods, (
        f"{len(breaching)} of {len(windows)} one-minute windows breach the Exhausted alarm "
        f"({breaching[:3]}...) with 0 deferrals at 4 of 600 requests a minute")
    # Twelve at once against a burst of 5, every minute: refused for an empty budget each minute.
    other = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), other)
    deferred, windows = minutes(other, 12)
    assert deferred >= 7 * periods and len(windows) == periods
    assert all(breaches(exhausted, alarm_value(exhausted, w)) for w in windows)


def test_an_alarm_action_topic_in_another_region_is_refused_at_synth() -> None:
    """CloudWatch sends an alarm's actions only to an SNS topic of the alarm's own region:
    PutMetricAlarm answers ``ValidationError: Invalid region ca-central-1 specified. Only
    us-west-2 is supported.`` (cds-snc/notification-terraform#128), so the stack fails at deploy
    on its first alarm. The fleet parses the ARN at synth (``check_alarm_actions``); a region other
    than the stack's must be the same kind of one-line error, not a template CloudFormation
    rejects."""
    from rayito_constructs import AgentFleet, AgentProject

    from .cdk_helpers import new_app, new_stack
    from .conftest import EXAMPLE

    stack = new_stack(new_app(), "Ops")  # us-east-1
    with pytest.raises(ValueError, match="alarm_actions"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                   alarm_actions="arn:aws:sns:eu-west-1:123456789012:ops")


@pytest.mark.parametrize("kwargs", [
    pytest.param({"deficit_minutes": 2000}, id="deficit-longer-than-a-day"),
    pytest.param({"amplification_threshold": float("nan")}, id="amplification-nan"),
    pytest.param({"stray_seconds": -5}, id="stray-seconds-negative"),
])
def test_add_alarms_refuses_values_cloudwatch_refuses_with_one_line(kwargs) -> None:
    """``FleetReconciler.add_alarms`` is documented (docs/reconciler.md) and takes numbers a user
    types. PutMetricAlarm refuses ``EvaluationPeriods x Period`` above one day (2000 one-minute
    periods), a NaN threshold crashes synth with a JSONDecodeError traceback, and a negative
    ``stray_seconds`` makes an alarm that is always in ALARM. Each should be a one-line
    ValueError naming the argument, like every other option of the fleet."""
    from aws_cdk.assertions import Template

    from rayito_constructs import AgentFleet, AgentProject

    from .cdk_helpers import new_app, new_stack
    from .conftest import EXAMPLE

    stack = new_stack(new_app(), "Alarms")
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                       reconciler_alarms=False)
    assert fleet.reconciler is not None
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        fleet.reconciler.add_alarms(custom_metrics=True, **kwargs)
        Template.from_stack(stack)


def test_the_deferral_rate_alarm_sees_half_the_requests_deferred_when_processes_differ_in_traffic() -> None:
    """The `Deferrals` alarm says "over 20% of requests to <target> deferred for 15 minutes". Its
    metric is ``DeferralRate`` with statistic Average: CloudWatch averages each process's own
    percentage, one datapoint per process per window, unweighted. One busy agent process sends
    1,000 requests and 500 are deferred; nine idle processes send one request each, granted. Of
    1,009 requests, 49.6% were deferred; the alarm's statistic reads 5.0% and stays OK. Expected:
    the alarm computes the fleet's rate (Sum of Deferrals / Sum of Requests), so it fires."""
    import io
    import json

    from aws_cdk.assertions import Template

    from rayito_constructs.egress import EmfRecorder
    from rayito_constructs.egress_budget import EgressBudget
    from rayito_constructs.model.options import EgressBudgetOptions

    from .cdk_helpers import new_app, new_stack

    stack = new_stack(new_app(), "Rate")
    EgressBudget(stack, "Egress", fleet_name="swarm", metrics=True,
                 envelopes=[EgressBudgetOptions(target=API, rate="10/second", burst=5)])
    alarms = Template.from_stack(stack).find_resources("AWS::CloudWatch::Alarm")
    (rate_alarm,) = [a["Properties"] for a in alarms.values() if "over 20% of requests" in a["Properties"]["AlarmDescription"]]
    granted = Granted(API, 3.0, 0, None, (API,), 10.0, 5)
    deferred = Deferral(API, 0.1, "budget_empty", 0.0, 0, None, "", (API,), 10.0, 5)
    records: list[dict[str, Any]] = []
    requests = deferrals = 0
    for process in range(10):
        clock = Clock()
        out = io.StringIO()
        recorder = EmfRecorder("swarm", out=out, clock=clock, background=False, metrics=True, log_decisions=False)
        decisions = [granted, deferred] * 500 if process == 0 else [granted]
        for decision in decisions:
            recorder(decision)
        recorder.close()
        requests += len(decisions)
        deferrals += sum(isinstance(d, Deferral) for d in decisions)
        records += [json.loads(line) for line in out.getvalue().splitlines()]
    true_rate = 100.0 * deferrals / requests
    # What the alarm computes from every process's datapoints of the period (all in one window).
    seen = alarm_value(rate_alarm, records)
    assert true_rate > rate_alarm["Threshold"]
    assert seen is not None and breaches(rate_alarm, seen), (
        f"{true_rate:.1f}% of requests deferred, the alarm reads {seen}% "
        f"(threshold {rate_alarm['Threshold']}%): it stays OK")
    assert seen == pytest.approx(true_rate, abs=0.01)
