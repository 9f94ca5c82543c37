"""``Custom::RayitoFleetTeardown``: off means off. When a fleet is deleted (its stack, or the fleet
from a stack) its reconciler is stopped first and every VM its ledger holds is terminated, parked
ones included, before CloudFormation hears that the delete is complete (docs/teardown.md).

One function per fleet (``rayito_constructs.fleet_teardown.FleetTeardown``), deployed from the
reconciler's package (the bundled ``lambda-microvms`` model, the ledger, the client tokens). Its
resource depends on the reconciler (function, schedule), the ledger table, the image and the roles
it needs, so CloudFormation deletes it first, while all of them still exist.

**Create / Update** claim the fleet for this resource in the ledger (``#teardown``: ``owner``, the
resource's logical id; ``previous``, the resource that held it before, when the fleet moved to
another logical id) and turn the fleet on (``ledger.turn_on``). A changed ledger table is a new
physical id: CloudFormation then deletes the old one (reported ``not_reachable``: the function now
serves the new table).

**Delete**, in order:

1. Nothing to do when the physical id is not this resource's (a create that failed), when
   ``RetainVms`` is ``true`` (``retain_vms_on_delete``: the old behaviour, VMs end at their
   lifetime), when another resource claims the fleet (a logical id that moved: the old one is
   deleted in the update's cleanup), or during an update's rollback when the fleet was there before
   the update (the resource being removed was added by the failed update; the fleet stays).
   A newer resource rolled back hands the claim back to the one before it.
2. **Stop the reconciler**: disable its EventBridge schedule (only while the schedule still
   invokes this fleet), then ``ledger.turn_off``: one update of ``#tick`` sets ``off`` and bumps
   the fence, so a tick that is running fails its next write before any further call, and no
   tick starts again (``FleetOff``).
3. **Every VM the ledger holds**: current and retiring VMs of every slot (base, warm/parked,
   members), and slots whose RunMicrovm answer was lost (*in doubt*): their token is sent again with
   the same parameters, which returns the VM the lost call made (or makes it, to be ended at once:
   the only way to be sure no VM of the token outlives the fleet). Never a VM the ledger does not
   hold: a client's, another fleet's on a shared image (they are counted and reported). The VMs
   the ledger names are asked to end before the lost runs are asked again, each lost run with an
   equal share of the time left, so one the service keeps refusing cannot hold up the rest.
4. **Terminate** each (idempotent; paced at ``TERMINATE_RATE`` per second, under the 10/s quota;
   a 429 waits ``retryAfterSeconds``, never past the deadline: a call that could only go out
   after it is not made), then **wait** until each is TERMINATED (a list of the image,
   GetMicrovm for one the list misses; ``ResourceNotFound`` for a VM older than the consistency
   window means gone), asking again for any still live 15 s after its terminate was accepted.
5. Bounded by the function's time: what is not confirmed ended is **reported** (response ``Data``,
   a JSON log line, the ``TeardownVMsNotEnded`` metric) and, with ``FailureMode`` ``fail``, the
   delete fails. The ledger forgets what ended (all of it, and its epoch, once everything ended).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from botocore.exceptions import BotoCoreError, ClientError

from . import core
from .answers import RUN_EVALUATED_NO_VM
from .aws import MICROVMS_CONFIG, STORE_CONFIG, session
from .custom_resource import BadRequest, check_identity, emit, error_code, log, remaining_seconds, respond, response_url_ok
from .ledger import DynamoDBLedger

RESOURCE_TYPE = "Custom::RayitoFleetTeardown"
NAMESPACE = "Rayito/Fleet"
SERVICE = "rayito-fleet-teardown"
CLAIM_KEY = "#teardown"
#: Seconds kept back from the function's time to answer CloudFormation.
RESERVE_SECONDS = 15.0
#: Stack states in which a Delete removes what a failed update added.
ROLLBACK_STATES = ("UPDATE_ROLLBACK_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
#: A schedule made this recently when the resource is created: the fleet is new in this stack
#: operation (so a rollback of it removes the fleet too, and ends its VMs).
NEW_FLEET_WINDOW_SECONDS = 900.0
#: Default TerminateMicrovm calls per second (the quota is 10/s, shared by the account).
TERMINATE_RATE = 5.0
RUN_RATE = 2.0
GET_RATE = 20.0
LIST_INTERVAL_SECONDS = 1.0
POLL_FIRST_SECONDS = 1.0
POLL_MAX_SECONDS = 5.0
#: A VM still seen live this long after its terminate was accepted is asked again.
RETERMINATE_SECONDS = 15.0
ENDED = ("TERMINATED", "GONE")
#: What the report lists by id, at most (the counts are whole).
MAX_IDS = 10

#: The clock and the sleep the teardown waits on (tests make them virtual; nothing else is).
CLOCK = time.time
SLEEP = time.sleep


def _now() -> float:
    return CLOCK()


def _sleep(seconds: float) -> None:
    if seconds > 0:
        SLEEP(seconds)


@dataclass
class Clients:
    microvms: Any
    dynamodb: Any
    scheduler: Any
    cloudformation: Any


def clients() -> Clients:
    """The production clients: one attempt per MicroVMs call (this code decides retries), a few
    quick ones with timeouts for the stores."""
    aws = session()
    return Clients(
        microvms=aws.client("lambda-microvms", config=MICROVMS_CONFIG),
        dynamodb=aws.client("dynamodb", config=STORE_CONFIG),
        scheduler=aws.client("scheduler", config=STORE_CONFIG),
        cloudformation=aws.client("cloudformation", config=STORE_CONFIG),
    )


_CLIENTS: Optional[Clients] = None


def physical_id(fleet: str, table: str) -> str:
    return f"rayito-teardown:{fleet}@{table}"


class Pacer:
    """At most ``rate`` calls a second; a 429 holds every later call for its ``retryAfterSeconds``."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / max(0.01, rate)
        self.next_at = float("-inf")

    def wait(self, deadline: float = float("inf")) -> bool:
        """Sleep until the next call may go; False (no sleep) when that is at or after
        ``deadline``: a 429's ``retryAfterSeconds`` can be longer than the function has left, and a
        function that sleeps through its timeout never answers CloudFormation (the stack waits an
        hour)."""
        now = _now()
        start = max(now, self.next_at)
        if start >= deadline:
            return False
        _sleep(start - now)
        self.next_at = start + self.interval
        return True

    def hold(self, seconds: float) -> None:
        self.next_at = max(self.next_at, _now() + max(0.0, seconds))


