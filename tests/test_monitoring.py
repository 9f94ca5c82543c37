"""The operations surface in the template (docs/operations.md): metrics off by default and then no
custom metric anywhere, alarms that refuse to watch metrics nobody sends, alarm actions on every
alarm below a fleet (the library's, later ones, a user's), the dashboard's widgets, the saved
queries, log retention of every log group, and app.py's context keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
import pytest
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Annotations, Match, Template
from constructs import Construct

from rayito_constructs import AgentFleet, AgentProject, EgressBudget, FleetStack
from rayito_constructs._function import library_function
from rayito_constructs.monitoring import (
    RETENTION_DAYS,
    Operations,
    create_alarm,
    retention_days,
    retention_from_days,
)
from rayito_constructs.queries import admission_timeline, egress_deferrals, egress_per_target, reconciler_problems
from rayito_constructs.reconciler import OPERATIONS

from .app_runner import stacks, synth
from .cdk_helpers import dashboard_body, lint_template, nag, new_app, new_stack, resources, stack_props, widget_metrics
from .conftest import EXAMPLE
from .logs_insights import parse
from .monitoring_invariants import violations
from .projects import project_with

OPS = "arn:aws:sns:us-east-1:123456789012:ops"
PAGER = "arn:aws:sns:us-east-1:123456789012:pager"
TARGETS = ("https://api.example.com", "https://api.example.com/v1/search?region")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def off() -> tuple[cdk.App, FleetStack, dict]:
    """The example fleet as `make synth` makes it: every default."""
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    return app, stack, Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def on() -> tuple[cdk.App, FleetStack, dict]:
    """Metrics on, three actions given four ways (a topic by ARN, the same topic imported, an SSM
    OpsItem action), and alarms added after the fleet: a user's, one with its own action, a bare
    CfnAlarm and a composite alarm below the fleet, and one beside it in the stack."""
    app = new_app()
    topics = cdk.Stack(app, "Topics", env=stack_props()["env"])
    cdk.CfnWaitConditionHandle(topics, "Placeholder")  # a stack may not be empty
    same = sns.Topic.from_topic_arn(topics, "Same", OPS)
    ssm = cw_actions.SsmAction(cw_actions.OpsItemSeverity.HIGH)
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), metrics=True,
                       alarm_actions=[OPS, same, ssm], **stack_props())
    fleet = stack.fleet
    fleet.reconciler.metric_deficit().create_alarm(fleet, "MineLater", threshold=3, evaluation_periods=2)
    own = fleet.reconciler.metric_dead_letters().create_alarm(fleet, "OwnAction", threshold=9, evaluation_periods=1)
    own.add_alarm_action(cw_actions.SnsAction(sns.Topic.from_topic_arn(stack, "Pager", PAGER)))
    own.add_alarm_action(cw_actions.SnsAction(sns.Topic.from_topic_arn(stack, "OpsAgain", OPS)))
    cloudwatch.CfnAlarm(fleet, "Bare", comparison_operator="GreaterThanThreshold", evaluation_periods=1,
                        threshold=0, metric_name="Errors", namespace="AWS/Lambda", period=60, statistic="Sum")
    cloudwatch.CompositeAlarm(fleet, "Composite", alarm_rule=cloudwatch.AlarmRule.any_of(*fleet.reconciler.alarms[:2]))
    fleet.reconciler.metric_dead_letters().create_alarm(stack, "Beside", threshold=1, evaluation_periods=1)
    return app, stack, Template.from_stack(stack).to_json()


def reconciler_env(template: dict) -> dict[str, Any]:
    (fn,) = [r for r in resources(template, "AWS::Lambda::Function").values()
             if r["Properties"]["Handler"] == "reconciler.index.handler"]
    return fn["Properties"]["Environment"]["Variables"]


def image_env(stack: Any) -> dict[str, Any]:
    """What rayd hands the agents: the template env composed into the fleet's image zip."""
    from rayito_constructs.image_composition import template_env_of

    return template_env_of(Path(stack.fleet.image.code.asset_path if Path(stack.fleet.image.code.asset_path).is_absolute()
                                else Path(cdk.Stage.of(stack).outdir) / stack.fleet.image.code.asset_path).read_bytes())


# --------------------------------------------------------------------------- metrics off: nothing custom


def test_metrics_are_off_by_default_everywhere(off) -> None:
    _, stack, template = off
    assert stack.fleet.metrics is False and stack.fleet.dashboard is None
    env = reconciler_env(template)
    assert env["RAYITO_METRICS"] == "off" and env["POWERTOOLS_METRICS_DISABLED"] == "true"
    (recipe,) = resources(template, "Custom::RayitoRecipe").values()
    assert recipe["Properties"]["Metrics"] == "off"
    assert image_env(stack)["RAYITO_METRICS"] == "off"  # the agents' EmfRecorder
    assert not resources(template, "AWS::CloudWatch::Dashboard")
    assert "DashboardName" not in template["Outputs"]
    # The one alarm left needs no custom metric: the dead-letter queue's depth (SQS).
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert [a["Properties"]["Namespace"] for a in alarms.values()] == ["AWS/SQS"]
    assert all("AlarmActions" not in a["Properties"] for a in alarms.values())


