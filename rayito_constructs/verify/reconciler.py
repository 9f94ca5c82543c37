"""Reconciler: the function is healthy and ticking (its last invocations in CloudWatch Logs, with
time and outcome), no dead letters wait in its queue, the ledger agrees with ListMicrovms
(``min_vms`` base VMs live, ``warm_vms`` slots parked, no VM of the image that no slot owns, never
more than ``max_vms``), and none of the fleet's alarms is in ALARM.

Lists are eventually consistent (``rayito-ground-truth.md`` section 4): a VM started seconds ago may
be missing, an ended one may still show; run verify again before acting on a difference of one VM.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

from .aws import AwsError, unable
from .context import Context
from .report import Finding, fail, ok, warn

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
#: Reconciler ticks run every minute (``FleetReconciler`` default); older than this is stale.
STALE_SECONDS = 300
#: How far back verify reads the reconciler's log.
LOG_WINDOW_SECONDS = 1800
_TEXT_REPORT = re.compile(r"REPORT RequestId:\s*(?P<id>\S+)\s+Duration:\s*(?P<ms>[\d.]+)\s*ms(?P<rest>.*)", re.S)


@dataclass(frozen=True)
class Tick:
    """One invocation, from its platform report line."""

    time: float
    request_id: str
    status: str  # success | error | timeout
    duration_ms: Optional[float]
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return {"time": datetime.fromtimestamp(self.time, timezone.utc).isoformat(), "request_id": self.request_id,
                "status": self.status, "duration_ms": self.duration_ms, "error": self.error}


def parse_ticks(events: Iterable[dict[str, Any]]) -> list[Tick]:
    """Invocations from Lambda's report lines, JSON (``platform.report``) or text (``REPORT``), oldest first."""
    ticks = []
    for event in events:
        message = str(event.get("message", ""))
        when = float(event.get("timestamp", 0)) / 1000
        line: Any = None
        if message.lstrip().startswith("{"):
            try:
                line = json.loads(message)
            except ValueError:
                line = None
        if isinstance(line, dict) and line.get("type") == "platform.report":
            record = line.get("record") or {}
            metrics = record.get("metrics") or {}
            ticks.append(Tick(when, str(record.get("requestId", "")), str(record.get("status", "success")),
                              metrics.get("durationMs"), record.get("errorType")))
            continue
        match = _TEXT_REPORT.search(message)
        if match:
            rest = match.group("rest")
            status = "timeout" if "Status: timeout" in rest else "error" if "Status: error" in rest else "success"
            error = re.search(r"Error Type:\s*(\S+)", rest)
            ticks.append(Tick(when, match.group("id"), status, float(match.group("ms")), error.group(1) if error else None))
    return sorted(ticks, key=lambda t: t.time)


def check(ctx: Context) -> list[Finding]:
    function = ctx.fleet.reconciler_function
    if not function:
        return [warn("reconciler", "not deployed: nothing keeps min_vms and warm_vms",
                     "nothing to do unless the fleet should keep VMs by itself (reconciler=True)")]
    try:
        config = ctx.reconciler_config() or {}
    except AwsError as error:
        return [unable("reconciler", error, f"read the reconciler function {function}")]
    findings = [_function(function, config), _ticks(ctx, function, config), _dead_letters(ctx), _fleet(ctx)]
    findings.append(alarms(ctx, "reconciler.alarms", lambda lid: "EgressBudget" not in lid))
    return findings


def _function(function: str, config: dict[str, Any]) -> Finding:
    state, update = config.get("State", "Active"), config.get("LastUpdateStatus", "Successful")
    data = {"function": function, "state": state, "last_update": update, "role": config.get("Role"),
            "reason": config.get("StateReason") or config.get("LastUpdateStatusReason")}
    if state == "Failed" or update == "Failed":
        return fail("reconciler", f"{function} is {state}/{update}: {data['reason']}",
                    "fix the cause named and deploy again", **data)
    if state != "Active":
        return warn("reconciler", f"{function} is {state}", "wait a minute and run verify again", **data)
    return ok("reconciler", f"{function} is Active", **data)


def log_group(ctx: Context, function: str, config: dict[str, Any]) -> str:
    group = (config.get("LoggingConfig") or {}).get("LogGroup")
    if group:
        return group
    resource = ctx.fleet.resource("AWS::Logs::LogGroup", "ReconcilerLogs")  # not its server's (ReconcilerServerLogs)
    return resource.physical_id if resource and resource.physical_id else f"/aws/lambda/{function}"


