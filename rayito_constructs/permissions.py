"""Who may do what to a fleet: the IAM statements behind the three policies and the ``grant_*`` methods.

One source of truth: :class:`CallerPolicy`, :class:`ImagePublisherPolicy` and
:class:`SandboxLauncherPolicy` put these statements in managed policies, the reconciler's role takes
:func:`microvm_statements`, and ``AgentFleet.grant_invoke|grant_publish|grant_launch`` add the same
statements to a grantee. ``docs/iam.md`` explains each statement with its source.

What the statements rest on (``shared/research/rayito-ground-truth.md`` section 1, measured on a
real account unless said otherwise; ``microvms.md`` section 2):

* MicroVM actions have the prefix ``lambda:`` and the operation's name (``lambda:RunMicrovm``).
* **RunMicrovm is authorized on the unversioned image ARN**: a role allowed on one image got
  AccessDenied naming the other images' ARNs (Notes Q90, Q119). The other lifecycle actions are
  authorized through the MicroVM's image (docs); Rayito runs its whole suite with them on
  ``microvm-image:*``. Whether the service names a version in their resource is not measured, so
  they get the image ARN and its versions (``<arn>:*``): an image name has no ``:``, so that
  pattern reaches no other image.
* **CreateMicrovmImage is authorized on ``*``**, not on the new image's ARN (Q114): scoped to
  ``microvm-image:*`` it fails "on resource: *". UpdateMicrovmImage is evaluated on the image ARN.
* Create and update of an image need ``lambda:PassNetworkConnector`` on the managed
  ``INTERNET_EGRESS`` connector even when the request names none (Q114); every RunMicrovm passes
  the managed ``HTTP_INGRESS``/``INTERNET_EGRESS`` connectors (Notes section 10).
* ``ListMicrovms``, ``ListMicrovmImages`` and ``ListManagedMicrovmImages`` take no resource in the
  service model (no identifier in their URI): ``Resource: "*"``. ``ListManagedMicrovmImageVersions``
  does take one (the managed base image, ``/managed-microvm-images/{imageIdentifier}/versions``);
  what IAM evaluates it on is not measured, and Rayito grants it on ``*`` (its ``ListEverything``
  statement), which is what works: it keeps ``*`` under its own Sid with that reason.
* The recipe is a SecureString: with the AWS managed key ``aws/ssm`` no KMS permission is needed;
  with a customer key, ``kms:Encrypt`` to write it and ``kms:Decrypt`` to read it, only through
  SSM. Tables encrypted with the customer key take the key only through DynamoDB. Every KMS
  statement carries ``kms:ViaService``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import IConstruct

from .names import fleet_name_problem

#: The MicroVM lifecycle actions besides RunMicrovm: inspect, park, resume, kill, connect.
DRIVE_ACTIONS = (
    "lambda:GetMicrovm",
    "lambda:SuspendMicrovm",
    "lambda:ResumeMicrovm",
    "lambda:TerminateMicrovm",
    "lambda:CreateMicrovmAuthToken",
)
#: What a sandbox launcher (and the fleet client) does to MicroVMs: create, list, connect,
#: suspend, resume and kill.
MICROVM_ACTIONS = ("lambda:RunMicrovm", *DRIVE_ACTIONS)
LIST_ACTIONS = ("lambda:ListMicrovms",)
CREATE_IMAGE_ACTIONS = ("lambda:CreateMicrovmImage",)
#: Image actions evaluated on the image's ARN (or a version of it).
IMAGE_ACTIONS = (
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
#: Catalog lists whose operation names no resource at all.
IMAGE_CATALOG_ACTIONS = ("lambda:ListMicrovmImages", "lambda:ListManagedMicrovmImages")
MANAGED_IMAGE_VERSIONS_ACTIONS = ("lambda:ListManagedMicrovmImageVersions",)
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
#: What DynamoDB needs of a principal that reads and writes a table under a customer key (the
#: set of CDK's ``grant_read_write_data``, its ``*`` families spelled out), only through DynamoDB.
TABLE_KEY_ACTIONS = (
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:Encrypt",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
)
LAMBDA_SERVICE = "lambda.amazonaws.com"
#: The managed connector an image build passes even when the request names none (Q114).
BUILD_CONNECTOR = "INTERNET_EGRESS"

#: Why a statement may hold a wildcard resource, by Sid. cdk-nag acknowledges each such statement
#: on its own with this reason (``_nag.acknowledge_statements``), and docs/iam.md prints them.
STAR_REASONS = {
    "ListMicrovms": (
        "ListMicrovms names no resource (GET /2025-09-09/microvms, service model 2025-09-09): IAM takes "
        "Resource '*' (ground truth section 1: List* needs '*')"
    ),
    "CreateMicrovmImage": (
        "CreateMicrovmImage is authorized on '*', not on the new image's ARN: measured, scoped to "
        "microvm-image:* it failed 'on resource: *' (ground truth section 1, Notes Q114)"
    ),
    "MicrovmImageCatalog": (
        "ListMicrovmImages and ListManagedMicrovmImages name no resource in the service model: IAM takes "
        "Resource '*'"
    ),
    "ManagedImageVersions": (
        "ListManagedMicrovmImageVersions lists the AWS-managed base image's versions; which ARN IAM "
        "evaluates is not measured, and Rayito's working policy grants it on '*' (ground truth section 10)"
    ),
    "MicrovmsOnAnyImage": (
        "opt-out (scope_microvm_actions_to_image=False): MicroVM lifecycle actions on every image of the "
        "account, for accounts that need it; see docs/iam.md for the risk"
    ),
    "RunMicrovm": "the fleet's image only (every image account-wide: microvm-image:*)",
    "Microvms": (
        "the fleet's image and its versions (<image ARN>:*; a name has no ':', so no other image), "
        "every image account-wide"
    ),
    "MicrovmImages": "the fleet's image and its versions (<image ARN>:*), every image account-wide",
    "PassNetworkConnectors": (
        "the AWS-managed network connectors (aws-network-connector:*), passed by every RunMicrovm even "
        "when none is named (ground truth section 1)"
    ),
    "AgentRecipe": "every fleet's recipe (parameter/rayito/agents/*) in an account-wide policy",
    "AgentRecipeWrite": "every fleet's recipe (parameter/rayito/agents/*) in an account-wide policy",
    "ReadCodeArtifact": "the image's code artifact objects given by the caller",
}
#: Kept for code that predates the per-Sid reasons.
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


def wildcard_reasons(statements: Sequence[Statement]) -> dict[str, str]:
    """``{sid: reason}`` for the statements of this module that hold a wildcard resource."""
    return {s.sid: STAR_REASONS[s.sid] for s in statements if s.sid in STAR_REASONS}


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
    table_key_arn: Optional[str] = None
    code_object_arns: tuple[str, ...] = ()
    scope_microvm_actions_to_image: bool = True
    build_connector_arns: tuple[str, ...] = ()
    region: str = field(default=cdk.Aws.REGION)

    @property
    def image_arn(self) -> str:
        """The unversioned image ARN (``microvm-image:*`` account-wide)."""
        return self.image_arns[0]


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


def image_and_versions(image_arn: str) -> tuple[str, ...]:
    """``(<arn>, <arn>:*)``: one image and its versions; ``microvm-image:*`` stays as it is."""
    return (image_arn,) if image_arn.endswith(":*") else (image_arn, f"{image_arn}:*")


def managed_connector_arn(stack: cdk.Stack, name: str = "*") -> str:
    """An AWS-managed network connector of the stack's region (``*``: every one of them)."""
    return f"arn:{stack.partition}:lambda:{stack.region}:aws:network-connector:aws-network-connector:{name}"


