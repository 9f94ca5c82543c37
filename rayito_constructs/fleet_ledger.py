"""``FleetLedger``: the slot ledger of every fleet of a stack (partition key ``fleet``, sort key
``key``): one item per slot lease, the tick lease and the counters (docs/reconciler.md)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from ._tables import state_table

_ID = "RayitoFleetLedger"


class FleetLedger(Construct):
    """The ledger table. On demand, encrypted, point-in-time recovery.

    :param removal_policy: Default: ``DESTROY``: a lost ledger is rebuilt by adoption (the next
        tick adopts the image's VMs as members and refills the slots).
    """

    def __init__(self, scope: Construct, id: str, *, removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY) -> None:
        super().__init__(scope, id)
        self.table: dynamodb.ITable = state_table(
            self, "Table", partition_key="fleet", sort_key="key", removal_policy=removal_policy
        )

    @classmethod
    def of(cls, scope: Construct) -> "FleetLedger":
        stack = cdk.Stack.of(scope)
        existing = stack.node.try_find_child(_ID)
        return existing if isinstance(existing, FleetLedger) else cls(stack, _ID)

    def grant_ledger(self, grantee: iam.IGrantable) -> iam.Grant:
        """Read and write ledger items (the reconciler)."""
        return self.table.grant(
            grantee, "dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"
        )
