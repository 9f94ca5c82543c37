"""IAM's size limits, checked at synth: a managed policy holds at most 6,144 characters and a
role's inline policies together at most 10,240, whitespace not counted (IAM quotas,
"IAM and AWS STS quotas": "Managed policy size", "Role policy size"). A policy over them fails at
deploy, after the other resources were made; here it is one line at synth that names it.

Unresolved values are counted as the longest they can be once deployed: a pseudo parameter its
longest value (``AWS::Partition`` 10, ``aws-us-gov``; ``AWS::Region`` 14, ``ap-southeast-2``;
``AWS::AccountId`` 12), the ARN of a resource of the stack the longest its type allows (a KMS key's
ends in a 36-character id, an image's in a name of at most 64, a role's in a generated name of at
most 64, a table's in the name CloudFormation generates from the stack's name and the logical id),
any other attribute or reference 200, a joined value the sum of its parts. So the estimate errs
long, never short (a fleet with a customer key, the index and dedicated sessions was refused at
about 6,300 characters when every ARN counted 200).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, Optional

import aws_cdk as cdk

MANAGED_POLICY_LIMIT = 6_144
INLINE_POLICIES_LIMIT = 10_240
_PSEUDO = {"AWS::AccountId": 12, "AWS::Region": 14, "AWS::Partition": 10, "AWS::URLSuffix": 17,
           "AWS::StackName": 128, "AWS::StackId": 160, "AWS::NoValue": 0}
_UNKNOWN = 200
_SUB_VARIABLE = 64


#: ``arn:<partition>:<service>:<region>:<account>:`` at its longest, without the service.
_ARN_HEAD = len("arn:") + 10 + 1 + 1 + 14 + 1 + 12 + 1
#: The longest generated suffix CloudFormation adds to a name it makes (``-`` and 12-13 characters).
_GENERATED_SUFFIX = 14


def _generated_name(stack_name: Optional[str], logical_id: str, limit: int) -> int:
    if stack_name is None:
        return limit
    return min(limit, len(stack_name) + 1 + len(logical_id) + _GENERATED_SUFFIX)


def _arn_bound(resource_type: str, attribute: str, logical_id: str, stack_name: Optional[str]) -> Optional[int]:
    """The longest ``Fn::GetAtt [logical_id, attribute]`` of a resource of ``resource_type`` can be,
    or None when this module does not know that attribute."""
    if attribute == "Arn" and resource_type == "AWS::KMS::Key":
        return _ARN_HEAD + len("kms") + len("key/") + 36
    if attribute == "ImageArn" and resource_type == "AWS::Lambda::MicrovmImage":
        return _ARN_HEAD + len("lambda") + len("microvm-image:") + 64
    if attribute == "Arn" and resource_type == "AWS::IAM::Role":
        return _ARN_HEAD + len("iam") + len("role/") + 64
    if attribute == "Arn" and resource_type == "AWS::DynamoDB::Table":
        return _ARN_HEAD + len("dynamodb") + len("table/") + _generated_name(stack_name, logical_id, 255)
    return None


Bounds = Callable[[str, str], Optional[int]]


def _no_bounds(logical_id: str, attribute: str) -> Optional[int]:
    return None


def _length(value: Any, bounds: Bounds = _no_bounds) -> int:
    """The characters ``value`` takes in a policy without whitespace (a string's quotes included)."""
    if isinstance(value, str):
        return len(json.dumps(value))
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return len(json.dumps(value))
    if isinstance(value, list):
        return 2 + sum(_length(v, bounds) for v in value) + max(len(value) - 1, 0)
    if isinstance(value, dict):
        if len(value) == 1:
            (key, inner), = value.items()
            if key == "Ref":
                return 2 + _PSEUDO.get(str(inner), _UNKNOWN)
            if key == "Fn::Join" and isinstance(inner, list) and len(inner) == 2:
                separator, parts = inner
                parts = parts if isinstance(parts, list) else [parts]
                return 2 + sum(_length(p, bounds) - 2 for p in parts) + len(str(separator)) * max(len(parts) - 1, 0)
            if key == "Fn::Sub":
                text = inner[0] if isinstance(inner, list) else inner
                return 2 + len(str(text)) + str(text).count("${") * _SUB_VARIABLE
            if key == "Fn::GetAtt" and isinstance(inner, list) and len(inner) == 2:
                bound = bounds(str(inner[0]), str(inner[1]))
                return 2 + (_UNKNOWN if bound is None else bound)
            if key.startswith("Fn::"):
                return 2 + _UNKNOWN
        return 2 + sum(len(json.dumps(k)) + 1 + _length(v, bounds) for k, v in value.items()) + max(len(value) - 1, 0)
    return 2 + _UNKNOWN


class _StackResources:
    """The types of one stack's CfnResources by logical id, each resource looked at once.

    A policy's size is checked as each policy is made, so walking the stack every time (one jsii
    round trip per resource for its logical id and type) made a stack of N fleets cost N² round
    trips. The walk now happens only when a policy names a logical id not seen yet, and only the
    resources not seen before (by their jsii reference) are asked for theirs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.types: dict[str, str] = {}

    def refresh(self, stack: cdk.Stack) -> None:
        for construct in stack.node.find_all():
            if not isinstance(construct, cdk.CfnResource):
                continue
            ref = construct.__jsii_ref__.ref  # type: ignore[attr-defined]
            if ref in self.seen:
                continue
            self.seen.add(ref)
            self.types[stack.resolve(construct.logical_id)] = construct.cfn_resource_type


#: By the stack's jsii reference; the last few stacks only (an app rarely checks more at once).
_RESOURCES: "OrderedDict[str, _StackResources]" = OrderedDict()
_KEEP = 8


def _resources_of(stack: cdk.Stack) -> _StackResources:
    key = stack.__jsii_ref__.ref  # type: ignore[attr-defined]
    found = _RESOURCES.get(key)
    if found is None:
        found = _RESOURCES[key] = _StackResources()
        while len(_RESOURCES) > _KEEP:
            _RESOURCES.popitem(last=False)
    else:
        _RESOURCES.move_to_end(key)
    return found


def _stack_bounds(stack: cdk.Stack) -> Bounds:
    """The ARN bounds of the resources ``stack`` defines, by logical id."""
    resources = _resources_of(stack)
    stack_name = None if cdk.Token.is_unresolved(stack.stack_name) else stack.stack_name
    refreshed = False

    def bound(logical_id: str, attribute: str) -> Optional[int]:
        nonlocal refreshed
        if logical_id not in resources.types and not refreshed:
            resources.refresh(stack)
            refreshed = True
        resource_type = resources.types.get(logical_id)
        return None if resource_type is None else _arn_bound(resource_type, attribute, logical_id, stack_name)

    return bound


def estimated_size(scope: cdk.Stack, document: Any) -> int:
    """The characters a policy document takes once deployed, whitespace aside (an estimate that
    errs long for unresolved values)."""
    resolved = scope.resolve(document.to_json() if hasattr(document, "to_json") else document)
    return _length(resolved, _stack_bounds(scope))


def check_size(scope: Any, what: str, document: Any, limit: int, *, hint: str) -> int:
    """Raise ``ValueError`` (one line, naming ``what``) when ``document`` would be over ``limit``."""
    size = estimated_size(cdk.Stack.of(scope), document)
    if size > limit:
        raise ValueError(f"{what}: its policy would take about {size:,} characters, over IAM's limit of {limit:,} "
                         f"(whitespace not counted); {hint}")
    return size
