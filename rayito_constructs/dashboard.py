"""``FleetDashboard``: one CloudWatch dashboard per fleet (docs/operations.md).

What the dispatcher essay (seed 004) says to watch, per fleet: queue depth (the reconciler's
``Deficit``), wait time (queued to RunMicrovm sent), claim-to-complete (RunMicrovm to RUNNING or
SUSPENDED), retry amplification (attempts per slot filled); the control plane's deferrals and
throttles per operation; dead letters; strays; the recipe's outcome at deploy; and, per the egress
essay (seed 002), requests, deferrals, deferral rate and the envelope in force per target.

Every graph reads the same ``metric_*`` methods the alarms use, so a graph and its alarm never
disagree on a name, a dimension or a statistic. The dashboard shows custom metrics: it exists only
with the fleet's ``metrics=True`` (a dashboard of graphs nobody feeds is refused at synth).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from .egress.client import REASONS
from .model.egress_targets import declared_target
from .egress.telemetry import NAMESPACE as EGRESS_NAMESPACE
from .model.names import fleet_name_problem

if TYPE_CHECKING:  # pragma: no cover
    from .egress_budget import EgressBudget
    from .queries import FleetQueries
    from .recipe_parameter import RecipeParameter
    from .reconciler import FleetReconciler

#: PutDashboard's ``DashboardName``: "The maximum length is 255, and valid characters are A-Z,
#: a-z, 0-9, "-", and "_"" (CloudWatch API Reference, PutDashboard). Dashboards are global to an
#: account: the default name carries the region.
DASHBOARD_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}", re.ASCII)
_W = 6  # four graphs a row (a dashboard is 24 units wide)
_H = 6


def _label(metric: cloudwatch.Metric, label: str) -> cloudwatch.Metric:
    return metric.with_(label=label)


def dashboard_name_problem(name: object) -> None:
    """A one-line ``ValueError`` unless ``name`` is a dashboard name (or a token CloudFormation
    fills in)."""
    if isinstance(name, str) and cdk.Token.is_unresolved(name):
        return
    if not isinstance(name, str) or not DASHBOARD_NAME.fullmatch(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80] + "...")
        why = "is longer than 255 characters" if isinstance(name, str) and len(name) > 255 else \
            "must be 1 to 255 of A-Z, a-z, 0-9, '-' and '_'"
        raise ValueError(f"dashboard_name: {shown} {why} (CloudWatch PutDashboard)")


def default_dashboard_name(fleet_name: str, region: str) -> str:
    """``Rayito-<fleet>-<region>``: a fleet name is at most 64 characters, so this fits 255."""
    name = f"Rayito-{fleet_name}-{region}"
    if not cdk.Token.is_unresolved(region):
        dashboard_name_problem(name)
    return name


class FleetDashboard(Construct):
    """The fleet's dashboard: capacity, admission, control plane, dead letters and strays, the
    reconciler function, the recipe, and egress per target.

    :param fleet_name: the fleet.
    :param reconciler: the fleet's reconciler. Default: none (its rows are left out).
    :param recipe: the fleet's recipe parameter. Default: none.
    :param egress_budget: the fleet's egress budget. Default: none.
    :param queries: the fleet's saved queries, named in the dashboard's header. Default: none.
    :param alarms: alarms shown in the header's status widget. Default: none.
    :param dashboard_name: 1 to 255 of ``A-Za-z0-9_-`` (PutDashboard's rule). Default:
        ``Rayito-<fleet>-<region>`` (dashboard names are global to an account, so the region keeps
        one fleet name in two regions apart; two fleets of a region have two names).
    :param amplification_threshold: drawn on the amplification graph. Default: 1.5 (the alarm's).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet_name: str,
        reconciler: Optional["FleetReconciler"] = None,
        recipe: Optional["RecipeParameter"] = None,
        egress_budget: Optional["EgressBudget"] = None,
        queries: Optional["FleetQueries"] = None,
        alarms: Sequence[cloudwatch.IAlarm] = (),
        dashboard_name: Optional[str] = None,
        amplification_threshold: float = 1.5,
    ) -> None:
        problem = fleet_name_problem(fleet_name)
        if problem:
            raise ValueError(f"fleet_name: {problem}")
        if dashboard_name is not None:
            dashboard_name_problem(dashboard_name)
        super().__init__(scope, id)
        self.fleet_name = fleet_name
        name = dashboard_name if dashboard_name is not None else default_dashboard_name(fleet_name, cdk.Stack.of(self).region)
        self.dashboard = cloudwatch.Dashboard(
            self, "Resource", dashboard_name=name,
            default_interval=cdk.Duration.hours(3),
            period_override=cloudwatch.PeriodOverride.AUTO,
        )
        """The ``AWS::CloudWatch::Dashboard``."""
        self.dashboard_name = name
        self.widgets: list[cloudwatch.IWidget] = []
        """Every widget, in order (tests read their metrics)."""
        self._header(queries, alarms)
        if reconciler is not None:
            self._reconciler(reconciler, amplification_threshold)
        if recipe is not None:
            self._row([cloudwatch.SingleValueWidget(
                title="Recipe saved / not saved (deploys in the range)", width=_W * 2, height=_H // 2 + 1,
                set_period_to_time_range=True,
                metrics=[_label(recipe.metric_saved(statistic="Sum"), "saved"),
                         _label(recipe.metric_not_saved(statistic="Sum"), "not saved")])])
        if egress_budget is not None:
            self._egress(egress_budget)

    # ------------------------------------------------------------------ rows

    def _row(self, widgets: Sequence[cloudwatch.IWidget]) -> None:
        self.widgets.extend(widgets)
        self.dashboard.add_widgets(*widgets)

    def _header(self, queries: Optional["FleetQueries"], alarms: Sequence[cloudwatch.IAlarm]) -> None:
        lines = [f"# Rayito fleet {self.fleet_name}",
                 "Custom metrics of namespaces `Rayito/Fleet` and `Rayito/Egress`, dimension `fleet`."]
        if queries is not None and queries.definitions:
            saved = ", ".join(f"`{queries.query_name(short)}`" for short in queries.definitions)
            lines.append(f"Logs Insights, saved queries: {saved}.")
        header: list[cloudwatch.IWidget] = [cloudwatch.TextWidget(markdown="\n\n".join(lines), width=12, height=_H // 2 + 1)]
        if alarms:
            header.append(cloudwatch.AlarmStatusWidget(alarms=list(alarms), title="Alarms", width=12,
                                                       height=_H // 2 + 1))
        self._row(header)

    def _reconciler(self, r: "FleetReconciler", threshold: float) -> None:
        self._row([
            cloudwatch.GraphWidget(title="Base VMs: live / desired", width=_W, height=_H, left=[
                _label(r.metric_live_base_vms(), "live"), _label(r.metric("DesiredBaseVMs", statistic="Maximum"), "desired")]),
            cloudwatch.GraphWidget(title="Parked slots: parked / desired", width=_W, height=_H, left=[
                _label(r.metric_parked_slots(), "parked"),
                _label(r.metric("DesiredParkedSlots", statistic="Maximum"), "desired")]),
            cloudwatch.GraphWidget(title="Deficit: slots waiting for a VM (queue depth)", width=_W, height=_H, left=[
                _label(r.metric_deficit(), "deficit"), _label(r.metric("InDoubtRuns", statistic="Maximum"), "in doubt")]),
            cloudwatch.GraphWidget(title="VMs of the fleet", width=_W, height=_H, left=[
                _label(r.metric("LiveVMs", statistic="Maximum"), "live"),
                _label(r.metric("Members", statistic="Maximum"), "members")]),
        ])
        self._row([
            cloudwatch.GraphWidget(title="Wait time: queued to RunMicrovm sent (s)", width=_W, height=_H, left=[
                _label(r.metric_wait_time(statistic=stat), stat) for stat in ("p50", "p90", "Maximum")]),
            cloudwatch.GraphWidget(title="Claim to complete: RunMicrovm to running or parked (s)", width=_W, height=_H,
                                   left=[_label(r.metric_claim_to_complete(statistic=stat), stat)
                                         for stat in ("p50", "p90", "Maximum")]),
            cloudwatch.GraphWidget(title="Retry amplification: attempts per slot filled", width=_W, height=_H,
                                   left=[_label(r.metric_retry_amplification(), "amplification")],
                                   left_annotations=[cloudwatch.HorizontalAnnotation(value=threshold, label="alarm")]),
            cloudwatch.GraphWidget(title="RunMicrovm attempts / slots filled", width=_W, height=_H, left=[
                _label(r.metric("RunMicrovmAttempts", statistic="Sum"), "attempts"),
                _label(r.metric("SlotsFilled", statistic="Sum"), "filled")]),
        ])
        from .reconciler import OPERATIONS

        self._row([
            cloudwatch.GraphWidget(title="Control-plane budget deferrals per operation", width=_W * 2, height=_H,
                                   left=[_label(r.metric_deferrals(op), op) for op in OPERATIONS]),
            cloudwatch.GraphWidget(title="Throttles (429) per operation", width=_W * 2, height=_H,
                                   left=[_label(r.metric_throttles(op), op) for op in OPERATIONS]),
        ])
        fn = r.function
        self._row([
            cloudwatch.GraphWidget(title="Dead letters", width=_W, height=_H, left=[
                _label(r.metric_dead_letters(statistic="Maximum"), "in the queue"),
                _label(r.metric_dead_lettered_slots(), "dead-lettered slots")]),
            cloudwatch.GraphWidget(title="Strays: foreign VMs of the image", width=_W, height=_H, left=[
                _label(r.metric_stray_vms(), "strays"), _label(r.metric("StraysTerminated", statistic="Sum"), "ended")],
                right=[_label(r.metric_oldest_stray_age(), "oldest unowned (s)")]),
            cloudwatch.GraphWidget(title="Reconciler function", width=_W, height=_H, left=[
                _label(fn.metric_invocations(statistic="Sum"), "invocations"),
                _label(fn.metric_errors(statistic="Sum"), "errors"),
                _label(fn.metric_throttles(statistic="Sum"), "throttles")],
                right=[_label(fn.metric_duration(statistic="p90"), "duration p90 (ms)")]),
        ])

    def _egress(self, e: "EgressBudget") -> None:
        def search(dimensions: str, where: str) -> cloudwatch.MathExpression:
            # Every target, declared or the default envelope of an origin: one line each.
            text = (f"SEARCH('{{{EGRESS_NAMESPACE},{dimensions}}} MetricName=\"Deferrals\" "
                    f"fleet=\"{self.fleet_name}\"{where}', 'Sum', 60)")
            return cloudwatch.MathExpression(expression=text, using_metrics={}, label="",
                                             period=cdk.Duration.minutes(1))

        self._row([
            cloudwatch.GraphWidget(title="Egress deferrals by reason", width=_W, height=_H,
                                   left=[_label(e.metric_deferrals(reason), reason) for reason in REASONS]),
            cloudwatch.GraphWidget(title="Egress deferrals per target (declared or default)", width=_W,
                                   height=_H, left=[search("fleet,target", "")]),
            cloudwatch.GraphWidget(title="Egress deferrals per target and reason", width=_W, height=_H,
                                   left=[search("fleet,reason,target", "")]),
            cloudwatch.GraphWidget(title="Egress throttled by a target (429/503): deferred by its backoff",
                                   width=_W, height=_H, left=[search("fleet,reason,target", ' reason=\"backoff\"')]),
        ])
        for envelope in e.envelopes:
            target = declared_target(envelope.target)
            self._row([
                # The deferral rate is the fleet's (deferred over requests, every process summed)
                # and "exhausted" counts refusals for an empty budget: what the alarms watch.
                cloudwatch.GraphWidget(title=f"Egress {target}: requests", width=_W * 2, height=_H, left=[
                    _label(e.metric_requests(target), "requests"), _label(e.metric_granted(target), "granted"),
                    _label(e.metric_target_deferrals(target), "deferred"),
                    _label(e.metric_exhausted(target), "deferred: budget empty (exhausted)")],
                    right=[e.metric_deferral_rate(target, label="deferral rate (%)")]),
                cloudwatch.GraphWidget(title=f"Egress {target}: envelope in force", width=_W * 2, height=_H, left=[
                    _label(e.metric_remaining(target), "tokens left at decision"),
                    _label(e.metric("EnvelopeBurst", target, statistic="Maximum"), "burst")],
                    right=[_label(e.metric("EnvelopeRate", target, statistic="Maximum"), "rate (per second)")]),
            ])
