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
* **What the product's client and CLI call** (``rayito`` 0.17.1, recorded on every path by
  ``tests/test_product_iam.py`` and shown per path in docs/iam.md) decides the three managed
  policies: the launcher runs and drives sessions (connect, status, invoke, stream, stop, warm
  slots, gateways, ``secret_env``, the session index), the publisher publishes the fleet's image
  (``rayito image publish``, ``rayito agent build``, ``rayito image prune``), the caller does both
  and deploys (``rayito agent deploy --renew-gateway-keys``). Nothing a path does not call: the
  client sends no ``executionRoleArn`` (``deploy_create_args``), so neither policy passes the
  execution role (the reconciler's role does); no path deletes or tags an image.
* The recipe is a SecureString: with the AWS managed key ``aws/ssm`` no KMS permission is needed;
  with a customer key, ``kms:Encrypt`` to write it and ``kms:Decrypt`` to read it, only through
  SSM. Tables encrypted with the customer key take the key only through DynamoDB. Every KMS
  statement carries ``kms:ViaService``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import IConstruct

from .model.names import fleet_name_problem
from .model.secrets import SessionSecrets, session_secrets  # noqa: F401 - re-exported

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
#: The image actions a publisher's paths call on the fleet's image (publish, build, prune): no
#: DeleteMicrovmImage (prune deletes versions, never the image), no tags (no path sends any).
PUBLISH_IMAGE_ACTIONS = (
    "lambda:UpdateMicrovmImage",
    "lambda:GetMicrovmImage",
    "lambda:GetMicrovmImageVersion",
    "lambda:UpdateMicrovmImageVersion",
    "lambda:DeleteMicrovmImageVersion",
    "lambda:ListMicrovmImageVersions",
    "lambda:GetMicrovmImageBuild",
    "lambda:ListMicrovmImageBuilds",
)
#: What ``rayito agent build`` reads of its base image (``rayito-base-caps``): its versions.
BASE_IMAGE_ACTIONS = ("lambda:GetMicrovmImage", "lambda:ListMicrovmImageVersions", "lambda:GetMicrovmImageVersion")
#: The product's metadata index (``rayito._index.IAM_ACTIONS``): a writer puts, a reader batch-gets.
INDEX_WRITE = ("dynamodb:PutItem",)
INDEX_READ = ("dynamodb:BatchGetItem",)
LAMBDA_SERVICE = "lambda.amazonaws.com"
#: The build role ``rayito setup`` makes (the product's ``_stacks/_templates/iam.yaml``, ``BuildRole``:
#: ``RoleName: !Sub rayito-m0-build-${AWS::Region}``): ``rayito-base-caps`` is built with it, and
#: ``rayito agent build`` passes the base's build role (``_templates/_build.py``: the body inherits
#: ``buildRoleArn``). tests/test_product_iam.py reads the product's template to keep this true.
PRODUCT_BUILD_ROLE_NAME = "rayito-m0-build-{region}"
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
    "ServeMicrovms": (
        "the fleet's VMs, authorized through its image and its versions (<image ARN>:*), every image account-wide"
    ),
    "PassNetworkConnectors": (
        "the AWS-managed network connectors (aws-network-connector:*), passed by every RunMicrovm even "
        "when none is named (ground truth section 1)"
    ),
    "AgentRecipe": "every fleet's recipe (parameter/rayito/agents/*) in an account-wide policy",
    "AgentRecipeWrite": "every fleet's recipe (parameter/rayito/agents/*) in an account-wide policy",
    "BaseImage": "the base image rayito agent build builds on (rayito-base-caps) and its versions (<image ARN>:*)",
    "PassBuildNetworkConnectors": (
        "the AWS-managed network connectors (aws-network-connector:*): an image build passes INTERNET_EGRESS even "
        "when it names none (measured, Q114), a build inherits its base's connectors"
    ),
    "UploadArtifacts": (
        "the product's artifact keys in the artifact bucket (rayito/images/* for rayito image publish, "
        "rayito/templates/* for rayito agent build): content-addressed zips whose names are known only at run time"
    ),
    "BuildLogs": "the build log group of the fleet's image (/rayito/<image>, the product's) and its streams",
    "ReadBaseArtifacts": (
        "the base images' zips in the artifact bucket (rayito/images/*, content-addressed by rayito image publish): "
        "which one a base's version names is known only at deploy (ImageComposer)"
    ),
    "ComposedArtifacts": (
        "one image's zips composed at deploy (rayito/templates/<image>/* of the asset bucket), named by their "
        "sha256, known only at deploy (ImageComposer)"
    ),
    "ReadCode": "the agent image's zips composed at deploy (rayito/templates/<image>/*), named by their sha256",
    "AccessToken": "every fleet's access token (rayito/agents/*/access-token) in an account-wide policy",
    "GatewaySecrets": "every secret under the product's prefix rayito/ in an account-wide policy (webhook signing secrets denied)",
    "NeverWebhookSigningSecrets": "a Deny: the product's webhook signing secrets are never read by a session",
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
    deny: bool = False

    def to_policy_statement(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            sid=self.sid,
            effect=iam.Effect.DENY if self.deny else iam.Effect.ALLOW,
            actions=list(self.actions),
            resources=list(self.resources),
            conditions=dict(self.conditions) if self.conditions else None,
        )

    def grant(self, grantee: iam.IGrantable, scope: IConstruct) -> iam.Grant:
        if self.deny:
            raise ValueError(f"{self.sid}: a Deny statement is not a grant (it belongs in a managed policy)")
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
    scope_microvm_actions_to_image: bool = True
    build_connector_arns: tuple[str, ...] = ()
    region: str = field(default=cdk.Aws.REGION)
    access_token_secret_arn: Optional[str] = None
    gateway_secret_arns: tuple[str, ...] = ()
    renewed_secret_arns: tuple[str, ...] = ()
    secret_env_arns: tuple[str, ...] = ()
    secret_key_arns: tuple[str, ...] = ()
    artifact_bucket_arn: Optional[str] = None
    base_image_arns: tuple[str, ...] = ()
    build_role_arns: tuple[str, ...] = ()
    build_log_group_arns: tuple[str, ...] = ()
    account_wide: bool = False

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


def secret_arn_for(stack: cdk.Stack, secret_id: str) -> tuple[str, ...]:
    """What a policy names for a secret the product reads by ``secret_id`` (``SecretId``): a name
    gets its ARN with the six random characters Secrets Manager appends (``<name>-??????``, never
    ``<name>*``, which would also reach ``<name>-old``); an ARN is taken as it is, and with the
    suffix in case it is a partial one."""
    if secret_id.startswith("arn:"):
        return (secret_id,) if cdk.Token.is_unresolved(secret_id) else (secret_id, f"{secret_id}-??????")
    return (stack.format_arn(service="secretsmanager", resource="secret", resource_name=f"{secret_id}-??????",
                             arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME),)


def product_base_image(project: Any) -> str:
    """The base image ``rayito agent build`` builds the project's image on (the project's
    ``[image] base``, ``rayito-base-caps`` by default): the product's ``project_template``."""
    from rayito._agent._project_base import project_template
    from rayito._agent._template import DEFAULT_AGENT_TEMPLATE_BASE

    if project is None:
        return DEFAULT_AGENT_TEMPLATE_BASE
    return str(project_template(project.product).base)


def artifact_bucket_name(stack: cdk.Stack) -> str:
    """The bucket ``rayito setup`` makes for artifacts (``rayito-artifacts-<account>-<region>``,
    the product's ``DEFAULT_ARTIFACT_BUCKET_TEMPLATE``), where its base images' zips are."""
    from rayito._account_setup._domain import DEFAULT_ARTIFACT_BUCKET_TEMPLATE

    return DEFAULT_ARTIFACT_BUCKET_TEMPLATE.format(account=stack.account, region=stack.region)


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
    scope_microvm_actions_to_image: bool = True,
    build_network_connectors: Sequence[str] = (),
    project: Any = None,
    artifact_bucket_arn: Optional[str] = None,
    base_build_role: Optional[iam.IRole] = None,
) -> FleetAccess:
    """Gather the ARNs for one fleet (``fleet_name``) or, with ``fleet_name=None``, every fleet.

    The name and the connector ARNs end up in resource ARNs: a name such as ``""`` (every fleet),
    ``"a*"`` (every image whose name starts with ``a``) or a connector ``"*"`` would widen the
    statements silently, so they are refused here with one line.

    ``project`` names the secrets the fleet's sessions read (:func:`session_secrets`) and the base
    image of ``rayito agent build``; without it the policies grant no gateway or ``secret_env``
    secret. ``artifact_bucket_arn``: where the publisher uploads (default: ``rayito setup``'s
    bucket). ``base_build_role``: the role the base image was built with (default: ``rayito
    setup``'s build role, :data:`PRODUCT_BUILD_ROLE_NAME`).
    """
    _check_access_inputs(fleet_name, network_connectors, build_network_connectors)
    _check_image_arn(image_arn)
    stack = cdk.Stack.of(scope)
    image = image_arn or image_arn_for(stack, fleet_name)
    secrets = session_secrets(project) if project is not None else SessionSecrets()
    for secret_id in secrets.secret_env:
        check_same_environment(scope, "secret_env", secret_id)
    for secret_id in secrets.gateways:
        check_same_environment(scope, "gateways", secret_id)
    from .access_token import token_secret_name

    if fleet_name:
        token = secret_arn_for(stack, token_secret_name(fleet_name))[0]
        gateways = tuple(a for g in secrets.gateways for a in secret_arn_for(stack, g))
        image_name = image.rsplit(":microvm-image:", 1)[-1] if not cdk.Token.is_unresolved(image) else fleet_name
    else:
        token = secret_arn_for(stack, "rayito/agents/*/access-token")[0]
        gateways = (stack.format_arn(service="secretsmanager", resource="secret", resource_name="rayito/*",
                                     arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME),)
        image_name = "*"
    from rayito._images_publish_domain import log_group_for

    group = stack.format_arn(service="logs", resource="log-group", resource_name=log_group_for(image_name),
                             arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
    base = product_base_image(project)
    base_arn = base if base.startswith("arn:") else image_arn_for(stack, base)
    base_role = (base_build_role.role_arn if base_build_role is not None else
                 stack.format_arn(service="iam", region="", resource="role",
                                  resource_name=PRODUCT_BUILD_ROLE_NAME.format(region=stack.region)))
    bucket = artifact_bucket_arn or f"arn:{stack.partition}:s3:::{artifact_bucket_name(stack)}"
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
        scope_microvm_actions_to_image=scope_microvm_actions_to_image,
        build_connector_arns=tuple(dict.fromkeys(build_network_connectors)),
        region=stack.region,
        access_token_secret_arn=token,
        gateway_secret_arns=gateways,
        renewed_secret_arns=tuple(a for g in secrets.renewed for a in secret_arn_for(stack, g)),
        secret_env_arns=tuple(a for g in secrets.secret_env for a in secret_arn_for(stack, g)),
        secret_key_arns=(recipe_key_arn,) if recipe_key_arn else (),
        artifact_bucket_arn=bucket,
        base_image_arns=image_and_versions(base_arn),
        build_role_arns=tuple(dict.fromkeys(r for r in (build_role.role_arn if build_role else None, base_role) if r)),
        build_log_group_arns=(group, f"{group}:*"),
        account_wide=not fleet_name,
    )


