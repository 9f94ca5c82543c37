"""``AgentImage``: the product's agent image of a project, built in the same ``cdk deploy``.

An L2 over ``aws_lambda.CfnMicrovmImage`` (``AWS::Lambda::MicrovmImage``) whose artifact and
configuration are what ``rayito agent deploy`` publishes for the project: the product's agent
template (runtime, agent host, app) over the product's base (``rayd`` as PID 1, every hook on),
composed at synth by the product's own functions (``image_composition.py``). A changed project
changes the zip, so CloudFormation updates the image and the service builds a new version; the
fleet's reconciler rolls onto it (docs/image.md). A Dockerfile in the folder is ignored, as the
product ignores it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from rayito._agent._project_base import template_name
from rayito._images_publish_domain import log_group_for
from rayito.cli._artifact import marker_has_efs, marker_variant

from ._assets import content_file
from ._nag import acknowledge_statements
from .image_composer import ImageComposer, PublishedBaseImage
from .image_composition import (
    HOOKS_PORT,
    MEMORY_CLASSES_MIB,
    MEMORY_FLOOR_MIB,
    RAYD_PORT,
    CompositionError,
    agent_configuration,
    agent_template,
    build_context,
    caps_base_configuration,
    compose_artifact,
    declared_inheritance,
)
from .image_pruner import ImagePruner, check_keep, properties_digest
from .model.names import claim
from .permissions import LAMBDA_SERVICE, STAR_REASONS, Statement, image_arn_for, source_arn_condition

# The product's CDK module (rayito.cdk) defines constructs of its own, about 0.2 CPU-s to import: it
# is imported where an image is made or a release zip read, never by a fleet without an image.
if TYPE_CHECKING:
    from rayito.cdk import MicrovmImageArtifact, RayitoMicrovmImage

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
#: The managed base image's major version. Measured (ground truth section 7, Notes Q52/Q115):
#: list-managed-microvm-image-versions lists 0 and 1, create rejects "1.0" ("Expected a single
#: major version number (e.g., 1)"), and Rayito pins "1". Whether "0" is accepted is not recorded.
DEFAULT_BASE_IMAGE_VERSION = "1"
#: The image resource's metadata key holding the template env composed into its zip.
TEMPLATE_ENV_METADATA = "RayitoTemplateEnv"
_MAJOR_VERSION = re.compile(r"^[0-9]{1,9}\Z")
#: How long the image's log group keeps the build logs and the VMs' output (agent output may hold
#: conversations: a month, not forever).
DEFAULT_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


def _usable_log_key(scope: Construct, key: Optional[kms.IKey], log_group: str) -> Optional[kms.IKey]:
    """``key`` when CloudWatch Logs may use it for ``log_group``: a key of this app gets the
    key-policy statement (for this group only); an imported key cannot, and is left out."""
    if key is None:
        return None
    stack = cdk.Stack.of(scope)
    group_arn = stack.format_arn(service="logs", resource="log-group", resource_name=log_group,
                                 arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
    added = key.add_to_resource_policy(
        iam.PolicyStatement(
            sid=f"CloudWatchLogs{_logical(log_group)}",
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],  # in a key policy, "*" is this key
            conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": group_arn}},
        ),
        allow_no_op=True,
    )
    if not added.statement_added:
        cdk.Annotations.of(scope).add_warning_v2(
            "rayito:log_key_not_used",
            f"{log_group} is not encrypted with the customer key: an imported key's policy cannot let "
            "CloudWatch Logs use it from here (add the logs service principal to the key policy and "
            "associate the key with the group)",
        )
        return None
    return key


def _logical(text: str) -> str:
    return "".join(ch for ch in text.title() if ch.isalnum())


class ImportedAgentImage(Construct):
    """An image made elsewhere, known by ARN."""

    def __init__(self, scope: Construct, id: str, *, image_arn: str) -> None:
        super().__init__(scope, id)
        self.image_arn = image_arn
        self.image_name = image_arn.rsplit(":microvm-image:", 1)[-1] if not cdk.Token.is_unresolved(image_arn) else None
        self.latest_active_image_version: Optional[str] = None
        self.build_role: Optional[iam.IRole] = None
        self.code_object_arns: tuple[str, ...] = ()


class AgentImage(Construct):
    """The product's agent image of a project: what ``rayito agent deploy`` publishes for it.

    The artifact is the product's ``project_template(project)`` laid over the product's base
    (``rayd`` as PID 1), composed at synth by the product's own functions
    (:mod:`rayito_constructs.image_composition`) into a deterministic file asset; the image's
    configuration is what the product's build sends: the base's hooks (every one ENABLED, port
    9000, the product's timeouts), capabilities, architecture and managed base, plus the project's
    memory and the image's own log group ``/rayito/<name>``. No Docker and no network at synth.

    :param project: the agent project (this library's ``AgentProject`` or the product's).
    :param rayd: where ``rayd`` comes from: the product's release zip
        (``rayito.cdk.MicrovmImageArtifact.from_file(path, sha256=...)``), or a
        ``rayito.cdk.RayitoMicrovmImage`` of the same app (its zip composed at synth, its
        configuration inherited, the image built after it), or a base image already published in
        the account (:class:`~rayito_constructs.image_composer.PublishedBaseImage`: composed at
        deploy by an :class:`~rayito_constructs.image_composer.ImageComposer`, its managed base
        inherited).
    :param base_image_version: the managed base's major version for a release zip (a published
        base's is inherited). Default: ``"1"``.
    :param template_env: variables ``rayd`` hands to every process (the product's ``set_envs``);
        values must be known at synth. Default: none.
    :param own_log_group: create ``/rayito/<image name>`` in the stack, before the image.
        Default: True.
    :param log_retention: Default: one month.
    :param log_removal_policy: Default: ``DESTROY``.
    :param encryption_key: customer KMS key for the log group. Default: the CloudWatch Logs default.
    :param build_role: the role the build runs as. Default: a new role that reads the composed zip
        and writes the image's build logs (the product's build uses its base's role, which reads
        only the base's zip here).
    :param keep_image_versions: versions the image keeps (1 to 49; ``None``: every one). Default: 5.
    :param prune_every: Default: one hour.
    :param pruner_reserved_concurrency: Default: 1.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        project: Any,
        rayd: Any,
        base_image_version: str = DEFAULT_BASE_IMAGE_VERSION,
        template_env: Optional[Mapping[str, str]] = None,
        own_log_group: bool = True,
        log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
        log_removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
        encryption_key: Optional[kms.IKey] = None,
        build_role: Optional[iam.IRole] = None,
        keep_image_versions: Optional[int] = 5,
        prune_every: cdk.Duration = cdk.Duration.hours(1),
        pruner_reserved_concurrency: Optional[int] = 1,
    ) -> None:
        from rayito.cdk import RayitoMicrovmImage
        from rayito.cdk._image_properties import camel_case, cfn_image_properties

        product = getattr(project, "product", project)
        image_name = template_name(product)
        env = dict(template_env or {})
        check_image_project(product, image_name)
        check_template_env(env)
        if keep_image_versions is not None:
            check_keep(keep_image_versions)
        published, base_name, base_pin, context, artifact = _composition(product, rayd, base_image_version, env)
        super().__init__(scope, id)
        claim(self, "image", image_name)  # one MicrovmImage of a name per account and region
        stack = cdk.Stack.of(self)
        folder = Path(product.source) if product.source else None
        if folder is not None and (folder / "Dockerfile").is_file():
            cdk.Annotations.of(self).add_info(
                f"{folder / 'Dockerfile'} is ignored: the image is the product's agent template over rayd "
                "(rayito agent deploy ignores it too)")
        self.image_name = image_name
        """The image's name (the product's ``[image] template``, else the project's name)."""
        self.template_env = env
        """The variables rayd hands to every process."""
        self.composer: Optional[ImageComposer] = None
        """Composes the zip at deploy, over a published base (``rayd=PublishedBaseImage()``)."""
        self.code: Optional[s3_assets.Asset] = None
        """The zip composed at synth, as a file asset (None when composed at deploy)."""
        if artifact is not None:
            self.artifact_sha256: str = hashlib.sha256(artifact).hexdigest()
            """The sha256 of the composed zip (the product's content-addressed key is made from it)."""
            self.code = s3_assets.Asset(self, "Code", path=str(content_file(artifact, f"{self.artifact_sha256}.zip")))
            self.code_object_arns: tuple[str, ...] = (self.code.bucket.arn_for_objects(self.code.s3_object_key),)
            artifact_uri = f"s3://{self.code.s3_bucket_name}/{self.code.s3_object_key}"
        else:
            assert published is not None and context is not None
            # What rayito setup declares for the base, checked by the composer against the version it finds.
            declared = declared_inheritance(caps_base_configuration(
                region=stack.region, base_image_version=DEFAULT_BASE_IMAGE_VERSION, artifact_uri="", build_role_arn="",
                base_name=base_name))
            self.composer = ImageComposer(self, "Composer", image_name=image_name, build_context=context,
                                          base_image_name=base_name, base_image_version=base_pin, declared=declared,
                                          base_artifact_bucket=published.artifact_bucket)
            self.artifact_sha256 = self.composer.artifact_sha256
            self.code_object_arns = self.composer.artifact_object_arns
            artifact_uri = self.composer.artifact_uri
        log_group = log_group_for(image_name)
        self.build_log_group_name = log_group
        """The image's own log group, ``/rayito/<name>``, as the product names it."""
        self.build_log_group: Optional[logs.LogGroup] = None
        """``/rayito/<name>`` when the stack owns it."""
        if own_log_group:
            self.build_log_group = logs.LogGroup(self, "Logs", log_group_name=log_group, retention=log_retention,
                                                 removal_policy=log_removal_policy,
                                                 encryption_key=_usable_log_key(self, encryption_key, log_group))
        self.log_group: Optional[logs.LogGroup] = None
        """The VMs' ``/aws/lambda-microvms/<name>`` group is the fleet's, not the image's (None)."""
        self.egress_network_connectors: tuple[str, ...] = ()
        if build_role is None:
            build_role = self._own_build_role(image_name, log_group)
        self.build_role = build_role
        """The role the build runs as."""
        if isinstance(rayd, RayitoMicrovmImage):
            base = _inherited_from(rayd)
        elif self.composer is not None:
            # The managed base is the one the base's version declares, as the product's build inherits it.
            base = caps_base_configuration(region=stack.region, base_image_version=self.composer.managed_base_image_version,
                                           artifact_uri=artifact_uri, build_role_arn=build_role.role_arn,
                                           base_name=self.composer.base_image_name)
            base["baseImageArn"] = self.composer.managed_base_image_arn
        else:
            base = caps_base_configuration(region=stack.region, base_image_version=base_image_version,
                                           artifact_uri=artifact_uri, build_role_arn=build_role.role_arn)
        configuration = agent_configuration(base=base, artifact_uri=artifact_uri, memory_mib=product.memory_mib,
                                            image_name=image_name)
        configuration["buildRoleArn"] = build_role.role_arn  # our role reads the composed zip
        self.configuration = configuration
        """The ``create-microvm-image`` body the product's build would send (ARNs as tokens)."""
        properties = cfn_image_properties(configuration, name=image_name,
                                          description=f"Rayito agent {image_name} (rayito agent deploy, rayito_constructs)")
        self.resource = lambda_.CfnMicrovmImage(
            self,
            "Resource",
            name=properties["Name"],
            description=properties["Description"],
            base_image_arn=properties["BaseImageArn"],
            base_image_version=properties["BaseImageVersion"],
            build_role_arn=properties["BuildRoleArn"],
            additional_os_capabilities=properties["AdditionalOsCapabilities"],
            egress_network_connectors=properties["EgressNetworkConnectors"],
            code_artifact=cdk.Token.as_any(camel_case(properties["CodeArtifact"])),
            cpu_configurations=cdk.Token.as_any(camel_case(properties["CpuConfigurations"])),
            environment_variables=cdk.Token.as_any(camel_case(properties["EnvironmentVariables"])),
            hooks=cdk.Token.as_any(camel_case(properties["Hooks"])),
            logging=cdk.Token.as_any(camel_case(properties["Logging"])),
            resources=cdk.Token.as_any(camel_case(properties["Resources"])),
        )
        if env:
            # What rayd hands the agents, readable from the deployed template too (rayito-constructs
            # verify reads the egress envelopes there); the zip itself sits in the assets bucket.
            self.resource.add_metadata(TEMPLATE_ENV_METADATA, dict(sorted(env.items())))
        self.resource.node.add_dependency(build_role)
        if isinstance(rayd, RayitoMicrovmImage):
            self.resource.node.add_dependency(rayd)
        if self.build_log_group is not None:
            self.resource.node.add_dependency(self.build_log_group)
        self.pruner: Optional[ImagePruner] = None
        """Deletes old versions (``keep_image_versions``), unless that is None."""
        if keep_image_versions is not None:
            self.pruner = ImagePruner(self, "Pruner", image_name=image_name, keep_image_versions=keep_image_versions,
                                      # composed at deploy: the composer's inputs change what is built too
                                      digest=properties_digest(self, self.resource, *(
                                          [self.composer.resource.node.default_child] if self.composer else [])),
                                      prune_every=prune_every,
                                      reserved_concurrency=pruner_reserved_concurrency)
            self.resource.node.add_dependency(self.pruner.resource)
        self.image_arn: str = self.resource.attr_image_arn
        """The image's ARN."""
        self.latest_active_image_version: Optional[str] = self.resource.attr_latest_active_image_version
        """The version new MicroVMs run (changes when a deploy builds a new one)."""

    def _own_build_role(self, image_name: str, log_group: str) -> iam.IRole:
        """The role the build runs as: it reads the composed zip and writes the image's log group."""
        stack = cdk.Stack.of(self)
        role = iam.Role(
            self,
            "BuildRole",
            assumed_by=iam.SessionTagsPrincipal(
                iam.PrincipalWithConditions(
                    iam.ServicePrincipal(LAMBDA_SERVICE),
                    source_arn_condition(stack, image_arn_for(stack, image_name)),
                )
            ),
            description=f"Rayito: builds the MicroVM image {image_name}",
        )
        group_arn = stack.format_arn(service="logs", resource="log-group", resource_name=f"{log_group}:*",
                                     arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
        log_actions = ("logs:CreateLogStream", "logs:PutLogEvents")
        statements = [
            Statement("ReadCode", ("s3:GetObject",), self.code_object_arns),
            Statement("BuildLogs", log_actions if self.build_log_group else ("logs:CreateLogGroup", *log_actions),
                      (group_arn,)),
        ]
        for statement in statements:
            role.add_to_policy(statement.to_policy_statement())
        acknowledge_statements(role, statements, {"BuildLogs": "the log streams of this image's own log group",
                                                  "ReadCode": STAR_REASONS["ReadCode"]})
        return role

    @property
    def owns_log_group(self) -> bool:
        """True when the stack makes the VMs' log group through the image (never: the fleet does)."""
        return self.log_group is not None

    @staticmethod
    def from_image_arn(scope: Construct, id: str, image_arn: str) -> ImportedAgentImage:
        """An image published elsewhere."""
        return ImportedAgentImage(scope, id, image_arn=image_arn)



def _composition(product: Any, rayd: Any, base_image_version: str, env: dict[str, str]) -> tuple[
        Optional["PublishedBaseImage"], Optional[str], Optional[str], Optional[bytes], Optional[bytes]]:
    """Where ``rayd`` comes from, and what is composed now: ``(published, base name, base pin,
    build context, artifact)``: the whole zip at synth over a local base, or only the project's
    side (the build context) when the base is published in the account (composed at deploy)."""
    from rayito.cdk import MicrovmImageArtifact, RayitoMicrovmImage

    published = rayd if isinstance(rayd, PublishedBaseImage) else None
    base_name = base_pin = None
    if isinstance(rayd, RayitoMicrovmImage):
        base_zip_path = _staged_artifact(rayd)
    elif isinstance(rayd, MicrovmImageArtifact):
        _check_release(rayd)
        base_zip_path = rayd.path
        if cdk.Token.is_unresolved(base_image_version) or not _MAJOR_VERSION.match(base_image_version or ""):
            raise ValueError(
                f"base_image_version: {base_image_version!r} is not a major version number such as '1' "
                "(CreateMicrovmImage rejects '1.0' and 'latest' would read AWS at synth)")
    elif published is not None:
        base_name, base_pin = published.resolve(str(product.base), product.base_image_version)
    else:
        raise ValueError(f"rayd: {type(rayd).__name__} is not a rayito.cdk.MicrovmImageArtifact, a "
                         "rayito.cdk.RayitoMicrovmImage or a rayito_constructs.PublishedBaseImage")
    try:
        if published is not None:
            # The base's zip is only in S3: the project's side travels, the rest is done at deploy.
            context, artifact = build_context(product, template_env=env, base_version=base_pin), None
        else:
            context, artifact = None, compose_artifact(product, Path(base_zip_path).read_bytes(), template_env=env)
    except CompositionError as exc:
        raise ValueError(str(exc)) from None
    return published, base_name, base_pin, context, artifact


def check_image_project(product: Any, image_name: str) -> None:
    """One line per problem the product's deploy would refuse to build or serve for the image."""
    from rayito.cdk._microvm_image import RESERVED_IMAGE_NAME_PREFIX

    problems = []
    if image_name.startswith(RESERVED_IMAGE_NAME_PREFIX):
        problems.append(f"image name: {image_name!r} starts with {RESERVED_IMAGE_NAME_PREFIX!r}, reserved for the "
                        "images of rayito setup and rayito image publish")
    elif not _NAME.match(image_name):
        problems.append(f"image name: {image_name!r} must be 1 to 64 letters, digits, '-' or '_'")
    memory = product.memory_mib
    if memory < MEMORY_FLOOR_MIB or memory not in MEMORY_CLASSES_MIB:
        classes = ", ".join(str(c) for c in MEMORY_CLASSES_MIB if c >= MEMORY_FLOOR_MIB)
        problems.append(f"memory_mib: {memory} is not one the product's agent image takes ({classes} MiB; "
                        f"its floor is {MEMORY_FLOOR_MIB})")
    app = getattr(product.runtime, "app", None)
    serve_port = product.serve.port
    port = getattr(app, "port", None)
    if port is not None and port in (RAYD_PORT, HOOKS_PORT, serve_port):
        owner = {RAYD_PORT: "rayd's gRPC port", HOOKS_PORT: "the image hooks' port"}.get(port, "the agent host's port")
        problems.append(f"runtime.app.port: {port} is {owner}; the app needs another port (not {RAYD_PORT}, "
                        f"{HOOKS_PORT} or {serve_port})")
    if not problems:
        try:
            agent_template(product)
        except CompositionError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("\n".join(problems))


def check_template_env(env: Mapping[str, str]) -> None:
    """Template variables must be values: synth composes them into the zip."""
    problems = []
    for key, value in sorted(env.items()):
        if cdk.Token.is_unresolved(key) or cdk.Token.is_unresolved(value):
            problems.append(f"template_env.{key}: a deploy-time value; the zip is composed at synth, "
                            "so give a value known at synth (a fixed name)")
        elif not _ENV_NAME.match(key):
            problems.append(f"template_env: {key!r} is not a valid variable name")
    if problems:
        raise ValueError("\n".join(problems))


def _check_release(artifact: MicrovmImageArtifact) -> None:
    """The product's own checks of a release zip: the ``full`` variant without EFS (what
    ``rayito-base-caps`` is made from), with the product's error codes."""
    from rayito.cdk import RayitoCdkException

    try:
        found = marker_variant(artifact.path)
        if found != "full":
            raise RayitoCdkException("artifact_variant_mismatch", found=found, variant="full")
        if marker_has_efs(artifact.path):
            raise RayitoCdkException("artifact_efs_mismatch", state="lleva", withEfs="false")
    except RayitoCdkException as exc:
        raise ValueError(f"rayd: {_one_line(exc)}") from None
    except zipfile.BadZipFile:
        raise ValueError(f"rayd: {artifact.path} is not a zip file (the product's rayito-image.zip is one)") from None


def release_artifact(path: str, sha256: Optional[str]) -> MicrovmImageArtifact:
    """``MicrovmImageArtifact.from_file`` with its errors (the product's codes) as one-line ``ValueError`` s."""
    from rayito.cdk import MicrovmImageArtifact, RayitoCdkException

    try:
        return MicrovmImageArtifact.from_file(path, sha256=sha256)
    except RayitoCdkException as exc:
        raise ValueError(f"base_artifact: {_one_line(exc)}") from None


def rayd_from_context(scope: Construct) -> Optional[Any]:
    """Where the app's context says ``rayd`` comes from: the release zip ``-c base_artifact=PATH``
    (with ``-c base_artifact_sha256=HEX``), as ``rayito agent deploy --base-artifact`` takes it, or
    the base image ``-c base_image=NAME`` already published in the account (composed at deploy);
    None without either."""
    path = scope.node.try_get_context("base_artifact")
    base = scope.node.try_get_context("base_image")
    return rayd_of(path, scope.node.try_get_context("base_artifact_sha256"), base)


def rayd_of(base_artifact: Optional[str], base_artifact_sha256: Optional[str],
            base_image: Optional[str]) -> Optional[Any]:
    """``rayd`` from the switches of ``app.py`` (``-c`` or ``[stack]``): a release zip
    (``base_artifact``) or a published base (``base_image``), never both; None without either."""
    if base_artifact and base_image:
        raise ValueError("base_artifact, base_image: give one of them (a release zip composed at synth, or the "
                         "base image published in the account, composed at deploy)")
    if base_image:
        return PublishedBaseImage(name=str(base_image), _option="base_image")
    if base_artifact:
        return release_artifact(str(base_artifact), base_artifact_sha256)
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _staged_artifact(image: RayitoMicrovmImage) -> Path:
    """The zip a ``RayitoMicrovmImage`` of this app stages (its ``Artifact`` asset)."""
    asset = image.node.try_find_child("Artifact")
    if not isinstance(asset, s3_assets.Asset):
        raise ValueError(f"rayd: {image.node.path} has no Artifact asset to compose from")
    path = Path(asset.asset_path)
    if not path.is_absolute():
        path = Path(cdk.Stage.of(image).outdir) / path
    return path


def _inherited_from(image: RayitoMicrovmImage) -> dict[str, Any]:
    """What the product's build inherits from its base (``INHERITED_CONFIGURATION_KEYS``), read
    from the base's ``AWS::Lambda::MicrovmImage`` in this app instead of ``get-microvm-image-version``."""
    cfn = image.node.try_find_child("Image")
    if not isinstance(cfn, lambda_.CfnMicrovmImage):
        raise ValueError(f"rayd: {image.node.path} has no Image to inherit from")
    stack = cdk.Stack.of(image)
    env = _camel(stack.resolve(cfn.environment_variables)) or []
    return {
        "baseImageArn": cfn.base_image_arn,
        "baseImageVersion": cfn.base_image_version,
        "buildRoleArn": cfn.build_role_arn,
        "cpuConfigurations": _camel(stack.resolve(cfn.cpu_configurations)),
        "environmentVariables": {e["key"]: e["value"] for e in env} or None,
        "additionalOsCapabilities": list(cfn.additional_os_capabilities or []) or None,
        "hooks": _camel(stack.resolve(cfn.hooks)),
        "egressNetworkConnectors": list(cfn.egress_network_connectors or []) or None,
    }


def _camel(value: Any) -> Any:
    """A resolved CloudFormation value (PascalCase keys) back in the API's camelCase."""
    from rayito.cdk._image_properties import camel_case

    return camel_case(value) if value is not None else None
