"""``ControlPlaneBudget``: the DynamoDB table of control-plane token buckets that every fleet's
reconciler in an account and region shares (see docs/reconciler.md).

One item per MicroVMs operation (partition key ``operation``), holding a GCRA arrival time and an
optional backoff. ``ControlPlaneBudget.of(stack)`` makes one per stack; to share one table across
stacks or apps, create it once and pass ``ControlPlaneBudget.from_table_name(...)`` elsewhere.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._tables import check_shared_key, state_table

_ID = "RayitoControlPlaneBudget"


class ControlPlaneBudget(Construct):
    """Token buckets per MicroVMs operation, shared by reconcilers.

    :param table_name: Default: a name CloudFormation generates.
    :param removal_policy: Default: ``DESTROY``: the buckets are seconds-long state that any
        reconciler rebuilds; there is nothing to keep.
    """

    def __init__(self, scope: Construct, id: str, *, table_name: Optional[str] = None,
                 removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
                 encryption_key: Optional[kms.IKey] = None) -> None:
        super().__init__(scope, id)
        self.table: dynamodb.ITable = state_table(
            self, "Table", partition_key="operation", table_name=table_name, removal_policy=removal_policy,
            encryption_key=encryption_key,
        )

    @classmethod
    def of(cls, scope: Construct, *, encryption_key: Optional[kms.IKey] = None) -> "ControlPlaneBudget":
        """The budget of ``scope``'s stack, created on first use (with ``encryption_key``); every
        fleet of the stack must ask for the same key."""
        stack = cdk.Stack.of(scope)
        existing = stack.node.try_find_child(_ID)
        if isinstance(existing, ControlPlaneBudget):
            check_shared_key(existing.table, encryption_key, "the stack's control-plane budget")
            return existing
        return cls(stack, _ID, encryption_key=encryption_key)

    @staticmethod
    def from_table_name(scope: Construct, id: str, table_name: str) -> dynamodb.ITable:
        """A budget table made by another stack or app."""
        return dynamodb.Table.from_table_name(scope, id, table_name)

    def grant_acquire(self, grantee: iam.IGrantable) -> iam.Grant:
        """What a reconciler needs: conditional updates and reads of the buckets."""
        return self.table.grant(grantee, "dynamodb:UpdateItem", "dynamodb:GetItem")
