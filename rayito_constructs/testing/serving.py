"""``VirtualServer``: the fleet's server function (``lambdas/reconciler/server.py``) in virtual time.

The real server serves a VM through its rayd (the product's client code over gRPC): that needs a
hosted VM (``MicrovmsEmulator(host_vms=True)``) and real time. For the reconciler's scheduling
(hundreds of fleets, hours of virtual time) this stand-in answers each ask the way the server
would, at the time it would: when the emulator has the VM running, plus rayd's readiness and the
agent host's start (a base slot's VM) or the pool's settling (a parked slot's), from
:mod:`.measured`; a VM that is not running (ended, unknown) is a failure, as the server's
readiness poll would find it. The answer goes to the fleet's ledger exactly as the server writes it
(``put_fact``), with its ``at`` in the future when the VM is not ready yet: the reconciler reads
nothing before its clock reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import measured
from .backend import MicrovmsBackend


@dataclass
class VirtualServer:
    """Answers the reconciler's asks (``ask(request)``, the server function's event) in ``ledger``
    (a ``MemoryLedger`` or ``DynamoDBLedger`` of the reconciler's).

    :param serve_seconds: rayd ready to the agent host ready (a base slot's VM).
    :param warm_seconds: rayd ready to warmed (a parked slot's VM).
    :param failures: how the next asks fail: each entry is the reason of one failed answer.
    """

    backend: MicrovmsBackend
    ledger: Any
    serve_seconds: float = measured.AGENT_READY_AFTER_RUNNING_SECONDS + measured.AGENT_HOST_START_SECONDS
    warm_seconds: float = measured.AGENT_READY_AFTER_RUNNING_SECONDS + measured.WARM_SETTLE_SECONDS
    failures: list[str] = field(default_factory=list)
    asks: list[dict[str, Any]] = field(default_factory=list)
    on_ask: Optional[Callable[[dict[str, Any]], None]] = None
    served: dict[str, float] = field(default_factory=dict)
    """Ground truth: when each VM asked about as a base slot's had its agent host ready."""
    warmed: dict[str, float] = field(default_factory=dict)
    """... and when each parked slot's VM was warmed."""

    def ask(self, request: dict[str, Any]) -> None:
        from .._lambdas.reconciler.core import Ready  # the reconciler's own record of an answer

        now = self.backend.clock.now()
        self.asks.append({**request, "received_at": now})
        if self.on_ask is not None:
            self.on_ask(request)
        vm_id = str(request["microvm_id"])
        attempt = int(request.get("attempt") or 0)
        running = self.backend.running_at(vm_id)
        role = "warm" if request.get("role") == "warm" else "member"
        warm = role == "warm"
        if self.failures:
            fact = Ready(vm_id, "failed", now + self.serve_seconds, attempt, self.failures.pop(0), role)
        elif running is None:
            fact = Ready(vm_id, "failed", now, attempt, "SandboxNotReadyException: the VM is not running", role)
        else:
            fact = Ready(vm_id, "ready", max(now, running) + (self.warm_seconds if warm else self.serve_seconds),
                         attempt, role=role)
            (self.warmed if warm else self.served).setdefault(vm_id, fact.at)
        self.ledger.put_fact(str(request["fleet"]), fact)


def serving_spans(vm: dict[str, Any]) -> list[tuple[float, float]]:
    """When a VM (an item of ``microvms_ever``) could serve a request: RUNNING, or suspended by its
    idle policy (auto-resume: a request wakes it) until it runs again or ends; not while PENDING
    from its run, nor while parked (suspended by a SuspendMicrovm)."""
    spans, start, idle = [], None, set(vm.get("idleSuspendedAt") or ())
    by_idle = False
    for at, state, _ in vm["history"]:
        if state == "SUSPENDING":
            by_idle = at in idle
        serves = state == "RUNNING" or (by_idle and state in ("SUSPENDING", "SUSPENDED", "PENDING"))
        if serves and start is None:
            start = at
        elif not serves and start is not None:
            spans.append((start, at))
            start = None
    if start is not None:
        spans.append((start, float("inf")))
    exited = vm.get("exitedAt")  # its PID 1 exited (rayd's deadline, a crash): it serves nothing since
    if exited is not None:
        spans = [(a, min(b, exited)) for a, b in spans if a < exited]
    return spans
