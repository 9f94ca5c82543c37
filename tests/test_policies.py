"""The IAM of a fleet, pinned statement by statement, and the guards around it.

Each policy and role of the example fleet is pinned to its exact set of (Sid, actions, resources,
conditions): any new action, resource or condition fails here and has to be explained. Logical ids
are compared without their 8-character hash.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template

from rayito_constructs import AgentFleet, AgentProject, CallerPolicy, FleetStack, ImagePublisherPolicy, SandboxLauncherPolicy
from rayito_constructs._nag import flatten_cfn_reference
from rayito_constructs.permissions import STAR_REASONS

from .cdk_helpers import lint_template, nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE
from .iam_invariants import as_list, iam_matches, iam_violations, policy_documents
from .projects import project_with

ACCOUNT = "arn:aws:{service}:us-east-1:123456789012:{rest}"
RECIPE = ACCOUNT.format(service="ssm", rest="parameter/rayito/agents/mi-agente/recipe")
ALL_RECIPES = ACCOUNT.format(service="ssm", rest="parameter/rayito/agents/*")
IMAGE = ACCOUNT.format(service="lambda", rest="microvm-image:mi-agente")
EVERY_IMAGE = ACCOUNT.format(service="lambda", rest="microvm-image:*")
BUILT_IMAGE = "<FleetImage.ImageArn>"
MANAGED_CONNECTORS = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:*"
INTERNET_EGRESS = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:INTERNET_EGRESS"
LOG_STREAMS = ACCOUNT.format(service="logs", rest="log-group:/aws/lambda-microvms/mi-agente:*")
PASSED_TO_LAMBDA = '{"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}'
DRIVE = ("lambda:CreateMicrovmAuthToken", "lambda:GetMicrovm", "lambda:ResumeMicrovm", "lambda:SuspendMicrovm",
         "lambda:TerminateMicrovm")
#: What the publisher's paths call on the fleet's image (tests/test_product_iam.py): no delete of
#: the image, no tags.
IMAGE_ACTIONS = (
    "lambda:DeleteMicrovmImageVersion", "lambda:GetMicrovmImage", "lambda:GetMicrovmImageBuild",
    "lambda:GetMicrovmImageVersion", "lambda:ListMicrovmImageBuilds", "lambda:ListMicrovmImageVersions",
    "lambda:UpdateMicrovmImage", "lambda:UpdateMicrovmImageVersion",
)
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:{}-??????"
TOKEN = SECRET.format("rayito/agents/mi-agente/access-token")
GATEWAY = SECRET.format("rayito/provider-key")
BUCKET = "arn:aws:s3:::rayito-artifacts-123456789012-us-east-1"
BASE = ACCOUNT.format(service="lambda", rest="microvm-image:rayito-base-caps")
PRODUCT_BUILD_ROLE = "arn:aws:iam::123456789012:role/rayito-m0-build-us-east-1"
BUILD_LOGS = ACCOUNT.format(service="logs", rest="log-group:/rayito/{}")
_HASH = re.compile(r"\b([A-Z][A-Za-z0-9]*?)[0-9A-F]{8}\b")
_ASSET = re.compile(r"[0-9a-f]{64}")

Pinned = frozenset[tuple[Any, tuple[str, ...], tuple[str, ...], str]]


def _norm(text: str) -> str:
    return _ASSET.sub("<asset>", _HASH.sub(r"\1", text))


def pinned(template: dict[str, Any], owner: str, *, deny: bool = False) -> Pinned:
    """The statements of the policies whose name or owner starts with ``owner``, normalized (a Deny
    statement's condition column says ``Deny``; ``deny=False`` allows none)."""
    found = set()
    for name, description, document in policy_documents(template):
        if not (_norm(name).startswith(owner) or description.startswith(owner)):
            continue
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow" or deny, statement
            found.add((
                statement.get("Sid"),
                tuple(sorted(as_list(statement["Action"]))),
                tuple(sorted(_norm(flatten_cfn_reference(r)) for r in as_list(statement["Resource"]))),
                "Deny" if statement["Effect"] == "Deny" else
                json.dumps(statement.get("Condition"), sort_keys=True) if statement.get("Condition") else "",
            ))
    assert found, f"no policy of {owner}"
    return frozenset(found)


def trust(template: dict[str, Any], role_prefix: str) -> list[dict[str, Any]]:
    (role,) = [r for k, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role" and _norm(k) == role_prefix]
    return role["Properties"]["AssumeRolePolicyDocument"]["Statement"]


@pytest.fixture(scope="module")
def example() -> tuple[cdk.App, dict[str, Any]]:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    return app, Template.from_stack(stack).to_json()


def microvms(image: str = BUILT_IMAGE, *, execution_role: bool = True) -> set[tuple[Any, ...]]:
    found = {
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("RunMicrovm", ("lambda:RunMicrovm",), (image,), ""),
        ("Microvms", DRIVE, tuple(sorted((image, f"{image}:*"))), ""),
        ("PassNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
    }
    if execution_role:  # the reconciler's and the teardown's: the product's client passes none
        found.add(("PassExecutionRole", ("iam:PassRole",), ("<FleetExecutionRole.Arn>",), PASSED_TO_LAMBDA))
    return found


def publisher(image: str = BUILT_IMAGE, build_role: str = "<FleetImageBuildRole.Arn>", fleet: str = "mi-agente",
              base: str = BASE) -> set[tuple[Any, ...]]:
    return {
        ("CreateMicrovmImage", ("lambda:CreateMicrovmImage",), ("*",), ""),
        ("MicrovmImages", IMAGE_ACTIONS, tuple(sorted((image, f"{image}:*"))), ""),
        ("BaseImage", ("lambda:GetMicrovmImage", "lambda:GetMicrovmImageVersion", "lambda:ListMicrovmImageVersions"),
         (base, f"{base}:*"), ""),
        ("ManagedImageVersions", ("lambda:ListManagedMicrovmImageVersions",), ("*",), ""),
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("PassBuildRole", ("iam:PassRole",), tuple(sorted(r for r in (build_role, PRODUCT_BUILD_ROLE) if r)), PASSED_TO_LAMBDA),
        ("UploadArtifacts", ("s3:GetObject", "s3:PutObject"), (f"{BUCKET}/rayito/images/*", f"{BUCKET}/rayito/templates/*"), ""),
        ("BuildLogs", ("logs:DescribeLogStreams", "logs:GetLogEvents"),
         (BUILD_LOGS.format(fleet), BUILD_LOGS.format(fleet) + ":*"), ""),
    }


SESSIONS = {
    ("AccessToken", ("secretsmanager:GetSecretValue",), (TOKEN,), ""),
    ("GatewaySecrets", ("secretsmanager:GetSecretValue",), (GATEWAY,), ""),
}


# ------------------------------------------------------------------ the example fleet, pinned
# What each statement is for, path by path: tests/test_product_iam.py and docs/iam.md.


def test_launcher_policy_pinned(example) -> None:
    assert pinned(example[1], "FleetSandboxLauncherPolicy") == {
        *microvms(execution_role=False),
        ("AgentRecipe", ("ssm:DeleteParameter", "ssm:GetParameter"), (RECIPE,), ""),
        *SESSIONS,
    }


def test_caller_policy_pinned(example) -> None:
    assert pinned(example[1], "FleetCallerPolicy") == {
        *microvms(execution_role=False),
        ("AgentRecipe", ("ssm:DeleteParameter", "ssm:GetParameter"), (RECIPE,), ""),
        ("AgentRecipeWrite", ("ssm:PutParameter",), (RECIPE,), ""),
        *SESSIONS,
        ("CheckGatewaySecrets", ("secretsmanager:DescribeSecret",), (GATEWAY,), ""),
        ("RenewGatewayKeys", ("secretsmanager:DescribeSecret", "secretsmanager:PutSecretValue"), (GATEWAY,), ""),
        *{s for s in publisher() if s[0] != "ListMicrovms"},  # one ListMicrovms, the launcher's
    }


def test_publisher_policy_pinned(example) -> None:
    assert pinned(example[1], "FleetImagePublisherPolicy") == {
        *publisher(),
        ("PassBuildNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
    }


def test_execution_role_pinned(example) -> None:
    template = example[1]
    assert pinned(template, "FleetExecutionRole") == {
        # The stack owns the log group: the VMs may not (re)create it.
        ("MicrovmLogs", ("logs:CreateLogStream", "logs:PutLogEvents"), (LOG_STREAMS,), ""),
        # The example declares egress budgets: the agents take tokens from the shared envelopes.
        (None, ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"),
         ("<FleetEgressBudgetTable.Arn>",), ""),
    }
    assert trust(template, "FleetExecutionRole") == [exact_trust()]


def exact_trust(image: str = IMAGE) -> dict[str, Any]:
    return {
        "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"},
                      "ArnLike": {"aws:SourceArn": [image, f"{image}:*"]}},
        "Effect": "Allow",
        "Principal": {"Service": "lambda.amazonaws.com"},
    }


def test_build_role_pinned(example) -> None:
    template = example[1]
    assert pinned(template, "FleetImageBuildRole") == {
        ("ReadCode", ("s3:GetObject",), ("arn:aws:s3:::cdk-hnb659fds-assets-123456789012-us-east-1/<asset>.zip",), ""),
        # the product's build log group, /rayito/<image>
        ("BuildLogs", ("logs:CreateLogStream", "logs:PutLogEvents"),
         (ACCOUNT.format(service="logs", rest="log-group:/rayito/mi-agente:*"),), ""),
    }
    assert trust(template, "FleetImageBuildRole") == [exact_trust()]


def test_reconciler_role_pinned(example) -> None:
    assert pinned(example[1], "FleetReconcilerRole") == {
        ("Logs", ("logs:CreateLogStream", "logs:PutLogEvents"), ("<FleetReconcilerLogs.Arn>",), ""),
        # It never connects to a VM: no CreateMicrovmAuthToken.
        *{s for s in microvms() if s[0] != "Microvms"},
        ("Microvms", tuple(a for a in DRIVE if a != "lambda:CreateMicrovmAuthToken"),
         tuple(sorted((BUILT_IMAGE, f"{BUILT_IMAGE}:*"))), ""),
        ("Ledger", ("dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"),
         ("<RayitoFleetLedgerTable.Arn>",), '{"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}'),
        ("ControlPlaneBudget", ("dynamodb:GetItem", "dynamodb:UpdateItem"), ("<RayitoControlPlaneBudgetTable.Arn>",), ""),
        ("DeadLetters", ("sqs:SendMessage",), ("<FleetReconcilerDeadLetters.Arn>",), ""),
        # CDK's on_failure destination grant
        (None, ("sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage"), ("<FleetReconcilerDeadLetters.Arn>",), ""),
        # the product's recipe at every tick, the token whose sha256 goes in each run payload, and
        # the fleet's server for each VM it starts; nothing that opens a VM
        ("AgentRecipe", ("ssm:GetParameter",), (RECIPE,), ""),
        ("AccessToken", ("secretsmanager:GetSecretValue",), (TOKEN,), ""),
        ("AskServer", ("lambda:InvokeFunction",), ("<FleetReconcilerServerFunction.Arn>",), ""),
    }


def test_server_role_pinned(example) -> None:
    """The server opens the fleet's VMs (an auth token), reads what serving needs, and writes
    only its answers into its fleet's ledger partition."""
    assert pinned(example[1], "FleetReconcilerServerRole") == {
        ("Logs", ("logs:CreateLogStream", "logs:PutLogEvents"), ("<FleetReconcilerServerLogs.Arn>",), ""),
        ("ServeMicrovms", ("lambda:CreateMicrovmAuthToken", "lambda:GetMicrovm"),
         tuple(sorted((BUILT_IMAGE, f"{BUILT_IMAGE}:*"))), ""),
        ("AgentRecipe", ("ssm:GetParameter",), (RECIPE,), ""),
        ("AccessToken", ("secretsmanager:GetSecretValue",), (TOKEN,), ""),
        ("GatewaySecrets", ("secretsmanager:GetSecretValue",), (SECRET.format("rayito/provider-key"),), ""),
        ("Answers", ("dynamodb:PutItem",), ("<RayitoFleetLedgerTable.Arn>",),
         '{"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}'),
    }


def test_schedule_role_pinned(example) -> None:
    assert pinned(example[1], "FleetReconcilerScheduleRole") == {
        (None, ("lambda:InvokeFunction",), ("<FleetReconcilerFunction.Arn>", "<FleetReconcilerFunction.Arn>:*"), ""),
        (None, ("sqs:SendMessage",), ("<FleetReconcilerDeadLetters.Arn>",), ""),
    }


def test_recipe_writer_role_pinned(example) -> None:
    assert pinned(example[1], "RayitoRecipeWriterRole") == {
        ("Logs", ("logs:CreateLogStream", "logs:PutLogEvents"), ("<RayitoRecipeWriterLogs.Arn>",), ""),
        ("WriteRecipes", ("ssm:DeleteParameter", "ssm:PutParameter"), (RECIPE,), ""),
        ("ReadRecipeDocuments", ("s3:GetObject",), ("arn:aws:s3:::cdk-hnb659fds-assets-123456789012-us-east-1/<asset>.json",), ""),
    }


def test_teardown_role_pinned(example) -> None:
    """Issue #13: it stops this fleet's schedule, reads and fences this fleet's ledger items, and
    ends VMs of this image (RunMicrovm only to resolve a lost answer by its token): no Suspend,
    Resume or auth token."""
    image = BUILT_IMAGE
    assert pinned(example[1], "FleetTeardownmiagenteRole") == {
        ("Logs", ("logs:CreateLogStream", "logs:PutLogEvents"), ("<FleetTeardownmiagenteLogs.Arn>",), ""),
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("RunMicrovm", ("lambda:RunMicrovm",), (image,), ""),
        ("Microvms", ("lambda:GetMicrovm", "lambda:TerminateMicrovm"), tuple(sorted((image, f"{image}:*"))), ""),
        ("PassNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
        ("PassExecutionRole", ("iam:PassRole",), ("<FleetExecutionRole.Arn>",), PASSED_TO_LAMBDA),
        ("Ledger", ("dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"),
         ("<RayitoFleetLedgerTable.Arn>",), '{"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["mi-agente"]}}'),
        ("ReconcilerSchedule", ("scheduler:GetSchedule", "scheduler:UpdateSchedule"), ("<FleetReconcilerSchedule.Arn>",), ""),
        ("PassScheduleRole", ("iam:PassRole",), ("<FleetReconcilerScheduleRole.Arn>",),
         '{"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}'),
        ("StackStatus", ("cloudformation:DescribeStacks",), ("<AWS::StackId>",), ""),
    }


def test_pruner_roles_pinned(example) -> None:
    """Issue #13: the pruner reads and deletes versions of this image only, and lists VMs."""
    named = "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente"
    assert pinned(example[1], "FleetImagePrunerRole") == {
        ("Logs", ("logs:CreateLogStream", "logs:PutLogEvents"), ("<FleetImagePrunerLogs.Arn>",), ""),
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("MicrovmImages", ("lambda:DeleteMicrovmImageVersion", "lambda:GetMicrovmImage",
                           "lambda:ListMicrovmImageVersions", "lambda:UpdateMicrovmImageVersion"),
         (named, f"{named}:*"), ""),
    }
    assert pinned(example[1], "FleetImagePrunerScheduleRole") == {
        (None, ("lambda:InvokeFunction",), ("<FleetImagePrunerFunction.Arn>", "<FleetImagePrunerFunction.Arn>:*"), ""),
    }


def test_every_role_of_the_example_is_pinned(example) -> None:
    roles = sorted(_norm(k) for k, r in example[1]["Resources"].items() if r["Type"] == "AWS::IAM::Role")
    assert roles == ["FleetExecutionRole", "FleetImageBuildRole", "FleetImagePrunerRole", "FleetImagePrunerScheduleRole",
                     "FleetReconcilerRole", "FleetReconcilerScheduleRole", "FleetReconcilerServerRole",
                     "FleetTeardownmiagenteRole",
                     "RayitoRecipeWriterRole"]
    policies = sorted(_norm(k) for k, r in example[1]["Resources"].items() if r["Type"] == "AWS::IAM::ManagedPolicy")
    assert policies == ["FleetCallerPolicy", "FleetImagePublisherPolicy", "FleetSandboxLauncherPolicy"]


def test_example_is_clean(example) -> None:
    app, template = example
    assert iam_violations(template) == []
    assert nag(app) == []


# ------------------------------------------------------------------ the policies on their own


def test_account_wide_policies() -> None:
    app = new_app()
    stack = new_stack(app)
    CallerPolicy(stack, "Caller")
    SandboxLauncherPolicy(stack, "Launcher")
    ImagePublisherPolicy(stack, "Publisher")
    template = Template.from_stack(stack).to_json()
    every = {
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("RunMicrovm", ("lambda:RunMicrovm",), (EVERY_IMAGE,), ""),
        ("Microvms", DRIVE, (EVERY_IMAGE,), ""),
        ("PassNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
        ("AgentRecipe", ("ssm:DeleteParameter", "ssm:GetParameter"), (ALL_RECIPES,), ""),
        ("AccessToken", ("secretsmanager:GetSecretValue",), (SECRET.format("rayito/agents/*/access-token"),), ""),
        ("GatewaySecrets", ("secretsmanager:GetSecretValue",),
         ("arn:aws:secretsmanager:us-east-1:123456789012:secret:rayito/*",), ""),
    }
    assert pinned(template, "Launcher", deny=True) == {
        *every, ("NeverWebhookSigningSecrets", ("secretsmanager:GetSecretValue",),
                 ("arn:aws:secretsmanager:us-east-1:123456789012:secret:rayito/webhooks/*",), "Deny")}
    assert pinned(template, "Caller", deny=True) >= {*every, ("AgentRecipeWrite", ("ssm:PutParameter",), (ALL_RECIPES,), "")}
    assert pinned(template, "Publisher") == {
        *{s for s in publisher(EVERY_IMAGE, "", "*") if s[0] != "MicrovmImages"},
        ("MicrovmImages", IMAGE_ACTIONS, (EVERY_IMAGE,), ""),
        ("PassBuildNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
    }
    assert nag(app) == [] and lint_template(Template.from_stack(stack)) == []


def test_one_fleet_by_name() -> None:
    app = new_app()
    stack = new_stack(app)
    role = iam.Role(stack, "ExecRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    SandboxLauncherPolicy(stack, "Launcher", fleet_name="mi-agente", execution_role=role)
    template = Template.from_stack(stack).to_json()
    assert pinned(template, "Launcher") == {
        ("ListMicrovms", ("lambda:ListMicrovms",), ("*",), ""),
        ("RunMicrovm", ("lambda:RunMicrovm",), (IMAGE,), ""),
        ("Microvms", DRIVE, (IMAGE, f"{IMAGE}:*"), ""),
        ("PassNetworkConnectors", ("lambda:PassNetworkConnector",), (MANAGED_CONNECTORS,), ""),
        ("AgentRecipe", ("ssm:DeleteParameter", "ssm:GetParameter"), (RECIPE,), ""),
        ("AccessToken", ("secretsmanager:GetSecretValue",), (TOKEN,), ""),
    }  # no PassExecutionRole: the product's client sends no executionRoleArn
    assert nag(app) == []


def test_opt_out_to_every_image_is_explicit_and_its_own_statement() -> None:
    app = new_app()
    stack = new_stack(app)
    SandboxLauncherPolicy(stack, "Launcher", fleet_name="mi-agente", scope_microvm_actions_to_image=False)
    s = pinned(Template.from_stack(stack).to_json(), "Launcher")
    assert ("MicrovmsOnAnyImage", tuple(sorted(("lambda:RunMicrovm", *DRIVE))), ("*",), "") in s
    assert not [st for st in s if st[0] in ("RunMicrovm", "Microvms")]
    assert "risk" in STAR_REASONS["MicrovmsOnAnyImage"]
    assert nag(app) == []


def test_customer_key_metadata_table_and_connectors() -> None:
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    table = dynamodb.Table.from_table_attributes(stack, "Index", table_name="sessions", encryption_key=key)
    connectors = ["arn:aws:lambda:us-east-1:123456789012:network-connector:nc-1"]
    common = dict(fleet_name="mi-agente", recipe_key=key, metadata_table=table, network_connectors=connectors)
    CallerPolicy(stack, "Caller", **common)
    SandboxLauncherPolicy(stack, "Launcher", **common)
    ImagePublisherPolicy(stack, "Publisher", **common, build_network_connectors=connectors)
    template = Template.from_stack(stack).to_json()
    ssm = '{"StringEquals": {"kms:ViaService": "ssm.us-east-1.amazonaws.com"}}'
    dynamo = '{"StringEquals": {"kms:ViaService": "dynamodb.us-east-1.amazonaws.com"}}'
    table_arn = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions"
    table_key = ("MetadataIndexKey", ("kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey",
                                      "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncryptFrom", "kms:ReEncryptTo"),
                 ("<Key.Arn>",), dynamo)
    launcher, caller, publisher = (pinned(template, p) for p in ("Launcher", "Caller", "Publisher"))
    assert ("AgentRecipeKey", ("kms:Decrypt",), ("<Key.Arn>",), ssm) in launcher
    assert ("AgentRecipeKey", ("kms:Decrypt", "kms:Encrypt"), ("<Key.Arn>",), ssm) in caller
    assert not [st for st in publisher if st[0] == "AgentRecipeKey"]  # no publisher path writes the recipe
    assert table_key in launcher and table_key in caller and table_key not in publisher
    for holder in (launcher, caller):  # the product's RayitoIndexWriter and RayitoIndexReader
        assert ("PutIndexRows", ("dynamodb:PutItem",), (table_arn,), "") in holder
        assert ("ReadIndexRows", ("dynamodb:BatchGetItem",), (table_arn,), "") in holder
    assert not [st for st in publisher if "Index" in st[0]]
    assert ("SecretsKey", ("kms:Decrypt",), ("<Key.Arn>",),
            '{"StringEquals": {"kms:ViaService": "secretsmanager.us-east-1.amazonaws.com"}}') in launcher
    assert ("PassNetworkConnectors", ("lambda:PassNetworkConnector",), tuple(sorted((MANAGED_CONNECTORS, connectors[0]))), "") in launcher
    assert ("PassBuildNetworkConnectors", ("lambda:PassNetworkConnector",), tuple(sorted((MANAGED_CONNECTORS, connectors[0]))), "") in publisher
    # Every KMS statement goes through a service.
    for _, actions, _, condition in (*launcher, *caller, *publisher):
        if any(a.startswith("kms:") for a in actions):
            assert "kms:ViaService" in condition
    assert nag(app) == []


def test_default_key_needs_no_kms(example) -> None:
    for owner in ("FleetCallerPolicy", "FleetSandboxLauncherPolicy", "FleetImagePublisherPolicy", "RayitoRecipeWriterRole"):
        assert not [st for st in pinned(example[1], owner) if any(a.startswith("kms:") for a in st[1])]


# ------------------------------------------------------------------ trust: exact, never a prefix


def arn_like(pattern: str, value: str) -> bool:
    """IAM's ArnLike: each of the six colon-delimited parts matched on its own, ``*`` and ``?``."""
    p, v = pattern.split(":", 5), value.split(":", 5)
    return len(p) == len(v) == 6 and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, v))


@pytest.mark.parametrize("name", ["mi-agente", "mi_agente", "a", "x" * 64, "agent_2-b"])
def test_trust_is_the_image_and_its_versions_only(name: str, agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(None, name=name)))
    template = Template.from_stack(stack).to_json()
    image = ACCOUNT.format(service="lambda", rest=f"microvm-image:{name}")
    for role in ("FleetExecutionRole", "FleetImageBuildRole"):
        (statement,) = trust(template, role)
        patterns = statement["Condition"]["ArnLike"]["aws:SourceArn"]
        assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
        allowed = [image, f"{image}:1.0", f"{image}:12.0"]
        denied = [f"{image}-dev", f"{image}2", f"{image}_old", image[:-1], image.replace("123456789012", "210987654321"),
                  image.replace("us-east-1", "us-west-2")]
        assert all(any(arn_like(p, arn) for p in patterns) for arn in allowed), (role, patterns)
        assert not [arn for arn in denied if any(arn_like(p, arn) for p in patterns)], (role, patterns)
    assert iam_violations(template) == [] and nag(app) == []


def test_imported_and_token_image_arns() -> None:
    app = new_app()
    stack = new_stack(app)
    parameter = cdk.CfnParameter(stack, "ImageArn", type="String")
    AgentFleet(stack, "Tokened", project=project_with(name="tokened"), image_arn=parameter.value_as_string)
    shared = "arn:aws:lambda:us-east-1:123456789012:microvm-image:shared_agent"
    AgentFleet(stack, "Shared", project=project_with(name="other"), image_arn=shared)
    template = Template.from_stack(stack).to_json()
    (tokened,) = trust(template, "TokenedExecutionRole")
    assert tokened["Condition"]["ArnLike"]["aws:SourceArn"] == [
        {"Ref": "ImageArn"}, {"Fn::Join": ["", [{"Ref": "ImageArn"}, ":*"]]}]
    assert pinned(template, "TokenedSandboxLauncherPolicy") >= {("RunMicrovm", ("lambda:RunMicrovm",), ("<ImageArn>",), "")}
    assert trust(template, "SharedExecutionRole") == [exact_trust(shared)]
    assert pinned(template, "SharedSandboxLauncherPolicy") >= {("RunMicrovm", ("lambda:RunMicrovm",), (shared,), "")}
    # An image made elsewhere: the stack does not own its log group, the VMs may create it.
    logs = [st for st in pinned(template, "SharedExecutionRole") if st[0] == "MicrovmLogs"]
    assert logs[0][1] == ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents")
    assert logs[0][2] == (ACCOUNT.format(service="logs", rest="log-group:/aws/lambda-microvms/shared_agent:*"),)
    assert iam_violations(template) == [] and nag(app) == [] and lint_template(Template.from_stack(stack)) == []


# ------------------------------------------------------------------ acknowledgements: one statement each


def _launcher_app() -> tuple[cdk.App, cdk.Stack, SandboxLauncherPolicy]:
    app = new_app()
    stack = new_stack(app)
    return app, stack, SandboxLauncherPolicy(stack, "Launcher", fleet_name="mi-agente")


@pytest.mark.parametrize("statement", [
    iam.PolicyStatement(actions=["ssm:PutParameter"], resources=["*"]),
    iam.PolicyStatement(sid="Extra", actions=["lambda:ListMicrovms"], resources=["*"]),  # a vouched action, another Sid
    iam.PolicyStatement(actions=["lambda:ListMicrovms", "ssm:PutParameter"], resources=["*"]),
    iam.PolicyStatement(sid="ListMicrovms2", actions=["s3:GetObject"], resources=["*"]),
])
def test_a_wildcard_added_to_the_launcher_gets_a_finding(statement) -> None:
    app, _, launcher = _launcher_app()
    assert nag(app, gate=False) == []  # the library's own statements are vouched for
    app, _, launcher = _launcher_app()
    launcher.add_statements(statement)
    assert nag(app, gate=False) == ["AwsSolutions-IAM5[Resource::*] Test/Launcher/Resource"]


def test_a_wildcard_added_to_a_library_role_gets_a_finding(example) -> None:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    stack.fleet.reconciler.function.role.add_to_principal_policy(
        iam.PolicyStatement(actions=["ssm:PutParameter"], resources=["*"]))
    stack.fleet.execution_role.add_to_principal_policy(
        iam.PolicyStatement(actions=["ssm:*"], resources=[RECIPE]))
    stack.fleet.recipe.writer.role.add_to_policy(
        iam.PolicyStatement(actions=["logs:PutLogEvents"], resources=[LOG_STREAMS]))  # vouched elsewhere, not here
    found = nag(app, gate=False)
    assert "AwsSolutions-IAM5[Resource::*] MiAgente/Fleet/Reconciler/Role/DefaultPolicy/Resource" in found
    assert "AwsSolutions-IAM5[Action::ssm:*] MiAgente/Fleet/ExecutionRole/DefaultPolicy/Resource" in found
    assert f"AwsSolutions-IAM5[Resource::{LOG_STREAMS}] MiAgente/RayitoRecipeWriter/Role/DefaultPolicy/Resource" in found
    assert len(found) == 3


def test_a_missing_reason_is_a_synth_error() -> None:
    from rayito_constructs._function import library_function
    from rayito_constructs.permissions import Statement

    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError, match="Sneaky: wildcard"):
        library_function(stack, name="recipe_writer", description="d", role_description="r",
                         statements=[Statement("Sneaky", ("ssm:PutParameter",), ("*",))])


# ------------------------------------------------------------------ the invariants catch what they claim


def _hostile(*statements: dict[str, Any], description: str = "Rayito SandboxLauncherPolicy: x") -> dict[str, Any]:
    return {"Resources": {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"Description": "a role"}},
        "Launcher": {"Type": "AWS::IAM::ManagedPolicy", "Properties": {
            "Description": description, "PolicyDocument": {"Statement": list(statements)}}},
    }}