_CONNECTOR_ARN = re.compile(r"arn:[a-z-]+:lambda:[a-z0-9-]+:([0-9]{12}|aws):network-connector:[A-Za-z0-9_.:/-]+")


def _check_access_inputs(
    fleet_name: Optional[str],
    network_connectors: Sequence[str],
    build_network_connectors: Sequence[str],
) -> None:
    """One line per mistake in what becomes a resource ARN (what, the value, what is allowed)."""
    if fleet_name is not None and not (isinstance(fleet_name, str) and cdk.Token.is_unresolved(fleet_name)):
        problem = fleet_name_problem(fleet_name)
        if problem:
            raise ValueError(f"fleet_name: {problem}; None means every fleet of the account")
    for option, arns in (("network_connectors", network_connectors),
                         ("build_network_connectors", build_network_connectors)):
        if isinstance(arns, str) or not isinstance(arns, (list, tuple)):
            raise ValueError(f"{option}: {arns!r} is not a list of ARNs (give [{arns!r}] for one)")
        for arn in arns:
            if not isinstance(arn, str):
                raise ValueError(f"{option}: {arn!r} is not an ARN string")
            if cdk.Token.is_unresolved(arn):
                continue
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


def recipe_key_statements(sid: str, actions: tuple[str, ...], access: FleetAccess) -> list[Statement]:
    """``actions`` on the recipe's customer key, through SSM only (none with ``aws/ssm``)."""
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


