"""IAM invariants checked on every template the tests synthesize (the session gate in conftest.py).

* The launcher never writes the recipe: no action of ``SandboxLauncherPolicy``, of the reconciler's
  role or of the MicroVMs' execution role matches ``ssm:PutParameter`` the way IAM matches
  (case-insensitive, ``*`` and ``?`` wildcards: ``ssm:Put*``, ``ssm:*``, ``*``, ``SSM:p?tparameter``),
  and none of them allows with ``NotAction``.
* A wildcard resource only where the allow-list below says, and only for the actions it lists
  (a Sid'd statement must also carry one of the Sids that may hold a wildcard).
* Every ``iam:PassRole`` names roles (no wildcard; a role ARN or a role of the template) and
  carries ``iam:PassedToService``.
* The launcher never publishes an image (no ``lambda:CreateMicrovmImage``/``UpdateMicrovmImage``)
  and never writes a secret (no ``secretsmanager:PutSecretValue``/``CreateSecret``).
* A secret is named with the six characters Secrets Manager appends (``<name>-??????``), never a
  bare prefix (``<name>*`` would reach ``<name>-old``), but in the account-wide form.
* Every KMS grant names the service it goes through (``kms:ViaService``).
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any, Iterable

from rayito_constructs._nag import flatten_cfn_reference
from rayito_constructs.permissions import (
    CREATE_IMAGE_ACTIONS,
    IMAGE_ACTIONS,
    IMAGE_CATALOG_ACTIONS,
    LIST_ACTIONS,
    MANAGED_IMAGE_VERSIONS_ACTIONS,
    MICROVM_ACTIONS,
    STAR_REASONS,
)

#: Roles and policies that launch sandboxes: they may read and delete the recipe, never write it.
LAUNCHER_DESCRIPTIONS = (
    "Rayito SandboxLauncherPolicy",
    "Rayito reconciler",
    "Rayito: the role a fleet's MicroVMs run as",
)
RECIPE_WRITE = "ssm:PutParameter"
#: What a launcher never does besides writing the recipe: publish an image, write a secret.
LAUNCHER_NEVER = ("lambda:CreateMicrovmImage", "lambda:UpdateMicrovmImage", "secretsmanager:PutSecretValue",
                  "secretsmanager:CreateSecret")
NO_RESOURCE = {*LIST_ACTIONS, *CREATE_IMAGE_ACTIONS, *IMAGE_CATALOG_ACTIONS, *MANAGED_IMAGE_VERSIONS_ACTIONS}
LOG_ACTIONS = {"logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"}
#: Sids that may hold a wildcard resource (every one with its reason in permissions.STAR_REASONS),
#: and the statements of the roles the library makes.
WILDCARD_SIDS = {*STAR_REASONS, "MicrovmLogs", "BuildLogs"}
_PSEUDO_OR_VALUE = r"(?:<AWS::[A-Za-z]+>|[^:*]+)"


def _arn(pattern: str) -> str:
    return pattern.replace("{P}", _PSEUDO_OR_VALUE).replace("{R}", _PSEUDO_OR_VALUE).replace("{A}", _PSEUDO_OR_VALUE)


#: (flattened resource pattern, actions allowed on it, Sids it is reserved to or None for any).
#: ``{P}``, ``{R}`` and ``{A}`` stand for an ARN's partition, region and account: a value, or a
#: pseudo parameter as the flattening shows it (``<AWS::AccountId>``, colons included: the
#: environment-agnostic stacks ``app.py`` makes; the tests' own stacks name an account and region).
#: The reserved Sids whose statements ``grant_publish`` also adds to a principal, Sid dropped.
GRANTED_WITHOUT_SID = frozenset({"UploadArtifacts", "BuildLogs"})

ALLOWED_WILDCARDS: tuple[tuple[re.Pattern[str], frozenset[str], frozenset[str] | None], ...] = (
    (re.compile(_arn(r"^\*$")), frozenset(NO_RESOURCE), None),
    (re.compile(_arn(r"^\*$")), frozenset(MICROVM_ACTIONS), frozenset({"MicrovmsOnAnyImage"})),
    # scope_microvm_actions_to_image=False: the fleet's server opens VMs of any image, as the
    # reconciler drives them (FleetServer)
    (re.compile(_arn(r"^\*$")), frozenset({"lambda:GetMicrovm", "lambda:CreateMicrovmAuthToken"}),
     frozenset({"ServeMicrovms"})),
    # one image and its versions, or every image account-wide
    (re.compile(_arn(r"^(arn:{P}:lambda:{R}:{A}:microvm-image:[^:*/]+|<[A-Za-z0-9.]+>):\*$")),
     frozenset({*MICROVM_ACTIONS, *IMAGE_ACTIONS}), None),
    (re.compile(_arn(r"^arn:{P}:lambda:{R}:{A}:microvm-image:\*$")), frozenset({*MICROVM_ACTIONS, *IMAGE_ACTIONS}), None),
    (re.compile(_arn(r"^arn:{P}:lambda:{R}:{A}:microvm-image:\*$")), frozenset({"lambda:CreateMicrovmAuthToken"}),
     frozenset({"ServeMicrovms"})),
    (re.compile(_arn(r"^arn:{P}:lambda:{R}:aws:network-connector:aws-network-connector:\*$")),
     frozenset({"lambda:PassNetworkConnector"}), None),
    (re.compile(_arn(r"^arn:{P}:logs:{R}:{A}:log-group:/aws/lambda-microvms/.+:\*$")), frozenset(LOG_ACTIONS), None),
    (re.compile(_arn(r"^arn:{P}:ssm:{R}:{A}:parameter/rayito/agents/\*$")),
     frozenset({"ssm:GetParameter", "ssm:DeleteParameter", "ssm:PutParameter"}), None),
    # the product's artifact keys in the artifact bucket (rayito/images/*, rayito/templates/*)
    (re.compile(_arn(r"^arn:{P}:s3:::[^/*]+/rayito/(images|templates)/\*$")),
     frozenset({"s3:PutObject", "s3:GetObject"}), frozenset({"UploadArtifacts"})),
    # the image composer reads the base images' zips, and reads and writes one image's composed zips,
    # which that image's build role reads (ImageComposer, AgentImage over a published base)
    (re.compile(_arn(r"^arn:{P}:s3:::[^/*]+/rayito/images/\*$")), frozenset({"s3:GetObject"}),
     frozenset({"ReadBaseArtifacts"})),
    (re.compile(_arn(r"^arn:{P}:s3:::[^/*]+/rayito/templates/[A-Za-z0-9_-]+/\*$")),
     frozenset({"s3:PutObject", "s3:GetObject"}), frozenset({"ComposedArtifacts"})),
    (re.compile(_arn(r"^arn:{P}:s3:::[^/*]+/rayito/templates/[A-Za-z0-9_-]+/\*$")), frozenset({"s3:GetObject"}),
     frozenset({"ReadCode"})),
    # the fleet image's build log group (/rayito/<image>, the product's) and its streams
    (re.compile(_arn(r"^arn:{P}:logs:{R}:{A}:log-group:/rayito/[^*]+:\*$")),
     frozenset({"logs:DescribeLogStreams", "logs:GetLogEvents"}), frozenset({"BuildLogs"})),
    # the agent image's build role writes its own /rayito/<image> group's streams (AgentImage)
    (re.compile(_arn(r"^arn:{P}:logs:{R}:{A}:log-group:/rayito/[^*]+:\*$")), frozenset(LOG_ACTIONS),
     frozenset({"BuildLogs"})),
    # account-wide: every fleet's token, every secret under rayito/ (webhooks denied), every build log group
    (re.compile(_arn(r"^arn:{P}:secretsmanager:{R}:{A}:secret:rayito/agents/\*/access-token-\?{6}$")),
     frozenset({"secretsmanager:GetSecretValue"}), frozenset({"AccessToken"})),
    (re.compile(_arn(r"^arn:{P}:secretsmanager:{R}:{A}:secret:rayito/\*$")),
     frozenset({"secretsmanager:GetSecretValue"}), frozenset({"GatewaySecrets"})),
    (re.compile(_arn(r"^arn:{P}:logs:{R}:{A}:log-group:/rayito/\*(:\*)?$")),
     frozenset({"logs:DescribeLogStreams", "logs:GetLogEvents"}), frozenset({"BuildLogs"})),
    # the agent image's build role writes its own /rayito/<image> group's streams (AgentImage)
    (re.compile(_arn(r"^arn:{P}:logs:{R}:{A}:log-group:/rayito/[^*]+:\*$")), frozenset(LOG_ACTIONS),
     frozenset({"BuildLogs"})),
    # EventBridge Scheduler invokes one function and its versions (CDK's grant)
    (re.compile(_arn(r"^<[A-Za-z0-9]+\.Arn>:\*$")), frozenset({"lambda:InvokeFunction"}), None),
    # an image's code artifact objects (given by the caller of ImagePublisherPolicy)
)


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def iam_matches(pattern: str, action: str) -> bool:
    """IAM's action matching: case-insensitive, ``*`` and ``?`` wildcards."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower())