def test_metrics_on_turn_on_every_emitter_and_every_alarm(on) -> None:
    _, stack, template = on
    assert reconciler_env(template)["RAYITO_METRICS"] == "on"
    assert "POWERTOOLS_METRICS_DISABLED" not in reconciler_env(template)
    (recipe,) = resources(template, "Custom::RayitoRecipe").values()
    assert recipe["Properties"]["Metrics"] == "on"
    assert image_env(stack)["RAYITO_METRICS"] == "on"
    made = {stack.resolve(stack.get_logical_id(a.node.default_child)) for a in stack.fleet.alarms}
    watched = [resources(template, "AWS::CloudWatch::Alarm")[k]["Properties"] for k in made]
    # A metric's name, or a metric math alarm's expression (the egress deferral rate: the fleet's).
    metrics = sorted(p.get("MetricName") or next(q["Expression"] for q in p["Metrics"] if q.get("ReturnData"))
                     for p in watched)
    assert metrics == sorted([
        "RetryAmplification", "Deficit", "DeadLetteredSlots", "ApproximateNumberOfMessagesVisible", "OldestStrayAge",
        "RecipeNotSaved", "Deferrals", "Deferrals", "100 * deferred / requests", "100 * deferred / requests", "Deferrals",
    ])
    assert template["Outputs"]["DashboardName"]["Value"] == {"Fn::Join": ["", ["Rayito-mi-agente-", {"Ref": "AWS::Region"}]]} \
        or template["Outputs"]["DashboardName"]["Value"] == "Rayito-mi-agente-us-east-1"


# --------------------------------------------------------------------------- refusals at synth


@pytest.mark.parametrize("option", ["reconciler_alarms", "recipe_alarm", "egress_alarms", "dashboard"])
def test_what_needs_metrics_refuses_without_them(option) -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError) as info:
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, **{option: True})
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{option}=True: ") and "metrics is False" in message and "metrics=True" in message
    assert "docs/operations.md" in message
    assert stack.node.try_find_child("Fleet") is None  # refused before anything was built
    # The same option with metrics on synthesizes.
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True, **{option: True})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"metrics": "false"}, "metrics: 'false' is not True or False"),
    ({"metrics": 1}, "metrics: 1 is not True or False"),
    ({"dashboard": "yes"}, "dashboard: 'yes' is not True, False or None"),
    ({"saved_queries": "false"}, "saved_queries: 'false' is not True or False"),
    ({"saved_queries": None}, "saved_queries: None is not True or False"),
    ({"log_retention": 30}, "log_retention: 30 is not a logs.RetentionDays"),
    ({"microvm_log_retention": "ONE_WEEK"}, "microvm_log_retention: 'ONE_WEEK' is not a logs.RetentionDays"),
    ({"alarm_actions": "ops"}, "alarm_actions: 'ops' is not an SNS topic ARN"),
    ({"alarm_actions": [OPS, "arn:aws:sqs:us-east-1:123456789012:q"]}, "alarm_actions[1]: 'arn:aws:sqs"),
    ({"alarm_actions": [OPS + "\n"]}, "alarm_actions[0]: "),
    ({"alarm_actions": 42}, "alarm_actions: 42 is neither an SNS topic"),
])
def test_bad_operations_options_are_one_line(kwargs, message) -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError) as info:
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, **kwargs)
    assert str(info.value).startswith(message) and len(str(info.value).splitlines()) == 1
    assert stack.node.try_find_child("Fleet") is None


def test_the_parts_refuse_on_their_own() -> None:
    """Outside a fleet the same rule holds: the alarm factory looks at the metric, not at a flag."""
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    with pytest.raises(ValueError, match=r"^add_alarms\(custom_metrics=True\): the alarm AmplificationAlarm watches "
                                         r"Rayito/Fleet RetryAmplification, a custom metric, and metrics are off"):
        fleet.reconciler.add_alarms(custom_metrics=True)
    with pytest.raises(ValueError, match=r"^add_alarm\(\): the alarm NotSavedAlarm watches Rayito/Fleet RecipeNotSaved"):
        fleet.recipe.add_alarm()
    with pytest.raises(ValueError, match=r"^alarms=True: the alarm Exhausted\w+ watches Rayito/Egress Deferrals"):
        EgressBudget(stack, "Budget", fleet_name="suelto", envelopes=fleet.project.egress.budgets, alarms=True)
    # A math expression over a custom metric is a custom metric too; an AWS metric never needs one.
    expression = cloudwatch.MathExpression(expression="m1 * 2", using_metrics={"m1": fleet.reconciler.metric_deficit()})
    with pytest.raises(ValueError, match="watches Rayito/Fleet Deficit"):
        create_alarm(fleet, "Doubled", expression, option="mine", threshold=1, evaluation_periods=1)
    create_alarm(fleet, "Queue", fleet.reconciler.metric_dead_letters(), option="mine", threshold=1, evaluation_periods=1)
    # A standalone reconciler (outside any fleet) has metrics off unless told.
    assert Operations.of(stack) == Operations()
    assert EgressBudget(stack, "Quiet", fleet_name="suelto", envelopes=fleet.project.egress.budgets).alarms == []


