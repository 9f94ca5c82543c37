"""``ImageComposer``: the product's agent image composed at deploy, over a base image already
published in the account (``rayito setup --caps-image``, ``rayito image publish``).

``AgentImage(rayd=PublishedBaseImage())`` makes one: the base's zip lives only in S3, so it cannot
be composed at synth. The project's side of the composition (the template's spec and its context
files, :func:`~rayito_constructs.image_composition.build_context`) is made at synth and travels as
a file asset; a custom resource (``Custom::RayitoImageComposer``, its function
``lambdas/reconciler/composer.py``) finds the base's version, reads its zip, composes with the
same functions synth uses (``lambdas/reconciler/composition.py``) and uploads the result,
content-addressed, to the stack's asset bucket. The image's ``CodeArtifact``, ``BaseImageArn``
and ``BaseImageVersion`` are its answer. No Docker and no network at synth.

Its function's role may only read the base image and its versions, read the base's zips
(``rayito/images/*`` of ``rayito setup``'s bucket), read the build context, and read and write
the composed zips of this image (``rayito/templates/<image>/*`` of the asset bucket).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from ._assets import content_file
from ._function import lazy_string, library_function
from ._lambdas.reconciler.composer import RESOURCE_TYPE
from .permissions import (
    BASE_IMAGE_ACTIONS,
    Statement,
    artifact_bucket_name,
    image_and_versions,
    image_arn_for,
    wildcard_reasons,
)
from .product_layer import ProductLayer

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_VERSION = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?\Z")
#: Where the composed zips go in the asset bucket (the product's ``rayito/templates``, per image).
ARTIFACT_PREFIX = "rayito/templates"
#: Where ``rayito image publish`` and ``rayito setup`` upload base zips (the product's ``S3_KEY_PREFIX``).
BASE_ARTIFACT_PREFIX = "rayito/images"
#: The base zip and the composed one are held in memory (about four times the zip in all) and
#: deflated again: 2 GiB gives the function more than a vCPU.
MEMORY_MIB = 2048
TIMEOUT = cdk.Duration.minutes(5)


@dataclass(frozen=True)
class PublishedBaseImage:
    """``rayd`` from a base image already published in the account and region: the agent image is
    composed at deploy (:class:`ImageComposer`), as ``rayito agent deploy`` composes it.

    :param name: the base image. Default: the project's ``[image] base`` (``rayito-base-caps``);
        another name is refused, since the product composes on the project's base.
    :param version: a version of it to compose on (``"3"``, ``"3.0"``). Default: the project's
        ``[deploy] base_image_version`` (the product's pin), else the newest SUCCESSFUL and ACTIVE
        version when the composer runs.
    :param artifact_bucket: the bucket its zip is in. Default: ``rayito setup``'s bucket,
        ``rayito-artifacts-<account>-<region>``.
    """

    name: Optional[str] = None
    version: Optional[str] = None
    artifact_bucket: Optional[s3.IBucket] = None
    _option: str = field(default="rayd", repr=False, compare=False)  # what errors name (app.py: base_image)

    def resolve(self, project_base: str, project_pin: Optional[str]) -> tuple[str, Optional[str]]:
        """``(base image name, pinned version or None)`` for a project whose ``[image] base`` is
        ``project_base`` and ``[deploy] base_image_version`` is ``project_pin``; one-line
        ``ValueError`` s for what the product would not compose on."""
        if self.name is not None and self.name != project_base:
            raise ValueError(f"{self._option}: the base image {self.name!r} is not the project's base {project_base!r} "
                             f"([image] base), which rayito agent deploy composes on; set [image] base = {self.name!r}")
        if not _NAME.match(project_base):
            raise ValueError(f"{self._option}: the base {project_base!r} is not the name of an image of the account "
                             "(1 to 64 letters, digits, '-' or '_')")
        version = self.version if self.version is not None else project_pin
        if version in (None, "latest"):
            return project_base, None
        if cdk.Token.is_unresolved(version) or not _VERSION.match(str(version)):
            raise ValueError(f"{self._option}: the base version {version!r} is not a version such as '3' or '3.0' (none: "
                             "the newest ACTIVE one when the composer runs)")
        return project_base, str(version)


class ImageComposer(Construct):
    """Composes the agent image's zip at deploy over a base image published in the account.

    :param image_name: the agent image the zip is for (names the prefix the zips go under).
    :param build_context: the project's side of the composition, the overlay zip
        (:func:`~rayito_constructs.image_composition.build_context`).
    :param base_image_name: the base image (``rayito-base-caps``).
    :param base_image_version: its version to compose on. Default: the newest SUCCESSFUL and ACTIVE.
    :param declared: what the agent image declares it inherits from the base (hooks,
        capabilities, architecture...); the composer fails the deploy when the base's version
        declares otherwise.
    :param base_artifact_bucket: where the base's zip is. Default: ``rayito setup``'s bucket.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image_name: str,
        build_context: bytes,
        base_image_name: str,
        base_image_version: Optional[str] = None,
        declared: Optional[Mapping[str, Any]] = None,
        base_artifact_bucket: Optional[s3.IBucket] = None,
    ) -> None:
        for option, value in (("image_name", image_name), ("base_image_name", base_image_name)):
            if not _NAME.match(value or ""):
                raise ValueError(f"{option}: {value!r} is not a MicroVM image name (1 to 64 letters, digits, '-' or '_')")
        if base_image_version is not None and not _VERSION.match(base_image_version):
            raise ValueError(f"base_image_version: {base_image_version!r} is not a version such as '3' or '3.0'")
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        digest = hashlib.sha256(build_context).hexdigest()
        self.build_context = s3_assets.Asset(self, "BuildContext", path=str(content_file(build_context, f"context-{digest}.zip")),
                                             asset_hash=digest, asset_hash_type=cdk.AssetHashType.CUSTOM)
        """The project's build context (the overlay zip), in the asset bucket."""
        context = self.build_context
        self.image_name = image_name
        self.base_image_name = base_image_name
        self.base_image_version = base_image_version
        self.artifact_prefix = f"{ARTIFACT_PREFIX}/{image_name}"
        """Where the composed zips go in the asset bucket, ``rayito/templates/<image>``."""
        self.artifact_bucket_name = context.s3_bucket_name
        """The stack's asset bucket."""
        self.artifact_object_arns = (context.bucket.arn_for_objects(f"{self.artifact_prefix}/*"),)
        """The composed zips of this image (their sha256 is known only at deploy)."""
        base_bucket_arn = (base_artifact_bucket.bucket_arn if base_artifact_bucket is not None
                           else f"arn:{stack.partition}:s3:::{artifact_bucket_name(stack)}")
        statements = [
            Statement("BaseImage", BASE_IMAGE_ACTIONS, image_and_versions(image_arn_for(stack, base_image_name))),
            Statement("ReadBaseArtifacts", ("s3:GetObject",), (f"{base_bucket_arn}/{BASE_ARTIFACT_PREFIX}/*",)),
            Statement("ReadBuildContext", ("s3:GetObject",), (context.bucket.arn_for_objects(context.s3_object_key),)),
            Statement("ComposedArtifacts", ("s3:GetObject", "s3:PutObject"), self.artifact_object_arns),
        ]
        made = library_function(
            self,
            name="reconciler",
            as_package=True,
            handler="reconciler.composer.handler",
            description=f"Rayito image composer: the agent image {image_name} over {base_image_name}",
            role_description=f"Rayito image composer of {image_name}: reads {base_image_name}, writes its zips",
            statements=statements,
            wildcard_reasons=wildcard_reasons(statements),
            timeout=TIMEOUT,
            memory_size=MEMORY_MIB,
            layers=[ProductLayer.of(self).layer],  # the product's build functions (lambdas/reconciler/composer.py)
            environment={
                "STACK_ID": cdk.Aws.STACK_ID,
                "IMAGE_NAME": image_name,
                "RESOURCES": lazy_string(self._resource_map),
            },
            retry_attempts=0,  # a CloudFormation request is answered once
        )
        self.function = made.function
        """The composer function."""
        self.role = made.role
        """Its role."""
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={
                "ImageName": image_name,
                "BuildContextBucket": context.s3_bucket_name,
                "BuildContextKey": context.s3_object_key,
                "BuildContextSha256": digest,
                "BaseImageName": base_image_name,
                "BaseImageVersion": base_image_version or "",
                "ArtifactBucket": self.artifact_bucket_name,
                "ArtifactPrefix": self.artifact_prefix,
                "Inherits": json.dumps(dict(declared or {}), sort_keys=True, separators=(",", ":")),
            },
            # The function always answers within its timeout; this bounds a lost answer too.
            service_timeout=cdk.Duration.seconds(TIMEOUT.to_seconds() + 60),
        )
        # Composed after its role may read and write, as CloudFormation runs it.
        self.resource.node.add_dependency(made.role)

    @property
    def artifact_uri(self) -> str:
        """``s3://<asset bucket>/rayito/templates/<image>/<sha256>.zip`` (at deploy)."""
        return self.resource.get_att_string("ArtifactUri")

    @property
    def artifact_sha256(self) -> str:
        """The composed zip's sha256 (at deploy)."""
        return self.resource.get_att_string("ArtifactSha256")

    @property
    def composed_on_version(self) -> str:
        """The version of the base image the zip was composed on (at deploy)."""
        return self.resource.get_att_string("BaseImageVersion")

    @property
    def managed_base_image_arn(self) -> str:
        """The managed base that version declares (``BaseImageArn`` of the agent image)."""
        return self.resource.get_att_string("ManagedBaseImageArn")

    @property
    def managed_base_image_version(self) -> str:
        """Its major version, as CreateMicrovmImage takes it (``BaseImageVersion`` of the agent image)."""
        return self.resource.get_att_string("ManagedBaseImageVersion")

    def _resource_map(self) -> str:
        stack = cdk.Stack.of(self)
        return json.dumps({stack.resolve(stack.get_logical_id(self.resource.node.default_child)): self.image_name},
                          separators=(",", ":"))
