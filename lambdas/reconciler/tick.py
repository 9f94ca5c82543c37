"""The reconciler's shell: observe, plan (pure, :mod:`.core`), then act under the shared budget.

A *step* lists the fleet's VMs, reconciles the ledger, and makes the calls the plan asks for, each
one admitted by the control-plane budget. A *tick* (one scheduled invocation) holds the fleet's
tick lease and runs steps until nothing is left to do or its deadline comes, sleeping between
steps for exactly as long as the budget or a pending VM asks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from botocore.exceptions import ClientError

from . import core
from .budget import Deferral, Granted

PENDING_POLL_SECONDS = 5.0
MIN_WAIT_SECONDS = 0.05
#: A step that wakes for tokens it reserved acts on the list its reservation was made with, if
#: that list is at most this old (with the VMs it started since): reserved calls then go out on
#: time instead of waiting for a list of their own, which would bunch them up behind others'.
OBSERVATION_TTL_SECONDS = 2.0
QUOTA_BACKOFF_SECONDS = 60.0
CAPACITY_BACKOFF_SECONDS = 30.0
BACKOFF_CODES = {"ThrottlingException", "ServiceQuotaExceededException", "InsufficientCapacityException"}
SLOT_FAILURES = {"ValidationException", "ResourceNotFoundException", "AccessDeniedException"}


@dataclass
class StepResult:
    """When the next step is worth taking, in seconds (None: not in this tick)."""

    wake_after: Optional[float]


@dataclass
class Reconciler:
    """One fleet's reconciler. ``microvms`` is a boto3 ``lambda-microvms`` client (or the
    emulator's direct client); ``ledger`` and ``budget`` are the stores; ``clock`` returns now."""

    spec: core.FleetSpec
    microvms: Any
    ledger: Any
    budget: Any
    telemetry: Any
    clock: Callable[[], float] = time.time
    dead_letters: Optional[Callable[[dict[str, Any]], None]] = None
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    api_calls: int = 0
    reserve_horizon: float = OBSERVATION_TTL_SECONDS
    _observation: Optional[tuple[float, list]] = None
    _demand: dict[str, int] = field(default_factory=dict)  # calls the last step had no token for
    _deadline: float = float("inf")
    _held: dict[str, list[float]] = field(default_factory=dict)  # operation -> [ready_at, tokens]

    # ------------------------------------------------------------------ ticks and steps

    def tick(self, deadline_seconds: float = 50.0, sleep: Callable[[float], None] = time.sleep,
             lease_seconds: float = 120.0) -> dict[str, Any]:
        """One scheduled run: take the tick lease, step until done or the deadline, release."""
        start = self.clock()
        if not self.begin_tick(lease_seconds, deadline_seconds):
            return {"fleet": self.spec.fleet, "skipped": "tick_in_progress"}
        steps = 0
        try:
            while True:
                result = self.step()
                steps += 1
                if result.wake_after is None:
                    break
                if self.clock() + result.wake_after > start + deadline_seconds:
                    break
                sleep(result.wake_after)
        finally:
            self.end_tick()
        return {"fleet": self.spec.fleet, "steps": steps, "api_calls": self.api_calls}

    def begin_tick(self, lease_seconds: float = 120.0, deadline_seconds: float = 50.0) -> bool:
        """Take the fleet's tick lease; False (and a timeline line) when another tick holds it."""
        holder = uuid.uuid4().hex  # each tick its own holder: a second tick of this object waits too
        if self.ledger.acquire_tick(self.spec.fleet, holder, self.clock(), lease_seconds):
            self.holder = holder
            self._deadline = self.clock() + deadline_seconds
            return True
        self._emit({"event": "tick_skipped", "reason": "another tick holds the lease"})
        return False

    def end_tick(self) -> None:
        """Release the lease; reservations not used are given up with it."""
        self._held.clear()
        self._demand.clear()
        self._observation = None
        self._deadline = float("inf")
        self.ledger.release_tick(self.spec.fleet, self.holder)
        self.telemetry.flush()

    def step(self) -> StepResult:
        """Observe, plan, act. Returns when the next step is worth taking (None: not this tick)."""
        now = self.clock()
        fleet = self.spec.fleet
        # Calls the last step had no token for: reserve them before listing again, so a fleet
        # waiting for the shared budget does not spend a ListMicrovms on every try.
        demand_waits = []
        for operation, count in list(self._demand.items()):
            if operation in self._held:
                continue
            decision = self._admit(operation, now, count)
            if isinstance(decision, Deferral):
                demand_waits.append(decision.retry_after_seconds)
                continue
            self._held.setdefault(operation, [now, 0])[1] += 1  # the token _admit handed out: keep it
            del self._demand[operation]
        ready = any(ready_at <= now + 1e-6 and n >= 1 for ready_at, n in self._held.values())
        if demand_waits and not ready:
            wait = min(demand_waits + [at - now for at, n in self._held.values() if n >= 1])
            if now + wait >= self._deadline:
                return StepResult(None)
            return StepResult(max(MIN_WAIT_SECONDS, wait))
        self._demand.clear()
        if ready and self._observation is not None and now - self._observation[0] <= OBSERVATION_TTL_SECONDS:
            observed = list(self._observation[1])
        else:
            observed = self._list(now)
            if not isinstance(observed, Deferral):
                self._observation = (now, list(observed))
        if isinstance(observed, Deferral):
            self._drop_due(now)  # reserved calls cannot wait for a list: given up, never sent late
            if now + observed.retry_after_seconds >= self._deadline:
                return StepResult(None)  # no list before the deadline: the next tick
            return StepResult(max(MIN_WAIT_SECONDS, observed.retry_after_seconds))
        slots, stats = self.ledger.load(fleet)
        plan = core.plan(self.spec, slots, observed, now)
        self._persist(slots, plan.slots)
        for event in plan.events:
            self._emit(event)
            if event.get("claim_to_complete") is not None:
                self.telemetry.metric(fleet, "ClaimToComplete", event["claim_to_complete"])
            if event["event"] == "slot_dead_lettered" and self.dead_letters:
                self.dead_letters({"fleet": fleet, **event})
        for name, value in plan.gauges.items():
            self.telemetry.metric(fleet, name, value)
        waits: list[float] = []
        live = plan.live_vms
        width = self.spec.max_starts_per_step
        runs = attempts = filled = 0
        runs_planned = sum(1 for i in plan.intents if i.kind == "run")
        slots = plan.slots
        for intent in plan.intents:
            if intent.kind == "run":
                slot = slots.get(intent.slot_id)
                if slot is None:
                    continue
                if live >= self.spec.max_vms:
                    self._note(slot, "max_vms_reached", intent)
                    continue
                if runs >= width:
                    waits.append(0.0)
                    continue
                want = max(1, min(runs_planned - runs, width - runs, self.spec.max_vms - live))
                calls_before = self.api_calls
                outcome = self._run(slot, intent, stats["epoch"], now, want)
                attempts += self.api_calls - calls_before  # every RunMicrovm sent, failed ones too
                if isinstance(outcome, Deferral):
                    waits.append(outcome.retry_after_seconds)
                    if outcome.reason == "budget_empty":
                        self._demand["RunMicrovm"] = want
                    break  # the bucket is empty (or the service said no) for every run after this one
                runs += 1
                if outcome == "started":
                    live += 1
                    filled += 1
                    if slot.role == core.WARM:
                        waits.append(PENDING_POLL_SECONDS)  # to park it once it runs
                elif outcome == "retry":
                    live += 1  # the VM may exist (a lost response): count it until a list says otherwise
                    waits.append(1.0)
            else:
                want = sum(1 for i in plan.intents if i.kind == intent.kind)
                decision = self._call(intent, now, want, slots)
                if isinstance(decision, Deferral):
                    waits.append(decision.retry_after_seconds)
                    if decision.reason == "budget_empty" and intent.kind == "suspend":
                        self._demand["SuspendMicrovm"] = want
        if attempts or filled:
            self.ledger.add_stats(fleet, run_attempts=attempts, slots_filled=filled)
            total_attempts = stats["run_attempts"] + attempts
            total_filled = stats["slots_filled"] + filled
            self.telemetry.metric(fleet, "RunMicrovmAttempts", attempts)
            self.telemetry.metric(fleet, "SlotsFilled", filled)
            if total_filled:
                self.telemetry.metric(fleet, "RetryAmplification", round(total_attempts / total_filled, 4))
        self._drop_due(now)
        if plan.wake_soon:
            waits.append(PENDING_POLL_SECONDS)
        # A floor on waits: float edges of the buckets must not turn into a busy loop.
        return StepResult(max(MIN_WAIT_SECONDS, min(waits)) if waits else None)

    def _drop_due(self, now: float) -> None:
        """Tokens that came due for this step and were not spent are given up: spent later they
        would land on top of other reconcilers' on-time calls, a burst above the service quota."""
        for operation in [op for op, (ready, _) in self._held.items() if ready <= now + 1e-6]:
            del self._held[operation]

    # ------------------------------------------------------------------ calls

    def _admit(self, operation: str, now: float, want: int = 1) -> Granted | Deferral:
        """One token for ``operation``. When a batch of ``want`` calls is ahead and the budget is
        busy, reserve them at a definite time instead of coming back to compete on every refill:
        with many reconcilers on one budget that removes a thundering herd of ListMicrovms."""
        held = self._held.get(operation)
        if held and held[1] >= 1:
            if held[0] <= now + 1e-6:
                held[1] -= 1
                return Granted(operation, 1)
            return Deferral(operation, held[0] - now, "reserved")
        burst = int(self.budget.shape(operation)[1])
        # Never reserve past the tick's deadline: the tick would end holding tokens nobody uses.
        horizon = max(0.0, min(self.reserve_horizon, self._deadline - now - 1))
        decision = self.budget.acquire(operation, now, cost=max(1, min(want, burst)), horizon=horizon)
        if isinstance(decision, Deferral):
            self._deferred(decision)
            return decision
        if decision.wait_seconds <= 1e-6:
            if decision.cost > 1:
                self._held[operation] = [now, decision.cost - 1]
            return Granted(operation, 1)
        self._held[operation] = [now + decision.wait_seconds, decision.cost]
        return Deferral(operation, decision.wait_seconds, "reserved")

    def _list(self, now: float) -> list[core.Observed] | Deferral:
        observed: list[core.Observed] = []
        token: Optional[str] = None
        while True:
            decision = self._admit("ListMicrovms", now)
            if isinstance(decision, Deferral):
                return decision
            kwargs: dict[str, Any] = {"imageIdentifier": self.spec.image_arn, "maxResults": 50}
            if token:
                kwargs["nextToken"] = token
            try:
                page = self._api("list_microvms", **kwargs)
            except ClientError as exc:
                return self._failed("ListMicrovms", exc, now)
            for item in page["items"]:
                started = item["startedAt"]
                observed.append(core.Observed(item["microvmId"], item["state"], _epoch(started), item.get("imageVersion")))
            token = page.get("nextToken")
            if not token:
                return observed

    def _run(self, slot: core.Slot, intent: core.Intent, epoch: str, now: float, want: int = 1) -> str | Deferral:
        decision = self._admit("RunMicrovm", now, want)
        if isinstance(decision, Deferral):
            self._note(slot, decision.reason, intent)
            return decision
        slot = core.admit_run(slot, intent, now)
        # Written before the call: a step killed after it leaves a slot the next step finishes.
        self.ledger.save(self.spec.fleet, slot)
        token = core.client_token(epoch, self.spec.fleet, slot.slot_id, slot.generation)
        self._emit(core._event("run_requested", slot, successor=intent.successor or None,
                               reason=intent.reason if intent.successor else None,
                               image_version=self.spec.image_version, wait_time=core._since(slot.queued_at, now)))
        if slot.queued_at is not None:
            self.telemetry.metric(self.spec.fleet, "WaitTime", round(now - slot.queued_at, 3))
        try:
            vm = self._api("run_microvm", clientToken=token, **self.spec.run_parameters(slot.role))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            self._failed("RunMicrovm", exc, now)
            if code in SLOT_FAILURES or code == "ConflictException":
                slot.attempts += 1
                slot.reason = f"{code}: {exc.response.get('Error', {}).get('Message', '')}"[:500]
                if slot.attempts >= self.spec.max_start_attempts:
                    slot.phase = core.DEAD
                    self._emit(core._event("slot_dead_lettered", slot, reason=slot.reason))
                    if self.dead_letters:
                        self.dead_letters({"fleet": self.spec.fleet, "event": "slot_dead_lettered", **slot.to_dict()})
                else:
                    slot.generation += 1  # a Conflict means the token's parameters changed
                    slot.phase = core.QUEUED
                self.ledger.save(self.spec.fleet, slot)
                return "failed"
            if code in BACKOFF_CODES:
                return Deferral("RunMicrovm", float(exc.response.get("retryAfterSeconds") or 1), f"error:{code}")
            return "retry"  # an internal error: the same token next time
        slot.microvm_id = vm["microvmId"]
        slot.vm_started_at = _epoch(vm["startedAt"])
        if self._observation is not None:
            self._observation[1].append(core.Observed(vm["microvmId"], vm["state"], slot.vm_started_at,
                                                      vm.get("imageVersion")))
        self.ledger.save(self.spec.fleet, slot)
        self._emit(core._event("run_accepted", slot, state=vm["state"]))
        return "started"

    def _call(self, intent: core.Intent, now: float, want: int = 1,
              slots: Optional[dict[str, core.Slot]] = None) -> Optional[Deferral]:
        operation, method = {
            "suspend": ("SuspendMicrovm", "suspend_microvm"),
            "terminate": ("TerminateMicrovm", "terminate_microvm"),
            "describe": ("GetMicrovm", "get_microvm"),
        }[intent.kind]
        decision = self._admit(operation, now, want)
        if isinstance(decision, Deferral):
            return decision
        try:
            result = self._api(method, microvmIdentifier=intent.microvm_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("ConflictException", "ResourceNotFoundException"):
                self._failed(operation, exc, now)
            return None
        if intent.kind == "describe":
            self._emit({"event": "vm_end_reason", "slot": intent.slot_id, "microvm_id": intent.microvm_id,
                        "state": result.get("state"), "reason": result.get("stateReason")})
        elif intent.kind == "suspend":
            slot = slots.get(intent.slot_id) if slots is not None else None
            if slot is not None:
                slot.parking_since = now
                self.ledger.save(self.spec.fleet, slot)
            self._emit({"event": "park_requested", "slot": intent.slot_id, "microvm_id": intent.microvm_id})
        else:
            self._emit({"event": "vm_terminated", "slot": intent.slot_id, "microvm_id": intent.microvm_id,
                        "reason": intent.reason})
        return None

    def _api(self, method: str, **kwargs: Any) -> Any:
        self.api_calls += 1
        return getattr(self.microvms, method)(**kwargs)

    def _failed(self, operation: str, exc: ClientError, now: float) -> Deferral:
        """Turn a service error into a shared backoff when it is about capacity or rate."""
        code = exc.response.get("Error", {}).get("Code", "")
        retry_after = float(exc.response.get("retryAfterSeconds") or 1)
        if code in BACKOFF_CODES:
            self._held.pop(operation, None)  # reserved tokens are worthless once the service says no
        if code == "ThrottlingException":
            self.telemetry.metric(self.spec.fleet, "Throttles", 1, operation=operation)
            self.budget.backoff(operation, now + retry_after, "throttled")
        elif code == "ServiceQuotaExceededException":
            retry_after = QUOTA_BACKOFF_SECONDS
            self.budget.backoff(operation, now + retry_after, "memory_quota")
        elif code == "InsufficientCapacityException":
            retry_after = CAPACITY_BACKOFF_SECONDS
            self.budget.backoff(operation, now + retry_after, "insufficient_capacity")
        self._emit({"event": "api_error", "operation": operation, "code": code,
                    "message": exc.response.get("Error", {}).get("Message"), "retry_after": retry_after})
        return Deferral(operation, retry_after, f"error:{code}")

    # ------------------------------------------------------------------ persistence and telling

    def _persist(self, before: dict[str, core.Slot], after: dict[str, core.Slot]) -> None:
        for slot_id, slot in after.items():
            if before.get(slot_id) != slot:
                self.ledger.save(self.spec.fleet, slot)
        for slot_id in before.keys() - after.keys():
            self.ledger.delete(self.spec.fleet, slot_id)

    def _deferred(self, deferral: Deferral) -> None:
        self.telemetry.metric(self.spec.fleet, "Deferrals", 1, operation=deferral.operation)

    def _note(self, slot: core.Slot, reason: str, intent: core.Intent) -> None:
        """Record why a slot waits, once per reason (not on every step)."""
        if core.noted(slot, reason):
            return
        core.note(slot, reason)
        self.ledger.save(self.spec.fleet, slot)
        kind = "no_headroom_for_rolling_replacement" if intent.successor and reason == "max_vms_reached" else "run_deferred"
        self._emit(core._event(kind, slot, reason=reason))

    def _emit(self, event: dict[str, Any]) -> None:
        self.telemetry.event(self.spec.fleet, {"time": round(self.clock(), 3), **event})


def _epoch(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)

