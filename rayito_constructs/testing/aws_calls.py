"""Every AWS call a process makes, recorded through botocore's own events, and the IAM requests
each one is authorized as.

**Recording.** The product (``rayito`` 0.17.1) never shares a session: it builds a
``boto3.session.Session`` per feature (``rayito/_aws_region.py``, ``_aws.py`` ``LazyClient``), and
each client copies its session's event emitter when it is made (``botocore/args.py``). So the
recorder hooks ``botocore.session.Session.__init__`` and registers on every session made after
:meth:`AwsCallRecorder.install` (and on boto3's default one). Logs cannot stand in: ``import
rayito`` filters botocore's DEBUG loggers (``rayito/_botocore_logs.py``). The events
(``botocore/client.py`` ``_make_api_call``): ``before-parameter-build`` (the API's keyword
arguments), ``before-sign`` (the region), ``after-call`` (status, error code, what the answer tells
about the resource) and ``after-call-error`` (a connection that failed). Values that may be secret
are never kept (:data:`SENSITIVE`).

For the product's CLI in a subprocess, put :data:`SITE_DIR` first on ``PYTHONPATH`` and name a
file in ``RAYITO_RECORD_AWS_CALLS``: its ``sitecustomize`` installs a recorder that appends one
JSON line per call to that file (children inherit both).

**Authorization** (:func:`requests_of`): the action, the resource ARN and the condition context IAM
evaluates for one recorded call, by what was measured (``shared/research/rayito-ground-truth.md``
section 1) and the services' authorization references:

* MicroVMs use the prefix ``lambda:``; instance operations are authorized on the VM's
  **unversioned** image ARN (the image comes from a Run/Get/List answer: only the VM id is sent);
  ``List*`` and ``CreateMicrovmImage`` on ``*`` (measured, Q114); RunMicrovm passes the managed
  ``HTTP_INGRESS`` and ``INTERNET_EGRESS`` connectors even when it names none, image create and
  update ``INTERNET_EGRESS`` (measured, Q114), each named connector too; ``executionRoleArn`` and
  ``buildRoleArn`` are passed roles (``iam:PassedToService = lambda.amazonaws.com``).
* S3 ``HeadObject`` is ``s3:GetObject``, ``HeadBucket`` and ``ListObjectsV2`` are ``s3:ListBucket``.
* A secret is authorized on its full ARN (the name and six random characters): taken from the
  answer when it names one, else the name with a stand-in suffix.
* ``sts:GetCallerIdentity`` needs no permission (it cannot be denied): ``exempt``.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional
from urllib.parse import unquote

#: Parameters whose values are never recorded (secret values, run payloads, tokens, bodies).
SENSITIVE = frozenset({"SecretString", "SecretBinary", "runHookPayload", "Value", "authToken", "Body",
                       "ClientRequestToken"})
#: The folder whose ``sitecustomize`` records the CLI's calls (``RAYITO_RECORD_AWS_CALLS``).
SITE_DIR = Path(__file__).resolve().parent / "record_site"
RECORD_FILE_ENV = "RAYITO_RECORD_AWS_CALLS"
LAMBDA_SERVICE = "lambda.amazonaws.com"
#: A secret's ARN ends with six random characters; this stands for them when no answer named it.
SECRET_SUFFIX = "-AbCdEf"
#: Managed connectors a RunMicrovm passes without naming any (HTTP_INGRESS measured, GT section 1;
#: the egress default taken to be INTERNET_EGRESS, as measured for image builds, Q114).
RUN_DEFAULT_CONNECTORS = ("HTTP_INGRESS", "INTERNET_EGRESS")
IMAGE_DEFAULT_CONNECTORS = ("INTERNET_EGRESS",)
_ON_ANY_RESOURCE = frozenset({"ListMicrovms", "ListMicrovmImages", "ListManagedMicrovmImages",
                              "ListManagedMicrovmImageVersions", "CreateMicrovmImage"})
_INSTANCE = frozenset({"GetMicrovm", "SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm",
                       "CreateMicrovmAuthToken", "CreateMicrovmShellAuthToken"})
_ON_IMAGE = frozenset({"UpdateMicrovmImage", "GetMicrovmImage", "DeleteMicrovmImage", "ListMicrovmImageVersions",
                       "GetMicrovmImageVersion", "UpdateMicrovmImageVersion", "DeleteMicrovmImageVersion",
                       "ListMicrovmImageBuilds", "GetMicrovmImageBuild"})
_S3_OBJECT = {"HeadObject": "s3:GetObject", "GetObject": "s3:GetObject", "PutObject": "s3:PutObject",
              "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
              "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload",
              "DeleteObject": "s3:DeleteObject"}


def _redact(value: Any, key: Optional[str] = None) -> Any:
    if key in SENSITIVE:
        return "<redacted>"
    if isinstance(value, dict):
        return {k: _redact(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if hasattr(value, "read"):
        return "<stream>"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _facts(parsed: Mapping[str, Any]) -> dict[str, str]:
    """What an answer tells about resources: ``microvmId -> imageArn`` (instance operations are
    authorized on the VM's image, which only answers carry) and a secret's full ``ARN``."""
    found: dict[str, str] = {}
    for item in [parsed, *(parsed.get("items") or [])]:
        if isinstance(item, dict) and "microvmId" in item and "imageArn" in item:
            found[str(item["microvmId"])] = str(item["imageArn"])
    if isinstance(parsed.get("ARN"), str) and ":secretsmanager:" in parsed["ARN"]:
        found["ARN"] = parsed["ARN"]
    return found


class AwsCallRecorder:
    """Records every botocore call of this process once installed; ``records`` in call order.

    ``path``: also append each record as a JSON line there (the CLI's subprocesses).
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._original: Any = None
        self._sessions: list[Any] = []
        # Its own name on a session's events, never reused: ``id(self)`` is, once an earlier
        # recorder is gone, and a session that recorder marked (boto3's default one, which lives
        # as long as the process) then took none of this one's handlers.
        self._name = f"rayito-record-{uuid.uuid4().hex}"

    # ---------------------------------------------------------------- the events

    def _on_params(self, params: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model
        context["_rayito_call"] = {"seq": next(self._seq), "pid": os.getpid(), "service": service.service_name,
                                   "signing": service.signing_name, "op": model.name, "region": None,
                                   "params": _redact(dict(params))}

    def _on_sign(self, request: Any = None, region_name: Optional[str] = None, **_: Any) -> None:
        record = getattr(request, "context", {}).get("_rayito_call") if request is not None else None
        if record is not None and region_name:
            record["region"] = region_name

    def _on_after_call(self, http_response: Any, parsed: Any, model: Any, context: dict[str, Any], **_: Any) -> None:
        record = context.pop("_rayito_call", None)
        if record is None:
            return
        record["status"] = getattr(http_response, "status_code", None)
        record["error"] = (parsed.get("Error") or {}).get("Code") if isinstance(parsed, dict) else None
        facts = _facts(parsed) if isinstance(parsed, dict) else {}
        if facts:
            record["facts"] = facts
        self._keep(record)

    def _on_error(self, exception: BaseException, context: dict[str, Any], **_: Any) -> None:
        record = context.pop("_rayito_call", None)
        if record is not None:
            record.update(status=None, error=type(exception).__name__)
            self._keep(record)

    def _keep(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.records.append(record)
            if self.path:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(record, default=str) + "\n")

    # ---------------------------------------------------------------- sessions

    def register(self, session: Any) -> None:
        """Record the calls of one botocore (or boto3) session's clients made from now on."""
        events = getattr(session, "_session", session)
        mark = f"_{self._name.replace('-', '_')}"
        if getattr(events, mark, False):
            return
        uid = self._name
        events.register("before-parameter-build", self._on_params, unique_id=f"{uid}-params")
        events.register("before-sign", self._on_sign, unique_id=f"{uid}-sign")
        events.register("after-call", self._on_after_call, unique_id=f"{uid}-after")
        events.register("after-call-error", self._on_error, unique_id=f"{uid}-error")
        setattr(events, mark, True)

    def install(self) -> "AwsCallRecorder":
        """Register on every botocore session made from now on (and boto3's default one)."""
        import boto3
        import botocore.session

        if self._original is not None:
            return self
        original = botocore.session.Session.__init__
        recorder = self

        def __init__(session: Any, *args: Any, **kwargs: Any) -> None:
            original(session, *args, **kwargs)
            recorder.register(session)

        self._original = original
        botocore.session.Session.__init__ = __init__  # type: ignore[method-assign]
        if boto3.DEFAULT_SESSION is not None:
            self.register(boto3.DEFAULT_SESSION)
        return self

    def uninstall(self) -> None:
        """Stop registering on new sessions (sessions already registered keep recording)."""
        import botocore.session

        if self._original is not None:
            botocore.session.Session.__init__ = self._original  # type: ignore[method-assign]
            self._original = None

    def __enter__(self) -> "AwsCallRecorder":
        return self.install()

    def __exit__(self, *_: Any) -> None:
        self.uninstall()

    def since(self, start: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records[start:])

    def mark(self) -> int:
        with self._lock:
            return len(self.records)


def load(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records a CLI's ``sitecustomize`` appended to ``path`` (none when it made no call)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -------------------------------------------------------------------- what IAM authorizes


@dataclass(frozen=True)
class IamRequest:
    """One request IAM authorizes for a recorded call (``exempt``: it needs no permission)."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)
    operation: str = ""
    exempt: bool = False

    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.action, self.resource, tuple(sorted((k, str(v)) for k, v in self.context.items())))


def unversioned_image_arn(identifier: str, region: str, account: str) -> str:
    """``arn:...:microvm-image:<name>`` from an ARN with or without a version, or a bare name."""
    identifier = unquote(identifier)
    if identifier.startswith("arn:"):
        return ":".join(identifier.split(":")[:7])
    return f"arn:aws:lambda:{region}:{account}:microvm-image:{identifier}"


def vm_images(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``microvmId -> imageArn`` from every answer the records saw."""
    found: dict[str, str] = {}
    for record in records:
        for key, value in (record.get("facts") or {}).items():
            if key.startswith("microvm-"):
                found[key] = value
    return found


def _connector(region: str, name: str) -> str:
    return f"arn:aws:lambda:{region}:aws:network-connector:aws-network-connector:{name}"


def _passed(role: str) -> IamRequest:
    return IamRequest("iam:PassRole", role, {"iam:PassedToService": LAMBDA_SERVICE})


def requests_of(record: Mapping[str, Any], images: Mapping[str, str], *, account: str,
                region: Optional[str] = None) -> list[IamRequest]:
    """The IAM requests one recorded call is authorized as. Raises ``KeyError`` for a call this
    module does not know how IAM authorizes (a new operation must be mapped, never guessed)."""
    service, op, p = record["service"], record["op"], record.get("params") or {}
    region = record.get("region") or region or "us-east-1"
    where = f"{region}:{account}"
    requests = _requests(service, op, p, record, images, region, account, where)
    return [IamRequest(r.action, r.resource, r.context, f"{service}:{op}", r.exempt) for r in requests]


@dataclass(frozen=True)
class _Call:
    """One recorded call, as the mappers below read it."""

    op: str
    p: Mapping[str, Any]
    record: Mapping[str, Any]
    images: Mapping[str, str]
    region: str
    account: str
    where: str  # ``<region>:<account>``


def _requests(service: str, op: str, p: Mapping[str, Any], record: Mapping[str, Any], images: Mapping[str, str],
              region: str, account: str, where: str) -> list[IamRequest]:
    mapper = _BY_SERVICE.get(service)
    found = mapper(_Call(op, p, record, images, region, account, where)) if mapper is not None else None
    if found is None:
        raise KeyError(f"{service}:{op}: how IAM authorizes it is not mapped here")
    return found


def _sts(c: _Call) -> Optional[list[IamRequest]]:
    return [IamRequest("sts:GetCallerIdentity", "*", exempt=True)] if c.op == "GetCallerIdentity" else None


def _microvms(c: _Call) -> Optional[list[IamRequest]]:
    op, p = c.op, c.p
    action = f"lambda:{op}"
    if op in _ON_ANY_RESOURCE and op != "CreateMicrovmImage":
        return [IamRequest(action, "*")]
    if op in _INSTANCE:
        vm = p["microvmIdentifier"]
        image = c.images.get(vm)
        if image is None:
            raise KeyError(f"{op} on {vm}: no answer named its image")
        return [IamRequest(action, unversioned_image_arn(image, c.region, c.account))]
    if op == "RunMicrovm":
        return _run_microvm(c)
    if op in ("CreateMicrovmImage", "UpdateMicrovmImage"):
        return _image_write(c)
    if op in _ON_IMAGE:
        return [IamRequest(action, unversioned_image_arn(p["imageIdentifier"], c.region, c.account))]
    if op in ("TagResource", "UntagResource", "ListTags"):
        return [IamRequest(action, unquote(p["Resource"]))]
    return None


def _run_microvm(c: _Call) -> list[IamRequest]:
    p, region = c.p, c.region
    out = [IamRequest("lambda:RunMicrovm", unversioned_image_arn(p["imageIdentifier"], region, c.account))]
    named = [*p.get("ingressNetworkConnectors", []), *p.get("egressNetworkConnectors", [])]
    out += [IamRequest("lambda:PassNetworkConnector", n)
            for n in dict.fromkeys([_connector(region, n) for n in RUN_DEFAULT_CONNECTORS] + named)]
    if p.get("executionRoleArn"):
        out.append(_passed(p["executionRoleArn"]))
    if p.get("kmsKeyIdentifier"):
        raise KeyError("RunMicrovm with kmsKeyIdentifier: what it needs of KMS is not measured")
    return out


def _image_write(c: _Call) -> list[IamRequest]:
    op, p, region = c.op, c.p, c.region
    resource = "*" if op == "CreateMicrovmImage" else unversioned_image_arn(p["imageIdentifier"], region, c.account)
    out = [IamRequest(f"lambda:{op}", resource)]
    connectors = [_connector(region, n) for n in IMAGE_DEFAULT_CONNECTORS] + list(p.get("egressNetworkConnectors", []))
    out += [IamRequest("lambda:PassNetworkConnector", n) for n in dict.fromkeys(connectors)]
    if p.get("buildRoleArn"):
        out.append(_passed(p["buildRoleArn"]))
    if p.get("tags"):
        raise KeyError(f"{op} with tags: whether it needs lambda:TagResource is not measured")
    return out


def _ssm(c: _Call) -> Optional[list[IamRequest]]:
    if c.op not in ("GetParameter", "PutParameter", "DeleteParameter"):
        return None
    name = c.p["Name"] if str(c.p["Name"]).startswith("/") else f"/{c.p['Name']}"
    return [IamRequest(f"ssm:{c.op}", f"arn:aws:ssm:{c.where}:parameter{name}")]


def _secretsmanager(c: _Call) -> Optional[list[IamRequest]]:
    if c.op == "ListSecrets":
        return [IamRequest("secretsmanager:ListSecrets", "*")]
    secret = str(c.p.get("SecretId") or c.p.get("Name"))
    arn = (c.record.get("facts") or {}).get("ARN")
    if arn is None:
        arn = secret if secret.startswith("arn:") else f"arn:aws:secretsmanager:{c.where}:secret:{secret}{SECRET_SUFFIX}"
    return [IamRequest(f"secretsmanager:{c.op}", arn)]


def _dynamodb(c: _Call) -> Optional[list[IamRequest]]:
    if c.op == "BatchGetItem":
        return [IamRequest("dynamodb:BatchGetItem", f"arn:aws:dynamodb:{c.where}:table/{t}") for t in c.p["RequestItems"]]
    return [IamRequest(f"dynamodb:{c.op}", f"arn:aws:dynamodb:{c.where}:table/{c.p['TableName']}")]


def _s3(c: _Call) -> Optional[list[IamRequest]]:
    bucket = c.p.get("Bucket")
    if c.op in _S3_OBJECT:
        return [IamRequest(_S3_OBJECT[c.op], f"arn:aws:s3:::{bucket}/{c.p.get('Key')}")]
    if c.op in ("HeadBucket", "ListObjectsV2", "ListObjects"):
        context = {"s3:prefix": c.p["Prefix"]} if c.p.get("Prefix") is not None else {}
        return [IamRequest("s3:ListBucket", f"arn:aws:s3:::{bucket}", context)]
    return None


def _logs(c: _Call) -> Optional[list[IamRequest]]:
    group = c.p.get("logGroupName")
    if c.op == "GetLogEvents":
        return [IamRequest("logs:GetLogEvents",
                           f"arn:aws:logs:{c.where}:log-group:{group}:log-stream:{c.p.get('logStreamName')}")]
    if c.op == "DescribeLogStreams":
        return [IamRequest("logs:DescribeLogStreams", f"arn:aws:logs:{c.where}:log-group:{group}:*")]
    return None


def _cloudformation(c: _Call) -> Optional[list[IamRequest]]:
    if c.op != "DescribeStacks":
        return None
    return [IamRequest("cloudformation:DescribeStacks",
                       f"arn:aws:cloudformation:{c.where}:stack/{c.p.get('StackName')}/*")]


#: How IAM authorizes the calls of each service; a mapper answers None for an operation it does not map.
_BY_SERVICE: dict[str, Callable[[_Call], Optional[list[IamRequest]]]] = {
    "sts": _sts,
    "lambda-microvms": _microvms,
    "ssm": _ssm,
    "secretsmanager": _secretsmanager,
    "dynamodb": _dynamodb,
    "s3": _s3,
    "logs": _logs,
    "cloudformation": _cloudformation,
}


def recorded(recorder: AwsCallRecorder, start: int = 0) -> Iterator[dict[str, Any]]:
    """The records kept since ``start`` (``recorder.mark()``)."""
    yield from recorder.since(start)
