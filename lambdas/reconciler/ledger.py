"""The slot ledger: one item per slot, a tick lease, and cumulative counters, per fleet.

DynamoDB layout (partition key ``fleet``, sort key ``key``):

* ``slot#<slot id>``: ``doc`` = the slot as JSON (see :class:`.core.Slot`);
* ``#tick``: the tick lease (``holder``, ``expires_at``): one tick of a fleet at a time;
* ``#stats``: ``epoch`` (part of every client token, so a re-created ledger never reuses a token
  of an earlier one), ``run_attempts`` and ``slots_filled`` (retry amplification).
"""

from __future__ import annotations

import json
import secrets
import threading
from typing import Any, Optional

from .core import Slot


class MemoryLedger:
    """The ledger in one process (tests and the benchmark)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, dict[str, dict[str, Any]]] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._stats: dict[str, dict[str, Any]] = {}

    def acquire_tick(self, fleet: str, holder: str, now: float, lease_seconds: float) -> bool:
        with self._lock:
            current = self._leases.get(fleet)
            if current and current[0] != holder and current[1] > now:
                return False
            self._leases[fleet] = (holder, now + lease_seconds)
            return True

    def release_tick(self, fleet: str, holder: str) -> None:
        with self._lock:
            if self._leases.get(fleet, ("",))[0] == holder:
                del self._leases[fleet]

    def load(self, fleet: str) -> tuple[dict[str, Slot], dict[str, Any]]:
        with self._lock:
            slots = {k: Slot.from_dict(v) for k, v in self._slots.get(fleet, {}).items()}
            stats = self._stats.setdefault(fleet, {"epoch": secrets.token_hex(4), "run_attempts": 0, "slots_filled": 0})
            return slots, dict(stats)

    def save(self, fleet: str, slot: Slot) -> None:
        with self._lock:
            self._slots.setdefault(fleet, {})[slot.slot_id] = slot.to_dict()

    def delete(self, fleet: str, slot_id: str) -> None:
        with self._lock:
            self._slots.get(fleet, {}).pop(slot_id, None)

    def add_stats(self, fleet: str, **deltas: int) -> None:
        with self._lock:
            stats = self._stats.setdefault(fleet, {"epoch": secrets.token_hex(4), "run_attempts": 0, "slots_filled": 0})
            for key, value in deltas.items():
                stats[key] = stats.get(key, 0) + value


class DynamoDBLedger:
    """The ledger in DynamoDB."""

    @staticmethod
    def create_table(dynamodb: Any, table_name: str) -> None:
        """Create the table as the construct does (for local runs and tests)."""
        dynamodb.create_table(
            TableName=table_name,
            KeySchema=[{"AttributeName": "fleet", "KeyType": "HASH"}, {"AttributeName": "key", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "fleet", "AttributeType": "S"},
                {"AttributeName": "key", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._ddb = dynamodb
        self._table = table_name

    def _key(self, fleet: str, key: str) -> dict[str, Any]:
        return {"fleet": {"S": fleet}, "key": {"S": key}}

    def acquire_tick(self, fleet: str, holder: str, now: float, lease_seconds: float) -> bool:
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item={**self._key(fleet, "#tick"), "holder": {"S": holder}, "expires_at": {"N": repr(now + lease_seconds)}},
                ConditionExpression="attribute_not_exists(fleet) OR expires_at < :now OR holder = :holder",
                ExpressionAttributeValues={":now": {"N": repr(now)}, ":holder": {"S": holder}},
            )
            return True
        except self._ddb.exceptions.ConditionalCheckFailedException:
            return False

    def release_tick(self, fleet: str, holder: str) -> None:
        try:
            self._ddb.delete_item(
                TableName=self._table,
                Key=self._key(fleet, "#tick"),
                ConditionExpression="holder = :holder",
                ExpressionAttributeValues={":holder": {"S": holder}},
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            pass

    def load(self, fleet: str) -> tuple[dict[str, Slot], dict[str, Any]]:
        slots: dict[str, Slot] = {}
        stats: Optional[dict[str, Any]] = None
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "fleet = :fleet",
            "ExpressionAttributeValues": {":fleet": {"S": fleet}},
            "ConsistentRead": True,
        }
        while True:
            page = self._ddb.query(**kwargs)
            for item in page.get("Items", []):
                key = item["key"]["S"]
                if key.startswith("slot#"):
                    slot = Slot.from_dict(json.loads(item["doc"]["S"]))
                    slots[slot.slot_id] = slot
                elif key == "#stats":
                    stats = {
                        "epoch": item["epoch"]["S"],
                        "run_attempts": int(item.get("run_attempts", {}).get("N", 0)),
                        "slots_filled": int(item.get("slots_filled", {}).get("N", 0)),
                    }
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        if stats is None:
            epoch = secrets.token_hex(4)
            try:
                self._ddb.put_item(
                    TableName=self._table,
                    Item={**self._key(fleet, "#stats"), "epoch": {"S": epoch}},
                    ConditionExpression="attribute_not_exists(fleet)",
                )
            except self._ddb.exceptions.ConditionalCheckFailedException:
                return self.load(fleet)
            stats = {"epoch": epoch, "run_attempts": 0, "slots_filled": 0}
        return slots, stats

    def save(self, fleet: str, slot: Slot) -> None:
        self._ddb.put_item(
            TableName=self._table,
            Item={**self._key(fleet, f"slot#{slot.slot_id}"), "doc": {"S": json.dumps(slot.to_dict(), sort_keys=True)}},
        )

    def delete(self, fleet: str, slot_id: str) -> None:
        self._ddb.delete_item(TableName=self._table, Key=self._key(fleet, f"slot#{slot_id}"))

    def add_stats(self, fleet: str, **deltas: int) -> None:
        if not deltas:
            return
        names = {f"#k{i}": k for i, k in enumerate(deltas)}
        values = {f":v{i}": {"N": str(v)} for i, v in enumerate(deltas.values())}
        self._ddb.update_item(
            TableName=self._table,
            Key=self._key(fleet, "#stats"),
            UpdateExpression="ADD " + ", ".join(f"#k{i} :v{i}" for i in range(len(deltas))),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