def _role_descriptions(resources: dict[str, Any]) -> dict[str, str]:
    return {k: str(r.get("Properties", {}).get("Description", "")) for k, r in resources.items() if r["Type"] == "AWS::IAM::Role"}


def policy_documents(template: dict[str, Any]) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """``(name, owner description, document)`` of every identity policy in the template."""
    resources = template.get("Resources", {})
    roles = _role_descriptions(resources)
    for logical, resource in resources.items():
        props = resource.get("Properties", {})
        kind = resource["Type"]
        if kind == "AWS::IAM::ManagedPolicy":
            yield logical, str(props.get("Description", "")), props["PolicyDocument"]
        elif kind == "AWS::IAM::Policy":
            owners = [roles.get(r.get("Ref", ""), "") for r in props.get("Roles", []) if isinstance(r, dict)]
            yield logical, " | ".join(owners), props["PolicyDocument"]
        elif kind == "AWS::IAM::Role":
            for policy in props.get("Policies", []) or []:
                yield f"{logical}/{policy.get('PolicyName')}", roles[logical], policy["PolicyDocument"]


def _is_launcher(description: str) -> bool:
    return any(part.strip().startswith(LAUNCHER_DESCRIPTIONS) for part in description.split(" | "))


def _role_reference_ok(resource: Any, roles: set[str]) -> bool:
    if isinstance(resource, str):
        return "*" not in resource and bool(re.match(r"^arn:[^:]+:iam::[0-9]{12}:role/[^*?]+$", resource))
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        logical, attribute = resource["Fn::GetAtt"]
        return logical in roles and attribute == "Arn"
    flat = flatten_cfn_reference(resource)
    return "*" not in flat and ":role/" in flat