def source_arn_condition(stack: cdk.Stack, image_arn: str) -> dict[str, dict[str, Any]]:
    """The confused-deputy conditions of a role the MicroVMs service assumes for one image.

    ``aws:SourceAccount`` equals the account, and ``aws:SourceArn`` is the image's ARN or one of
    its versions (``<arn>:*``): never a name prefix, which would also match ``<name>-dev``.
    """
    return {
        "StringEquals": {"aws:SourceAccount": stack.account},
        "ArnLike": {"aws:SourceArn": list(image_and_versions(image_arn))},
    }


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
    table_key_arn: Optional[str] = None,
    code_object_arns: Sequence[str] = (),
    scope_microvm_actions_to_image: bool = True,
    build_network_connectors: Sequence[str] = (),
) -> FleetAccess:
    """Gather the ARNs for one fleet (``fleet_name``) or, with ``fleet_name=None``, every fleet.

    The name and the connector ARNs end up in resource ARNs: a name such as ``""`` (every fleet),
    ``"a*"`` (every image whose name starts with ``a``) or a connector ``"*"`` would widen the
    statements silently, so they are refused here with one line (audit round 9).
    """
    _check_access_inputs(fleet_name, network_connectors, build_network_connectors, code_object_arns)
    _check_image_arn(image_arn)
    stack = cdk.Stack.of(scope)
    image = image_arn or image_arn_for(stack, fleet_name)
    return FleetAccess(
        recipe_parameter_arns=(recipe_parameter_arn(stack, fleet_name),),
        image_arns=image_and_versions(image),
        managed_connector_arn=managed_connector_arn(stack),
        network_connector_arns=tuple(network_connectors),
        execution_role_arn=execution_role.role_arn if execution_role else None,
        build_role_arn=build_role.role_arn if build_role else None,
        recipe_key_arn=recipe_key_arn,
        table_arn=table_arn,
        table_key_arn=table_key_arn if table_arn else None,
        code_object_arns=tuple(code_object_arns),
        scope_microvm_actions_to_image=scope_microvm_actions_to_image,
        build_connector_arns=(managed_connector_arn(stack, BUILD_CONNECTOR), *build_network_connectors),
        region=stack.region,
    )


