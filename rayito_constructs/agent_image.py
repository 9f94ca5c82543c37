"""``AgentImage``: the agent's MicroVM image, built by the service in the same ``cdk deploy``.

An L2 over ``aws_lambda.CfnMicrovmImage`` (``AWS::Lambda::MicrovmImage``). The agent folder
(a Dockerfile at its root) becomes an S3 zip asset with no Docker at synth: the MicroVMs service
builds the image from it. A changed folder changes the asset, so CloudFormation updates the image
and the service builds a new version; the fleet's reconciler rolls onto it (docs/image.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from ._nag import acknowledge_wildcard_resources
from .envrules import secret_reason
from .names import claim
from .options import MEMORY_CLASSES_MIB
from .permissions import LAMBDA_SERVICE, image_arn_for

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
#: Always left out of the uploaded folder, on top of its .dockerignore.
DEFAULT_EXCLUDES = (".git", "cdk.out", "node_modules", "__pycache__", "*.pyc", ".venv", ".DS_Store")
DEFAULT_BASE_IMAGE = "al2023-1"
DEFAULT_BASE_IMAGE_VERSION = "0"


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
    :param base_image_version: the managed base image's version, pinned so synth is offline and
        deterministic. Default: ``"0"`` (the only managed version reported so far; see docs/image.md).
    :param hooks: lifecycle hooks. Default: none enabled.
    :param environment: variables baked into the image; names that look like secrets are refused
        (the ``--env`` rule): pass secrets at run time instead. Default: none.
    :param egress_network_connectors: at most one customer connector for the build. Default: none.
    :param logging: ``True`` for CloudWatch Logs in ``/aws/lambda-microvms/<image name>``,
        ``False`` to turn build and runtime logs off. Default: True.
    :param build_role: the role the build runs as. Default: a new role that trusts
        ``lambda.amazonaws.com`` (confused-deputy conditions), reads the asset and writes logs.
    :param description: Default: ``Rayito agent <image name>``.
    :param secret_looking_names: ``reject`` (default: the ``--env`` rule) or ``allow`` (for a
        project's ``[env]``, already warned as ``env_looks_secret``).
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
    ) -> None:
        problems = []
        if (folder is None) == (code is None):
            problems.append("folder, code: give exactly one of them")
        if not _NAME.match(image_name):
            problems.append(f"image_name: {image_name!r} must be 1 to 64 letters, digits, '-' or '_'")
        if not re.fullmatch(r"\S{1,2048}", base_image_version or ""):
            problems.append(f"base_image_version: {base_image_version!r} must be 1 to 2048 characters, no spaces")
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
            if not _ENV_NAME.match(key):
                problems.append(f"environment: {key!r} is not a valid variable name")
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
        log_group = f"/aws/lambda-microvms/{image_name}"
        if build_role is None:
            role = iam.Role(
                self,
                "BuildRole",
                assumed_by=iam.SessionTagsPrincipal(
                    iam.PrincipalWithConditions(
                        iam.ServicePrincipal(LAMBDA_SERVICE),
                        {
                            "StringEquals": {"aws:SourceAccount": stack.account},
                            "ArnLike": {"aws:SourceArn": image_arn_for(stack, image_name) + "*"},
                        },
                    )
                ),
                description=f"Rayito: builds the MicroVM image {image_name}",
            )
            # The build reads exactly this zip (CDK's grant_read would open the whole asset bucket).
            role.add_to_policy(iam.PolicyStatement(sid="ReadCode", actions=["s3:GetObject"],
                                                   resources=list(self.code_object_arns)))
            streams = stack.format_arn(service="logs", resource="log-group", resource_name=f"{log_group}:*",
                                       arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
            role.add_to_policy(iam.PolicyStatement(
                sid="BuildLogs", actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[streams]))
            acknowledge_wildcard_resources(role, [streams], "the log streams of this image's own log group")
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
        self.image_arn: str = self.resource.attr_image_arn
        """The image's ARN."""
        self.latest_active_image_version: Optional[str] = self.resource.attr_latest_active_image_version
        """The version new MicroVMs run (changes when a deploy builds a new one)."""

    @staticmethod
    def from_image_arn(scope: Construct, id: str, image_arn: str) -> ImportedAgentImage:
        """An image published elsewhere."""
        return ImportedAgentImage(scope, id, image_arn=image_arn)