def _retry_after(exc: ClientError) -> float:
    try:
        return float(exc.response.get("retryAfterSeconds") or 1.0)
    except (TypeError, ValueError):  # pragma: no cover - the model types it an Integer (the Retry-After header): botocore hands over an int or nothing, and fails its own parse before this on anything else
        return 1.0


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _epoch(value: Any) -> Optional[float]:
    if value is None:
        # uncovered: moto always sets CreationDate (and the emulator startedAt): an item without a time is never seen
        return None
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


# ------------------------------------------------------------------ the claim


class Claims:
    """``#teardown`` in the fleet's ledger partition: which teardown resource holds the fleet."""

    def __init__(self, dynamodb: Any, table: str, fleet: str) -> None:
        self._ddb, self._table, self._fleet = dynamodb, table, fleet

    def _key(self) -> dict[str, Any]:
        return {"fleet": {"S": self._fleet}, "key": {"S": CLAIM_KEY}}

    def read(self) -> dict[str, Any]:
        item = self._ddb.get_item(TableName=self._table, Key=self._key(), ConsistentRead=True).get("Item") or {}
        return {k: (v.get("S") if "S" in v else v.get("BOOL")) for k, v in item.items() if k not in ("fleet", "key")}

    def write(self, claim: Mapping[str, Any]) -> None:
        item = dict(self._key())
        for key, value in claim.items():
            if isinstance(value, bool):
                item[key] = {"BOOL": value}
            elif value is not None:
                item[key] = {"S": str(value)}
        self._ddb.put_item(TableName=self._table, Item=item)


