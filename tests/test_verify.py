"""``verify`` against one deployed fleet, shared by the tests of this module: the example's stack
deployed into moto's CloudFormation, its image in the MicroVMs emulator, its reconciler ticking for
real (tests/verify_world.py). Faults are injected on the wire or made in the world and undone;
scenarios that need a world of their own are in test_verify_scenarios.py."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from rayito_constructs import AgentProject
from rayito_constructs.egress import BudgetClient
from rayito_constructs.egress.client import Envelope
from rayito_constructs.verify import Options, Status, TargetNotFound, verify
from rayito_constructs.verify.launch import http_probe

from . import verify_world as vw
from .verify_world import finding, statuses
from .conftest import EXAMPLE, ROOT
from .verify_fakes import ServiceQuotas, error_response, inject_error

FLEET = "mi-agente"
STACK = "RayitoFleet-mi-agente"


@pytest.fixture(scope="module")
def example() -> vw.Assembly:
    return vw.synth("example", vw.fleet_stack(AgentProject.load(EXAMPLE), metrics=True))


@pytest.fixture(scope="module")
def deployed(example: vw.Assembly) -> Iterator[vw.World]:
    """The example fleet, deployed and converged (base VM running, warm slot parked). Tests that
    change it put it back."""
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        world.deploy(example)
        world.converge(STACK)
        yield world


# ------------------------------------------------------------------ the whole fleet


def test_a_healthy_fleet(deployed: vw.World) -> None:
    deployed.tick(STACK)
    report = deployed.verify(FLEET)
    got = statuses(report)
    assert report.stack == STACK and report.fleet == FLEET and report.account == vw.ACCOUNT
    for check in ("account", "region", "stack", "quotas.memory", "quotas.rates", "image", "image.version",
                  "image.base", "recipe", "recipe.key", "recipe.launcher", "reconciler", "reconciler.ticks",
                  "reconciler.dead_letters", "reconciler.fleet", "reconciler.alarms", "egress", "egress.alarms"):
        assert got[check] == "OK", (check, finding(report, check).summary)
    fleet = finding(report, "reconciler.fleet")
    assert fleet.data["base_live"] == 1 and fleet.data["parked"] == 1 and fleet.data["strays"] == []
    # The library's policies as deployed pass the simulator; what is left is its known false deny.
    for check in ("iam.SandboxLauncherPolicy", "iam.CallerPolicy", "iam.ImagePublisherPolicy", "iam.reconciler"):
        assert got[check] == "WARN" and "known false deny" in finding(report, check).summary, check
    assert report.exit_code == 0 and report.counts()["FAIL"] == 0
    assert "equals what the stack wrote" in finding(report, "recipe").summary
    # The launcher never writes the recipe, and the simulator's PassNetworkConnector deny is its
    # known false one, wherever the policy does allow it.
    launcher = finding(report, "iam.SandboxLauncherPolicy").data["answers"]
    put = [a for a in launcher if a["action"] == "ssm:PutParameter"]
    assert put and all(a["decision"] != "allowed" for a in put)
    connectors = [a for a in launcher if a["action"] == "lambda:PassNetworkConnector"]
    assert connectors and all(a["known_false_deny_of"] == "PassNetworkConnectors" for a in connectors)
    assert report.summary_line() == (f"verify: {report.counts()['OK']} OK, {report.counts()['WARN']} WARN, "
                                     f"{report.counts()['FAIL']} FAIL")
    documented = (ROOT / "docs" / "verify.md").read_text()
    for check in {f.check for f in report.findings}:
        named = "iam.<policy>" if check.startswith("iam.") and check != "iam.reconciler" else check
        assert f"`{named}`" in documented, check


# ------------------------------------------------------------------ account, region, stack


def test_credentials_refused(deployed: vw.World) -> None:
    session = deployed.session(hooks=[lambda ev: inject_error(ev, "sts", "GetCallerIdentity", "InvalidClientTokenId",
                                                              status=403, message="The security token is invalid")])
    report = deployed.verify(FLEET, session=session)
    assert [f.check for f in report.findings] == ["account"]
    assert report.findings[0].status is Status.FAIL and "InvalidClientTokenId" in report.findings[0].summary
    assert report.exit_code == 1


def test_no_credentials_at_all(deployed: vw.World, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    report = deployed.verify(FLEET)
    assert report.findings[0].check == "account" and report.findings[0].status is Status.FAIL
    assert "no AWS credentials" in report.findings[0].summary and report.exit_code == 1


def test_wrong_stack_name(deployed: vw.World) -> None:
    with pytest.raises(TargetNotFound) as caught:
        deployed.verify("no-such-fleet")
    assert "RayitoFleet-no-such-fleet" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(TargetNotFound):
        deployed.verify("my_agent")  # not even a valid stack name


def test_verify_may_not_describe_stacks(deployed: vw.World) -> None:
    session = deployed.session(hooks=[lambda ev: inject_error(ev, "cloudformation", "DescribeStacks", "AccessDenied",
                                                              status=403, message="not authorized")])
    report = deployed.verify(FLEET, session=session)
    stack = finding(report, "stack")
    assert stack.status is Status.FAIL and "cloudformation:DescribeStacks" in stack.fix
    assert report.exit_code == 1


def test_throttling_is_retried_then_reported(deployed: vw.World) -> None:
    counters: list[dict[str, int]] = []

    def always(ev: Any) -> None:
        counters.append(inject_error(ev, "cloudformation", "ListStackResources", "Throttling", message="Rate exceeded"))

    report = deployed.verify(FLEET, session=deployed.session(hooks=[always]), attempts=3)
    stack = finding(report, "stack")
    assert stack.status is Status.WARN and "throttled" in stack.summary
    assert counters[0]["count"] == 3  # every attempt went out, then verify gave up and said so

    once: list[dict[str, int]] = []
    report = deployed.verify(FLEET, session=deployed.session(hooks=[lambda ev: once.append(
        inject_error(ev, "cloudformation", "ListStackResources", "Throttling", times=1))]), attempts=3)
    assert finding(report, "stack").status is Status.OK and once[0]["count"] == 1


def test_a_throttled_microvms_list(deployed: vw.World) -> None:
    deployed.emulator.set_rate_limit("ListMicrovms", 0.001, 1)
    try:
        deployed.microvms.list_microvms()  # spend the only token
        report = deployed.verify(FLEET)
    finally:
        deployed.emulator.set_rate_limit("ListMicrovms", 10, 10)
    fleet = finding(report, "reconciler.fleet")
    assert fleet.status is Status.WARN and "throttled" in fleet.summary


# ------------------------------------------------------------------ quotas


def test_memory_quota_too_small(deployed: vw.World) -> None:
    # max_vms 3 x 4096 MiB = 12 GB, min 1 + warm 1 = 8 GB
    report = deployed.verify(FLEET, session=deployed.session(quotas=ServiceQuotas({"L-CD1C0CC4": 10})))
    memory = finding(report, "quotas.memory")
    assert memory.status is Status.FAIL and "cannot reach max_vms" in memory.summary
    assert "L-CD1C0CC4" in memory.fix and "below the documented 1024 GB" in memory.summary
    report = deployed.verify(FLEET, session=deployed.session(quotas=ServiceQuotas({"L-CD1C0CC4": 6})))
    assert "min_vms + warm_vms alone" in finding(report, "quotas.memory").summary
    report = deployed.verify(FLEET, session=deployed.session(quotas=ServiceQuotas({"L-CD1C0CC4": 14})))
    assert finding(report, "quotas.memory").status is Status.WARN


def test_a_new_account_below_the_reconciler_budgets(deployed: vw.World) -> None:
    quotas = ServiceQuotas({"L-535CA9B6": 1, "L-91B95582": 1})
    report = deployed.verify(FLEET, session=deployed.session(quotas=quotas))
    rates = finding(report, "quotas.rates")
    assert rates.status is Status.FAIL and "RunMicrovm 4.75/s burst 4 > 1/s burst 1" in rates.summary
    assert "control_plane_budgets={'RunMicrovm': (0.95, 1)}" in rates.fix


def test_quotas_found_by_name_or_one_by_one(deployed: vw.World) -> None:
    renamed = ServiceQuotas(renamed={"L-535CA9B6": "L-00000001"}, unlisted=["L-90045317"])
    report = deployed.verify(FLEET, session=deployed.session(quotas=renamed))
    assert finding(report, "quotas.rates").status is Status.OK
    assert any(op == "GetServiceQuota" and p["QuotaCode"] == "L-90045317" for op, p in renamed.calls)
    absent = ServiceQuotas(absent=["L-CE98C9E3", "L-C9C2110E"])
    report = deployed.verify(FLEET, session=deployed.session(quotas=absent))
    rates = finding(report, "quotas.rates")
    assert rates.status is Status.WARN and "GetMicrovm" in rates.summary


def test_quotas_denied_to_verify(deployed: vw.World) -> None:
    def deny(ev: Any) -> None:
        ev.register_first("before-call.service-quotas.ListServiceQuotas",
                          lambda **_: error_response("AccessDeniedException", "no", 403))
    report = deployed.verify(FLEET, session=deployed.session(hooks=[deny]))
    quotas = finding(report, "quotas")
    assert quotas.status is Status.FAIL and "servicequotas:ListServiceQuotas" in quotas.fix


# ------------------------------------------------------------------ image


def _versions(world: vw.World) -> Any:
    return world.versions.copy()


def test_image_without_a_usable_version(deployed: vw.World) -> None:
    image = deployed.outputs(STACK)["ImageArn"]
    deployed.microvms.update_microvm_image_version(imageIdentifier=image, imageVersion="1.0", status="INACTIVE")
    try:
        report = deployed.verify(FLEET)
    finally:
        deployed.microvms.update_microvm_image_version(imageIdentifier=image, imageVersion="1.0", status="ACTIVE")
    assert finding(report, "image").status is Status.FAIL
    assert "no ACTIVE, SUCCESSFUL version" in finding(report, "image").summary
    version = finding(report, "image.version")
    assert version.status is Status.FAIL and "INACTIVE" in version.summary and "RunMicrovm refuses it" in version.summary


@pytest.mark.parametrize("status,expected", [("DEPRECATED", Status.WARN), ("EXPIRING", Status.FAIL),
                                             ("RECALLED", Status.FAIL), ("AVAILABLE", Status.OK)])
def test_base_image_version_status(deployed: vw.World, status: str, expected: Status) -> None:
    versions = _versions(deployed)
    for managed in versions.managed.values():
        for item in managed:
            item["status"] = status
    report = deployed.verify(FLEET, session=deployed.session(versions=versions))
    base = finding(report, "image.base")
    assert base.status is expected and status in base.summary


# ------------------------------------------------------------------ IAM


def _set_policy(world: vw.World, arn: str, document: dict[str, Any]) -> tuple[str, str]:
    """Make ``document`` the policy's default version; returns (old version, new version)."""
    iam = world.moto("iam")
    old = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    new = iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(document), SetAsDefault=True)
    return old, new["PolicyVersion"]["VersionId"]