def _ticks(ctx: Context, function: str, config: dict[str, Any]) -> Finding:
    group = log_group(ctx, function, config)
    now = ctx.clock()
    try:
        events = [e for page in ctx.clients.pages(
            "logs", "filter_log_events", logGroupName=group, startTime=int((now - LOG_WINDOW_SECONDS) * 1000),
            filterPattern='?"platform.report" ?"REPORT RequestId"', limit_pages=20) for e in page.get("events", [])]
    except AwsError as error:
        if error.kind == "not_found":
            events = []
        else:
            return unable("reconciler.ticks", error, f"read the reconciler's log {group}")
    ticks = parse_ticks(events)
    last = ticks[-5:]
    data = {"log_group": group, "window_seconds": LOG_WINDOW_SECONDS, "ticks": [t.to_dict() for t in last],
            "count": len(ticks), "failed": sum(1 for t in ticks if t.status != "success")}
    stack = ctx.fleet.stack
    deployed = max((t.timestamp() for t in (stack.updated, stack.created) if t is not None), default=0.0)
    if not ticks:
        if now - deployed < STALE_SECONDS:
            return warn("reconciler.ticks", f"no tick yet in {group}; the stack changed {int(now - deployed)} s ago",
                        "wait a minute or two and run verify again", **data)
        return fail("reconciler.ticks", f"no tick in the last {LOG_WINDOW_SECONDS // 60} minutes ({group})",
                    "check the EventBridge schedule of the reconciler (enabled? its role may invoke the function?)", **data)
    newest = ticks[-1]
    age = int(now - newest.time)
    outcomes = ", ".join(f"{t.status}" for t in last)
    what = f"last tick {age} s ago ({newest.status}); last {len(last)}: {outcomes}"
    if age > STALE_SECONDS:
        return fail("reconciler.ticks", f"{what}: no tick for {age // 60} minutes",
                    "check the reconciler's EventBridge schedule and its errors in the log", **data)
    if newest.status != "success":
        return fail("reconciler.ticks", f"{what}: the last tick ended in {newest.status}"
                    + (f" ({newest.error})" if newest.error else ""),
                    f"read the errors in {group} (aws logs tail {group})", **data)
    if data["failed"]:
        return warn("reconciler.ticks", f"{what}; {data['failed']} of {len(ticks)} ticks in "
                    f"{LOG_WINDOW_SECONDS // 60} minutes failed", f"read the errors in {group}", **data)
    return ok("reconciler.ticks", what, **data)


def _dead_letters(ctx: Context) -> Finding:
    url = ctx.reconciler_env().get("DEAD_LETTER_QUEUE_URL") or ctx.fleet.dead_letter_queue_url
    if not url:
        return warn("reconciler.dead_letters", "no dead-letter queue found", "deploy the fleet's stack completely")
    try:
        attributes = ctx.clients.call("sqs", "get_queue_attributes", QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    except AwsError as error:
        return unable("reconciler.dead_letters", error, f"read the dead-letter queue {url}")
    waiting = int(attributes.get("ApproximateNumberOfMessages", 0))
    in_flight = int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0))
    data = {"queue_url": url, "waiting": waiting, "in_flight": in_flight}
    if waiting or in_flight:
        return fail("reconciler.dead_letters", f"{waiting + in_flight} dead letters wait in the queue",
                    f"read them (aws sqs receive-message --queue-url {url}), fix the cause, then invoke the "
                    "reconciler with {\"action\": \"redrive\"}", **data)
    return ok("reconciler.dead_letters", "no dead letters waiting", **data)