# ------------------------------------------------------------------ stopping the reconciler


def disable_schedule(scheduler: Any, name: str, group: str, fleet: str) -> str:
    """Disable the reconciler's schedule while it still invokes this fleet; what happened."""
    if not name:
        return "none"
    try:
        schedule = scheduler.get_schedule(Name=name, GroupName=group)
    except ClientError as exc:
        return "gone" if error_code(exc) == "ResourceNotFoundException" else f"error:{error_code(exc)}"
    except BotoCoreError as exc:
        return f"error:{type(exc).__name__}"
    target = schedule.get("Target") or {}
    try:
        owner = json.loads(target.get("Input") or "{}").get("fleet")
    except (ValueError, AttributeError):
        owner = None
    if owner not in (None, fleet):
        return "not_ours"  # the same schedule now ticks another fleet (renamed in place)
    if schedule.get("State") == "DISABLED":
        return "already_disabled"
    update = {k: schedule[k] for k in ("Name", "GroupName", "ScheduleExpression", "ScheduleExpressionTimezone",
                                       "StartDate", "EndDate", "Description", "KmsKeyArn", "Target",
                                       "FlexibleTimeWindow", "ActionAfterCompletion")
              if schedule.get(k) not in (None, "")}
    update["State"] = "DISABLED"
    try:
        scheduler.update_schedule(**update)
    except ClientError as exc:
        return f"error:{error_code(exc)}"
    except BotoCoreError as exc:
        return f"error:{type(exc).__name__}"
    return "disabled"


def schedule_is_new(scheduler: Any, name: str, group: str, window: float) -> bool:
    """The reconciler's schedule was made within ``window`` seconds (its ``CreationDate``, the
    service's clock against the function's: both real). Unknown counts as not new: a rollback
    then leaves the fleet as it is rather than ending a fleet that was there before."""
    if not name:
        return False
    try:
        created = _epoch(scheduler.get_schedule(Name=name, GroupName=group).get("CreationDate"))
    except (ClientError, BotoCoreError):
        return False
    return created is not None and time.time() - created <= window


# ------------------------------------------------------------------ ending the VMs


