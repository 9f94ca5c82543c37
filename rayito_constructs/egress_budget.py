"""``EgressBudget``: the store of per-target egress envelopes a fleet's agents share
(docs/egress-budgets.md). The agents take tokens with ``rayito_constructs.egress.BudgetClient``."""

from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._tables import state_table
from .monitoring import Operations, create_alarm

from .egress.client import BUDGET_EMPTY, LIMITER_UNAVAILABLE, REASONS
from .model.egress_targets import declared_target
from .egress.telemetry import NAMESPACE
from .model.options import EgressBudgetOptions
from .permissions import table_key_statement


class EgressBudget(Construct):
    """A table of token buckets, one per external target, and its alarms.

    :param fleet_name: the fleet whose agents use it (the metrics' ``fleet`` dimension).
    :param envelopes: the declared envelopes; each gets an exhaustion alarm (requests deferred
        for an empty budget in each of 10 minutes) and a deferral-rate alarm (over 20% of its
        requests deferred, summed over every agent process, for 15 minutes), on the ``target``
        dimension ``EmfRecorder`` emits (the envelope's key); and the fleet one alarm for a store
        that does not answer.
    :param encryption_key: Default: an AWS managed key.
    :param removal_policy: Default: ``DESTROY``: buckets are seconds-long state; the envelope
        history goes with them (keep it with ``RETAIN``).
    :param metrics: the agents' ``EmfRecorder`` sends the metrics (``RAYITO_METRICS=on`` in their
        image, which ``AgentFleet`` sets when it builds the image). Default: the fleet's
        ``metrics`` (off outside a fleet).
    :param table_name: a fixed physical name, for a name baked into the agents' image at synth.
        Default: one CloudFormation makes.
    :param alarms: the alarms above; they watch custom metrics, so True while metrics are off is
        a synth error. Default: when metrics are on.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet_name: str,
        envelopes: Sequence[EgressBudgetOptions] = (),
        encryption_key: Optional[kms.IKey] = None,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
        alarms: Optional[bool] = None,
        metrics: Optional[bool] = None,
        table_name: Optional[str] = None,
    ) -> None:
        seen: set[str] = set()
        for envelope in envelopes:  # one envelope per target (EgressOptions checks the project's)
            if envelope.target in seen:
                raise ValueError(f"envelopes: {envelope.target!r} is declared twice: one envelope per target")
            seen.add(envelope.target)
        super().__init__(scope, id)
        self.metrics = Operations.of(self).metrics if metrics is None else metrics
        """Whether the agents send the egress metrics."""
        self.fleet_name = fleet_name
        self.envelopes = tuple(envelopes)
        self.table = state_table(
            self, "Table", partition_key="target", sort_key="item", encryption_key=encryption_key,
            removal_policy=removal_policy, table_name=table_name,
        )
        """The buckets and the envelope history."""
        self.alarms: list[cloudwatch.Alarm] = []
        if self.metrics if alarms is None else alarms:
            for envelope in self.envelopes:
                self.alarms.extend(self._alarms_for(envelope.target))
            # Failing closed means a store outage stops every agent's egress: say so, apart from
            # any target being exhausted.
            self.alarms.append(self._alarm(
                "StoreUnavailable", self.metric_deferrals(LIMITER_UNAVAILABLE), threshold=1, evaluation_periods=3,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                alarm_description=f"{self.fleet_name}: the egress budget store did not answer for 3 minutes; "
                                  "requests are deferred (fail closed)"))

    @property
    def table_name(self) -> str:
        return self.table.table_name

    def grant_acquire(self, grantee: iam.IGrantable) -> iam.Grant:
        """What ``BudgetClient`` needs: conditional updates of buckets, reads, envelope versions."""
        grant = self.table.grant(
            grantee, "dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem"
        )
        key = self.table.encryption_key
        if key is not None:  # the customer key, through DynamoDB only (kms:ViaService)
            region = cdk.Stack.of(self).region
            grant = grant.combine(table_key_statement("EgressBudgetKey", key.key_arn, region).grant(grantee, self))
        return grant

    def metric(self, name: str, target: str, **props: object) -> cloudwatch.Metric:
        """``Requests``, ``Granted``, ``Deferrals``, ``DeferralRate``, ``RemainingAtDecision``,
        ``EnvelopeVersion``, ``EnvelopeRate`` or ``EnvelopeBurst`` of one envelope: an origin or a
        declared class, written as declared (``https://api.example.com/v1/search?region``: the
        value ``EmfRecorder`` emits for every region of that class)."""
        props.setdefault("period", cdk.Duration.minutes(1))
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name=name,
                                 dimensions_map={"fleet": self.fleet_name, "target": declared_target(target)}, **props)

    def metric_deferrals(self, reason: str, **props: object) -> cloudwatch.Metric:
        """Deferrals of the whole fleet for one reason (``budget_empty``, ``backoff``,
        ``limiter_unavailable``, ``invalid_target``, ``invalid_cost``), summed per period."""
        if reason not in REASONS:
            raise ValueError(f"reason: {reason!r} is not one of {', '.join(REASONS)}")
        props.setdefault("period", cdk.Duration.minutes(1))
        props.setdefault("statistic", "Sum")
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name="Deferrals",
                                 dimensions_map={"fleet": self.fleet_name, "reason": reason}, **props)

    def metric_requests(self, target: str, **props: object) -> cloudwatch.Metric:
        """Requests that belong to one envelope, granted or not, summed per period."""
        props.setdefault("statistic", "Sum")
        return self.metric("Requests", target, **props)

    def metric_granted(self, target: str, **props: object) -> cloudwatch.Metric:
        props.setdefault("statistic", "Sum")
        return self.metric("Granted", target, **props)

    def metric_target_deferrals(self, target: str, reason: Optional[str] = None, **props: object) -> cloudwatch.Metric:
        """Requests one envelope deferred, summed per period: for every reason, or for one
        (``budget_empty`` and ``backoff`` count on the envelope that refused; the metric with
        dimensions ``fleet, target, reason`` exists once that reason was seen)."""
        props.setdefault("statistic", "Sum")
        if reason is None:
            return self.metric("Deferrals", target, **props)
        if reason not in REASONS:
            raise ValueError(f"reason: {reason!r} is not one of {', '.join(REASONS)}")
        props.setdefault("period", cdk.Duration.minutes(1))
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name="Deferrals", dimensions_map={
            "fleet": self.fleet_name, "target": declared_target(target), "reason": reason}, **props)

    def metric_exhausted(self, target: str, **props: object) -> cloudwatch.Metric:
        """Requests one envelope refused because its budget was empty (``budget_empty``), summed
        per period: what the exhaustion alarm watches. An envelope used near its burst without a
        refusal is in use, not exhausted."""
        return self.metric_target_deferrals(target, BUDGET_EMPTY, **props)

    def metric_deferral_rate(self, target: str, **props: object) -> cloudwatch.MathExpression:
        """Percent of one envelope's requests deferred, over the whole fleet:
        ``100 * Sum(Deferrals) / Sum(Requests)`` per period (a metric math expression of two
        metrics, one series: what an alarm may watch). Not the ``Average`` of the recorder's
        ``DeferralRate``: that is each agent process's own rate, unweighted, so one busy process
        at 50% beside nine idle ones at 0% would read 5%. ``props``: the expression's (``period``,
        default one minute; ``label``...)."""
        props.setdefault("period", cdk.Duration.minutes(1))
        period = props["period"]
        return cloudwatch.MathExpression(
            expression="100 * deferred / requests",
            using_metrics={"deferred": self.metric_target_deferrals(target, period=period),
                           "requests": self.metric_requests(target, period=period)},
            **props)

    def metric_remaining(self, target: str, **props: object) -> cloudwatch.Metric:
        """Tokens left at decision (``Minimum`` per period), after the grant: an envelope used at
        its burst reads below 1 without refusing anything, so this is a gauge of headroom, not of
        exhaustion (:meth:`metric_exhausted` is)."""
        props.setdefault("statistic", "Minimum")
        return self.metric("RemainingAtDecision", target, **props)

    def _alarm(self, id: str, metric: cloudwatch.IMetric, **props: object) -> cloudwatch.Alarm:
        return create_alarm(self, id, metric, option="alarms=True", metrics=self.metrics,
                            off_hint="leave alarms unset", treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                            **props)

    def _alarms_for(self, target: str) -> list[cloudwatch.Alarm]:
        key = hashlib.sha256(target.encode()).hexdigest()[:8]
        return [
            # Exhausted: it refused requests for an empty budget in each of 10 minutes. Not the
            # tokens left at decision: they are counted after a grant, so light use of a small
            # burst reads below 1 with nothing refused.
            self._alarm(f"Exhausted{key}", self.metric_exhausted(target), threshold=1, evaluation_periods=10,
                        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                        alarm_description=f"{self.fleet_name}: the envelope of {target} has been exhausted for 10 minutes "
                                          "(requests deferred for an empty budget, budget_empty, in each minute)"),
            self._alarm(f"Deferrals{key}", self.metric_deferral_rate(target, period=cdk.Duration.minutes(5)),
                        threshold=20, evaluation_periods=3,
                        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                        alarm_description=f"{self.fleet_name}: over 20% of requests to {target} deferred for 15 minutes"),
        ]