def _document(world: vw.World, arn: str) -> dict[str, Any]:
    iam = world.moto("iam")
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    return iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]


def _verify_with(deployed: vw.World, arn: str, document: dict[str, Any]) -> Any:
    """verify's report while the managed policy ``arn`` holds ``document`` (then restored)."""
    old = _set_policy(deployed, arn, document)
    try:
        return deployed.verify(FLEET)
    finally:
        _restore(deployed, arn, old)


def _restore(world: vw.World, arn: str, versions: tuple[str, str]) -> None:
    iam = world.moto("iam")
    iam.set_default_policy_version(PolicyArn=arn, VersionId=versions[0])
    iam.delete_policy_version(PolicyArn=arn, VersionId=versions[1])


def test_a_launcher_that_may_write_the_recipe(deployed: vw.World) -> None:
    arn = deployed.outputs(STACK)["SandboxLauncherPolicyArn"]
    document = _document(deployed, arn)
    document["Statement"].append({"Sid": "Oops", "Effect": "Allow", "Action": "ssm:Put*", "Resource": "*"})
    report = _verify_with(deployed, arn, document)
    launcher = finding(report, "iam.SandboxLauncherPolicy")
    assert launcher.status is Status.FAIL and "ssm:PutParameter" in launcher.summary and "ALLOWED" in launcher.summary