# --------------------------------------------------------------------------- alarm actions


def test_every_alarm_below_the_fleet_gets_its_actions(on) -> None:
    _, stack, template = on
    below = [k for k in {**resources(template, "AWS::CloudWatch::Alarm"), **resources(template, "AWS::CloudWatch::CompositeAlarm")}
             if k.startswith("Fleet")]
    assert len(below) == 11 + 4  # the fleet's own eleven, then the user's four below it
    for logical_id in below:
        actions = template["Resources"][logical_id]["Properties"]["AlarmActions"]
        assert OPS in actions, logical_id
        assert any("opsitem" in json.dumps(a) for a in actions), logical_id
        assert len(actions) == len({json.dumps(a, sort_keys=True) for a in actions}), logical_id  # each once
    own = template["Resources"][[k for k in below if k.startswith("FleetOwnAction")][0]]["Properties"]["AlarmActions"]
    assert own[:2] == [PAGER, OPS] and len(own) == 3  # its own first, ours added once
    beside = [r for k, r in resources(template, "AWS::CloudWatch::Alarm").items() if k.startswith("Beside")]
    assert beside and "AlarmActions" not in beside[0]["Properties"]  # outside the fleet: not ours to touch


def test_actions_lint_and_nag_clean(on) -> None:
    app, stack, template = on
    assert lint_template(Template.from_json(template)) == []
    assert nag(app) == []


def test_the_gate_catches_an_alarm_without_the_actions(on) -> None:
    """The session gate (tests/conftest.py) is not vacuous: a template whose alarm lost an action,
    or one on a custom metric below a fleet whose metrics are off, is reported."""
    _, stack, template = on
    from .monitoring_invariants import expectations

    fleets = expectations(stack)
    assert violations(template, fleets) == []
    (fleet,) = fleets
    broken = json.loads(json.dumps(template))
    first = fleet["alarms"][0]
    broken["Resources"][first]["Properties"]["AlarmActions"] = [OPS]
    assert violations(broken, fleets) == [f"{fleet['fleet']}: alarm {first} has actions ['{OPS}'], not the fleet's 2 (['{OPS}'])"]
    quiet = [{**fleet, "metrics": False, "actions": 0}]
    assert any("while metrics are off" in v for v in violations(template, quiet))
    assert any("a dashboard while metrics are off" in v for v in violations(template, quiet))


# --------------------------------------------------------------------------- dashboard


def test_the_dashboard_shows_what_the_essays_ask(on) -> None:
    _, stack, template = on
    body = dashboard_body(template)
    metrics = widget_metrics(body)
    fleet = {"fleet": "mi-agente", "service": "rayito-reconciler"}

    def has(namespace: str, name: str, dims: dict, stat: str) -> bool:
        return any(m.get("namespace") == namespace and m.get("name") == name and m.get("dims") == dims
                   and m.get("stat") == stat for m in metrics)

    for name, stat in [("Deficit", "Maximum"), ("WaitTime", "p90"), ("WaitTime", "p50"), ("ClaimToComplete", "p90"),
                       ("RetryAmplification", "Maximum"), ("LiveBaseVMs", "Minimum"), ("ParkedSlots", "Minimum"),
                       ("DeadLetteredSlots", "Maximum"), ("StrayVMs", "Maximum"), ("OldestStrayAge", "Maximum"),
                       ("RunMicrovmAttempts", "Sum"), ("SlotsFilled", "Sum")]:
        assert has("Rayito/Fleet", name, fleet, stat), name
    for operation in OPERATIONS:
        assert has("Rayito/Fleet", "Deferrals", {**fleet, "operation": operation}, "Sum"), operation
        assert has("Rayito/Fleet", "Throttles", {**fleet, "operation": operation}, "Sum"), operation
    assert any(m.get("namespace") == "AWS/SQS" and m.get("name") == "ApproximateNumberOfMessagesVisible" for m in metrics)
    assert any(m.get("namespace") == "AWS/Lambda" and m.get("name") == "Errors" for m in metrics)
    assert has("Rayito/Fleet", "RecipeNotSaved", {"fleet": "mi-agente"}, "Sum")
    assert has("Rayito/Fleet", "RecipeSaved", {"fleet": "mi-agente"}, "Sum")
    for target in TARGETS:
        dims = {"fleet": "mi-agente", "target": target}
        for name, stat in [("Requests", "Sum"), ("Granted", "Sum"), ("Deferrals", "Sum"),
                           ("RemainingAtDecision", "Minimum"), ("EnvelopeRate", "Maximum"), ("EnvelopeBurst", "Maximum")]:
            assert has("Rayito/Egress", name, dims, stat), (target, name)
        # What the exhaustion alarm watches: refusals for an empty budget of this envelope.
        assert has("Rayito/Egress", "Deferrals", {**dims, "reason": "budget_empty"}, "Sum"), target
    # The deferral rate is the fleet's, deferred over requests of the same graph (its ids), not
    # the Average of each process's own rate.
    rates = [m for m in metrics if m.get("expression") == "100 * deferred / requests"]
    assert len(rates) == len(TARGETS)
    assert not [m for m in metrics if m.get("name") == "DeferralRate"]
    for reason in ("budget_empty", "backoff", "limiter_unavailable", "invalid_target", "invalid_cost"):
        assert has("Rayito/Egress", "Deferrals", {"fleet": "mi-agente", "reason": reason}, "Sum"), reason
    searches = [m["expression"] for m in metrics if m.get("expression", "").startswith("SEARCH(")]
    assert searches == [
        "SEARCH('{Rayito/Egress,fleet,target} MetricName=\"Deferrals\" fleet=\"mi-agente\"', 'Sum', 60)",
        "SEARCH('{Rayito/Egress,fleet,reason,target} MetricName=\"Deferrals\" fleet=\"mi-agente\"', 'Sum', 60)",
        "SEARCH('{Rayito/Egress,fleet,reason,target} MetricName=\"Deferrals\" fleet=\"mi-agente\" "
        "reason=\"backoff\"', 'Sum', 60)"]
    # The header names the saved queries and shows every alarm the fleet made.
    (text,) = [w for w in body["widgets"] if w["type"] == "text"]
    assert "rayito/mi-agente/admission-timeline" in text["properties"]["markdown"]
    (status,) = [w for w in body["widgets"] if w.get("properties", {}).get("title") == "Alarms"]
    assert len(status["properties"]["alarms"]) == 11
    # Graphs and alarms read the same metric objects: the amplification alarm's line is drawn.
    (amplification,) = [w for w in body["widgets"] if "amplification" in w.get("properties", {}).get("title", "")]
    assert amplification["properties"]["annotations"]["horizontal"][0]["value"] == 1.5


