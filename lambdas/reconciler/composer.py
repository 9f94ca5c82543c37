"""The image composer: the product's agent image of a project, composed at deploy over a base
image already published in the account (``rayito setup --caps-image``, ``rayito image publish``).

``Custom::RayitoImageComposer`` (``rayito_constructs.image_composer.ImageComposer``) calls it on
Create and Update, and the agent image's ``CodeArtifact`` is its answer. It does what the
product's ``ProjectService.build`` does before it creates the image, with the product's own
functions:

1. reads the project's build context, the overlay made at synth (``composition.template_overlay``:
   the template's spec and its context files), from the stack's assets, checked against its sha256;
2. finds the base image (``GetMicrovmImage``) and its version with the product's
   ``resolve_base_version``: the pinned one, else the newest SUCCESSFUL and ACTIVE
   (``ListMicrovmImageVersions``, then ``GetMicrovmImageVersion``);
3. checks that the version declares what the stack declared for the image it inherits from
   (hooks, capabilities, architecture, environment, connectors): the image must be what the
   product's build would make;
4. reads the base's zip (``codeArtifact.uri``) with the product's ``fetch_base_artifact``;
5. composes with the same function synth uses (``composition.compose``);
6. uploads it, content-addressed, under ``ArtifactPrefix`` with the product's ``upload_if_absent``
   (a second run with the same inputs uploads nothing).

The answer's ``Data``: ``ArtifactBucket``, ``ArtifactKey``, ``ArtifactUri``, ``ArtifactSha256``,
``Uploaded``, ``BaseImageVersion`` (the version composed on), ``BaseArtifactUri``, and
``ManagedBaseImageArn``/``ManagedBaseImageVersion`` (the managed base that version declares, which
the agent image inherits, in the spelling CreateMicrovmImage takes). Any failure is a ``FAILED``
answer whose reason is one line naming what went wrong. A Delete does nothing: composed zips are
content-addressed and kept (an image version built from one may be rebuilt from it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from rayito._images import account_image_arn, inherited_configuration, upload_if_absent
from rayito._templates._build import fetch_base_artifact, resolve_base_version
from rayito.exceptions import BuildException, NotFoundException

from .aws import session
from .composition import DECLARED_KEYS, CompositionError, artifact_key, compose
from .custom_resource import BadRequest, check_identity, error_code, log, remaining_seconds, respond, response_url_ok

RESOURCE_TYPE = "Custom::RayitoImageComposer"
SERVICE = "rayito-image-composer"
#: Where ``rayito setup`` keeps base zips, and for how long (its ``ArtifactExpirationDays``).
BASE_ZIP_DAYS = 7
#: Kept back to answer CloudFormation: a step is not started with less time left than this.
RESERVE_SECONDS = 20.0
#: Three attempts a call (the composer decides nothing on its own: a throttled call is retried).
MICROVMS_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=15)
#: A base zip is tens of megabytes: a minute to read it.
S3_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?$")
_PREFIX = re.compile(r"^rayito/templates/[A-Za-z0-9_-]{1,64}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class Failure(Exception):
    """What CloudFormation is told when the composition fails: one line."""

    def __init__(self, line: str) -> None:
        super().__init__(" ".join(line.split()))
        self.line = " ".join(line.split())


@dataclass(frozen=True)
class Request:
    """The resource's properties, checked."""

    image_name: str
    context_bucket: str
    context_key: str
    context_sha256: str
    base_name: str
    base_version: Optional[str]
    artifact_bucket: str
    artifact_prefix: str
    declared: Mapping[str, Any]

    @classmethod
    def parse(cls, props: Mapping[str, Any]) -> "Request":
        """Raises :class:`BadRequest` naming the property (never echoing a value)."""
        for key, pattern in (("ImageName", _NAME), ("BuildContextSha256", _SHA256), ("BaseImageName", _NAME),
                             ("ArtifactPrefix", _PREFIX), ("ArtifactBucket", _BUCKET), ("BuildContextBucket", _BUCKET)):
            if not isinstance(props.get(key), str) or not pattern.match(props[key]):
                raise BadRequest(f"{key} is missing or malformed")
        if not isinstance(props.get("BuildContextKey"), str) or not props["BuildContextKey"]:
            raise BadRequest("BuildContextKey is missing")
        version = props.get("BaseImageVersion") or None
        if version is not None and not (isinstance(version, str) and _VERSION.match(version)):
            raise BadRequest("BaseImageVersion must be empty (the latest ACTIVE) or a version such as 3 or 3.0")
        try:
            declared = json.loads(str(props.get("Inherits") or "{}"))
        except ValueError:
            declared = None
        if not isinstance(declared, dict) or set(declared) - set(DECLARED_KEYS):
            raise BadRequest(f"Inherits must be a JSON object of {', '.join(DECLARED_KEYS)}")
        return cls(image_name=props["ImageName"], context_bucket=props["BuildContextBucket"],
                   context_key=props["BuildContextKey"], context_sha256=props["BuildContextSha256"],
                   base_name=props["BaseImageName"], base_version=version, artifact_bucket=props["ArtifactBucket"],
                   artifact_prefix=props["ArtifactPrefix"], declared=declared)


