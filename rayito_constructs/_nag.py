"""Precise cdk-nag acknowledgements: each covers one statement, never a whole policy or role.

cdk-nag v3 matches an acknowledgement by its exact id, and for ``AwsSolutions-IAM5`` the id names
the finding: ``AwsSolutions-IAM5[Resource::<the ARN, flattened>]`` (or ``[Action::<action>]``). The
id says nothing about the statement: once ``Resource::*`` is acknowledged on a policy for
``ListMicrovms``, an ``ssm:PutParameter`` on ``*`` added to the same policy later would pass
silently. So the library never acknowledges a finding up front. It records, next to the policy or
role, the exact statements it vouches for (Sid, actions, resources, reason) with
:func:`acknowledge_statements`; an aspect on that construct (read-only priority, so after every
mutating aspect) looks at each IAM policy of its subtree as it is finally synthesized and
acknowledges a finding only when **every** statement that produces it is one of those recorded.
Any other statement with a wildcard keeps its finding.

:func:`acknowledge_wildcard_resources` acknowledges one exact, specific ARN (``<function>:*``),
which no unrelated statement shares; a bare ``*`` is refused there.

The flattening mirrors cdk-nag's ``flattenCfnReference``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import aws_cdk as cdk
import jsii
from constructs import IConstruct

from .permissions import Statement

#: Construct metadata that holds the statements a policy or role vouches for.
METADATA_TYPE = "rayito:acknowledged-statements"
RULE = "AwsSolutions-IAM5"
_IAM_TYPES = ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role")


def flatten_cfn_reference(node: Any) -> str:
    """A resolved CloudFormation value as cdk-nag prints it in a finding."""
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict) and len(node) == 1:
        (key, value), = node.items()
        if key == "Fn::Join":
            delimiter, items = value
            return delimiter.join(flatten_cfn_reference(i) for i in items)
        if key == "Fn::Sub":
            return flatten_cfn_reference(value)
        if key == "Fn::GetAtt":
            return f"<{flatten_cfn_reference(value[0])}.{flatten_cfn_reference(value[1])}>"
        if key == "Fn::ImportValue":
            return flatten_cfn_reference(value)
        if key == "Ref":
            return f"<{flatten_cfn_reference(value)}>"
    return json.dumps(node, separators=(",", ":"))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def findings_of(statement: Mapping[str, Any]) -> list[str]:
    """The ``AwsSolutions-IAM5`` findings one resolved statement produces (Allow only)."""
    if statement.get("Effect") != "Allow":
        return []
    actions = [f"Action::{a}" for a in _as_list(statement.get("Action")) if "*" in a]
    resources = [flatten_cfn_reference(r) for r in _as_list(statement.get("Resource"))]
    return actions + [f"Resource::{r}" for r in resources if "*" in r]


def _key(sid: Any, actions: Iterable[str], resources: Iterable[str]) -> str:
    return json.dumps([sid, sorted(actions), sorted(resources)])


def acknowledge_statements(construct: IConstruct, statements: Iterable[Statement], reasons: Mapping[str, str]) -> None:
    """Vouch for exactly these statements of ``construct``'s policies (its policy or its role).

    Every statement with a wildcard (in a resource or an action) needs a reason under its Sid; a
    missing one is a synth error, so a new wildcard never passes silently.
    """
    stack = cdk.Stack.of(construct)
    statements = list(statements)
    entries = []
    for statement, resolved in zip(statements, _resolve_all(stack, [list(s.resources) for s in statements]),
                                   strict=True):
        resources = [flatten_cfn_reference(r) for r in resolved]
        if not any("*" in r for r in resources) and not any("*" in a for a in statement.actions):
            continue
        if statement.sid not in reasons:
            raise ValueError(f"statement {statement.sid}: wildcard in {resources or statement.actions} needs a reason")
        entries.append({"key": _key(statement.sid, statement.actions, resources), "reason": reasons[statement.sid]})
    if entries:
        construct.node.add_metadata(METADATA_TYPE, entries)
        aspect = _aspect_of(stack)
        aspect.vouched.setdefault(construct.node.path, []).extend(entries)
        cdk.Aspects.of(construct).add(aspect, priority=cdk.AspectPriority.READONLY)


def _resolve_all(stack: cdk.Stack, values: list[list[Any]]) -> list[list[Any]]:
    """``stack.resolve`` of each value of each list, in one jsii round trip."""
    resolved = stack.resolve(values) if values else []
    if not isinstance(resolved, list) or [len(v) for v in values] != [len(r) if isinstance(r, list) else -1
                                                                       for r in resolved]:
        return [[stack.resolve(v) for v in value] for value in values]  # a value resolved to a list: one by one
    return resolved


def acknowledge_wildcard_resources(construct: IConstruct, resources: Iterable[str], reason: str) -> None:
    """Acknowledge ``AwsSolutions-IAM5`` for each specific ARN of ``resources`` that has a ``*``
    (``<function ARN>:*``, ``<log group ARN>:*``). A bare ``*`` is shared by every statement on
    ``*``: acknowledge those with :func:`acknowledge_statements` instead."""
    stack = cdk.Stack.of(construct)
    for resource in resources:
        flat = flatten_cfn_reference(stack.resolve(resource))
        if flat == "*":
            raise ValueError("Resource '*' is acknowledged per statement (acknowledge_statements), never by ARN")
        if "*" in flat:
            cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=f"{RULE}[Resource::{flat}]", reason=reason))


def _documents(node: cdk.CfnResource) -> list[Any]:
    stack = cdk.Stack.of(node)
    if node.cfn_resource_type == "AWS::IAM::Role":
        policies = stack.resolve(node.policies) or []  # type: ignore[attr-defined]
        return [stack.resolve(p.get("policyDocument", p.get("PolicyDocument"))) for p in policies]
    return [stack.resolve(node.policy_document)]  # type: ignore[attr-defined]


@jsii.implements(cdk.IAspect)
class _AcknowledgeVouchedStatements:
    """Acknowledges an IAM5 finding of a policy when every statement behind it was vouched for.

    One per stack, added to each construct that vouches for statements (only its subtree can hold
    a policy they cover, so the aspect visits, a jsii callback each, nothing else of the stack; the
    CDK invokes an aspect once per node however many ancestors hold it). It keeps what each
    construct vouched for by path, as the construct's metadata also records it: reading that
    metadata back through jsii cost a round trip per entry of every ancestor."""

    def __init__(self) -> None:
        self.vouched: dict[str, list[dict[str, str]]] = {}

    def _vouched(self, path: str) -> dict[str, str]:
        """The statements vouched for on the construct at ``path`` and its ancestors, by key (an
        ancestor's reason wins, as the nearest construct's entries are read first)."""
        vouched: dict[str, str] = {}
        holders = [p for p in self.vouched if path == p or path.startswith(p + "/")]
        for holder in sorted(holders, key=lambda p: p.count("/"), reverse=True):
            for item in self.vouched[holder]:
                vouched[item["key"]] = item["reason"]
        return vouched

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, cdk.CfnResource) or node.cfn_resource_type not in _IAM_TYPES:
            return
        vouched = self._vouched(node.node.path)
        if not vouched:
            return
        behind: dict[str, list[str | None]] = {}
        for document in _documents(node):  # type: ignore[arg-type]
            for statement in _as_list((document or {}).get("Statement")):
                resources = [flatten_cfn_reference(r) for r in _as_list(statement.get("Resource"))]
                reason = vouched.get(_key(statement.get("Sid"), _as_list(statement.get("Action")), resources))
                for finding in findings_of(statement):
                    behind.setdefault(finding, []).append(reason)
        for finding, reasons in behind.items():
            if all(reasons):
                text = "; ".join(sorted(set(r for r in reasons if r)))
                cdk.Validations.of(node).acknowledge(cdk.Acknowledgment(id=f"{RULE}[{finding}]", reason=text))


#: Each stack's aspect, by the stack's jsii reference.
_ASPECTS: dict[str, _AcknowledgeVouchedStatements] = {}


def _aspect_of(stack: cdk.Stack) -> _AcknowledgeVouchedStatements:
    key = stack.__jsii_ref__.ref  # type: ignore[attr-defined]
    if key not in _ASPECTS:
        _ASPECTS[key] = _AcknowledgeVouchedStatements()
    return _ASPECTS[key]