def test_a_dashboard_for_a_fleet_without_reconciler_or_budgets(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(None, name="solo")), metrics=True,
                       reconciler=False, alarm_actions=OPS)
    template = Template.from_stack(stack).to_json()
    body = dashboard_body(template)
    assert {m["name"] for m in widget_metrics(body)} == {"RecipeSaved", "RecipeNotSaved"}
    assert fleet.queries is None  # no reconciler log, no egress: nothing to query
    (alarm,) = resources(template, "AWS::CloudWatch::Alarm").values()
    assert alarm["Properties"]["AlarmActions"] == [OPS]


# --------------------------------------------------------------------------- saved queries


def test_query_definitions(off) -> None:
    _, stack, template = off
    definitions = {r["Properties"]["Name"]: r["Properties"] for r in resources(template, "AWS::Logs::QueryDefinition").values()}
    assert set(definitions) == {f"rayito/mi-agente/{q}" for q in
                                ("admission-timeline", "reconciler-problems", "egress-per-target", "egress-deferrals")}
    reconciler_logs = stack.resolve(stack.fleet.reconciler.log_group.log_group_name)
    for name, text in [("admission-timeline", admission_timeline("mi-agente")),
                       ("reconciler-problems", reconciler_problems("mi-agente"))]:
        props = definitions[f"rayito/mi-agente/{name}"]
        assert props["QueryString"] == text and props["LogGroupNames"] == [reconciler_logs]
        parse(text)  # the evaluator's subset: anything else would not pass
    for name, text in [("egress-per-target", egress_per_target("mi-agente")),
                       ("egress-deferrals", egress_deferrals("mi-agente"))]:
        props = definitions[f"rayito/mi-agente/{name}"]
        assert props["QueryString"] == text and props["LogGroupNames"] == ["/aws/lambda-microvms/mi-agente"]
        parse(text)


def test_queries_off_and_names_that_need_quoting() -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, saved_queries=False)
    assert fleet.queries is None
    # A fleet name is [A-Za-z0-9_-]; the query quotes it as a string all the same.
    for name in ("a_b-C9", "x" * 64):
        for text in (admission_timeline(name), egress_per_target(name)):
            assert f'fleet = "{name}"' in text
            parse(text)


# --------------------------------------------------------------------------- log retention


def log_groups(template: dict) -> dict[str, Any]:
    return {k: r.get("Properties", {}).get("RetentionInDays") for k, r in resources(template, "AWS::Logs::LogGroup").items()}


def test_default_retention_of_every_log_group(off) -> None:
    _, _, template = off
    groups = log_groups(template)
    assert {k: v for k, v in groups.items() if k.startswith("FleetReconcilerLogs")} .popitem()[1] == 90
    assert {k: v for k, v in groups.items() if k.startswith("FleetReconcilerServerLogs")}.popitem()[1] == 90
    assert {k: v for k, v in groups.items() if k.startswith("RayitoRecipeWriterLogs")}.popitem()[1] == 90
    # The image's build group (/rayito/<name>) and the VMs' group: the MicroVM retention.
    assert [v for k, v in groups.items() if k.startswith("FleetImageLogs") or "Microvm" in k] == [30, 30]
    # The fleet's teardown and the image's pruner (#13) follow the fleet's function retention.
    assert [v for k, v in groups.items() if k.startswith(("FleetTeardown", "FleetImagePrunerLogs"))] == [90, 90]
    assert len(groups) == 7  # and no log group is left without a retention
    assert all(v for v in groups.values())