def _metadata_index(access: FleetAccess, *, write: bool = True, read: bool = True) -> list[Statement]:
    """The product's index grants (``RayitoIndexWriter``'s ``PutIndexRows``, ``RayitoIndexReader``'s
    ``ReadIndexRows``, ``_stacks/_templates/metadata-index.yaml``), and the table's customer key."""
    if not access.table_arn:
        return []
    statements = []
    if write:
        statements.append(Statement("PutIndexRows", INDEX_WRITE, (access.table_arn,)))
    if read:
        statements.append(Statement("ReadIndexRows", INDEX_READ, (access.table_arn,)))
    if access.table_key_arn:
        statements.append(table_key_statement("MetadataIndexKey", access.table_key_arn, access.region))
    return statements


def _client_microvms(access: FleetAccess) -> list[Statement]:
    """The MicroVM statements of the product's client: those of :func:`microvm_statements` but
    PassExecutionRole (the client's RunMicrovm sends no ``executionRoleArn``)."""
    return [s for s in microvm_statements(access) if s.sid != "PassExecutionRole"]


def _secret_keys(access: FleetAccess) -> list[Statement]:
    if not access.secret_key_arns:
        return []  # aws/secretsmanager needs no KMS permission
    return [Statement("SecretsKey", ("kms:Decrypt",), access.secret_key_arns, via("secretsmanager", access.region))]


