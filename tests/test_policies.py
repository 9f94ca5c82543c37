"""The three managed policies, statement by statement."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template

from rayito_constructs import CallerPolicy, ImagePublisherPolicy, SandboxLauncherPolicy

from .cdk_helpers import lint_template, nag, new_app, new_stack

ACCOUNT_ARN = "arn:aws:{service}:us-east-1:123456789012:{rest}"
RECIPE = ACCOUNT_ARN.format(service="ssm", rest="parameter/rayito/agents/mi-agente/recipe")
ALL_RECIPES = ACCOUNT_ARN.format(service="ssm", rest="parameter/rayito/agents/*")
IMAGE = ACCOUNT_ARN.format(service="lambda", rest="microvm-image:mi-agente")
MANAGED_CONNECTORS = "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:*"
MICROVM_ACTIONS = [
    "lambda:CreateMicrovmAuthToken",
    "lambda:GetMicrovm",
    "lambda:ResumeMicrovm",
    "lambda:RunMicrovm",
    "lambda:SuspendMicrovm",
    "lambda:TerminateMicrovm",
]


def statements(template: Template, logical_prefix: str) -> dict[str, dict[str, Any]]:
    """The statements of one managed policy, by Sid, resolved against the test stack."""
    policies = template.find_resources("AWS::IAM::ManagedPolicy")
    (doc,) = [p["Properties"]["PolicyDocument"] for k, p in policies.items() if k.startswith(logical_prefix)]
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    assert len(by_sid) == len(doc["Statement"]), "every statement has its own Sid"
    return by_sid


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.fixture(scope="module")
def fleet_scoped() -> tuple[cdk.App, Template]:
    app = new_app()
    stack = new_stack(app)
    role = iam.Role(stack, "ExecRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    build = iam.Role(stack, "BuildRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    common = dict(fleet_name="mi-agente", execution_role=role)
    CallerPolicy(stack, "Caller", **common)
    SandboxLauncherPolicy(stack, "Launcher", **common)
    ImagePublisherPolicy(
        stack, "Publisher", fleet_name="mi-agente", build_role=build,
        code_object_arns=["arn:aws:s3:::assets-bucket/mi-agente/*"],
    )
    return app, Template.from_stack(stack)


def test_launcher_statements(fleet_scoped) -> None:
    s = statements(fleet_scoped[1], "Launcher")
    assert set(s) == {"ListMicrovms", "Microvms", "PassNetworkConnectors", "PassExecutionRole", "AgentRecipe"}
    assert s["ListMicrovms"]["Action"] == "lambda:ListMicrovms" and s["ListMicrovms"]["Resource"] == "*"
    assert sorted(s["Microvms"]["Action"]) == MICROVM_ACTIONS and s["Microvms"]["Resource"] == "*"
    assert s["PassNetworkConnectors"]["Action"] == "lambda:PassNetworkConnector"
    assert s["PassNetworkConnectors"]["Resource"] == MANAGED_CONNECTORS
    assert s["PassExecutionRole"]["Action"] == "iam:PassRole"
    assert s["PassExecutionRole"]["Resource"]["Fn::GetAtt"][0].startswith("ExecRole")
    assert s["PassExecutionRole"]["Condition"] == {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}
    # The AgentRecipe statement: read and delete, never write.
    assert sorted(s["AgentRecipe"]["Action"]) == ["ssm:DeleteParameter", "ssm:GetParameter"]
    assert s["AgentRecipe"]["Resource"] == RECIPE


def test_launcher_never_writes_the_recipe(fleet_scoped) -> None:
    actions = [a for st in statements(fleet_scoped[1], "Launcher").values() for a in as_list(st["Action"])]
    assert "ssm:PutParameter" not in actions


def test_caller_statements(fleet_scoped) -> None:
    s = statements(fleet_scoped[1], "Caller")
    assert set(s) == {
        "ListMicrovms", "Microvms", "PassNetworkConnectors", "PassExecutionRole", "AgentRecipe", "AgentRecipeWrite",
    }
    assert sorted(s["Microvms"]["Action"]) == MICROVM_ACTIONS
    assert s["AgentRecipeWrite"] == {
        "Sid": "AgentRecipeWrite", "Effect": "Allow", "Action": "ssm:PutParameter", "Resource": RECIPE,
    }


def test_publisher_statements(fleet_scoped) -> None:
    s = statements(fleet_scoped[1], "Publisher")
    assert set(s) == {"MicrovmImages", "MicrovmImageCatalog", "PassBuildRole", "ReadCodeArtifact", "AgentRecipeWrite"}
    assert s["MicrovmImages"]["Resource"] == [IMAGE, IMAGE + ":*"]
    assert "lambda:CreateMicrovmImage" in s["MicrovmImages"]["Action"]
    assert "lambda:UpdateMicrovmImageVersion" in s["MicrovmImages"]["Action"]
    assert "lambda:RunMicrovm" not in s["MicrovmImages"]["Action"]
    assert sorted(s["MicrovmImageCatalog"]["Action"]) == [
        "lambda:ListManagedMicrovmImageVersions", "lambda:ListManagedMicrovmImages", "lambda:ListMicrovmImages",
    ]
    assert s["PassBuildRole"]["Resource"]["Fn::GetAtt"][0].startswith("BuildRole")
    assert s["PassBuildRole"]["Condition"] == {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}
    assert s["ReadCodeArtifact"]["Action"] == "s3:GetObject"
    assert s["AgentRecipeWrite"]["Action"] == "ssm:PutParameter" and s["AgentRecipeWrite"]["Resource"] == RECIPE


def test_no_service_wildcards_and_star_only_where_justified(fleet_scoped) -> None:
    app, template = fleet_scoped
    for prefix in ("Caller", "Launcher", "Publisher"):
        for sid, st in statements(template, prefix).items():
            assert all("*" not in a for a in as_list(st["Action"])), (prefix, sid)
            assert all(not a.startswith("lambda-microvms:") for a in as_list(st["Action"]))
            if "*" in as_list(st["Resource"]):
                assert sid in {"ListMicrovms", "Microvms", "MicrovmImageCatalog"}, (prefix, sid)
    assert nag(app) == []
    assert lint_template(template) == []


def test_account_wide_policies() -> None:
    app = new_app()
    stack = new_stack(app)
    CallerPolicy(stack, "Caller")
    SandboxLauncherPolicy(stack, "Launcher")
    ImagePublisherPolicy(stack, "Publisher")
    template = Template.from_stack(stack)
    assert statements(template, "Launcher")["AgentRecipe"]["Resource"] == ALL_RECIPES
    assert statements(template, "Caller")["AgentRecipeWrite"]["Resource"] == ALL_RECIPES
    every_image = ACCOUNT_ARN.format(service="lambda", rest="microvm-image:*")
    assert statements(template, "Publisher")["MicrovmImages"]["Resource"] == every_image
    assert "PassExecutionRole" not in statements(template, "Launcher")
    assert nag(app) == [] and lint_template(template) == []


def test_scope_microvm_actions_to_image() -> None:
    app = new_app()
    stack = new_stack(app)
    SandboxLauncherPolicy(stack, "Launcher", fleet_name="mi-agente", scope_microvm_actions_to_image=True)
    s = statements(Template.from_stack(stack), "Launcher")
    assert s["Microvms"]["Resource"] == [IMAGE, IMAGE + ":*"]
    assert s["ListMicrovms"]["Resource"] == "*"  # ListMicrovms has no resource either way
    assert nag(app) == []


def test_customer_key_and_metadata_table() -> None:
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    table = dynamodb.Table.from_table_name(stack, "Index", "sessions")
    connectors = ["arn:aws:lambda:us-east-1:123456789012:network-connector:nc-1"]
    common = dict(fleet_name="mi-agente", recipe_key=key, metadata_table=table, network_connectors=connectors)
    CallerPolicy(stack, "Caller", **common)
    SandboxLauncherPolicy(stack, "Launcher", **common)
    ImagePublisherPolicy(stack, "Publisher", **common)
    template = Template.from_stack(stack)
    via = {"StringEquals": {"kms:ViaService": "ssm.us-east-1.amazonaws.com"}}
    launcher, caller, publisher = (statements(template, p) for p in ("Launcher", "Caller", "Publisher"))
    assert launcher["AgentRecipeKey"]["Action"] == "kms:Decrypt" and launcher["AgentRecipeKey"]["Condition"] == via
    assert sorted(caller["AgentRecipeKey"]["Action"]) == ["kms:Decrypt", "kms:Encrypt"]
    assert publisher["AgentRecipeKey"]["Action"] == "kms:Encrypt"
    table_arn = "arn:aws:dynamodb:us-east-1:123456789012:table/sessions"
    assert launcher["MetadataIndex"]["Resource"] == table_arn and caller["MetadataIndex"]["Resource"] == table_arn
    assert "MetadataIndex" not in publisher
    assert "dynamodb:PutItem" in launcher["MetadataIndex"]["Action"]
    assert sorted(launcher["PassNetworkConnectors"]["Resource"]) == sorted([MANAGED_CONNECTORS, connectors[0]])


def test_default_key_needs_no_kms(fleet_scoped) -> None:
    for prefix in ("Caller", "Launcher", "Publisher"):
        actions = [a for st in statements(fleet_scoped[1], prefix).values() for a in as_list(st["Action"])]
        assert not [a for a in actions if a.startswith("kms:")]
