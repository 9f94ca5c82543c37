"""What every template the tests synthesize keeps about the operations surface (docs/operations.md),
checked by the session gate in tests/conftest.py:

* below a fleet whose metrics are off, no alarm watches a custom metric (any namespace but
  ``AWS/...``): it would never fire, and a dashboard of such metrics would stay empty, so there is
  none either;
* below a fleet given ``alarm_actions``, every alarm (``AWS::CloudWatch::Alarm`` and
  ``CompositeAlarm``, whoever made it) has at least as many actions as the fleet was given, and
  every SNS topic among them.

``expectations(stack)`` reads what each fleet of a stack decided (its ``Operations``) and which
alarms lie below it, when the template is taken from the stack object; ``violations`` checks a
template against that.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch

ALARM_TYPES = ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm")


def expectations(stack: cdk.Stack) -> list[dict[str, Any]]:
    """One entry per fleet of ``stack``: its path, metrics switch, the number of actions, the topic
    ARNs (as the template holds them), the logical ids of the alarms and dashboards below it."""
    from rayito_constructs.monitoring import Operations

    found = []
    for node in stack.node.find_all():
        operations = getattr(node, Operations._ATTRIBUTE, None)
        if not isinstance(operations, Operations) or cdk.Stack.of(node) is not stack:
            continue
        alarms, dashboards = [], []
        for child in node.node.find_all():
            if isinstance(child, (cloudwatch.CfnAlarm, cloudwatch.CfnCompositeAlarm)):
                alarms.append(stack.resolve(stack.get_logical_id(child)))
            elif isinstance(child, cloudwatch.CfnDashboard):
                dashboards.append(stack.resolve(stack.get_logical_id(child)))
        found.append({"fleet": node.node.path, "metrics": operations.metrics,
                      "actions": len(operations.alarm_actions), "topics": list(operations.alarm_topic_arns),
                      "alarms": alarms, "dashboards": dashboards})
    return found


def _namespaces(props: dict[str, Any]) -> list[str]:
    if "Namespace" in props:
        return [props["Namespace"]]
    return [m["MetricStat"]["Metric"]["Namespace"] for m in props.get("Metrics", []) if "MetricStat" in m]


def violations(template: dict[str, Any], fleets: list[dict[str, Any]]) -> list[str]:
    resources = template.get("Resources", {})
    found = []
    for fleet in fleets:
        for logical_id in fleet["alarms"]:
            resource = resources.get(logical_id)
            if resource is None or resource["Type"] not in ALARM_TYPES:
                found.append(f"{fleet['fleet']}: alarm {logical_id} is not in the template")
                continue
            props = resource.get("Properties", {})
            if not fleet["metrics"]:
                custom = [n for n in _namespaces(props) if not str(n).startswith("AWS/")]
                if custom:
                    found.append(f"{fleet['fleet']}: alarm {logical_id} watches {custom[0]} while metrics are off")
            if fleet["actions"]:
                actions = props.get("AlarmActions") or []
                have = {json.dumps(a, sort_keys=True) for a in actions}
                missing = [t for t in fleet["topics"] if json.dumps(t, sort_keys=True) not in have]
                if len(actions) < fleet["actions"] or missing:
                    found.append(f"{fleet['fleet']}: alarm {logical_id} has actions {actions}, "
                                 f"not the fleet's {fleet['actions']} ({fleet['topics']})")
        if not fleet["metrics"] and fleet["dashboards"]:
            found.append(f"{fleet['fleet']}: a dashboard while metrics are off")
    return found
