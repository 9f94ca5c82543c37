"""The pure parts of ``verify``: classification of errors, the report, log parsing, the ledger
comparison, quotas arithmetic, policy reading, template resolution, and the test fakes' own IAM
evaluation (a fake that answers wrongly would make the IAM tests meaningless)."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from rayito_constructs.verify import basics, iam, image, quotas, recipe, reconciler
from rayito_constructs.verify.aws import classify
from rayito_constructs.model.names import stack_name_for
from rayito_constructs.verify.deployed import DeployedStack, StackResource, candidates, fleets_of
from rayito_constructs.verify.policy import granting_statement
from rayito_constructs.verify.report import Finding, Report, Status, fail, ok, render_json, render_table, warn
from rayito_constructs.verify.template import Unresolved, resolve

from .verify_fakes import evaluate


def _client_error(code: str, status: int, message: str = "m") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize("exc,kind", [
    (_client_error("AccessDenied", 403), "denied"),
    (_client_error("AccessDeniedException", 400), "denied"),
    (_client_error("ExpiredToken", 400), "denied"),
    (_client_error("Throttling", 400), "throttled"),
    (_client_error("ThrottlingException", 429), "throttled"),
    (_client_error("TooManyRequestsException", 429), "throttled"),
    (_client_error("ParameterNotFound", 400), "not_found"),
    (_client_error("ValidationError", 400, "Stack with id x does not exist"), "not_found"),
    (_client_error("ValidationException", 400), "error"),
    (_client_error("", 403), "denied"),
    (NoCredentialsError(), "no_credentials"),
    (EndpointConnectionError(endpoint_url="https://x"), "unreachable"),
])
def test_errors_are_classified(exc: Exception, kind: str) -> None:
    error = classify("lambda-microvms", "GetMicrovmImage", exc)
    assert error.kind == kind
    assert error.action == "lambda:GetMicrovmImage"  # the IAM prefix, not lambda-microvms


def test_service_quotas_action_name() -> None:
    assert classify("service-quotas", "ListServiceQuotas", _client_error("X", 400)).action == "servicequotas:ListServiceQuotas"


def test_report_table_and_summary() -> None:
    report = Report("mi-agente", region="us-east-1", account="123", stack="S", fleet="mi-agente")
    report.add(ok("a", "fine"), warn("b", "hmm\nsecond line", "do x"), fail("c", "bad", "do y"))
    out = io.StringIO()
    render_table(report, out)
    text = out.getvalue()
    assert "\033[" not in text  # no colour unless asked (a pipe, a file)
    assert text.rstrip().splitlines()[-1] == "verify: 1 OK, 1 WARN, 1 FAIL"
    assert "hmm second line" in text and "fix: do x" in text and "fix: do y" in text
    assert report.exit_code == 1
    coloured = io.StringIO()
    render_table(report, coloured, color=True)
    assert "\033[31mFAIL" in coloured.getvalue()
    data = io.StringIO()
    render_json(report, data)
    doc = json.loads(data.getvalue())
    assert doc["summary"] == {"OK": 1, "WARN": 1, "FAIL": 1} and doc["exit_code"] == 1
    assert [c["status"] for c in doc["checks"]] == ["OK", "WARN", "FAIL"]


def test_warnings_alone_exit_zero() -> None:
    report = Report("x")
    report.add(warn("b", "hmm", "x"))
    assert report.exit_code == 0


def test_ticks_from_json_and_text_report_lines() -> None:
    events = [
        {"timestamp": 2000, "message": json.dumps({"time": "t", "type": "platform.report", "record": {
            "requestId": "r2", "status": "timeout", "metrics": {"durationMs": 65000.0}, "errorType": "Sandbox.Timedout"}})},
        {"timestamp": 1000, "message": "REPORT RequestId: r1\tDuration: 12.50 ms\tBilled Duration: 13 ms\t"},
        {"timestamp": 3000, "message": "REPORT RequestId: r3\tDuration: 60000.00 ms\tStatus: timeout"},
        {"timestamp": 4000, "message": json.dumps({"level": "INFO", "message": "run_requested"})},
        {"timestamp": 5000, "message": "{not json"},
    ]
    ticks = reconciler.parse_ticks(events)
    assert [(t.request_id, t.status) for t in ticks] == [("r1", "success"), ("r2", "timeout"), ("r3", "timeout")]
    assert ticks[0].duration_ms == 12.5 and ticks[1].error == "Sandbox.Timedout"


def test_ledger_against_the_list() -> None:
    slots = [
        {"role": "base", "phase": "running", "microvm_id": "a"},
        {"role": "base", "phase": "running", "microvm_id": "b", "retiring_id": "c"},
        {"role": "warm", "phase": "parked", "microvm_id": "d"},
        {"role": "member", "phase": "running", "microvm_id": "e"},
        {"role": "base", "phase": "dead", "microvm_id": None},
        {"role": "warm", "phase": "starting", "microvm_id": "gone"},
    ]
    vms = [{"microvmId": i, "state": s} for i, s in
           [("a", "RUNNING"), ("b", "PENDING"), ("c", "RUNNING"), ("d", "SUSPENDED"), ("e", "RUNNING"),
            ("x", "RUNNING"), ("y", "TERMINATED"), ("gone", "TERMINATED")]]
    view = reconciler.compare(slots, vms, min_vms=3, warm_vms=2, max_vms=6, idle=False)
    assert view["base_live"] == 2 and view["parked"] == 1 and view["members"] == 1
    assert view["strays"] == ["x"] and view["live"] == 6 and view["dead_slots"] == 1
    assert view["ledger_vms_not_listed"] == ["gone"]
    # With idle, a base VM the service suspended is still a live base VM.
    idle = reconciler.compare([{"role": "base", "microvm_id": "a"}], [{"microvmId": "a", "state": "SUSPENDED"}],
                              min_vms=1, warm_vms=0, max_vms=1, idle=True)
    assert idle["base_live"] == 1


def test_memory_quota_units() -> None:
    def q(value: float, unit: str) -> quotas.Quota:
        return quotas.Quota("L-CD1C0CC4", "Max allocated memory", value, unit, "applied")
    assert quotas.memory_mib(q(1024, "None")) == 1024 * 1024
    assert quotas.memory_mib(q(400, "Gigabytes")) == 400 * 1024
    assert quotas.memory_mib(q(8192, "Megabytes")) == 8192


def test_reconciler_budgets_follow_its_overrides() -> None:
    defaults = quotas.reconciler_budgets({"BUDGETS": "{}"})
    assert defaults["RunMicrovm"] == pytest.approx((4.75, 4.0)) and defaults["SuspendMicrovm"] == pytest.approx((1.9, 1.0))
    tuned = quotas.reconciler_budgets({"BUDGETS": json.dumps({"RunMicrovm": [0.9, 1]})})
    assert tuned["RunMicrovm"] == (0.9, 1.0) and tuned["TerminateMicrovm"] == pytest.approx((9.5, 9.0))
    assert quotas.reconciler_budgets({"BUDGETS": "not json"})["RunMicrovm"] == pytest.approx((4.75, 4.0))


def test_quotas_by_name_when_codes_differ() -> None:
    found = {"L-1": quotas.Quota("L-1", "Rate of RunMicrovm requests", 3, "None", "applied"),
             "L-2": quotas.Quota("L-2", "Burst of RunMicrovm requests", 4, "None", "applied"),
             "L-3": quotas.Quota("L-3", "Max allocated memory across all MicroVMs", 100, "None", "applied")}
    assert quotas.quota(found, "L-535CA9B6").value == 3
    assert quotas.quota(found, "L-91B95582").value == 4
    assert quotas.quota(found, "L-CD1C0CC4").value == 100
    assert quotas.quota(found, "L-90045317") is None


def test_granting_statement() -> None:
    doc = {"Statement": [
        {"Sid": "Pass", "Effect": "Allow", "Action": "lambda:PassNetworkConnector",
         "Resource": "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:*"},
        {"Effect": "Allow", "NotAction": "iam:*", "NotResource": "arn:aws:s3:::secret/*"},
    ]}
    connector = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:HTTP_INGRESS"
    assert granting_statement([doc], "LAMBDA:passnetworkconnector", connector) == "Pass"
    assert granting_statement([doc], "s3:GetObject", "arn:aws:s3:::other/x") == "#1"
    assert granting_statement([doc], "s3:GetObject", "arn:aws:s3:::secret/x") is None
    assert granting_statement([doc], "iam:PassRole", "*") is None
    denied = {"Statement": [{"Effect": "Deny", "Action": "*", "Resource": "*"}]}
    assert granting_statement([doc, denied], "lambda:PassNetworkConnector", connector) is None


def test_template_values_resolve_or_say_they_cannot() -> None:
    def attribute(lid: str, attr: str) -> Any:
        return "1.0" if (lid, attr) == ("Image", "LatestActiveImageVersion") else None

    context = {"pseudo": {"AWS::Region": "eu-west-1", "AWS::AccountId": "1"}, "physical": {"Table": "t-1"},
               "attribute": attribute}
    assert resolve({"Fn::Join": ["", ["a-", {"Ref": "AWS::Region"}, "-", {"Ref": "Table"}]]}, **context) == "a-eu-west-1-t-1"
    assert resolve({"Fn::Sub": "${AWS::AccountId}:${Table}:${Image.LatestActiveImageVersion}:${!Literal}"},
                   **context) == "1:t-1:1.0:${Literal}"
    assert resolve({"Fn::Sub": ["${X}", {"X": {"Ref": "Table"}}]}, **context) == "t-1"
    assert resolve({"Fn::GetAtt": "Image.LatestActiveImageVersion"}, **context) == "1.0"
    for value in ({"Ref": "Nope"}, {"Fn::GetAtt": ["Table", "Arn"]}, {"Fn::If": ["C", 1, 2]}):
        with pytest.raises(Unresolved):
            resolve(value, **context)


def test_base_versions_match_by_major() -> None:
    assert image._same_version("1", "1.0") and image._same_version("1.0", "1") and image._same_version("0", "0")
    assert not image._same_version("1", "10") and not image._same_version("1", "0") and not image._same_version(None, "1")


def _answer(action: str, resource: str, must_allow: bool, decision: str, false_deny: Any = None) -> iam.Answer:
    return iam.Answer(iam.Probe(action, resource, must_allow, "why"), decision, (), false_deny)


def test_judging_simulator_answers() -> None:
    connector = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:HTTP_INGRESS"
    good = [_answer("lambda:RunMicrovm", "arn:aws:lambda:r:1:microvm-image:a", True, "allowed"),
            _answer("ssm:PutParameter", "arn:aws:ssm:r:1:parameter/rayito/agents/a/recipe", False, "implicitDeny")]
    assert iam.judge("iam.x", "X", good, "fix").status is Status.OK
    false_deny = good + [_answer("lambda:PassNetworkConnector", connector, True, "implicitDeny", "PassNetworkConnectors")]
    finding = iam.judge("iam.x", "X", false_deny, "fix")
    assert finding.status is Status.WARN and "known false deny" in finding.summary
    real = false_deny + [_answer("lambda:PassNetworkConnector", connector, True, "implicitDeny")]
    assert iam.judge("iam.x", "X", real, "fix").status is Status.FAIL
    allowed = good + [_answer("ssm:PutParameter", "arn:aws:ssm:r:1:parameter/rayito/agents/b/recipe", False, "allowed")]
    finding = iam.judge("iam.x", "X", allowed, "fix")
    assert finding.status is Status.FAIL and "PutParameter on parameter/rayito/agents/b/recipe ALLOWED" in finding.summary


def test_the_fake_simulator_evaluates_like_iam() -> None:
    """The test fake's own rules: explicit deny wins, conditions need their context, ForAllValues
    with no value holds, wildcards in actions ignore case."""
    doc = {"Statement": [
        {"Sid": "Pass", "Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::1:role/x",
         "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}},
        {"Sid": "Ledger", "Effect": "Allow", "Action": "dynamodb:PutItem", "Resource": "*",
         "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["a"]}}},
        {"Sid": "All", "Effect": "Allow", "Action": "lambda:*Microvm", "Resource": "*"},
        {"Sid": "No", "Effect": "Deny", "Action": "lambda:TerminateMicrovm", "Resource": "*"},
    ]}
    docs = [("p", doc)]
    assert evaluate(docs, "iam:PassRole", "arn:aws:iam::1:role/x", {"iam:passedtoservice": ["lambda.amazonaws.com"]})[0] == "allowed"
    assert evaluate(docs, "iam:PassRole", "arn:aws:iam::1:role/x", {})[0] == "implicitDeny"
    assert evaluate(docs, "iam:PassRole", "arn:aws:iam::1:role/x", {"iam:passedtoservice": ["ec2.amazonaws.com"]})[0] == "implicitDeny"
    assert evaluate(docs, "dynamodb:PutItem", "t", {"dynamodb:leadingkeys": ["a"]})[0] == "allowed"
    assert evaluate(docs, "dynamodb:PutItem", "t", {"dynamodb:leadingkeys": ["b"]})[0] == "implicitDeny"
    assert evaluate(docs, "dynamodb:PutItem", "t", {})[0] == "allowed"
    assert evaluate(docs, "Lambda:RunMicroVM", "x", {})[0] == "allowed"
    assert evaluate(docs, "lambda:TerminateMicrovm", "x", {})[0] == "explicitDeny"


def test_fleets_of_a_stack() -> None:
    def r(lid: str, type_: str) -> StackResource:
        return StackResource(lid, type_, "p", "CREATE_COMPLETE")

    stack = DeployedStack("S", "arn:aws:cloudformation:us-east-1:1:stack/S/x", "us-east-1", "CREATE_COMPLETE", None,
                          {}, None, None, [
                              r("FleetSandboxLauncherPolicy599AC4D5", "AWS::IAM::ManagedPolicy"),
                              r("FleetReconcilerFunction9F3B903B", "AWS::Lambda::Function"),
                              r("FleetRecipe33B2E66F", "Custom::RayitoRecipe"),
                              r("RayitoRecipeWriterFunction07CC5D31", "AWS::Lambda::Function"),
                              r("OtherCallerPolicyA2730E72", "AWS::IAM::ManagedPolicy"),
                          ])
    assert fleets_of(stack) == ["Fleet", "Other"]
    assert stack.account == "1"
    assert candidates("mi-agente") == ["mi-agente", "RayitoFleet-mi-agente"]
    # app.py's derived stack name (without it only the FleetName search remains, with no
    # other-region hint)
    assert candidates("my_agent") == [stack_name_for("my_agent")]
    assert stack_name_for("my_agent").startswith("RayitoFleet-my-agent-")
    assert candidates("RayitoFleet-x") == ["RayitoFleet-x"]
    arn = "arn:aws:cloudformation:eu-west-1:123456789012:stack/RayitoFleet-x/0a1b2c3d-0000-4000-8000-000000000000"
    assert candidates(arn) == [arn]


@pytest.mark.parametrize("status,expected", [
    ("CREATE_COMPLETE", Status.OK), ("UPDATE_COMPLETE", Status.OK), ("UPDATE_IN_PROGRESS", Status.WARN),
    ("UPDATE_ROLLBACK_COMPLETE", Status.WARN), ("ROLLBACK_COMPLETE", Status.FAIL), ("CREATE_FAILED", Status.FAIL),
    ("DELETE_IN_PROGRESS", Status.FAIL),
])
def test_stack_status(status: str, expected: Status) -> None:
    stack = DeployedStack("S", "id", "us-east-1", status, None, {}, datetime.now(timezone.utc), None, [])
    assert basics.stack_status(stack).status is expected


def test_a_failed_resource_fails_the_stack() -> None:
    stack = DeployedStack("S", "id", "us-east-1", "UPDATE_COMPLETE", None, {}, None, None,
                          [StackResource("X", "AWS::SQS::Queue", None, "CREATE_FAILED", "quota")])
    finding = basics.stack_status(stack)
    assert finding.status is Status.FAIL and "X" in finding.summary


def test_recipe_keys_and_differences() -> None:
    assert recipe._same_key(None, "alias/aws/ssm") and recipe._same_key("alias/aws/ssm", "alias/aws/ssm")
    arn = "arn:aws:kms:us-east-1:1:key/1234"
    assert recipe._same_key("1234", arn) and recipe._same_key(arn, arn)
    assert not recipe._same_key(arn, "alias/aws/ssm") and not recipe._same_key("alias/aws/ssm", arn)
    assert recipe._differences({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 9}, "e": 0}) == ["b.c", "b.d", "e"]


def test_finding_to_dict_round_trips() -> None:
    f = Finding("x", Status.WARN, "s", "f", {"k": 1})
    assert f.to_dict() == {"check": "x", "status": "WARN", "summary": "s", "fix": "f", "data": {"k": 1}}


def test_no_network_is_a_finding_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import boto3

    from rayito_constructs.verify import Options, verify

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1")
    report = verify(Options("mi-agente"), session=session, attempts=1)
    assert [f.check for f in report.findings] == ["account"]
    assert report.findings[0].status is Status.FAIL and "unreachable" in report.findings[0].summary
    assert report.exit_code == 1


def test_a_profile_that_does_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayito_constructs.verify import BadInput, Options, verify

    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(BadInput) as caught:
        verify(Options("mi-agente", region="us-east-1"))
    assert "no-such-profile" in str(caught.value)


def test_a_config_file_that_does_not_parse(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from rayito_constructs.verify import BadInput, Options, verify

    config = tmp_path / "config"
    config.write_text("[default\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    with pytest.raises(BadInput) as caught:
        verify(Options("mi-agente", region="us-east-1"), attempts=1)
    assert "Unable to parse config file" in str(caught.value) and "\n" not in str(caught.value)


def test_a_fleet_whose_construct_id_extends_anothers_is_its_own() -> None:
    """``Agent`` and ``AgentCanary`` in one stack are two fleets (each has its own
    launcher policy), and neither takes the other's resources or alarms; a reconciler's own
    markers (``AgentReconciler...``) stay the fleet's, and without a launcher policy (a stack
    still deploying) a prefix that extends another is still the same fleet."""
    from rayito_constructs.verify.deployed import DeployedFleet

    def r(lid: str, type_: str) -> StackResource:
        return StackResource(lid, type_, lid.lower(), "CREATE_COMPLETE")

    stack = DeployedStack("S", "arn:aws:cloudformation:us-east-1:1:stack/S/x", "us-east-1", "CREATE_COMPLETE", None,
                          {}, None, None, [
                              r("AgentSandboxLauncherPolicy599AC4D5", "AWS::IAM::ManagedPolicy"),
                              r("AgentReconcilerFunction9F3B903B", "AWS::Lambda::Function"),
                              r("AgentCanarySandboxLauncherPolicyA2730E72", "AWS::IAM::ManagedPolicy"),
                              r("AgentCanaryRecipe33B2E66F", "Custom::RayitoRecipe"),
                              r("AgentCanaryReconcilerFunction07CC5D31", "AWS::Lambda::Function"),
                              r("AgentCanaryReconcilerDeficitAlarm0A1B2C3D", "AWS::CloudWatch::Alarm"),
                              r("AgentReconcilerDeficitAlarm1A1B2C3D", "AWS::CloudWatch::Alarm"),
                          ])
    assert fleets_of(stack) == ["Agent", "AgentCanary"]
    agent, canary = DeployedFleet(stack, "Agent"), DeployedFleet(stack, "AgentCanary")
    assert agent.recipe_resource is None and canary.recipe_resource is not None
    assert agent.reconciler_function == "agentreconcilerfunction9f3b903b"
    assert canary.reconciler_function == "agentcanaryreconcilerfunction07cc5d31"
    assert [a.logical_id for a in agent.alarms] == ["AgentReconcilerDeficitAlarm1A1B2C3D"]
    assert [a.logical_id for a in canary.alarms] == ["AgentCanaryReconcilerDeficitAlarm0A1B2C3D"]
    deploying = DeployedStack("S", "", "us-east-1", "CREATE_IN_PROGRESS", None, {}, None, None, [
        r("AgentRecipe33B2E66F", "Custom::RayitoRecipe"), r("AgentReconcilerFunction07CC5D31", "AWS::Lambda::Function")])
    assert fleets_of(deploying) == ["Agent"]


def test_the_vms_of_sibling_fleets_are_neither_strays_nor_counted_toward_max_vms() -> None:
    """On a shared image, what the siblings' ledgers hold is theirs (as the reconciler
    counts); a client's VM (no ledger holds it) still counts and is a stray."""
    slots = [{"role": "base", "phase": "running", "microvm_id": "a"}, {"role": "base", "phase": "running", "microvm_id": "b"}]
    siblings = [{"role": "base", "phase": "running", "microvm_id": "c"},
                {"role": "base", "phase": "running", "microvm_id": "d", "retiring_id": "e"}]
    vms = [{"microvmId": i, "state": "RUNNING"} for i in "abcdex"]
    view = reconciler.compare(slots, vms, min_vms=2, warm_vms=0, max_vms=3, idle=False, siblings=siblings)
    assert view["live"] == 3 and view["strays"] == ["x"] and view["sibling_vms"] == 3
    alone = reconciler.compare(slots, vms, min_vms=2, warm_vms=0, max_vms=3, idle=False)
    assert alone["live"] == 6 and alone["strays"] == ["c", "d", "e", "x"] and alone["sibling_vms"] == 0


