"""What the reconciler tells: a timeline of decisions (one structured log line each) and metrics in
CloudWatch embedded metric format, namespace ``Rayito/Fleet``, dimension ``fleet`` (and
``operation`` for deferrals and throttles).

Metrics are sent only when the fleet turned them on (``RAYITO_METRICS=on``, which the construct
sets from ``AgentFleet(metrics=...)``, off by default): off, not one EMF line is printed, so the fleet
pays for no custom metric, and the decisions still go to the log, line for line the same.

Event fields never use a name ``logging.LogRecord`` reserves (``message``, ``name``, ``msg``,
``args``, ...): Python's logging raises ``KeyError: "Attempt to overwrite 'message' in LogRecord"``
on them, which under Powertools crashed the tick on its first API error. :func:`safe_fields`
renames any such key (``message`` -> ``message_``) as a last line of defence.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import defaultdict
from typing import Any, Optional

NAMESPACE = "Rayito/Fleet"
SERVICE = "rayito-reconciler"
#: The switch: ``on`` (or true, 1, yes) sends metrics; anything else, or nothing, sends none.
METRICS_ENV = "RAYITO_METRICS"


def metrics_enabled(env: Optional[dict[str, str]] = None) -> bool:
    """Whether this function sends custom metrics (``RAYITO_METRICS``)."""
    import os

    value = (os.environ if env is None else env).get(METRICS_ENV, "")
    return str(value).strip().lower() in ("on", "true", "1", "yes")

#: Metric names and units; the construct's ``metric_*`` methods use the same names.
METRICS = {
    "LiveBaseVMs": "Count",
    "DesiredBaseVMs": "Count",
    "ParkedSlots": "Count",
    "DesiredParkedSlots": "Count",
    "Members": "Count",
    "LiveVMs": "Count",
    "Deficit": "Count",
    "DeadLetteredSlots": "Count",
    "WaitTime": "Seconds",
    "ClaimToComplete": "Seconds",
    "RunMicrovmAttempts": "Count",
    "SlotsFilled": "Count",
    "RetryAmplification": "None",
    "Deferrals": "Count",
    "Throttles": "Count",
    "InDoubtRuns": "Count",
    "StrayVMs": "Count",
    "OldestStrayAge": "Seconds",
    "StraysTerminated": "Count",
}

#: Attributes of every ``logging.LogRecord`` (and what ``Logger.makeRecord`` refuses in ``extra``).
RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def safe_fields(event: dict[str, Any]) -> dict[str, Any]:
    """The event's fields, with any name logging reserves renamed (``message`` -> ``message_``)."""
    return {(f"{k}_" if k in RESERVED else k): v for k, v in event.items()}


def unit_of(name: str) -> str:
    """The CloudWatch unit of a metric (``Seconds``, ``Count`` or ``None``)."""
    return METRICS.get(name, "Count")


class MemoryTelemetry:
    """Keeps everything in lists: for tests and the benchmark."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.by_operation: dict[tuple[str, str], float] = defaultdict(float)

    def event(self, fleet: str, event: dict[str, Any]) -> None:
        clash = RESERVED & (event.keys() - {"event"})
        # uncovered: MemoryTelemetry is the tests' telemetry; no event of the reconciler uses a reserved key (the guard is there to catch one)
        if clash:  # as strict as logging is under Powertools: a test sees the crash production would
            raise KeyError(f"Attempt to overwrite {sorted(clash)!r} in LogRecord")
        self.events.append({"fleet": fleet, **event})

    def metric(self, fleet: str, name: str, value: float, operation: Optional[str] = None) -> None:
        self.metrics[name].append(value)
        if operation:
            self.by_operation[(name, operation)] += value

    def flush(self) -> None:
        pass


class PowertoolsTelemetry:
    """Powertools Logger (timeline) and Metrics (EMF) in the Lambda function."""

    def __init__(self, fleet: str, *, metrics: bool = True) -> None:
        from aws_lambda_powertools import Logger, Metrics
        from aws_lambda_powertools.metrics import MetricUnit

        self._unit = MetricUnit
        self.logger = Logger(service=SERVICE, log_uncaught_exceptions=True)
        self.logger.append_keys(fleet=fleet)
        self.metrics = None
        if metrics:  # off: no Metrics object at all, so nothing can print an EMF line
            self.metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
            self.metrics.set_default_dimensions(fleet=fleet)
        self._fleet = fleet

    def event(self, fleet: str, event: dict[str, Any]) -> None:
        self.logger.info(event["event"], extra=safe_fields({k: v for k, v in event.items() if k != "event"}))

    def metric(self, fleet: str, name: str, value: float, operation: Optional[str] = None) -> None:
        if self.metrics is None:
            return
        unit = self._unit(unit_of(name))  # by value: MetricUnit("Seconds"), MetricUnit("None") = NoUnit
        if operation is None:
            self.metrics.add_metric(name=name, unit=unit, value=value)
            return
        from aws_lambda_powertools.metrics import single_metric

        with single_metric(name=name, unit=unit, value=value, namespace=NAMESPACE,
                           default_dimensions={"fleet": fleet, "service": SERVICE}) as metric:
            metric.add_dimension(name="operation", value=operation)

    def flush(self) -> None:
        if self.metrics is not None:
            self.metrics.flush_metrics()


class EmfTelemetry:
    """Embedded metric format and JSON log lines without Powertools (when its layer is missing)."""

    def __init__(self, fleet: str, out: Any = None, *, metrics: bool = True) -> None:
        self.fleet = fleet
        self.out = out or sys.stdout
        self.send_metrics = metrics
        self._metrics: list[tuple[str, float, Optional[str]]] = []

    def event(self, fleet: str, event: dict[str, Any]) -> None:
        fields = safe_fields({k: v for k, v in event.items() if k != "event"})
        self.out.write(json.dumps({"level": "INFO", "service": SERVICE, "fleet": fleet,
                                   "message": event["event"], **fields}, default=str) + "\n")

    def metric(self, fleet: str, name: str, value: float, operation: Optional[str] = None) -> None:
        if self.send_metrics:
            self._metrics.append((name, value, operation))

    def flush(self) -> None:
        import time as _time

        metrics, self._metrics = self._metrics, []
        for name, value, operation in metrics:
            dimensions = ["fleet", "service"] + (["operation"] if operation else [])
            record: dict[str, Any] = {
                "_aws": {"Timestamp": int(_time.time() * 1000), "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE, "Dimensions": [dimensions],
                    "Metrics": [{"Name": name, "Unit": unit_of(name)}]}]},
                "fleet": self.fleet, "service": SERVICE, name: value,
            }
            if operation:
                record["operation"] = operation
            self.out.write(json.dumps(record) + "\n")


class JsonTelemetry(MemoryTelemetry):
    """Plain JSON lines on stdout, for running a reconciler by hand without Powertools."""

    def event(self, fleet: str, event: dict[str, Any]) -> None:
        # uncovered: JsonTelemetry is for running a reconciler by hand; no test uses it
        super().event(fleet, event)
        sys.stdout.write(json.dumps({"fleet": fleet, **event}) + "\n")