def test_the_sessions_secrets_and_deploys_checks_are_simulated(deployed: vw.World) -> None:
    """The gateways' secrets of the project the recipe holds: the launcher reads them (a session),
    the caller also describes them (deploy) and renews the bedrock ones (--renew-gateway-keys);
    without the GatewaySecrets statement the launcher's check fails naming the path."""
    report = deployed.verify(FLEET)
    launcher = finding(report, "iam.SandboxLauncherPolicy").data["answers"]
    gateway = [a for a in launcher if a["path"] == "a session with gateways and secret_env"]
    assert gateway and all(a["decision"] == "allowed" and "provider-key" in a["resource"] for a in gateway), gateway
    caller = finding(report, "iam.CallerPolicy").data["answers"]
    renew = {a["action"] for a in caller if a["path"] == "agent deploy --renew-gateway-keys" and a["decision"] == "allowed"}
    assert renew == {"secretsmanager:DescribeSecret", "secretsmanager:PutSecretValue"}
    assert any(a["action"] == "secretsmanager:DescribeSecret" and a["path"] == "agent deploy" for a in caller)
    arn = deployed.outputs(STACK)["SandboxLauncherPolicyArn"]
    document = _document(deployed, arn)
    document["Statement"] = [st for st in document["Statement"] if st.get("Sid") != "GatewaySecrets"]
    report = _verify_with(deployed, arn, document)
    broken = finding(report, "iam.SandboxLauncherPolicy")
    assert broken.status is Status.FAIL and "GetSecretValue" in broken.summary
    assert "a session with gateways and secret_env" in broken.summary