class _PolicyClients:
    """IAM reads for Context: a launcher policy document, or AccessDenied."""

    region = "us-east-1"

    def __init__(self, document: Any) -> None:
        self.document = document

    def call(self, service: str, operation: str, **kwargs: Any) -> Any:
        from rayito_constructs.verify.aws import AwsError

        if self.document is None:
            raise AwsError(service, operation, "denied", "AccessDenied", "denied")
        if operation == "get_policy":
            return {"Policy": {"DefaultVersionId": "v1", "Arn": kwargs["PolicyArn"]}}
        return {"PolicyVersion": {"Document": json.dumps(self.document)}}


@pytest.mark.parametrize(("resources", "found"), [
    (["arn:aws:lambda:us-east-1:123456789012:microvm-image:agent-images-v2"], "agent-images-v2"),
    ("arn:aws:lambda:us-east-1:123456789012:microvm-image:agent-images-v2:*", "agent-images-v2"),
    (["arn:aws:lambda:us-east-1:123456789012:microvm-image:agent*",
      "arn:aws:lambda:us-east-1:123456789012:microvm-image:agent_2:3"], "agent_2"),
    (["*"], "my-fleet"),  # nothing names an image: the image named after the fleet, as before
    (None, "my-fleet"),  # the policy cannot be read
])
def test_the_image_is_read_from_the_launcher_policy_before_it_is_guessed(resources, found) -> None:
    """A fleet on an image published elsewhere (``image_arn=``, no reconciler) has no
    image resource, output or environment naming it; its launcher policy does."""
    from rayito_constructs.verify.context import Context
    from rayito_constructs.verify.deployed import DeployedFleet

    stack = DeployedStack("S", "arn:aws:cloudformation:us-east-1:123456789012:stack/S/x", "us-east-1",
                          "CREATE_COMPLETE", None, {}, None, None, [StackResource(
                              "FleetSandboxLauncherPolicy599AC4D5", "AWS::IAM::ManagedPolicy",
                              "arn:aws:iam::123456789012:policy/launcher", "CREATE_COMPLETE")])
    document = None if resources is None else {"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Action": "lambda:RunMicrovm", "Resource": "arn:aws:lambda:us-east-1:123456789012:microvm-image:no"},
        {"Effect": "Allow", "Action": ["lambda:GetMicrovm"], "Resource": "arn:aws:lambda:us-east-1:123456789012:microvm-image:no"},
        "not a statement",
        {"Effect": "Allow", "Action": ["lambda:RunMicrovm", "lambda:PassNetworkConnector"], "Resource": resources}]}
    ctx = Context(_PolicyClients(document), DeployedFleet(stack, "Fleet", "my-fleet"))  # type: ignore[arg-type]
    ctx.account = "123456789012"
    assert ctx.image_arn() == f"arn:aws:lambda:us-east-1:123456789012:microvm-image:{found}"


