"""``FleetLedger``: the slot ledger of every fleet of a stack (partition key ``fleet``, sort key
``key``): one item per slot lease, the tick lease and the counters (docs/reconciler.md)."""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._tables import check_shared_key, state_table

_ID = "RayitoFleetLedger"


class FleetLedger(Construct):
    """The ledger table. On demand, encrypted, point-in-time recovery.

    :param removal_policy: Default: ``DESTROY``: a lost ledger is rebuilt by adoption (the next
        tick adopts the image's VMs as members and refills the slots).
    """

    def __init__(self, scope: Construct, id: str, *, removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
                 encryption_key: Optional[kms.IKey] = None) -> None:
        super().__init__(scope, id)
        self.table: dynamodb.ITable = state_table(
            self, "Table", partition_key="fleet", sort_key="key", removal_policy=removal_policy,
            encryption_key=encryption_key,
        )

    @classmethod
    def of(cls, scope: Construct, *, encryption_key: Optional[kms.IKey] = None) -> "FleetLedger":
        """The ledger of ``scope``'s stack, created on first use (with ``encryption_key``); every
        fleet of the stack must ask for the same key."""
        stack = cdk.Stack.of(scope)
        existing = stack.node.try_find_child(_ID)
        if isinstance(existing, FleetLedger):
            check_shared_key(existing.table, encryption_key, "the stack's fleet ledger")
            return existing
        return cls(stack, _ID, encryption_key=encryption_key)

    def grant_ledger(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read and write ledger items (the reconciler)."""
        return self.table.grant(
            grantee, "dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"
        )