def test_a_policy_scoped_right_passes_with_the_known_false_deny(deployed: vw.World) -> None:
    """The launcher scoped to its image: everything as required, only the simulator's
    PassNetworkConnector deny left, reported as the known false deny (WARN, not FAIL)."""
    arn = deployed.outputs(STACK)["SandboxLauncherPolicyArn"]
    image = deployed.outputs(STACK)["ImageArn"]
    document = _document(deployed, arn)
    for statement in document["Statement"]:
        if statement.get("Sid") == "Microvms":
            statement["Resource"] = [image, f"{image}:*"]
    report = _verify_with(deployed, arn, document)
    launcher = finding(report, "iam.SandboxLauncherPolicy")
    assert launcher.status is Status.WARN, launcher.summary
    assert "known false deny" in launcher.summary and "PassNetworkConnectors" in launcher.summary


def test_a_missing_connector_grant_is_a_real_deny(deployed: vw.World) -> None:
    arn = deployed.outputs(STACK)["SandboxLauncherPolicyArn"]
    document = _document(deployed, arn)
    document["Statement"] = [s for s in document["Statement"] if s.get("Sid") != "PassNetworkConnectors"]
    report = _verify_with(deployed, arn, document)
    launcher = finding(report, "iam.SandboxLauncherPolicy")
    assert launcher.status is Status.FAIL and "PassNetworkConnector" in launcher.summary and "denied" in launcher.summary


def test_lifecycle_on_another_fleets_image(deployed: vw.World) -> None:
    arn = deployed.outputs(STACK)["CallerPolicyArn"]
    document = _document(deployed, arn)
    for statement in document["Statement"]:
        if statement.get("Sid") == "Microvms":
            statement["Resource"] = f"arn:aws:lambda:us-east-1:{vw.ACCOUNT}:microvm-image:{FLEET}*"  # a prefix
    report = _verify_with(deployed, arn, document)
    caller = finding(report, "iam.CallerPolicy")
    assert caller.status is Status.FAIL and f"microvm-image:{FLEET}-other" in caller.summary
    assert "rayito-verify-probe" not in caller.summary  # the prefix matches only the look-alike


def test_a_permissions_boundary_that_denies_the_reconciler(deployed: vw.World) -> None:
    iam = deployed.moto("iam")
    role = deployed.function_config(STACK)["Role"].rsplit("/", 1)[-1]
    boundary = iam.create_policy(PolicyName="tight-boundary", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "NotAction": "lambda:RunMicrovm", "Resource": "*"}]}))["Policy"]["Arn"]
    iam.put_role_permissions_boundary(RoleName=role, PermissionsBoundary=boundary)
    try:
        report = deployed.verify(FLEET)
    finally:
        iam.delete_role_permissions_boundary(RoleName=role)
    reconciler = finding(report, "iam.reconciler")
    assert reconciler.status is Status.FAIL and "RunMicrovm on microvm-image:mi-agente denied" in reconciler.summary


def test_simulation_denied_to_verify(deployed: vw.World) -> None:
    report = deployed.verify(FLEET, session=deployed.session(hooks=[lambda ev: ev.register_first(
        "before-call.iam.SimulateCustomPolicy",
        lambda **_: error_response("AccessDenied", "User is not authorized to perform: iam:SimulateCustomPolicy", 403))]))
    for kind in ("SandboxLauncherPolicy", "CallerPolicy", "ImagePublisherPolicy"):
        f = finding(report, f"iam.{kind}")
        assert f.status is Status.FAIL and "iam:SimulateCustomPolicy" in f.fix
    assert finding(report, "recipe.launcher").status is Status.FAIL


# ------------------------------------------------------------------ recipe


def _parameter(world: vw.World) -> tuple[str, str]:
    name = world.outputs(STACK)["RecipeParameterName"]
    value = world.moto("ssm").get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    return name, value


def test_a_recipe_changed_by_hand(deployed: vw.World) -> None:
    name, original = _parameter(deployed)
    doc = json.loads(original)
    doc["project"]["env"]["GREETING"] = "Hello"
    ssm = deployed.moto("ssm")
    ssm.put_parameter(Name=name, Value=json.dumps(doc, sort_keys=True, separators=(",", ":")), Type="SecureString",
                      Overwrite=True)
    try:
        report = deployed.verify(FLEET)
    finally:
        ssm.put_parameter(Name=name, Value=original, Type="SecureString", Overwrite=True)
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "differs from what the stack wrote" in recipe.summary
    assert "Hello" not in json.dumps(report.to_dict())  # never a value of the recipe in the report


