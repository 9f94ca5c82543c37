"""Lambda entry point of the fleet reconciler: wires AWS clients to :class:`.tick.Reconciler`.

Configuration comes from the environment the construct sets:

``FLEET_NAME``, ``IMAGE_ARN``, ``MIN_VMS``, ``MAX_VMS``, ``WARM_VMS``, ``MAX_LIFETIME_SECONDS``,
``IDLE_SECONDS`` (optional), ``EXECUTION_ROLE_ARN`` (optional), ``LEDGER_TABLE``,
``BUDGET_TABLE``, ``BUDGETS`` (JSON ``{operation: [rate, burst]}``), ``DEAD_LETTER_QUEUE_URL``,
``SUCCESSOR_LEAD_SECONDS``, ``MAX_START_ATTEMPTS``, ``MAX_STARTS_PER_STEP``, ``TICK_SECONDS``,
``IMAGE_VERSION`` (the version to roll onto), ``BASE_ROLLOUT`` (``on_expiry`` or ``rolling``),
``SHARED_WITH`` (JSON list of the other fleets on the image, whose ledger items in the same table
say which VMs are theirs), ``TERMINATE_STRAYS`` (``1``: end idle foreign VMs),
``STRAY_GRACE_SECONDS``, ``SCHEDULE_SECONDS`` (how often the schedule ticks; 60 when unset), ``RAYITO_METRICS`` (``on``: send the custom metrics; off or unset: send
none, print no EMF line; the log lines are the same either way).

The Lambda Python runtime's bundled botocore may predate ``lambda-microvms`` (botocore 1.43.35):
the service model ships with this function (``data/``) and is put first on botocore's search path.
Clients make one attempt per call: the reconciler's own budget and backoff decide retries, and
every call it makes is one the budget admitted and the metrics count.

Events: the scheduler's ``{"source": "schedule", ...}`` runs a tick; ``{"action": "redrive"}``
resets dead-lettered slots to queued; anything else runs a tick on demand. Once the fleet's
teardown turned it off (``ledger.FleetOff``), every invocation returns ``{"skipped": "fleet_off"}``
without a call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import boto3
import botocore.session
from botocore.config import Config

from .budget import DynamoDBBudget
from .core import DEAD, QUEUED, FleetSpec
from .ledger import DynamoDBLedger, FencedOut, FleetOff
from .tick import Reconciler

DATA_DIR = Path(__file__).resolve().parent / "data"
#: One attempt per MicroVMs call (botocore's ``total_max_attempts`` counts the first one):
#: a 429 or 500 comes back to the reconciler, which decides, under the shared budget.
MICROVMS_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=15)
#: The stores: a few quick attempts (throttling of the tables is rare and retrying it is safe:
#: every write is conditional), and timeouts so a hung store cannot hold the tick.
STORE_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=3, read_timeout=5)
#: The dead-letter queue: one quick attempt (a letter the queue does not take stays in the ledger
#: and is sent again by the next tick), so a queue that hangs costs a tick at most 5 s.
LETTER_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=3)
#: Seconds a tick leaves before the invocation's own timeout.
DEADLINE_MARGIN_SECONDS = 8.0


def session() -> boto3.Session:
    """A boto3 session whose botocore knows ``lambda-microvms`` whatever its version."""
    core_session = botocore.session.get_session()
    loader = core_session.get_component("data_loader")
    # uncovered: 57->59, each call makes a new botocore session (a new loader) that never has DATA_DIR yet
    if str(DATA_DIR) not in loader.search_paths:
        loader.search_paths.insert(0, str(DATA_DIR))
    return boto3.Session(botocore_session=core_session)


def spec_from_env(env: Optional[dict[str, str]] = None) -> FleetSpec:
    env = dict(os.environ if env is None else env)

    def number(key: str, default: Optional[float] = None) -> Optional[float]:
        value = env.get(key)
        return float(value) if value not in (None, "") else default

    idle = number("IDLE_SECONDS")
    return FleetSpec(
        fleet=env["FLEET_NAME"],
        image_arn=env["IMAGE_ARN"],
        min_vms=int(env["MIN_VMS"]),
        max_vms=int(env["MAX_VMS"]),
        warm_vms=int(env.get("WARM_VMS", "0")),
        max_lifetime_seconds=int(number("MAX_LIFETIME_SECONDS", 28_800)),
        idle_seconds=int(idle) if idle else None,
        execution_role_arn=env.get("EXECUTION_ROLE_ARN") or None,
        successor_lead_seconds=number("SUCCESSOR_LEAD_SECONDS", 900.0),
        # At least 1 each (the construct refuses less): a width of 0 never started a VM and
        # stepped every 50 ms; 0 attempts dead-lettered a slot on its first error.
        max_start_attempts=max(1, int(number("MAX_START_ATTEMPTS", 3))),
        max_starts_per_step=max(1, int(number("MAX_STARTS_PER_STEP", 10))),
        image_version=env.get("IMAGE_VERSION") or None,
        base_rollout=env.get("BASE_ROLLOUT") or "on_expiry",
        shared_image=bool(json.loads(env.get("SHARED_WITH") or "[]")),
        terminate_strays=env.get("TERMINATE_STRAYS") == "1",
        stray_grace_seconds=number("STRAY_GRACE_SECONDS", 3600.0),
        look_period_seconds=number("SCHEDULE_SECONDS", 60.0),
    )


def telemetry_for(fleet: str, env: Optional[dict[str, str]] = None) -> Any:
    """Powertools when its layer is there; otherwise EMF and JSON lines of our own, same format.
    Metrics only when ``RAYITO_METRICS`` says on."""
    from .telemetry import metrics_enabled

    metrics = metrics_enabled(env)
    try:
        from .telemetry import PowertoolsTelemetry

        return PowertoolsTelemetry(fleet, metrics=metrics)
    except ImportError:
        # The Powertools layer is missing (a wrong ARN, a region without it): keep ticking and
        # keep telling, in the same format.
        from .telemetry import EmfTelemetry

        return EmfTelemetry(fleet, metrics=metrics)


def build(env: Optional[dict[str, str]] = None, telemetry: Any = None) -> Reconciler:
    """A reconciler for the fleet the environment names."""
    env = dict(os.environ if env is None else env)
    aws = session()
    dynamodb = aws.client("dynamodb", config=STORE_CONFIG)
    try:
        budgets = json.loads(env.get("BUDGETS") or "{}")
    except ValueError:
        budgets = None
    if not isinstance(budgets, dict):  # not a JSON object: every operation keeps its default
        budgets = {"BUDGETS": env.get("BUDGETS")}
    spec = spec_from_env(env)
    telemetry = telemetry if telemetry is not None else telemetry_for(spec.fleet, env)
    queue_url = env.get("DEAD_LETTER_QUEUE_URL")
    sqs = aws.client("sqs", config=LETTER_CONFIG) if queue_url else None

    def dead_letter(record: dict[str, Any]) -> None:
        # uncovered: 120->exit, no DEAD_LETTER_QUEUE_URL: the construct always sets it; kept for running by hand
        if sqs is not None:
            sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(record, default=str, sort_keys=True))

    budget = DynamoDBBudget(dynamodb, env["BUDGET_TABLE"], budgets)
    if budget.rejected:
        # A bad entry keeps the documented quota (never "no limit", never a crash on every tick).
        telemetry.event(spec.fleet, {"event": "budgets_rejected", "operations": sorted(budget.rejected),
                                     "values": budget.rejected,
                                     "allowed": "[rate > 0, burst >= 1], both finite numbers"})
    reconciler = Reconciler(
        spec=spec,
        microvms=aws.client("lambda-microvms", config=MICROVMS_CONFIG),
        ledger=DynamoDBLedger(dynamodb, env["LEDGER_TABLE"]),
        budget=budget,
        telemetry=telemetry,
        dead_letters=dead_letter,
        siblings=tuple(json.loads(env.get("SHARED_WITH") or "[]")),
    )

    def learn_offset(parsed: Any = None, **_: Any) -> None:
        # DynamoDB dates its answers on AWS's clock too: a fresh execution environment knows the
        # shared time from the lease and ledger reads, before its first reservation in the shared
        # budget (a clock 30 s off reset the buckets: a second burst at once) and before it weighs
        # another tick's recorded end. The MicroVMs answers refine it.
        reconciler._learn_offset(parsed)

    dynamodb.meta.events.register("after-call.dynamodb", learn_offset)
    return reconciler


def redrive(reconciler: Reconciler, lease_seconds: float = 60.0) -> dict[str, Any]:
    """Reset dead-lettered slots so the next step tries them again (under the tick lease)."""
    fleet = reconciler.spec.fleet
    if not reconciler.begin_tick(lease_seconds, lease_seconds):
        return {"fleet": fleet, "skipped": "tick_in_progress"}  # pragma: no cover - both ledgers' acquire_tick always takes the lease (a fenced takeover)
    reset = []
    try:
        slots, _ = reconciler.ledger.load(fleet)
        changed = []
        for slot in slots.values():
            if slot.phase == DEAD:
                slot.phase, slot.errors, slot.crashes, slot.reason, slot.noted = QUEUED, 0, 0, "redriven", None
                slot.dead_kind, slot.retry_at = None, None
                if slot.in_doubt_since is None:
                    slot.generation += 1  # in doubt, the same token first: it may have made a VM
                    slot.request = None
                changed.append(slot)
                reset.append(slot.slot_id)
        reconciler.ledger.write(fleet, reconciler.fence, puts=changed)
        reconciler.telemetry.event(fleet, {"event": "slots_redriven", "slots": reset})
    except FencedOut:
        return {"fleet": fleet, "skipped": "lease_lost"}
    finally:
        reconciler.end_tick()
    return {"fleet": fleet, "redriven": reset}


_RECONCILER: Optional[Reconciler] = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global _RECONCILER
    if _RECONCILER is None:
        # Clients, the bundled model and Powertools load once per execution environment; each
        # tick resets the reconciler's own state (lease holder, reservations) in begin_tick.
        _RECONCILER = build()
    reconciler = _RECONCILER
    try:
        if isinstance(event, dict) and event.get("action") == "redrive":
            return redrive(reconciler)
        remaining = context.get_remaining_time_in_millis() / 1000 if context is not None else 60.0
        deadline = min(float(os.environ.get("TICK_SECONDS", "50")), max(1.0, remaining - DEADLINE_MARGIN_SECONDS))
        # The lease covers the whole invocation; past it, the fence (not the clock) keeps a late
        # tick from writing or calling.
        # Past the deadline, what the invocation has left (its margin kept) may go to replacing
        # a base VM that nothing could replace before its end (Reconciler.tick).
        overtime = max(0.0, remaining - DEADLINE_MARGIN_SECONDS - deadline)
        return reconciler.tick(deadline_seconds=deadline, lease_seconds=remaining + 5, overtime_seconds=overtime)
    except FleetOff:
        # The fleet's teardown turned it off: the lease was never taken, nothing was called.
        fleet = reconciler.spec.fleet
        reconciler.telemetry.event(fleet, {"event": "tick_skipped", "reason": "fleet_off"})
        reconciler.telemetry.flush()
        return {"fleet": fleet, "skipped": "fleet_off"}
