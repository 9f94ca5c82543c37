"""``AgentImage``: the agent's MicroVM image, built by the service in the same ``cdk deploy``.

An L2 over ``aws_lambda.CfnMicrovmImage`` (``AWS::Lambda::MicrovmImage``). The agent folder
(a Dockerfile at its root) becomes an S3 zip asset with no Docker at synth: the MicroVMs service
builds the image from it. A changed folder changes the asset, so CloudFormation updates the image
and the service builds a new version; the fleet's reconciler rolls onto it (docs/image.md).

The image's log group ``/aws/lambda-microvms/<name>`` (build logs and the VMs' output) belongs to
the stack, with a retention, created before the image so that neither the build nor a VM creates
it first without one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from ._nag import acknowledge_statements
from .envrules import credential_problem, credential_shape, secret_reason
from .execution_role import LOG_GROUP_PREFIX, microvm_log_streams_arn
from .image_pruner import ImagePruner, check_keep, properties_digest
from .names import claim
from .options import MEMORY_CLASSES_MIB
from .permissions import LAMBDA_SERVICE, Statement, image_arn_for, source_arn_condition

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}\Z")
#: Always left out of the uploaded folder, on top of its .dockerignore.
DEFAULT_EXCLUDES = (".git", "cdk.out", "node_modules", "__pycache__", "*.pyc", ".venv", ".DS_Store")
DEFAULT_BASE_IMAGE = "al2023-1"
#: The managed base image's major version. Measured (ground truth section 7, Notes Q52/Q115):
#: list-managed-microvm-image-versions lists 0 and 1, create rejects "1.0" ("Expected a single
#: major version number (e.g., 1)"), and Rayito pins "1". Whether "0" is accepted is not recorded.
DEFAULT_BASE_IMAGE_VERSION = "1"
_MAJOR_VERSION = re.compile(r"^[0-9]{1,9}\Z")
#: How long the image's log group keeps the build logs and the VMs' output (agent output may hold
#: conversations: a month, not forever).
DEFAULT_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


@dataclass(frozen=True)
class ImageHooks:
    """Lifecycle hooks of the image (``POST /aws/lambda-microvms/runtime/v1/<hook>`` on ``port``).

    Runtime hooks (``run``, ``resume``, ``suspend``, ``terminate``) time out after 1–60 s; build
    hooks (``ready``, ``validate``) after 1–3,600 s. Default: all off.
    """

    port: int = 9000
    run: bool = False
    resume: bool = False
    suspend: bool = False
    terminate: bool = False
    ready: bool = False
    validate: bool = False
    runtime_timeout_seconds: int = 30
    build_timeout_seconds: int = 600

    def check(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"hooks.port: {self.port} is not a port (1 to 65535)")
        if not 1 <= self.runtime_timeout_seconds <= 60:
            raise ValueError(f"hooks.runtime_timeout_seconds: {self.runtime_timeout_seconds} is not within 1 to 60")
        if not 1 <= self.build_timeout_seconds <= 3600:
            raise ValueError(f"hooks.build_timeout_seconds: {self.build_timeout_seconds} is not within 1 to 3600")

    def to_cfn(self) -> lambda_.CfnMicrovmImage.HooksProperty:
        state = {True: "ENABLED", False: "DISABLED"}
        runtime = self.runtime_timeout_seconds
        build = self.build_timeout_seconds
        return lambda_.CfnMicrovmImage.HooksProperty(
            port=self.port,
            microvm_hooks=lambda_.CfnMicrovmImage.MicrovmHooksProperty(
                run=state[self.run], run_timeout_in_seconds=runtime,
                resume=state[self.resume], resume_timeout_in_seconds=runtime,
                suspend=state[self.suspend], suspend_timeout_in_seconds=runtime,
                terminate=state[self.terminate], terminate_timeout_in_seconds=runtime,
            ),
            microvm_image_hooks=lambda_.CfnMicrovmImage.MicrovmImageHooksProperty(
                ready=state[self.ready], ready_timeout_in_seconds=build,
                validate=state[self.validate], validate_timeout_in_seconds=build,
            ),
        )


def dockerignore_patterns(folder: Path) -> list[str]:
    """The patterns of ``<folder>/.dockerignore`` (comments and blank lines dropped)."""
    file = folder / ".dockerignore"
    if not file.is_file():
        return []
    return [line.strip() for line in file.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


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
    """The MicroVM image of an agent folder.

    :param folder: the agent folder, with a Dockerfile at its root; uploaded as a zip asset
        (``.dockerignore`` honoured). Exactly one of ``folder`` and ``code``.
    :param code: an existing ``s3_assets.Asset`` holding the zip instead.
    :param image_name: 1–64 letters, digits, ``-`` or ``_``; unique in the account.
    :param memory_mib: the image's size class: 512, 1024, 2048, 4096 or 8192. Default: 2048.
    :param architecture: ``ARM_64`` or ``X86_64``. Default: ``ARM_64``.
    :param base_image_arn: the managed base image. Default: ``al2023-1`` in the stack's region.
    :param base_image_version: the managed base image's major version (digits only: create
        rejects ``"1.0"``), pinned so synth is offline and deterministic. Default: ``"1"``, the
        version Rayito pins (see docs/image.md).
    :param hooks: lifecycle hooks. Default: none enabled.
    :param environment: variables baked into the image; names that look like secrets are refused
        (the ``--env`` rule): pass secrets at run time instead. Default: none.
    :param egress_network_connectors: at most one customer connector for the build. Default: none.
    :param logging: ``True`` for CloudWatch Logs in ``/aws/lambda-microvms/<image name>``,
        ``False`` to turn build and runtime logs off. Default: True.
    :param own_log_group: create ``/aws/lambda-microvms/<image name>`` in the stack (with
        ``log_retention``), before the image. A group of that name that already exists in the
        account (an image published before by hand) makes the deploy fail: delete it, import it
        (``cdk import``) or pass False (docs/image.md). Default: True (when ``logging``).
    :param log_retention: Default: one month.
    :param log_removal_policy: Default: ``DESTROY``: the VMs' output goes with the stack.
    :param encryption_key: customer KMS key for the log group. A key made in this app gets the
        key-policy statement CloudWatch Logs needs (for this group only); an imported key is not
        used for the group (its policy cannot be changed from here), with a warning. Default: the
        CloudWatch Logs default encryption.
    :param build_role: the role the build runs as. Default: a new role that trusts
        ``lambda.amazonaws.com`` (confused-deputy conditions), reads the asset and writes logs.
    :param description: Default: ``Rayito agent <image name>``.
    :param secret_looking_names: ``reject`` (default: the ``--env`` rule) or ``allow`` (for a
        project's ``[env]``, already warned as ``env_looks_secret``).
    :param keep_image_versions: how many versions the image keeps (1 to 49); older ones are
        deleted, oldest first, one at a time, never the latest active one (what the fleet runs and
        rolls to) nor one with a live VM, before each build and every ``prune_every``
        (docs/image.md "Old versions"). ``None`` keeps every version. Default: 5.
    :param prune_every: how often the pruner looks again. Default: one hour.
    :param pruner_reserved_concurrency: the pruner's reserved concurrency: 1 keeps a scheduled
        pass from overlapping a deploy's (``ImagePruner``); ``None`` where the account's
        concurrency quota leaves no room to reserve. Default: 1.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image_name: str,
        folder: Optional[str | Path] = None,
        code: Optional[s3_assets.Asset] = None,
        memory_mib: int = 2048,
        architecture: str = "ARM_64",
        base_image_arn: Optional[str] = None,
        base_image_version: str = DEFAULT_BASE_IMAGE_VERSION,
        hooks: Optional[ImageHooks] = None,
        environment: Optional[Mapping[str, str]] = None,
        egress_network_connectors: Sequence[str] = (),
        logging: bool = True,
        build_role: Optional[iam.IRole] = None,
        description: Optional[str] = None,
        secret_looking_names: str = "reject",
        own_log_group: bool = True,
        log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
        log_removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
        encryption_key: Optional[kms.IKey] = None,
        keep_image_versions: Optional[int] = 5,
        prune_every: cdk.Duration = cdk.Duration.hours(1),
        pruner_reserved_concurrency: Optional[int] = 1,
    ) -> None:
        problems = []
        if keep_image_versions is not None:
            try:
                check_keep(keep_image_versions)
            except ValueError as exc:
                problems.append(str(exc))
        if (folder is None) == (code is None):
            problems.append("folder, code: give exactly one of them")
        if not _NAME.match(image_name):
            problems.append(f"image_name: {image_name!r} must be 1 to 64 letters, digits, '-' or '_'")
        if not cdk.Token.is_unresolved(base_image_version) and not _MAJOR_VERSION.match(base_image_version or ""):
            problems.append(
                f"base_image_version: {base_image_version!r} is not a major version number such as '1' "
                "(CreateMicrovmImage rejects '1.0': 'Expected a single major version number')"
            )
        if memory_mib not in MEMORY_CLASSES_MIB:
            classes = ", ".join(str(c) for c in MEMORY_CLASSES_MIB)
            problems.append(f"memory_mib: {memory_mib} is not a MicroVM size class ({classes} MiB)")
        if architecture not in ("ARM_64", "X86_64"):
            problems.append(f"architecture: {architecture!r} is not one of 'ARM_64', 'X86_64'")
        if len(egress_network_connectors) > 1:
            problems.append(f"egress_network_connectors: {len(egress_network_connectors)} given, the build takes at most 1")
        env = dict(environment or {})
        if len(env) > 100:
            problems.append(f"environment: {len(env)} variables is above the limit of 100")
        for key, value in sorted(env.items()):
            reason = secret_reason(key)
            shape = credential_shape(value) if isinstance(value, str) else None
            if not _ENV_NAME.match(key):
                problems.append(f"environment: {key!r} is not a valid variable name")
            elif shape:
                problems.append(f"environment.{key}: {credential_problem(key, shape)}")
            elif reason and secret_looking_names == "reject":
                problems.append(f"environment: {key} looks like a secret ({reason}); pass it at run time, not in the image")
            elif len(value) > 4096:
                problems.append(f"environment.{key}: value of {len(value)} characters is above the limit of 4096")
        if folder is not None and not (Path(folder) / "Dockerfile").is_file():
            problems.append(f"folder: {str(folder)!r} has no Dockerfile at its root")
        if hooks is not None:
            try:
                hooks.check()
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("\n".join(problems))
        super().__init__(scope, id)
        claim(self, "image", image_name)  # one MicrovmImage of a name per account and region
        stack = cdk.Stack.of(self)
        self.image_name = image_name
        """The image's name."""
        if code is None:
            path = Path(folder).resolve()  # type: ignore[arg-type]
            code = s3_assets.Asset(
                self,
                "Code",
                path=str(path),
                exclude=[*DEFAULT_EXCLUDES, *dockerignore_patterns(path)],
                ignore_mode=cdk.IgnoreMode.DOCKER,
            )
        self.code = code
        """The zip asset the service builds from."""
        self.code_object_arns = (code.bucket.arn_for_objects(code.s3_object_key),)
        log_group = f"{LOG_GROUP_PREFIX}{image_name}"
        self.egress_network_connectors = tuple(egress_network_connectors)
        """Customer connectors the build uses (the publisher passes them, and ``INTERNET_EGRESS``)."""
        self.log_group: Optional[logs.LogGroup] = None
        """``/aws/lambda-microvms/<name>``, when the stack owns it (``own_log_group``)."""
        if logging and own_log_group:
            self.log_group = logs.LogGroup(
                self,
                "Logs",
                log_group_name=log_group,
                retention=log_retention,
                removal_policy=log_removal_policy,
                encryption_key=_usable_log_key(self, encryption_key, log_group),
            )
        if build_role is None:
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
            # The build reads exactly this zip (CDK's grant_read would open the whole asset bucket).
            log_actions = ("logs:CreateLogStream", "logs:PutLogEvents")
            statements = [
                Statement("ReadCode", ("s3:GetObject",), self.code_object_arns),
                Statement("BuildLogs", log_actions if self.log_group else ("logs:CreateLogGroup", *log_actions),
                          (microvm_log_streams_arn(stack, image_name),)),
            ]
            for statement in statements:
                role.add_to_policy(statement.to_policy_statement())
            acknowledge_statements(role, statements, {"BuildLogs": "the log streams of this image's own log group"})
            build_role = role
        self.build_role = build_role
        """The role the build runs as."""
        base = base_image_arn or f"arn:{stack.partition}:lambda:{stack.region}:aws:microvm-image:{DEFAULT_BASE_IMAGE}"
        self.resource = lambda_.CfnMicrovmImage(
            self,
            "Resource",
            name=image_name,
            description=description or f"Rayito agent {image_name}",
            base_image_arn=base,
            base_image_version=base_image_version,
            build_role_arn=build_role.role_arn,
            code_artifact=lambda_.CfnMicrovmImage.CodeArtifactProperty(
                uri=f"s3://{code.s3_bucket_name}/{code.s3_object_key}"
            ),
            cpu_configurations=[lambda_.CfnMicrovmImage.CpuConfigurationProperty(architecture=architecture)],
            resources=[lambda_.CfnMicrovmImage.ResourcesProperty(minimum_memory_in_mib=memory_mib)],
            additional_os_capabilities=[],
            egress_network_connectors=list(egress_network_connectors),
            environment_variables=[
                lambda_.CfnMicrovmImage.EnvironmentVariableProperty(key=k, value=v) for k, v in sorted(env.items())
            ],
            hooks=(hooks or ImageHooks()).to_cfn(),
            logging=(
                lambda_.CfnMicrovmImage.LoggingProperty(
                    cloud_watch=lambda_.CfnMicrovmImage.CloudWatchLoggingProperty(log_group=log_group)
                )
                if logging
                else lambda_.CfnMicrovmImage.LoggingProperty(disabled=True)
            ),
        )
        self.resource.node.add_dependency(build_role)
        if self.log_group is not None:
            self.resource.node.add_dependency(self.log_group)
        self.pruner: Optional[ImagePruner] = None
        """Deletes old versions (``keep_image_versions``), unless that is None."""
        if keep_image_versions is not None:
            self.pruner = ImagePruner(self, "Pruner", image_name=image_name, keep_image_versions=keep_image_versions,
                                      digest=properties_digest(self, self.resource), prune_every=prune_every,
                                      reserved_concurrency=pruner_reserved_concurrency)
            # Before each build: room for the new version (and no delete under way when it starts).
            self.resource.node.add_dependency(self.pruner.resource)
        self.image_arn: str = self.resource.attr_image_arn
        """The image's ARN."""
        self.latest_active_image_version: Optional[str] = self.resource.attr_latest_active_image_version
        """The version new MicroVMs run (changes when a deploy builds a new one)."""

    @property
    def owns_log_group(self) -> bool:
        """True when the stack makes the image's log group (the VMs need not create it)."""
        return self.log_group is not None

    @staticmethod
    def from_image_arn(scope: Construct, id: str, image_arn: str) -> ImportedAgentImage:
        """An image published elsewhere."""
        return ImportedAgentImage(scope, id, image_arn=image_arn)