def test_an_unreadable_recipe(deployed: vw.World) -> None:
    name, original = _parameter(deployed)
    ssm = deployed.moto("ssm")
    ssm.put_parameter(Name=name, Value='{"data":"not-base64!","encoding":"gzip+base64","schema":"rayito.agent-recipe/1"}',
                      Type="SecureString", Overwrite=True)
    try:
        report = deployed.verify(FLEET)
    finally:
        ssm.put_parameter(Name=name, Value=original, Type="SecureString", Overwrite=True)
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "recipe_unreadable" in recipe.summary


def test_the_recipe_finding_names_the_products_encoding(deployed: vw.World) -> None:
    """The stored value's encoding as the product's envelope says it: ``json``, or ``gzip+base64``
    for the ``{"schema", "encoding", "data"}`` envelope (verify said "json" for an envelope before:
    it looked for this library's old ``rz1:`` prefix)."""
    import base64
    import gzip

    from rayito_constructs.model.product import canonical_json

    name, original = _parameter(deployed)
    assert "decodes (json, " in finding(deployed.verify(FLEET), "recipe").summary
    data = base64.b64encode(gzip.compress(original.encode(), compresslevel=9, mtime=0)).decode()
    envelope = canonical_json({"schema": "rayito.agent-recipe/1", "encoding": "gzip+base64", "data": data})
    ssm = deployed.moto("ssm")
    ssm.put_parameter(Name=name, Value=envelope, Type="SecureString", Overwrite=True)
    try:
        report = deployed.verify(FLEET)
    finally:
        ssm.put_parameter(Name=name, Value=original, Type="SecureString", Overwrite=True)
    recipe = finding(report, "recipe")
    assert f"decodes (gzip+base64, {len(envelope)} bytes)" in recipe.summary, recipe.summary


def test_a_recipe_with_the_wrong_key(deployed: vw.World) -> None:
    name, original = _parameter(deployed)
    ssm = deployed.moto("ssm")
    key = deployed.moto("kms").create_key()["KeyMetadata"]["Arn"]
    ssm.put_parameter(Name=name, Value=original, Type="SecureString", Overwrite=True, KeyId=key)
    try:
        report = deployed.verify(FLEET)
    finally:
        ssm.put_parameter(Name=name, Value=original, Type="SecureString", Overwrite=True, KeyId="alias/aws/ssm")
    assert finding(report, "recipe").status is Status.OK
    wrong = finding(report, "recipe.key")
    assert wrong.status is Status.FAIL and "alias/aws/ssm" in wrong.summary


def test_a_launcher_that_cannot_read_the_recipe(deployed: vw.World) -> None:
    arn = deployed.outputs(STACK)["SandboxLauncherPolicyArn"]
    document = _document(deployed, arn)
    document["Statement"] = [s for s in document["Statement"] if s.get("Sid") != "AgentRecipe"]
    report = _verify_with(deployed, arn, document)
    assert finding(report, "recipe.launcher").status is Status.FAIL


def test_recipe_against_the_project_folder(deployed: vw.World, agent_folder: Any) -> None:
    """Without the template (GetTemplate denied), --project gives what the stack meant to write."""
    deny = [lambda ev: inject_error(ev, "cloudformation", "GetTemplate", "AccessDenied", status=403)]
    report = deployed.verify(FLEET, session=deployed.session(hooks=deny))
    assert finding(report, "recipe").status is Status.WARN and "--project" in finding(report, "recipe").fix
    report = deployed.verify(FLEET, session=deployed.session(hooks=deny), project=EXAMPLE)
    assert finding(report, "recipe").status is Status.OK, finding(report, "recipe").summary
    other = agent_folder((EXAMPLE / "rayito-agent.toml").read_text().replace('GREETING = "Hola"', 'GREETING = "Hi"'),
                         name="mi-agente")
    report = deployed.verify(FLEET, session=deployed.session(hooks=deny), project=other)
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "env.GREETING" in recipe.summary and "Hi" not in recipe.summary


def test_verify_may_not_read_the_recipe(deployed: vw.World) -> None:
    deny = [lambda ev: inject_error(ev, "ssm", "GetParameter", "AccessDeniedException", status=400, protocol="json")]
    report = deployed.verify(FLEET, session=deployed.session(hooks=deny))
    recipe = finding(report, "recipe")
    assert recipe.status is Status.FAIL and "ssm:GetParameter" in recipe.fix


