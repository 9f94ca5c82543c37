"""The reconciler's shell: observe, plan (pure, :mod:`.core`), then act under the shared budget.

A *step* looks at the fleet's VMs (:mod:`.looks`), plans, and makes the calls the plan asks for
(:mod:`.calls`), each one admitted by the control-plane budget (:mod:`.admission`). A *tick* (one
invocation) holds the fleet's fenced tick lease and runs steps until nothing is left to do or its
time is up (:mod:`.timing`), sleeping between steps for exactly as long as its waits ask.

What lives one tick is one :class:`TickState`, made when the tick takes the lease and dropped when
it releases it; what outlives ticks (the service's clock, the account's "no room") is on the
:class:`Reconciler`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import answers, core
from .admission import RESERVE_HORIZON_SECONDS, ROOM_BACKOFFS, Admission
from .budget import Deferral
from .calls import Calls, Step, parked_for_base
from .core import IntentKind, Observed, Reason, Slot, Wait
from .core.lifetimes import CALL_MARGIN_SECONDS
from .ledger import FencedOut
from .letters import Outbox
from .looks import Looks
from .ports import Budget, DeadLetters, FleetState, Ledger, MicrovmsApi, Server, Stats, Telemetry
from .run_requests import RequestFor, RunRequests
from .timing import MIN_WAIT_SECONDS, Deadline, StepResult, next_sleep, wakes

#: A tick waits for an overlapping one of its fleet only if this much of its own time is left.
HOLDER_WAIT_SPARE_SECONDS = 1.0
#: A holder's recorded end further ahead than one whole tick plus this is from a clock that runs
#: ahead (or a longer timeout): not believed, the holder is taken over.
HOLDER_SKEW_SECONDS = 35.0
#: An AWS error a step's call site does not handle (a DynamoDB throttle or 500 after the client's
#: own attempts, a timeout, a transaction cancelled for another reason than the fence): told
#: (``step_failed``), the ledger read again and the step taken again after 1, 2, 4 s, at most this
#: many times a tick. Every write is fenced and every call written down first, so a step taken
#: again finds what the failed one did (a run by its token).
MAX_STEP_FAILURES = 3
STEP_RETRY_SECONDS = 1.0
#: An offset between our clock and the service's ``Date`` beyond this is not believed.
MAX_CLOCK_OFFSET_SECONDS = 300.0
#: A step whose runs learned the account has no room plans again this soon (a handover).
ROOM_REPLAN_SECONDS = 0.5


@dataclass
class TickState:
    """Everything one tick keeps between its steps."""

    deadline: Deadline
    admission: Admission
    looks: Looks
    outbox: Outbox
    calls: Calls
    told: set[str] = field(default_factory=set)  # strays (and list_incomplete) told in this tick
    loaded: Optional[tuple[dict[str, Slot], Stats]] = None  # the tick's first ledger read, for its first plan
    short_at_start: bool = False  # the first read had wanted slots without a VM
    dues: list[float] = field(default_factory=list)  # when the last plan found a step worth overtime
    woken_for_answers: bool = False  # this step woke only to read the server's answers
    answers_at: Optional[float] = None  # when the last plan expects the server's next answer
    parked: dict[str, Slot] = field(default_factory=dict)  # the VMs the watch looks at, with their slots (core.watched_vms)
    woken_for_watch: bool = False  # this step woke only to watch them
    watched_at: Optional[float] = None  # when a watch last read them (a fresh list reads them too)
    watched: list[Observed] = field(default_factory=list)  # ... and what the watch saw change
    waits: list[Wait] = field(default_factory=list)  # the last step's waits but the watch's (a watch step keeps them)


@dataclass
class Reconciler:
    """One fleet's reconciler. ``microvms`` is a boto3 ``lambda-microvms`` client (or the
    emulator's); ``ledger`` and ``budget`` are the stores; ``clock`` is the wall clock (the
    service's time is learned from its answers), ``monotonic`` the one a tick's deadline runs on
    (``clock`` when not given); ``run_requests`` the RunMicrovm parameters per role.

    ``siblings``: the other fleets whose ledgers (same table) hold VMs of a shared image."""

    spec: core.FleetSpec
    microvms: MicrovmsApi
    ledger: Ledger
    budget: Budget
    telemetry: Telemetry
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    monotonic: Optional[Callable[[], float]] = None
    dead_letters: Optional[DeadLetters] = None
    run_requests: Optional[RequestFor] = None
    state_source: Optional[FleetState] = None
    server: Optional[Server] = None
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    siblings: tuple[str, ...] = ()
    api_calls: int = 0
    list_calls: int = 0  # the ListMicrovms pages among them
    fence: Optional[int] = None
    reserve_horizon: float = RESERVE_HORIZON_SECONDS
    offset: float = 0.0  # the service's clock minus ours, from the Date of its answers
    no_room_until: float = float("-inf")  # the account refuses new VMs for room until then (shared clock)
    state: Optional[TickState] = None
    _pause: Optional[Callable[[float], None]] = None  # the running tick's sleep

    def refresh(self) -> Optional[str]:
        """Take the fleet as it is now (``state_source``: the product's recipe) for the next tick:
        its spec and its VMs' run parameters. Returns why there is no fleet to keep (the tick then
        makes no call), None otherwise, and when there is no source (the spec given stands)."""
        if self.state_source is None:
            return None
        got = self.state_source.desired()
        if isinstance(got, str):
            return got
        self.spec, self.run_requests = got
        return None

    # ------------------------------------------------------------------ shared services (ports.Shell)

    def now(self) -> float:
        """The service's time as this function's clock and the last answer's ``Date`` tell it: VM
        start times come from the service, so expiries and ages are reckoned on its clock,
        whatever this environment's clock says (a skew of 30 s would delay a replacement by 30 s)."""
        return self.clock() + self.offset

    def elapsed(self) -> float:
        """The monotonic clock a tick's deadline runs on."""
        return (self.monotonic or self.clock)()

    def api(self, method: str, **kwargs: Any) -> Any:
        self.api_calls += 1
        if method == "list_microvms":
            self.list_calls += 1
        answer = getattr(self.microvms, method)(**kwargs)
        if method == "list_microvms":
            self.learn_offset(answer)
        return answer

    def emit(self, event: dict[str, Any]) -> None:
        self.telemetry.event(self.spec.fleet, {"time": round(self.now(), 3), **event})

    def metric(self, name: str, value: float, operation: Optional[str] = None) -> None:
        self.telemetry.metric(self.spec.fleet, name, value, operation=operation)

    def write(self, slots: dict[str, Slot], changed: list[Slot], meta: Optional[dict[str, Any]] = None) -> None:
        self.ledger.write(self.spec.fleet, self.fence, puts=changed, meta=meta)
        for slot in changed:
            slots[slot.slot_id] = slot

    def pause(self, seconds: float) -> None:
        (self._pause or self.sleep)(seconds)

    def learn_offset(self, response: Any) -> None:
        """The service's clock from an answer's ``Date`` (whole seconds: moved only by a second or
        more; an offset beyond ``MAX_CLOCK_OFFSET_SECONDS`` is not believed)."""
        service = answers.service_time(response)
        if service is None:  # uncovered: every answer (the emulator over HTTP, and AWS) has a Date header
            return
        offset = service - self.clock()
        if abs(offset) <= MAX_CLOCK_OFFSET_SECONDS and abs(offset - self.offset) >= 1.0:  # uncovered: the service's clock more than 300 s from ours; the tests skew clocks by 30 s
            self.offset = offset

    # ------------------------------------------------------------------ ticks

    def tick(self, deadline_seconds: float = 50.0, sleep: Optional[Callable[[float], None]] = None,
             lease_seconds: float = 120.0, overtime_seconds: float = 0.0) -> dict[str, Any]:
        """One invocation's work: take the tick lease, step until done or out of time, release.

        ``deadline_seconds``: the soft bound (``tick_seconds``); ``overtime_seconds``: how far past
        it steps may still come for a wait worth overtime (the invocation's time less the call
        margin: :mod:`.timing`). The lease is recorded to end at the soft bound: a tick that starts
        during the overtime takes it over at once, and the fence stops this one at its next write."""
        pause = self._pause = sleep or self.sleep
        deadline = Deadline.starting(self.elapsed, deadline_seconds, overtime_seconds)
        if not self._wait_for_holder(deadline, deadline_seconds, pause):
            self.telemetry.flush()
            return {"fleet": self.spec.fleet, "skipped": "holder_covers_fleet"}
        failures = 0
        while True:
            try:
                self.begin_tick(lease_seconds, deadline.soft - self.elapsed(), deadline)
                break
            except (answers.ClientError, answers.BotoCoreError) as exc:  # the lease's store, after its own attempts
                failures += 1
                wait = STEP_RETRY_SECONDS * 2 ** (failures - 1)
                code = self._step_failed(exc, "begin_tick")
                if failures >= MAX_STEP_FAILURES or not deadline.reaches(wait):
                    self.telemetry.flush()
                    return {"fleet": self.spec.fleet, "skipped": "store_error", "code": code}
                pause(wait)
        state = self.state
        assert state is not None  # begin_tick made it; only end_tick, below, clears it
        calls = self.api_calls
        outcome: dict[str, Any] = {}
        steps = 0
        demand = True
        try:
            while steps == 0 or deadline.allows_intent():
                lists = self.list_calls
                try:
                    if demand:
                        self._demand_from_ledger()
                        demand = False
                    result = self.step()
                except (answers.ClientError, answers.BotoCoreError) as exc:
                    failures += 1
                    outcome["step_failures"] = failures
                    self._step_failed(exc, "step")
                    state.loaded = None  # read the ledger again: the failed write may have landed
                    # and so may a hand-over of a parked VM: the watch writes parked slots back
                    # whole, so it waits for the next step's own (a second later) rather than these
                    state.parked = {}
                    if failures >= MAX_STEP_FAILURES:
                        break
                    result = StepResult(self.now(), [Wait(self.now() + STEP_RETRY_SECONDS * 2 ** (failures - 1), Reason.RETRY)])
                    result.waits += [Wait(at, Reason.OWED) for at in state.dues]
                steps += 1
                result.listed = self.list_calls != lists
                state.waits = [w for w in result.waits if w.reason != Reason.WATCH]
                if not state.admission.demand:
                    # A step waiting for tokens is not woken to watch (asked again on each wake, the
                    # shared buckets gave other fleets' runs first: 300 fleets converged 22 s later).
                    self._watch_next(result, state)
                wake = next_sleep(result, deadline, self.now())
                if wake is None:
                    break
                if wake.overtime and any(w.reason.owed for w in result.waits):
                    self.emit({"event": "tick_overtime", "reason": "a base slot is, or is about to be, without a VM",
                               "wake": round(wake.seconds, 3)})
                pause(wake.seconds)
                due = [w.reason for w in result.waits if w.at <= self.now() + 1e-6 and wakes(w.reason)]
                state.woken_for_answers = bool(due) and set(due) <= {Reason.SERVE, Reason.SERVED}
                state.woken_for_watch = bool(due) and set(due) == {Reason.WATCH}
        except FencedOut:
            outcome["lease_lost"] = True
            self.emit({"event": "lease_lost", "reason": "another tick took the lease; this one stops"})
        finally:
            self.end_tick()
        return {"fleet": self.spec.fleet, "steps": steps, "api_calls": self.api_calls - calls, **outcome}

    def _wait_for_holder(self, deadline: Deadline, deadline_seconds: float, pause: Callable[[float], None]) -> bool:
        """Whether this invocation should tick, after waiting (if it can) for an overlapping one of
        the fleet (the deploy's invocation and the first scheduled one, a duplicate delivery).

        * No holder, or one past its recorded end (killed without releasing): tick at once.
        * A holder whose end is plausible and leaves this one time to work: wait for it, then tick
          (taken over, the holder would drop the budget tokens it reserved).
        * A holder whose end is plausible but too late to wait for: skip (``tick_skipped``): the
          holder covers the fleet until its end (taken over, it would stop at its next write, and
          if this invocation then died nobody would act on the fleet until the next schedule).
        * A holder that says it ends implausibly late (past a whole tick plus the clock skew
          tolerated: its clock runs ahead): taken over at once; the fence keeps both safe."""
        try:
            until = self.ledger.busy_until(self.spec.fleet)
        except (answers.ClientError, answers.BotoCoreError):  # uncovered: DynamoDB failing on the lease read of a tick's start but not on the writes after it
            return True  # the lease item cannot be read: take over (the fence keeps both safe)
        # Ends are written and weighed on the shared (service's) clock.
        now = self.now()
        if until is None or until <= now:
            return True
        if until - now > deadline_seconds + HOLDER_SKEW_SECONDS:
            self.emit({"event": "tick_takeover", "reason": "holder_end_implausible", "holder_ends_in": round(until - now, 3)})
            return True
        wait = until - now + MIN_WAIT_SECONDS
        if wait <= deadline.soft - self.elapsed() - HOLDER_WAIT_SPARE_SECONDS:
            self.emit({"event": "tick_waiting", "reason": "another tick of the fleet ends first", "wait": round(wait, 3)})
            pause(wait)
            return True
        self.emit({"event": "tick_skipped", "reason": "holder_covers_fleet", "holder_ends_in": round(until - now, 3)})
        return False

    def begin_tick(self, lease_seconds: float = 120.0, deadline_seconds: float = 50.0,
                   deadline: Optional[Deadline] = None) -> bool:
        """Take the fleet's tick lease, from a tick still holding it too: the newest invocation has
        the latest deadline (and a killed one's lease must not hold the fleet back). The older
        tick's next ledger write fails on the fence and it stops (``lease_lost``). Makes the
        tick's :class:`TickState`."""
        holder = uuid.uuid4().hex  # each tick its own holder: a second tick of this object waits too
        now = self.now()  # the shared clock: another invocation weighs this end (_wait_for_holder)
        self.fence = self.ledger.acquire_tick(self.spec.fleet, holder, now, lease_seconds,
                                              tick_until=now + deadline_seconds)
        self.holder = holder
        self.state = self._new_state(deadline or Deadline.starting(self.elapsed, deadline_seconds, 0.0))
        return True

    def _new_state(self, deadline: Deadline) -> TickState:
        admission = Admission(self, deadline, self.reserve_horizon, no_room_until=self.no_room_until)
        told: set[str] = set()
        looks = Looks(self, admission, deadline, told)
        outbox = Outbox(self, deadline, self.dead_letters)
        calls = Calls(self, admission, looks, outbox, deadline, self.run_requests or RunRequests.of(self.spec),
                      self.server)
        return TickState(deadline, admission, looks, outbox, calls, told)

    def end_tick(self) -> None:
        """Release the lease; reservations not used are given up with the tick's state."""
        if self.state is not None:  # uncovered: end_tick() without begin_tick() (both callers take the lease first)
            self.no_room_until = max(self.no_room_until, self.state.admission.no_room_until)
        self.state = None
        try:
            self.ledger.release_tick(self.spec.fleet, self.holder)
        except (answers.ClientError, answers.BotoCoreError) as exc:
            # Not released: the lease ends at its recorded end, and the next tick takes it then.
            self._step_failed(exc, "end_tick")
        self.telemetry.flush()

    def _step_failed(self, exc: Exception, where: str) -> str:
        """Tell an AWS error no call site handled (``step_failed``); its code."""
        code = answers.error_code(exc)
        self.emit({"event": "step_failed", "where": where, "code": code,
                   "operation": getattr(exc, "operation_name", None), "error_message": str(exc)[:300]})
        return code

    def _demand_from_ledger(self) -> None:
        """The runs the ledger says are due become this tick's first demand: reserved before the
        first list, so a fleet that waits for the shared RunMicrovm budget lists once, when its
        tokens come due. The tick's first step plans on this read: nothing but this tick writes the
        fleet's slots while it holds the lease (every write is fenced)."""
        state = self._state()
        state.loaded = self.ledger.load(self.spec.fleet)
        due = core.ledger_demand(self.spec, state.loaded[0], self.now())
        state.short_at_start = bool(due)
        if due:
            state.admission.demand["RunMicrovm"] = min(due, self.spec.max_starts_per_step)

    def _state(self) -> TickState:
        if self.state is None:
            raise RuntimeError("no tick holds the lease: begin_tick() first")  # uncovered: a step outside a tick is a caller's bug
        return self.state

    # ------------------------------------------------------------------ a step

    def step(self) -> StepResult:
        """Look, plan, act. Returns the step's waits (none: nothing more to do in this tick)."""
        state = self._state()
        now = self.now()
        waiting = self._wait_for_tokens(state, now)
        if waiting is not None:
            return waiting
        quiet = self._watch(state, now)
        if quiet is not None:
            return quiet
        if state.watched:
            now = self.now()  # the watch may have waited for a token: the plan is made as of now
        admission, looks = state.admission, state.looks
        admission.demand.clear()
        state.short_at_start = False  # a plan from here on: its waits say what is short
        owed = looks.owed(now)
        looks.park_at = None
        loaded, state.loaded = state.loaded, None
        slots, stats = loaded or self.ledger.load(self.spec.fleet)
        facts = stats.get("facts") or {}
        looks.facts_seen(facts, slots, now)
        choice = looks.choose(now, admission.ready(now), answers_only=state.woken_for_answers)
        if choice.observed is None:
            assert choice.deferral is not None
            admission.drop_due(now)  # reserved calls cannot wait for a list: given up, never sent late
            refused = choice.deferral.reason.startswith("error:")
            return self._carry(state, now, choice.deferral.retry_after_seconds, Reason.LIST if refused else Reason.BUDGET)
        if choice.fresh:
            owed = None
        observed = _with_watched(state, looks.for_plan(looks.confirm(slots, choice.observed, now), slots, now))
        others = self.ledger.load_vm_ids(self.siblings) if self.siblings else set()
        fingerprint = self.spec.fingerprint()
        no_room = admission.no_room_until > now
        plan = core.plan(self.spec, slots, observed, now, others=others, strays=stats.get("strays") or {},
                         redrive=stats.get("spec") not in (None, fingerprint), retired=stats.get("retired") or {},
                         no_room=no_room, facts=facts)
        orphans = self._persist(slots, plan, stats, fingerprint)
        self._tell(state, plan, now)
        result = StepResult(now)
        step = Step(plan.slots, stats["epoch"], now, result, plan.live_vms,
                    {kind: sum(1 for i in plan.intents if i.kind == kind) for kind in IntentKind},
                    suspends_only=choice.suspends_only)
        state.calls.make(step, plan.intents)
        state.outbox.flush(step.slots, [e["slot"] for e in plan.events if e["event"] == "slot_dead_lettered"], orphans)
        if not no_room and admission.no_room_until > now and parked_for_base(step.slots):
            # The account said "no room" during this step's runs: a plan soon hands parked VMs to
            # the base slots still without one.
            result.add(now + ROOM_REPLAN_SECONDS, Reason.ROOM)
        self._count_runs(step, stats)
        admission.drop_due(now)
        looks.plan_next(plan, observed, step.started_warm, result, owed)
        result.waits += plan.waits
        # What a tick may work past its deadline for: wanted slots still without a VM after this
        # step's runs (refused, or no token yet; first fills too; not one that waits for room
        # under max_vms: clients may hold it for hours).
        short = core.short_slot_due({k: v for k, v in step.slots.items() if k not in step.at_max | step.later}, now)
        if short is not None:
            result.add(short, Reason.SHORT)
        state.dues = [w.at for w in result.waits if w.reason.owed]
        serve_waits = [w.at for w in result.waits if w.reason in (Reason.SERVE, Reason.SERVED)]
        state.answers_at = min(serve_waits) if serve_waits else None
        result.booked = bool(admission.booked())
        state.parked = core.watched_vms(step.slots.values())
        return result

    def _watch(self, state: TickState, now: float) -> Optional[StepResult]:
        """A step woken only to watch the parked slots' VMs: their GetMicrovm; a suspend seen landed
        is written (the slot parked); nothing else new (or no answer now), the step ends there and
        the next watch is due; a take makes it list afresh and plan (None)."""
        if not (state.woken_for_watch and state.parked):
            return None
        news, read = state.looks.watch(state.parked)
        state.watched_at = now
        self._parked_by_watch(state, read)
        if not news:
            # Nothing else was due (woken for the watch alone): the last step's waits stand. Carried
            # as owed only, a server's answer due 3 s later waited for the next watch (5 s).
            return StepResult(now, list(state.waits), booked=bool(state.admission.booked()))
        state.watched = news
        state.looks.listed_at = None  # a client took one: a fresh list before the plan refills it
        return None

    def _parked_by_watch(self, state: TickState, read: list[Observed]) -> None:
        """The parking slots whose VM the watch read SUSPENDED: parked, in one fenced write
        (:func:`.core.parked_by_watch`), so a take of it is news to the next look."""
        now = self.now()
        changes = [c for vm in read if vm.microvm_id in state.parked
                   and (c := core.parked_by_watch(self.spec, state.parked[vm.microvm_id], vm, now)) is not None]
        parked = [c.slot for c in changes if c.slot is not None]
        if not parked:
            return
        self.write({}, parked)
        for slot in parked:
            state.parked[slot.microvm_id or ""] = slot
        for change in changes:
            for told in change.events:
                self.emit(told)

    def _watch_next(self, result: StepResult, state: TickState) -> None:
        """The next look at the parked slots' VMs, added to every step's waits while the tick
        lives: ``watch_seconds`` after the last one that read them (a watch, or a fresh list; a
        step that planned on an older list or only read the server's answers did not, and must
        not put the watch off), past ``tick_seconds`` too, up to the last moment a take it sees
        can still be refilled in the tick (its hard bound less a step's reserve), so that the next
        tick's list is not the first to see a take in the rest of the schedule period
        (:func:`.core.next_watch`)."""
        if self.spec.watch_seconds <= 0 or not state.parked:
            return
        deadline = state.deadline
        now = self.now()
        last = now + deadline.last - deadline.clock()
        looked = [at for at in (state.watched_at, state.looks.listed_at) if at is not None]
        at = core.next_watch(max(looked) if looked else result.now, now, self.spec.watch_seconds, last)
        if at is not None:
            result.add(at, Reason.WATCH)

    def _wait_for_tokens(self, state: TickState, now: float) -> Optional[StepResult]:
        """Calls the last step had no token for are reserved before looking again, so a fleet
        waiting for the shared budget does not spend a ListMicrovms on every try. A step that
        waits only for them returns here (None: it looks and plans)."""
        admission = state.admission
        waits = []
        for operation, count in list(admission.demand.items()):
            if operation in admission.held:
                continue
            decision = admission.admit(operation, now, count)
            if isinstance(decision, Deferral) and decision.reason in ROOM_BACKOFFS:
                # The account has no room for a new VM (402, no capacity): not worth waiting for
                # before a plan, which hands parked VMs to base slots without a RunMicrovm.
                del admission.demand[operation]
            elif isinstance(decision, Deferral):
                waits.append(decision.retry_after_seconds)
            else:
                admission.keep(operation, now)
                del admission.demand[operation]
        park_at = state.looks.park_at
        park_due = park_at is not None and park_at <= now + 1e-6
        answers_at = state.answers_at  # the server's answers may be in the ledger then (a VM to park, one that serves)
        answers_due = answers_at is not None and answers_at <= now + 1e-6
        if not waits or admission.ready(now) or park_due or answers_due:
            return None
        wait = min([*waits, *[at - now for at in admission.booked()], *([park_at - now] if park_at is not None else []),
                    *([answers_at - now] if answers_at is not None else [])])
        if not state.deadline.reaches(wait):  # uncovered: tokens past the deadline for successors only (their slots hold VMs: nothing short)
            if state.dues or state.short_at_start:
                # Wanted slots without a VM wait for these tokens: worth the overtime, from when
                # they come due (a tick that took the lease over late planned nothing yet).
                state.dues = [*state.dues, now + wait]
            return self._carry(state, now, None)
        return self._carry(state, now, wait)

    def _carry(self, state: TickState, now: float, wait: Optional[float], reason: Reason = Reason.BUDGET) -> StepResult:
        """A step that did not plan: its own wait (if it comes before the tick's bound), and what
        the last plan found worth overtime."""
        result = StepResult(now, [Wait(at, Reason.OWED) for at in state.dues], booked=bool(state.admission.booked()))
        if wait is not None and state.deadline.reaches(wait):
            result.add(now + max(MIN_WAIT_SECONDS, wait), reason)
        return result

    def _persist(self, before: dict[str, Slot], plan: core.Plan, stats: Stats, fingerprint: str) -> dict[str, Any]:
        """The plan's slots and the ledger's metadata in one fenced write: the retired generations
        with the deletes, the letters of slots the plan drops (to ``#stats``), the spec's
        fingerprint, the strays worth a write. Returns the letters kept in ``#stats``."""
        meta: dict[str, Any] = {}
        retired = core.retired_generations(before, plan.slots, stats.get("retired"))
        if retired is not None:
            meta["retired"] = retired
        orphans = dict(stats.get("letters") or {})
        dropped = {f"{s.slot_id}#{s.generation}": s.letter for k, s in before.items() if k not in plan.slots and s.letter}
        if dropped:
            orphans.update(dropped)
            meta["letters"] = orphans
        if stats.get("spec") != fingerprint:
            meta["spec"] = fingerprint
        if core.stray_keys(plan.strays) != core.stray_keys(stats.get("strays") or {}):
            meta["strays"] = plan.strays
        puts = [slot for slot_id, slot in plan.slots.items() if before.get(slot_id) != slot]
        deletes = sorted(before.keys() - plan.slots.keys())
        held = core.own_vm_ids(plan.slots)
        facts_gone = sorted(vm for vm in stats.get("facts") or {} if vm not in held)  # the server's answers about VMs no slot holds
        if puts or deletes or meta or facts_gone:
            self.ledger.write(self.spec.fleet, self.fence, puts=puts, deletes=deletes, meta=meta or None,
                              facts_gone=facts_gone)
        return orphans

    def _tell(self, state: TickState, plan: core.Plan, now: float) -> None:
        """The plan's events, each stray once a tick (its id and age), and the gauges."""
        for told in plan.events:
            if told["event"] in ("stray_vm", "slot_dead_lettered"):
                state.told.add(told.get("microvm_id") or "")
            self.emit(told)
            if told.get("claim_to_complete") is not None:
                self.metric("ClaimToComplete", told["claim_to_complete"])
        for vm_id, entry in sorted(plan.strays.items()):
            if vm_id not in state.told:
                state.told.add(vm_id)
                self.emit({"event": "stray_vm", "microvm_id": vm_id, "state": entry.get("state"),
                           "age": round(now - float(entry.get("started_at") or now), 3),
                           "unowned_for": round(now - float(entry["first_seen"]), 3)})
        for name, value in plan.gauges.items():
            self.metric(name, value)

    def _count_runs(self, step: Step, stats: Stats) -> None:
        """RunMicrovm attempts and slots filled, into the ledger's counters and the metrics:
        attempts per slot filled since the ledger began (with nothing filled yet, the attempts
        themselves: 30 minutes of 500s must show, not divide by zero)."""
        if not (step.attempts or step.filled):
            return
        self.ledger.add_stats(self.spec.fleet, run_attempts=step.attempts, slots_filled=step.filled)
        self.metric("RunMicrovmAttempts", step.attempts)
        self.metric("SlotsFilled", step.filled)
        total = stats["run_attempts"] + step.attempts
        self.metric("RetryAmplification", round(total / max(1, stats["slots_filled"] + step.filled), 4))


__all__ = ["CALL_MARGIN_SECONDS", "Reconciler", "TickState"]


def _with_watched(state: TickState, observed: list[Observed]) -> list[Observed]:
    """``observed`` with what the step's watch read (newer than a list that may lag it)."""
    if not state.watched:
        return observed
    seen = {o.microvm_id: o for o in state.watched}
    state.watched = []
    return [seen.pop(o.microvm_id, o) for o in observed] + list(seen.values())
