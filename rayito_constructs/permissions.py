"""Who may do what to a fleet: the IAM statements behind the three policies and the ``grant_*`` methods.

One source of truth: :class:`CallerPolicy`, :class:`ImagePublisherPolicy` and
:class:`SandboxLauncherPolicy` put these statements in managed policies, and
``AgentFleet.grant_invoke|grant_publish|grant_launch`` add the same statements to a grantee.

Facts the statements rest on (``shared/research/microvms.md``, section 2):

* MicroVM actions have the prefix ``lambda:`` and the operation's name (``lambda:RunMicrovm``).
* RunMicrovm also needs ``lambda:PassNetworkConnector`` on every call (the AWS-managed
  ``HTTP_INGRESS`` and ``INTERNET_EGRESS`` connectors are passed implicitly) and ``iam:PassRole`` on
  the execution role, with ``iam:PassedToService = lambda.amazonaws.com``.
* ``lambda:ListMicrovms`` and the image catalog lists act on no resource: ``Resource: "*"``.
* Whether the MicroVM lifecycle actions support resource-level permissions is not settled: one
  published library says they are permission-only, others scope them to the image ARN. The
  default is ``"*"``; ``scope_microvm_actions_to_image=True`` scopes them to the image ARN and its
  versions (``<image ARN>`` and ``<image ARN>:*``).
* The recipe is a SecureString: with the AWS managed key ``aws/ssm`` no KMS permission is needed;
  with a customer key, ``kms:Encrypt`` to write it and ``kms:Decrypt`` to read it, only through SSM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import IConstruct

#: What a sandbox launcher (and the fleet client) does to MicroVMs: create, list, connect,
#: suspend, resume and kill.
MICROVM_ACTIONS = (
    "lambda:RunMicrovm",
    "lambda:GetMicrovm",
    "lambda:SuspendMicrovm",
    "lambda:ResumeMicrovm",
    "lambda:TerminateMicrovm",
    "lambda:CreateMicrovmAuthToken",
)
LIST_ACTIONS = ("lambda:ListMicrovms",)
IMAGE_ACTIONS = (
    "lambda:CreateMicrovmImage",
    "lambda:UpdateMicrovmImage",
    "lambda:DeleteMicrovmImage",
    "lambda:GetMicrovmImage",
    "lambda:GetMicrovmImageVersion",
    "lambda:UpdateMicrovmImageVersion",
    "lambda:DeleteMicrovmImageVersion",
    "lambda:ListMicrovmImageVersions",
    "lambda:GetMicrovmImageBuild",
    "lambda:ListMicrovmImageBuilds",
    "lambda:TagResource",
    "lambda:UntagResource",
    "lambda:ListTags",
)
IMAGE_CATALOG_ACTIONS = (
    "lambda:ListMicrovmImages",
    "lambda:ListManagedMicrovmImages",
    "lambda:ListManagedMicrovmImageVersions",
)
RECIPE_READ_DELETE = ("ssm:GetParameter", "ssm:DeleteParameter")
RECIPE_WRITE = ("ssm:PutParameter",)
TABLE_DATA_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:ConditionCheckItem",
)
LAMBDA_SERVICE = "lambda.amazonaws.com"

#: Why a statement may use ``Resource: "*"``; printed in docs/iam.md and in the cdk-nag
#: acknowledgements that sit next to each policy.
STAR_REASONS = {
    "ListMicrovms": "ListMicrovms acts on no resource: IAM only accepts Resource '*'",
    "MicrovmImageCatalog": "the image catalog lists act on no resource: IAM only accepts Resource '*'",
    "Microvms": (
        "whether MicroVM lifecycle actions support resource-level permissions is unconfirmed (sources "
        "disagree); scope_microvm_actions_to_image=True scopes them to the image ARN"
    ),
}
WILDCARD_REASON = (
    "a wildcard only where a set is meant: the versions of one image (<image ARN>:*), the AWS-managed "
    "network connectors, or every fleet's recipe (parameter/rayito/agents/*) in an account-wide policy"
)


@dataclass(frozen=True)
class Statement:
    """A policy statement in a form that becomes a ``PolicyStatement`` or an ``iam.Grant``."""

    sid: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: Optional[Mapping[str, Mapping[str, Any]]] = None

    def to_policy_statement(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid=self.sid,
            actions=list(self.actions),
            resources=list(self.resources),
            conditions=dict(self.conditions) if self.conditions else None,
        )

    def grant(self, grantee: iam.IGrantable, scope: IConstruct) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(self.actions),
            resource_arns=list(self.resources),
            conditions=dict(self.conditions) if self.conditions else None,
        )


@dataclass(frozen=True)
class FleetAccess:
    """The ARNs one set of permissions is about: one fleet, or every fleet of the account.

    Build it with :func:`fleet_access`.
    """

    recipe_parameter_arns: tuple[str, ...]
    image_arns: tuple[str, ...]
    managed_connector_arn: str
    network_connector_arns: tuple[str, ...] = ()
    execution_role_arn: Optional[str] = None
    build_role_arn: Optional[str] = None
    recipe_key_arn: Optional[str] = None
    table_arn: Optional[str] = None
    code_object_arns: tuple[str, ...] = ()
    scope_microvm_actions_to_image: bool = False
    region: str = field(default=cdk.Aws.REGION)


def recipe_parameter_arn(stack: cdk.Stack, fleet_name: Optional[str]) -> str:
    """The recipe parameter of one fleet, or ``parameter/rayito/agents/*`` for every fleet."""
    resource_name = f"rayito/agents/{fleet_name}/recipe" if fleet_name else "rayito/agents/*"
    return stack.format_arn(service="ssm", resource="parameter", resource_name=resource_name)


def image_arn_for(stack: cdk.Stack, image_name: Optional[str]) -> str:
    """The ARN of a MicroVM image of this account and region (``*`` for every image)."""
    return stack.format_arn(
        service="lambda",
        resource="microvm-image",
        resource_name=image_name or "*",
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )


def fleet_access(
    scope: IConstruct,
    *,
    fleet_name: Optional[str] = None,
    image_arn: Optional[str] = None,
    execution_role: Optional[iam.IRole] = None,
    build_role: Optional[iam.IRole] = None,
    network_connectors: Sequence[str] = (),
    recipe_key_arn: Optional[str] = None,
    table_arn: Optional[str] = None,
    code_object_arns: Sequence[str] = (),
    scope_microvm_actions_to_image: bool = False,
) -> FleetAccess:
    """Gather the ARNs for one fleet (``fleet_name``) or, with ``fleet_name=None``, every fleet."""
    stack = cdk.Stack.of(scope)
    image = image_arn or image_arn_for(stack, fleet_name)
    images = (image,) if image.endswith(":*") else (image, f"{image}:*")
    managed = (
        f"arn:{stack.partition}:lambda:{stack.region}:aws:network-connector:aws-network-connector:*"
    )
    return FleetAccess(
        recipe_parameter_arns=(recipe_parameter_arn(stack, fleet_name),),
        image_arns=images,
        managed_connector_arn=managed,
        network_connector_arns=tuple(network_connectors),
        execution_role_arn=execution_role.role_arn if execution_role else None,
        build_role_arn=build_role.role_arn if build_role else None,
        recipe_key_arn=recipe_key_arn,
        table_arn=table_arn,
        code_object_arns=tuple(code_object_arns),
        scope_microvm_actions_to_image=scope_microvm_actions_to_image,
        region=stack.region,
    )


def _pass_role(sid: str, role_arn: str) -> Statement:
    return Statement(
        sid, ("iam:PassRole",), (role_arn,), {"StringEquals": {"iam:PassedToService": LAMBDA_SERVICE}}
    )


def _kms(sid: str, actions: tuple[str, ...], access: FleetAccess) -> list[Statement]:
    if not access.recipe_key_arn:
        return []  # the AWS managed key aws/ssm needs no KMS permission
    via = {"StringEquals": {"kms:ViaService": f"ssm.{access.region}.amazonaws.com"}}
    return [Statement(sid, actions, (access.recipe_key_arn,), via)]


def microvm_statements(access: FleetAccess) -> list[Statement]:
    """What creating and handling MicroVMs needs, RunMicrovm's dependent permissions included."""
    microvm_resources = access.image_arns if access.scope_microvm_actions_to_image else ("*",)
    statements = [
        Statement("ListMicrovms", LIST_ACTIONS, ("*",)),
        Statement("Microvms", MICROVM_ACTIONS, microvm_resources),
        Statement(
            "PassNetworkConnectors",
            ("lambda:PassNetworkConnector",),
            (access.managed_connector_arn, *access.network_connector_arns),
        ),
    ]
    if access.execution_role_arn:
        statements.append(_pass_role("PassExecutionRole", access.execution_role_arn))
    return statements


def _metadata_index(access: FleetAccess) -> list[Statement]:
    if not access.table_arn:
        return []
    return [Statement("MetadataIndex", TABLE_DATA_ACTIONS, (access.table_arn,))]


def launcher_statements(access: FleetAccess) -> list[Statement]:
    """SandboxLauncherPolicy: create, list, connect to, suspend, resume and kill sandboxes, and
    the AgentRecipe statement (read and delete the recipe, never write it)."""
    return [
        *microvm_statements(access),
        Statement("AgentRecipe", RECIPE_READ_DELETE, access.recipe_parameter_arns),
        *_kms("AgentRecipeKey", ("kms:Decrypt",), access),
        *_metadata_index(access),
    ]


def caller_statements(access: FleetAccess) -> list[Statement]:
    """CallerPolicy: the deployer and the fleet client route, connect and grow the fleet, and
    save, read and delete its recipe."""
    return [
        *microvm_statements(access),
        Statement("AgentRecipe", RECIPE_READ_DELETE, access.recipe_parameter_arns),
        Statement("AgentRecipeWrite", RECIPE_WRITE, access.recipe_parameter_arns),
        *_kms("AgentRecipeKey", ("kms:Decrypt", "kms:Encrypt"), access),
        *_metadata_index(access),
    ]


def publisher_statements(access: FleetAccess) -> list[Statement]:
    """ImagePublisherPolicy: create, update and manage MicroVM images, their versions and builds,
    pass the build role, read the code artifact, and save the recipe."""
    statements = [
        Statement("MicrovmImages", IMAGE_ACTIONS, access.image_arns),
        Statement("MicrovmImageCatalog", IMAGE_CATALOG_ACTIONS, ("*",)),
    ]
    if access.build_role_arn:
        statements.append(_pass_role("PassBuildRole", access.build_role_arn))
    if access.code_object_arns:
        statements.append(Statement("ReadCodeArtifact", ("s3:GetObject",), access.code_object_arns))
    statements.append(Statement("AgentRecipeWrite", RECIPE_WRITE, access.recipe_parameter_arns))
    statements.extend(_kms("AgentRecipeKey", ("kms:Encrypt",), access))
    return statements


def grant_all(statements: Sequence[Statement], grantee: iam.IGrantable, scope: IConstruct) -> iam.Grant:
    """Add every statement to ``grantee``'s policy; one combined :class:`iam.Grant`."""
    grants = [s.grant(grantee, scope) for s in statements]
    return functools.reduce(lambda combined, grant: combined.combine(grant), grants)
