"""The slot ledger: one item per slot, a fenced tick lease, and the fleet's counters, per fleet.

DynamoDB layout (partition key ``fleet``, sort key ``key``):

* ``slot#<slot id>``: ``doc`` = the slot as JSON (see :class:`.core.Slot`);
* ``#tick``: the tick lease: ``holder``, ``expires_at`` and ``fence``, a counter every
  acquisition increments. The newest tick always takes the lease (it has the latest deadline; a
  killed tick's lease must not hold the fleet back), and every ledger write of a tick is a
  transaction conditioned on the ``fence`` it acquired: an older tick (a duplicate delivery, a
  hung or skewed one) fails its next write with :class:`FencedOut` and stops, before its next
  RunMicrovm, resume or terminate (each is written down first). No clock is compared.
* ``#stats``: ``epoch`` (part of every client token, so a re-created ledger never reuses a token
  of an earlier one), ``run_attempts`` and ``slots_filled`` (retry amplification), ``spec`` (the
  fingerprint of the spec the last tick ran), ``strays`` (foreign VMs seen, as JSON) and
  ``retired`` (the next generation of each slot id the spec dropped, as JSON: a slot asked for
  again later starts there, so its client tokens are never those of its earlier VMs) and
  ``letters`` (dead letters of slots a spec dropped before the queue took them, as JSON).
* ``ready#<VM id>``: ``doc`` = what the fleet's server answered about the VM (a
  :class:`.core.Ready`: its agent host serves, it is warmed, or why not). The server writes it
  (unfenced: it holds no lease, and the answer belongs to the VM, not to a tick); the reconciler
  deletes it in a fenced write once no slot holds the VM.

**Off.** The fleet's teardown (``teardown.py``, when the fleet is deleted) sets ``off`` on the
``#tick`` item in the same update that increments the fence: a tick already running fails its next
write (:class:`FencedOut`), and a tick that starts later cannot take the lease
(:class:`FleetOff`): no RunMicrovm, resume or terminate of the reconciler goes out after it.
``turn_on`` (the teardown resource's create or update) clears it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from typing import Any, Iterable, Optional

from .core import Ready, Slot


class FencedOut(Exception):
    """Another tick took the fleet's lease: this one must stop writing and calling."""


class FleetOff(Exception):
    """The fleet was turned off (its teardown began): no tick may take the lease."""


def _new_stats() -> dict[str, Any]:
    return {"epoch": secrets.token_hex(4), "run_attempts": 0, "slots_filled": 0, "spec": None, "strays": {},
            "retired": {}, "letters": {}}


def _facts(docs: Iterable[dict[str, Any]]) -> dict[str, Ready]:
    facts = [Ready.from_dict(doc) for doc in docs]
    return {fact.microvm_id: fact for fact in facts}