_CONNECTOR_ARN = re.compile(r"arn:[a-z-]+:lambda:[a-z0-9-]+:([0-9]{12}|aws):network-connector:[A-Za-z0-9_.:/-]+")


def _check_access_inputs(
    fleet_name: Optional[str],
    network_connectors: Sequence[str],
    build_network_connectors: Sequence[str],
    code_object_arns: Sequence[str],
) -> None:
    """One line per mistake in what becomes a resource ARN (what, the value, what is allowed)."""
    if fleet_name is not None and not (isinstance(fleet_name, str) and cdk.Token.is_unresolved(fleet_name)):
        problem = fleet_name_problem(fleet_name)
        if problem:
            raise ValueError(f"fleet_name: {problem}; None means every fleet of the account")
    for option, arns in (("network_connectors", network_connectors),
                         ("build_network_connectors", build_network_connectors),
                         ("code_object_arns", code_object_arns)):
        if isinstance(arns, str) or not isinstance(arns, (list, tuple)):
            raise ValueError(f"{option}: {arns!r} is not a list of ARNs (give [{arns!r}] for one)")
        for arn in arns:
            if not isinstance(arn, str):
                raise ValueError(f"{option}: {arn!r} is not an ARN string")
            if cdk.Token.is_unresolved(arn):
                continue
            if option == "code_object_arns":
                continue  # S3 object ARNs, a key prefix with '*' allowed (ReadCodeArtifact's reason)
            if "*" in arn or "?" in arn:
                raise ValueError(f"{option}: {arn!r} holds a wildcard; name each connector exactly")
            if not _CONNECTOR_ARN.fullmatch(arn):
                raise ValueError(
                    f"{option}: {arn!r} is not a network connector ARN "
                    "(arn:<partition>:lambda:<region>:<account>:network-connector:<name>)")


_IMAGE_ARN = re.compile(r"arn:[a-z-]+:lambda:[a-z0-9-]+:[0-9]{12}:microvm-image:(?:[A-Za-z0-9_-]{1,64}|\*)")


def _check_image_arn(image_arn: Optional[str]) -> None:
    """The unversioned ARN of one image (``microvm-image:<name>``), or ``microvm-image:*`` for
    every image: RunMicrovm is authorized on the unversioned ARN (measured, GT section 1), so a
    version (``:3``) would be denied, and a name pattern (``x*``) is the prefix #12 removed."""
    if image_arn is None or (isinstance(image_arn, str) and cdk.Token.is_unresolved(image_arn)):
        return
    if not isinstance(image_arn, str) or not _IMAGE_ARN.fullmatch(image_arn):
        raise ValueError(
            f"image_arn: {image_arn!r} is not an unversioned MicroVM image ARN "
            "(arn:<partition>:lambda:<region>:<account>:microvm-image:<name>, or microvm-image:* for every image)")


def pass_role(sid: str, role_arn: str) -> Statement:
    """``iam:PassRole`` on one role, only to the Lambda (MicroVMs) service."""
    return Statement(
        sid, ("iam:PassRole",), (role_arn,), {"StringEquals": {"iam:PassedToService": LAMBDA_SERVICE}}
    )


def via(service: str, region: str) -> dict[str, dict[str, str]]:
    """``kms:ViaService`` for one AWS service of the region."""
    return {"StringEquals": {"kms:ViaService": f"{service}.{region}.amazonaws.com"}}


def _recipe_key(sid: str, actions: tuple[str, ...], access: FleetAccess) -> list[Statement]:
    if not access.recipe_key_arn:
        return []  # the AWS managed key aws/ssm needs no KMS permission
    return [Statement(sid, actions, (access.recipe_key_arn,), via("ssm", access.region))]


