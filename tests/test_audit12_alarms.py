"""Audit round 12 (alarms and synth-time checks): the four breaks of the operations surface
found by the audit (branch audit14, tests/test_audit12_front.py). Each test states what a user or
the spec expects."""

from __future__ import annotations

import pytest


def test_an_alarm_action_topic_in_another_region_is_refused_at_synth() -> None:
    """CloudWatch sends an alarm's actions only to an SNS topic of the alarm's own region:
    PutMetricAlarm answers ``ValidationError: Invalid region ca-central-1 specified. Only
    us-west-2 is supported.`` (cds-snc/notification-terraform#128), so the stack fails at deploy
    on its first alarm. The fleet parses the ARN at synth (``check_alarm_actions``); a region other
    than the stack's must be the same kind of one-line error, not a template CloudFormation
    rejects."""
    from rayito_constructs import AgentFleet, AgentProject

    from .cdk_helpers import new_app, new_stack
    from .conftest import EXAMPLE

    stack = new_stack(new_app(), "Ops")  # us-east-1
    with pytest.raises(ValueError, match="alarm_actions"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                   alarm_actions="arn:aws:sns:eu-west-1:123456789012:ops")


@pytest.mark.parametrize("kwargs", [
    pytest.param({"deficit_minutes": 2000}, id="deficit-longer-than-a-day"),
    pytest.param({"amplification_threshold": float("nan")}, id="amplification-nan"),
    pytest.param({"stray_seconds": -5}, id="stray-seconds-negative"),
])
def test_add_alarms_refuses_values_cloudwatch_refuses_with_one_line(kwargs) -> None:
    """``FleetReconciler.add_alarms`` is documented (docs/reconciler.md) and takes numbers a user
    types. PutMetricAlarm refuses ``EvaluationPeriods x Period`` above one day (2000 one-minute
    periods), a NaN threshold crashes synth with a JSONDecodeError traceback, and a negative
    ``stray_seconds`` makes an alarm that is always in ALARM. Each should be a one-line
    ValueError naming the argument, like every other option of the fleet."""
    from aws_cdk.assertions import Template

    from rayito_constructs import AgentFleet, AgentProject

    from .cdk_helpers import new_app, new_stack
    from .conftest import EXAMPLE

    stack = new_stack(new_app(), "Alarms")
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), build_image=False, metrics=True,
                       reconciler_alarms=False)
    assert fleet.reconciler is not None
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        fleet.reconciler.add_alarms(custom_metrics=True, **kwargs)
        Template.from_stack(stack)


