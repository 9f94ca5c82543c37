"""Fakes for the few AWS operations neither moto nor the MicroVMs emulator answer, and wire-level
fault injection. Each fake hooks one operation of a real boto3 client the way botocore's Stubber
does (``before-parameter-build`` sees the request after botocore validated and before it serialized
it; ``before-call`` returns the response), and every response it builds is validated against the
operation's output shape first, so a fake can only answer what the real service could.

* :class:`IamSimulator`: SimulateCustomPolicy / SimulatePrincipalPolicy, evaluating the policy
  documents actually deployed in moto (Allow/Deny, NotAction/NotResource, wildcards, the condition
  operators the library uses, permissions boundaries), with the real simulator's known false
  ``implicitDeny`` for ``lambda:PassNetworkConnector``.
* :class:`ServiceQuotas`: the applied quotas of service code ``lambda`` (moto knows only ``vpc``).
* :class:`ImageVersions`: image versions, for emulators that do not implement them, and managed
  base image versions (with the status a test sets).
* :func:`inject_error`: an HTTP error response in the protocol's own format, handed to botocore at
  ``before-send`` so its parser and its retry logic run as for a real error.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
from typing import Any, Callable, Iterable, Optional

from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator

from rayito_constructs.verify.policy import matches, statements


def _checked(model: Any, response: dict[str, Any]) -> dict[str, Any]:
    report = ParamValidator().validate(response, model.output_shape)
    if report.has_errors():
        raise AssertionError(f"fake response for {model.name} does not fit its shape: {report.generate_report()}")
    return {**response, "ResponseMetadata": {"HTTPStatusCode": 200, "RequestId": "fake", "HTTPHeaders": {},
                                             "RetryAttempts": 0}}


def error_response(code: str, message: str, status: int) -> tuple[AWSResponse, dict[str, Any]]:
    """What a ``before-call`` handler returns for an error answer (as botocore's Stubber does)."""
    parsed = {"Error": {"Code": code, "Message": message},
              "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "fake", "HTTPHeaders": {}}}
    return AWSResponse("https://fake", status, {}, None), parsed


class _Fake:
    """Register ``handlers`` ({operation: callable(params) -> response}) for ``service``."""

    service = ""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        raise NotImplementedError

    def register(self, events: Any, skip: Iterable[str] = ()) -> None:
        """Answer this fake's operations on clients of ``events``, but those in ``skip``."""
        for operation in self.handlers():
            if operation in skip:
                continue
            events.register(f"before-parameter-build.{self.service}.{operation}", self._stash)
            events.register(f"before-call.{self.service}.{operation}", self._answer)

    def _stash(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["fake_params"] = copy.deepcopy(params)

    def _answer(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        params = context.get("fake_params", {})
        with self._lock:
            self.calls.append((model.name, params))
        try:
            response = self.handlers()[model.name](params)
        except FakeError as exc:
            return error_response(exc.code, exc.message, exc.status)
        return AWSResponse("https://fake", 200, {}, None), _checked(model, response)


class FakeError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


# ---------------------------------------------------------------------------------------------
# IAM policy simulation


def _condition_holds(operator: str, key: str, expected: Any, context: dict[str, list[str]]) -> bool:
    qualifier, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists")
    op = op[: -len("IfExists")] if if_exists else op
    values = context.get(key.lower())
    wanted = [str(v) for v in (expected if isinstance(expected, list) else [expected])]
    if values is None:
        return if_exists or qualifier == "ForAllValues" or op == "Null" and str(expected).lower() == "true"

    def one(value: str) -> bool:
        if op in ("StringEquals", "ArnEquals"):
            return value in wanted
        if op in ("StringLike", "ArnLike"):
            return matches(wanted, value)
        if op == "StringEqualsIgnoreCase":
            return value.lower() in [w.lower() for w in wanted]
        if op in ("StringNotEquals", "ArnNotEquals"):
            return value not in wanted
        if op in ("StringNotLike", "ArnNotLike"):
            return not matches(wanted, value)
        if op == "Bool":
            return value.lower() in [w.lower() for w in wanted]
        if op == "Null":
            return str(expected).lower() == "false"
        return False  # an operator this fake does not know never matches: the safe side

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    return any(one(v) for v in values)


def _applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, list[str]]) -> bool:
    def as_list(v: Any) -> list[str]:
        return [str(x) for x in (v if isinstance(v, list) else [v])] if v is not None else []

    if "Action" in statement and not matches(as_list(statement["Action"]), action, case_insensitive=True):
        return False
    if "NotAction" in statement and matches(as_list(statement["NotAction"]), action, case_insensitive=True):
        return False
    if "Resource" in statement and not matches(as_list(statement["Resource"]), resource):
        return False
    if "NotResource" in statement and matches(as_list(statement["NotResource"]), resource):
        return False
    for operator, block in (statement.get("Condition") or {}).items():
        for key, expected in block.items():
            if not _condition_holds(operator, key, expected, context):
                return False
    return True


def evaluate(documents: Iterable[tuple[str, Any]], action: str, resource: str,
             context: dict[str, list[str]]) -> tuple[str, list[str]]:
    """(``allowed`` | ``explicitDeny`` | ``implicitDeny``, ids of the statements that decided)."""
    allowed: list[str] = []
    for policy_id, document in documents:
        for statement in statements(document):
            if not _applies(statement, action, resource, context):
                continue
            if statement.get("Effect") == "Deny":
                return "explicitDeny", [policy_id]
            if statement.get("Effect") == "Allow":
                allowed.append(policy_id)
    return ("allowed", allowed[:1]) if allowed else ("implicitDeny", [])


class IamSimulator(_Fake):
    """IAM's policy simulator over the documents moto holds.

    :param iam: a boto3 IAM client of moto (to read a principal's policies).
    :param false_deny: actions the real simulator denies although a policy allows them.
    """

    service = "iam"

    def __init__(self, iam: Any, false_deny: Iterable[str] = ("lambda:PassNetworkConnector",)) -> None:
        super().__init__()
        self.iam = iam
        self.false_deny = {a.lower() for a in false_deny}

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"SimulateCustomPolicy": self._custom, "SimulatePrincipalPolicy": self._principal}

    def _results(self, identity: list[tuple[str, Any]], boundary: list[tuple[str, Any]],
                 params: dict[str, Any]) -> dict[str, Any]:
        context = {e["ContextKeyName"].lower(): list(e.get("ContextKeyValues", [])) for e in params.get("ContextEntries", [])}
        results = []
        for resource in params.get("ResourceArns") or ["*"]:
            for action in params["ActionNames"]:
                decision, matched = evaluate(identity, action, resource, context)
                if decision == "allowed" and boundary:
                    inside, _ = evaluate(boundary, action, resource, context)
                    if inside != "allowed":
                        decision, matched = "implicitDeny", []
                if decision == "allowed" and action.lower() in self.false_deny:
                    decision, matched = "implicitDeny", []  # the real simulator's known false deny
                results.append({
                    "EvalActionName": action,
                    "EvalResourceName": resource,
                    "EvalDecision": decision,
                    "MatchedStatements": [{"SourcePolicyId": m, "SourcePolicyType": "user-managed"} for m in matched],
                    "MissingContextValues": [],
                })
        return {"EvaluationResults": results, "IsTruncated": False}

    def _custom(self, params: dict[str, Any]) -> dict[str, Any]:
        identity = [(f"PolicyInputList.{i + 1}", json.loads(p)) for i, p in enumerate(params["PolicyInputList"])]
        boundary = [(f"PermissionsBoundaryPolicyInputList.{i + 1}", json.loads(p))
                    for i, p in enumerate(params.get("PermissionsBoundaryPolicyInputList", []))]
        return self._results(identity, boundary, params)

    def _principal(self, params: dict[str, Any]) -> dict[str, Any]:
        arn = params["PolicySourceArn"]
        if ":role/" not in arn:
            raise FakeError("InvalidInput", f"this fake simulates roles only, not {arn}")
        name = arn.rsplit("/", 1)[-1]
        try:
            role = self.iam.get_role(RoleName=name)["Role"]
        except self.iam.exceptions.NoSuchEntityException:
            raise FakeError("NoSuchEntity", f"The role with name {name} cannot be found.", 404) from None
        identity = []
        for attached in self.iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            identity.append((attached["PolicyName"], self._document(attached["PolicyArn"])))
        for policy_name in self.iam.list_role_policies(RoleName=name)["PolicyNames"]:
            identity.append((policy_name, self.iam.get_role_policy(RoleName=name, PolicyName=policy_name)["PolicyDocument"]))
        boundary = []
        if role.get("PermissionsBoundary"):
            boundary_arn = role["PermissionsBoundary"]["PermissionsBoundaryArn"]
            boundary.append(("boundary", self._document(boundary_arn)))
        return self._results(identity, boundary, params)

    def _document(self, arn: str) -> Any:
        version = self.iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        return self.iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]