def session_secret_statements(access: FleetAccess) -> list[Statement]:
    """Read what a session of the fleet needs: the access token (``RAYITO_ACCESS_TOKEN``: rayd
    admits no RPC without it), each gateway's secret (its headers, sent to the VM after it is
    ready) and each ``secret_env`` secret (its value, into the agent's environment)."""
    statements = []
    if access.access_token_secret_arn:
        statements.append(Statement("AccessToken", ("secretsmanager:GetSecretValue",), (access.access_token_secret_arn,)))
    if access.gateway_secret_arns:
        statements.append(Statement("GatewaySecrets", ("secretsmanager:GetSecretValue",), access.gateway_secret_arns))
        if access.account_wide:
            statements.append(Statement(
                "NeverWebhookSigningSecrets", ("secretsmanager:GetSecretValue",),
                (access.gateway_secret_arns[0].replace(":secret:rayito/*", ":secret:rayito/webhooks/*"),), deny=True))
    if access.secret_env_arns:
        statements.append(Statement("SecretEnv", ("secretsmanager:GetSecretValue",), access.secret_env_arns))
    return [*statements, *_secret_keys(access)]


def serving_statements(access: FleetAccess) -> list[Statement]:
    """What serving a base VM needs beyond starting it, for the reconciler's role: the secrets a
    session reads (:func:`session_secret_statements`) and ``CreateMicrovmAuthToken`` on the
    fleet's image (``ServeMicrovms``: the token opens the VM's endpoint to configure its gateways
    and start the agent host). Not attached here: the reconciler's role is its owner's."""
    return [
        *[s for s in session_secret_statements(access) if not s.deny],
        Statement("ServeMicrovms", ("lambda:CreateMicrovmAuthToken",),
                  ("*",) if not access.scope_microvm_actions_to_image else access.image_arns),
    ]


def launcher_statements(access: FleetAccess) -> list[Statement]:
    """SandboxLauncherPolicy: run and drive the fleet's sessions as the product's client does
    (connect, status, invoke, stream, stop, warm slots), read (never write) the recipe, the
    sessions' secrets and the session index."""
    return [
        *_client_microvms(access),
        Statement("AgentRecipe", RECIPE_READ_DELETE, access.recipe_parameter_arns),
        *recipe_key_statements("AgentRecipeKey", ("kms:Decrypt",), access),
        *session_secret_statements(access),
        *_metadata_index(access),
    ]