def ledger_slots(ctx: Context, table: str, fleet: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fleet's slot documents and its other items (``#stats``, ``#tick``) from the ledger."""
    slots, other = [], {}
    for page in ctx.clients.pages("dynamodb", "query", TableName=table, KeyConditionExpression="#f = :f",
                                  ExpressionAttributeNames={"#f": "fleet"},
                                  ExpressionAttributeValues={":f": {"S": fleet}}):
        for item in page.get("Items", []):
            key = item.get("key", {}).get("S", "")
            plain = {k: next(iter(v.values())) for k, v in item.items() if isinstance(v, dict) and v}
            if key.startswith("slot#"):
                try:
                    doc = json.loads(item.get("doc", {}).get("S", "{}"))
                except ValueError:
                    doc = {}
                slots.append(doc if isinstance(doc, dict) else {})
            else:
                other[key] = plain
    return slots, other


def compare(slots: list[dict[str, Any]], vms: list[dict[str, Any]], *, min_vms: int, warm_vms: int,
            max_vms: int, idle: bool, siblings: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The ledger against ListMicrovms (pure): live base VMs, parked warm slots, members, strays.
    ``siblings``: the slots of the fleets sharing the image (``SHARED_WITH``); the VMs they hold
    are theirs, neither this fleet's strays nor counted toward its ``max_vms`` (as the reconciler
    counts them)."""
    state = {vm["microvmId"]: vm.get("state") for vm in vms}
    theirs = {i for slot in siblings for i in (slot.get("microvm_id"), slot.get("retiring_id")) if i}
    live_ids = {i for i, s in state.items() if s in LIVE}
    sibling_vms = len(live_ids & theirs)
    live_ids -= theirs
    base_states = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED") if idle else ("PENDING", "RUNNING")
    owned: set[str] = set()
    base_live = parked = members = 0
    gone = []
    for slot in slots:
        ids = [i for i in (slot.get("microvm_id"), slot.get("retiring_id")) if i]
        owned.update(ids)
        vm = slot.get("microvm_id")
        role = slot.get("role")
        if vm and vm not in live_ids and slot.get("phase") not in ("queued", "dead"):
            gone.append(vm)
        if role == "base" and any(state.get(i) in base_states for i in ids):
            base_live += 1
        elif role == "warm" and vm and state.get(vm) in ("SUSPENDING", "SUSPENDED"):
            parked += 1
        elif role == "member" and vm in live_ids:
            members += 1
    strays = sorted(live_ids - owned)
    return {"base_live": base_live, "min_vms": min_vms, "parked": parked, "warm_vms": warm_vms,
            "members": members, "strays": strays, "live": len(live_ids), "max_vms": max_vms,
            "dead_slots": sum(1 for s in slots if s.get("phase") == "dead"), "slots": len(slots),
            "ledger_vms_not_listed": gone, "sibling_vms": sibling_vms}


def _fleet(ctx: Context) -> Finding:
    env = ctx.reconciler_env()
    spec = ctx.spec()
    image = ctx.image_arn()
    table = env.get("LEDGER_TABLE")
    fleet = ctx.fleet_name
    if not (table and fleet and image):
        return warn("reconciler.fleet", "the reconciler's ledger or image is unknown", "see the reconciler check")
    try:
        slots, other = ledger_slots(ctx, table, fleet)
    except AwsError as error:
        return unable("reconciler.fleet", error, f"read the ledger {table}")
    try:
        vms = [vm for page in ctx.clients.pages("lambda-microvms", "list_microvms", imageIdentifier=image)
               for vm in page.get("items", [])]
    except AwsError as error:
        return unable("reconciler.fleet", error, f"list the VMs of {image}")
    vms += _confirm_unlisted(ctx, slots, vms)
    siblings, unread = _sibling_slots(ctx, table, env)
    view = compare(slots, vms, min_vms=spec.min_vms or 0, warm_vms=spec.warm_vms or 0,
                   max_vms=spec.max_vms or 0, idle=bool(spec.idle_seconds), siblings=siblings)
    stats = other.get("#stats") or {}
    data = {**view, "ledger_table": table, "stats": stats, "siblings_unread": unread}
    shared = f", {view['sibling_vms']} of sibling fleets" if view["sibling_vms"] else ""
    what = (f"base {view['base_live']}/{view['min_vms']} live, warm {view['parked']}/{view['warm_vms']} parked, "
            f"{view['members']} members, {len(view['strays'])} strays, {view['live']} live of max {view['max_vms']}"
            f"{shared}")
    if view["max_vms"] and view["live"] > view["max_vms"] and unread:
        return warn("reconciler.fleet", f"{what}: above max_vms unless the VMs are sibling fleets' (the ledgers of "
                    f"{', '.join(unread)} could not be read)", "run verify with read access to the ledger table, "
                    "or verify each sibling fleet", **data)
    if view["max_vms"] and view["live"] > view["max_vms"]:
        return fail("reconciler.fleet", f"{what}: above max_vms", "terminate the strays (VMs no slot owns) or raise "
                    "max_vms; report it if the reconciler started them", **data)
    stack = ctx.fleet.stack
    changed = max((t.timestamp() for t in (stack.updated, stack.created) if t is not None), default=0.0)
    if view["base_live"] < view["min_vms"] and ctx.clock() - changed < STALE_SECONDS and not view["dead_slots"]:
        return warn("reconciler.fleet", f"{what}: the stack changed {int(ctx.clock() - changed)} s ago, the fleet "
                    "is still coming up", "run verify again in a few minutes", **data)
    if view["base_live"] < view["min_vms"]:
        dead = f"; {view['dead_slots']} slots dead-lettered" if view["dead_slots"] else ""
        return fail("reconciler.fleet", f"{what}: below min_vms{dead}", "read the reconciler's log for run_deferred, "
                    "api_error or slot_dead_lettered; check the quotas and image findings above", **data)
    if view["parked"] < view["warm_vms"]:
        return warn("reconciler.fleet", f"{what}: parked slots missing (a client may have just taken one)",
                    "run verify again in a minute; if it stays, read the reconciler's log", **data)
    if view["strays"]:
        seen = _stray_ages(stats, view["strays"], ctx.clock())
        since = f" (the reconciler first saw one {int(max(seen) // 60)} min ago)" if seen else ""
        return warn("reconciler.fleet", f"{what}: {', '.join(view['strays'][:3])} run the fleet's image and no slot "
                    f"owns them{since}", "a client's VMs are fine; others (a killed deploy's) cost money: terminate "
                    "them by id, or turn on the reconciler's terminate_strays", **data)
    return ok("reconciler.fleet", what, **data)


def _sibling_slots(ctx: Context, table: str, env: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The slots of the fleets that share the image (the reconciler's ``SHARED_WITH``, partitions of
    the same ledger table), and the siblings whose slots could not be read."""
    try:
        names = json.loads(env.get("SHARED_WITH") or "[]")
    except ValueError:
        names = []
    slots: list[dict[str, Any]] = []
    unread: list[str] = []
    for name in names if isinstance(names, list) else []:
        try:
            slots += ledger_slots(ctx, table, str(name))[0]
        except AwsError:
            unread.append(str(name))
    return slots, unread


def _stray_ages(stats: dict[str, Any], strays: list[str], now: float) -> list[float]:
    """How long the reconciler has seen each stray (its ledger's ``#stats`` ``strays``), in seconds."""
    try:
        tracked = json.loads(stats.get("strays") or "{}")
    except (TypeError, ValueError):
        return []
    ages = []
    for vm in strays:
        entry = tracked.get(vm) if isinstance(tracked, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("first_seen"), (int, float)):
            ages.append(max(0.0, now - float(entry["first_seen"])))
    return ages


#: At most this many ledger VMs missing from the list are asked about one by one.
CONFIRM_LIMIT = 20


def _confirm_unlisted(ctx: Context, slots: list[dict[str, Any]], vms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lists are eventually consistent: a VM the ledger holds and the list does not show is asked
    about (GetMicrovm) before it counts as gone."""
    listed = {vm.get("microvmId") for vm in vms}
    missing = [i for slot in slots for i in (slot.get("microvm_id"), slot.get("retiring_id")) if i and i not in listed]
    found = []
    for microvm_id in list(dict.fromkeys(missing))[:CONFIRM_LIMIT]:
        try:
            vm = ctx.clients.call("lambda-microvms", "get_microvm", microvmIdentifier=microvm_id)
        except AwsError:
            continue  # not found (gone) or not answered: it stays unlisted
        found.append({"microvmId": microvm_id, "state": vm.get("state"), "confirmed": True})
    return found


def alarms(ctx: Context, check_id: str, keep: Any) -> Finding:
    """The state of the fleet's alarms whose logical id ``keep`` accepts."""
    names = [r.physical_id for r in ctx.fleet.alarms if r.physical_id and keep(r.logical_id)]
    if not names:
        return warn(check_id, "no alarms deployed", "nothing to do unless the fleet should have them (alarms on "
                    "custom metrics need the fleet's metrics=True, off by default: docs/operations.md)")
    found = []
    try:
        for start in range(0, len(names), 100):
            for page in ctx.clients.pages("cloudwatch", "describe_alarms", AlarmNames=names[start:start + 100]):
                found.extend(page.get("MetricAlarms", []))
    except AwsError as error:
        return unable(check_id, error, "read the fleet's alarms")
    firing = [a for a in found if a.get("StateValue") == "ALARM"]
    missing = sorted(set(names) - {a.get("AlarmName") for a in found})
    data = {"alarms": [{"name": a.get("AlarmName"), "state": a.get("StateValue"), "reason": a.get("StateReason")}
                       for a in found], "missing": missing}
    if firing:
        first = firing[0]
        return fail(check_id, f"{len(firing)} of {len(names)} in ALARM: {first.get('AlarmName')} "
                    f"({first.get('AlarmDescription') or first.get('StateReason')})",
                    "read the alarm's description and the reconciler's log", **data)
    if missing:
        return warn(check_id, f"{len(missing)} of {len(names)} alarms the stack lists do not exist",
                    "deploy the stack again", **data)
    return ok(check_id, f"{len(names)} alarms, none in ALARM", **data)