# ---------------------------------------------------------------------------------------------
# Service Quotas

#: The MicroVM quotas of service code lambda as third-party tools listed them
#: (shared/research/microvms.md 6.1), plus one unrelated Lambda quota.
LAMBDA_QUOTAS = {
    "L-CD1C0CC4": ("Max allocated memory across all MicroVMs", 1024.0),
    "L-535CA9B6": ("Rate of RunMicrovm requests", 5.0), "L-91B95582": ("Burst of RunMicrovm requests", 5.0),
    "L-118C44B3": ("Rate of ResumeMicrovm requests", 5.0), "L-25EEC0A4": ("Burst of ResumeMicrovm requests", 5.0),
    "L-90045317": ("Rate of SuspendMicrovm requests", 2.0), "L-139F9A48": ("Burst of SuspendMicrovm requests", 2.0),
    "L-74787B8A": ("Rate of TerminateMicrovm requests", 10.0), "L-2CCA0501": ("Burst of TerminateMicrovm requests", 10.0),
    "L-CE98C9E3": ("Rate of GetMicrovm requests", 100.0), "L-C9C2110E": ("Burst of GetMicrovm requests", 100.0),
    "L-7712260B": ("Rate of CreateMicrovmAuthToken requests", 50.0),
    "L-D65D9F16": ("Burst of CreateMicrovmAuthToken requests", 50.0),
    "L-B99A9384": ("Concurrent executions", 1000.0),
}