def test_the_probes_follow_the_bucket_and_base_image_the_fleet_was_deployed_with() -> None:
    """A fleet with its own artifact bucket (``artifact_bucket=``) or base image (``[image] base``):
    the publisher's upload and base-image probes name them, as its deployed statements do, not
    ``rayito setup``'s defaults (which would FAIL a right policy)."""
    from rayito_constructs.verify.iam import Refs, publisher_probes, with_deployed_places

    image = "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente"
    r = Refs("mi-agente", image, (), "recipe", "other", ("c1", "c2"),
             artifact_bucket="arn:aws:s3:::rayito-artifacts-123456789012-us-east-1",
             base_image="arn:aws:lambda:us-east-1:123456789012:microvm-image:rayito-base-caps")
    document = {"Statement": [
        {"Sid": "UploadArtifacts", "Effect": "Allow", "Action": ["s3:PutObject"],
         "Resource": ["arn:aws:s3:::my-own-artifacts/rayito/images/*", "arn:aws:s3:::my-own-artifacts/rayito/templates/*"]},
        {"Sid": "BaseImage", "Effect": "Allow", "Action": ["lambda:ListMicrovmImageVersions"],
         "Resource": ["arn:aws:lambda:us-east-1:123456789012:microvm-image:my-base",
                      "arn:aws:lambda:us-east-1:123456789012:microvm-image:my-base:*"]},
    ]}
    placed = with_deployed_places(r, document)
    assert placed.artifact_bucket == "arn:aws:s3:::my-own-artifacts"
    assert placed.base_image.endswith(":microvm-image:my-base")
    resources = {p.resource for p in publisher_probes(placed)}
    assert "arn:aws:s3:::my-own-artifacts/rayito/images/rayd-probe.zip" in resources
    assert not any("rayito-artifacts-" in x or "rayito-base-caps" in x for x in resources)
    assert with_deployed_places(r, None) == r  # no document: the defaults