def iam_violations(template: dict[str, Any]) -> list[str]:
    """Every breach of the invariants above, one line each (empty when the template keeps them)."""
    found: list[str] = []
    roles = set(_role_descriptions(template.get("Resources", {})))
    for name, owner, document in policy_documents(template):
        for number, statement in enumerate(as_list(document.get("Statement"))):
            if statement.get("Effect") != "Allow":
                continue
            where = f"{name} statement {statement.get('Sid', number)}"
            actions = [str(a) for a in as_list(statement.get("Action"))]
            if _is_launcher(owner):
                if "NotAction" in statement:
                    found.append(f"{where}: a launcher allows with NotAction")
                for action in actions:
                    if iam_matches(action, RECIPE_WRITE):
                        found.append(f"{where}: a launcher may write the recipe ({action} matches {RECIPE_WRITE})")
                    for never in LAUNCHER_NEVER:
                        if owner.startswith("Rayito SandboxLauncherPolicy") and iam_matches(action, never):
                            found.append(f"{where}: a launcher may {never} ({action})")
            for resource in as_list(statement.get("Resource")):
                flat = flatten_cfn_reference(resource)
                if ":secret:" in flat and not flat.endswith("-??????") and "*" in flat and statement.get("Sid") not in (
                        "GatewaySecrets", "NeverWebhookSigningSecrets"):
                    found.append(f"{where}: the secret {flat} is a prefix, not a name and its six characters")
            if any(iam_matches(a, "iam:PassRole") for a in actions):
                condition = statement.get("Condition", {}).get("StringEquals", {})
                if "iam:PassedToService" not in condition:
                    found.append(f"{where}: iam:PassRole without iam:PassedToService")
                for resource in as_list(statement.get("Resource")):
                    if not _role_reference_ok(resource, roles):
                        found.append(f"{where}: iam:PassRole on {flatten_cfn_reference(resource)}, not a role")
            if any(a.lower().startswith("kms:") or a == "*" for a in actions):
                if "kms:ViaService" not in json.dumps(statement.get("Condition", {})):
                    found.append(f"{where}: a KMS grant without kms:ViaService")
            sid = statement.get("Sid")
            for resource in as_list(statement.get("Resource")):
                flat = flatten_cfn_reference(resource)
                if "*" not in flat:
                    continue
                if sid is not None and sid not in WILDCARD_SIDS:
                    found.append(f"{where}: Sid {sid} may not hold a wildcard resource ({flat})")
                    continue
                # a statement without a Sid is a grant in a principal's default policy (CDK's
                # iam.Grant drops the Sid): the publisher's grants carry the same statements as
                # ImagePublisherPolicy's UploadArtifacts and BuildLogs, so they may use their patterns
                allowed = [
                    acts for pattern, acts, sids in ALLOWED_WILDCARDS
                    if pattern.match(flat) and (sids is None or sid in sids
                                                or sid is None and sids <= GRANTED_WITHOUT_SID)
                ]
                bad = [a for a in actions if not any(a in acts for acts in allowed)]
                if bad or not allowed:
                    found.append(f"{where}: {bad or actions} on {flat} is outside the wildcard allow-list")
    return found