def test_retention_follows_the_fleet_and_the_writer_keeps_the_longest(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    week = AgentFleet(stack, "Week", project=AgentProject.load(EXAMPLE), build_image=False,
                      log_retention=logs.RetentionDays.ONE_WEEK, own_microvm_log_group=True,
                      microvm_log_retention=logs.RetentionDays.TWO_WEEKS)
    # A function added later below the fleet (as teardown or pruning would be) follows it untold.
    library_function(Construct(week, "Later"), name="reconciler", as_package=True, description="later",
                     role_description="later")
    year = AgentFleet(stack, "Year", project=AgentProject.load(agent_folder(None, name="otro")), build_image=False,
                      log_retention=logs.RetentionDays.ONE_YEAR)
    template = Template.from_stack(stack).to_json()
    groups = log_groups(template)
    by_prefix = {p: [v for k, v in groups.items() if k.startswith(p)] for p in
                 ("WeekReconcilerLogs", "WeekLaterLogs", "WeekMicrovmLogs", "YearReconcilerLogs", "RayitoRecipeWriterLogs")}
    assert by_prefix == {"WeekReconcilerLogs": [7], "WeekLaterLogs": [7], "WeekMicrovmLogs": [14],
                         "YearReconcilerLogs": [365], "RayitoRecipeWriterLogs": [365]}
    assert year.operations.log_retention == logs.RetentionDays.ONE_YEAR


def test_never_expire() -> None:
    app = new_app()
    stack = FleetStack(app, "Forever", project=AgentProject.load(EXAMPLE), log_retention=logs.RetentionDays.INFINITE,
                       **stack_props())
    groups = log_groups(Template.from_stack(stack).to_json())
    assert [v for k, v in groups.items() if k.startswith(("FleetReconcilerLogs", "RayitoRecipeWriterLogs"))] == [None, None]


def test_retention_table_matches_cdk() -> None:
    app = new_app()
    stack = new_stack(app)
    for name in RETENTION_DAYS:
        logs.LogGroup(stack, name, retention=getattr(logs.RetentionDays, name))
    rendered = {k: r.get("Properties", {}).get("RetentionInDays")
                for k, r in Template.from_stack(stack).to_json()["Resources"].items()}
    for name, days in RETENTION_DAYS.items():
        (value,) = [v for k, v in rendered.items() if k.startswith(name.replace("_", ""))]
        assert value == days, name
        assert retention_days(getattr(logs.RetentionDays, name)) == days
    assert set(RETENTION_DAYS) == {m.name for m in logs.RetentionDays}
    assert retention_from_days(0) == logs.RetentionDays.INFINITE and retention_from_days(400) == logs.RetentionDays.THIRTEEN_MONTHS
    with pytest.raises(ValueError, match="31 days is not a CloudWatch Logs retention"):
        retention_from_days(31)


# --------------------------------------------------------------------------- an image the fleet does not build


def test_egress_metrics_need_the_switch_in_an_image_built_elsewhere() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), metrics=True,
               image_arn="arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente")
    warnings = [m for m in Annotations.from_stack(stack).find_warning("*", Match.any_value())
                if "egress_metrics_switch" in str(m.entry.data)]
    assert len(warnings) == 1 and "RAYITO_METRICS=on" in str(warnings[0].entry.data)


# --------------------------------------------------------------------------- app.py context


def test_context_keys_of_app_py(monkeypatch, tmp_path, capsys) -> None:
    code, err, outdir = synth(monkeypatch, tmp_path, capsys, metrics="true", alarm_actions=f"{OPS},{PAGER}",
                              log_retention="30")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert len(alarms) == 11 and all(a["Properties"]["AlarmActions"] == [OPS, PAGER] for a in alarms.values())
    assert resources(template, "AWS::CloudWatch::Dashboard")
    assert sorted(v for k, v in log_groups(template).items() if "Microvm" not in k and "ImageLogs" not in k) == [30] * 5  # with server, teardown, pruner
    assert len(resources(template, "AWS::Logs::QueryDefinition")) == 4
    code, err, outdir = synth(monkeypatch, tmp_path / "quiet", capsys, saved_queries="false")
    assert code == 0, err
    (template,) = stacks(outdir).values()
    assert not resources(template, "AWS::Logs::QueryDefinition")