class ServiceQuotas(_Fake):
    """Applied quotas of service code ``lambda``; ``applied`` overrides values, ``listed=False``
    leaves codes out of ListServiceQuotas (they are then only found by GetServiceQuota)."""

    service = "service-quotas"

    def __init__(self, applied: Optional[dict[str, float]] = None, *, unlisted: Iterable[str] = (),
                 absent: Iterable[str] = (), renamed: Optional[dict[str, str]] = None, region: str = "us-east-1") -> None:
        super().__init__()
        self.values = {code: value for code, (_, value) in LAMBDA_QUOTAS.items()}
        self.values.update(applied or {})
        self.names = {code: name for code, (name, _) in LAMBDA_QUOTAS.items()}
        self.codes = dict(renamed or {})  # our code -> the code the "service" uses
        self.unlisted = set(unlisted)
        self.absent = set(absent)
        self.region = region

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"ListServiceQuotas": self._list, "GetServiceQuota": self._get, "GetAWSDefaultServiceQuota": self._default}

    def _quota(self, code: str, value: Optional[float] = None) -> dict[str, Any]:
        real = self.codes.get(code, code)
        return {"ServiceCode": "lambda", "ServiceName": "AWS Lambda", "QuotaCode": real, "QuotaName": self.names[code],
                "QuotaArn": f"arn:aws:servicequotas:{self.region}:123456789012:lambda/{real}",
                "Value": self.values[code] if value is None else value, "Unit": "None", "Adjustable": True,
                "GlobalQuota": False}

    def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("ServiceCode") != "lambda":
            raise FakeError("NoSuchResourceException", "no such service", 400)
        return {"Quotas": [self._quota(c) for c in self.values if c not in self.unlisted | self.absent]}

    def _find(self, code: str) -> Optional[str]:
        reverse = {v: k for k, v in self.codes.items()}
        ours = reverse.get(code, code)
        return ours if ours in self.values and ours not in self.absent else None

    def _get(self, params: dict[str, Any]) -> dict[str, Any]:
        code = self._find(params["QuotaCode"])
        if code is None:
            raise FakeError("NoSuchResourceException", f"The request failed because the specified quota "
                            f"{params['QuotaCode']} does not exist.", 400)
        return {"Quota": self._quota(code)}

    def _default(self, params: dict[str, Any]) -> dict[str, Any]:
        code = self._find(params["QuotaCode"])
        if code is None:
            raise FakeError("NoSuchResourceException", "The request failed because the specified quota does not exist.", 400)
        return {"Quota": self._quota(code, LAMBDA_QUOTAS[code][1])}


# ---------------------------------------------------------------------------------------------
# Image versions