@dataclass
class Teardown:
    """Ends every VM the fleet's ledger holds, within ``deadline`` (on :data:`CLOCK`)."""

    fleet: str
    image_arn: str
    microvms: Any
    ledger: DynamoDBLedger
    deadline: float
    terminate_rate: float = TERMINATE_RATE
    owned: dict[str, str] = field(default_factory=dict)  # VM -> the slot that holds it
    started: dict[str, float] = field(default_factory=dict)  # VM -> startedAt, when known
    learned: dict[str, float] = field(default_factory=dict)  # VM -> when a RunMicrovm answer named it
    state: dict[str, str] = field(default_factory=dict)  # VM -> last state seen
    accepted: dict[str, float] = field(default_factory=dict)  # VM -> when its terminate was accepted
    errors: dict[str, str] = field(default_factory=dict)
    in_doubt: dict[str, str] = field(default_factory=dict)  # slot -> how its lost run was resolved
    unresolved: dict[str, str] = field(default_factory=dict)  # slot -> why it could not be
    others: dict[str, str] = field(default_factory=dict)  # live VMs of the image the ledger does not hold
    slot_vms: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    listed: bool = False  # a whole list of the image was read (``others`` is from it)

    def __post_init__(self) -> None:
        self._terminates = Pacer(self.terminate_rate)
        self._runs = Pacer(RUN_RATE)
        self._gets = Pacer(GET_RATE)
        self._lists = Pacer(1.0 / LIST_INTERVAL_SECONDS)

    def _call(self, method: str, **kwargs: Any) -> Any:
        name = "".join(part.title() for part in method.split("_"))
        self.calls[name] = self.calls.get(name, 0) + 1
        return getattr(self.microvms, method)(**kwargs)

    def _time_left(self) -> float:
        return self.deadline - _now()

    # -------------------------------------------------------------- what the ledger holds

    def gather(self) -> None:
        """What the ledger holds: the VMs it names are asked to end at once; then each slot whose
        RunMicrovm answer was lost is resolved by its token, each with an equal share of the time
        left and one share kept for the wait. A lost run that cannot be resolved (RunMicrovm
        answering 5xx through an outage, exactly when answers get lost) must not use up the time
        the known VMs need (found: the whole budget went to one such slot and every RUNNING VM of
        the fleet was left running)."""
        slots, stats = self.ledger.peek(self.fleet)
        doubtful: list[core.Slot] = []
        for slot in sorted(slots.values(), key=lambda s: s.slot_id):
            vms = [vm for vm in (slot.microvm_id, slot.retiring_id) if vm]
            self.slot_vms[slot.slot_id] = list(vms)
            for vm in vms:
                self.owned[vm] = slot.slot_id
            if slot.microvm_id and slot.vm_started_at:
                self.started[slot.microvm_id] = float(slot.vm_started_at)
            if slot.microvm_id is None and slot.in_doubt:
                doubtful.append(slot)
        for vm in sorted(self.owned):
            if self._time_left() <= 0:
                break
            self._terminate(vm)
        for index, slot in enumerate(doubtful):
            self._resolve(slot, stats, until=_now() + self._time_left() / (len(doubtful) - index + 1))

    def _resolve(self, slot: core.Slot, stats: Optional[Mapping[str, Any]], until: float) -> None:
        """A slot whose RunMicrovm answer was lost: its token again, same parameters, until ``until``."""
        if not slot.request:
            self.in_doubt[slot.slot_id] = "never_sent"  # admit_run pins the request before any call
            return
        if stats is None or not stats.get("epoch"):
            self.unresolved[slot.slot_id] = "no_epoch"
            return
        token = core.client_token(stats["epoch"], self.fleet, slot.slot_id, slot.generation)
        backoff = 1.0
        last = "deadline"
        until = min(until, self.deadline)
        while until - _now() > 0:
            # uncovered: a deadline check between calls that take no virtual time in the tests (the clock only moves in sleeps)
            if not self._runs.wait(until):
                break
            try:
                vm = self._call("run_microvm", clientToken=token, **slot.request)
            except ClientError as exc:
                code = error_code(exc)
                if code == "ConflictException" and exc.response.get("resourceId"):
                    self._own(str(exc.response["resourceId"]), slot.slot_id, None)
                    self.in_doubt[slot.slot_id] = "token_named_vm"
                    return
                if code == "ThrottlingException":
                    self._runs.hold(_retry_after(exc))
                    last = code
                    continue
                if _status(exc) >= 500 and code not in ("InsufficientCapacityException",):
                    last = code  # ambiguous again: the same token, later
                    _sleep(min(backoff, max(0.0, until - _now())))
                    backoff = min(8.0, backoff * 2)
                    continue
                if code in RUN_EVALUATED_NO_VM:
                    # The service weighed a new VM for this token and made none: a VM the lost call
                    # had made would have been returned instead.
                    self.in_doubt[slot.slot_id] = f"no_vm:{code}"
                    return
                # Refused before the token was looked at (AccessDenied, Validation, NotFound...):
                # proof of nothing about what the lost call made. Reported, never taken as "no VM".
                self.unresolved[slot.slot_id] = f"refused:{code}"
                return
            except BotoCoreError as exc:
                last = type(exc).__name__
                _sleep(min(backoff, max(0.0, until - _now())))
                backoff = min(8.0, backoff * 2)
                continue
            self._own(vm["microvmId"], slot.slot_id, _epoch(vm.get("startedAt")))
            self.state[vm["microvmId"]] = vm.get("state", "PENDING")
            self.in_doubt[slot.slot_id] = "token_returned_vm"
            return
        self.unresolved[slot.slot_id] = last

    def _own(self, vm_id: str, slot_id: str, started: Optional[float]) -> None:
        self.owned[vm_id] = slot_id
        self.slot_vms.setdefault(slot_id, []).append(vm_id)
        self.learned[vm_id] = _now()
        if started:
            self.started[vm_id] = started

    # -------------------------------------------------------------- ending them

    def ended(self, vm: str) -> bool:
        return self.state.get(vm) in ENDED

    def run(self) -> None:
        poll = POLL_FIRST_SECONDS
        while self._time_left() > 0:
            pending = [vm for vm in sorted(self.owned) if not self.ended(vm)]
            if not pending:
                return
            for vm in pending:
                # uncovered: a deadline check between calls that take no virtual time in the tests (the clock only moves in sleeps)
                if self._time_left() <= 0:
                    return
                if self._needs_terminate(vm):
                    self._terminate(vm)
            # uncovered: a deadline check between calls that take no virtual time in the tests (the clock only moves in sleeps)
            if self._time_left() <= 0:
                return
            self._observe([vm for vm in pending if not self.ended(vm)])
            if all(self.ended(vm) for vm in self.owned):
                return
            _sleep(min(poll, max(0.0, self._time_left())))
            poll = min(POLL_MAX_SECONDS, poll * 1.5)

    def _needs_terminate(self, vm: str) -> bool:
        at = self.accepted.get(vm)
        if at is None:
            return True
        return self.state.get(vm) in core.LIVE and _now() - at >= RETERMINATE_SECONDS

    def _terminate(self, vm: str) -> None:
        if not self._terminates.wait(self.deadline):
            return  # no time left for it: reported not ended
        try:
            self._call("terminate_microvm", microvmIdentifier=vm)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException" and self._old_enough(vm):
                self.state[vm] = "GONE"
            elif code == "ThrottlingException":
                self._terminates.hold(_retry_after(exc))
            self.errors[vm] = code
            return
        except BotoCoreError as exc:
            self.errors[vm] = type(exc).__name__
            return
        self.accepted[vm] = _now()
        self.errors.pop(vm, None)

    def _old_enough(self, vm: str) -> bool:
        """``ResourceNotFound`` means gone, unless a RunMicrovm answer named the VM moments ago
        (a read that lags a new VM proves nothing)."""
        learned = self.learned.get(vm)
        return learned is None or _now() - learned >= core.CONSISTENCY_SECONDS

    def _observe(self, pending: list[str]) -> None:
        seen = self.list_image()
        for vm in pending:
            if vm in seen:
                continue
            # uncovered: a deadline check between calls that take no virtual time in the tests (the clock only moves in sleeps)
            if not self._gets.wait(self.deadline):
                return
            try:
                answer = self._call("get_microvm", microvmIdentifier=vm)
            except ClientError as exc:
                code = error_code(exc)
                # uncovered: a GetMicrovm error other than a throttle (or a 404 on a young VM) here; no test injects one at this call
                # uncovered: GetMicrovm 404 on an old VM while waiting after an accepted terminate (the emulator lists it TERMINATED for 20 min);
                if code == "ResourceNotFoundException" and self._old_enough(vm):
                    self.state[vm] = "GONE"
                elif code == "ThrottlingException":
                    self._gets.hold(_retry_after(exc))
                continue
            except BotoCoreError:
                continue
            self.state[vm] = answer.get("state") or self.state.get(vm, "unknown")

    def list_image(self) -> set[str]:
        """One list of the image (every page): states of ours, and the live VMs it does not hold."""
        seen: set[str] = set()
        others: dict[str, str] = {}
        token: Optional[str] = None
        while self._lists.wait(self.deadline):
            kwargs: dict[str, Any] = {"imageIdentifier": self.image_arn, "maxResults": 50}
            if token:
                kwargs["nextToken"] = token
            try:
                page = self._call("list_microvms", **kwargs)
            except ClientError as exc:
                if error_code(exc) == "ThrottlingException":
                    self._lists.hold(_retry_after(exc))
                return seen  # the gets below tell instead
            except BotoCoreError:
                return seen
            for item in page.get("items") or []:
                vm, state = item["microvmId"], item["state"]
                if vm in self.owned:
                    seen.add(vm)
                    # uncovered: a foreign VM listed already ended (another fleet's TERMINATED VM of the image) during a teardown
                    if not (self.ended(vm) and state not in ENDED):  # never back from an end
                        self.state[vm] = state
                elif state in core.LIVE:
                    others[vm] = state
            token = page.get("nextToken")
            if not token:
                self.others, self.listed = others, True
                return seen
        return seen

    # -------------------------------------------------------------- after

    def forget_what_ended(self) -> bool:
        """Delete the ledger items of slots whose VMs all ended; everything (and the epoch) when
        nothing is left. True when nothing is left."""
        done = [slot for slot, vms in self.slot_vms.items()
                if slot not in self.unresolved and all(self.ended(vm) for vm in vms)]
        everything = len(done) == len(self.slot_vms) and not self.unresolved
        self.ledger.forget(self.fleet, done, stats=everything)
        return everything

    def not_ended(self) -> dict[str, str]:
        return {vm: self.state.get(vm, "unknown") for vm in sorted(self.owned) if not self.ended(vm)}


