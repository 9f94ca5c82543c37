"""``MetadataIndex``: the product's metadata index for a fleet (``rayito.DynamoDbIndex``).

With dedicated sessions, a session id the user chose (a chat thread) is found by its label
(``rayito.agent.session``) among the fleet's VMs. ``ListMicrovms`` does not know a VM's labels, so
without an index the client can ask only the VMs that are running, one by one; with
``AgentFleet(..., session_index=DynamoDbIndex(<table name>))`` (the product's), every VM the client
starts gets one row, and any process finds a session's VM, suspended ones included, with one
``BatchGetItem`` per page of VMs. It is off by default (``AgentFleet(metadata_index=False)``): see
docs/metadata-index.md for its cost and for the migration from the table of earlier versions.

The table is the product's (``_stacks/_templates/metadata-index.yaml``, ``MetadataIndexTable``):
hash key ``pk`` (S), no sort key, TTL on ``expires_at``; the rows are what the product's
``IndexRecord.to_item`` writes (``pk`` = the MicroVM id, ``image_arn``, ``image_version``,
``started_at_ms``, ``metadata``, ``sdk``, ``expires_at``), once per VM with ``PutItem`` on
``attribute_not_exists(pk)``, read with ``BatchGetItem``, never updated or deleted (the TTL
deletes them). The grants are the product's two policies: ``RayitoIndexWriter`` (``PutIndexRows``)
and ``RayitoIndexReader`` (``ReadIndexRows``). Unlike the product's template (both off by
default), point-in-time recovery is on and the table is retained on delete, as this library's
tables are.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._tables import state_table
from .permissions import INDEX_READ, INDEX_WRITE, Statement, grant_all, table_key_statement

#: The product's key and TTL attribute (``rayito._index``: ``IndexRecord.to_item``, ``PUT_CONDITION``).
PARTITION_KEY = "pk"
TTL_ATTRIBUTE = "expires_at"


class MetadataIndex(Construct):
    """The product's metadata index table: on demand, point-in-time recovery, encrypted, TTL.

    :param encryption_key: customer KMS key; grants on it go through DynamoDB only
        (``kms:ViaService``). Default: an AWS managed key (``aws/dynamodb``).
    :param removal_policy: what happens to the table when it leaves the stack.
        Default: ``RemovalPolicy.RETAIN``.
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
        """The table's name: ``DynamoDbIndex(<it>)``, ``rayito sandbox list --index-table <it>``."""
        return self.table.table_name

    @property
    def table_arn(self) -> str:
        """The table's ARN."""
        return self.table.table_arn

    def _grant(self, sid: str, actions: tuple[str, ...], grantee: iam.IGrantable, what: str) -> iam.Grant:
        statements = [Statement(sid, actions, (self.table.table_arn,))]
        key = self.table.encryption_key
        if key is not None:
            statements.append(table_key_statement("MetadataIndexKey", key.key_arn, cdk.Stack.of(self).region))
        return grant_all(statements, grantee, self, what=what)

    def grant_write_rows(self, grantee: iam.IGrantable) -> iam.Grant:
        """The product's ``RayitoIndexWriter``: ``dynamodb:PutItem`` (a row per VM the client
        starts, ``Sandbox.create(index=)``, ``PoolConfig(index=)``)."""
        return self._grant("PutIndexRows", INDEX_WRITE, grantee, "grant_write_rows")

    def grant_read_rows(self, grantee: iam.IGrantable) -> iam.Grant:
        """The product's ``RayitoIndexReader``: ``dynamodb:BatchGetItem`` (``Sandbox.list(metadata=,
        index=)``, a fleet's ``find_session``)."""
        return self._grant("ReadIndexRows", INDEX_READ, grantee, "grant_read_rows")

    def grant_read_write_data(self, grantee: iam.IGrantable) -> iam.Grant:
        """Both: what a fleet's client needs (it finds sessions and starts VMs)."""
        return self._grant("MetadataIndex", (*INDEX_WRITE, *INDEX_READ), grantee, "grant_read_write_data")
