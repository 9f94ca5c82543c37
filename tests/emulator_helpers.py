"""Real boto3 clients for the MicroVMs emulator, and a check that every answer fits the model."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.validate import ParamValidator

from rayito_constructs.testing._wire import service_model


def microvms_client(endpoint: str, *, retries: int = 1) -> Any:
    """A lambda-microvms client; ``retries=1`` means one attempt, so errors surface as raised."""
    return boto3.client(
        "lambda-microvms",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": retries, "mode": "standard"}),
    )


def assert_fits_model(operation: str, response: dict[str, Any]) -> None:
    """The parsed response satisfies the operation's output shape (required members, types)."""
    shape = service_model().operation_model(operation).output_shape
    data = {k: v for k, v in response.items() if k != "ResponseMetadata"}
    report = ParamValidator().validate(data, shape)
    assert not report.has_errors(), report.generate_report()