# ------------------------------------------------------------------ the requests


def _props(event: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (event.get("ResourceProperties") or {}).items()}


#: Seconds between DescribeStacks attempts when the stack's status could not be read (throttled,
#: a timeout): an update's rollback read as a delete would end a fleet that stays.
STATUS_RETRY_SECONDS = (2.0, 4.0, 8.0, 16.0)


def _stack_status(cloudformation: Any, stack_id: str) -> str:
    """The stack's status; ``unknown:<code>`` when every attempt failed (the delete then goes on:
    off means off, and the report says the status was unknown)."""
    status = "unknown"
    for pause in (*STATUS_RETRY_SECONDS, None):
        try:
            return str(cloudformation.describe_stacks(StackName=stack_id)["Stacks"][0]["StackStatus"])
        except (ClientError, BotoCoreError, KeyError, IndexError) as exc:
            status = f"unknown:{error_code(exc)}"
            log({"event": "stack_status_unknown", "service": SERVICE, "code": error_code(exc)})
        if pause is not None:
            _sleep(pause)
    return status


def claim(event: Mapping[str, Any], env: Mapping[str, str], aws: Clients) -> dict[str, Any]:
    """Create or Update: this resource holds the fleet, and the fleet is on."""
    fleet, table = env["FLEET_NAME"], env["LEDGER_TABLE"]
    me = str(event["LogicalResourceId"])
    claims = Claims(aws.dynamodb, table, fleet)
    held = claims.read()
    owner = held.get("owner")
    new = event["RequestType"] == "Create" and schedule_is_new(
        aws.scheduler, env.get("SCHEDULE_NAME", ""), env.get("SCHEDULE_GROUP") or "default",
        float(env.get("NEW_FLEET_WINDOW_SECONDS") or NEW_FLEET_WINDOW_SECONDS))
    claims.write({
        "owner": me,
        "previous": owner if owner and owner != me and held.get("state") != "off" else (
            held.get("previous") if owner == me else None),
        "fleet_new": new,
        "stack": event.get("StackId"),
        "state": "on",
    })
    DynamoDBLedger(aws.dynamodb, table).turn_on(fleet)
    return {"Outcome": "armed", "Fleet": fleet, "Previous": owner if owner and owner != me else ""}