def _deploy_statements(access: FleetAccess) -> list[Statement]:
    """``rayito agent deploy``'s own calls: the preflight describes each gateway secret, and
    ``--renew-gateway-keys`` writes a new key into each bedrock gateway's secret."""
    statements = []
    if access.gateway_secret_arns and not access.account_wide:
        statements.append(Statement("CheckGatewaySecrets", ("secretsmanager:DescribeSecret",), access.gateway_secret_arns))
    if access.renewed_secret_arns:
        statements.append(Statement("RenewGatewayKeys", ("secretsmanager:DescribeSecret", "secretsmanager:PutSecretValue"),
                                    access.renewed_secret_arns))
    return statements


def caller_statements(access: FleetAccess) -> list[Statement]:
    """CallerPolicy: the launcher and the publisher together ("kept for existing setups", the
    product's union), plus what ``rayito agent deploy`` does besides: describe the gateway
    secrets, renew the bedrock gateways' keys and save the recipe."""
    launcher = launcher_statements(access)
    publisher = [s for s in publisher_statements(access) if s.sid not in {l.sid for l in launcher}]
    recipe_key = [s for s in launcher if s.sid == "AgentRecipeKey"]
    statements = [s for s in launcher if s.sid != "AgentRecipeKey"]
    statements.insert(statements.index(next(s for s in statements if s.sid == "AgentRecipe")) + 1,
                      Statement("AgentRecipeWrite", RECIPE_WRITE, access.recipe_parameter_arns))
    if recipe_key:
        statements.append(Statement("AgentRecipeKey", ("kms:Decrypt", "kms:Encrypt"), recipe_key[0].resources,
                                    recipe_key[0].conditions))
    return [*statements, *_deploy_statements(access), *_merge_connectors(publisher, statements)]


def _merge_connectors(publisher: list[Statement], launcher: list[Statement]) -> list[Statement]:
    """The publisher's statements for the caller, its connectors and ListMicrovms already held."""
    held = {r for s in launcher if s.sid == "PassNetworkConnectors" for r in s.resources}
    out = []
    for statement in publisher:
        if statement.sid == "PassBuildNetworkConnectors":
            extra = tuple(r for r in statement.resources if r not in held)
            if extra:
                out.append(Statement(statement.sid, statement.actions, extra))
            continue
        out.append(statement)
    return out


def publisher_statements(access: FleetAccess) -> list[Statement]:
    """ImagePublisherPolicy: what ``rayito image publish``, ``rayito agent build`` and ``rayito
    image prune`` call for the fleet's image: create and update it, its versions and builds,
    read its base's versions, upload the artifact, pass the build roles and the connectors, read
    the build's logs, list VMs to keep the versions in use."""
    statements = [
        Statement("CreateMicrovmImage", CREATE_IMAGE_ACTIONS, ("*",)),
        Statement("MicrovmImages", PUBLISH_IMAGE_ACTIONS, access.image_arns),
        Statement("BaseImage", BASE_IMAGE_ACTIONS, access.base_image_arns),
        Statement("ManagedImageVersions", MANAGED_IMAGE_VERSIONS_ACTIONS, ("*",)),
        Statement("ListMicrovms", LIST_ACTIONS, ("*",)),
        Statement("PassBuildNetworkConnectors", ("lambda:PassNetworkConnector",),
                  tuple(dict.fromkeys((access.managed_connector_arn, *access.network_connector_arns,
                                       *access.build_connector_arns)))),
    ]
    if access.build_role_arns:
        statements.append(Statement("PassBuildRole", ("iam:PassRole",), access.build_role_arns,
                                    {"StringEquals": {"iam:PassedToService": LAMBDA_SERVICE}}))
    if access.artifact_bucket_arn:
        # No s3:ListBucket (the product's ProbeArtifactBucket): no path calls HeadBucket with a
        # bucket given, and without it a missing key's HeadObject answers 403, which the product
        # reads as absent (_images.MISSING_OBJECT_CODES) before it uploads.
        statements.append(Statement("UploadArtifacts", ("s3:PutObject", "s3:GetObject"),
                                    tuple(f"{access.artifact_bucket_arn}/{prefix}/*" for prefix in _artifact_prefixes())))
    if access.build_log_group_arns:
        statements.append(Statement("BuildLogs", ("logs:DescribeLogStreams", "logs:GetLogEvents"),
                                    access.build_log_group_arns))
    return statements


