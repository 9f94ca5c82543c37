"""Calls that also check every answer against the model's output shape."""

from __future__ import annotations

from typing import Any

from ..emulator_helpers import assert_fits_model

BASE = "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1"
ROLE = "arn:aws:iam::123456789012:role/agent"


def run(client: Any, image: str, **kw: Any) -> dict[str, Any]:
    response = client.run_microvm(imageIdentifier=image, **kw)
    assert_fits_model("RunMicrovm", response)
    return response


def get(client: Any, vm_id: str) -> dict[str, Any]:
    response = client.get_microvm(microvmIdentifier=vm_id)
    assert_fits_model("GetMicrovm", response)
    return response


def state(client: Any, vm_id: str) -> str:
    return get(client, vm_id)["state"]


def error(call: Any) -> dict[str, Any]:
    """The error response of a call that must fail."""
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        return exc.response
    raise AssertionError("the call succeeded")
