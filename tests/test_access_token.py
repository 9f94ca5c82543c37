"""The fleet's access token: made at deploy in Secrets Manager, never in the template, in the
product's token format, readable by whoever is granted it."""

from __future__ import annotations

import json
import secrets
import string

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match, Template

from rayito_constructs import AgentFleet, AgentProject, FleetStack
from rayito_constructs.access_token import TOKEN_LENGTH

from .cdk_helpers import lint_template, nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE


def test_the_secret_is_generated_at_deploy_and_named_after_the_fleet() -> None:
    app = new_app()
    stack = FleetStack(app, "Fleet", project=AgentProject.load(EXAMPLE), **stack_props())
    reader = iam.Role(stack, "Reader", assumed_by=iam.AccountRootPrincipal())
    stack.fleet.grant_read_access_token(reader)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::SecretsManager::Secret", {
        "Name": "rayito/agents/mi-agente/access-token",
        "GenerateSecretString": {"PasswordLength": 44, "ExcludePunctuation": True, "IncludeSpace": False},
    })
    assert all("SecretString" not in r["Properties"] for r in template.find_resources("AWS::SecretsManager::Secret").values())
    template.has_output("AccessTokenSecretName", {"Value": "rayito/agents/mi-agente/access-token"})
    granted = [s for p in template.find_resources("AWS::IAM::Policy").values()
               for s in p["Properties"]["PolicyDocument"]["Statement"]
               if "secretsmanager:GetSecretValue" in s["Action"] and "FleetAccessTokenSecret" in json.dumps(s["Resource"])]
    assert len(granted) == 1 and "secretsmanager:DescribeSecret" in granted[0]["Action"]
    assert lint_template(template) == [] and nag(app) == []


def test_the_generated_form_is_the_products_token_format() -> None:
    """44 characters of [A-Za-z0-9], as Secrets Manager generates them with these settings, are
    canonical base64url of 33 bytes: the product's own check accepts every such string."""
    from rayito._payload import access_token_sha256, validate_access_token

    alphabet = string.ascii_letters + string.digits
    for _ in range(200):
        token = "".join(secrets.choice(alphabet) for _ in range(TOKEN_LENGTH))
        assert validate_access_token(token) == token and len(access_token_sha256(token)) == 64


def test_an_imported_fleet_grants_its_token_by_name() -> None:
    app = new_app()
    stack = new_stack(app)
    role = iam.Role(stack, "Client", assumed_by=iam.AccountRootPrincipal())
    AgentFleet.from_fleet_name(stack, "Other", "otra").grant_read_access_token(role)
    statements = [s for p in Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    (statement,) = statements
    resource = json.dumps(statement["Resource"])
    assert "secret:rayito/agents/otra/access-token-??????" in resource


def test_a_customer_key_encrypts_the_token() -> None:
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), recipe_key=key)
    reader = iam.Role(stack, "Reader", assumed_by=iam.AccountRootPrincipal())
    fleet.grant_read_access_token(reader)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::SecretsManager::Secret", {"KmsKeyId": Match.any_value()})
    actions = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert "kms:Decrypt" in actions
    assert cdk.Token.is_unresolved(fleet.access_token.secret_arn)
