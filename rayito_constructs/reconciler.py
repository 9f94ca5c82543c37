"""``FleetReconciler``: the small Lambda that keeps a fleet's ``min_vms`` and ``warm_vms`` against
ListMicrovms, on EventBridge Scheduler every minute and on demand (docs/reconciler.md).

No Docker at synth: the code is ``lambdas/reconciler`` as is, with the ``lambda-microvms`` botocore
model bundled (the runtime's botocore may predate it); Powertools comes from its public layer.
"""

from __future__ import annotations

import json
import math
import weakref
from typing import Any, Callable, Mapping, Optional

import jsii

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from ._function import lazy_string, library_function, scheduled_invoke
from ._lambdas.reconciler.core import lifetimes
from .control_plane_budget import ControlPlaneBudget
from .fleet_ledger import FleetLedger
from .fleet_server import FleetServer
from .monitoring import METRICS_ENV, Operations, check_evaluation_periods, check_threshold, create_alarm, metrics_value
from .access_token import token_secret_name
from .permissions import (
    FleetAccess,
    Statement,
    recipe_key_statements,
    microvm_statements,
    session_secret_statements,
    table_key_statement,
    wildcard_reasons,
)
from .product_layer import ProductLayer

def _check_whole(option: str, value: object, *, optional: bool = False) -> None:
    """A whole number (not a bool: ``True`` would be 1; not ``100.5``: the API takes integers)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{option}: {value!r} is not a whole number" + (" (None: no reservation)" if optional else ""))


#: The reconciler's own rule (lambdas/reconciler/core/lifetimes.py, shipped in the wheel as
#: rayito_constructs._lambdas): the successor lead, the stagger step, the slowest start, and how far
#: past ``tick_seconds`` a tick may be woken for an end (its overtime).
_MIN_STAGGER_STEP_SECONDS = lifetimes.MIN_STAGGER_STEP_SECONDS
SUCCESSOR_START_SECONDS = lifetimes.SUCCESSOR_START_SECONDS
SLOW_START_SECONDS = lifetimes.SLOW_START_SECONDS
_OVERTIME_SECONDS = lifetimes.OVERTIME_SECONDS
effective_lead = lifetimes.successor_lead


def _first_spread(project: AgentProject, lifetime: float, effective: float) -> tuple[int, int, float]:
    """The fleet's slots, its headroom above them, and the seconds its first lifetimes are
    spread over (core.first_lifetime, with the successor lead ``effective``)."""
    slots = project.scaling.min_vms + project.scaling.warm_vms
    return slots, project.scaling.max_vms - slots, lifetimes.first_spread(lifetime, effective)


def short_lifetime_problems(project: AgentProject, lifetime: float, lead: float, period: float,
                            tick_seconds: float = 50.0) -> list[str]:
    """Why VMs of ``lifetime`` seconds would take the fleet below ``min_vms`` at their ends, as the
    reconciler plans them (core.successor_lead, core.first_lifetime), looking every ``period`` s
    with ticks of ``tick_seconds``:

    - the successor lead is under a look and a start (``successor_lead_seconds`` set that low), or
      the lifetime is, so a successor may start only after its VM ends;
    - the first lifetimes of the slots cannot be spread a stagger step (20 s) apart and there is
      less headroom than slots, so VMs that end together wait for each other's ends (measured:
      min 10 / max 11 with 400 s VMs, 18 s a slot: 16 s below min_vms in 27 minutes; min 20 /
      max 21 with 600 s VMs: 13 s);
    - ticks leave more than 10 s of each period unwatched (a schedule longer than a tick): a
      successor waiting for an end that falls there waits for the next tick. Slots must then end
      that much further apart, and a VM under two looks and two starts waits for its own
      predecessor's end (measured: min 3 / max 4 with 700 s VMs looked at every 5 minutes, 736 s
      below min_vms in 55 minutes; min 1 / max 2 with 320 s VMs, 42 s).

    Measured through the handler (tests/reconciler/test_short_lifetimes.py): with the default lead
    and schedule, every shape spread 20 s a slot or more held, from 90 s VMs (30 s starts from
    120 s) up."""
    problems = []
    effective = effective_lead(lifetime, lead, period)
    needed = period + SUCCESSOR_START_SECONDS
    if effective < needed or lifetime < needed:
        problems.append(
            f"successors start {min(effective, lifetime):g} s before a VM's end (successor_lead_seconds = {lead:g}, "
            f"max_lifetime_seconds = {lifetime:g}), less than a schedule period and {SUCCESSOR_START_SECONDS:g} s "
            f"({needed:g} s): a successor may start only once its VM has ended, and the fleet falls below min_vms "
            f"at each end; a successor_lead_seconds and a max_lifetime_seconds of at least {needed:g} s avoid it")
    unwatched = max(0.0, period - tick_seconds - _OVERTIME_SECONDS)
    if unwatched > SUCCESSOR_START_SECONDS and lifetime < 2 * needed:
        problems.append(
            f"max_lifetime_seconds = {lifetime:g} is under two schedule periods and starts ({2 * needed:g} s), and "
            f"ticks of {tick_seconds:g} s leave {unwatched:g} s of each {period:g} s period unwatched: a successor "
            "waits for the end of the VM before it, and an end there is seen only at the next tick; a shorter "
            "schedule, a tick_seconds near the schedule's period, or longer VMs avoid it")
    slots, headroom, spread = _first_spread(project, lifetime, effective)
    step = _MIN_STAGGER_STEP_SECONDS + (unwatched if unwatched > SUCCESSOR_START_SECONDS else 0.0)
    if slots >= 2 and headroom < slots and spread / slots < step:
        problems.append(
            f"the first lifetimes of {slots} slots cannot be spread {step:g} s apart in max_lifetime_seconds = "
            f"{lifetime:g} (over {max(spread, 0):g} s), and {headroom} VM(s) of headroom cannot hold all their "
            "successors: VMs that end together wait for each other's ends"
            + (f" (and ends in the {unwatched:g} s ticks leave unwatched each period wait for the next tick)"
               if step > _MIN_STAGGER_STEP_SECONDS else "")
            + " and the fleet falls below min_vms; give the VMs longer lifetimes or max_vms more headroom"
            + (", or ticks near the schedule's period (tick_seconds)" if step > _MIN_STAGGER_STEP_SECONDS else ""))
    return problems


def rollout_problems(project: AgentProject, lifetime: float, lead: float, period: float) -> list[str]:
    """Why a new image version's first launches (26-65 s PENDING, measured) would take the fleet
    below ``min_vms``: slots whose successors wait for room (less headroom than slots) and run at
    the end before their own, with first lifetimes less than a stagger step and a slow start apart
    (75 s). Told as an info (``short_lifetime_rollout``), not a warning: outside a rollout these
    shapes hold, and ``cdk synth --strict`` fails on warnings. Measured through the handler
    (tests/reconciler/test_room_for_successors.py): min 3 / max 4 with 180 s VMs (20 s a slot), 42 s
    below min_vms in 13 minutes; min 5 / max 6 with 600 s VMs (56 s a slot), 6.4 s."""
    slots, headroom, spread = _first_spread(project, lifetime, effective_lead(lifetime, lead, period))
    step = _MIN_STAGGER_STEP_SECONDS + SLOW_START_SECONDS - SUCCESSOR_START_SECONDS
    if slots >= 2 and headroom < slots and spread / slots < step:
        return [f"the first lifetimes of {slots} slots are spread less than {step:g} s apart in max_lifetime_seconds = "
                f"{lifetime:g}, with {headroom} VM(s) of headroom: while a new image version's first launches take "
                "26-65 s (measured), a successor that waits for the end before its own may be RUNNING only after "
                "its VM ends; longer VMs or more headroom avoid it"]
    return []


def check_budgets(budgets: Optional[Mapping[str, tuple[float, float]]]) -> None:
    """``{operation: (rate_per_second, burst)}``: one of :data:`BUDGET_OPERATIONS`, a finite rate
    above 0 and a finite burst of at least 1. The reconciler ignores anything else at run time
    (``budgets_rejected``) and keeps the documented default: a mistake is told at synth instead."""
    if budgets is None:
        return
    if not isinstance(budgets, Mapping):
        raise ValueError(f"control_plane_budgets: {budgets!r} is not a mapping of operation to (rate, burst)")
    for operation, value in budgets.items():
        if operation not in BUDGET_OPERATIONS:
            raise ValueError(f"control_plane_budgets: {operation!r} is not one of {', '.join(BUDGET_OPERATIONS)}")
        pair = tuple(value) if isinstance(value, (list, tuple)) else ()
        numbers = len(pair) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
        if not numbers or not (math.isfinite(pair[0]) and pair[0] > 0 and math.isfinite(pair[1]) and pair[1] >= 1):
            raise ValueError(f"control_plane_budgets[{operation!r}]: {value!r} is not (rate, burst) with a finite "
                             "rate above 0 per second and a finite burst of at least 1")


#: The reconciler runs, inspects, parks, resumes and ends VMs; it never connects to one, so its role
#: has no ``lambda:CreateMicrovmAuthToken`` (a token opens the VM's endpoint: the agents' sessions).
NEVER_CONNECTS = "lambda:CreateMicrovmAuthToken"


def _without_auth_token(statements: list[Statement]) -> list[Statement]:
    out = []
    for statement in statements:
        if NEVER_CONNECTS in statement.actions:
            statement = Statement(statement.sid, tuple(a for a in statement.actions if a != NEVER_CONNECTS),
                                  statement.resources, statement.conditions)
        out.append(statement)
    return out
from .model.project import AgentProject

NAMESPACE = "Rayito/Fleet"
#: Fleets per image, per app: ``{app root: {image key: [FleetReconciler, ...]}}``.
_IMAGE_USERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: Powertools for AWS Lambda (Python) v3 public layer, pinned (override with powertools_layer_arn).
POWERTOOLS_LAYER_VERSION = 27
POWERTOOLS_ACCOUNT = "017000801446"
#: The MicroVMs operations the reconciler calls under its budget: ``Deferrals`` and ``Throttles``
#: carry one of these as their ``operation`` dimension.
OPERATIONS = ("RunMicrovm", "ListMicrovms", "GetMicrovm", "SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm")
#: Operations the shared control-plane budget has a bucket for (lambdas/reconciler/budget.py).
BUDGET_OPERATIONS = (*OPERATIONS, "CreateMicrovmAuthToken")


def _check_ranges(
    *,
    reserved_concurrency: Optional[int],
    max_start_attempts: int,
    max_starts_per_step: int,
    tick_seconds: int,
    stray_grace_seconds: int,
    max_lifetime_seconds: int,
    successor_lead_seconds: int,
) -> None:
    """Each whole-number option within its range; the first one outside is the error."""
    _check_whole("reserved_concurrency", reserved_concurrency, optional=True)
    if reserved_concurrency is not None and reserved_concurrency < 1:
        raise ValueError(f"reserved_concurrency: {reserved_concurrency} is not at least 1 (None: no reservation)")
    # A width of 0 (or less) never starts a VM: every step skips its runs with a 0 s wait, and
    # the tick steps every 50 ms for its whole deadline (measured: 958 steps and 102 lists a tick).
    for option, value, least, most in (("max_start_attempts", max_start_attempts, 1, 100),
                                       ("max_starts_per_step", max_starts_per_step, 1, 1000),
                                       ("tick_seconds", tick_seconds, 1, 885),  # its timeout, + 15 s, is at most 900
                                       ("stray_grace_seconds", stray_grace_seconds, 60, 28_800)):
        _check_whole(option, value)
        if not least <= value <= most:
            raise ValueError(f"{option}: {value} is not within {least} to {most}")
    for option, value, least in (("max_lifetime_seconds", max_lifetime_seconds, 1),
                                 ("successor_lead_seconds", successor_lead_seconds, 0)):
        _check_whole(option, value)
        if not least <= value <= 28_800:
            raise ValueError(f"{option}: {value} is not within {least} to 28800 (8 hours)")


@jsii.implements(cdk.IStableListProducer)
class _LazyList:
    def __init__(self, produce: Callable[[], list[str]]) -> None:
        self._produce = produce

    def produce(self) -> list[str]:
        return self._produce()


class FleetReconciler(Construct):
    """Keeps one fleet's base VMs and parked slots.

    :param project: the fleet's project (``min_vms``, ``max_vms``, ``warm_vms``, ``idle``).
    :param access: the fleet's ARNs (image, execution role, connectors), from ``AgentFleet``.
    :param execution_role: the role the fleet's MicroVMs run as. Default: none.
    :param schedule: how often a tick runs. Default: every minute.
    :param tick_seconds: how long a tick may keep working. Default: 50 seconds.
    :param watch_seconds: while a tick lives, how often it looks at the parked slots' VMs
        (GetMicrovm each, from a bucket of the shared budget of its own: 30 a second account-wide)
        for a client's take, to refill the slot within seconds instead of at the next tick. A
        fleet with parked slots then ticks past ``tick_seconds`` into the invocation's overtime,
        until about 2 seconds before its timeout, so one tick's watch meets the next's (about 57
        of every 60 seconds: Lambda time in docs/cost-and-activation.md). 0 turns the watch off (a take is seen by the next tick's
        list, up to a schedule period later). 2 to 60, or 0. Default: 5.
    :param max_lifetime_seconds: ``maximumDurationInSeconds`` of every VM, 1 to 28,800 (the
        construct warns ``short_lifetime`` when VMs this short would take the fleet below
        ``min_vms`` at their ends: :func:`short_lifetime_problems`). Default: 28,800.
    :param successor_lead_seconds: how long before a VM's end its successor starts, at most half
        of ``max_lifetime_seconds`` (a longer lead is capped there, and the construct says so at
        synth). Default: 900.
    :param max_start_attempts: failed starts in a row before a slot is dead-lettered. Default: 3.
    :param max_starts_per_step: RunMicrovm calls one step may make (admission width). Default: 10.
    :param budgets: ``{operation: (rate_per_second, burst)}`` over the documented default quotas,
        to match the account's applied quotas or to leave room for clients. Default: none.
    :param control_plane_budget: the shared budget table. Default: one per stack.
    :param ledger: the ledger table. Default: one per stack.
    :param powertools_layer_arn: Default: the public Powertools v3 layer, version 27, for
        python3.14 on arm64 in the stack's region.
    :param image_version: the image version new VMs run; VMs on another are rolled. Default: none.
    :param base_rollout: ``on_expiry`` (default) or ``rolling`` (see docs/image.md).
    :param share_image: let other fleets of the app run the same image. Every fleet on it must say
        so, and all of them must use one ledger table (the stack's, by default): each then counts
        only the VMs its own ledger started, and none reports the others' as strays. Default:
        False (a second fleet on an image is a synth error).
    :param terminate_strays: end foreign VMs of the image that show no sign of serving: SUSPENDED,
        unowned, at every observation for ``stray_grace_seconds`` (docs/reconciler.md "Strays").
        RUNNING and PENDING ones are never ended. Default: False (strays are only reported).
    :param stray_grace_seconds: Default: 3,600.
    :param reserved_concurrency: reserved concurrent executions of the function: 1 keeps two ticks
        of the fleet from ever running at once (a second delivery waits in Lambda's async queue).
        ``None`` for accounts whose concurrency quota leaves no room to reserve (new accounts
        start at 10, and Lambda keeps 100 unreserved). Default: 1.
    :param encryption_key: customer key of the stack's ledger and control-plane budget (made with
        it on first use); the role may use it through DynamoDB only. Default: AWS managed keys.
    :param metrics: emit the custom metrics below (EMF, namespace ``Rayito/Fleet``); off, the
        function prints no EMF line at all, and its decisions stay in its log. Default: the
        fleet's ``metrics`` (off outside a fleet).
    :param log_retention: retention of the function's log group. Default: the fleet's
        ``log_retention`` (three months outside a fleet).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        project: AgentProject,
        access: FleetAccess,
        execution_role_arn: Optional[str] = None,
        schedule: cdk.Duration = cdk.Duration.minutes(1),
        tick_seconds: int = 50,
        watch_seconds: int = 5,
        max_lifetime_seconds: int = 28_800,
        successor_lead_seconds: int = 900,
        max_start_attempts: int = 3,
        max_starts_per_step: int = 10,
        budgets: Optional[Mapping[str, tuple[float, float]]] = None,
        control_plane_budget: Optional[dynamodb.ITable] = None,
        ledger: Optional[dynamodb.ITable] = None,
        powertools_layer_arn: Optional[str] = None,
        image_version: Optional[str] = None,
        base_rollout: str = "on_expiry",
        share_image: bool = False,
        terminate_strays: bool = False,
        stray_grace_seconds: int = 3600,
        reserved_concurrency: Optional[int] = 1,
        encryption_key: Optional[kms.IKey] = None,
        metrics: Optional[bool] = None,
        log_retention: Optional[logs.RetentionDays] = None,
    ) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        operations = Operations.of(self)
        self.metrics = operations.metrics if metrics is None else metrics
        """Whether the function emits custom metrics."""
        _check_ranges(reserved_concurrency=reserved_concurrency, max_start_attempts=max_start_attempts,
                      max_starts_per_step=max_starts_per_step, tick_seconds=tick_seconds,
                      stray_grace_seconds=stray_grace_seconds, max_lifetime_seconds=max_lifetime_seconds,
                      successor_lead_seconds=successor_lead_seconds)
        _check_whole("watch_seconds", watch_seconds)
        if watch_seconds != 0 and not 2 <= watch_seconds <= 60:
            raise ValueError(f"watch_seconds: {watch_seconds} is not 0 (no watch) or within 2 to 60")
        self._tell_lead_capped(max_lifetime_seconds, successor_lead_seconds, schedule.to_seconds())
        check_budgets(budgets)
        if tick_seconds >= schedule.to_seconds():
            raise ValueError(f"tick_seconds: {tick_seconds} leaves no room before the next tick ({schedule.to_seconds()} s)")
        self._tell_short_lifetimes(project, max_lifetime_seconds, successor_lead_seconds, schedule.to_seconds(),
                                   tick_seconds)
        self.fleet_name = project.name
        self.alarms: list[cloudwatch.Alarm] = []
        """The alarms ``add_alarms`` made."""
        budget_table = control_plane_budget or ControlPlaneBudget.of(self, encryption_key=encryption_key).table
        ledger_table = ledger or FleetLedger.of(self, encryption_key=encryption_key).table
        self.share_image = share_image
        self.siblings: list["FleetReconciler"] = []
        """The other fleets of the app on this fleet's image (``share_image``)."""
        self._claim_image(access.image_arns[0], ledger_table)
        self.ledger_table = ledger_table
        """The slot ledger."""
        self.budget_table = budget_table
        """The shared control-plane budget."""

        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetters",
            enforce_ssl=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            retention_period=cdk.Duration.days(14),
        )
        """Failed invocations and dead-lettered slots, with their reasons."""
        cdk.Validations.of(self.dead_letter_queue).acknowledge(
            cdk.Acknowledgment(id="AwsSolutions-SQS3", reason="this queue is the dead-letter queue itself")
        )

        self.server = FleetServer(self, "Server", fleet_name=project.name, access=access, ledger=ledger_table,
                                  image_version=image_version, log_retention=log_retention)
        """Serves and warms the VMs this reconciler starts (the product's agent host, the pool's warming)."""
        layer_arn = powertools_layer_arn or (
            f"arn:{stack.partition}:lambda:{stack.region}:{POWERTOOLS_ACCOUNT}:layer:"
            f"AWSLambdaPowertoolsPythonV3-python314-arm64:{POWERTOOLS_LAYER_VERSION}"
        )
        environment = self._environment(
            project, access, ledger_table=ledger_table, budget_table=budget_table, schedule=schedule,
            tick_seconds=tick_seconds, watch_seconds=watch_seconds, max_lifetime_seconds=max_lifetime_seconds,
            successor_lead_seconds=successor_lead_seconds, max_start_attempts=max_start_attempts,
            max_starts_per_step=max_starts_per_step, budgets=budgets, image_version=image_version,
            base_rollout=base_rollout, execution_role_arn=execution_role_arn, share_image=share_image,
            terminate_strays=terminate_strays, stray_grace_seconds=stray_grace_seconds,
        )
        statements = self._statements(project, access, ledger_table=ledger_table, budget_table=budget_table,
                                      share_image=share_image)
        reasons = wildcard_reasons(statements)
        made = library_function(
            self,
            name="reconciler",
            as_package=True,
            description=f"Rayito reconciler: keeps fleet {project.name}'s base VMs and parked slots",
            role_description=f"Rayito reconciler of fleet {project.name}",
            statements=statements,
            wildcard_reasons=reasons,
            layers=[lambda_.LayerVersion.from_layer_version_arn(self, "Powertools", layer_arn),
                    # The product: its recipe decoder and its launch of each VM (lambdas/reconciler/product_launch.py).
                    ProductLayer.of(self).layer],
            timeout=cdk.Duration.seconds(tick_seconds + 15),
            environment=environment,
            # Stale ticks are dropped, never retried: the next tick starts from the truth anyway.
            retry_attempts=0,
            max_event_age=cdk.Duration.seconds(60),
            on_failure=destinations.SqsDestination(self.dead_letter_queue),
            # One tick of a fleet at a time: a second delivery (the scheduler delivers at least
            # once, a deploy invokes on demand) waits in Lambda's async queue, up to the 60 s above.
            reserved_concurrency=reserved_concurrency,
            log_retention=log_retention,
        )
        self.log_group = made.log_group
        """The function's log group: the timeline of its decisions (docs/operations.md)."""
        self.function = made.function
        """The reconciler function (invoke it on demand; ``{"action": "redrive"}`` retries dead slots)."""
        # The fleet's name in the event: the teardown disables the schedule only while it ticks this fleet.
        self.schedule, self.schedule_role = scheduled_invoke(
            self, self.function, what=f"reconciler of fleet {project.name}", kind="reconciler",
            description=f"Rayito reconciler tick for fleet {project.name}", rate=schedule,
            event={"source": "schedule", "fleet": project.name}, max_event_age=cdk.Duration.seconds(60),
            dead_letter_queue=self.dead_letter_queue)

    def _tell_lead_capped(self, lifetime: int, lead: int, period: float) -> None:
        """Told, not warned: the cap is what the reconciler does anyway (core.successor_lead)."""
        if lead > lifetime / 2:
            effective = effective_lead(lifetime, lead, period)
            cdk.Annotations.of(self).add_info(
                f"successor_lead_capped: successor_lead_seconds = {lead} is more than half of "
                f"max_lifetime_seconds = {lifetime}: successors start {effective:g} s before a VM's end (half "
                "a lifetime, or a look and a start if that is longer: a lead as long as the lifetime would start "
                "every VM's successor at once)")

    def _tell_short_lifetimes(self, project: AgentProject, lifetime: int, lead: int, period: float,
                              tick_seconds: int) -> None:
        """Warn ``short_lifetime`` where the fleet would dip at its VMs' ends; otherwise tell what a
        rollout would do (``short_lifetime_rollout``)."""
        problems = short_lifetime_problems(project, lifetime, lead, period, tick_seconds)
        for problem in problems:
            cdk.Annotations.of(self).add_warning_v2("rayito:short_lifetime", f"short_lifetime: {problem}")
        if not problems:
            for problem in rollout_problems(project, lifetime, lead, period):
                cdk.Annotations.of(self).add_info(f"short_lifetime_rollout: {problem}")

    def _environment(
        self,
        project: AgentProject,
        access: FleetAccess,
        *,
        ledger_table: dynamodb.ITable,
        budget_table: dynamodb.ITable,
        schedule: cdk.Duration,
        tick_seconds: int,
        watch_seconds: int,
        max_lifetime_seconds: int,
        successor_lead_seconds: int,
        max_start_attempts: int,
        max_starts_per_step: int,
        budgets: Optional[Mapping[str, tuple[float, float]]],
        image_version: Optional[str],
        base_rollout: str,
        execution_role_arn: Optional[str],
        share_image: bool,
        terminate_strays: bool,
        stray_grace_seconds: int,
    ) -> dict[str, str]:
        """The function's environment: the fleet, its tables and every tuning option."""
        environment: dict[str, str] = {
            "FLEET_NAME": project.name,
            "IMAGE_ARN": access.image_arns[0],
            # The token's name, not its value: the function reads it (GetSecretValue) and sends its
            # sha256 in each VM's run payload.
            "ACCESS_TOKEN_SECRET": token_secret_name(project.name),
            "SERVER_FUNCTION": self.server.function.function_name,
            "MIN_VMS": str(project.scaling.min_vms),
            "MAX_VMS": str(project.scaling.max_vms),
            "WARM_VMS": str(project.scaling.warm_vms),
            "MAX_LIFETIME_SECONDS": str(max_lifetime_seconds),
            "SUCCESSOR_LEAD_SECONDS": str(successor_lead_seconds),
            "MAX_START_ATTEMPTS": str(max_start_attempts),
            "MAX_STARTS_PER_STEP": str(max_starts_per_step),
            "TICK_SECONDS": str(tick_seconds),
            "WATCH_SECONDS": str(watch_seconds),
            "SCHEDULE_SECONDS": str(int(schedule.to_seconds())),
            "LEDGER_TABLE": ledger_table.table_name,
            "BUDGET_TABLE": budget_table.table_name,
            "BUDGETS": json.dumps({k: list(v) for k, v in sorted((budgets or {}).items())}, separators=(",", ":")),
            "DEAD_LETTER_QUEUE_URL": self.dead_letter_queue.queue_url,
            "POWERTOOLS_SERVICE_NAME": "rayito-reconciler",
            "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE,
            METRICS_ENV: metrics_value(self.metrics),
        }
        if not self.metrics:
            # Our telemetry adds no metric when off; Powertools' own switch as well, so nothing it
            # might add on its own (a cold-start metric) is printed either.
            environment["POWERTOOLS_METRICS_DISABLED"] = "true"
        if project.scaling.idle:
            environment["IDLE_SECONDS"] = str(project.scaling.idle)
        if image_version:
            environment["IMAGE_VERSION"] = image_version
            environment["BASE_ROLLOUT"] = base_rollout
        if execution_role_arn:
            environment["EXECUTION_ROLE_ARN"] = execution_role_arn
        if share_image:
            # Lazy: a fleet added later to the app on the same image is a sibling too.
            environment["SHARED_WITH"] = lazy_string(
                lambda: json.dumps(sorted(s.fleet_name for s in self.siblings), separators=(",", ":")))
        if terminate_strays:
            environment["TERMINATE_STRAYS"] = "1"
            environment["STRAY_GRACE_SECONDS"] = str(stray_grace_seconds)
        return environment

    def _statements(
        self,
        project: AgentProject,
        access: FleetAccess,
        *,
        ledger_table: dynamodb.ITable,
        budget_table: dynamodb.ITable,
        share_image: bool,
    ) -> list[Statement]:
        """The function's permissions, each with its Sid."""
        stack = cdk.Stack.of(self)
        statements = [
            *_without_auth_token(microvm_statements(access)),
            Statement("Ledger",
                      ("dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
                      (ledger_table.table_arn,),
                      {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [project.name]}}),
            Statement("ControlPlaneBudget", ("dynamodb:UpdateItem", "dynamodb:GetItem"), (budget_table.table_arn,)),
            Statement("DeadLetters", ("sqs:SendMessage",), (self.dead_letter_queue.queue_arn,)),
            # What the fleet is (the product's recipe, at every tick) and the token its VMs admit.
            Statement("AgentRecipe", ("ssm:GetParameter",), access.recipe_parameter_arns),
            # Each VM it starts is served (base) or warmed (parked) by the fleet's server.
            Statement("AskServer", ("lambda:InvokeFunction",), (self.server.function.function_arn,)),
            *recipe_key_statements("AgentRecipeKey", ("kms:Decrypt",), access),
            *[st for st in session_secret_statements(access) if st.sid in ("AccessToken", "SecretsKey")],
        ]
        if share_image:
            # Which VMs the other fleets on the image hold: their slot items, read only.
            statements.append(Statement(
                "SiblingLedgers", ("dynamodb:Query",), (ledger_table.table_arn,),
                {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": cdk.Lazy.list(_LazyList(
                    lambda: sorted(s.fleet_name for s in self.siblings) or [project.name]))}}))
        keys: dict[str, str] = {}  # the tables' customer keys, each once
        for table in (ledger_table, budget_table):
            if table.encryption_key is not None:
                keys.setdefault(json.dumps(stack.resolve(table.encryption_key.key_arn)), table.encryption_key.key_arn)
        if keys:
            statements.append(table_key_statement("TablesKey", tuple(keys.values()), stack.region))
        return statements

    def _claim_image(self, image_arn: str, ledger_table: dynamodb.ITable) -> None:
        """One fleet per image in an app, unless every fleet on it shares it explicitly."""
        stack = cdk.Stack.of(self)
        # The same ARN text in another account or region (or a default image named after the fleet,
        # built from the stack's pseudo parameters) is another image.
        key = json.dumps([stack.resolve(stack.account), stack.resolve(stack.region), stack.resolve(image_arn)],
                         sort_keys=True)
        users = _IMAGE_USERS.setdefault(self.node.root, {}).setdefault(key, [])
        for other in users:
            if not (self.share_image and other.share_image):
                raise ValueError(
                    f"image_arn: fleet {self.fleet_name!r} would run the image fleet {other.fleet_name!r} already "
                    "runs; two fleets on one image count each other's VMs. Give each fleet its own image, or pass "
                    "share_image=True to every fleet on it")
            if other.ledger_table is not ledger_table:
                raise ValueError(
                    f"ledger: fleets {other.fleet_name!r} and {self.fleet_name!r} share an image but not a ledger "
                    "table; put them in one stack (its ledger) or pass them the same ledger")
            other.siblings.append(self)
            self.siblings.append(other)
        users.append(self)

    # ------------------------------------------------------------------ metrics and alarms

    def metric(self, name: str, *, operation: Optional[str] = None, **props: object) -> cloudwatch.Metric:
        """A metric the reconciler emits (namespace ``Rayito/Fleet``, dimension ``fleet``)."""
        dimensions = {"fleet": self.fleet_name, "service": "rayito-reconciler"}
        if operation:
            dimensions["operation"] = operation
        props.setdefault("period", cdk.Duration.minutes(1))
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name=name, dimensions_map=dimensions, **props)

    def metric_live_base_vms(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Minimum")
        return self.metric("LiveBaseVMs", **props)

    def metric_parked_slots(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Minimum")
        return self.metric("ParkedSlots", **props)

    def metric_deficit(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Maximum")
        return self.metric("Deficit", **props)

    def metric_wait_time(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "p90")
        return self.metric("WaitTime", **props)

    def metric_claim_to_complete(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "p90")
        return self.metric("ClaimToComplete", **props)

    def metric_retry_amplification(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Maximum")
        return self.metric("RetryAmplification", **props)

    def metric_dead_lettered_slots(self, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Maximum")
        return self.metric("DeadLetteredSlots", **props)

    def metric_deferrals(self, operation: str = "RunMicrovm", **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Sum")
        return self.metric("Deferrals", operation=operation, **props)

    def metric_throttles(self, operation: str = "RunMicrovm", **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Sum")
        return self.metric("Throttles", operation=operation, **props)

    def metric_dead_letters(self, **props: object) -> cloudwatch.Metric:
        """Messages waiting in the dead-letter queue (an SQS metric: no custom metric needed)."""
        props.setdefault("period", cdk.Duration.minutes(1))
        return self.dead_letter_queue.metric_approximate_number_of_messages_visible(**props)

    def metric_stray_vms(self, **props: object) -> cloudwatch.Metric:
        """Foreign VMs of the image (no slot of the ledger started them)."""
        props.setdefault("statistic", "Maximum")
        return self.metric("StrayVMs", **props)

    def metric_oldest_stray_age(self, **props: object) -> cloudwatch.Metric:
        """Seconds the oldest foreign VM has been seen unowned."""
        props.setdefault("statistic", "Maximum")
        return self.metric("OldestStrayAge", **props)

    def add_alarms(self, *, amplification_threshold: float = 1.5, deficit_minutes: int = 10,
                   stray_seconds: int = 3600, custom_metrics: Optional[bool] = None,
                   option: str = "add_alarms(custom_metrics=True)") -> list[cloudwatch.Alarm]:
        """Alarms on retry amplification, a sustained deficit, dead-lettered slots and a foreign VM
        of the image unowned for ``stray_seconds`` (custom metrics), and on the dead-letter queue's
        depth (an SQS metric, free of custom metrics).

        :param amplification_threshold: attempts per slot filled the amplification alarm fires
            at: a finite number above 1 (every slot filled took at least one attempt, so 1 or
            less would always be in alarm). Default: 1.5.
        :param deficit_minutes: one-minute periods with a deficit before the deficit alarm fires:
            a whole number from 1 to 1,440 (PutMetricAlarm evaluates periods under an hour over
            at most one day). Default: 10.
        :param stray_seconds: seconds a foreign VM stays unowned before the stray alarm fires:
            a finite number above 0 (the metric is 0 when there is none). Default: 3,600.
        :param custom_metrics: make the alarms on custom metrics. True while the reconciler's
            metrics are off is a synth error naming ``option``. Default: when metrics are on.

        A value outside these is a one-line ``ValueError`` naming it, before any alarm is made.
        """
        check_threshold("amplification_threshold", amplification_threshold, above=1,
                        why="every slot filled takes at least one attempt, so the alarm would always fire")
        deficit = self.metric_deficit()  # one-minute periods: a period per minute of deficit
        check_evaluation_periods("deficit_minutes", deficit_minutes, int(deficit.period.to_seconds()), unit="minutes")
        check_threshold("stray_seconds", stray_seconds, above=0,
                        why="the oldest stray's age is 0 with no stray, so the alarm would always fire")
        missing = cloudwatch.TreatMissingData.NOT_BREACHING
        custom = self.metrics if custom_metrics is None else custom_metrics
        off_hint = "leave the alarms on custom metrics out (the dead-letter queue alarm needs none)"

        def alarm(id: str, metric: cloudwatch.IMetric, **props: Any) -> cloudwatch.Alarm:
            return create_alarm(self, id, metric, option=option, metrics=self.metrics, off_hint=off_hint,
                                treat_missing_data=missing, **props)

        alarms = []
        if custom:
            alarms += [
                alarm("AmplificationAlarm", self.metric_retry_amplification(period=cdk.Duration.minutes(5)),
                      threshold=amplification_threshold, evaluation_periods=3,
                      comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,  # "above", as told
                      alarm_description=f"{self.fleet_name}: RunMicrovm attempts per slot filled above {amplification_threshold}"),
                alarm("DeficitAlarm", deficit, threshold=0, evaluation_periods=deficit_minutes,
                      comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                      alarm_description=f"{self.fleet_name}: slots without a VM for {deficit_minutes} minutes"),
                alarm("DeadLetteredSlotsAlarm", self.metric_dead_lettered_slots(), threshold=1, evaluation_periods=1,
                      comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                      alarm_description=f"{self.fleet_name}: a slot failed to start repeatedly and was dead-lettered"),
            ]
        alarms.append(alarm(
            "DeadLetterQueueAlarm", self.metric_dead_letters(), threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            alarm_description=f"{self.fleet_name}: reconciler dead letters waiting"))
        if custom:
            alarms.append(alarm(
                "StrayVMsAlarm", self.metric_oldest_stray_age(period=cdk.Duration.minutes(5)),
                threshold=stray_seconds, evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                alarm_description=f"{self.fleet_name}: a VM of the fleet's image no slot owns, for {stray_seconds} s or more"))
        self.alarms = alarms
        return alarms