def delete(event: Mapping[str, Any], env: Mapping[str, str], aws: Clients, context: Any) -> dict[str, Any]:
    """Delete: stop the reconciler and end every VM the fleet's ledger holds (module doc)."""
    started = _now()
    fleet, table, image = env["FLEET_NAME"], env["LEDGER_TABLE"], env["IMAGE_ARN"]
    props = _props(event)
    me = str(event["LogicalResourceId"])
    physical = str(event.get("PhysicalResourceId") or "")
    base = {"Fleet": fleet}
    if physical != physical_id(props.get("FleetName", ""), props.get("LedgerTable", "")):
        return {**base, "Outcome": "skipped", "Reason": "no teardown of this resource was created"}
    if (props.get("FleetName"), props.get("LedgerTable")) != (fleet, table):
        return {**base, "Outcome": "not_reachable", "Failed": True,
                "Reason": f"this function now serves fleet {fleet} in another ledger; {props.get('FleetName')}'s VMs "
                          "were not ended (they end at their lifetime)"}
    if props.get("RetainVms", "false").lower() == "true":
        return {**base, "Outcome": "retained", "Reason": "retain_vms_on_delete: the VMs end at their lifetime"}
    claims = Claims(aws.dynamodb, table, fleet)
    held = claims.read()
    owner, previous = held.get("owner"), held.get("previous")
    if owner and owner != me:
        if previous == me:
            claims.write({**held, "previous": None})  # this resource is gone now: no fallback
        return {**base, "Outcome": "handed_over", "Reason": f"resource {owner} holds the fleet now"}
    status = _stack_status(aws.cloudformation, str(event.get("StackId")))
    rollback = status in ROLLBACK_STATES
    if rollback and previous and previous != me:
        claims.write({**held, "owner": previous, "previous": None})
        return {**base, "Outcome": "handed_back", "Reason": f"update rolled back: resource {previous} holds the fleet again"}
    if rollback and not held.get("fleet_new"):
        return {**base, "Outcome": "kept", "Reason": "update rolled back: the fleet was there before it, and stays"}

    schedule = disable_schedule(aws.scheduler, env.get("SCHEDULE_NAME", ""), env.get("SCHEDULE_GROUP") or "default", fleet)
    ledger = DynamoDBLedger(aws.dynamodb, table)
    marker = f"teardown:{event.get('RequestId') or uuid.uuid4().hex}"
    ledger.turn_off(fleet, marker, _now())
    claims.write({**held, "owner": me, "state": "off", "stack": event.get("StackId")})
    deadline = _now() + max(0.0, remaining_seconds(context) - RESERVE_SECONDS)
    work = Teardown(fleet=fleet, image_arn=image, microvms=aws.microvms, ledger=ledger, deadline=deadline,
                    terminate_rate=float(env.get("TERMINATE_RATE") or TERMINATE_RATE))
    work.gather()
    work.run()
    if not work.listed:
        work.list_image()  # what else of the image is live, for the report
    left = work.not_ended()
    everything = work.forget_what_ended()
    ended = [vm for vm in work.owned if work.ended(vm)]
    outcome = "ended" if not left and not work.unresolved else "not_all_ended"
    log({"event": "teardown", "fleet": fleet, "service": SERVICE, "outcome": outcome, "schedule": schedule,
         "ended": sorted(ended), "not_ended": left, "unresolved": work.unresolved, "in_doubt": work.in_doubt,
         "errors": work.errors, "other_vms": work.others, "calls": work.calls, "ledger_cleared": everything,
         "seconds": round(_now() - started, 3), "stack_status": status})
    reason = "every VM the fleet held ended" if outcome == "ended" else (
        f"{len(left)} VM(s) not confirmed ended ({', '.join(list(left)[:MAX_IDS])}), "
        f"{len(work.unresolved)} lost run(s) unresolved; they end at their lifetime")
    return {
        **base,
        "Outcome": outcome,
        "Failed": outcome != "ended",
        "Reason": reason,
        "ScheduleDisabled": schedule,
        "VMs": len(work.owned),
        "Ended": len(ended),
        "NotEnded": len(left),
        "NotEndedIds": ",".join(list(left)[:MAX_IDS]),
        "Unresolved": len(work.unresolved),
        "InDoubtResolved": len(work.in_doubt),
        "OtherVms": len(work.others),
        "OtherVmIds": ",".join(sorted(work.others)[:MAX_IDS]),
        "Seconds": round(_now() - started, 3),
    }


