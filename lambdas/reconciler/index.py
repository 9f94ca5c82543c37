"""Lambda entry point of the fleet reconciler: wires AWS clients to :class:`.tick.Reconciler`.

What the fleet is comes from the product's recipe (:mod:`.fleet_source`), read at every tick: its
project (how each VM is started: :mod:`.product_launch`), its ``scaling`` (``min_vms``,
``max_vms``, ``warm_vms``) and its image version. No recipe, no VMs: ``rayito agent stop`` deletes
it, and every tick then returns ``{"skipped": "fleet_stopped"}`` without a MicroVMs call until a
deploy writes it again. The rest comes from the environment the construct sets:

``FLEET_NAME``, ``IMAGE_ARN``, ``ACCESS_TOKEN_SECRET`` (the fleet's token, whose sha256 every VM's
run payload carries), ``SERVER_FUNCTION`` (the fleet's server: each VM started is handed to it), ``MIN_VMS``, ``MAX_VMS``, ``WARM_VMS`` (what the stack deployed: used only
until a recipe was read), ``MAX_LIFETIME_SECONDS`` (a cap on the product's lifetime, optional),
``EXECUTION_ROLE_ARN`` (optional), ``LEDGER_TABLE``, ``BUDGET_TABLE``, ``BUDGETS`` (JSON
``{operation: [rate, burst]}``), ``DEAD_LETTER_QUEUE_URL``, ``SUCCESSOR_LEAD_SECONDS``,
``MAX_START_ATTEMPTS``, ``MAX_STARTS_PER_STEP``, ``TICK_SECONDS``, ``IMAGE_VERSION`` (the version
the stack built, when the recipe names none), ``BASE_ROLLOUT`` (``on_expiry`` or ``rolling``),
``SHARED_WITH`` (JSON list of the other fleets on the image, whose ledger items in the same table
say which VMs are theirs), ``TERMINATE_STRAYS`` (``1``: end idle foreign VMs),
``STRAY_GRACE_SECONDS``, ``SCHEDULE_SECONDS`` (how often the schedule ticks; 60 when unset),
``RAYITO_METRICS`` (``on``: send the custom metrics; off or unset: send none, print no EMF line;
the log lines are the same either way).

The clients (:mod:`.aws`) make one attempt per call: the reconciler's own budget and backoff decide
retries, and every call it makes is one the budget admitted and the metrics count.

Events: the scheduler's ``{"source": "schedule", ...}`` runs a tick; ``{"action": "redrive"}``
resets dead-lettered slots to queued; anything else runs a tick on demand. Once the fleet's
teardown turned it off (``ledger.FleetOff``), every invocation returns ``{"skipped": "fleet_off"}``
without a call.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from . import core
from .aws import LETTER_CONFIG, MICROVMS_CONFIG, STORE_CONFIG, session
from .budget import DynamoDBBudget
from .core import DEAD, FleetSpec
from .core.lifetimes import CALL_MARGIN_SECONDS
from .ledger import DynamoDBLedger, FencedOut, FleetOff
from .ports import DeadLetters, Telemetry
from .fleet_source import FleetSource, RecipeSource, TokenSource
from .serving import LambdaServer
from .tick import Reconciler

__all__ = ["LETTER_CONFIG", "MICROVMS_CONFIG", "STORE_CONFIG", "build", "handler", "redrive", "session",
           "spec_from_env", "telemetry_for"]


def spec_from_env(env: Optional[dict[str, str]] = None) -> FleetSpec:
    env = dict(os.environ if env is None else env)

    def number(key: str, default: float) -> float:
        value = env.get(key)
        return float(value) if value not in (None, "") else default

    idle = number("IDLE_SECONDS", 0)
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
        watch_seconds=max(0.0, number("WATCH_SECONDS", 0.0)),
    )


def telemetry_for(fleet: str, env: Optional[dict[str, str]] = None) -> Telemetry:
    """Powertools when its layer is there; otherwise EMF and JSON lines of our own, same format.
    Metrics only when ``RAYITO_METRICS`` says on."""
    from .telemetry import EmfTelemetry, metrics_enabled

    metrics = metrics_enabled(env)
    try:
        from .telemetry import PowertoolsTelemetry

        return PowertoolsTelemetry(fleet, metrics=metrics)
    except ImportError:
        # The Powertools layer is missing (a wrong ARN, a region without it): keep ticking and
        # keep telling, in the same format.
        return EmfTelemetry(fleet, metrics=metrics)


def build(env: Optional[dict[str, str]] = None, telemetry: Optional[Telemetry] = None) -> Reconciler:
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
        monotonic=time.monotonic,
        dead_letters=letters_to(aws.client("sqs", config=LETTER_CONFIG), queue_url) if queue_url else None,
        state_source=fleet_source(aws, env, spec),
        server=LambdaServer(aws.client("lambda", config=LETTER_CONFIG), env["SERVER_FUNCTION"])
        if env.get("SERVER_FUNCTION") else None,
        siblings=tuple(json.loads(env.get("SHARED_WITH") or "[]")),
    )

    def learn_offset(parsed: Any = None, **_: Any) -> None:
        # DynamoDB dates its answers on AWS's clock too: a fresh execution environment knows the
        # shared time from the lease and ledger reads, before its first reservation in the shared
        # budget (a clock 30 s off reset the buckets: a second burst at once) and before it weighs
        # another tick's recorded end. The MicroVMs lists refine it.
        reconciler.learn_offset(parsed)

    dynamodb.meta.events.register("after-call.dynamodb", learn_offset)
    return reconciler


def fleet_source(aws: Any, env: dict[str, str], spec: FleetSpec) -> FleetSource:
    """The fleet as its recipe says, read at every tick with the function's own clients."""
    region = aws.region_name or env.get("AWS_REGION") or "us-east-1"
    token = TokenSource(aws.client("secretsmanager", config=STORE_CONFIG), env["ACCESS_TOKEN_SECRET"], time.monotonic)
    return FleetSource(env, spec, RecipeSource(aws.client("ssm", config=STORE_CONFIG), spec.fleet), token, region)


