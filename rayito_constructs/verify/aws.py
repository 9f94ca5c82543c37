"""The AWS side of ``verify``: one boto3 session, clients with a short retry budget, and every
service error turned into a value a check can report (never a traceback).

Endpoints follow the SDK's own configuration (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_<SERVICE>``,
profiles), which is how the tests point ``verify`` at moto and the MicroVMs emulator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError
from botocore.parsers import ResponseParserError

from .report import Finding, fail, warn

#: Attempts per call (the first and three retries, the SDK's standard backoff between them):
#: "throttling retried a little, then reported".
ATTEMPTS = 4
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 20

#: IAM prefix of each boto3 service name, where they differ (the MicroVMs API is ``lambda:``).
IAM_PREFIX = {"lambda-microvms": "lambda", "service-quotas": "servicequotas"}

DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError",
          "UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
          "SignatureDoesNotMatch", "InvalidSignatureException", "KMS.AccessDeniedException")
THROTTLED = ("Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException",
             "RequestLimitExceeded", "ProvisionedThroughputExceededException", "RequestThrottled",
             "RequestThrottledException", "SlowDown", "LimitExceededException")
NOT_FOUND = ("ResourceNotFoundException", "ParameterNotFound", "NoSuchEntity", "NoSuchResourceException",
             "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NotFoundException",
             "ResourceNotFound")


@dataclass
class AwsError(Exception):
    """A failed AWS call, classified: ``denied``, ``throttled``, ``not_found``, ``unreachable``,
    ``no_credentials`` or ``error``."""

    service: str
    operation: str
    kind: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.action}: {self.code}: {self.message}".strip()

    @property
    def action(self) -> str:
        """The IAM action of the call, e.g. ``cloudformation:DescribeStacks``."""
        return f"{IAM_PREFIX.get(self.service, self.service)}:{self.operation}"


def classify(service: str, operation: str, exc: BaseException) -> AwsError:
    """Turn any botocore exception into an :class:`AwsError`."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "error"))
        message = _short(str(error.get("Message") or ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in DENIED or (status == 403 and code not in THROTTLED):
            kind = "denied"
        elif code in THROTTLED or status == 429:
            kind = "throttled"
        elif code in NOT_FOUND or status == 404 or (code == "ValidationError" and "does not exist" in message):
            kind = "not_found"
        else:
            kind = "error"
        return AwsError(service, operation, kind, code, message)
    if isinstance(exc, NoCredentialsError):
        return AwsError(service, operation, "no_credentials", "NoCredentials", str(exc))
    if isinstance(exc, NoRegionError):
        return AwsError(service, operation, "error", "NoRegion", str(exc))
    if isinstance(exc, ResponseParserError):
        return AwsError(service, operation, "error", "UnreadableAnswer", "the endpoint's answer is not the service's")
    if isinstance(exc, BotoCoreError):
        # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, UnknownEndpoint...
        return AwsError(service, operation, "unreachable", type(exc).__name__, _short(str(exc)))
    return AwsError(service, operation, "error", type(exc).__name__, _short(str(exc)))


def _short(message: str, limit: int = 200) -> str:
    """One line, no HTML page: an error message fit for a report."""
    text = " ".join(message.split())
    if text.lstrip().startswith("<"):
        return "(an HTML page, not a service answer)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Clients:
    """boto3 clients of one session and region, made once each, with ``verify``'s retry budget.

    :param session: Default: a new ``boto3.Session()`` (the usual credential chain).
    :param region: Default: the session's region.
    :param attempts: attempts per call, retries included. Default: :data:`ATTEMPTS`.
    """

    def __init__(self, session: Optional[boto3.Session] = None, region: Optional[str] = None,
                 attempts: int = ATTEMPTS) -> None:
        self.session = session or boto3.Session()
        self.region = region or self.session.region_name
        self.attempts = attempts
        self._clients: dict[tuple[str, Optional[str]], Any] = {}
        self._lock = threading.Lock()

    def config(self) -> Config:
        return Config(
            retries={"mode": "standard", "total_max_attempts": self.attempts},
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_TIMEOUT,
            user_agent_extra="rayito-constructs-verify",
        )

    def client(self, service: str, region: Optional[str] = None) -> Any:
        key = (service, region or self.region)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self.session.client(service, region_name=key[1], config=self.config())
            return self._clients[key]

    def call(self, service: str, operation: str, *, region: Optional[str] = None, **params: Any) -> dict[str, Any]:
        """One API call (``operation`` in boto3's snake_case); raises :class:`AwsError`."""
        op_name = _camel(operation)
        try:
            client = self.client(service, region)
            return getattr(client, operation)(**params)
        except Exception as exc:  # noqa: BLE001 - anything the SDK raises is an AWS error for a check
            raise classify(service, op_name, exc) from None

    def pages(self, service: str, operation: str, *, limit_pages: int = 50, **params: Any) -> Iterator[dict[str, Any]]:
        """The pages of a paginated call, at most ``limit_pages``; raises :class:`AwsError`."""
        op_name = _camel(operation)
        try:
            pages = iter(self.client(service).get_paginator(operation).paginate(**params))
        except Exception as exc:  # noqa: BLE001
            raise classify(service, op_name, exc) from None
        for _ in range(limit_pages):
            try:
                page = next(pages)
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - anything the SDK raises is an AWS error for a check
                raise classify(service, op_name, exc) from None
            yield page


def _camel(operation: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in operation.split("_"))


def unable(check: str, error: AwsError, what: str) -> Finding:
    """The finding for a check that could not run because an AWS call failed."""
    data = {"error": {"action": error.action, "code": error.code, "message": error.message}}
    if error.kind == "denied":
        return fail(check, f"could not {what}: {error.code} on {error.action}",
                    f"give the principal running verify {error.action} (docs/verify.md lists what verify needs)", **data)
    if error.kind == "no_credentials":
        return fail(check, f"could not {what}: no AWS credentials", "configure credentials (aws configure, AWS_PROFILE)", **data)
    if error.kind == "throttled":
        return warn(check, f"could not {what}: still throttled after {ATTEMPTS} attempts ({error.action})",
                    "run verify again in a minute", **data)
    if error.kind == "unreachable":
        return fail(check, f"could not {what}: {error.action} unreachable ({error.code})",
                    "check the network, the region and any endpoint override (AWS_ENDPOINT_URL*)", **data)
    return warn(check, f"could not {what}: {error.code} {error.message}".strip(),
                f"check {error.action} by hand (aws cli) and run verify again", **data)


def safe(check: str, what: str, body: Callable[[], list[Finding]]) -> list[Finding]:
    """Run a check body; an :class:`AwsError` becomes the finding that says what could not be done."""
    try:
        return body()
    except AwsError as error:
        return [unable(check, error, what)]
