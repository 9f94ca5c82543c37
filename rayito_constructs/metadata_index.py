"""``MetadataIndex``: the optional session index of a fleet (session id → MicroVM).

With dedicated sessions, a session id the user chose (a chat thread) is only remembered inside the
process that deployed the fleet. The index lets any process find that session's VM. It is off by
default (``AgentFleet(metadata_index=False)``): see docs/metadata-index.md for its cost.

Item schema (one item per session; no secondary index):

=================  ====  ======================================================================
attribute          type  meaning
=================  ====  ======================================================================
``session_id``     S     partition key: the session id the client chose
``fleet``          S     the fleet name
``microvm_id``     S     the MicroVM serving the session (``microvm-<uuid>``)
``endpoint``       S     the MicroVM's HTTPS endpoint
``created_at``     N     epoch seconds when the session was placed
``expires_at``     N     TTL: epoch seconds after which DynamoDB deletes the item (the VM's end)
=================  ====  ======================================================================
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._tables import state_table
from .permissions import TABLE_DATA_ACTIONS, Statement, grant_all, table_key_statement

PARTITION_KEY = "session_id"
TTL_ATTRIBUTE = "expires_at"


class MetadataIndex(Construct):
    """A DynamoDB table that maps a session id to the MicroVM that serves it.

    On demand, point-in-time recovery, encrypted, with a TTL attribute.

    :param encryption_key: customer KMS key; grants on it go through DynamoDB only
        (``kms:ViaService``). Default: an AWS managed key (``aws/dynamodb``).
    :param removal_policy: what happens to the table when it leaves the stack.
        Default: ``RemovalPolicy.RETAIN`` (sessions outlive a mistaken delete).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        encryption_key: Optional[kms.IKey] = None,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        self.table = state_table(
            self, "Table", partition_key=PARTITION_KEY, encryption_key=encryption_key,
            time_to_live_attribute=TTL_ATTRIBUTE, removal_policy=removal_policy,
        )

    @property
    def table_name(self) -> str:
        """The table's name."""
        return self.table.table_name

    @property
    def table_arn(self) -> str:
        """The table's ARN."""
        return self.table.table_arn

    def grant_read_write_data(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read and write session items (and use the customer key, through
        DynamoDB only)."""
        statements = [Statement("MetadataIndex", TABLE_DATA_ACTIONS, (self.table.table_arn,))]
        key = self.table.encryption_key
        if key is not None:
            statements.append(table_key_statement("MetadataIndexKey", key.key_arn, cdk.Stack.of(self).region))
        return grant_all(statements, grantee, self)