def _artifact_prefixes() -> tuple[str, str]:
    """Where the product puts artifacts: ``rayito/images`` (``rayito image publish``,
    ``cli/_publish.py``) and ``rayito/templates`` (``Template.build``, ``_templates/_build.py``)."""
    from rayito._templates._build import S3_KEY_PREFIX as TEMPLATES
    from rayito.cli._publish import S3_KEY_PREFIX as IMAGES

    return (IMAGES, TEMPLATES)


def grant_all(statements: Sequence[Statement], grantee: iam.IGrantable, scope: IConstruct,
              *, what: str = "grant") -> iam.Grant:
    """Add every statement to ``grantee``'s policy; one combined :class:`iam.Grant`.

    A principal the statements cannot reach is an error, never a silent no-op: an imported role
    that is immutable (``mutable=False``) or of another account takes no statement (CDK pretends
    it did), and a principal that is not a construct (a service or an account) has no policy."""
    return checked_grant(grantee, scope, lambda: functools.reduce(
        lambda combined, grant: combined.combine(grant), [s.grant(grantee, scope) for s in statements]), what=what)


def checked_grant(grantee: iam.IGrantable, scope: IConstruct, grant: "Callable[[], iam.Grant]",
                  *, what: str) -> iam.Grant:
    """``grant()`` (a CDK grant such as ``secret.grant_read(grantee)``) with :func:`grant_all`'s
    checks: refused for a principal of another account, and when nothing landed on it."""
    principal = grantee.grant_principal
    _check_same_stack_environment(principal, scope, what)
    foreign = _foreign_account(principal, scope)
    if foreign is not None:
        raise ValueError(
            f"{what}: {foreign} is of another account than the stack's ({cdk.Stack.of(scope).account}); a grant "
            "would attach a policy to the same-named principal of the stack's account. Attach the fleet's managed "
            "policy in that account instead")
    granted = grant()
    if not _grant_landed(principal):
        name = (getattr(principal, "role_arn", None) or getattr(getattr(principal, "node", None), "path", None)
                or type(principal).__name__)
        raise ValueError(
            f"{what}: {name} cannot be granted to (an imported role that is immutable or of another account, or a "
            "principal without a policy), so the statements would be dropped silently; attach the fleet's managed "
            "policy to it where it is defined (the stack's CallerPolicyArn, ImagePublisherPolicyArn or "
            "SandboxLauncherPolicyArn output)")
    _check_inline_size(principal, what)
    return granted


def _check_same_stack_environment(principal: Any, scope: IConstruct, what: str) -> None:
    """A grantee in a stack of a known environment is refused when the fleet's stack leaves its
    account or region to the deploy (environment-agnostic): the statements then name the fleet's
    resources with the pseudo parameters (``AWS::Region``, ``AWS::AccountId``) of the stack they land
    in, the grantee's. A fleet of a known environment writes its ARNs out in full (IAM is global:
    any stack may hold them), and two agnostic stacks are not judged (one deploy target for both
    is the usual case)."""
    node = getattr(principal, "node", None)
    if node is None:
        return
    theirs, ours = cdk.Stack.of(principal), cdk.Stack.of(scope)
    if theirs is ours:
        return

    def known(value: str) -> Optional[str]:
        return None if cdk.Token.is_unresolved(value) else value

    pairs = [(known(ours.account), known(theirs.account)), (known(ours.region), known(theirs.region))]
    if not any(mine is None and other is not None for mine, other in pairs):
        return
    shown = {k: "/".join(v or "any" for v in env) for k, env in
             (("mine", [m for m, _ in pairs]), ("other", [o for _, o in pairs]))}
    raise ValueError(
        f"{what}: {node.path} is in stack {theirs.node.path} ({shown['other']}), the fleet in the "
        f"environment-agnostic {ours.node.path} ({shown['mine']}); its statements would name the grantee's "
        "account and region. Give the fleet's stack an env, or grant from AgentFleet.from_fleet_name in the "
        "grantee's stack")