# ------------------------------------------------------------------ reconciler


def test_ticks_that_stopped_or_failed(deployed: vw.World) -> None:
    deployed.tick(STACK)
    later = time.time() + 600
    report = deployed.verify(FLEET, clock=lambda: later)
    ticks = finding(report, "reconciler.ticks")
    assert ticks.status is Status.FAIL and "no tick for 10 minutes" in ticks.summary
    much_later = time.time() + 7200
    report = deployed.verify(FLEET, clock=lambda: much_later)
    assert "no tick in the last 30 minutes" in finding(report, "reconciler.ticks").summary
    deployed.tick(STACK, status="error")
    report = deployed.verify(FLEET)
    ticks = finding(report, "reconciler.ticks")
    assert ticks.status is Status.FAIL and "ended in error" in ticks.summary
    deployed.tick(STACK)
    assert finding(deployed.verify(FLEET), "reconciler.ticks").status is Status.WARN  # an error among the last


def test_dead_letters_waiting(deployed: vw.World) -> None:
    url = deployed.outputs(STACK)["ReconcilerDeadLetterQueueUrl"]
    sqs = deployed.moto("sqs")
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"event": "slot_dead_lettered"}))
    try:
        report = deployed.verify(FLEET)
    finally:
        sqs.purge_queue(QueueUrl=url)
    letters = finding(report, "reconciler.dead_letters")
    assert letters.status is Status.FAIL and "redrive" in letters.fix


def test_a_list_that_misses_a_vm(deployed: vw.World) -> None:
    """Lists are eventually consistent: a VM the ledger holds and a list omits is asked about
    (GetMicrovm) before it counts as gone."""
    deployed.tick(STACK)

    def forget_running(parsed: dict[str, Any], **_: Any) -> None:
        parsed["items"] = [vm for vm in parsed.get("items", []) if vm["state"] != "RUNNING"]

    asked: list[str] = []
    hooks = [lambda ev: ev.register("after-call.lambda-microvms.ListMicrovms", forget_running),
             lambda ev: ev.register("provide-client-params.lambda-microvms.GetMicrovm",
                                    lambda params, **_: asked.append(params["microvmIdentifier"]))]
    report = deployed.verify(FLEET, session=deployed.session(hooks=hooks))
    fleet = finding(report, "reconciler.fleet")
    assert fleet.status is Status.OK and fleet.data["base_live"] == 1, fleet.summary
    assert len(asked) == 1


def test_an_alarm_in_alarm(deployed: vw.World) -> None:
    name = deployed.physical(STACK, "FleetReconcilerDeficitAlarm", "AWS::CloudWatch::Alarm")
    cloudwatch = deployed.moto("cloudwatch")
    cloudwatch.set_alarm_state(AlarmName=name, StateValue="ALARM", StateReason="Threshold crossed")
    try:
        report = deployed.verify(FLEET)
    finally:
        cloudwatch.set_alarm_state(AlarmName=name, StateValue="OK", StateReason="back")
    alarms = finding(report, "reconciler.alarms")
    assert alarms.status is Status.FAIL and name in alarms.summary
    assert finding(report, "egress.alarms").status is Status.OK


# ------------------------------------------------------------------ egress


def test_egress_envelopes_in_use(deployed: vw.World) -> None:
    table = deployed.outputs(STACK)["EgressBudgetTableName"]
    client = BudgetClient(table, deployed.moto("dynamodb"), envelopes=[
        Envelope("https://api.example.com", 1.0, 5), Envelope("https://api.example.com/v1/search?region", 0.5, 2)])
    for _ in range(3):
        client.acquire("https://api.example.com/items")
    client.acquire("https://api.example.com/v1/search?region=eu")
    before = time.time()
    library = client.remaining(["https://api.example.com"])["https://api.example.com"]
    then = time.time()
    report = deployed.verify(FLEET, clock=lambda: then)
    egress = [f for f in report.findings if f.check == "egress"]
    assert [f.status for f in egress] == [Status.OK, Status.OK]
    host = egress[0].data["envelopes"][0]
    # Tokens were taken; verify reads with this machine's clock, the library with the store's (its
    # Date headers, to the second): within one token, and the refill of the time between the two
    # readings (rate 1/s). No bound on the value itself: a slow machine refills while it acquires.
    assert host["bucket"] == "https://api.example.com" and host["remaining"] < 5
    assert library is not None and abs(host["remaining"] - library) <= 1.05 + (then - before)
    assert egress[1].data["envelopes"][0]["bucket"] == "https://api.example.com/v1/search?region=eu"
    client.backoff("https://api.example.com", 120, "throttled by the target")
    report = deployed.verify(FLEET)
    host = next(f for f in report.findings if f.check == "egress")
    assert host.status is Status.WARN and "backoff" in host.summary