def test_the_session_secrets_come_from_the_recipes_project_keys_and_bundles_too(tmp_path) -> None:
    """verify reads the secrets a session reads from the project the recipe holds, as the product
    does: a ``[secret_env]`` entry with a JSON key (an object, not a string) and a
    ``[[secret_env_from]]`` bundle are probed like a plain name (it crashed the iam check)."""
    from types import SimpleNamespace

    from rayito_constructs import AgentProject
    from rayito_constructs.model.product import encode, recipe
    from rayito_constructs.verify.context import RecipeRead
    from rayito_constructs.verify.iam import Refs, _session_secrets, launcher_probes

    from .projects import write_project

    folder = write_project(tmp_path / "secretos", name="secretos", toml="""
        [secret_env]
        DB = {secret = "app/json", key = "password"}

        [[secret_env_from]]
        secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:app/bundle-AbCdEf"
    """)
    project = AgentProject.load(folder)
    _, value = encode(recipe(project.product, project.product_scaling, renew_gateway_keys=False, image_version="1"))
    ctx = SimpleNamespace(recipe=lambda: RecipeRead("/rayito/agents/secretos/recipe", value, "SecureString", {}, None))
    secrets = _session_secrets(ctx)  # type: ignore[arg-type]
    assert secrets.secret_env == ("app/json", "arn:aws:secretsmanager:us-east-1:123456789012:secret:app/bundle-AbCdEf")
    r = Refs("secretos", "arn:aws:lambda:us-east-1:123456789012:microvm-image:secretos", (), "recipe", "other", ("c",),
             secret_env=("arn:aws:secretsmanager:us-east-1:123456789012:secret:app/json-AbCdEf", secrets.secret_env[1]))
    probed = {p.resource for p in launcher_probes(r) if p.path == "a session with gateways and secret_env"}
    assert probed == set(r.secret_env)
