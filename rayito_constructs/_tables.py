"""The DynamoDB tables this library makes share one shape: on demand, encrypted (with a customer key
when the fleet has one), point-in-time recovery, a string partition key and an optional string sort
key."""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from constructs import Construct


def state_table(
    scope: Construct,
    id: str,
    *,
    partition_key: str,
    sort_key: Optional[str] = None,
    removal_policy: cdk.RemovalPolicy,
    encryption_key: Optional[kms.IKey] = None,
    table_name: Optional[str] = None,
    time_to_live_attribute: Optional[str] = None,
) -> dynamodb.Table:
    string = dynamodb.AttributeType.STRING
    return dynamodb.Table(
        scope,
        id,
        table_name=table_name,
        partition_key=dynamodb.Attribute(name=partition_key, type=string),
        sort_key=dynamodb.Attribute(name=sort_key, type=string) if sort_key else None,
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED if encryption_key else dynamodb.TableEncryption.AWS_MANAGED,
        encryption_key=encryption_key,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        time_to_live_attribute=time_to_live_attribute,
        removal_policy=removal_policy,
    )


def check_shared_key(table: dynamodb.ITable, key: Optional[kms.IKey], what: str) -> None:
    """A table shared by the fleets of a stack has one key: a fleet asking for another is an error."""
    have = table.encryption_key
    stack = cdk.Stack.of(table)
    same = (have is None and key is None) or (
        have is not None and key is not None and stack.resolve(have.key_arn) == stack.resolve(key.key_arn)
    )
    if not same:
        def show(k: Optional[kms.IKey]) -> str:
            return "an AWS managed key" if k is None else f"the key {k.node.path}"

        raise ValueError(
            f"recipe_key: {what} is shared by every fleet of the stack and is encrypted with {show(have)}, "
            f"but this fleet asks for {show(key)}; give the fleets of one stack the same key, or put them in "
            "different stacks"
        )