# ------------------------------------------------------------------ a fleet without the optional parts


# ------------------------------------------------------------------ --launch


class _Endpoint:
    """A stand-in for the VM's endpoint on a real socket: 502 until the emulator says the launched
    VM is RUNNING, then 200 on /ping. ``hook`` learns the VM from RunMicrovm's answer."""

    def __init__(self, world: vw.World) -> None:
        self.headers: list[str] = []
        self.current = ""
        baseline = {vm["microvmId"] for vm in world.emulator.microvms_ever()}
        outer = self

        def launched() -> list[str]:
            if outer.current:
                return [outer.current]
            return [vm["microvmId"] for vm in world.emulator.microvms_ever() if vm["microvmId"] not in baseline]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.headers.append(self.headers.get("X-aws-proxy-auth", ""))
                running = any(world.emulator.state_of(vm) == "RUNNING" for vm in launched())
                self.send_response(200 if running and self.path == "/ping" else 502)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hook(self, events: Any) -> None:
        events.register("after-call.lambda-microvms.RunMicrovm", self._learn)

    def _learn(self, parsed: dict[str, Any], **_: Any) -> None:
        self.current = parsed.get("microvmId", "")

    def probe(self, endpoint: str, headers: dict[str, str]) -> Any:
        return http_probe(endpoint, headers, timeout=5, url=f"http://127.0.0.1:{self.server.server_address[1]}/ping")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_launch_answers_and_terminates(deployed: vw.World) -> None:
    endpoint = _Endpoint(deployed)
    notes: list[str] = []
    before = {vm["microvmId"] for vm in deployed.emulator.microvms()}
    try:
        report = deployed.verify(FLEET, launch=True, launch_timeout=30, probe=endpoint.probe, on_note=notes.append,
                                 session=deployed.session(hooks=[endpoint.hook]))
    finally:
        endpoint.close()
    launch = finding(report, "launch")
    assert launch.status is Status.OK, launch.summary
    vm = launch.data["microvm_id"]
    assert vm not in before and deployed.emulator.state_of(vm) in ("TERMINATING", "TERMINATED")
    assert {"run_call", "answered", "terminate_call", "total"} <= set(launch.data["timings"])
    assert notes[0].startswith("launch: one 4096 MiB MicroVM") and "$" in notes[0]
    assert "your own credentials" in notes[1]
    assert endpoint.headers and all(endpoint.headers)  # the auth token went with every probe


def test_launch_that_never_answers_still_terminates(deployed: vw.World) -> None:
    report = deployed.verify(FLEET, launch=True, launch_timeout=1.5, probe=lambda e, h: None,
                             sleep=lambda s: time.sleep(0.05))
    launch = finding(report, "launch")
    assert launch.status is Status.FAIL and "never answered" in launch.summary
    assert deployed.emulator.state_of(launch.data["microvm_id"]) in ("TERMINATING", "TERMINATED")


def test_launch_interrupted_terminates_its_vm(deployed: vw.World) -> None:
    def interrupt(endpoint: str, headers: dict[str, str]) -> Any:
        raise KeyboardInterrupt

    started: list[str] = []
    events = [lambda ev: ev.register("after-call.lambda-microvms.RunMicrovm",
                                     lambda parsed, **_: started.append(parsed["microvmId"]))]
    with pytest.raises(KeyboardInterrupt):
        deployed.verify(FLEET, launch=True, launch_timeout=30, probe=interrupt,
                        session=deployed.session(hooks=events))
    assert started and deployed.emulator.state_of(started[0]) in ("TERMINATING", "TERMINATED")


def test_launch_terminated_by_sigterm_terminates_its_vm(deployed: vw.World) -> None:
    def term(endpoint: str, headers: dict[str, str]) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises before this ends
        return None

    started: list[str] = []
    events = [lambda ev: ev.register("after-call.lambda-microvms.RunMicrovm",
                                     lambda parsed, **_: started.append(parsed["microvmId"]))]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as caught:
        deployed.verify(FLEET, launch=True, launch_timeout=30, probe=term, session=deployed.session(hooks=events))
    assert caught.value.code == 128 + signal.SIGTERM
    assert started and deployed.emulator.state_of(started[0]) in ("TERMINATING", "TERMINATED")
    assert signal.getsignal(signal.SIGTERM) == before  # put back


