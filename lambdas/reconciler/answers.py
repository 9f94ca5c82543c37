"""What an AWS answer says, read once: an error as a :class:`.core.Failure` (its code, status, and
whether the call may have been carried out), a timestamp as seconds, the service's clock from a
response's ``Date`` header. Shared by the reconciler, the fleet teardown and the image pruner."""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any, Optional

from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError

from .core import REFUSED_FOR_ROOM, Failure

#: RunMicrovm refusals that come after the service weighed making a VM for the token (capacity,
#: quota): the only ones that prove a token an earlier, lost, call used made no VM.
RUN_EVALUATED_NO_VM = REFUSED_FOR_ROOM


def error_code(exc: BaseException) -> str:
    """The service's error code (``ThrottlingException``...), or the client error's class name."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def failure(exc: BaseException) -> Failure:
    """A failed call as the core reads it."""
    if isinstance(exc, ClientError):
        response = exc.response
        retry_after = response.get("retryAfterSeconds")
        named = response.get("resourceId") if response.get("resourceType") == "Microvm" else None
        return Failure(error_code(exc), int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0),
                       str(response.get("Error", {}).get("Message", "")),
                       named_vm=str(named) if named else None,
                       retry_after=float(retry_after) if retry_after is not None else None)
    connected = not isinstance(exc, (ConnectTimeoutError, EndpointConnectionError))
    return Failure(type(exc).__name__, 0, str(exc), connected=connected)


def lost_answer(exc: BaseException) -> bool:
    """Whether a failed call may have been carried out (:attr:`.core.Failure.lost`)."""
    return failure(exc).lost


def epoch(value: Any) -> float:
    """A timestamp as seconds since the epoch (botocore parses them into datetimes)."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def service_time(response: Any) -> Optional[float]:
    """The service's clock when it answered, from the ``Date`` header (whole seconds: the middle of
    the second); None without one."""
    if not isinstance(response, dict):  # uncovered: botocore parses every answer into a dict
        return None
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not date:  # uncovered: every answer (the emulator over HTTP, and AWS) has a Date header
        return None
    try:
        return parsedate_to_datetime(date).timestamp() + 0.5
    except (TypeError, ValueError):  # uncovered: a Date header email.utils cannot parse; neither the emulator nor AWS sends one
        return None


__all__ = ["BotoCoreError", "ClientError", "RUN_EVALUATED_NO_VM", "epoch", "error_code", "failure", "lost_answer",
           "service_time"]
