"""Precise cdk-nag acknowledgements, placed next to the resource they excuse.

cdk-nag v3 matches an acknowledgement by its exact id, and for ``AwsSolutions-IAM5`` the id names
the finding: ``AwsSolutions-IAM5[Resource::<the ARN, flattened>]``. Acknowledging the bare rule
would excuse every wildcard a user adds later, so each wildcard ARN is acknowledged on its own.
The flattening mirrors cdk-nag's ``flattenCfnReference``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import aws_cdk as cdk
from constructs import IConstruct


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


def acknowledge_wildcard_resources(construct: IConstruct, resources: Iterable[str], reason: str) -> None:
    """Acknowledge ``AwsSolutions-IAM5`` for each resource ARN of ``resources`` that has a ``*``."""
    stack = cdk.Stack.of(construct)
    for resource in resources:
        flat = flatten_cfn_reference(stack.resolve(resource))
        if "*" in flat:
            cdk.Validations.of(construct).acknowledge(
                cdk.Acknowledgment(id=f"AwsSolutions-IAM5[Resource::{flat}]", reason=reason)
            )