def test_launch_refused(deployed: vw.World) -> None:
    deny = [lambda ev: inject_error(ev, "lambda-microvms", "RunMicrovm", "AccessDeniedException", status=403,
                                    protocol="rest-json", message="not authorized to perform: lambda:RunMicrovm")]
    report = deployed.verify(FLEET, launch=True, launch_timeout=10, session=deployed.session(hooks=deny))
    launch = finding(report, "launch")
    assert launch.status is Status.FAIL and "AccessDeniedException" in launch.summary
    assert launch.data["microvm_id"] is None


def test_launch_with_the_launchers_role(deployed: vw.World) -> None:
    iam = deployed.moto("iam")
    role = iam.create_role(RoleName="launcher", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{vw.ACCOUNT}:root"}, "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
    endpoint = _Endpoint(deployed)
    notes: list[str] = []
    try:
        report = deployed.verify(FLEET, launch=True, launch_timeout=30, launch_role=role, probe=endpoint.probe,
                                 on_note=notes.append, session=deployed.session(hooks=[endpoint.hook]))
    finally:
        endpoint.close()
    assert finding(report, "launch").status is Status.OK
    assert any(n.startswith(f"launch: as {role}, limited to SandboxLauncherPolicy") for n in notes)


def test_http_probe_against_a_real_socket() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.headers.get("X-aws-proxy-auth") == "t" else 403)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ping"
    try:
        assert http_probe("x.lambda-microvm.us-east-1.on.aws", {"X-aws-proxy-auth": "t"}, url=url) == 200
        assert http_probe("x", {"X-aws-proxy-auth": "no"}, url=url) == 403
    finally:
        server.shutdown()
        server.server_close()
    assert http_probe("x", {}, url=url, timeout=2) is None  # nothing listens any more
    assert http_probe("nonexistent.invalid", {}, timeout=2) is None


# ------------------------------------------------------------------ read-only, proven


READS = ("Get", "List", "Describe", "Simulate", "Query", "Scan", "BatchGet", "Filter")


def _recorded(world: vw.World, monkeypatch: pytest.MonkeyPatch, **options: Any) -> list[tuple[str, str]]:
    """Every API call any boto3 client makes while verify runs (stubbed ones included)."""
    import botocore.client

    calls: list[tuple[str, str]] = []
    original = botocore.client.BaseClient._make_api_call

    def record(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if not getattr(self.meta, "test_fake", False):
            calls.append((self.meta.service_model.service_name, operation))
        return original(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", record)
    try:
        world.verify(FLEET, **options)
    finally:
        monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", original)
    return calls


def test_verify_only_reads(deployed: vw.World, monkeypatch: pytest.MonkeyPatch) -> None:
    deployed.tick(STACK)
    calls = _recorded(deployed, monkeypatch)
    writes = sorted({c for c in calls if not c[1].startswith(READS) and c != ("sts", "GetCallerIdentity")})
    assert writes == []
    assert len(calls) <= 120  # docs/verify.md: about 70 reads for the example fleet
    services = {s for s, _ in calls}
    assert {"cloudformation", "iam", "lambda", "lambda-microvms", "ssm", "dynamodb", "sqs", "cloudwatch", "logs",
            "service-quotas", "sts"} <= services
    # docs/verify.md lists every permission verify used.
    documented = (ROOT / "docs" / "verify.md").read_text()
    prefix = {"lambda-microvms": "lambda", "service-quotas": "servicequotas"}
    missing = sorted({f"{prefix.get(s, s)}:{op}" for s, op in calls} - set(re.findall(r"`([a-z]+:[A-Za-z]+)`", documented)))
    assert missing == []


def test_only_the_launch_writes(deployed: vw.World, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = _Endpoint(deployed)
    try:
        calls = _recorded(deployed, monkeypatch, launch=True, launch_timeout=30, probe=endpoint.probe,
                          session=deployed.session(hooks=[endpoint.hook]))
    finally:
        endpoint.close()
    writes = sorted({c for c in calls if not c[1].startswith(READS) and c != ("sts", "GetCallerIdentity")})
    assert writes == [("lambda-microvms", "CreateMicrovmAuthToken"), ("lambda-microvms", "RunMicrovm"),
                      ("lambda-microvms", "TerminateMicrovm")]


def test_verify_api_without_the_cli(deployed: vw.World) -> None:
    """The library entry point: the same report, through a plain session."""
    report = verify(Options(FLEET), session=deployed.session(), attempts=2)
    assert report.stack == STACK and report.findings
