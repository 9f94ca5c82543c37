"""Custom resource handler: writes the fleet recipe as an SSM SecureString, never logging it.

CloudFormation cannot create a SecureString parameter, and the stock ``AwsCustomResource`` handler
logs the whole request (recipe included). This handler logs only the request type, the parameter
name, the encoding and the size. It needs nothing but the boto3 of the Lambda runtime.

Properties (all strings): ``ParameterName``, ``Value``, ``Encoding`` (``json``|``compressed``),
``KeyId`` (optional customer KMS key), ``KeepOnDelete`` (``"true"`` keeps the parameter when the
resource is deleted). The physical id is the parameter name, so renaming a fleet makes
CloudFormation delete the old parameter after the new one is written.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from typing import Any, Callable, Mapping

import boto3

LOG = logging.getLogger("rayito.recipe_writer")
LOG.setLevel(os.environ.get("LOG_LEVEL", "INFO"))
# botocore logs request bodies at DEBUG, and the body of PutParameter is the recipe: keep the SDK's
# loggers quiet whatever log level the function is given.
for _sdk_logger in ("botocore", "boto3", "urllib3"):
    logging.getLogger(_sdk_logger).setLevel(logging.WARNING)
PARAMETER_PREFIX = "/rayito/agents/"


class BadRequest(ValueError):
    """A request this handler refuses; its message holds no property value."""


def _ssm() -> Any:
    return boto3.client("ssm")


def _put(ssm: Any, props: Mapping[str, Any]) -> None:
    args = {
        "Name": props["ParameterName"],
        "Value": props["Value"],
        "Type": "SecureString",
        "Tier": "Standard",
        "Overwrite": True,
        "Description": f"Rayito fleet recipe ({props.get('Encoding', 'json')})",
    }
    if props.get("KeyId"):
        args["KeyId"] = props["KeyId"]
    ssm.put_parameter(**args)


def _delete(ssm: Any, name: str) -> bool:
    """Delete ``name``; False when it was already gone."""
    try:
        ssm.delete_parameter(Name=name)
        return True
    except ssm.exceptions.ParameterNotFound:
        return False


def handle(event: Mapping[str, Any], ssm: Any) -> dict[str, Any]:
    """Carry out one CloudFormation request; returns the physical id and non-secret data."""
    kind = event["RequestType"]
    props = event.get("ResourceProperties", {})
    name = props.get("ParameterName", "")
    if not name.startswith(PARAMETER_PREFIX):
        raise BadRequest(f"ParameterName must start with {PARAMETER_PREFIX}")
    if kind in ("Create", "Update"):
        _put(ssm, props)
        LOG.info(
            json.dumps(
                {"action": kind, "parameter": name, "encoding": props.get("Encoding"), "bytes": len(props["Value"])}
            )
        )
        return {"PhysicalResourceId": name, "Data": {"ParameterName": name}}
    physical = event.get("PhysicalResourceId", "")
    if not physical.startswith(PARAMETER_PREFIX):
        # A create that failed before writing anything has no parameter to delete.
        LOG.info(json.dumps({"action": "Delete", "parameter": None, "skipped": "never created"}))
        return {"PhysicalResourceId": physical}
    if str(props.get("KeepOnDelete", "false")).lower() == "true":
        LOG.info(json.dumps({"action": "Delete", "parameter": physical, "kept": True}))
        return {"PhysicalResourceId": physical}
    deleted = _delete(ssm, physical)
    LOG.info(json.dumps({"action": "Delete", "parameter": physical, "deleted": deleted}))
    return {"PhysicalResourceId": physical}


def _respond(event: Mapping[str, Any], context: Any, status: str, result: Mapping[str, Any], reason: str) -> None:
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:1000],
            "PhysicalResourceId": result.get("PhysicalResourceId")
            or event.get("PhysicalResourceId")
            or getattr(context, "log_stream_name", "recipe"),
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
            "NoEcho": True,
            "Data": result.get("Data", {}),
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (CloudFormation's URL)
        response.read()


def handler(event: Mapping[str, Any], context: Any, ssm_factory: Callable[[], Any] = _ssm) -> None:
    """Lambda entry point. Never logs the event: its properties hold the recipe."""
    try:
        result = handle(event, ssm_factory())
        status, reason = "SUCCESS", "ok"
    except Exception as exc:  # noqa: BLE001 - every failure must reach CloudFormation
        # The error names the exception type and the AWS error code only: never the value.
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        reason = f"{type(exc).__name__} {code}".strip() + (f": {exc}" if isinstance(exc, BadRequest) else "")
        LOG.error(json.dumps({"action": event.get("RequestType"), "error": reason}))
        result, status = {}, "FAILED"
    _respond(event, context, status, result, reason)