@dataclass(frozen=True)
class Clients:
    """What the product's build functions take (``BuildClients``): its clients, region and account."""

    microvms: Any
    s3: Any
    region: str
    account_id: str
    logs: Any = None


def clients(region: str, account_id: str) -> Clients:
    """The production clients: the function's credentials, region and endpoints."""
    made = session()
    return Clients(microvms=made.client("lambda-microvms", config=MICROVMS_CONFIG),
                   s3=made.client("s3", config=S3_CONFIG), region=region, account_id=account_id)


def mismatches(declared: Mapping[str, Any], version: Mapping[str, Any]) -> list[str]:
    """The keys of :data:`DECLARED_KEYS` whose value the base version declares otherwise than the
    stack (absent, ``[]`` and ``{}`` are all "none")."""
    inherited = inherited_configuration(dict(version))
    return [key for key in DECLARED_KEYS if (declared.get(key) or None) != (inherited.get(key) or None)]


def _aws_line(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    code = error_code(exc)
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return f"{code} (HTTP {status})" if status else code


def _denied(exc: BaseException) -> bool:
    return error_code(exc) in ("AccessDenied", "AccessDeniedException", "403")


class Composer:
    """One composition, within the time the function has left."""

    def __init__(self, request: Request, aws: Clients, context: Any) -> None:
        self.request = request
        self.aws = aws
        self.context = context
        self.base = f"base image {request.base_name}"

    def _time(self, step: str) -> None:
        if remaining_seconds(self.context, default=900.0) < RESERVE_SECONDS:
            raise Failure(f"out of time before {step} (the function's timeout); deploy again")

    def build_context(self) -> bytes:
        r = self.request
        where = f"the project's build context s3://{r.context_bucket}/{r.context_key}"
        self._time("reading the project's build context")
        try:
            data: bytes = self.aws.s3.get_object(Bucket=r.context_bucket, Key=r.context_key)["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise Failure(f"{where}: {_aws_line(exc)} (cdk deploy uploads it before CloudFormation runs)") from None
        if hashlib.sha256(data).hexdigest() != r.context_sha256:
            raise Failure(f"{where}: its sha256 is not the BuildContextSha256 the stack was synthesized with")
        return data

    def base_version(self) -> dict[str, Any]:
        r = self.request
        arn = account_image_arn(self.aws.region, self.aws.account_id, r.base_name)
        self._time("GetMicrovmImage")
        try:
            image = self.aws.microvms.get_microvm_image(imageIdentifier=arn)
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise Failure(self._no_image()) from None
            raise Failure(f"{self.base}: GetMicrovmImage: {_aws_line(exc)}") from None
        if str(image.get("state", "")) in ("DELETING", "DELETED"):
            raise Failure(self._no_image())
        self._time("finding the base version")
        try:
            return resolve_base_version(self.aws, r.base_name, r.base_version)
        except NotFoundException:
            raise Failure(f"{self.base}: no SUCCESSFUL and ACTIVE version to compose on (rayito image list-versions "
                          f"{r.base_name}; publish one, or pin a version)") from None
        except (ClientError, BotoCoreError) as exc:
            if r.base_version is not None and error_code(exc) == "ResourceNotFoundException":
                raise Failure(f"{self.base}: the pinned version {r.base_version} does not exist (give another "
                              "version, or none for the latest ACTIVE)") from None
            raise Failure(f"{self.base}: reading its versions: {_aws_line(exc)}") from None

    def _no_image(self) -> str:
        return (f"{self.base}: not found in account {self.aws.account_id} region {self.aws.region} (publish it with "
                "rayito setup --caps-image, or compose at synth from a release zip: base_artifact)")

    def base_zip(self, version: Mapping[str, Any], label: str) -> bytes:
        uri = str((version.get("codeArtifact") or {}).get("uri") or "")
        self._time("reading the base's zip")
        try:
            return fetch_base_artifact(self.aws, dict(version))
        except BuildException as exc:  # uncovered: the service makes no version without an s3:// codeArtifact.uri (Q84)
            raise Failure(f"{label}: its codeArtifact cannot be read ({exc.reason or 'no s3:// URI'})") from None
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise Failure(f"{label}: its zip {uri} is gone (rayito setup keeps base zips {BASE_ZIP_DAYS} days): "
                              "publish the base again, or compose at synth from the release zip (base_artifact)") from None
            if _denied(exc):
                raise Failure(f"{label}: reading its zip {uri}: access denied (the composer reads rayito/images/* of "
                              "the base's artifact bucket: give base_artifact_bucket)") from None
            raise Failure(f"{label}: reading its zip {uri}: {_aws_line(exc)}") from None

    def run(self) -> dict[str, str]:
        r = self.request
        overlay = self.build_context()
        version = self.base_version()
        number = str(version.get("imageVersion", ""))
        label = f"{self.base} version {number}"
        differ = mismatches(r.declared, version)
        if differ:
            raise Failure(f"{label}: its {', '.join(differ)} differ from what the stack declares for the agent image "
                          "(rayito setup's base); compose at synth from a RayitoMicrovmImage or a release zip")
        inherited = inherited_configuration(version)
        if not inherited.get("baseImageArn") or not inherited.get("baseImageVersion"):
            raise Failure(f"{label}: it declares no managed base (baseImageArn, baseImageVersion) to inherit")
        base_zip = self.base_zip(version, label)
        self._time("composing")
        try:
            artifact = compose(base_zip, overlay, where=label)
        except CompositionError as exc:
            raise Failure(str(exc)) from None
        key = artifact_key(artifact, r.artifact_prefix)
        self._time("uploading the composed zip")
        try:
            uploaded = upload_if_absent(self.aws, r.artifact_bucket, key, artifact, self.aws.account_id)
        except (ClientError, BotoCoreError) as exc:
            why = "access denied" if _denied(exc) else _aws_line(exc)
            raise Failure(f"uploading the composed zip to s3://{r.artifact_bucket}/{key}: {why}") from None
        return {
            "ArtifactBucket": r.artifact_bucket,
            "ArtifactKey": key,
            "ArtifactUri": f"s3://{r.artifact_bucket}/{key}",
            "ArtifactSha256": hashlib.sha256(artifact).hexdigest(),
            "Uploaded": "true" if uploaded else "false",
            "BaseImageVersion": number,
            "BaseArtifactUri": str(version["codeArtifact"]["uri"]),
            "ManagedBaseImageArn": str(inherited["baseImageArn"]),
            "ManagedBaseImageVersion": str(inherited["baseImageVersion"]),
        }


def _account(context: Any) -> str:
    """The function's account, from its own ARN (no STS call)."""
    parts = str(getattr(context, "invoked_function_arn", "") or "").split(":")
    return parts[4] if len(parts) > 4 else ""


def handler(event: Mapping[str, Any], context: Any) -> None:
    """Lambda entry point: CloudFormation's requests for this function's image."""
    env = os.environ
    region = env.get("AWS_REGION", "")
    if not response_url_ok(str(event.get("ResponseURL", "")), region):
        log({"event": "refused", "service": SERVICE, "reason": "ResponseURL is not CloudFormation's response endpoint"})
        return
    kind = str(event.get("RequestType"))
    physical = str(event.get("PhysicalResourceId") or f"rayito-composer:{env.get('IMAGE_NAME', '')}")
    props = event.get("ResourceProperties") or {}
    try:
        named = check_identity(event, context, env, RESOURCE_TYPE)
        if named != env.get("IMAGE_NAME"):
            raise BadRequest("the resource is not this function's image")
        request = Request.parse(props) if kind != "Delete" else None
        if request is not None and request.image_name != named:
            raise BadRequest("ImageName is not this function's image")
    except BadRequest as exc:
        log({"event": "refused", "service": SERVICE, "reason": str(exc), "action": kind})
        respond(event, "FAILED", physical, {}, f"refused: {exc}")
        return
    if request is None:
        # Composed zips are content-addressed and shared by every deploy that made the same one.
        respond(event, "SUCCESS", physical, {"Outcome": "kept"}, "composed zips are kept")
        return
    try:
        data = Composer(request, clients(region, _account(context)), context).run()
    except Failure as exc:
        log({"event": "image_not_composed", "service": SERVICE, "action": kind, "image": request.image_name,
             "reason": exc.line})
        respond(event, "FAILED", physical, {}, exc.line)
        return
    log({"event": "image_composed", "service": SERVICE, "action": kind, "image": request.image_name, **data})
    respond(event, "SUCCESS", data["ArtifactUri"], data, f"composed on {request.base_name} version {data['BaseImageVersion']}")
