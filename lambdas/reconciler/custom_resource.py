"""What the library's lifecycle custom resources share (the fleet teardown, the image pruner): who may
ask, how they answer CloudFormation, and the one-line report each prints.

A custom resource function acts only on requests for its own stack (``StackId``), for one of its
own resources (``LogicalResourceId``, in the ``RESOURCES`` map the construct sets), sent to itself
(``ServiceToken``), and answers only CloudFormation's pre-signed response URL
(``https://cloudformation-custom-resource-response-<region without dashes>.s3...``). A request for
another URL is never answered; any other refusal is answered ``FAILED`` without acting. The same
rules as the recipe writer's (``lambdas/recipe_writer/index.py``): separate deployment packages,
so the few lines are repeated there.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Optional

from .telemetry import metrics_enabled

#: An answer is sent up to this many times (S3 answers a pre-signed PUT with a 5xx now and then).
RESPONSE_ATTEMPTS = 3
RESPONSE_TIMEOUT = 10
#: CloudFormation takes at most 4,096 bytes of response body: Data is cut to fit.
MAX_RESPONSE_BYTES = 4096


class BadRequest(ValueError):
    """A request this function refuses; its message holds no property value."""


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


def check_identity(event: Mapping[str, Any], context: Any, environ: Mapping[str, str], resource_type: str) -> str:
    """The value the ``RESOURCES`` map gives this event's resource (its fleet or image); raises
    :class:`BadRequest` for an event that is not one of this stack's ``resource_type`` resources
    sent to this function."""
    if event.get("RequestType") not in ("Create", "Update", "Delete"):
        raise BadRequest("RequestType must be Create, Update or Delete")
    if event.get("ResourceType") != resource_type:
        raise BadRequest(f"ResourceType must be {resource_type}")
    if not environ.get("STACK_ID") or event.get("StackId") != environ["STACK_ID"]:
        raise BadRequest("StackId is not this function's stack")
    resources = json.loads(environ.get("RESOURCES") or "{}")
    value = resources.get(event.get("LogicalResourceId"))
    if not value:
        raise BadRequest(f"LogicalResourceId is not one of this stack's {resource_type} resources")
    own = _unqualified(getattr(context, "invoked_function_arn", "") or "")
    props = event.get("ResourceProperties") or {}
    tokens = {props.get("ServiceToken"), event.get("ServiceToken", props.get("ServiceToken"))}
    if not own or tokens != {own}:
        raise BadRequest("ServiceToken is not this function")
    return str(value)


def remaining_seconds(context: Any, default: float = 60.0) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining() / 1000 if remaining is not None else default


def error_code(exc: BaseException) -> str:
    """The AWS error code of an exception, or its type's name."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")) or type(exc).__name__


def fit_data(data: Mapping[str, Any], budget: int = 3000) -> dict[str, str]:
    """``Data`` as strings, each value cut so the whole answer stays under CloudFormation's limit."""
    out = {k: str(v) for k, v in data.items()}
    while len(json.dumps(out)) > budget:
        longest = max(out, key=lambda k: len(out[k]))
        out[longest] = out[longest][: max(0, len(out[longest]) // 2 - 3)] + "..."
    return out


def respond(event: Mapping[str, Any], status: str, physical: str, data: Mapping[str, Any], reason: str,
            sleep: Any = time.sleep) -> None:
    """PUT the answer on the event's response URL (checked by the caller), retrying 5xx."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:1000],
            "PhysicalResourceId": physical[:1024],
            "StackId": event.get("StackId", ""),
            "RequestId": event.get("RequestId", ""),
            "LogicalResourceId": event.get("LogicalResourceId", ""),
            "NoEcho": False,
            "Data": fit_data(data),
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    # uncovered: the loop never runs out: its last attempt returns or raises
    for attempt in range(RESPONSE_ATTEMPTS):
        try:
            with urllib.request.build_opener().open(request, timeout=RESPONSE_TIMEOUT) as response:  # noqa: S310
                response.read()
            return
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == RESPONSE_ATTEMPTS - 1:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt == RESPONSE_ATTEMPTS - 1:
                raise
        sleep(0.5 * 2**attempt)


def emit(namespace: str, dimensions: Mapping[str, str], metrics: Mapping[str, tuple[float, str]],
         fields: Optional[Mapping[str, Any]] = None) -> None:
    """One JSON line on stdout: the report's fields and its metrics in embedded metric format
    (extracted by CloudWatch as the line is ingested, so the numbers outlive the log group).
    With the fleet's metrics off (``RAYITO_METRICS`` not ``on``: docs/operations.md) the same
    numbers are logged as plain fields and no custom metric is made."""
    if not metrics_enabled():
        log({**dict(dimensions), **{name: value for name, (value, _) in metrics.items()}, **dict(fields or {})})
        return
    record = {
        "_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [{
            "Namespace": namespace, "Dimensions": [sorted(dimensions)],
            "Metrics": [{"Name": name, "Unit": unit} for name, (_, unit) in metrics.items()]}]},
        **dict(dimensions),
        **{name: value for name, (value, _) in metrics.items()},
        **dict(fields or {}),
    }
    sys.stdout.write(json.dumps(record, default=str, sort_keys=True) + "\n")
    sys.stdout.flush()


def log(fields: Mapping[str, Any]) -> None:
    """One JSON log line on stdout (no EMF)."""
    sys.stdout.write(json.dumps(dict(fields), default=str, sort_keys=True) + "\n")
    sys.stdout.flush()