def _foreign_account(principal: Any, scope: IConstruct) -> Optional[str]:
    """The ARN of an imported user or group of another account than the stack's, or None. (CDK
    attaches a grant to such a principal by name, in the stack's account; an imported role of
    another account takes no policy at all, which :func:`_grant_landed` tells.)"""
    account = cdk.Stack.of(scope).account
    for attribute in ("user_arn", "group_arn"):
        arn = getattr(principal, attribute, None)
        if not isinstance(arn, str) or cdk.Token.is_unresolved(arn) or cdk.Token.is_unresolved(account):
            continue
        parts = arn.split(":", 5)
        if len(parts) == 6 and parts[4] and parts[4] != account:
            return arn
    return None


def _grant_landed(principal: Any) -> bool:
    """Whether statements added to ``principal`` land in a policy of the template: a role, user or
    group of the app (its ``DefaultPolicy``) or an imported mutable role (a ``Policy`` CDK attaches
    by name)."""
    return _principal_policy(principal) is not None


def _principal_policy(principal: Any) -> Any:
    """The policy construct statements added to ``principal`` land in, or None: a role's
    ``DefaultPolicy``, or the ``Policy`` CDK attaches to an imported mutable role (named
    ``Policy<stack><id>`` under the ``importedRoleStackSafeDefaultPolicyName`` feature flag)."""
    node = getattr(principal, "node", None)
    if node is None:
        return None
    for child in node.children:
        if child.node.id == "DefaultPolicy" or child.node.id.startswith("Policy"):
            return child
    return None


def _check_inline_size(principal: Any, what: str) -> None:
    """An imported role's inline policy (CDK splits the policies of the roles it makes into
    managed ones when they grow; an imported role's ``Policy`` it does not): IAM's 10,240."""
    from .policy_size import INLINE_POLICIES_LIMIT, check_size

    policy = _principal_policy(principal)
    if policy is None or policy.node.id == "DefaultPolicy" or not hasattr(policy, "document"):
        return
    name = getattr(principal, "role_arn", None) or principal.node.path
    check_size(principal, f"{what}: the inline policy of {name}", policy.document, INLINE_POLICIES_LIMIT,
               hint="attach the fleet's managed policy instead of granting inline")


def check_same_environment(scope: IConstruct, option: str, resource: Any) -> None:
    """A secret, bucket or table of another account or region is refused, in one line: the
    product's client reads them by name in its own account and region (``DynamoDbIndex``'s
    table name, ``SecretCache``'s ids, the artifact bucket of its session), so the fleet would
    never reach them. Unresolved values (tokens) are not judged."""
    if resource is None:
        return
    stack = cdk.Stack.of(scope)
    if isinstance(resource, str):
        if cdk.Token.is_unresolved(resource) or not resource.startswith("arn:"):
            return
        parts = resource.split(":", 5)
        if len(parts) < 6:
            return
        account, region, name = parts[4], parts[3], resource
    else:
        env = getattr(resource, "env", None)
        if env is None:
            return
        account, region = env.account, env.region
        name = next((getattr(resource, a) for a in ("table_arn", "secret_arn", "bucket_arn") if hasattr(resource, a)),
                    getattr(getattr(resource, "node", None), "path", option))
        if cdk.Token.is_unresolved(name):
            name = getattr(getattr(resource, "node", None), "path", option)
        else:
            # An import by ARN keeps the stack's environment (Table.from_table_arn): its ARN says.
            parts = str(name).split(":", 5)
            if str(name).startswith("arn:") and len(parts) == 6:
                account, region = parts[4] or account, parts[3] or region
    problems = []
    for kind, theirs, ours in (("account", account, stack.account), ("region", region, stack.region)):
        if not theirs or cdk.Token.is_unresolved(theirs) or cdk.Token.is_unresolved(ours):
            continue
        if theirs != ours:
            problems.append(f"{kind} {theirs}, not the stack's {ours}")
    if problems:
        raise ValueError(f"{option}: {name} is in {' and '.join(problems)}; the product's client reads it by name "
                         "in its own account and region, so the fleet would never reach it: give one of the stack's")