@pytest.mark.parametrize(("context", "line"), [
    ({"metrics": "maybe"}, "-c metrics: 'maybe' is not true or false"),
    ({"metric": "true"}, "-c metric: unknown context key; did you mean 'metrics'?"),
    ({"alarm_actions": "ops"}, "-c alarm_actions: 'ops' is not an SNS topic ARN"),
    ({"alarm_actions": ""}, "-c alarm_actions: give at least one SNS topic ARN"),
    ({"log_retention": "31"}, "-c log_retention: '31' is not a retention CloudWatch Logs offers"),
    ({"log_retention": "-1"}, "-c log_retention: '-1' is not a retention"),
    ({"log_retention": "٣٠"}, "-c log_retention: '٣٠' is not a retention"),
    ({"log_retention": "30.0"}, "-c log_retention: '30.0' is not a retention"),
    ({"log_retention": "NaN"}, "-c log_retention: 'NaN' is not a retention"),
    ({"log_retention": "30 days"}, "-c log_retention: '30 days' is not a retention"),
    ({"log_retention": "3653000"}, "-c log_retention: '3653000' is not a retention"),
    ({"alarm_actions": "arn:aws:sns:us-east-1:١٢٣٤٥٦٧٨٩٠١٢:ops"}, "-c alarm_actions: 'arn:aws:sns:us-east-1:"),
    ({"alarm_actions": f"{OPS},arn:aws:sns:us-east-1:123456789012:"}, "-c alarm_actions: 'arn:aws:sns:us-east-1:123456789012:'"),
    ({"dashboard": "true"}, "dashboard=True: its graphs are the custom metrics"),
    ({"saved_queries": "nope"}, "-c saved_queries: 'nope' is not true or false"),
    ({"alarm_actions": ",".join(f"arn:aws:sns:us-east-1:123456789012:t{i}" for i in range(6))},
     "-c alarm_actions: 6 topics; a CloudWatch alarm takes at most 5 actions"),
])
def test_context_mistakes_are_one_line(monkeypatch, tmp_path, capsys, context, line) -> None:
    code, err, _ = synth(monkeypatch, tmp_path, capsys, **context)
    assert code == 2
    assert err.splitlines()[0].startswith(line), err
    assert "Traceback" not in err


@pytest.mark.parametrize("given", ["arn", "topic", "list"])
def test_a_topic_of_another_region_is_one_line(given) -> None:
    """CloudWatch sends an alarm's actions only to a topic of its own region (PutMetricAlarm:
    "Invalid region ... specified"): refused at synth, as a string, an imported topic or in a list."""
    app = new_app()
    stack = new_stack(app)  # us-east-1
    arn = "arn:aws:sns:eu-west-1:123456789012:ops"
    actions = {"arn": arn, "topic": sns.Topic.from_topic_arn(stack, "Far", arn), "list": [OPS, arn]}[given]
    with pytest.raises(ValueError) as info:
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                   alarm_actions=actions)
    assert str(info.value).startswith(f"alarm_actions: '{arn}' is a topic in eu-west-1 and the stack deploys to us-east-1; ")
    assert len(str(info.value).splitlines()) == 1


def test_the_region_is_checked_only_when_the_stack_knows_it() -> None:
    """An environment-agnostic stack's region is a token: any region's topic is taken as given."""
    app = new_app()
    stack = cdk.Stack(app, "Agnostic", synthesizer=cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))
    arn = "arn:aws:sns:eu-west-1:123456789012:ops"
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True, alarm_actions=arn)
    alarms = resources(Template.from_stack(stack).to_json(), "AWS::CloudWatch::Alarm")
    assert alarms and all(a["Properties"]["AlarmActions"] == [arn] for a in alarms.values())


def test_context_alarm_actions_of_another_region(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "123456789012")
    monkeypatch.setenv("CDK_DEFAULT_REGION", "us-east-1")
    code, err, _ = synth(monkeypatch, tmp_path, capsys, metrics="true",
                         alarm_actions=f"{OPS},arn:aws:sns:eu-west-1:123456789012:pager")
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[0].startswith("-c alarm_actions: 'arn:aws:sns:eu-west-1:123456789012:pager' is a topic in "
                                          "eu-west-1 and the stack deploys to us-east-1"), err


@jsii.implements(cloudwatch.IAlarmAction)
class _Never:
    def bind(self, scope: Construct, alarm: cloudwatch.IAlarm) -> cloudwatch.AlarmActionConfig:
        return cloudwatch.AlarmActionConfig(alarm_action_arn="arn:aws:automate:us-east-1:ec2:stop")


def test_any_alarm_action_and_the_same_topic_twice() -> None:
    app = new_app()
    stack = new_stack(app)
    topic = sns.Topic(stack, "Ops")
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                       alarm_actions=[topic, topic, _Never()])
    assert len(fleet.operations.alarm_actions) == 2
    template = Template.from_stack(stack).to_json()
    for alarm in resources(template, "AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": stack.resolve(stack.get_logical_id(topic.node.default_child))},
                                                      "arn:aws:automate:us-east-1:ec2:stop"]


# --------------------------------------------------------------------------- hostile inputs: names, ARNs, two fleets


