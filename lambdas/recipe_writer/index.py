"""Custom resource handler: writes the fleet recipe as an SSM SecureString. Never logs the recipe,
never fails a deploy unless asked to, answers only CloudFormation.

CloudFormation cannot create a SecureString parameter, so ``Custom::RayitoRecipe`` resources call
this function. The recipe is **not** a template property (anyone with
``cloudformation:GetTemplate`` would read it): the stack ships the recipe document as an S3 asset
in its deployment bucket, and the resource names the object and its SHA-256. This function reads
it (its role may read exactly those objects), checks it, and then does with the product's own code
(``rayito``, from the function's layer) what ``rayito agent deploy`` does with the image version
CloudFormation resolved at deploy: the product's recipe with that version
(``recipe_from_document``, ``recipe_document``), encoded as the product encodes it (canonical JSON
up to 4,096 bytes, the ``gzip+base64`` envelope above that, nothing when even that does not fit)
and put with the product's description. So the value is byte for byte what the product saves.

Properties (strings): ``ParameterName``, ``DocumentBucket``, ``DocumentKey``, ``DocumentSha256``,
``ImageVersion`` (optional: the version the stack built), ``KeyId`` (optional customer key),
``KeepOnDelete`` (``"true"`` keeps the parameter on delete), ``FailureMode`` (``warn``: a failed save
is reported and the deploy goes on, the product page's rule; ``fail``: the deploy rolls back),
``Metrics`` (``on``: emit the metrics below; anything else or nothing: emit none).

The outcome is answered as response ``Data`` (``Saved``, ``Outcome``, ``Reason``, ``Encoding``,
``Bytes``, ``ImageVersion``), logged as one JSON line and, when ``Metrics`` is ``on``, emitted as
the ``RecipeSaved`` and ``RecipeNotSaved`` metrics (embedded metric format, namespace
``Rayito/Fleet``, dimension ``fleet``): with metrics off (the fleet's default) the function prints
no EMF line, so the fleet pays for no custom metric. Outcomes: ``saved``, ``kept``, ``deleted``, and the page's warning codes
``recipe_too_large``, ``recipe_access_denied``, ``recipe_not_saved``.

Who may invoke this function may write the fleets' recipes. So it acts only on events for its own
stack (``StackId``), for one of its own ``Custom::RayitoRecipe`` resources (``LogicalResourceId``,
mapped to its fleet), sent to itself (``ServiceToken``), and answers only CloudFormation's
pre-signed response URL (``https://cloudformation-custom-resource-response-<region>.s3...``);
anything else is refused without a write, and a request that names another URL is never answered.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import boto3
from botocore.config import Config
from rayito._agent._fleet_recipe import (
    RecipeWarning,
    canonical_json,
    encode_recipe,
    recipe_document,
    recipe_from_document,
)
from rayito._limits import AGENT_RECIPE_DESCRIPTION, AGENT_RECIPE_MAX_BYTES, AGENT_RECIPE_SCHEMA

LOG = logging.getLogger("rayito.recipe_writer")
LOG.setLevel(os.environ.get("LOG_LEVEL", "INFO"))
# botocore logs request bodies at DEBUG, and the body of PutParameter is the recipe: keep the SDK's
# loggers quiet whatever log level the function is given.
for _sdk_logger in ("botocore", "boto3", "urllib3"):
    logging.getLogger(_sdk_logger).setLevel(logging.WARNING)

PARAMETER_PREFIX = "/rayito/agents/"
RESOURCE_TYPE = "Custom::RayitoRecipe"
STANDARD_PARAMETER_BYTES = AGENT_RECIPE_MAX_BYTES
NAMESPACE = "Rayito/Fleet"
SERVICE = "rayito-recipe-writer"
#: The SDK's standard retry mode, 3 attempts per call in all (botocore's ``max_attempts`` counts
#: the retries only: 3 there makes 4 requests; ``total_max_attempts`` counts them all). With these
#: timeouts one call takes at most about 45 s, and the handler keeps ``RESERVE_MS`` to answer
#: CloudFormation (an unanswered request makes CloudFormation wait and then fail the deploy).
RETRIES = {"mode": "standard", "total_max_attempts": 3}
CONNECT_TIMEOUT = 3
READ_TIMEOUT = 10
CALL_BUDGET_MS = 45_000
RESERVE_MS = 10_000
RESPONSE_TIMEOUT = 10
#: S3 answers a pre-signed PUT with a 5xx now and then: the answer is sent up to 3 times.
RESPONSE_ATTEMPTS = 3
_VERSION = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FLEET = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class BadRequest(ValueError):
    """A request this handler refuses; its message holds no property value."""


class RemovedFleet(BadRequest):
    """The cleanup Delete of a fleet removed from this stack (its logical id is gone from
    RECIPE_RESOURCES, and its parameter from this function's role, in the update phase before)."""

    def __init__(self, parameter: str) -> None:
        super().__init__("LogicalResourceId is not one of this stack's recipe resources (a fleet removed from it)")
        self.parameter = parameter


class NotSaved(Exception):
    """The recipe could not be saved; ``code`` is the product page's warning code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class Clients:
    ssm: Any
    s3: Any


def _client(service: str) -> Any:
    config = Config(retries=dict(RETRIES), connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                    user_agent_extra=SERVICE)
    return boto3.client(service, config=config)


def clients() -> Clients:
    """The production clients (the Lambda's credentials, region and endpoints)."""
    return Clients(ssm=_client("ssm"), s3=_client("s3"))


# ------------------------------------------------------------------ encoding (the product's)


def encode(doc: Mapping[str, Any], image_version: Optional[str]) -> tuple[str, str, int]:
    """``(value, encoding, json_bytes)`` of the product's recipe of ``doc`` with ``image_version``
    (None: the document's own); raises :class:`NotSaved` (``recipe_too_large``, or
    ``recipe_not_saved`` for a document the product does not read)."""
    try:
        recipe = recipe_from_document(doc)
    except RecipeWarning:
        raise NotSaved("recipe_not_saved", "the recipe document is not one rayito reads") from None
    if image_version is not None:
        recipe = dataclasses.replace(recipe, image_version=image_version)
    document = recipe_document(recipe)
    plain = canonical_json(document)
    value = encode_recipe(document)
    if value is None:
        raise NotSaved(
            "recipe_too_large",
            f"the recipe is {len(plain.encode())} bytes as JSON, and does not fit the {STANDARD_PARAMETER_BYTES} "
            "bytes of a standard parameter even as gzip+base64",
        )
    return value, ("json" if value == plain else "gzip+base64"), len(plain.encode())


# ------------------------------------------------------------------ who may ask


def response_url_ok(url: str, region: str) -> bool:
    """True for CloudFormation's pre-signed response URL of ``region``: an HTTPS URL of an object in
    the bucket ``cloudformation-custom-resource-response-<region without dashes>`` (virtual-hosted
    ``<bucket>.s3[.-<region>].amazonaws.com``, or path-style on ``s3[.-<region>].amazonaws.com``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "https" or port not in (None, 443) or parts.username or parts.password or not region:
        return False
    bucket = re.escape(f"cloudformation-custom-resource-response-{region.replace('-', '')}")
    s3 = rf"s3(?:[.-]{re.escape(region)})?\.amazonaws\.com" + (r"\.cn" if region.startswith("cn-") else "")
    host = parts.hostname or ""
    if re.fullmatch(rf"{bucket}\.{s3}", host):
        return len(parts.path) > 1
    return bool(re.fullmatch(s3, host)) and bool(re.match(rf"^/{bucket}/.", parts.path))


def _unqualified(arn: str) -> str:
    """A function ARN without its version or alias."""
    parts = arn.split(":")
    return ":".join(parts[:7]) if len(parts) > 7 and parts[5] == "function" else arn


def _old_recipe_delete(event: Mapping[str, Any], props: Mapping[str, Any]) -> bool:
    """A cleanup Delete that names a recipe this resource no longer is (a fleet renamed in place,
    or removed from the stack): CloudFormation sends the old physical id with the old properties."""
    parameter = props.get("ParameterName")
    return (event.get("RequestType") == "Delete" and isinstance(parameter, str)
            and parameter.startswith(PARAMETER_PREFIX) and event.get("PhysicalResourceId") == parameter)


def check_identity(event: Mapping[str, Any], context: Any, environ: Mapping[str, str]) -> str:
    """The fleet the event is for; raises :class:`BadRequest` for an event that is not one of this
    stack's recipe resources, sent to this function."""
    if event.get("RequestType") not in ("Create", "Update", "Delete"):
        raise BadRequest("RequestType must be Create, Update or Delete")
    if event.get("ResourceType") != RESOURCE_TYPE:
        raise BadRequest(f"ResourceType must be {RESOURCE_TYPE}")
    if not environ.get("STACK_ID") or event.get("StackId") != environ["STACK_ID"]:
        raise BadRequest("StackId is not this writer's stack")
    resources = json.loads(environ.get("RECIPE_RESOURCES") or "{}")
    fleet: Optional[str] = resources.get(event.get("LogicalResourceId"))  # logical id -> fleet name
    own = _unqualified(getattr(context, "invoked_function_arn", "") or "")
    props = event.get("ResourceProperties") or {}
    tokens = {props.get("ServiceToken"), event.get("ServiceToken", props.get("ServiceToken"))}
    if not fleet:
        if own and tokens == {own} and _old_recipe_delete(event, props):
            raise RemovedFleet(props["ParameterName"])
        raise BadRequest("LogicalResourceId is not one of this stack's recipe resources")
    if not own or tokens != {own}:
        raise BadRequest("ServiceToken is not this function")
    if props.get("ParameterName") != f"{PARAMETER_PREFIX}{fleet}/recipe":
        if not _old_recipe_delete(event, props):
            raise BadRequest(f"ParameterName must be {PARAMETER_PREFIX}{fleet}/recipe for this resource")
        # The cleanup Delete of a fleet renamed in place: the old physical id with the old
        # properties. handle() sees a physical id that is not this fleet's and touches nothing.
    return fleet


# ------------------------------------------------------------------ what it does


class _Deadline:
    """Skips a call that could outlast the function: a late answer is worse than no recipe."""

    def __init__(self, context: Any) -> None:
        self._remaining = getattr(context, "get_remaining_time_in_millis", None)

    def check(self, what: str) -> None:
        if self._remaining is not None and self._remaining() < CALL_BUDGET_MS + RESERVE_MS:
            raise NotSaved("recipe_not_saved", f"not enough time left for {what} before the function's timeout")


def _response(exc: Exception) -> Mapping[str, Any]:
    """The parsed AWS error of ``exc``, or ``{}``. botocore's connection errors carry
    ``response = None`` (a store that hangs up was reported as ``AttributeError`` before)."""
    response = getattr(exc, "response", None)
    return response if isinstance(response, Mapping) else {}


def _error_code(exc: Exception) -> str:
    return str((_response(exc).get("Error") or {}).get("Code") or "") or type(exc).__name__


def _not_saved(exc: Exception, what: str) -> NotSaved:
    code = _error_code(exc)
    status = (_response(exc).get("ResponseMetadata") or {}).get("HTTPStatusCode")
    denied = code in ("AccessDeniedException", "AccessDenied") or status == 403
    return NotSaved("recipe_access_denied" if denied else "recipe_not_saved", f"{what}: {code}")


def read_document(s3: Any, props: Mapping[str, Any], fleet: str, deadline: _Deadline) -> dict[str, Any]:
    """The recipe document the stack shipped, checked against its SHA-256 and its fleet."""
    expected = str(props.get("DocumentSha256", ""))
    if not _SHA256.match(expected) or not props.get("DocumentBucket") or not props.get("DocumentKey"):
        raise BadRequest("DocumentBucket, DocumentKey and DocumentSha256 are required")
    deadline.check("reading the recipe document")
    try:
        body = s3.get_object(Bucket=props["DocumentBucket"], Key=props["DocumentKey"])["Body"].read()
    except Exception as exc:  # noqa: BLE001 - every store error becomes an outcome
        raise _not_saved(exc, "reading the recipe document") from None
    if hashlib.sha256(body).hexdigest() != expected:
        raise NotSaved("recipe_not_saved", "the recipe document does not match its DocumentSha256")
    try:
        doc = json.loads(body)
    except ValueError:
        raise NotSaved("recipe_not_saved", "the recipe document is not JSON") from None
    if (not isinstance(doc, dict) or doc.get("schema") != AGENT_RECIPE_SCHEMA or doc.get("name") != fleet
            or not isinstance(doc.get("image"), dict)):
        raise NotSaved("recipe_not_saved", f"the recipe document is not the {AGENT_RECIPE_SCHEMA} recipe of fleet {fleet}")
    return doc


def image_version(props: Mapping[str, Any]) -> Optional[str]:
    """The ``ImageVersion`` property: the version CloudFormation resolved (None: the document's)."""
    version = props.get("ImageVersion")
    if not version:
        return None
    if not _VERSION.match(str(version)):
        raise BadRequest("ImageVersion must look like 1 or 1.0")
    return str(version)


def _put(ssm: Any, name: str, value: str, encoding: str, key_id: Optional[str], deadline: _Deadline) -> None:
    args = {
        "Name": name,
        "Value": value,
        "Type": "SecureString",
        "Tier": "Standard",
        "Overwrite": True,
        "Description": AGENT_RECIPE_DESCRIPTION,  # the product's own
    }
    if key_id:
        args["KeyId"] = key_id
    deadline.check("PutParameter")
    try:
        ssm.put_parameter(**args)
    except Exception as exc:  # noqa: BLE001
        raise _not_saved(exc, "PutParameter") from None


def _delete(ssm: Any, name: str, deadline: _Deadline) -> bool:
    """Delete ``name``; False when it was already gone."""
    deadline.check("DeleteParameter")
    try:
        ssm.delete_parameter(Name=name)
        return True
    except Exception as exc:  # noqa: BLE001
        if _error_code(exc) == "ParameterNotFound":
            return False
        raise _not_saved(exc, "DeleteParameter") from None


def handle(event: Mapping[str, Any], fleet: str, aws: Clients, deadline: _Deadline) -> dict[str, str]:
    """Carry out one CloudFormation request for ``fleet``; returns the outcome (no recipe in it).

    Raises :class:`NotSaved` when the store refuses or the recipe does not fit.
    """
    kind = event["RequestType"]
    props = event.get("ResourceProperties") or {}
    name = f"{PARAMETER_PREFIX}{fleet}/recipe"
    if kind == "Delete":
        physical = event.get("PhysicalResourceId", "")
        if physical != name:
            # A create that failed before writing anything has no parameter to delete, and a
            # renamed fleet's old parameter is another resource's: touch nothing.
            if physical.startswith(PARAMETER_PREFIX):
                return {"Outcome": "skipped", "Saved": "false",
                        "Reason": f"renamed: the old recipe {physical} is left (this writer may no longer delete it); "
                                  "delete it by hand if no process reads it"}
            return {"Outcome": "skipped", "Saved": "false", "Reason": "no parameter of this resource to delete"}
        if str(props.get("KeepOnDelete", "false")).lower() == "true":
            return {"Outcome": "kept", "Saved": "true", "Reason": "keep_recipe"}
        deleted = _delete(aws.ssm, name, deadline)
        return {"Outcome": "deleted", "Saved": "false", "Reason": "deleted" if deleted else "already gone"}
    version = image_version(props)
    doc = read_document(aws.s3, props, fleet, deadline)
    try:
        value, encoding, json_bytes = encode(doc, version)
    except NotSaved as exc:
        if exc.code == "recipe_too_large":
            # As the product: when even the gzip+base64 envelope does not fit, the previous one is deleted.
            _delete(aws.ssm, name, deadline)
        raise
    _put(aws.ssm, name, value, encoding, props.get("KeyId") or None, deadline)
    return {
        "Outcome": "saved",
        "Saved": "true",
        "Reason": "saved",
        "Encoding": encoding,
        "Bytes": str(len(value.encode())),
        "JsonBytes": str(json_bytes),
        "ImageVersion": version or str(doc["image"].get("version") or ""),
    }


# ------------------------------------------------------------------ telling


def _emit(fleet: str, kind: str, outcome: Mapping[str, str]) -> None:
    """One JSON log line and the two metrics, in embedded metric format, on stdout."""
    saved = 1 if outcome.get("Saved") == "true" and outcome.get("Outcome") == "saved" else 0
    failed = 0 if outcome.get("Outcome") in ("saved", "kept", "deleted", "skipped") else 1
    record = {
        "_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [{
            "Namespace": NAMESPACE, "Dimensions": [["fleet"]],
            "Metrics": [{"Name": "RecipeSaved", "Unit": "Count"}, {"Name": "RecipeNotSaved", "Unit": "Count"}]}]},
        "fleet": fleet, "service": SERVICE, "action": kind,
        "RecipeSaved": saved, "RecipeNotSaved": failed,
        **{k: v for k, v in outcome.items() if k in ("Outcome", "Reason", "Encoding", "Bytes", "ImageVersion")},
    }
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _respond(event: Mapping[str, Any], status: str, physical: str, data: Mapping[str, str], reason: str) -> None:
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:1000],
            "PhysicalResourceId": physical,
            "StackId": event.get("StackId", ""),
            "RequestId": event.get("RequestId", ""),
            "LogicalResourceId": event.get("LogicalResourceId", ""),
            "NoEcho": False,  # Data holds the outcome only, and outputs read it with Fn::GetAtt
            "Data": dict(data),
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    # uncovered: the loop's exit; it never runs out, since its last attempt returns or raises
    for attempt in range(RESPONSE_ATTEMPTS):
        try:
            # A fresh opener per answer: it honours the environment's proxy settings as they are now.
            with urllib.request.build_opener().open(request, timeout=RESPONSE_TIMEOUT) as response:  # noqa: S310
                response.read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == RESPONSE_ATTEMPTS - 1:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt == RESPONSE_ATTEMPTS - 1:
                raise
        time.sleep(0.5 * 2**attempt)


