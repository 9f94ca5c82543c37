"""FleetReconciler in the template: function, schedule, dead letters, IAM, tables, alarms, asset."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Annotations, Match, Template

from rayito_constructs import AgentFleet, AgentProject, ControlPlaneBudget, FleetStack

from ..cdk_helpers import lint_template, nag, new_app, new_stack, stack_props
from ..conftest import EXAMPLE
from ..projects import project_with


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> tuple[cdk.App, FleetStack, Template, Path]:
    app = new_app()
    stack = FleetStack(app, "Fleet", project=AgentProject.load(EXAMPLE), **stack_props())
    template = Template.from_stack(stack)
    assembly = app.synth()
    return app, stack, template, Path(assembly.directory)


def reconciler_function(template: Template) -> dict:
    functions = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": "reconciler.index.handler"}})
    (function,) = functions.values()
    return function["Properties"]


def test_function(synth) -> None:
    _, _, template, _ = synth
    props = reconciler_function(template)
    assert props["Runtime"] == "python3.14" and props["Architectures"] == ["arm64"]
    assert props["Timeout"] == 65 and props["LoggingConfig"]["LogFormat"] == "JSON"
    env = props["Environment"]["Variables"]
    assert {k: env[k] for k in ("FLEET_NAME", "MIN_VMS", "MAX_VMS", "WARM_VMS", "IDLE_SECONDS", "MAX_LIFETIME_SECONDS")} == {
        "FLEET_NAME": "mi-agente", "MIN_VMS": "1", "MAX_VMS": "3", "WARM_VMS": "1", "IDLE_SECONDS": "600",
        "MAX_LIFETIME_SECONDS": "28800",
    }
    assert env["IMAGE_ARN"] == {"Fn::GetAtt": ["FleetImage4D94793D", "ImageArn"]}
    assert env["IMAGE_VERSION"] == {"Fn::GetAtt": ["FleetImage4D94793D", "LatestActiveImageVersion"]}
    assert env["BASE_ROLLOUT"] == "on_expiry"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Rayito/Fleet"
    powertools, product = props["Layers"]
    assert powertools == "arn:aws:lambda:us-east-1:017000801446:layer:AWSLambdaPowertoolsPythonV3-python314-arm64:27"
    assert product["Ref"].startswith("RayitoProductLayer")  # the product: its recipe decoder and launch


def test_stale_ticks_are_dropped_and_failures_dead_lettered(synth) -> None:
    _, _, template, _ = synth
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60,
         "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [Match.string_like_regexp("DeadLetters"), "Arn"]}}}},
    )
    template.has_resource_properties(
        "AWS::Scheduler::Schedule",
        {"ScheduleExpression": "rate(1 minute)", "State": "ENABLED",
         "Target": Match.object_like({
             "RetryPolicy": {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60},
             "DeadLetterConfig": {"Arn": {"Fn::GetAtt": [Match.string_like_regexp("DeadLetters"), "Arn"]}},
             # The fleet's name: the teardown (#13) disables the schedule only while it ticks this fleet.
             "Input": json.dumps({"source": "schedule", "fleet": "mi-agente"}, separators=(",", ":")),
         })},
    )
    template.has_resource_properties("AWS::SQS::Queue", {"MessageRetentionPeriod": 1209600, "SqsManagedSseEnabled": True})


def test_reconciler_permissions(synth) -> None:
    _, _, template, _ = synth
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("FleetReconcilerRole")}]}})
    (policy,) = policies.values()
    by_sid = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(by_sid) >= {"Logs", "ListMicrovms", "Microvms", "PassNetworkConnectors", "PassExecutionRole", "Ledger",
                           "ControlPlaneBudget", "DeadLetters"}
    assert by_sid["Ledger"]["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}
    assert sorted(by_sid["ControlPlaneBudget"]["Action"]) == ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    assert by_sid["DeadLetters"]["Action"] == "sqs:SendMessage"
    actions = {a for s in by_sid.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # It reads the recipe (what the fleet is), never writes or deletes it; it reads its own fleet's
    # token (for the run payload's sha256) and no other secret; it never opens a VM's endpoint (no
    # auth token: its server does) and hands each VM to its server, nothing else.
    assert {a for a in actions if a.startswith("ssm:")} == {"ssm:GetParameter"}
    assert by_sid["AgentRecipe"]["Resource"] == "arn:aws:ssm:us-east-1:123456789012:parameter/rayito/agents/mi-agente/recipe"
    assert {a for a in actions if a.startswith("secretsmanager:")} == {"secretsmanager:GetSecretValue"}
    assert json.dumps(by_sid["AccessToken"]["Resource"]).endswith(':secret:rayito/agents/mi-agente/access-token-??????"')
    assert "lambda:CreateMicrovmAuthToken" not in actions
    assert by_sid["AskServer"]["Action"] == "lambda:InvokeFunction"
    assert by_sid["AskServer"]["Resource"]["Fn::GetAtt"][0].startswith("FleetReconcilerServerFunction")


def test_server_permissions(synth) -> None:
    """The server opens the fleet's VMs (an auth token on its image), reads the recipe and the
    sessions' secrets, and writes only its answers into the fleet's ledger partition."""
    _, _, template, _ = synth
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("FleetReconcilerServerRole")}]}})
    (policy,) = policies.values()
    by_sid = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert set(by_sid) == {"Logs", "ServeMicrovms", "AgentRecipe", "AccessToken", "GatewaySecrets", "Answers"}
    assert sorted(by_sid["ServeMicrovms"]["Action"]) == ["lambda:CreateMicrovmAuthToken", "lambda:GetMicrovm"]
    assert by_sid["Answers"]["Action"] == "dynamodb:PutItem"
    assert by_sid["Answers"]["Condition"] == {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}
    (function,) = [f for f in template.find_resources("AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == "reconciler.server.handler"]
    assert function["Properties"]["Timeout"] == 240
    assert set(function["Properties"]["Environment"]["Variables"]) == {
        "FLEET_NAME", "IMAGE_ARN", "ACCESS_TOKEN_SECRET", "LEDGER_TABLE", "IMAGE_VERSION"}


def test_tables(synth) -> None:
    _, _, template, _ = synth
    tables = template.find_resources("AWS::DynamoDB::Table")
    keys = sorted(json.dumps(t["Properties"]["KeySchema"]) for t in tables.values())
    assert keys == [
        json.dumps([{"AttributeName": "fleet", "KeyType": "HASH"}, {"AttributeName": "key", "KeyType": "RANGE"}]),
        json.dumps([{"AttributeName": "operation", "KeyType": "HASH"}]),
        json.dumps([{"AttributeName": "target", "KeyType": "HASH"}, {"AttributeName": "item", "KeyType": "RANGE"}]),
    ]
    for table in tables.values():
        assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
        assert table["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_alarms(synth) -> None:
    # Metrics off (the default): the dead-letter queue's alarm alone, on an SQS metric.
    _, _, template, _ = synth
    alarms = {k: a for k, a in template.find_resources("AWS::CloudWatch::Alarm").items() if k.startswith("FleetReconciler")}
    assert [a["Properties"]["Namespace"] for a in alarms.values()] == ["AWS/SQS"]
    # Metrics on: the alarms on the reconciler's own metrics too.
    app = new_app()
    stack = FleetStack(app, "Fleet", project=AgentProject.load(EXAMPLE), metrics=True, **stack_props())
    template = Template.from_stack(stack)
    alarms = {k: a for k, a in template.find_resources("AWS::CloudWatch::Alarm").items() if k.startswith("FleetReconciler")}
    names = sorted(a["Properties"].get("MetricName", "ApproximateNumberOfMessagesVisible") for a in alarms.values())
    assert names == ["ApproximateNumberOfMessagesVisible", "DeadLetteredSlots", "Deficit", "OldestStrayAge",
                     "RetryAmplification"]
    stray = [a for a in alarms.values() if a["Properties"].get("MetricName") == "OldestStrayAge"][0]["Properties"]
    assert stray["Threshold"] == 3600 and stray["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    amplification = [a for a in alarms.values() if a["Properties"].get("MetricName") == "RetryAmplification"][0]["Properties"]
    # "above 1.5", as the description and docs/operations.md say (CDK's default is >=).
    assert amplification["Threshold"] == 1.5 and amplification["ComparisonOperator"] == "GreaterThanThreshold"
    deficit = [a for a in alarms.values() if a["Properties"].get("MetricName") == "Deficit"][0]["Properties"]
    assert deficit["EvaluationPeriods"] == 10 and deficit["Namespace"] == "Rayito/Fleet"
    assert {"Name": "fleet", "Value": "mi-agente"} in deficit["Dimensions"]


@pytest.mark.parametrize(("kwargs", "line"), [
    ({"deficit_minutes": 1441}, "deficit_minutes: 1441 is above the limit of 1440 minutes: CloudWatch (PutMetricAlarm) "
                                "evaluates an alarm of 60 s periods over at most 86,400 s"),
    ({"deficit_minutes": 0}, "deficit_minutes: 0 is below the minimum of 1"),
    ({"deficit_minutes": True}, "deficit_minutes: True is not a whole number of minutes"),
    ({"deficit_minutes": 10.5}, "deficit_minutes: 10.5 is not a whole number of minutes"),
    ({"amplification_threshold": float("inf")}, "amplification_threshold: inf is not a finite number"),
    ({"amplification_threshold": 1}, "amplification_threshold: 1 is not above 1: every slot filled"),
    ({"amplification_threshold": "2"}, "amplification_threshold: '2' is not a number"),
    ({"stray_seconds": 0}, "stray_seconds: 0 is not above 0: the oldest stray's age is 0 with no stray"),
    ({"stray_seconds": float("nan")}, "stray_seconds: nan is not a finite number"),
])
def test_add_alarms_values_are_checked_before_any_alarm(kwargs, line) -> None:
    """What PutMetricAlarm refuses (over a day of one-minute periods), what crashes the synth (NaN
    in a JSON template) and what is always in alarm, each refused in one line naming it."""
    stack = new_stack(new_app(), "Alarms")
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                       reconciler_alarms=False)
    with pytest.raises(ValueError) as info:
        fleet.reconciler.add_alarms(custom_metrics=True, **kwargs)
    assert str(info.value).startswith(line) and len(str(info.value).splitlines()) == 1, str(info.value)
    assert not fleet.reconciler.alarms
    # The limits themselves are accepted: a day of one-minute periods, any threshold above them.
    alarms = fleet.reconciler.add_alarms(custom_metrics=True, deficit_minutes=1440, amplification_threshold=1.01,
                                         stray_seconds=0.5)
    template = Template.from_stack(stack)
    (deficit,) = [template.to_json()["Resources"][stack.resolve(stack.get_logical_id(a.node.default_child))]
                  for a in alarms if a.node.id == "DeficitAlarm"]
    assert deficit["Properties"]["EvaluationPeriods"] * deficit["Properties"]["Period"] == 86_400


def test_asset_holds_the_reconciler_and_its_model_only(synth) -> None:
    _, _, template, outdir = synth
    key = reconciler_function(template)["Code"]["S3Key"]
    folder = outdir / f"asset.{key.removesuffix('.zip')}"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert "reconciler/index.py" in files and "reconciler/core/phases.py" in files
    assert "reconciler/data/lambda-microvms/2025-09-09/service-2.json" in files
    assert not [f for f in files if f.startswith("recipe_writer") or "__pycache__" in f or f.endswith(".pyc")]


def test_shared_budget_across_fleets_and_stacks() -> None:
    app = new_app()
    stack = new_stack(app, "Two")
    AgentFleet(stack, "A", project=project_with(name="a"))
    AgentFleet(stack, "B", project=project_with(name="b"))
    other = new_stack(app, "Other")
    shared = ControlPlaneBudget.from_table_name(other, "Budget", "rayito-budget")
    AgentFleet(other, "C", project=project_with(name="c"), control_plane_budget=shared)
    template = Template.from_stack(stack)
    keys = [t["Properties"]["KeySchema"][0]["AttributeName"] for t in template.find_resources("AWS::DynamoDB::Table").values()]
    assert keys.count("fleet") == 1 and keys.count("operation") == 1  # one ledger, one budget for both fleets
    env = [f["Properties"]["Environment"]["Variables"] for f in Template.from_stack(other).find_resources("AWS::Lambda::Function").values()
           if f["Properties"].get("Handler") == "reconciler.index.handler"][0]
    assert env["BUDGET_TABLE"] == "rayito-budget"


def test_without_reconciler() -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), reconciler=False)
    assert fleet.reconciler is None
    schedules = Template.from_stack(stack).find_resources("AWS::Scheduler::Schedule").values()
    # The image's pruner (#13) has a schedule of its own; no reconciler tick.
    assert not [s for s in schedules if s["Properties"]["Description"].startswith("Rayito reconciler")]


def test_metrics_match_what_the_function_emits(synth) -> None:
    from lambdas.reconciler.telemetry import METRICS, NAMESPACE

    _, stack, _, _ = synth
    reconciler = stack.fleet.reconciler
    for method in ("metric_live_base_vms", "metric_parked_slots", "metric_deficit", "metric_wait_time",
                   "metric_claim_to_complete", "metric_retry_amplification", "metric_dead_lettered_slots",
                   "metric_deferrals", "metric_throttles"):
        metric = getattr(reconciler, method)()
        assert metric.namespace == NAMESPACE and metric.metric_name in METRICS
        assert metric.dimensions["fleet"] == "mi-agente"


def test_clean(synth) -> None:
    app, _, template, _ = synth
    assert lint_template(template) == []
    assert nag(app) == []


def test_validation() -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError, match="max_lifetime_seconds: 30000 is not within 1 to 28800"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), max_lifetime_seconds=30000)


@pytest.mark.parametrize("lead", [-1, 28_801])
def test_a_successor_lead_out_of_range_is_refused(lead) -> None:
    from rayito_constructs.reconciler import FleetReconciler

    stack = new_stack(new_app())
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), reconciler=False)
    with pytest.raises(ValueError, match=f"successor_lead_seconds: {lead} is not within 0 to 28800"):
        FleetReconciler(stack, "Reconciler", project=AgentProject.load(EXAMPLE), access=fleet.access,
                        successor_lead_seconds=lead)


def test_short_lifetimes_are_told_at_synth() -> None:
    """Two things a short ``max_lifetime_seconds`` is told at synth:

    - ``successor_lead_capped`` (an info: `cdk synth --strict` fails on warnings): the reconciler
      starts successors at most half a lifetime before a VM's end, but at least a look and a start
      (core.successor_lead), so the default 900 s lead with VMs under 1,800 s is capped;
    - ``short_lifetime`` (a warning, ``short_lifetime_problems``): a lifetime under a look and a
      start (70 s), and slots whose first lifetimes cannot be spread 20 s apart with less headroom
      than slots (the example's two slots, min 1 and warm 1, with none).

    8-hour VMs say nothing."""
    infos, warnings = {}, {}
    for lifetime in (1, 119, 120, 240, 1_200, 1_800, 28_800):
        stack = new_stack(new_app())
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), max_lifetime_seconds=lifetime)
        annotations = Annotations.from_stack(stack)
        infos[lifetime] = [m.entry.data for m in annotations.find_info("*", Match.string_like_regexp("^successor_lead_capped: "))]
        warnings[lifetime] = [m.entry.data for m in annotations.find_warning("*", Match.string_like_regexp("^short_lifetime: "))]
    assert [lifetime for lifetime, told in infos.items() if told] == [1, 119, 120, 240, 1_200]
    assert "successors start 600 s before a VM's end" in infos[1_200][0]
    assert "successors start 70 s before a VM's end" in infos[120][0]  # a look and a start, over half
    assert [lifetime for lifetime, told in warnings.items() if told] == [1, 119, 120]
    assert len(warnings[120]) == 1 and "the first lifetimes of 2 slots cannot be spread 20 s apart" in warnings[120][0]
    assert len(warnings[1]) == 2 and "less than a schedule period and 10 s (70 s)" in warnings[1][0]


@pytest.mark.parametrize(("scaling", "lifetime", "period", "warned"), [
    # Measured through the handler (tests/reconciler/test_short_lifetimes.py, test_room_for_successors.py):
    ((1, 2, 0), 120, 60, False),     # held (a 70 s lead, 30 s starts); a 60 s lead: 90 s below in 13 min
    ((1, 2, 0), 90, 60, False),      # held
    ((1, 2, 0), 60, 60, True),       # a VM shorter than a look and a start
    ((2, 3, 0), 300, 60, False),     # held; without the rules of test_short_lifetimes.py: 5 s below in 8 min
    ((3, 4, 0), 180, 60, False),     # held: 20 s a slot
    ((10, 11, 0), 600, 60, False),   # held: 27 s a slot
    ((10, 11, 0), 1_200, 60, False),  # held; unspread: 4.3 s below at each generation's end
    ((10, 11, 0), 400, 60, True),    # 18 s a slot: not spread, 16 s below in 27 min
    ((20, 21, 0), 600, 60, True),    # 13.5 s a slot: 13 s below
    ((1, 2, 0), 320, 300, True),     # every 5 minutes: 42 s below in 55 min
    ((3, 4, 0), 700, 300, True),     # every 5 minutes: 736 s below in 55 min
    ((1, 2, 0), 600, 300, True),     # held in the test's phase, but under two looks and starts
    ((2, 3, 0), 900, 300, True),     # held in the test's phase, but 215 s a slot with 243 s unwatched
    ((3, 4, 0), 1_800, 60, False),
    ((10, 11, 0), 3_600, 60, False),
    ((2, 4, 0), 300, 60, False),     # as much headroom as slots: successors never wait
])
def test_short_lifetime_problems_name_the_shapes_that_dip(scaling, lifetime, period, warned) -> None:
    """What ``short_lifetime`` warns about: the shapes the handler was measured to dip on (and
    those whose hold depends on when the ticks fall), and not the shapes that held."""
    from rayito_constructs.reconciler import short_lifetime_problems

    min_vms, max_vms, warm_vms = scaling
    project = project_with(name="corta", min_vms=min_vms, max_vms=max_vms, warm_vms=warm_vms)
    assert bool(short_lifetime_problems(project, lifetime, 900, period)) is warned


def test_a_longer_tick_watches_more_of_a_long_schedule() -> None:
    """Ticks as long as the schedule allows watch the whole period: 700 s VMs of min 3 / max 4
    looked at every 5 minutes are then told only what a minute's schedule would be told."""
    from rayito_constructs.reconciler import short_lifetime_problems

    project = project_with(name="corta", min_vms=3, max_vms=4, warm_vms=0)
    assert short_lifetime_problems(project, 700, 900, 300, tick_seconds=50)
    assert not short_lifetime_problems(project, 700, 900, 300, tick_seconds=285)


def test_one_tick_at_a_time_by_reserved_concurrency(synth) -> None:
    _, _, template, _ = synth
    assert reconciler_function(template)["ReservedConcurrentExecutions"] == 1
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), reconciler_reserved_concurrency=None)
    assert "ReservedConcurrentExecutions" not in reconciler_function(Template.from_stack(stack))
    with pytest.raises(ValueError, match="reserved_concurrency: 0 is not at least 1"):
        AgentFleet(new_stack(new_app()), "Fleet", project=AgentProject.load(EXAMPLE), reconciler_reserved_concurrency=0)