@pytest.mark.parametrize("arn", [
    "arn:aws:sns:us-east-1:١٢٣٤٥٦٧٨٩٠١٢:ops",  # Arabic-Indic digits: a bare \d would take them
    "arn:aws:sns:us-east-1:123456789012:ópś",
    "arn:aws:sns::123456789012:ops",
    "arn:aws:sns:us-east-1:12345678901:ops",
    "arn:aws:sns:us-east-1:123456789012:" + "a" * 257,
    "arn:aws:sns:us-east-1:123456789012:ops.fifo.fifo",
    "arn:aws:sns:us-east-1:123456789012:ops:sub",
    " " + OPS,
])
def test_bad_topic_arns_are_one_line(arn) -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError) as info:
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                   alarm_actions=arn)
    assert str(info.value).startswith("alarm_actions: ") and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("arn", [OPS, "arn:aws-cn:sns:cn-north-1:123456789012:ops_1",
                                 "arn:aws-us-gov:sns:us-gov-west-1:123456789012:a-b.fifo"])
def test_topic_arns_of_every_partition(arn) -> None:
    app = new_app()
    stack = new_stack(app, env=cdk.Environment(account="123456789012", region=arn.split(":")[3]))  # the topic's region
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True, alarm_actions=arn)
    for alarm in resources(Template.from_stack(stack).to_json(), "AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] == [arn]


def test_metrics_off_with_alarm_actions_keeps_the_free_alarm_only() -> None:
    """Off, the fleet makes no alarm on a custom metric, and the one alarm it makes (the dead-letter
    queue's depth, an SQS metric) gets the actions; so does a user's alarm on an AWS metric."""
    app = new_app()
    stack = FleetStack(app, "Quiet", project=AgentProject.load(EXAMPLE), alarm_actions=OPS, **stack_props())
    stack.fleet.reconciler.function.metric_errors().create_alarm(stack.fleet, "Errors", threshold=1,
                                                                evaluation_periods=1)
    template = Template.from_stack(stack).to_json()
    alarms = resources(template, "AWS::CloudWatch::Alarm")
    assert {p["Properties"]["Namespace"] for p in alarms.values()} == {"AWS/SQS", "AWS/Lambda"}
    assert len(alarms) == 2 and all(a["Properties"]["AlarmActions"] == [OPS] for a in alarms.values())
    assert not resources(template, "AWS::CloudWatch::Dashboard")
    assert "DashboardName" not in template.get("Outputs", {})


@pytest.mark.parametrize(("kwargs", "start"), [
    ({"fleet_name": "ñandú"}, "fleet_name: 'ñandú' must be"),
    ({"fleet_name": "a b"}, "fleet_name: 'a b' must be"),
    ({"fleet_name": ""}, "fleet_name: '' must be"),
    ({"fleet_name": "x" * 65}, "fleet_name: "),
    ({"fleet_name": "ok", "dashboard_name": "ñandú"}, "dashboard_name: 'ñandú' must be 1 to 255 of"),
    ({"fleet_name": "ok", "dashboard_name": "dash.board"}, "dashboard_name: 'dash.board' must be"),
    ({"fleet_name": "ok", "dashboard_name": ""}, "dashboard_name: '' must be"),
    ({"fleet_name": "ok", "dashboard_name": "x" * 256}, "dashboard_name: 'xxx"),
])
def test_dashboard_and_query_names_follow_cloudwatch_rules(kwargs, start) -> None:
    """PutDashboard: 1 to 255 of A-Z, a-z, 0-9, '-' and '_'. A one-line error at synth, not a
    jsii traceback (or a deploy that fails)."""
    from rayito_constructs.dashboard import FleetDashboard
    from rayito_constructs.queries import FleetQueries

    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError) as info:
        FleetDashboard(stack, "Dashboard", **kwargs)
    assert str(info.value).startswith(start) and len(str(info.value).splitlines()) == 1
    if "dashboard_name" not in kwargs:
        with pytest.raises(ValueError, match=r"^fleet_name: "):
            FleetQueries(stack, "Queries", fleet_name=kwargs["fleet_name"])
    # The longest fleet name and the longest dashboard name pass.
    FleetDashboard(stack, "Long", fleet_name="x" * 64)
    FleetDashboard(stack, "Longest", fleet_name="ok", dashboard_name="y" * 255)
    names = [r["Properties"]["DashboardName"] for r in resources(Template.from_stack(stack).to_json(),
                                                                    "AWS::CloudWatch::Dashboard").values()]
    assert sorted(names) == sorted([f"Rayito-{'x' * 64}-us-east-1", "y" * 255])


