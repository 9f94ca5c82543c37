"""What the egress budget tells: per envelope per window, in CloudWatch embedded metric format
(namespace ``Rayito/Egress``), and one log line per decision with the trajectory ``step`` that
asked, so a count joins the reasoning step that produced it.

Per window and envelope (dimensions ``fleet`` and ``target``, the envelope's key: an origin or a
declared class, the same value ``EgressBudget``'s alarms watch; ``(invalid)`` for every URL that
is not a target, never the URL itself): ``Requests`` (requests that belong to it), ``Granted``,
``Deferrals`` (refused by it, or not decided because the store did not answer), ``DeferralRate``,
``RemainingAtDecision`` (only from decisions the store answered: an outage is not an exhausted
envelope), and the envelope in force: ``EnvelopeVersion``, ``EnvelopeRate`` (per second),
``EnvelopeBurst``. Per reason (dimensions ``fleet, target,
reason`` and ``fleet, reason``): ``Deferrals``, so ``limiter_unavailable`` (the store) is told
apart from ``budget_empty`` and ``backoff`` (the target).

The EMF records are written only when metrics are on: ``EmfRecorder(metrics=True)``, or, by
default, ``RAYITO_METRICS=on`` in the environment, which ``AgentFleet`` sets in the image it builds
from its own ``metrics=`` (off by default: custom metrics cost money). Off, the recorder writes no
EMF record at all, and the decision log lines (what the per-target queries read) stay.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TextIO

from .client import BUDGET_EMPTY, BACKOFF, Decision, Deferral
from ..model.egress_targets import envelope_of

NAMESPACE = "Rayito/Egress"
#: The switch the fleet sets in the image it builds: ``on`` (or true, 1, yes) writes metrics.
METRICS_ENV = "RAYITO_METRICS"
#: Reasons that belong to one envelope (the one that refused); the others are the whole request's.
_ENVELOPE_REASONS = (BUDGET_EMPTY, BACKOFF)


@dataclass
class _Counts:
    requests: int = 0
    granted: int = 0
    deferrals: dict[str, int] = field(default_factory=dict)
    remaining: Optional[float] = None
    version: Optional[int] = None
    rate: Optional[float] = None
    burst: Optional[int] = None


class EmfRecorder:
    """Pass ``recorder`` as ``BudgetClient(on_decision=recorder)``.

    A window is written when it is over: on the next decision, by a background thread that wakes
    once a window (``background=True``), and at ``close()``/process exit, so the last window is
    not lost.

    :param fleet: the ``fleet`` dimension.
    :param window_seconds: Default: 60.
    :param out: where EMF records and log lines go. Default: standard output.
    :param log_decisions: one JSON line per decision. Default: True.
    :param background: flush from a daemon thread once a window. Default: True.
    :param metrics: write the EMF records (custom metrics, billed per metric and dimension values
        per month). Default: ``RAYITO_METRICS`` of the environment (``on``, true, 1 or yes); unset
        is off, like the fleet's ``metrics=``.
    """

    def __init__(self, fleet: str, *, window_seconds: float = 60.0, out: TextIO = sys.stdout,
                 log_decisions: bool = True, clock: Callable[[], float] = time.time, background: bool = True,
                 metrics: Optional[bool] = None) -> None:
        self.fleet = fleet
        self.metrics = (os.environ.get(METRICS_ENV, "").strip().lower() in ("on", "true", "1", "yes")
                        if metrics is None else bool(metrics))
        """Whether EMF records are written (the decision log lines are, either way)."""
        self.window = window_seconds
        self.out = out
        self.log_decisions = log_decisions
        self.clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._counts: dict[str, _Counts] = {}
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._background = background
        ref = weakref.ref(self)
        self._atexit = lambda: (lambda r: r.close() if r is not None else None)(ref())
        atexit.register(self._atexit)

    def __call__(self, decision: Decision) -> None:
        deferred = isinstance(decision, Deferral)
        own = envelope_of(decision.target)
        belongs = decision.belongs if isinstance(decision, Deferral) else decision.charged
        envelopes = list(dict.fromkeys([envelope_of(t) for t in belongs] or [own]))
        with self._lock:
            for key in envelopes:
                c = self._counts.setdefault(key, _Counts())
                c.requests += 1
                if not deferred:
                    c.granted += 1
                elif decision.reason not in _ENVELOPE_REASONS or key == own:
                    c.deferrals[decision.reason] = c.deferrals.get(decision.reason, 0) + 1
                if decision.remaining is not None and (not deferred or key == own):
                    c.remaining = decision.remaining if c.remaining is None else min(c.remaining, decision.remaining)
                if key == own and decision.rate_per_second is not None:
                    c.version, c.rate, c.burst = decision.envelope_version, decision.rate_per_second, decision.burst
        if self.log_decisions:
            line: dict[str, Any] = {"event": "egress_deferred" if deferred else "egress_granted", "fleet": self.fleet,
                                    "target": decision.target, "envelope": own, "step": decision.step,
                                    "remaining": decision.remaining, "envelope_version": decision.envelope_version}
            if isinstance(decision, Deferral):
                line.update(reason=decision.reason, detail=decision.detail,
                            retry_after=round(decision.retry_after_seconds, 3), belongs=list(decision.belongs))
            else:
                line.update(charged=list(decision.charged))
            self._write(json.dumps(line))
        if self.clock() - self._start >= self.window:
            self.flush()
        elif self.metrics and self._background and self._thread is None and not self._closed.is_set():
            self._start_thread()

    def _start_thread(self) -> None:
        ref = weakref.ref(self)
        closed = self._closed
        window = self.window

        def run() -> None:
            while not closed.wait(window):
                recorder = ref()
                if recorder is None:  # pragma: no cover - the recorder was collected while the thread slept
                    return
                if recorder.clock() - recorder._start >= recorder.window:  # pragma: no branch - a decision flushed first
                    recorder.flush()
                del recorder

        self._thread = threading.Thread(target=run, name="egress-emf", daemon=True)
        self._thread.start()

    def _write(self, text: str) -> None:
        try:
            self.out.write(text + "\n")
            self.out.flush()
        except (ValueError, OSError):  # a closed stream at interpreter exit: nothing left to tell it
            pass

    def flush(self) -> list[dict[str, Any]]:
        """Write the window's EMF records (one per envelope, one per envelope and reason); returns
        them. An empty window writes nothing, and so does any window while metrics are off."""
        with self._lock:
            counts, self._counts = self._counts, {}
            self._start = self.clock()
        if not self.metrics:
            return []
        records: list[dict[str, Any]] = []
        stamp = int(self.clock() * 1000)
        for target, c in sorted(counts.items()):
            deferrals = sum(c.deferrals.values())
            metrics = [("Requests", "Count", c.requests), ("Granted", "Count", c.granted),
                       ("Deferrals", "Count", deferrals),
                       ("DeferralRate", "Percent", round(100.0 * deferrals / c.requests, 3) if c.requests else 0.0)]
            if c.remaining is not None:
                metrics.append(("RemainingAtDecision", "Count", c.remaining))
            if c.rate is not None:
                metrics += [("EnvelopeVersion", "None", c.version), ("EnvelopeRate", "Count/Second", c.rate),
                            ("EnvelopeBurst", "Count", c.burst)]
            record: dict[str, Any] = {
                "_aws": {"Timestamp": stamp, "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE, "Dimensions": [["fleet", "target"]],
                    "Metrics": [{"Name": name, "Unit": unit} for name, unit, _ in metrics]}]},
                "fleet": self.fleet, "target": target, **{name: value for name, _, value in metrics},
            }
            records.append(record)
            for reason, count in sorted(c.deferrals.items()):
                records.append({
                    "_aws": {"Timestamp": stamp, "CloudWatchMetrics": [{
                        "Namespace": NAMESPACE, "Dimensions": [["fleet", "target", "reason"], ["fleet", "reason"]],
                        "Metrics": [{"Name": "Deferrals", "Unit": "Count"}]}]},
                    "fleet": self.fleet, "target": target, "reason": reason, "Deferrals": count,
                })
        for record in records:
            self._write(json.dumps(record))
        return records

    def close(self) -> list[dict[str, Any]]:
        """Write the last window and stop the background thread."""
        self._closed.set()
        with contextlib.suppress(Exception):  # interpreter shutdown
            atexit.unregister(self._atexit)
        return self.flush()

    def __enter__(self) -> "EmfRecorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