IMAGE = "arn:aws:lambda:us-east-1:123456789012:microvm-image:compartida"


def test_a_second_fleet_on_an_image_is_refused_unless_shared() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Uno", project=project_with(name="uno"), image_arn=IMAGE)
    with pytest.raises(ValueError, match="fleet 'dos' would run the image fleet 'uno' already runs"):
        AgentFleet(stack, "Dos", project=project_with(name="dos"), image_arn=IMAGE)
    other = new_stack(app, "Otra")
    with pytest.raises(ValueError, match="share_image=True"):
        AgentFleet(other, "Tres", project=project_with(name="tres"), image_arn=IMAGE, share_image=True)
    # Another app is another world.
    AgentFleet(new_stack(new_app()), "Dos", project=project_with(name="dos"), image_arn=IMAGE)


def test_shared_fleets_read_each_other_ledgers_only() -> None:
    app = new_app()
    stack = new_stack(app)
    for name in ("uno", "dos", "tres"):
        AgentFleet(stack, name.title(), project=project_with(name=name), image_arn=IMAGE, share_image=True)
    template = Template.from_stack(stack)
    functions = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": "reconciler.index.handler"}})
    shared = sorted(f["Properties"]["Environment"]["Variables"]["SHARED_WITH"] for f in functions.values())
    assert shared == ['["dos","tres"]', '["tres","uno"]', '["dos","uno"]'] or sorted(shared) == sorted(
        ['["dos","tres"]', '["tres","uno"]', '["dos","uno"]'])
    policies = template.find_resources("AWS::IAM::Policy")
    siblings = [st for p in policies.values() for st in p["Properties"]["PolicyDocument"]["Statement"]
                if st.get("Sid") == "SiblingLedgers"]
    assert len(siblings) == 3 and all(st["Action"] == "dynamodb:Query" for st in siblings)
    keys = sorted(tuple(st["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"]) for st in siblings)
    assert keys == [("dos", "tres"), ("dos", "uno"), ("tres", "uno")]
    unshared_app = new_app()
    unshared_stack = new_stack(unshared_app)
    AgentFleet(unshared_stack, "Solo", project=AgentProject.load(EXAMPLE), image_arn=IMAGE)
    env = reconciler_function(Template.from_stack(unshared_stack))["Environment"]["Variables"]
    assert "SHARED_WITH" not in env and "TERMINATE_STRAYS" not in env


def test_stray_termination_is_opt_in() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), terminate_strays=True)
    env = reconciler_function(Template.from_stack(stack))["Environment"]["Variables"]
    assert env["TERMINATE_STRAYS"] == "1" and env["STRAY_GRACE_SECONDS"] == "3600"