class ImageVersions(_Fake):
    """Versions of the fleet's images and of the managed base images (ListManagedMicrovmImageVersions:
    the emulator lists them too, all AVAILABLE, but tests vary their status here; the image versions
    themselves only for an emulator that does not have them)."""

    service = "lambda-microvms"

    def __init__(self) -> None:
        super().__init__()
        self.versions: dict[str, list[dict[str, Any]]] = {}
        self.managed: dict[str, list[dict[str, Any]]] = {}

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {"ListMicrovmImageVersions": self._list, "GetMicrovmImageVersion": self._get,
                "ListManagedMicrovmImageVersions": self._managed}

    def copy(self) -> "ImageVersions":
        """An independent copy a test may change."""
        other = ImageVersions()
        other.versions, other.managed = copy.deepcopy(self.versions), copy.deepcopy(self.managed)
        return other

    def add(self, image_arn: str, version: str, **fields: Any) -> dict[str, Any]:
        now = dt.datetime.now(dt.timezone.utc)
        record = {"imageArn": image_arn, "imageVersion": version, "state": "SUCCESSFUL", "status": "ACTIVE",
                  "createdAt": now, "baseImageArn": image_arn.split(":microvm-image:")[0].rsplit(":", 1)[0]
                  + ":aws:microvm-image:al2023-1", "baseImageVersion": "1",
                  "buildRoleArn": "arn:aws:iam::123456789012:role/build", "codeArtifact": {"uri": "s3://bucket/key.zip"},
                  "resources": [{"minimumMemoryInMiB": 2048}]}
        record.update(fields)
        self.versions.setdefault(image_arn, []).append(record)
        self.add_base(record["baseImageArn"])
        return record

    def add_base(self, base: str) -> None:
        """A managed base image with versions 0 and 1 AVAILABLE (both listed on the service, GT section 7)."""
        now = dt.datetime.now(dt.timezone.utc)
        self.managed.setdefault(base, [
            {"imageArn": base, "imageVersion": "0", "status": "AVAILABLE", "createdAt": now},
            {"imageArn": base, "imageVersion": "1", "status": "AVAILABLE", "createdAt": now},
        ])

    def _image(self, identifier: str) -> list[dict[str, Any]]:
        for arn, versions in self.versions.items():
            if identifier in (arn, arn.rsplit(":", 1)[-1]):
                return versions
        raise FakeError("ResourceNotFoundException", f"MicroVM image {identifier} not found", 404)

    def _list(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"items": copy.deepcopy(self._image(params["imageIdentifier"]))}

    def _get(self, params: dict[str, Any]) -> dict[str, Any]:
        for version in self._image(params["imageIdentifier"]):
            if version["imageVersion"] == params["imageVersion"]:
                return copy.deepcopy(version)
        raise FakeError("ResourceNotFoundException", f"version {params['imageVersion']} not found", 404)

    def _managed(self, params: dict[str, Any]) -> dict[str, Any]:
        items = self.managed.get(params["imageIdentifier"])
        if items is None:
            raise FakeError("ResourceNotFoundException", f"managed image {params['imageIdentifier']} not found", 404)
        return {"items": copy.deepcopy(items)}


# ---------------------------------------------------------------------------------------------
# Faults on the wire


class _Raw:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any):
        yield self._data


def inject_error(events: Any, service: str, operation: str, code: str, *, status: int = 400,
                 message: str = "injected", times: Optional[int] = None, protocol: str = "query") -> dict[str, int]:
    """Answer ``operation`` with an HTTP error in ``protocol``'s format (``query``, ``json`` or
    ``rest-json``), ``times`` times (always when None). Returns a counter of requests answered."""
    seen = {"count": 0}

    def send(request: Any, **_: Any) -> Optional[AWSResponse]:
        if times is not None and seen["count"] >= times:
            return None
        seen["count"] += 1
        headers: dict[str, str] = {}
        if protocol == "query":
            body = (f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
                    f"</Error><RequestId>fake</RequestId></ErrorResponse>").encode()
            headers["Content-Type"] = "text/xml"
        elif protocol == "json":
            body = json.dumps({"__type": code, "message": message}).encode()
            headers["Content-Type"] = "application/x-amz-json-1.1"
        else:
            body = json.dumps({"message": message}).encode()
            headers.update({"Content-Type": "application/json", "x-amzn-ErrorType": code})
        return AWSResponse(request.url, status, headers, _Raw(body))

    events.register_first(f"before-send.{service}.{operation}", send)
    return seen


def _project(root: Any, name: str, toml: str, **flags: Any) -> Any:
    """A product project named ``name`` under ``root`` with the tables of ``toml`` and deploy
    ``flags``, loaded."""
    import tomllib

    from rayito_constructs import AgentProject

    from .projects import write_project

    tables = {k: v for k, v in tomllib.loads(toml).items() if k != "name"}
    return AgentProject.load(write_project(root / name, name=name, tables=tables, dockerfile=True), **flags)