def handler(event: Mapping[str, Any], context: Any) -> None:
    """Lambda entry point (CloudFormation's custom resource requests)."""
    global _CLIENTS
    env = os.environ
    region = env.get("AWS_REGION", "")
    url = str(event.get("ResponseURL", ""))
    if not response_url_ok(url, region):
        log({"event": "refused", "service": SERVICE, "reason": "ResponseURL is not CloudFormation's response endpoint"})
        return
    kind = str(event.get("RequestType"))
    fallback = str(event.get("PhysicalResourceId") or f"rayito-teardown-refused:{event.get('RequestId', '')}")
    try:
        named = check_identity(event, context, env, RESOURCE_TYPE)
        if named != env.get("FLEET_NAME"):
            raise BadRequest("the resource is not this function's fleet")
        if event.get("RequestType") != "Delete":
            props = _props(event)
            if (props.get("FleetName"), props.get("LedgerTable")) != (env.get("FLEET_NAME"), env.get("LEDGER_TABLE")):
                raise BadRequest("FleetName and LedgerTable must be this function's fleet and ledger")
    except (BadRequest, ValueError) as exc:
        log({"event": "refused", "service": SERVICE, "reason": str(exc), "action": kind})
        respond(event, "FAILED", fallback, {}, f"refused: {exc}")
        return
    if _CLIENTS is None:
        _CLIENTS = clients()
    props = _props(event)
    fleet, table = env["FLEET_NAME"], env["LEDGER_TABLE"]
    strict = props.get("FailureMode", "warn") == "fail"
    if kind in ("Create", "Update"):
        physical = physical_id(fleet, table)
        try:
            outcome = claim(event, env, _CLIENTS)
        except Exception as exc:  # noqa: BLE001 - the ledger could not be reached: the deploy must know
            log({"event": "teardown_claim_failed", "fleet": fleet, "service": SERVICE, "code": error_code(exc)})
            # A failed create leaves a physical id no Delete acts on.
            failed_id = physical if kind == "Update" else f"rayito-teardown-failed:{event.get('RequestId', '')}"
            respond(event, "FAILED", failed_id, {}, f"could not claim fleet {fleet} in the ledger: {error_code(exc)}")
            return
        log({"event": "teardown_armed", "fleet": fleet, "service": SERVICE, **outcome})
        respond(event, "SUCCESS", physical, outcome, "armed")
        return
    try:
        outcome = delete(event, env, _CLIENTS, context)
    except Exception as exc:  # noqa: BLE001 - every failure must reach CloudFormation
        outcome = {"Fleet": fleet, "Outcome": "error", "Failed": True, "Reason": f"teardown failed: {error_code(exc)}"}
        log({"event": "teardown_error", "fleet": fleet, "service": SERVICE, "code": error_code(exc)})
    failed = bool(outcome.pop("Failed", False))
    emit(NAMESPACE, {"fleet": fleet}, {
        "TeardownVMsEnded": (float(outcome.get("Ended", 0)), "Count"),
        "TeardownVMsNotEnded": (float(outcome.get("NotEnded", 0)) + float(outcome.get("Unresolved", 0)), "Count"),
        "TeardownOtherVMs": (float(outcome.get("OtherVms", 0)), "Count"),
        "TeardownFailed": (1.0 if failed else 0.0, "Count"),
    }, {"service": SERVICE, "action": kind, "Outcome": outcome.get("Outcome"), "Reason": outcome.get("Reason")})
    physical = str(event.get("PhysicalResourceId") or fallback)
    if failed and strict:
        respond(event, "FAILED", physical, outcome, f"{outcome['Outcome']}: {outcome['Reason']} (teardown_failure='fail')")
        return
    reason = str(outcome.get("Reason", "ok")) + (" (the delete goes on: teardown_failure='warn')" if failed else "")
    respond(event, "SUCCESS", physical, outcome, reason)
