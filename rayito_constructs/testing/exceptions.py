"""The errors the service answers, shaped as the model's error shapes (status, members, headers)."""

from __future__ import annotations

import json
from typing import Any, Optional

from .service_model import service_model


class WireError(Exception):
    """An error the service answers, shaped as the model's error shape ``code``."""

    def __init__(self, code: str, message: str, *, status: Optional[int] = None, **fields: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = {k: v for k, v in fields.items() if v is not None}
        if status is None:
            status = _status_of(code)
        self.status = status

    def encode(self) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body, with header-bound members (Retry-After) as headers."""
        headers = {"x-amzn-ErrorType": self.code, "Content-Type": "application/json"}
        body: dict[str, Any] = {"message": self.message}
        try:
            members = service_model().shape_for(self.code).members
        except Exception:  # noqa: BLE001 - a code outside the model (NotImplemented...)
            members = {}
        for key, value in self.fields.items():
            member = members.get(key)
            if member is not None and member.serialization.get("location") == "header":
                headers[member.serialization["name"]] = str(value)
            else:
                body[key] = value
        return self.status, headers, json.dumps(body).encode()


def _status_of(code: str) -> int:
    try:
        return int(service_model().shape_for(code).metadata["error"]["httpStatusCode"])
    except Exception:  # noqa: BLE001
        return 500


def validation(message: str) -> WireError:
    return WireError("ValidationException", message)


def not_found(message: str, resource_type: str, resource_id: str) -> WireError:
    return WireError("ResourceNotFoundException", message, resourceType=resource_type, resourceId=resource_id)


def conflict(message: str, resource_type: str, resource_id: str) -> WireError:
    return WireError("ConflictException", message, resourceType=resource_type, resourceId=resource_id)


def internal(retry_after: int = 1) -> WireError:
    return WireError("InternalServerException", "An internal error occurred.", retryAfterSeconds=retry_after)