def test_two_fleets_in_one_stack_have_their_own_names(agent_folder) -> None:
    """Two fleets (metrics on, actions of their own, names apart only by '-' and '_') in one stack: two
    dashboards, eight saved queries, no name twice, each fleet's alarms with its own actions only."""
    app = new_app()
    stack = new_stack(app, "Two")
    one = AgentFleet(stack, "One", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                     alarm_actions=OPS)
    example_egress = {"budgets": [{"target": "https://api.example.com", "rate": "60/minute", "burst": 5},
                                  {"target": "https://api.example.com/v1/search?region", "rate": "30/minute", "burst": 2}]}
    two = AgentFleet(stack, "Two", project=project_with(name="mi_agente", tables={"egress": example_egress}), build_image=False,
                     metrics=True, alarm_actions=PAGER)
    template = Template.from_stack(stack).to_json()
    dashboards = [r["Properties"]["DashboardName"] for r in resources(template, "AWS::CloudWatch::Dashboard").values()]
    assert len(dashboards) == 2 and len({json.dumps(d, sort_keys=True) for d in dashboards}) == 2
    assert sorted(dashboards) == ["Rayito-mi-agente-us-east-1", "Rayito-mi_agente-us-east-1"]
    queries = [r["Properties"]["Name"] for r in resources(template, "AWS::Logs::QueryDefinition").values()]
    assert len(queries) == 8 and len(set(queries)) == 8
    assert {q.split("/")[1] for q in queries} == {"mi-agente", "mi_agente"}
    for fleet, topic in ((one, OPS), (two, PAGER)):
        ids = {stack.resolve(stack.get_logical_id(a.node.default_child)) for a in fleet.alarms}
        assert len(ids) == 11
        for logical_id in ids:
            assert template["Resources"][logical_id]["Properties"]["AlarmActions"] == [topic]
        # Each fleet's saved queries read its own log groups.
        for definition in fleet.queries.definitions.values():
            assert stack.resolve(definition.name).startswith(f"rayito/{fleet.fleet_name}/")
    assert lint_template(Template.from_json(template)) == []


def test_at_most_five_actions_an_alarm() -> None:
    """CloudWatch takes at most five actions per alarm state: six topics, or an alarm whose own
    actions and the fleet's make six, fail at synth, not at deploy."""
    topics = [f"arn:aws:sns:us-east-1:123456789012:t{i}" for i in range(6)]
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError, match=r"^alarm_actions: 6 actions; a CloudWatch alarm takes at most 5"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, alarm_actions=topics)
    assert stack.node.try_find_child("Fleet") is None
    # The same topic six times, as ARNs and as imported topics, is one action.
    same = [OPS, OPS, sns.Topic.from_topic_arn(stack, "Same", OPS)]
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, alarm_actions=same)
    assert len(fleet.operations.alarm_actions) == 1
    # Five of the fleet's and one of the alarm's own: an error on that alarm at synth.
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, alarm_actions=topics[:5])
    crowded = fleet.reconciler.metric_dead_letters().create_alarm(fleet, "Crowded", threshold=1, evaluation_periods=1)
    crowded.add_alarm_action(cw_actions.SnsAction(sns.Topic.from_topic_arn(stack, "Sixth", topics[5])))
    with pytest.raises(RuntimeError, match=r"alarm_actions: the alarm Test/Fleet/Crowded/Resource would have 6 "
                                           r"actions \(its own and the fleet's\); a CloudWatch alarm takes at most 5"):
        Template.from_stack(stack)


def test_a_users_alarm_on_a_custom_metric_with_metrics_off_fails_synth() -> None:
    """The library refuses its own alarms on custom metrics when metrics are off; one a user adds
    below the fleet (math alarms too) is a synth error the same way. AWS metrics, an alarm outside
    the fleet, and metrics on are left alone."""
    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    fleet.reconciler.metric_deficit().create_alarm(fleet, "Mine", threshold=1, evaluation_periods=1)
    with pytest.raises(RuntimeError, match=r"metrics: the alarm Test/Fleet/Mine/Resource watches Rayito/Fleet "
                                           r"Deficit, a custom metric the fleet sends only with metrics=True"):
        Template.from_stack(stack)
    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    math = cloudwatch.MathExpression(expression="d * 2", using_metrics={"d": fleet.reconciler.metric_deficit()})
    math.create_alarm(fleet, "Math", threshold=1, evaluation_periods=1)
    with pytest.raises(RuntimeError, match=r"the alarm Test/Fleet/Math/Resource watches Rayito/Fleet Deficit"):
        Template.from_stack(stack)
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    fleet.reconciler.function.metric_errors().create_alarm(fleet, "Errors", threshold=1, evaluation_periods=1)
    fleet.reconciler.metric_deficit().create_alarm(stack, "Outside", threshold=1, evaluation_periods=1)
    # A namespace of the user's own under Rayito/, and another fleet's metric: not this fleet's to judge.
    # (Read from the assembly, not Template.from_stack: the session gate holds the library's own
    # alarms to a stricter rule, no custom namespace at all below a fleet with metrics off.)
    cloudwatch.Metric(namespace="Rayito/MyApp", metric_name="Orders").create_alarm(fleet, "Own", threshold=1,
                                                                                 evaluation_periods=1)
    cloudwatch.Metric(namespace="Rayito/Fleet", metric_name="Deficit", dimensions_map={"fleet": "otra"}).create_alarm(
        fleet, "Other", threshold=1, evaluation_periods=1)
    template = app.synth().get_stack_by_name(stack.stack_name).template
    alarms = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert {a["Properties"].get("Namespace") for a in alarms} >= {"Rayito/MyApp", "Rayito/Fleet", "AWS/Lambda"}
    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True)
    fleet.reconciler.metric_deficit().create_alarm(fleet, "Mine", threshold=1, evaluation_periods=1)
    assert Template.from_stack(stack).find_resources("AWS::CloudWatch::Alarm")