@pytest.mark.parametrize("action", ["ssm:PutParameter", "ssm:Put*", "ssm:*", "*", "SSM:putparameter", "ssm:P?tParameter",
                                    "s*:*Parameter", ["ssm:GetParameter", "ssm:*"]])
def test_the_launcher_never_writes_the_recipe(action) -> None:
    found = iam_violations(_hostile({"Effect": "Allow", "Action": action, "Resource": RECIPE}))
    assert [f for f in found if "may write the recipe" in f]


@pytest.mark.parametrize("action", ["ssm:GetParameter", "ssm:Get*", "ssm:DeleteParameter", "ssm:PutParameterX"])
def test_reading_is_not_writing(action) -> None:
    assert not [f for f in iam_violations(_hostile({"Effect": "Allow", "Action": action, "Resource": RECIPE}))
                if "may write" in f]
    assert iam_matches("ssm:Put*", "ssm:PutParameter") and not iam_matches("ssm:PutParameterX", "ssm:PutParameter")


def test_not_action_in_a_launcher() -> None:
    found = iam_violations(_hostile({"Effect": "Allow", "NotAction": "iam:*", "Resource": RECIPE}))
    assert [f for f in found if "NotAction" in f]


@pytest.mark.parametrize("statement, message", [
    ({"Effect": "Allow", "Action": "iam:PassRole", "Resource": {"Fn::GetAtt": ["Role", "Arn"]}}, "without iam:PassedToService"),
    ({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*",
      "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}}, "not a role"),
    ({"Effect": "Allow", "Action": "iam:*", "Resource": "arn:aws:iam::123456789012:role/x*",
      "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}}, "not a role"),
    ({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::123456789012:role/agent"},
     "without iam:PassedToService"),
    ({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}, "outside the wildcard allow-list"),
    ({"Effect": "Allow", "Action": "lambda:RunMicrovm", "Resource": "*"}, "outside the wildcard allow-list"),
    ({"Sid": "Mine", "Effect": "Allow", "Action": "lambda:ListMicrovms", "Resource": "*"}, "may not hold a wildcard"),
    ({"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": "arn:aws:ssm:us-east-1:1:parameter/*"},
     "outside the wildcard allow-list"),
    ({"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": "arn:aws:kms:us-east-1:123456789012:key/k"},
     "a KMS grant without kms:ViaService"),
])
def test_invariants_catch_each_breach(statement, message) -> None:
    found = iam_violations(_hostile(statement, description="Rayito CallerPolicy: x"))
    assert [f for f in found if message in f], found


def test_invariants_accept_what_the_library_makes() -> None:
    ok = [
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": {"Fn::GetAtt": ["Role", "Arn"]},
         "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}},
        {"Sid": "ListMicrovms", "Effect": "Allow", "Action": "lambda:ListMicrovms", "Resource": "*"},
        {"Effect": "Allow", "Action": ["lambda:GetMicrovm"], "Resource": [IMAGE, f"{IMAGE}:*"]},
        {"Effect": "Deny", "Action": "*", "Resource": "*"},
    ]
    assert iam_violations(_hostile(*ok)) == []


def test_every_secret_a_session_reads_is_granted_as_the_product_reads_it() -> None:
    """``[secret_env]`` with a JSON key and ``[[secret_env_from]]``: the launcher's ``SecretEnv``
    names each secret the product's ``secret_ids`` lists (a session reads them all with the
    caller's credentials); one from another account is refused at synth."""
    from rayito_constructs.permissions import session_secrets

    project = _toml_project("secretos", """
        [secret_env]
        DB = {secret = "app/json", key = "password"}
        PLAIN = "app/plain"

        [[secret_env_from]]
        secret = "app/bundle"
        prefix = "APP_"
    """)
    assert session_secrets(project).secret_env == ("app/json", "app/plain", "app/bundle")
    stack = new_stack(new_app())
    policy = SandboxLauncherPolicy(stack, "Launcher", project=project)
    document = stack.resolve(policy.document.to_json())
    (statement,) = [s for s in document["Statement"] if s.get("Sid") == "SecretEnv"]
    names = json.dumps(statement["Resource"])
    assert all(f"{name}-??????" in names for name in ("app/json", "app/plain", "app/bundle")), names
    far = _toml_project("lejos-from", """
        [[secret_env_from]]
        secret = "arn:aws:secretsmanager:us-east-1:999999999999:secret:app/bundle-AbCdEf"
    """)
    with pytest.raises(ValueError, match="^secret_env: .*account 999999999999"):
        SandboxLauncherPolicy(new_stack(new_app()), "Far", project=far)


def test_a_gateway_secret_under_the_webhook_prefix_is_refused_by_name_or_arn() -> None:
    for secret in ("webhooks/sig", "arn:aws:secretsmanager:us-east-1:123456789012:secret:rayito/webhooks/sig-AbCdEf"):
        project = project_with("ganchos", tables={"gateways": {"model": {"secret": secret}}})
        with pytest.raises(ValueError, match="rayito/webhooks/"):
            SandboxLauncherPolicy(new_stack(new_app()), "Hooks", project=project)


def _toml_project(name: str, toml: str) -> AgentProject:
    """A product project with ``toml`` (text) over the base: tables of arrays as written."""
    from .projects import scratch, write_project

    return AgentProject.load(write_project(scratch("secrets-") / name, name=name, toml=toml))
