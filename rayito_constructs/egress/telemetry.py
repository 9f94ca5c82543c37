"""What the egress budget tells: per target per window, in CloudWatch embedded metric format
(namespace ``Rayito/Egress``, dimensions ``fleet`` and ``target``), and one log line per decision
with the trajectory ``step`` that asked, so a count joins the reasoning step that produced it."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable, TextIO

from .client import Decision, Deferral

NAMESPACE = "Rayito/Egress"


class EmfRecorder:
    """Pass ``recorder`` as ``BudgetClient(on_decision=recorder)``; call ``flush()`` each window
    (or let ``window_seconds`` do it on the next decision)."""

    def __init__(self, fleet: str, *, window_seconds: float = 60.0, out: TextIO = sys.stdout,
                 log_decisions: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.fleet = fleet
        self.window = window_seconds
        self.out = out
        self.log_decisions = log_decisions
        self.clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def __call__(self, decision: Decision) -> None:
        deferred = isinstance(decision, Deferral)
        with self._lock:
            c = self._counts[decision.target]
            c["Requests"] += 1
            c["Deferrals" if deferred else "Granted"] += 1
            c["RemainingAtDecision"] = decision.remaining
            c["EnvelopeVersion"] = decision.envelope_version
        if self.log_decisions:
            line: dict[str, Any] = {"event": "egress_deferred" if deferred else "egress_granted", "fleet": self.fleet,
                                    "target": decision.target, "step": decision.step, "remaining": decision.remaining,
                                    "envelope_version": decision.envelope_version}
            if deferred:
                line.update(reason=decision.reason, retry_after=round(decision.retry_after_seconds, 3))
            self.out.write(json.dumps(line) + "\n")
        if self.clock() - self._start >= self.window:
            self.flush()

    def flush(self) -> list[dict[str, Any]]:
        """Write one EMF record per target for the window; returns them."""
        with self._lock:
            counts, self._counts = self._counts, defaultdict(lambda: defaultdict(float))
            self._start = self.clock()
        records = []
        for target, c in sorted(counts.items()):
            requests = c["Requests"] or 1
            record = {
                "_aws": {"Timestamp": int(self.clock() * 1000), "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE, "Dimensions": [["fleet", "target"]],
                    "Metrics": [{"Name": "Granted", "Unit": "Count"}, {"Name": "Deferrals", "Unit": "Count"},
                                {"Name": "DeferralRate", "Unit": "Percent"},
                                {"Name": "RemainingAtDecision", "Unit": "Count"},
                                {"Name": "EnvelopeVersion", "Unit": "None"}]}]},
                "fleet": self.fleet, "target": target, "Granted": c["Granted"], "Deferrals": c["Deferrals"],
                "DeferralRate": round(100.0 * c["Deferrals"] / requests, 3),
                "RemainingAtDecision": c["RemainingAtDecision"], "EnvelopeVersion": c["EnvelopeVersion"],
            }
            self.out.write(json.dumps(record) + "\n")
            records.append(record)
        return records