class MemoryLedger:
    """The ledger in one process (tests and the benchmark), with the same fencing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, dict[str, dict[str, Any]]] = {}
        self._leases: dict[str, dict[str, Any]] = {}
        self._stats: dict[str, dict[str, Any]] = {}
        self._facts: dict[str, dict[str, dict[str, Any]]] = {}

    def put_fact(self, fleet: str, fact: Ready) -> None:
        """The server's answer about a VM (no fence: the server holds no lease)."""
        with self._lock:
            self._facts.setdefault(fleet, {})[fact.microvm_id] = fact.to_dict()

    def acquire_tick(self, fleet: str, holder: str, now: float, lease_seconds: float,
                     tick_until: Optional[float] = None) -> Optional[int]:
        """The lease and its new fence token (taken over from any earlier holder); ``tick_until``
        (when the new holder's tick ends, its clock) tells later ticks how long to wait; raises
        :class:`FleetOff` once the fleet is off."""
        with self._lock:
            lease = self._leases.setdefault(fleet, {"holder": None, "expires_at": 0.0, "fence": 0})
            if lease.get("off"):
                raise FleetOff(fleet)
            lease.update(holder=holder, expires_at=now + lease_seconds, fence=lease["fence"] + 1,
                         tick_until=tick_until)
            return int(lease["fence"])

    def busy_until(self, fleet: str) -> Optional[float]:
        """When the tick holding the lease said it would end (None: free, or not said)."""
        with self._lock:
            lease = self._leases.get(fleet)
            return lease.get("tick_until") if lease and lease.get("holder") else None

    def turn_off(self, fleet: str, marker: str, now: float) -> int:
        """Fence out every tick and keep new ones from starting; returns the new fence."""
        with self._lock:
            lease = self._leases.setdefault(fleet, {"holder": None, "expires_at": 0.0, "fence": 0})
            lease.update(holder=marker, expires_at=0.0, fence=lease["fence"] + 1, off=marker, off_at=now,
                         tick_until=None)
            return int(lease["fence"])

    def turn_on(self, fleet: str) -> None:
        with self._lock:
            lease = self._leases.get(fleet)
            if lease:
                lease.pop("off", None)
                lease.pop("off_at", None)

    def is_off(self, fleet: str) -> bool:
        with self._lock:
            return bool(self._leases.get(fleet, {}).get("off"))

    def release_tick(self, fleet: str, holder: str) -> None:
        with self._lock:
            lease = self._leases.get(fleet)
            if lease and lease["holder"] == holder:
                lease.update(holder=None, expires_at=0.0)

    def _check(self, fleet: str, fence: Optional[int]) -> None:
        if fence is not None and self._leases.get(fleet, {}).get("fence") != fence:
            raise FencedOut(fleet)

    def load(self, fleet: str) -> tuple[dict[str, Slot], dict[str, Any]]:
        with self._lock:
            slots = {k: Slot.from_dict(v) for k, v in self._slots.get(fleet, {}).items()}
            stats = json.loads(json.dumps(self._stats.setdefault(fleet, _new_stats())))
            stats["facts"] = _facts(self._facts.get(fleet, {}).values())
            return slots, stats

    def peek(self, fleet: str) -> tuple[dict[str, Slot], Optional[dict[str, Any]]]:
        with self._lock:
            slots = {k: Slot.from_dict(v) for k, v in self._slots.get(fleet, {}).items()}
            stats = self._stats.get(fleet)
            return slots, (json.loads(json.dumps(stats)) if stats is not None else None)

    def forget(self, fleet: str, slot_ids: Iterable[str], stats: bool = False) -> None:
        with self._lock:
            table = self._slots.get(fleet, {})
            for slot_id in slot_ids:
                table.pop(slot_id, None)
            if stats:
                self._stats.pop(fleet, None)

    def load_vm_ids(self, fleets: Iterable[str]) -> set[str]:
        """VM IDs the slots of other fleets hold (fleets sharing an image)."""
        with self._lock:
            return {i for f in fleets for d in self._slots.get(f, {}).values()
                    for i in (d.get("microvm_id"), d.get("retiring_id")) if i}

    def write(self, fleet: str, fence: Optional[int], puts: Iterable[Slot] = (), deletes: Iterable[str] = (),
              meta: Optional[dict[str, Any]] = None, facts_gone: Iterable[str] = ()) -> None:
        """Slots and metadata in one write, only while ``fence`` is the lease's."""
        with self._lock:
            self._check(fleet, fence)
            table = self._slots.setdefault(fleet, {})
            for slot in puts:
                table[slot.slot_id] = slot.to_dict()
            for slot_id in deletes:
                table.pop(slot_id, None)
            for vm_id in facts_gone:
                self._facts.get(fleet, {}).pop(vm_id, None)
            if meta:
                self._stats.setdefault(fleet, _new_stats()).update(json.loads(json.dumps(meta)))

    def save(self, fleet: str, slot: Slot, fence: Optional[int] = None) -> None:
        self.write(fleet, fence, puts=[slot])

    def delete(self, fleet: str, slot_id: str, fence: Optional[int] = None) -> None:
        self.write(fleet, fence, deletes=[slot_id])

    def add_stats(self, fleet: str, **deltas: int) -> None:
        with self._lock:
            stats = self._stats.setdefault(fleet, _new_stats())
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

    def put_fact(self, fleet: str, fact: Ready) -> None:
        """The server's answer about a VM (no fence: the server holds no lease)."""
        self._ddb.put_item(TableName=self._table, Item={**self._key(fleet, f"ready#{fact.microvm_id}"),
                                                        "doc": {"S": json.dumps(fact.to_dict(), sort_keys=True)}})

    def acquire_tick(self, fleet: str, holder: str, now: float, lease_seconds: float,
                     tick_until: Optional[float] = None) -> Optional[int]:
        """The lease and its new fence token (one UpdateItem), taken over from any earlier
        holder: the fence, not the clock, decides who may write (``expires_at`` and
        ``tick_until``, when the holder's tick ends, only inform). Refused, with
        :class:`FleetOff`, once the fleet's teardown turned it off."""
        try:
            result = self._ddb.update_item(
                TableName=self._table,
                Key=self._key(fleet, "#tick"),
                UpdateExpression="SET holder = :holder, expires_at = :expires, tick_until = :until ADD fence :one",
                ConditionExpression="attribute_not_exists(#off)",
                ExpressionAttributeNames={"#off": "off"},
                ExpressionAttributeValues={":holder": {"S": holder}, ":expires": {"N": repr(now + lease_seconds)},
                                           ":until": {"N": repr(float(tick_until if tick_until is not None else 0.0))},
                                           ":one": {"N": "1"}},
                ReturnValues="UPDATED_NEW",
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            raise FleetOff(fleet) from None
        return int(result["Attributes"]["fence"]["N"])

    def turn_off(self, fleet: str, marker: str, now: float) -> int:
        """Fence out every tick of the fleet and keep new ones from taking the lease (one
        UpdateItem: the fence and the mark together); returns the new fence. Idempotent."""
        result = self._ddb.update_item(
            TableName=self._table,
            Key=self._key(fleet, "#tick"),
            UpdateExpression="SET holder = :marker, expires_at = :zero, tick_until = :zero, #off = :marker, "
                             "off_at = :now ADD fence :one",
            ExpressionAttributeNames={"#off": "off"},
            ExpressionAttributeValues={":marker": {"S": marker}, ":zero": {"N": "0"}, ":now": {"N": repr(now)},
                                       ":one": {"N": "1"}},
            ReturnValues="UPDATED_NEW",
        )
        return int(result["Attributes"]["fence"]["N"])

    def turn_on(self, fleet: str) -> None:
        """Let ticks take the lease again (the fleet's teardown resource was created or updated)."""
        self._ddb.update_item(
            TableName=self._table,
            Key=self._key(fleet, "#tick"),
            UpdateExpression="REMOVE #off, off_at",
            ExpressionAttributeNames={"#off": "off"},
        )

    def is_off(self, fleet: str) -> bool:
        item = self._ddb.get_item(TableName=self._table, Key=self._key(fleet, "#tick"), ConsistentRead=True).get("Item")
        return bool(item and "off" in item)

    def busy_until(self, fleet: str) -> Optional[float]:
        """When the tick holding the lease said it would end (None: free, or not said)."""
        item = self._ddb.get_item(TableName=self._table, Key=self._key(fleet, "#tick"), ConsistentRead=True).get("Item")
        if not item or "holder" not in item:
            return None
        until = float(item.get("tick_until", {}).get("N", "0"))
        return until or None

    def release_tick(self, fleet: str, holder: str) -> None:
        # Refused: taken over already, and the fence keeps the other tick safe.
        with contextlib.suppress(self._ddb.exceptions.ConditionalCheckFailedException):
            self._ddb.update_item(
                TableName=self._table,
                Key=self._key(fleet, "#tick"),
                UpdateExpression="REMOVE holder SET expires_at = :zero",
                ConditionExpression="holder = :holder",
                ExpressionAttributeValues={":holder": {"S": holder}, ":zero": {"N": "0"}},
            )

    def _query(self, fleet: str, prefix: Optional[str] = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "fleet = :fleet" + (" AND begins_with(#k, :prefix)" if prefix else ""),
            "ExpressionAttributeValues": {":fleet": {"S": fleet}, **({":prefix": {"S": prefix}} if prefix else {})},
            "ConsistentRead": True,
        }
        if prefix:
            kwargs["ExpressionAttributeNames"] = {"#k": "key"}
        items: list[dict[str, Any]] = []
        while True:
            page = self._ddb.query(**kwargs)
            items += page.get("Items", [])
            # uncovered: a fleet query over 1 MB (a next page) needs 1 MB of ledger items in moto
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def peek(self, fleet: str) -> tuple[dict[str, Slot], Optional[dict[str, Any]]]:
        """The slots and the stats as they are (``None`` when there are none), creating nothing."""
        slots, stats, _ = self._peek(fleet)
        return slots, stats

    def _peek(self, fleet: str) -> tuple[dict[str, Slot], Optional[dict[str, Any]], dict[str, Ready]]:
        slots: dict[str, Slot] = {}
        stats: Optional[dict[str, Any]] = None
        facts: list[dict[str, Any]] = []
        for item in self._query(fleet):
            key = item["key"]["S"]
            if key.startswith("ready#"):
                facts.append(json.loads(item["doc"]["S"]))
            elif key.startswith("slot#"):
                slot = Slot.from_dict(json.loads(item["doc"]["S"]))
                slots[slot.slot_id] = slot
            elif key == "#stats":
                stats = {
                    "epoch": item["epoch"]["S"],
                    "run_attempts": int(item.get("run_attempts", {}).get("N", 0)),
                    "slots_filled": int(item.get("slots_filled", {}).get("N", 0)),
                    "spec": item.get("spec", {}).get("S"),
                    "strays": json.loads(item.get("strays", {}).get("S", "{}")),
                    "retired": json.loads(item.get("retired", {}).get("S", "{}")),
                    "letters": json.loads(item.get("letters", {}).get("S", "{}")),
                }
        return slots, stats, _facts(facts)

    def forget(self, fleet: str, slot_ids: Iterable[str], stats: bool = False) -> None:
        """Delete slot items (unfenced: the teardown, after turning the fleet off), and with
        ``stats`` the ``#stats`` item too, so a fleet made again later starts a new epoch (new
        client tokens: never the answer of a token of the fleet that was torn down)."""
        keys = [f"slot#{slot_id}" for slot_id in slot_ids] + (["#stats"] if stats else [])
        for key in keys:
            self._ddb.delete_item(TableName=self._table, Key=self._key(fleet, key))

    def load(self, fleet: str) -> tuple[dict[str, Slot], dict[str, Any]]:
        slots, stats, facts = self._peek(fleet)
        if stats is None:
            stats = _new_stats()
            try:
                self._ddb.put_item(
                    TableName=self._table,
                    Item={**self._key(fleet, "#stats"), "epoch": {"S": stats["epoch"]}},
                    ConditionExpression="attribute_not_exists(fleet)",
                )
            except self._ddb.exceptions.ConditionalCheckFailedException:
                # uncovered: two invocations of a new fleet writing its first #stats at once; the
                # tests reach it only when their ticks happen to race (covered in some runs)
                return self.load(fleet)
        stats["facts"] = facts
        return slots, stats

    def load_vm_ids(self, fleets: Iterable[str]) -> set[str]:
        """VM IDs the slots of other fleets hold (fleets sharing an image; read only)."""
        out: set[str] = set()
        for fleet in fleets:
            for item in self._query(fleet, "slot#"):
                doc = json.loads(item["doc"]["S"])
                out |= {i for i in (doc.get("microvm_id"), doc.get("retiring_id")) if i}
        return out

    def write(self, fleet: str, fence: Optional[int], puts: Iterable[Slot] = (), deletes: Iterable[str] = (),
              meta: Optional[dict[str, Any]] = None, facts_gone: Iterable[str] = ()) -> None:
        """Slots and metadata in one transaction, conditioned on the tick's fence."""
        actions: list[dict[str, Any]] = []
        if meta:
            # First: split over several transactions (over 99 items), the stats (the generations
            # of the slots deleted below) land no later than the deletes.
            names = {f"#m{i}": k for i, k in enumerate(meta)}
            values = {f":m{i}": {"S": v if isinstance(v, str) else json.dumps(v, sort_keys=True)}
                      for i, v in enumerate(meta.values())}
            actions.append({"Update": {"TableName": self._table, "Key": self._key(fleet, "#stats"),
                                       "UpdateExpression": "SET " + ", ".join(f"#m{i} = :m{i}" for i in range(len(meta))),
                                       "ExpressionAttributeNames": names, "ExpressionAttributeValues": values}})
        for slot in puts:
            actions.append({"Put": {"TableName": self._table, "Item": {
                **self._key(fleet, f"slot#{slot.slot_id}"), "doc": {"S": json.dumps(slot.to_dict(), sort_keys=True)}}}})
        for slot_id in deletes:
            actions.append({"Delete": {"TableName": self._table, "Key": self._key(fleet, f"slot#{slot_id}")}})
        for vm_id in facts_gone:
            actions.append({"Delete": {"TableName": self._table, "Key": self._key(fleet, f"ready#{vm_id}")}})
        if not actions:
            return
        if fence is None:
            for action in actions:
                kind, body = next(iter(action.items()))
                {"Put": self._ddb.put_item, "Delete": self._ddb.delete_item, "Update": self._ddb.update_item}[kind](**body)
            return
        check = {"ConditionCheck": {"TableName": self._table, "Key": self._key(fleet, "#tick"),
                                    "ConditionExpression": "fence = :fence",
                                    "ExpressionAttributeValues": {":fence": {"N": str(fence)}}}}
        for start in range(0, len(actions), 99):  # 100 items per transaction, the check included
            try:
                self._ddb.transact_write_items(TransactItems=[check, *actions[start:start + 99]])
            except self._ddb.exceptions.TransactionCanceledException as exc:
                reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
                # uncovered: a cancellation for another reason than the fence (a throttled or conflicting item); moto does not produce one
                if reasons and reasons[0] == "ConditionalCheckFailed":
                    raise FencedOut(fleet) from exc
                raise

    def save(self, fleet: str, slot: Slot, fence: Optional[int] = None) -> None:
        self.write(fleet, fence, puts=[slot])

    def delete(self, fleet: str, slot_id: str, fence: Optional[int] = None) -> None:
        self.write(fleet, fence, deletes=[slot_id])

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
