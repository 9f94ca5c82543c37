"""The operations surface of a fleet, in one place (docs/operations.md): whether the library emits
custom metrics, who is told when an alarm fires, how long its logs are kept.

A fleet attaches one :class:`Operations` to itself; every part below it (the reconciler, the recipe,
the egress budget, the dashboard, a function added next year) asks :meth:`Operations.of` instead of
taking its own copy of the setting, so a part added later cannot disagree with the fleet.

Two rules are enforced here rather than in each part:

* **Alarms come from one factory** (:func:`create_alarm`). An alarm on a custom metric (any namespace
  but ``AWS/...``) refuses at synth, with one line naming the option, when the fleet's metrics are
  off: it would watch a metric nobody sends and never fire.
* **Every alarm gets the fleet's actions**, through an aspect (:class:`AlarmActions`) on the fleet's
  scope, not through each caller: it visits every ``AWS::CloudWatch::Alarm`` and
  ``AWS::CloudWatch::CompositeAlarm`` below the fleet at synth, the ones the library makes, the
  ones made later and the ones a user adds under the fleet, and adds each action once.

Custom metrics cost money per metric (name x dimension values) per month, and their EMF lines are
billed as log ingestion, so metrics are **off by default**, like every Rayito feature but the recipe
(the product page's "Cost and activation"). Off means nothing is emitted at all: the reconciler and
the recipe writer print no EMF line (their log lines stay), and the agents' egress recorder follows
``RAYITO_METRICS`` in the image the fleet builds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import aws_cdk as cdk
import jsii
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct, IConstruct

from .model.cloudwatch_limits import MAX_ALARM_ACTIONS, RETENTION_DAYS, SNS_TOPIC_ARN

#: The environment variable (and custom resource property) that carries the switch to code that
#: runs in AWS: ``on`` or ``off``; anything else, or nothing, is off.
METRICS_ENV = "RAYITO_METRICS"
_ON = frozenset({"on", "true", "1", "yes"})
#: Default retention of the library's function logs (reconciler, recipe writer, any later one).
DEFAULT_LOG_RETENTION = logs.RetentionDays.THREE_MONTHS

#: How long an alarm may look back: "An alarm's total current evaluation period can be no longer
#: than seven days, so Period multiplied by EvaluationPeriods can't be more than 604,800 seconds.
#: For alarms with a period of less than one hour (3,600 seconds), the total evaluation period
#: can't be longer than one day (86,400 seconds)" (CloudWatch API Reference, PutMetricAlarm,
#: ``Period``).
MAX_EVALUATION_SECONDS = 604_800
MAX_EVALUATION_SECONDS_UNDER_AN_HOUR = 86_400


def max_evaluation_periods(period_seconds: int) -> int:
    """The most ``EvaluationPeriods`` PutMetricAlarm takes for a period of ``period_seconds``."""
    limit = MAX_EVALUATION_SECONDS_UNDER_AN_HOUR if period_seconds < 3600 else MAX_EVALUATION_SECONDS
    return limit // period_seconds


def check_evaluation_periods(option: str, value: object, period_seconds: int, unit: str = "periods") -> int:
    """A whole number of evaluation periods from 1 to what PutMetricAlarm takes for the period
    (:func:`max_evaluation_periods`); a one-line ``ValueError`` naming ``option`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{option}: {value!r} is not a whole number of {unit}")
    most = max_evaluation_periods(period_seconds)
    if value < 1:
        raise ValueError(f"{option}: {value} is below the minimum of 1")
    if value > most:
        window = MAX_EVALUATION_SECONDS_UNDER_AN_HOUR if period_seconds < 3600 else MAX_EVALUATION_SECONDS
        raise ValueError(f"{option}: {value} is above the limit of {most} {unit}: CloudWatch (PutMetricAlarm) "
                         f"evaluates an alarm of {period_seconds} s periods over at most {window:,} s")
    return value


def check_threshold(option: str, value: object, *, above: float, why: str) -> float:
    """A finite number above ``above`` (not a bool: ``True`` would be 1); ``why`` says what a
    value at or below it would do. A one-line ``ValueError`` naming ``option`` otherwise (a NaN
    would otherwise crash the synth: the template is JSON, which has no NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{option}: {value!r} is not a number")
    if not math.isfinite(value):
        raise ValueError(f"{option}: {value!r} is not a finite number")
    if value <= above:
        raise ValueError(f"{option}: {value!r} is not above {above:g}: {why}")
    return value


def metrics_value(on: bool) -> str:
    """What ``RAYITO_METRICS`` says for a switch."""
    return "on" if on else "off"


def metrics_on(value: Optional[str]) -> bool:
    """Read ``RAYITO_METRICS``: ``on`` (or true, 1, yes) is on; anything else, or unset, is off."""
    return (value or "").strip().lower() in _ON


def retention_days(retention: logs.RetentionDays, option: str = "log_retention") -> Optional[int]:
    """Days a ``RetentionDays`` keeps logs (``None`` for ``INFINITE``)."""
    if not isinstance(retention, logs.RetentionDays) or retention.name not in RETENTION_DAYS:
        raise ValueError(f"{option}: {retention!r} is not a logs.RetentionDays (logs.RetentionDays.THREE_MONTHS...)")
    return RETENTION_DAYS[retention.name]


def retention_from_days(days: int) -> logs.RetentionDays:
    """The ``RetentionDays`` of a number of days (``cdk synth -c log_retention=90``; 0: never expire)."""
    if days == 0:
        return logs.RetentionDays.INFINITE
    for name, value in RETENTION_DAYS.items():
        if value == days:
            return getattr(logs.RetentionDays, name)
    allowed = ", ".join(str(v) for v in RETENTION_DAYS.values() if v is not None)
    raise ValueError(f"{days} days is not a CloudWatch Logs retention; allowed: {allowed}, or 0 for never expire")


def longest(*retentions: logs.RetentionDays) -> logs.RetentionDays:
    """The retention that keeps logs longest (``INFINITE`` above all)."""
    return max(retentions, key=lambda r: float("inf") if retention_days(r) is None else retention_days(r))


AlarmActionLike = Union[cloudwatch.IAlarmAction, sns.ITopic, str]


def alarm_actions_of(scope: Construct, given: Union[None, AlarmActionLike, Sequence[AlarmActionLike]],
                     *, option: str = "alarm_actions") -> tuple[cloudwatch.IAlarmAction, ...]:
    """``alarm_actions=`` as actions: an SNS topic (``sns.ITopic`` or its ARN) becomes an
    ``SnsAction``; any ``cloudwatch.IAlarmAction`` is taken as it is; one item or a sequence.
    The same topic given twice is one action."""
    return tuple(action for action, _ in _normalized(scope, given, option))


def _known(value: Any) -> bool:
    return isinstance(value, str) and not cdk.Token.is_unresolved(value)


def check_alarm_actions(given: Any, option: str = "alarm_actions", *, region: Optional[str] = None) -> list[tuple[str, Any]]:
    """``(where, item)`` of each action given; a one-line ``ValueError`` for anything that is not
    an SNS topic, its ARN or a ``cloudwatch.IAlarmAction`` (checked before anything is built), and
    for a topic in another region than ``region`` (the stack's) when both are known: CloudWatch
    sends an alarm's actions only to a topic of the alarm's own region, and PutMetricAlarm refuses
    the alarm at deploy otherwise."""
    if given is None:
        return []
    several = isinstance(given, (list, tuple))
    items = list(given) if several else [given]
    checked = []
    for index, item in enumerate(items):
        where = f"{option}[{index}]" if several else option
        if isinstance(item, str):
            if not cdk.Token.is_unresolved(item) and not SNS_TOPIC_ARN.match(item):
                raise ValueError(f"{where}: {item!r} is not an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)")
        elif not hasattr(item, "topic_arn") and not callable(getattr(item, "bind", None)):
            raise ValueError(f"{where}: {item!r} is neither an SNS topic (sns.ITopic or its ARN) "
                             "nor a cloudwatch.IAlarmAction")
        arn = item if isinstance(item, str) else getattr(item, "topic_arn", None)
        if _known(region) and _known(arn) and SNS_TOPIC_ARN.match(arn) and arn.split(":")[3] != region:
            # Named by the option and the ARN (not its index): `-c alarm_actions` reads the same.
            raise ValueError(f"{option}: {arn!r} is a topic in {arn.split(':')[3]} and the stack deploys to {region}; "
                             "CloudWatch sends an alarm's actions only to an SNS topic of the alarm's own region "
                             f"(PutMetricAlarm refuses the alarm): give a topic in {region}")
        checked.append((where, item))
    distinct = {item if isinstance(item, str) else (getattr(item, "topic_arn", None) if isinstance(
        getattr(item, "topic_arn", None), str) and not cdk.Token.is_unresolved(item.topic_arn) else id(item))
        for _, item in checked}
    if len(distinct) > MAX_ALARM_ACTIONS:
        raise ValueError(f"{option}: {len(distinct)} actions; a CloudWatch alarm takes at most {MAX_ALARM_ACTIONS} "
                         "(give one SNS topic that fans out to more)")
    return checked


def _normalized(scope: Construct, given: Any, option: str) -> list[tuple[cloudwatch.IAlarmAction, Any]]:
    """(action, the topic's ARN as the template will hold it, or None for another action)."""
    found: list[tuple[cloudwatch.IAlarmAction, Any]] = []
    seen: set[str] = set()
    stack = cdk.Stack.of(scope)
    for index, (_where, item) in enumerate(check_alarm_actions(given, option, region=stack.region)):
        arn: Any = None
        if isinstance(item, str):
            arn = stack.resolve(item)
            item = sns.Topic.from_topic_arn(scope, f"AlarmTopic{index}", item)
        elif hasattr(item, "topic_arn"):
            arn = stack.resolve(item.topic_arn)
        key = json.dumps(arn, sort_keys=True) if arn is not None else f"action:{id(item)}"
        if key in seen:
            continue
        seen.add(key)
        found.append((cw_actions.SnsAction(item) if arn is not None else item, arn))
    return found


@dataclass(frozen=True)
class Operations:
    """What a fleet decided about its operations surface (see the module docstring).

    :param metrics: the library emits custom metrics (EMF). Default: False.
    :param alarm_actions: actions every alarm below the fleet gets. Default: none.
    :param log_retention: retention of the library's function logs. Default: three months.
    :param fleet_name: for messages.
    :param alarm_topic_arns: the SNS topics among the actions, as the template holds their ARNs
        (what a check of the template can look for). Default: none.
    """

    metrics: bool = False
    alarm_actions: tuple[cloudwatch.IAlarmAction, ...] = field(default=())
    log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION
    fleet_name: Optional[str] = None
    alarm_topic_arns: tuple[Any, ...] = field(default=())

    _ATTRIBUTE = "_rayito_operations"

    def attach(self, scope: Construct) -> "Operations":
        """Make this the setting of every construct below ``scope``, and give every alarm below
        it the actions (an aspect, so alarms added later get them too)."""
        object.__setattr__(scope, self._ATTRIBUTE, self)
        if self.alarm_actions:
            cdk.Aspects.of(scope).add(AlarmActions(self.alarm_actions))
        if not self.metrics:
            cdk.Aspects.of(scope).add(SilentAlarms(self.fleet_name))
        return self

    @classmethod
    def for_fleet(cls, scope: Construct, *, metrics: bool = False, alarm_actions: Any = None,
                  log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
                  fleet_name: Optional[str] = None) -> "Operations":
        """The setting of a fleet from its options (``alarm_actions`` as ``AgentFleet`` takes them)."""
        actions = _normalized(scope, alarm_actions, "alarm_actions")
        return cls(metrics=metrics, alarm_actions=tuple(a for a, _ in actions), log_retention=log_retention,
                   fleet_name=fleet_name, alarm_topic_arns=tuple(arn for _, arn in actions if arn is not None))

    @classmethod
    def of(cls, scope: IConstruct) -> "Operations":
        """The setting of the nearest fleet above ``scope`` (``scope`` included), or the defaults."""
        for node in reversed(scope.node.scopes):
            found = getattr(node, cls._ATTRIBUTE, None)
            if isinstance(found, Operations):
                return found
        return _DEFAULTS


_DEFAULTS = Operations()


def custom_metrics_of(metric: cloudwatch.IMetric) -> list[str]:
    """``namespace name`` of every custom metric (any namespace but ``AWS/...``) ``metric`` reads."""
    found: list[str] = []
    if isinstance(metric, cloudwatch.MathExpression):
        for inner in metric.using_metrics.values():
            found += custom_metrics_of(inner)
        return found
    namespace = getattr(metric, "namespace", None)
    if isinstance(namespace, str) and not namespace.startswith("AWS/"):
        found.append(f"{namespace} {getattr(metric, 'metric_name', '?')}")
    return found


def create_alarm(scope: Construct, id: str, metric: cloudwatch.IMetric, *, option: str,
                 metrics: Optional[bool] = None, off_hint: str = "", **props: Any) -> cloudwatch.Alarm:
    """Every alarm the library makes: refuses, at synth, an alarm on a custom metric when metrics
    are off (``option`` names what asked for it), and otherwise makes ``metric``'s alarm under
    ``scope``. Actions are not added here: the fleet's :class:`AlarmActions` aspect adds them to
    every alarm below it, this one included."""
    on = Operations.of(scope).metrics if metrics is None else metrics
    custom = custom_metrics_of(metric)
    if custom and not on:
        hint = f" or {off_hint}" if off_hint else ""
        raise ValueError(
            f"{option}: the alarm {id} watches {custom[0]}, a custom metric, and metrics are off; pass "
            f"metrics=True (custom metrics and their cost: docs/operations.md){hint}")
    return cloudwatch.Alarm(scope, id, metric=metric, **props)


@jsii.implements(cdk.IAnyProducer)
class _Actions:
    """The alarm's own actions (whatever set them), then the fleet's, each once."""

    def __init__(self, own: Any, ours: list[str]) -> None:
        self._own = own
        self._ours = ours

    def produce(self, context: cdk.IResolveContext) -> Any:
        own = context.resolve(self._own) if self._own is not None else None
        merged: list[Any] = list(own or [])
        keys = {json.dumps(a, sort_keys=True) for a in merged}
        for arn in context.resolve(self._ours):
            key = json.dumps(arn, sort_keys=True)
            if key not in keys:
                keys.add(key)
                merged.append(arn)
        return merged or None


#: The namespaces of the custom metrics a fleet's parts send when metrics are on (dimension ``fleet``).
FLEET_NAMESPACES = ("Rayito/Fleet", "Rayito/Egress")


@jsii.implements(cdk.IAspect)
class SilentAlarms:
    """With metrics off, an alarm below the fleet on one of the fleet's own custom metrics (a
    user's, ``fleet.reconciler.metric_deficit().create_alarm(fleet, ...)``) is a synth error, as
    the library's own are (:func:`create_alarm`): it would watch a metric nobody sends and never
    fire. Its metrics are those of :data:`FLEET_NAMESPACES` whose ``fleet`` is this fleet (or
    unset); another namespace, another fleet's metrics, and a SEARCH expression are not judged."""

    def __init__(self, fleet_name: Optional[str]) -> None:
        self.fleet_name = fleet_name

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, cloudwatch.CfnAlarm):
            return
        stack = cdk.Stack.of(node)
        watched = [(node.namespace, node.metric_name, stack.resolve(node.dimensions) or [])]
        for query in stack.resolve(node.metrics) or []:
            metric = ((query or {}).get("metricStat") or {}).get("metric") or {}
            watched.append((metric.get("namespace"), metric.get("metricName"), metric.get("dimensions") or []))
        silent = [f"{ns} {name}" for ns, name, dimensions in watched
                  if ns in FLEET_NAMESPACES and self._ours(dimensions)]
        if silent:
            cdk.Annotations.of(node).add_error(
                f"metrics: the alarm {node.node.path} watches {silent[0]}, a custom metric the fleet sends only "
                "with metrics=True; it would never fire (custom metrics and their cost: docs/operations.md)")

    def _ours(self, dimensions: Sequence[Any]) -> bool:
        fleet = next((d.get("value") for d in dimensions if isinstance(d, dict) and d.get("name") == "fleet"), None)
        return fleet is None or self.fleet_name is None or fleet == self.fleet_name


@jsii.implements(cdk.IAspect)
class AlarmActions:
    """Adds ``actions`` to every alarm (``CfnAlarm``, ``CfnCompositeAlarm``) below where it is
    applied, once each, keeping the actions the alarm already has."""

    def __init__(self, actions: Sequence[cloudwatch.IAlarmAction]) -> None:
        self.actions = tuple(actions)

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, (cloudwatch.CfnAlarm, cloudwatch.CfnCompositeAlarm)):
            return
        parent = node.node.scope
        alarm = parent if isinstance(parent, cloudwatch.AlarmBase) else None
        if alarm is None:  # an L1 alarm of its own: actions bind to it by its ARN
            alarm = cloudwatch.Alarm.from_alarm_arn(node, "ForActions", node.attr_arn)
        bind_scope = parent if parent is not None else node
        ours = [action.bind(bind_scope, alarm).alarm_action_arn for action in self.actions]
        stack = cdk.Stack.of(node)
        own = stack.resolve(node.alarm_actions) or []
        merged = {json.dumps(a, sort_keys=True) for a in [*own, *stack.resolve(ours)]}
        if len(merged) > MAX_ALARM_ACTIONS:  # the deploy would fail on it
            cdk.Annotations.of(node).add_error(
                f"alarm_actions: the alarm {node.node.path} would have {len(merged)} actions (its own and the "
                f"fleet's); a CloudWatch alarm takes at most {MAX_ALARM_ACTIONS}")
        node.add_property_override("AlarmActions", cdk.Lazy.uncached_any(_Actions(node.alarm_actions, ours)))