def handler(event: Mapping[str, Any], context: Any, clients_factory: Callable[[], Clients] = clients) -> None:
    """Lambda entry point. Never logs the event: its properties name the recipe document."""
    region = os.environ.get("AWS_REGION", "")
    url = str(event.get("ResponseURL", ""))
    if not response_url_ok(url, region):
        LOG.error(json.dumps({"refused": "ResponseURL is not CloudFormation's response endpoint", "region": region}))
        return
    kind = event.get("RequestType")
    props = event.get("ResourceProperties") or {}
    try:
        fleet = check_identity(event, context, os.environ)
    except RemovedFleet as exc:
        # Touches nothing (this function may no longer delete that parameter) and never fails the
        # update: SUCCESS with the outcome, as for a renamed fleet's old recipe.
        outcome = {"Outcome": "skipped", "Saved": "false", "ParameterName": exc.parameter,
                   "Reason": f"removed from the stack: the recipe {exc.parameter} is left (this writer may no "
                             "longer delete it); delete it by hand if no process reads it"}
        LOG.warning(json.dumps({"action": kind, "parameter": exc.parameter, "Outcome": "skipped",
                                "Reason": outcome["Reason"]}))
        _respond(event, "SUCCESS", exc.parameter, outcome, f"skipped: {outcome['Reason']}")
        return
    except (BadRequest, ValueError) as exc:
        LOG.error(json.dumps({"refused": str(exc), "action": kind}))
        _respond(event, "FAILED", str(event.get("PhysicalResourceId") or "refused"), {}, f"refused: {exc}")
        return
    name = f"{PARAMETER_PREFIX}{fleet}/recipe"
    strict = str(props.get("FailureMode", "warn")) == "fail"
    try:
        outcome = handle(event, fleet, clients_factory(), _Deadline(context))
    except NotSaved as exc:
        outcome = {"Outcome": exc.code, "Saved": "false", "Reason": exc.reason}
    except BadRequest as exc:
        outcome = {"Outcome": "recipe_not_saved", "Saved": "false", "Reason": f"refused: {exc}"}
    except Exception as exc:  # noqa: BLE001 - every failure must reach CloudFormation
        # The error names the exception type and the AWS error code only: never a value.
        outcome = {"Outcome": "recipe_not_saved", "Saved": "false", "Reason": _error_code(exc)}
    outcome.setdefault("Encoding", "")
    outcome.setdefault("Bytes", "0")
    outcome.setdefault("ImageVersion", "")
    outcome["ParameterName"] = name
    if str(props.get("Metrics", "")).strip().lower() in ("on", "true", "1", "yes"):
        _emit(fleet, str(kind), outcome)
    failed = outcome["Outcome"] not in ("saved", "kept", "deleted", "skipped")
    LOG.log(logging.WARNING if failed else logging.INFO,
            json.dumps({"action": kind, "parameter": name, **{k: outcome[k] for k in ("Outcome", "Reason", "Encoding", "Bytes")}}))
    physical = name if kind != "Delete" else str(event.get("PhysicalResourceId") or name)
    if failed and strict:
        _respond(event, "FAILED", physical, outcome, f"{outcome['Outcome']}: {outcome['Reason']} (recipe_failure='fail')")
        return
    reason = "ok" if not failed else f"{outcome['Outcome']}: {outcome['Reason']} (the deploy goes on: recipe_failure='warn')"
    _respond(event, "SUCCESS", physical, outcome, reason)
