"""IAM's size limits, checked at synth: a managed policy holds at most 6,144 characters and a
role's inline policies together at most 10,240, whitespace not counted (IAM quotas,
"IAM and AWS STS quotas": "Managed policy size", "Role policy size"). A policy over them fails at
deploy, after the other resources were made; here it is one line at synth that names it.

Unresolved values are counted as the longest they reasonably are once deployed: a pseudo
parameter its longest value (``AWS::Partition`` 10, ``aws-us-gov``; ``AWS::Region`` 14,
``ap-southeast-2``; ``AWS::AccountId`` 12), an attribute or a reference 200 (an ARN with a path),
a joined value the sum of its parts. So the estimate errs long, never short.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk

MANAGED_POLICY_LIMIT = 6_144
INLINE_POLICIES_LIMIT = 10_240
_PSEUDO = {"AWS::AccountId": 12, "AWS::Region": 14, "AWS::Partition": 10, "AWS::URLSuffix": 17,
           "AWS::StackName": 128, "AWS::StackId": 160, "AWS::NoValue": 0}
_UNKNOWN = 200
_SUB_VARIABLE = 64


def _length(value: Any) -> int:
    """The characters ``value`` takes in a policy without whitespace (a string's quotes included)."""
    if isinstance(value, str):
        return len(json.dumps(value))
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return len(json.dumps(value))
    if isinstance(value, list):
        return 2 + sum(_length(v) for v in value) + max(len(value) - 1, 0)
    if isinstance(value, dict):
        if len(value) == 1:
            (key, inner), = value.items()
            if key == "Ref":
                return 2 + _PSEUDO.get(str(inner), _UNKNOWN)
            if key == "Fn::Join" and isinstance(inner, list) and len(inner) == 2:
                separator, parts = inner
                parts = parts if isinstance(parts, list) else [parts]
                return 2 + sum(_length(p) - 2 for p in parts) + len(str(separator)) * max(len(parts) - 1, 0)
            if key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                return 2 + len(str(text)) + str(text).count("${") * _SUB_VARIABLE
            if key.startswith("Fn::"):
                return 2 + _UNKNOWN
        return 2 + sum(len(json.dumps(k)) + 1 + _length(v) for k, v in value.items()) + max(len(value) - 1, 0)
    return 2 + _UNKNOWN


def estimated_size(scope: cdk.Stack, document: Any) -> int:
    """The characters a policy document takes once deployed, whitespace aside (an estimate that
    errs long for unresolved values)."""
    resolved = scope.resolve(document.to_json() if hasattr(document, "to_json") else document)
    return _length(resolved)


def check_size(scope: Any, what: str, document: Any, limit: int, *, hint: str) -> int:
    """Raise ``ValueError`` (one line, naming ``what``) when ``document`` would be over ``limit``."""
    size = estimated_size(cdk.Stack.of(scope), document)
    if size > limit:
        raise ValueError(f"{what}: its policy would take about {size:,} characters, over IAM's limit of {limit:,} "
                         f"(whitespace not counted); {hint}")
    return size