def letters_to(sqs: Any, queue_url: str) -> DeadLetters:
    """Dead letters as messages of the fleet's dead-letter queue (JSON, keys sorted)."""

    def send(record: dict[str, Any]) -> None:
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(record, default=str, sort_keys=True))

    return send


def redrive(reconciler: Reconciler, lease_seconds: float = 60.0) -> dict[str, Any]:
    """Dead-lettered slots tried again (``core.redrive``, under the tick lease): the next tick fills
    them; a slot that was in doubt keeps its token."""
    fleet = reconciler.spec.fleet
    reconciler.begin_tick(lease_seconds, lease_seconds)
    reset = []
    try:
        slots, _ = reconciler.ledger.load(fleet)
        changed = []
        now = reconciler.now()
        for slot in sorted(slots.values(), key=lambda s: s.slot_id):
            if slot.phase == DEAD:
                change = core.redrive(slot, now, "redriven")
                assert change.slot is not None
                changed.append(change.slot)
                reset.append(slot.slot_id)
                for told in change.events:
                    reconciler.emit(told)
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
        # tick makes its own state when it takes the lease.
        _RECONCILER = build()
    reconciler = _RECONCILER
    try:
        if isinstance(event, dict) and event.get("action") == "redrive":
            return redrive(reconciler)
        why = reconciler.refresh()
        if why is not None:
            # No fleet to keep now (stopped, or its recipe or token unreadable): no MicroVMs call.
            fleet = reconciler.spec.fleet
            reconciler.telemetry.event(fleet, {"event": "tick_skipped", "reason": why})
            reconciler.telemetry.flush()
            return {"fleet": fleet, "skipped": why.split(":", 1)[0], "reason": why}
        # The tick's time: the invocation's, read once here and counted on a monotonic clock by
        # the tick (a step of the wall clock moves neither bound). No call starts in its last
        # CALL_MARGIN_SECONDS; steps past tick_seconds only for a wait worth overtime.
        remaining = context.get_remaining_time_in_millis() / 1000 if context is not None else 60.0
        hard = max(1.0, remaining - CALL_MARGIN_SECONDS)
        deadline = min(float(os.environ.get("TICK_SECONDS", "50")), hard)
        # The lease covers the whole invocation; past it, the fence (not the clock) keeps a late
        # tick from writing or calling.
        return reconciler.tick(deadline_seconds=deadline, lease_seconds=remaining + 5, overtime_seconds=hard - deadline)
    except FleetOff:
        # The fleet's teardown turned it off: the lease was never taken, nothing was called.
        fleet = reconciler.spec.fleet
        reconciler.telemetry.event(fleet, {"event": "tick_skipped", "reason": "fleet_off"})
        reconciler.telemetry.flush()
        return {"fleet": fleet, "skipped": "fleet_off"}