def table_key_statement(sid: str, key_arns: str | Sequence[str], region: str) -> Statement:
    """Use customer keys only through DynamoDB, for reading and writing their tables."""
    keys = (key_arns,) if isinstance(key_arns, str) else tuple(key_arns)
    return Statement(sid, TABLE_KEY_ACTIONS, keys, via("dynamodb", region))


def microvm_statements(access: FleetAccess) -> list[Statement]:
    """What creating and handling MicroVMs needs, RunMicrovm's dependent permissions included."""
    statements = [Statement("ListMicrovms", LIST_ACTIONS, ("*",))]
    if access.scope_microvm_actions_to_image:
        statements += [
            Statement("RunMicrovm", ("lambda:RunMicrovm",), (access.image_arn,)),
            Statement("Microvms", DRIVE_ACTIONS, access.image_arns),
        ]
    else:
        statements.append(Statement("MicrovmsOnAnyImage", MICROVM_ACTIONS, ("*",)))
    statements.append(
        Statement(
            "PassNetworkConnectors",
            ("lambda:PassNetworkConnector",),
            (access.managed_connector_arn, *access.network_connector_arns),
        )
    )
    if access.execution_role_arn:
        statements.append(pass_role("PassExecutionRole", access.execution_role_arn))
    return statements


def _metadata_index(access: FleetAccess) -> list[Statement]:
    if not access.table_arn:
        return []
    statements = [Statement("MetadataIndex", TABLE_DATA_ACTIONS, (access.table_arn,))]
    if access.table_key_arn:
        statements.append(table_key_statement("MetadataIndexKey", access.table_key_arn, access.region))
    return statements


def launcher_statements(access: FleetAccess) -> list[Statement]:
    """SandboxLauncherPolicy: create, list, connect to, suspend, resume and kill sandboxes, and
    the AgentRecipe statement (read and delete the recipe, never write it)."""
    return [
        *microvm_statements(access),
        Statement("AgentRecipe", RECIPE_READ_DELETE, access.recipe_parameter_arns),
        *_recipe_key("AgentRecipeKey", ("kms:Decrypt",), access),
        *_metadata_index(access),
    ]


def caller_statements(access: FleetAccess) -> list[Statement]:
    """CallerPolicy: the deployer and the fleet client route, connect and grow the fleet, and
    save, read and delete its recipe."""
    return [
        *microvm_statements(access),
        Statement("AgentRecipe", RECIPE_READ_DELETE, access.recipe_parameter_arns),
        Statement("AgentRecipeWrite", RECIPE_WRITE, access.recipe_parameter_arns),
        *_recipe_key("AgentRecipeKey", ("kms:Decrypt", "kms:Encrypt"), access),
        *_metadata_index(access),
    ]


def publisher_statements(access: FleetAccess) -> list[Statement]:
    """ImagePublisherPolicy: create, update and manage MicroVM images, their versions and builds,
    pass the build role and the build's network connector, read the code artifact, and save the
    recipe."""
    statements = [
        Statement("CreateMicrovmImage", CREATE_IMAGE_ACTIONS, ("*",)),
        Statement("MicrovmImages", IMAGE_ACTIONS, access.image_arns),
        Statement("MicrovmImageCatalog", IMAGE_CATALOG_ACTIONS, ("*",)),
        Statement("ManagedImageVersions", MANAGED_IMAGE_VERSIONS_ACTIONS, ("*",)),
        Statement("PassBuildNetworkConnectors", ("lambda:PassNetworkConnector",), access.build_connector_arns),
    ]
    if access.build_role_arn:
        statements.append(pass_role("PassBuildRole", access.build_role_arn))
    if access.code_object_arns:
        statements.append(Statement("ReadCodeArtifact", ("s3:GetObject",), access.code_object_arns))
    statements.append(Statement("AgentRecipeWrite", RECIPE_WRITE, access.recipe_parameter_arns))
    statements.extend(_recipe_key("AgentRecipeKey", ("kms:Encrypt",), access))
    return statements


def grant_all(statements: Sequence[Statement], grantee: iam.IGrantable, scope: IConstruct) -> iam.Grant:
    """Add every statement to ``grantee``'s policy; one combined :class:`iam.Grant`."""
    grants = [s.grant(grantee, scope) for s in statements]
    return functools.reduce(lambda combined, grant: combined.combine(grant), grants)
