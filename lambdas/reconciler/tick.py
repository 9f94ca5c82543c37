"""The reconciler's shell: observe, plan (pure, :mod:`.core`), then act under the shared budget.

A *step* lists the fleet's VMs, asks GetMicrovm about VMs of ours the list missed, reconciles the
ledger, and makes the calls the plan asks for, each one admitted by the control-plane budget. A
*tick* (one scheduled invocation) holds the fleet's fenced tick lease and runs steps until nothing
is left to do or its deadline comes, sleeping between steps for exactly as long as the budget, a
slot's backoff or a pending VM asks.

Errors of a RunMicrovm, by what they prove (docs/reconciler.md "Ownership"):

* *definite* (the call made no VM): ``ThrottlingException`` (shared backoff, not the slot's fault),
  ``ServiceQuotaExceededException`` and ``InsufficientCapacityException`` (shared backoff, a slot
  error of kind ``service``), ``ValidationException``, ``ResourceNotFoundException``,
  ``AccessDeniedException`` (a slot error of kind ``request``). The slot goes back to the queue.
* ``ConflictException``: the token was used with other parameters, so it made a VM: when the
  error names it (``resourceId``), that VM is the slot's; otherwise, on a first call, a new
  generation, and on a retry of a token in doubt, the doubt stays (below).
* *ambiguous* (``InternalServerException``, any other 5xx, a timeout or a dropped connection):
  the VM may exist. The slot is *in doubt*: it counts as live and retries with the same token
  and parameters, which returns the VM the first call made, if it made one.
* A *retry* of such a token (or of one a tick sent and died before writing the answer down) that
  is refused before the service looks at the token (throttled, ``AccessDenied``, ``Validation``,
  ``ResourceNotFound``) proves nothing about the earlier call: the slot stays in doubt (counted,
  backed off, dead-lettered still in doubt with its token kept). Only ``InsufficientCapacity``
  and ``ServiceQuotaExceeded`` (the service weighed a VM for the token and made none; one made
  earlier would have been returned) end the doubt, as in teardown.py.

Every slot error backs the slot off (2, 8, 32 s ...); ``max_start_attempts`` errors in a row
dead-letter it, with the reason, in the dead-letter queue.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError

from . import core
from .budget import Deferral, Granted
from .ledger import FencedOut

#: A tick waits for an overlapping one of its fleet only if this much of its own time is left.
HOLDER_WAIT_SPARE_SECONDS = 1.0
#: A holder's recorded end further ahead than one whole tick plus this is from a clock that runs
#: ahead (or a longer timeout): not believed, the holder is taken over.
HOLDER_SKEW_SECONDS = 35.0
#: A step waiting for our own suspend or resume to show looks again after this long.
TRANSITION_POLL_SECONDS = 5.0
MIN_WAIT_SECONDS = 0.05
#: An AWS error a step's call site does not handle (a DynamoDB throttle or 500 after the client's
#: own attempts, a timeout, a transaction cancelled for another reason than the fence): told
#: (``step_failed``), the ledger read again and the step taken again after 1, 2, 4 s, at most
#: this many times a tick. Before, any one of them ended the invocation (the fleet waited a
#: minute: 62 s below min_vms from empty; audit 13). Every write is fenced and every call written
#: down first, so a step taken again finds what the failed one did (a run by its token).
MAX_STEP_FAILURES = 3
STEP_RETRY_SECONDS = 1.0
#: Steps a tick may take past its deadline for a slot left without a VM that list (ListMicrovms
#: is shared by every fleet: a list that still shows an ended VM, a refused run), and their spacing.
MAX_OVERTIME_STEPS = 3
OVERTIME_SPACING_SECONDS = 0.5
#: ... and steps past it that do not list (they wait for tokens they booked, or run, park, get on
#: the step's list): counted apart, so that a fleet whose last runs and parking come due just
#: past its deadline is not stopped halfway (the 36-fleet benchmark run, seed 19: three steps
#: that waited, then its last five runs a minute later; 37 fleets, seed 19: its last VM parked
#: by the next tick).
MAX_OVERTIME_QUIET_STEPS = 10
#: A look at a parked slot's PENDING VM that falls at most this far past the overtime's end is
#: taken this long before the end instead (``OVERTIME_LAST_LOOK_SECONDS``): the look is timed on the
#: VM's expected end of PENDING, and a VM often runs before it. Left to the next tick, a VM RUNNING
#: from about 51 s was parked at about 62 s (round-8 attack: a poll due at 57.05 s, 0.05 s past).
OVERTIME_LAST_LOOK_REACH_SECONDS = 2.0
OVERTIME_LAST_LOOK_SECONDS = 0.3
#: The longest backoff a 429's retryAfterSeconds may set for every fleet (the service's value was
#: never measured; an artificial quota answered about 1,000 s).
MAX_RETRY_AFTER_SECONDS = 60.0
#: A step that wakes for tokens it reserved acts on the list its reservation was made with, if
#: that list is at most this old (with the VMs it started since): reserved calls then go out on
#: time instead of waiting for a list of their own, which would bunch them up behind others'.
OBSERVATION_TTL_SECONDS = 2.0
#: ... and, when the shared ListMicrovms budget has no token for a step holding due tokens, at most
#: this old (our own VMs come from the ledger and the run answers; only others' are older).
STALE_OBSERVATION_SECONDS = 10.0
#: GetMicrovm answers are reused within a tick for this long (a VM a list missed is asked once).
CONFIRM_TTL_SECONDS = 20.0
#: A step may look at the last list plus GetMicrovm answers this long after the list was made.
PEEK_TTL_SECONDS = 12.0
#: At most this many GetMicrovm peeks replace one ListMicrovms.
MAX_PEEKS = 1
#: At most this many GetMicrovm confirmations per step.
MAX_CONFIRMS_PER_STEP = 25
#: A ListMicrovms that failed on the service's side is asked again after this long in a tick.
LIST_RETRY_SECONDS = 5.0
QUOTA_BACKOFF_SECONDS = 60.0
#: GetMicrovm and ListMicrovms see the service as it was up to 0.5 s ago (measured); a read this
#: long after an answer cannot show the state from before the request.
READ_LAG_SECONDS = 0.6
#: An offset between our clock and the service's Date beyond this is not believed.
MAX_CLOCK_OFFSET_SECONDS = 300.0
#: InsufficientCapacity is not measured; it is retried soon, by every reconciler together.
CAPACITY_BACKOFF_SECONDS = 5.0
BACKOFF_CODES = {"ThrottlingException", "ServiceQuotaExceededException", "InsufficientCapacityException"}
#: The shared backoffs that say the account has no room for a new VM (their reasons).
ROOM_BACKOFFS = ("backoff:memory_quota", "backoff:insufficient_capacity")
#: How far past its deadline and overtime a tick's last calls may start (its margin is 8 s).
HARD_STOP_GRACE_SECONDS = 2.0
#: The longest a dead letter's SendMessage may take (index.LETTER_CONFIG: one attempt, 2 s to
#: connect, 3 s to read, and a margin): one is sent only with that much of the invocation left.
LETTER_SEND_SECONDS = 6.0
#: A step whose runs learned the account has no room plans again this soon (a handover).
ROOM_REPLAN_SECONDS = 0.5
REQUEST_FAILURES = {"ValidationException", "ResourceNotFoundException", "AccessDeniedException"}
SERVICE_FAILURES = {"ServiceQuotaExceededException", "InsufficientCapacityException"}
#: RunMicrovm refusals that come after the service weighed making a VM for the token: the only ones
#: that prove a token an earlier (lost) call used made no VM (as in teardown.py).
RUN_EVALUATED_NO_VM = frozenset(SERVICE_FAILURES)


@dataclass
class StepResult:
    """When the next step is worth taking, in seconds (None: not in this tick)."""

    wake_after: Optional[float]


@dataclass
class Reconciler:
    """One fleet's reconciler. ``microvms`` is a boto3 ``lambda-microvms`` client (or the
    emulator's direct client); ``ledger`` and ``budget`` are the stores; ``clock`` returns now.

    ``siblings``: the other fleets whose ledgers (same table) hold VMs of a shared image."""

    spec: core.FleetSpec
    microvms: Any
    ledger: Any
    budget: Any
    telemetry: Any
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    dead_letters: Optional[Callable[[dict[str, Any]], None]] = None
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    siblings: tuple[str, ...] = ()
    api_calls: int = 0
    list_calls: int = 0  # the ListMicrovms pages among them (overtime steps are counted by these)
    fence: Optional[int] = None
    reserve_horizon: float = OBSERVATION_TTL_SECONDS
    _observation: Optional[tuple[float, list]] = None
    _demand: dict[str, int] = field(default_factory=dict)  # calls the last step had no token for
    _deadline: float = float("inf")
    _held: dict[str, list[float]] = field(default_factory=dict)  # operation -> [ready_at, tokens]
    _confirmed: dict[str, tuple[float, Optional[core.Observed]]] = field(default_factory=dict)
    _told: set = field(default_factory=set)  # strays told in this tick
    _letters_due: bool = False  # a step of the tick sends the dead letters the queue refused before
    _letters_blocked: bool = False  # a send failed in this tick: the others wait for the next one
    _hard_stop: float = float("inf")  # this clock's time past which the invocation makes no call
    _intent_estimate: float = 0.0  # how long the next intent may take: the tick's second slowest
    _slowest_intent: float = 0.0  # the slowest intent of the tick (one outlier stands for no other)
    _no_room_until: float = float("-inf")  # the account refuses new VMs for room until then (shared clock)
    _offset: float = 0.0  # the service's clock minus ours, from the Date of its answers
    _peek_ids: list = field(default_factory=list)  # VMs the next step asks GetMicrovm about
    _park_at: Optional[float] = None  # when a parked slot's PENDING VM is worth a look (to park it)
    _replace_at: Optional[float] = None  # the last plan's replace_at (shared clock)
    _short_at_start: bool = False  # the ledger read at the tick's start had wanted slots without a VM
    _peeked: Optional[tuple[float, list]] = None  # the last peek: when, and the list with its answers
    _relooked: set = field(default_factory=set)  # parked slots' VMs a list missed, looked at again this tick
    _sleep: Optional[Callable[[float], None]] = None  # the running tick's sleep
    _run_answers: dict = field(default_factory=dict)  # VM -> (answered at, startedAt, version): this tick's runs
    _assumed: dict = field(default_factory=dict)  # parked slots' VMs assumed RUNNING this tick (-> Observed)
    _too_early: list = field(default_factory=list)  # ... whose suspend said the VM was not RUNNING yet
    _read_at: dict = field(default_factory=dict)  # VM -> when this tick last read it (a list or a get; not a run's answer)
    _suspend_failed: set = field(default_factory=set)  # VMs whose suspend failed ambiguously this tick: not sent again in it
    _loaded: Optional[tuple] = None  # the tick's first ledger read, for its first step's plan (then None)

    # ------------------------------------------------------------------ ticks and steps

    def tick(self, deadline_seconds: float = 50.0, sleep: Optional[Callable[[float], None]] = None,
             lease_seconds: float = 120.0, overtime_seconds: float = 0.0) -> dict[str, Any]:
        """One scheduled run: take the tick lease, step until done or the deadline, release.

        ``overtime_seconds``: how far past the deadline more steps may start (MAX_OVERTIME_STEPS),
        only for a base VM that nothing can replace before its end (``max_vms == min_vms``,
        nothing parked) and that ends in that time, and for a base slot still without a VM after
        a step (its run refused, no token yet). Left to the next scheduled tick, an end that fell
        between this tick's deadline and the next tick was replaced up to 10 s late (the 37-fleet
        benchmark day, seed 5). The lease is recorded to end at the deadline: a tick that starts
        during the overtime takes it over at once, and the fence stops this one at its next write."""
        sleep = self._sleep = sleep or self.sleep
        start = self.clock()
        # No call starts past the deadline and the overtime (and a little more: a step the overtime
        # wakes at its very end still acts), nor an intent that would not end before it, judged by
        # the tick's second slowest so far (_intent_took): a store answering 2.5 s late ran a
        # tick's intents to 110 s, past the function's 65 s.
        self._hard_stop = start + deadline_seconds + overtime_seconds + HARD_STOP_GRACE_SECONDS
        self._intent_estimate = self._slowest_intent = 0.0
        if not self._wait_for_holder(start, deadline_seconds, sleep):
            self.telemetry.flush()
            return {"fleet": self.spec.fleet, "skipped": "holder_covers_fleet"}
        failures = 0
        while True:
            try:
                began = self.begin_tick(lease_seconds, start + deadline_seconds - self.clock())
                break
            except (ClientError, BotoCoreError) as exc:  # the lease's store, after its own attempts
                failures += 1
                wait = STEP_RETRY_SECONDS * 2 ** (failures - 1)
                code = self._step_failed(exc, "begin_tick")
                if failures >= MAX_STEP_FAILURES or self.clock() + wait >= start + deadline_seconds:
                    self.telemetry.flush()
                    return {"fleet": self.spec.fleet, "skipped": "store_error", "code": code}
                sleep(wait)
        if not began:
            return {"fleet": self.spec.fleet, "skipped": "tick_in_progress"}  # pragma: no cover - both ledgers' acquire_tick always takes the lease (a fenced takeover)
        steps = overtime_steps = overtime_quiet = 0
        calls = self.api_calls
        outcome: dict[str, Any] = {}
        demand = True
        try:
            while True:
                lists = self.list_calls
                if steps and self.clock() + self._intent_estimate >= self._hard_stop:
                    break
                try:
                    if demand:
                        self._demand_from_ledger()
                        demand = False
                    result = self.step()
                except (ClientError, BotoCoreError) as exc:
                    failures += 1
                    outcome["step_failures"] = failures
                    self._step_failed(exc, "step")
                    self._loaded = None  # read the ledger again: the failed write may have landed
                    if failures >= MAX_STEP_FAILURES:
                        break
                    result = StepResult(STEP_RETRY_SECONDS * 2 ** (failures - 1))
                steps += 1
                if self._deadline > start + deadline_seconds and self.list_calls == lists:
                    overtime_steps, overtime_quiet = overtime_steps - 1, overtime_quiet + 1  # it did not list
                wake = result.wake_after
                if wake is None or self.clock() + wake > start + deadline_seconds:
                    until = start + deadline_seconds + overtime_seconds
                    wake = self._overtime_wake(until, overtime_steps, wake, overtime_quiet)
                    if wake is None:
                        break
                    # The steps past the deadline reserve and wait within the overtime, not the deadline.
                    self._deadline = until
                    overtime_steps += 1
                sleep(wake)
        except FencedOut:
            outcome["lease_lost"] = True
            self._emit({"event": "lease_lost", "reason": "another tick took the lease; this one stops"})
        finally:
            self.end_tick()
        return {"fleet": self.spec.fleet, "steps": steps, "api_calls": self.api_calls - calls, **outcome}

    def _overtime_wake(self, until: float, taken: int, wake_after: Optional[float], quiet: int = 0) -> Optional[float]:
        """The wait before one more step past the deadline (None: none): for a base slot the last
        plan left without a VM (``Plan.replace_at``: a VM that nothing replaces before its end, or
        a slot whose VM ended), when it comes before ``until`` (this process's clock), and not
        before the step's own wait (a refused run's backoff, the shared budget). Three steps that
        list a tick at most (a list that still showed the VM, a refused run), and
        MAX_OVERTIME_QUIET_STEPS that did not; OVERTIME_SPACING_SECONDS at least between them,
        unless tokens this tick booked come due sooner (left waiting, they would be spent late,
        on top of other fleets' calls, or dropped)."""
        if self._replace_at is None or taken >= MAX_OVERTIME_STEPS or quiet >= MAX_OVERTIME_QUIET_STEPS:
            return None
        spacing = MIN_WAIT_SECONDS if not (taken or quiet) or self._held else OVERTIME_SPACING_SECONDS
        wake = max(spacing, self._replace_at - self._now(), wake_after or 0.0)
        left = until - self.clock()
        if wake > left:
            # A parked slot's PENDING VM due for a look just past the end: looked at before it.
            last = left - OVERTIME_LAST_LOOK_SECONDS
            parking = self._park_at is not None and self._replace_at >= self._park_at - 1e-6
            if not (parking and wake - left <= OVERTIME_LAST_LOOK_REACH_SECONDS
                    and last >= max(spacing, wake_after or 0.0)):
                return None
            wake = last
        self._emit({"event": "tick_overtime", "reason": "a base slot is, or is about to be, without a VM",
                    "wake": round(wake, 3)})
        return wake

    def _wait_for_holder(self, start: float, deadline_seconds: float, sleep: Callable[[float], None]) -> bool:
        """Whether this invocation should tick, after waiting (if it can) for an overlapping one
        of the fleet (the deploy's invocation and the first scheduled one, a duplicate delivery).

        * No holder, or one past its recorded end (killed without releasing): tick at once.
        * A holder whose end is plausible and leaves this one time to work: wait for it, then
          tick (taken over, the holder would drop the budget tokens it reserved).
        * A holder whose end is plausible but too late to wait for: skip (``tick_skipped``). The
          holder covers the fleet until its end; taken over, it would stop at its next write and,
          if this invocation then died, nobody would act on the fleet until the next schedule
          (a 20.7 s dip of a base VM's successor on the 37-fleet benchmark day, seed 3).
        * A holder that says it ends implausibly late (past a whole tick plus the clock skew we
          tolerate: its clock runs ahead): taken over at once; the fence keeps both safe."""
        busy_until = getattr(self.ledger, "busy_until", None)
        # uncovered: both ledgers (DynamoLedger, MemoryLedger) have busy_until; kept for a ledger object without one
        if busy_until is None:
            return True
        try:
            until = busy_until(self.spec.fleet)
        # uncovered: needs DynamoDB failing on the lease read of a tick's start but not on the writes after it; no test injects that
        except (ClientError, BotoCoreError):
            return True  # the lease item cannot be read: take over (the fence keeps both safe)
        # Ends are written and weighed on the shared (service's) clock: a holder 30 s ahead
        # looked as if it ended 30 s later (skipped: the fleet uncovered after its real end).
        now = self._now()
        if until is None or until <= now:
            return True
        if until - now > deadline_seconds + HOLDER_SKEW_SECONDS:
            self._emit({"event": "tick_takeover", "reason": "holder_end_implausible", "holder_ends_in": round(until - now, 3)})
            return True
        wait = until - now + MIN_WAIT_SECONDS
        if wait <= deadline_seconds - HOLDER_WAIT_SPARE_SECONDS - (self.clock() - start):
            self._emit({"event": "tick_waiting", "reason": "another tick of the fleet ends first",
                        "wait": round(wait, 3)})
            sleep(wait)
            return True
        self._emit({"event": "tick_skipped", "reason": "holder_covers_fleet", "holder_ends_in": round(until - now, 3)})
        return False

    def _demand_from_ledger(self) -> None:
        """The runs the ledger says are due become this tick's first demand: reserved before the
        first list, so a fleet that waits for the shared RunMicrovm budget lists once, when its
        tokens come due (at hundreds of fleets, listing first and again after the wait was a
        quarter of all calls)."""
        loaded = self.ledger.load(self.spec.fleet)
        # The tick's first step plans on this read: nothing but this tick writes the fleet's
        # slots while it holds the lease (every write is fenced), so a second Query before the
        # first list would read the same items (one DynamoDB call of about seven a tick).
        self._loaded = loaded
        due = core.ledger_demand(self.spec, loaded[0], self._now())
        self._short_at_start = bool(due)
        if due:
            self._demand["RunMicrovm"] = min(due, self.spec.max_starts_per_step)

    def begin_tick(self, lease_seconds: float = 120.0, deadline_seconds: float = 50.0) -> bool:
        """Take the fleet's tick lease, from a tick still holding it too: the newest invocation
        has the latest deadline (and a killed one's lease must not hold the fleet back). The
        older tick's next ledger write fails on the fence and it stops (``lease_lost``)."""
        holder = uuid.uuid4().hex  # each tick its own holder: a second tick of this object waits too
        now = self._now()  # the shared clock: another invocation weighs this end (_wait_for_holder)
        fence = self.ledger.acquire_tick(self.spec.fleet, holder, now, lease_seconds, tick_until=now + deadline_seconds)
        if fence:
            self.holder, self.fence = holder, fence
            self._deadline = self.clock() + deadline_seconds
            self._told = set()
            self._confirmed = {}
            self._letters_due = True  # the ledger's unsent dead letters: sent by a step with time left
            self._letters_blocked = False
            return True
        # A ledger that refuses the lease (both ledgers here always take it over: fence, not clock).
        self._emit({"event": "tick_skipped", "reason": "another tick holds the lease"})  # pragma: no cover - both ledgers' acquire_tick always takes the lease (a fenced takeover)
        self.telemetry.flush()  # pragma: no cover - both ledgers' acquire_tick always takes the lease (a fenced takeover)
        return False  # pragma: no cover - both ledgers' acquire_tick always takes the lease (a fenced takeover)

    def end_tick(self) -> None:
        """Release the lease; reservations not used are given up with it."""
        self._held.clear()
        self._demand.clear()
        self._peek_ids = []
        self._park_at = None
        self._replace_at = None
        self._observation = None
        self._peeked = None
        self._relooked = set()
        self._run_answers, self._assumed, self._too_early = {}, {}, []
        self._read_at, self._suspend_failed = {}, set()
        self._loaded = None
        self._short_at_start = False
        self._deadline = self._hard_stop = float("inf")
        try:
            self.ledger.release_tick(self.spec.fleet, self.holder)
        except (ClientError, BotoCoreError) as exc:
            # Not released: the lease ends at its recorded end, and the next tick takes it then.
            self._step_failed(exc, "end_tick")
        self.telemetry.flush()

    def _step_failed(self, exc: Exception, where: str) -> str:
        """Tell an AWS error no call site handled (``step_failed``); its code."""
        code = _code(exc) if isinstance(exc, ClientError) else type(exc).__name__
        self._emit({"event": "step_failed", "where": where, "code": code,
                    "operation": getattr(exc, "operation_name", None), "error_message": str(exc)[:300]})
        return code

    def step(self) -> StepResult:
        """Observe, plan, act. Returns when the next step is worth taking (None: not this tick)."""
        now = self._now()
        fleet = self.spec.fleet
        # Calls the last step had no token for: reserve them before listing again, so a fleet
        # waiting for the shared budget does not spend a ListMicrovms on every try.
        demand_waits = []
        for operation, count in list(self._demand.items()):
            if operation in self._held:
                continue
            decision = self._admit(operation, now, count)
            if isinstance(decision, Deferral) and decision.reason in ROOM_BACKOFFS:
                # The account has no room for a new VM (402, no capacity): not worth waiting for
                # before a plan, which hands parked VMs to base slots without a RunMicrovm (with
                # the quota's 60 s backoff every tick waited it out, and no base slot ever took
                # a parked VM: audit 13).
                del self._demand[operation]
                continue
            if isinstance(decision, Deferral):
                demand_waits.append(decision.retry_after_seconds)
                continue
            self._held.setdefault(operation, [now, 0])[1] += 1  # the token _admit handed out: keep it
            del self._demand[operation]
        ready = any(ready_at <= now + 1e-6 and n >= 1 for ready_at, n in self._held.values())
        # A parked slot's VM that should be RUNNING by now is parked while the fleet waits for
        # RunMicrovm tokens: SuspendMicrovm (2/s) has its own quota, and left until the run
        # tokens come due (a whole round of the shared budget at dozens of fleets) the suspends
        # of every fleet bunch up at the end of convergence.
        park_due = self._park_at is not None and self._park_at <= now + 1e-6
        if demand_waits and not ready and not park_due:
            wait = min(demand_waits + [at - now for at, n in self._held.values() if n >= 1]
                       + ([self._park_at - now] if self._park_at is not None else []))
            if self.clock() + wait >= self._deadline:
                # uncovered: tokens past the deadline for successors only (their slots hold VMs: nothing short); no test books a successor's token that late
                if self._replace_at is not None or self._short_at_start:
                    # Wanted slots without a VM wait for these tokens: worth the overtime, from when
                    # they come due. A tick that took the lease over from one in its overtime (whose
                    # wait for it left 2.6 s of its own) planned nothing yet and stopped, and nobody
                    # started them until the next minute (41 fleets, seed 215268: 11.8 s lost).
                    due_at = now + wait
                    self._replace_at = due_at if self._replace_at is None else min(self._replace_at, due_at)
                return StepResult(None)
            return StepResult(max(MIN_WAIT_SECONDS, wait))
        self._demand.clear()
        self._short_at_start = False  # a plan from here on: _replace_at says what is short
        # A look planned at a parked slot's VM (PENDING, or not listed yet) that this step does not
        # make (it spends tokens that came due on the last look) is still owed after it.
        owed_look = (self._park_at, list(self._peek_ids)) if self._park_at is not None and not park_due else None
        self._park_at = None
        # A step on a look older than a list a step may reuse (only suspends came due) ends or
        # resumes nothing (a parked VM a client may have resumed since): that waits for a fresh
        # list. Its runs stand on the look as a peek's do (the ledger counts every run of ours).
        suspends_only = False
        looked = None
        if ready and self._observation is not None and now - self._observation[0] <= OBSERVATION_TTL_SECONDS:
            observed = list(self._observation[1])
        elif ready and (looked := self._last_look(now, parking_only=self._parking_only(now))) is not None:
            # Tokens that came due just after a look (a suspend of the VM the look saw RUNNING,
            # deferred a moment by the shared SuspendMicrovm budget) act on that look: nothing this
            # tick did since can have changed what a list would show of those VMs, and the rest is
            # a list a peek may stand on (PEEK_TTL_SECONDS).
            observed = looked
            suspends_only = self._parking_only(now)
        elif not ready and (peeked := self._peek(now)) is not None:
            observed = peeked
            owed_look = None
        else:
            observed = self._list(now)
            if not isinstance(observed, Deferral):
                self._observation = (now, list(observed))
                self._peeked = None
                owed_look = None
            elif (ready and self._observation is not None and observed.reason == "budget_empty"
                  and now - self._observation[0] <= STALE_OBSERVATION_SECONDS):
                # No list to be had now (ListMicrovms is shared by every fleet): tokens that came
                # due are spent on the last list, a few seconds old, with the VMs started since,
                # rather than given up (a refill of the shared quota that nobody would use). It
                # ends and resumes nothing: a parked VM it shows SUSPENDED a client may have
                # resumed since (found by the round-8 attack: a client's session terminated as
                # above max_vms on a 3 s old list); that waits for a fresh list.
                observed = list(self._observation[1])
                suspends_only = True
        if isinstance(observed, Deferral):
            self._drop_due(now)  # reserved calls cannot wait for a list: given up, never sent late
            if self.clock() + observed.retry_after_seconds >= self._deadline:
                return StepResult(None)  # no list before the deadline: the next tick
            return StepResult(max(MIN_WAIT_SECONDS, observed.retry_after_seconds))
        loaded, self._loaded = self._loaded, None
        slots, stats = loaded or self.ledger.load(fleet)
        confirmed = self._confirm(slots, observed, now)
        if confirmed:  # a get's answer is newer than the list's line about the same VM
            known = {o.microvm_id for o in confirmed}
            observed = [o for o in observed if o.microvm_id not in known] + confirmed
        observed = self._assume_running(observed, slots, now)
        observed = self._unread_doubts_hidden(observed, slots)
        others = self.ledger.load_vm_ids(self.siblings) if self.siblings else set()
        fingerprint = self.spec.fingerprint()
        no_room = self._no_room_until > now
        plan = core.plan(self.spec, slots, observed, now, others=others, strays=stats.get("strays") or {},
                         redrive=stats.get("spec") not in (None, fingerprint), retired=stats.get("retired") or {},
                         no_room=no_room)
        meta: dict[str, Any] = {}
        retired = core.retired_generations(slots, plan.slots, stats.get("retired"))
        if retired is not None:
            meta["retired"] = retired  # in the same fenced write as the deletes
        # A letter of a slot the plan drops (the spec lowered) moves to #stats, in the same write.
        orphans = dict(stats.get("letters") or {})
        dropped = {f"{s.slot_id}#{s.generation}": s.letter for k, s in slots.items() if k not in plan.slots and s.letter}
        if dropped:
            orphans.update(dropped)
            meta["letters"] = orphans
        if stats.get("spec") != fingerprint:
            meta["spec"] = fingerprint
        if _stray_keys(plan.strays) != _stray_keys(stats.get("strays") or {}):
            meta["strays"] = plan.strays
        self._persist(slots, plan.slots, meta)
        for event in plan.events:
            if event["event"] == "stray_vm" or event["event"] == "slot_dead_lettered":
                self._told.add(event.get("microvm_id"))
            self._emit(event)
            if event.get("claim_to_complete") is not None:
                self.telemetry.metric(fleet, "ClaimToComplete", event["claim_to_complete"])
        fresh_letters = [e["slot"] for e in plan.events if e["event"] == "slot_dead_lettered"]
        for vm_id, entry in sorted(plan.strays.items()):
            if vm_id not in self._told:  # once per tick per stray: its id and age
                self._told.add(vm_id)
                self._emit({"event": "stray_vm", "microvm_id": vm_id, "state": entry.get("state"),
                            "age": round(now - float(entry.get("started_at") or now), 3),
                            "unowned_for": round(now - float(entry["first_seen"]), 3)})
        for name, value in plan.gauges.items():
            self.telemetry.metric(fleet, name, value)
        waits: list[float] = []
        live = plan.live_vms
        width = self.spec.max_starts_per_step
        runs = attempts = filled = 0
        runs_planned = sum(1 for i in plan.intents if i.kind == "run")
        slots = plan.slots
        budget_out: set[str] = set()
        run_waits: list[float] = []  # waits for the shared RunMicrovm budget (not for this fleet's VMs)
        started_warm: list[str] = []
        at_max: set[str] = set()  # slots whose run waits for room under max_vms (clients' VMs, say)
        park_waits: list[float] = []  # when suspends the shared budget deferred come due
        began_at: Optional[float] = None
        for intent in plan.intents:
            if began_at is not None:  # the intent before this one: how long its calls took
                self._intent_took(self.clock() - began_at)
            if self.clock() + self._intent_estimate >= self._hard_stop:
                break  # the invocation's time is up: the rest waits for the next tick
            began_at = self.clock()
            if suspends_only and intent.kind in ("terminate", "resume"):
                waits.append(0.0)  # a parked VM a client may have taken since: after a fresh list
                continue
            if intent.kind == "run":
                slot = slots.get(intent.slot_id)
                if slot is None or "RunMicrovm" in budget_out:
                    continue
                if live >= self.spec.max_vms and not intent.retry:
                    self._note(slot, "max_vms_reached", intent)
                    at_max.add(slot.slot_id)
                    continue
                if runs >= width:
                    waits.append(0.0)
                    continue
                want = max(1, min(runs_planned - runs, width - runs, max(1, self.spec.max_vms - live)))
                calls_before = self.api_calls
                outcome = self._run(slot, intent, stats["epoch"], now, want, slots)
                attempts += self.api_calls - calls_before  # every RunMicrovm sent, failed ones too
                if isinstance(outcome, Deferral):
                    waits.append(outcome.retry_after_seconds)
                    if outcome.reason in ("budget_empty", "reserved"):
                        run_waits.append(outcome.retry_after_seconds)
                    if outcome.reason == "budget_empty":
                        self._demand["RunMicrovm"] = want
                    budget_out.add("RunMicrovm")  # empty (or the service said no) for every run after this
                    continue
                runs += 1
                if outcome == "started":
                    if not intent.retry:
                        live += 1
                    filled += 1
                    if slot.role == core.WARM:
                        waits.append(core.PENDING_POLL_SECONDS)  # to park it once it runs
                        started_warm.append(slots[intent.slot_id].microvm_id)
                elif outcome == "in_doubt":
                    if not intent.retry:
                        live += 1  # the VM may exist (a lost response): counted until proven
                    waits.append(core.retry_delay(slots[intent.slot_id].errors))
                elif outcome == "retry_later":
                    waits.append(core.retry_delay(max(1, slots[intent.slot_id].errors)))
            else:
                operation = _OPERATIONS[intent.kind][0]
                if operation in budget_out:
                    continue
                if intent.kind == "suspend" and intent.microvm_id in self._suspend_failed:
                    continue  # failed ambiguously in this tick (sent again once at most): the next tick's turn
                want = sum(1 for i in plan.intents if i.kind == intent.kind)
                decision = self._call(intent, now, want, slots)
                if isinstance(decision, Deferral):
                    waits.append(decision.retry_after_seconds)
                    budget_out.add(operation)
                    if intent.kind == "suspend":  # a parked slot's VM still to park: worth overtime
                        park_waits.append(now + decision.retry_after_seconds)
                    # uncovered: Suspend/Terminate/Resume budget empty beyond the reserve horizon (2 s): dozens of fleets parking at once; the tests never exhaust those quotas
                    if decision.reason == "budget_empty" and intent.kind in ("suspend", "terminate", "resume"):
                        self._demand[operation] = want
        if began_at is not None:
            self._intent_took(self.clock() - began_at)
        # Dead letters after the step's calls (a queue that hangs must not hold the runs back): the
        # ones this plan made, and once a tick every one the queue refused before.
        if self._letters_due:
            self._letters_due = False
            self._send_letters(slots, orphans=orphans)
        else:
            self._send_letters(slots, fresh_letters, orphans=orphans)
        if not no_room and self._no_room_until > now and _parked_for_base(slots):
            # The account said "no room" during this step's runs: a plan soon hands parked VMs to
            # the base slots still without one (left to the next tick, three base slots of 40
            # waited a minute with 13 VMs parked).
            waits.append(ROOM_REPLAN_SECONDS)
        # What a tick may work past its deadline for: a base VM that nothing replaces before its
        # end, wanted slots still without a VM after this step's runs (refused, or no token yet;
        # first fills too; not one that waits for room under max_vms: clients may hold it for
        # hours), and (below) parked slots' new VMs to park.
        short = {k: v for k, v in slots.items() if k not in at_max}
        dues = [at for at in (plan.replace_at, core.short_slot_due(short, now), *park_waits) if at is not None]
        self._replace_at = min(dues) if dues else None
        if attempts or filled:
            self.ledger.add_stats(fleet, run_attempts=attempts, slots_filled=filled)
            total_attempts = stats["run_attempts"] + attempts
            total_filled = stats["slots_filled"] + filled
            self.telemetry.metric(fleet, "RunMicrovmAttempts", attempts)
            self.telemetry.metric(fleet, "SlotsFilled", filled)
            # Attempts per slot filled since the ledger began; with nothing filled yet, the
            # attempts themselves (30 minutes of 500s must show, not divide by zero).
            self.telemetry.metric(fleet, "RetryAmplification", round(total_attempts / max(1, total_filled), 4))
        self._drop_due(now)
        # Waking only for parked slots' PENDING VMs: the next step asks GetMicrovm about them (its
        # own quota, 100/s) on top of this list, instead of listing again (ListMicrovms, 10/s,
        # shared by every fleet, is what a fleet count of dozens waits on while converging).
        # Waits for the shared RunMicrovm budget do not need a list either: the tokens' step lists
        # (or uses a list of at most 2 s) when they come due.
        # The VMs this step started for parked slots are waited for too: looked at with the others.
        pending = list(plan.pending_warm) + [vm for vm in started_warm if vm and vm not in plan.pending_warm]
        # Parked slots' young VMs the look did not show (lists lag new VMs): looked at again, with
        # GetMicrovm (a list would miss them again), not left RUNNING until the next tick.
        listed_at = self._observation[0] if self._observation is not None else now
        # Once per VM and tick: a VM that neither lists nor gets show is the next tick's (bounded cost).
        unlisted = [vm for vm in _unlisted_warm(plan.slots, observed, listed_at, now, mine=self._run_answers)
                    if vm not in started_warm and vm not in self._relooked]
        self._relooked.update(unlisted)
        if unlisted:
            pending += [vm for vm in unlisted if vm not in pending]
            waits.append(core.PENDING_POLL_SECONDS)
        if self._too_early:  # assumed RUNNING too early (a slow start): looked at as before
            pending += [vm for vm in self._too_early if vm not in pending]
            waits.append(core.PENDING_POLL_SECONDS)
            self._too_early = []
        other = list(waits)
        for w in run_waits:
            other.remove(w)
        only_pending = pending and not any(w != core.PENDING_POLL_SECONDS for w in other)
        peek_all = (len(pending) <= MAX_PEEKS or (unlisted and len(pending) <= MAX_CONFIRMS_PER_STEP)
                    or all(self._assumable(vm) for vm in pending))
        self._peek_ids = pending if only_pending and peek_all else []
        if pending or started_warm:
            self._park_at = now + (core.PENDING_POLL_SECONDS if started_warm or plan.wake_at is None
                                   else max(core.PENDING_POLL_SECONDS, plan.wake_at - now))
            # A VM this tick ran is assumed RUNNING PENDING_POLL_SECONDS after its run's answer
            # (_assume_running), not after this step: a step that parked earlier VMs in the
            # meantime must not put its look off (2 fleets, seed 41: a parked slot's VM run at
            # 2.3 s, looked at from the 4.3 s step's time, was parked at 6.9 s, not 5.3 s).
            assumable = [self._run_answers[vm][0] + core.PENDING_POLL_SECONDS for vm in pending
                         if self._assumable(vm) and vm in self._run_answers]
            if assumable:
                self._park_at = max(now + MIN_WAIT_SECONDS, min([self._park_at] + assumable))
                # ... and the step wakes for it: the plan's own look at the PENDING VM is
                # PENDING_POLL_SECONDS from this step (1 fleet, seed 5059040: a parked slot's VM
                # run at 0.632 s, the step at 2.6 s that parked the one before planned its look
                # for 3.232 s and slept till 5.2 s; converged at 6.6 s against a goal of 6.56 s).
                waits.append(self._park_at - now)
            self._replace_at = min(self._park_at, self._replace_at or self._park_at)
        if owed_look is not None:
            # 43 fleets, seed 81868: the suspends of a tick that took the lease over came due
            # one by one on its first list, each step dropped the look planned for the VM that
            # list had not shown yet, and it was parked by the next minute's tick, 24 s late.
            at, peeks = owed_look
            self._park_at = at if self._park_at is None else min(self._park_at, at)
            self._peek_ids = self._peek_ids + [vm for vm in peeks if vm not in self._peek_ids]
            self._replace_at = min(self._park_at, self._replace_at or self._park_at)
            waits.append(max(0.0, at - now))
        if plan.wake_soon:
            waits.append(TRANSITION_POLL_SECONDS)
        if plan.wake_at is not None:
            waits.append(max(0.0, plan.wake_at - now))
        # A floor on waits: float edges of the buckets must not turn into a busy loop.
        return StepResult(max(MIN_WAIT_SECONDS, min(waits)) if waits else None)

    def _intent_took(self, seconds: float) -> None:
        """The next intent is expected to take as long as the second slowest of the tick: a slow
        store slows every one (2.5 s a DynamoDB call: intents of 10 s, stopped 10 s before the
        hard stop), one slow answer or a clock step does not. Before, the slowest one stood for
        every later one: one RunMicrovm answered 7.5 s late (or a clock step of 30 s during it)
        ended a tick with three of its four runs not sent (audit 14: 62 s below min_vms with
        room), one 14 s late cost a tick two of its seven runs."""
        seconds = max(0.0, seconds)
        self._intent_estimate = max(self._intent_estimate, min(seconds, self._slowest_intent))
        self._slowest_intent = max(self._slowest_intent, seconds)

    def _drop_due(self, now: float) -> None:
        """Tokens that came due for this step and were not spent are given up: spent later they
        would land on top of other reconcilers' on-time calls, a burst above the service quota."""
        for operation in [op for op, (ready, _) in self._held.items() if ready <= now + 1e-6]:
            del self._held[operation]

    # ------------------------------------------------------------------ observing

    def _confirm(self, slots: dict[str, core.Slot], observed: list[core.Observed], now: float) -> list[core.Observed]:
        """GetMicrovm for VMs of ours the list did not show (old enough for the answer to mean
        something): their state, ``GONE`` when the service no longer knows them, nothing (live,
        unknown) when the get fails or the budget says wait."""
        out: list[core.Observed] = []
        asked = 0
        for vm_id in core.to_confirm(slots, {o.microvm_id: o for o in observed}, now):
            cached = self._confirmed.get(vm_id)
            # uncovered: a VM a list misses in two steps of one tick less than CONFIRM_TTL_SECONDS apart; no test lags a list that long
            if cached is not None and now - cached[0] <= CONFIRM_TTL_SECONDS:
                if cached[1] is not None:
                    out.append(cached[1])
                continue
            # uncovered: more than MAX_CONFIRMS_PER_STEP (25) VMs missing from one list, or the GetMicrovm budget (100/s) empty; no test reaches either
            if asked >= MAX_CONFIRMS_PER_STEP or isinstance(self._admit("GetMicrovm", now), Deferral):
                continue
            asked += 1
            seen: Optional[core.Observed] = None
            try:
                vm = self._api("get_microvm", microvmIdentifier=vm_id)
                seen = core.Observed(vm_id, vm["state"], _epoch(vm["startedAt"]), vm.get("imageVersion"),
                                     vm.get("stateReason"))
            except ClientError as exc:
                # uncovered: a GetMicrovm error other than 404 (throttle, 500) while confirming a missed VM; no test injects a fault at that call
                if _code(exc) == "ResourceNotFoundException":
                    seen = core.Observed(vm_id, core.GONE, 0.0, reason="not_found")
                else:
                    self._failed("GetMicrovm", exc, now)
            except BotoCoreError as exc:
                self._emit({"event": "api_error", "operation": "GetMicrovm", "code": type(exc).__name__})
            self._confirmed[vm_id] = (now, seen)
            if seen is not None:
                self._read_at[vm_id] = now
                out.append(seen)
                self._emit({"event": "vm_confirmed", "microvm_id": vm_id, "state": seen.state, "end_reason": seen.reason})
        return out

    def _peek(self, now: float) -> Optional[list[core.Observed]]:
        """The last list, with GetMicrovm's word on the VMs the last step waited for (None: list)."""
        ids, self._peek_ids = self._peek_ids, []
        if not ids or self._observation is None or now - self._observation[0] > PEEK_TTL_SECONDS:
            return None
        fresh: dict[str, core.Observed] = {}
        for vm_id in ids:
            if self._assumable(vm_id) or self._assumed_running(vm_id):
                continue  # no read: assumed RUNNING by the step (_assume_running)
            # uncovered: the GetMicrovm budget (100/s) empty during a peek; no test exhausts it
            if isinstance(self._admit("GetMicrovm", now), Deferral):
                return None
            try:
                vm = self._api("get_microvm", microvmIdentifier=vm_id)
            except ClientError as exc:
                self._failed("GetMicrovm", exc, now)  # told (a throttle also backs every reconciler off)
                return None
            # uncovered: a dropped connection or client timeout on a peek; the emulator's faults answer over HTTP (latency is real time)
            except BotoCoreError as exc:
                self._emit({"event": "api_error", "operation": "GetMicrovm", "code": type(exc).__name__})
                return None
            fresh[vm_id] = core.Observed(vm_id, vm["state"], _epoch(vm["startedAt"]), vm.get("imageVersion"),
                                         vm.get("stateReason"))
            self._read_at[vm_id] = now
        if not fresh:  # nothing read (every VM assumed RUNNING): not a look of its own
            return list(self._observation[1])
        listed = {o.microvm_id for o in self._observation[1]}
        # VMs started after the list (this tick's parked slots' runs) join it with their answers.
        merged = [fresh.get(o.microvm_id, o) for o in self._observation[1]] + [
            o for vm_id, o in fresh.items() if vm_id not in listed]
        self._peeked = (now, merged)
        return list(merged)

    def _assumable(self, vm_id: str) -> bool:
        """A VM this tick started (its run answered), not assumed RUNNING yet, in a tick where no
        assumption was refused."""
        return vm_id in self._run_answers and vm_id not in self._assumed and None not in self._assumed.values()

    def _assumed_running(self, vm_id: str) -> bool:
        """Assumed RUNNING, and no suspend said otherwise."""
        return self._assumed.get(vm_id) is not None

    def _assume_running(self, observed: list[core.Observed], slots: dict[str, core.Slot],
                        now: float) -> list[core.Observed]:
        """Parked slots' VMs this tick started that no read has shown RUNNING yet, once
        ``core.PENDING_POLL_SECONDS`` have passed since their runs were answered: assumed RUNNING
        (once per VM and tick), so their suspends go out without a look of their own (a GetMicrovm
        or a ListMicrovms per fleet that converges). PENDING lasts 2 s (measured p50 1.85 s, p95
        2.13 s; 3.59 s with 20 runs at once); a VM still PENDING refuses the suspend (409, told
        with ``assumed_running``): it is looked at as before, and nothing more is assumed in the
        tick. A read that shows more than PENDING wins over the assumption."""
        seen = {o.microvm_id: o for o in observed}
        assumed: dict[str, core.Observed] = {}
        for slot in slots.values():
            vm_id = slot.microvm_id
            if slot.role != core.WARM or slot.phase not in (core.STARTING, core.PARKING) or not vm_id:
                continue
            shown = seen.get(vm_id)
            if shown is not None and shown.state != "PENDING":
                continue  # a read shows more than the run's answer did
            if slot.parking_since is not None or slot.park_doubt_since is not None:
                # Our suspend was sent (accepted, or its answer lost): the assumption was for that
                # suspend only. A list that misses the VM later must not read as RUNNING (past the
                # park grace: a parked VM taken for a client's, a member, the pool refilled), nor
                # settle a lost suspend's doubt (only a read of the VM may).
                continue
            if self._assumable(vm_id) and slot.phase == core.STARTING:
                answered, started, version = self._run_answers[vm_id]
                if now - answered < core.PENDING_POLL_SECONDS - 1e-6:
                    continue
                self._assumed[vm_id] = core.Observed(vm_id, "RUNNING", started, version)
            if self._assumed.get(vm_id) is not None:
                assumed[vm_id] = self._assumed[vm_id]
        if not assumed:
            return observed
        return [o for o in observed if o.microvm_id not in assumed] + list(assumed.values())

    def _unread_doubts_hidden(self, observed: list[core.Observed], slots: dict[str, core.Slot]) -> list[core.Observed]:
        """A VM whose suspend's answer was lost (``park_doubt_since``) is shown to the plan only as
        a read made ``READ_LAG_SECONDS`` after that suspend was sent shows it: a reused list, a
        look from before the suspend or a run's answer shows the VM as it was before the suspend
        (RUNNING or PENDING), which would settle the doubt wrongly (``not_landed``: the suspend
        sent again, later, on a session a client may have resumed since). Hidden, the VM is live
        and unknown until such a read (the next list)."""
        doubted = {s.microvm_id: s.park_doubt_since for s in slots.values()
                   if s.park_doubt_since is not None and s.microvm_id}
        if not doubted:
            return observed
        return [o for o in observed if o.microvm_id not in doubted
                or self._read_at.get(o.microvm_id, float("-inf")) >= doubted[o.microvm_id] + READ_LAG_SECONDS]

    def _parking_only(self, now: float) -> bool:
        """Whether the only tokens due now are SuspendMicrovm's (parking VMs of our own)."""
        due = [op for op, (ready_at, n) in self._held.items() if ready_at <= now + 1e-6 and n >= 1]
        return bool(due) and all(op == "SuspendMicrovm" for op in due)

    def _last_look(self, now: float, parking_only: bool = False) -> Optional[list[core.Observed]]:
        """The last look of this tick (a list, or a peek on it) a step may act on without listing
        again: one as fresh as a list a step may reuse (OBSERVATION_TTL_SECONDS), or, when only
        suspends came due, one a peek may stand on (PEEK_TTL_SECONDS: the VMs to park are our own,
        seen RUNNING by it, and a suspend of one that ended since is refused by the service).
        None: list."""
        if self._observation is None or now - self._observation[0] > PEEK_TTL_SECONDS:
            return None
        ttl = PEEK_TTL_SECONDS if parking_only else OBSERVATION_TTL_SECONDS
        look = self._peeked if self._peeked is not None else self._observation
        if now - look[0] > ttl:
            return None
        return list(look[1])

    def _list(self, now: float) -> list[core.Observed] | Deferral:
        """Every page of the image's VMs (TERMINATED ones stay listed 20 minutes: churn multiplies
        them). A page after the first waits for its token within the tick, the pages read kept:
        before, a page past the budget's burst returned the deferral and dropped the pages read,
        and each retry read about one page more: with 510 VMs listed (eleven pages) a tick sent 484
        ListMicrovms and no RunMicrovm (audit 13)."""
        observed: list[core.Observed] = []
        token: Optional[str] = None
        pages = 0
        while True:
            decision = self._admit("ListMicrovms", self._now() if token else now)
            if isinstance(decision, Deferral):
                wait = decision.retry_after_seconds
                if token and (not wait < float("inf") or self.clock() + wait >= self._deadline):
                    # A list longer than the tick's share of the ListMicrovms budget allows: never
                    # completes (a known limit: docs/reconciler.md, "Errors"); said, once a tick.
                    if "list_incomplete" not in self._told:
                        self._told.add("list_incomplete")
                        self._emit({"event": "list_incomplete", "pages_read": pages,
                                    "listed_so_far": len(observed), "reason": "the ListMicrovms budget "
                                    "left no token for the next page before the tick's deadline"})
                    return decision
                if not token:
                    return decision
                (self._sleep or self.sleep)(max(MIN_WAIT_SECONDS, wait))
                continue
            kwargs: dict[str, Any] = {"imageIdentifier": self.spec.image_arn, "maxResults": 50}
            if token:
                kwargs["nextToken"] = token
            try:
                page = self._api("list_microvms", **kwargs)
            except ClientError as exc:
                deferral = self._failed("ListMicrovms", exc, now)
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500)
                if _code(exc) not in BACKOFF_CODES and 400 <= status < 500:
                    return Deferral("ListMicrovms", float("inf"), deferral.reason)  # asking again will not help
                if _code(exc) not in BACKOFF_CODES:
                    return Deferral("ListMicrovms", LIST_RETRY_SECONDS, deferral.reason)
                return deferral
            except BotoCoreError as exc:
                self._emit({"event": "api_error", "operation": "ListMicrovms", "code": type(exc).__name__})
                return Deferral("ListMicrovms", 1.0, "error:" + type(exc).__name__)
            self._learn_offset(page)
            pages += 1
            for item in page.get("items") or []:
                self._read_at[item["microvmId"]] = now
                observed.append(core.Observed(item["microvmId"], item["state"], _epoch(item["startedAt"]),
                                              item.get("imageVersion")))
            token = page.get("nextToken")
            if not token:
                return observed

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
            # uncovered: 490->493, a step that runs (for a parked slot's PENDING VM, say) before the RunMicrovm tokens it reserved come due; not timed by any test
            return Deferral(operation, held[0] - now, "reserved")
        interval, burst_f = self.budget.shape(operation)
        burst = int(burst_f)
        cost = max(1, min(want, burst))
        # Never reserve past the tick's deadline: the tick would end holding tokens nobody uses
        # (a batch's tokens are due up to (cost - 1) intervals after the horizon).
        reach = max(0.0, self._deadline - self.clock() - 1 - (cost - 1) * interval)
        horizon = min(self.reserve_horizon, reach)
        # The fleet is the asker: refused while the budget's place in line is free, it goes first
        # (budget.NEXT_IN_LINE_BONUS_SECONDS), so a fleet whose clock runs behind is not starved.
        decision = self.budget.acquire(operation, now, cost=cost, horizon=horizon, asker=self.spec.fleet,
                                       horizon_cap=reach)
        if isinstance(decision, Deferral):
            if decision.reason in ROOM_BACKOFFS:  # another fleet (or an earlier tick) met the refusal
                self._no_room_until = max(self._no_room_until, now + decision.retry_after_seconds)
            self._deferred(decision)
            return decision
        if decision.wait_seconds <= 1e-6:
            if decision.cost > 1:
                self._held[operation] = [now, decision.cost - 1]
            return Granted(operation, 1)
        self._held[operation] = [now + decision.wait_seconds, decision.cost]
        return Deferral(operation, decision.wait_seconds, "reserved")

    def _run(self, slot: core.Slot, intent: core.Intent, epoch: str, now: float, want: int,
             slots: dict[str, core.Slot]) -> str | Deferral:
        decision = self._admit("RunMicrovm", now, want)
        if isinstance(decision, Deferral):
            self._note(slot, decision.reason, intent)
            return decision
        slot = core.admit_run(self.spec, slot, intent, now)
        # Written before the call (fenced): a step killed after it leaves a slot the next step
        # finishes with the same token and parameters.
        self._save(slot, slots)
        token = core.client_token(epoch, self.spec.fleet, slot.slot_id, slot.generation)
        self._emit(core._event("run_requested", slot, successor=intent.successor or None,
                               reason=intent.reason if intent.successor else None, retry=intent.retry or None,
                               image_version=self.spec.image_version, wait_time=core._since(slot.queued_at, now),
                               lifetime=slot.lifetime))
        if slot.queued_at is not None and not intent.retry:
            self.telemetry.metric(self.spec.fleet, "WaitTime", round(now - slot.queued_at, 3))
        try:
            vm = self._api("run_microvm", clientToken=token, **(slot.request or {}))
        except (ClientError, BotoCoreError) as exc:
            return self._run_failed(slot, intent, exc, now, slots)
        if self._held_elsewhere(slot, vm["microvmId"], slots):
            return "retry_later"
        slot.microvm_id = vm["microvmId"]
        slot.vm_started_at = _epoch(vm["startedAt"])
        self._run_answers[slot.microvm_id] = (self._now(), slot.vm_started_at, vm.get("imageVersion"))
        slot.in_doubt_since, slot.errors, slot.retry_at = None, 0, None
        # uncovered: 535->538, unreachable from step(): every step that runs has an observation (its list, a peek of it, or the reserved one)
        if self._observation is not None:
            self._observation[1].append(core.Observed(vm["microvmId"], vm["state"], slot.vm_started_at,
                                                      vm.get("imageVersion")))
        self._save(slot, slots)
        self._emit(core._event("run_accepted", slot, state=vm["state"]))
        return "started"

    def _held_elsewhere(self, slot: core.Slot, vm_id: str, slots: dict[str, core.Slot]) -> bool:
        """Whether the VM a run's answer names is another slot's (a member, a retiring VM): a
        token that was sent before, for a VM the ledger already holds. Never attached to a second
        slot (it may serve a client's session): the slot moves to a new generation, a new token,
        and the VM stays with its holder. Unreachable while every slot id's generations go on
        where the last left off (``core.retired_generations``); a ledger from before that, or one
        restored by hand, could still send an old token."""
        holder = next((s for s in slots.values() if s.slot_id != slot.slot_id
                       and vm_id in (s.microvm_id, s.retiring_id)), None)
        if holder is None:
            return False
        self._emit(core._event("token_collision", slot, taken_id=vm_id, holder=holder.slot_id,
                               reason="the answer names a VM another slot holds: a new token"))
        slot.generation += 1
        slot.request, slot.phase, slot.in_doubt_since = None, core.QUEUED, None
        self._save(slot, slots)
        return True

    def _run_failed(self, slot: core.Slot, intent: core.Intent, exc: Exception, now: float,
                    slots: dict[str, core.Slot]) -> str | Deferral:
        if isinstance(exc, ClientError):
            code = _code(exc)
            deferral = self._failed("RunMicrovm", exc, now)
            message = exc.response.get("Error", {}).get("Message", "")
        else:
            code, message, deferral = type(exc).__name__, str(exc), None
            self._emit({"event": "api_error", "operation": "RunMicrovm", "code": code, "error_message": message[:300]})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) if isinstance(exc, ClientError) else 0
        # A retry of a token an earlier call may have used (its answer lost, or the tick that sent
        # it died before writing the answer down): only a refusal that comes after the service
        # weighed making a VM for the token proves the earlier call made none.
        retried = intent.retry or slot.in_doubt_since is not None
        if code == "ThrottlingException":
            # Made no VM; the rate's fault, not the slot's: back to the queue (or, in doubt, the
            # same token later), under the shared backoff every reconciler sees.
            # uncovered: a throttled retry of an in-doubt token (an ambiguous error, then a throttle on the same slot's retry); no test orders faults so
            if retried:
                slot.in_doubt_since = slot.in_doubt_since or now
            else:
                slot.phase = core.QUEUED
            self._save(slot, slots)
            return deferral  # type: ignore[return-value]
        if code == "ConflictException" and exc.response.get("resourceType") == "Microvm" and exc.response.get("resourceId"):
            # The token already made a VM (with other parameters): the service names it, it is ours.
            # uncovered: a 409 naming a VM another slot holds needs an old token sent with other parameters; the 200 path is tested (test_audit13_scale)
            if self._held_elsewhere(slot, str(exc.response["resourceId"]), slots):
                return "retry_later"
            slot.microvm_id = str(exc.response["resourceId"])
            slot.in_doubt_since, slot.errors, slot.retry_at = None, 0, None
            self._save(slot, slots)
            self._emit(core._event("run_accepted", slot, state="unknown", reason="token_already_used"))
            return "started"
        ambiguous = code not in REQUEST_FAILURES and code not in SERVICE_FAILURES and code != "ConflictException" and (
            status >= 500 or status == 0)
        request_error = code in REQUEST_FAILURES or code == "ConflictException" or (
            400 <= status < 500 and code not in BACKOFF_CODES and code not in SERVICE_FAILURES)
        kind = "request" if request_error else "service"
        # Capacity and the memory quota are the account's state, not the slot's: the shared
        # backoff paces them, and they never dead-letter a slot (a 402 lasts until VMs end).
        counted = code not in SERVICE_FAILURES
        slot.errors += 1 if counted else 0
        slot.reason = f"{code}: {message}"[:500]
        if code in RUN_EVALUATED_NO_VM:
            # Capacity or the memory quota: the service weighed a new VM for this token and made
            # none (one an earlier call had made would have been returned): no longer in doubt.
            if slot.in_doubt_since is not None or retried:
                self._emit(core._event("run_doubt_resolved", slot, reason=f"no_vm:{code}"))
            slot.in_doubt_since = None
            slot.phase = core.QUEUED
        elif ambiguous or retried:
            # Ambiguous, or a retry refused (AccessDenied, Validation, NotFound..., or a Conflict
            # that names no VM: the same token with the same pinned parameters, so nothing the
            # earlier call made is proven either way). The slot stays in doubt: counted live,
            # asked again with the same token, dead-lettered (still in doubt, its token kept for a
            # redrive) after max_start_attempts; never a new token while a VM of the old one may
            # run (a lost answer, then a 409 on the retry: a new token made a second VM and left
            # the first one running, foreign to the fleet).
            slot.in_doubt_since = slot.in_doubt_since or now
        else:
            slot.phase = core.QUEUED
            if code == "ConflictException":
                slot.generation += 1  # a first call's token used before with other parameters: a new token
                slot.request = None
        outcome = "in_doubt" if slot.in_doubt_since is not None else "retry_later"
        if counted and slot.errors >= self.spec.max_start_attempts:
            slot.phase, slot.dead_kind = core.DEAD, kind
            probes_failed = slot.errors - self.spec.max_start_attempts
            slot.retry_at = now + core.dead_probe_delay(probes_failed) if kind == "service" else None
            event = core._event("slot_dead_lettered", slot, reason=slot.reason, kind=kind, errors=slot.errors,
                                in_doubt=slot.in_doubt_since is not None or None, probe=probes_failed or None)
            self._emit(event)
            if not probes_failed:
                # One message a dead-lettering: a failed probe of a slot already dead-lettered says
                # so in the timeline only (probes come 1, 2, 4, 8 minutes apart, then every 15).
                # Written with the DEAD slot, sent once that write landed (_send_letters).
                slot.letter = dict(event)
            outcome = "dead"
        elif counted:
            slot.retry_at = now + core.retry_delay(slot.errors)
        self._save(slot, slots)
        if slot.letter is not None:
            self._send_letters(slots, [slot.slot_id])
        if deferral is not None and code in BACKOFF_CODES:
            return deferral
        return outcome

    def _call(self, intent: core.Intent, now: float, want: int = 1,
              slots: Optional[dict[str, core.Slot]] = None, resend: bool = True) -> Optional[Deferral]:
        operation, method = _OPERATIONS[intent.kind]
        slots = slots if slots is not None else {}
        slot = slots.get(intent.slot_id)
        if intent.kind == "terminate" and slot is None:
            return self._end_stray(intent, now)
        decision = self._admit(operation, now, want)
        if isinstance(decision, Deferral):
            return decision
        if intent.kind == "resume" and intent.donor and slot is not None and intent.donor in slots:
            base, donor = core.handover(slot, slots[intent.donor], now)
            self._write(slots, [base, donor])
            slot = base
            self._emit(core._event("vm_handed_over", base, donor=donor.slot_id, reason="no headroom for a successor"))
        if intent.kind == "terminate" and slot is not None and intent.microvm_id == slot.microvm_id:
            slot.ending = intent.reason
            self._save(slot, slots)  # fenced: a tick that lost its lease ends nothing
        sent = self._now()
        if intent.kind == "suspend" and slot is not None:
            # Written before the call (fenced), as a run is: a tick that dies (or loses its lease)
            # after the suspend went out leaves the doubt to the next one, which must not send it
            # again on a session a client may have resumed since; a tick that lost its lease
            # suspends nothing. Cleared below when the service answers.
            slot.park_doubt_since = sent
            self._save(slot, slots)
        try:
            self._api(method, microvmIdentifier=intent.microvm_id)
        except ClientError as exc:
            assumed = intent.kind == "suspend" and self._assumed.get(str(intent.microvm_id)) is not None
            if assumed and _code(exc) in ("ConflictException", "ResourceNotFoundException"):
                # Assumed RUNNING, and not (still PENDING: a slow start, as a fresh image version's
                # first launches; or ended, or gone: 404): looked at before its next suspend, and
                # no VM of the fleet is assumed RUNNING any more in this tick (its starts are slow).
                self._too_early.append(intent.microvm_id)
                self._assumed = dict.fromkeys(self._assumed)  # every other assumption too
            if intent.kind == "suspend" and _code(exc) == "ResourceNotFoundException":
                self._suspend_failed.add(intent.microvm_id)  # gone: never sent again in the tick
            if _code(exc) not in ("ConflictException", "ResourceNotFoundException"):
                self._failed(operation, exc, now)
            else:
                self._emit({"event": "api_error", "operation": operation, "code": _code(exc),
                            "microvm_id": intent.microvm_id, "slot": intent.slot_id, "assumed_running": assumed or None})
            lost = _lost_answer(exc)
        except BotoCoreError as exc:
            self._emit({"event": "api_error", "operation": operation, "code": type(exc).__name__})
            lost = _lost_answer(exc)
        else:
            lost = None
        if intent.kind == "suspend" and slot is not None and not lost:
            slot.park_doubt_since = None  # answered (accepted or refused): no doubt
            if lost is False:
                self._save(slot, slots)
        if lost is not None:
            if intent.kind == "suspend" and slot is not None and lost:
                if self._park_in_doubt(slot, slots, sent) == "not_landed" and resend:
                    # Proven not landed, before any client could resume: sent again once, now
                    # (or, without a token now, by a step of this tick when the budget has one).
                    return self._call(intent, self._now(), 1, slots, resend=False)
                # Failed twice, or its doubt still open: not sent again in this tick (before, a
                # 500 on every suspend cost a suspend and a read per poll until the deadline).
                self._suspend_failed.add(intent.microvm_id)
            return None
        if intent.kind in ("suspend", "resume"):
            # uncovered: 648->651, plan() makes suspend/resume intents only for slots of its own ledger (never a stray)
            if slot is not None:
                slot.parking_since = now
                self._save(slot, slots)
            self._emit({"event": "park_requested" if intent.kind == "suspend" else "resume_requested",
                        "slot": intent.slot_id, "microvm_id": intent.microvm_id})
        else:
            if slot is not None and intent.microvm_id == slot.microvm_id:
                slot.end_requested_at = now
                self._save(slot, slots)
            self._emit({"event": "vm_terminated", "slot": intent.slot_id, "microvm_id": intent.microvm_id,
                        "reason": intent.reason})
        return None

    def _park_in_doubt(self, slot: core.Slot, slots: dict[str, core.Slot], sent: float) -> Optional[str]:
        """A suspend sent at ``sent`` whose answer was lost: it may have landed, and a client may
        resume the VM at any moment after. Written down before it was sent (a tick that dies now
        leaves the doubt to the next one: ``_call``), then settled by a GetMicrovm as soon as a read cannot predate the
        suspend (``READ_LAG_SECONDS``): sent again only if that read proves it did not land.
        Returns what the read settled (``core.settle_park_doubt``), None when nothing was read."""
        wait = max(0.0, READ_LAG_SECONDS - (self._now() - sent))
        # uncovered: a lost suspend answer less than READ_LAG_SECONDS before the tick's deadline; the next tick's list settles it
        if self.clock() + wait >= self._deadline:
            return None
        (self._sleep or self.sleep)(wait)
        now = self._now()
        # uncovered: the GetMicrovm budget (100/s) empty right after a lost suspend; no test exhausts it
        if isinstance(self._admit("GetMicrovm", now), Deferral):
            return None
        try:
            vm = self._api("get_microvm", microvmIdentifier=slot.microvm_id)
        except ClientError as exc:
            if _code(exc) != "ResourceNotFoundException":
                self._failed("GetMicrovm", exc, now)
            else:  # the VM gone right after a lost suspend: told (as every refusal); the next list requeues the slot
                self._emit({"event": "api_error", "operation": "GetMicrovm", "code": _code(exc),
                            "microvm_id": slot.microvm_id, "slot": slot.slot_id})
            return None
        # uncovered: a dropped connection or timeout on this read; the emulator's faults answer over HTTP (latency is real time)
        except BotoCoreError as exc:
            self._emit({"event": "api_error", "operation": "GetMicrovm", "code": type(exc).__name__})
            return None
        events: list = []
        core.settle_park_doubt(slot, str(vm.get("state")), self._now(), events)
        self._save(slot, slots)
        for event in events:
            self._emit(event)
        return str(events[0]["outcome"])

    def _end_stray(self, intent: core.Intent, now: float) -> Optional[Deferral]:
        """End an idle foreign VM (opt-in): GetMicrovm first, and only while it still says
        SUSPENDED; a lost lease ends nothing (the fence is checked by a write first)."""
        self.ledger.write(self.spec.fleet, self.fence, meta={"last_stray_end": intent.microvm_id or ""})
        for operation in ("GetMicrovm", "TerminateMicrovm"):
            decision = self._admit(operation, now)
            # uncovered: the Get/Terminate budget empty while ending a stray (opt-in policy); no test exhausts it then
            if isinstance(decision, Deferral):
                return decision
            try:
                if operation == "GetMicrovm":
                    vm = self._api("get_microvm", microvmIdentifier=intent.microvm_id)
                    # uncovered: a client resumes the stray between our list and our GetMicrovm; no test races a client in that window
                    if vm.get("state") != "SUSPENDED":
                        self._emit({"event": "stray_spared", "microvm_id": intent.microvm_id, "state": vm.get("state")})
                        return None
                else:
                    self._api("terminate_microvm", microvmIdentifier=intent.microvm_id)
            except (ClientError, BotoCoreError) as exc:
                self._emit({"event": "api_error", "operation": operation, "microvm_id": intent.microvm_id,
                            "code": _code(exc) if isinstance(exc, ClientError) else type(exc).__name__})
                return None
        self._emit({"event": "stray_terminated", "microvm_id": intent.microvm_id, "reason": intent.reason})
        self.telemetry.metric(self.spec.fleet, "StraysTerminated", 1)
        return None

    def _api(self, method: str, **kwargs: Any) -> Any:
        self.api_calls += 1
        if method == "list_microvms":
            self.list_calls += 1
        return getattr(self.microvms, method)(**kwargs)

    def _failed(self, operation: str, exc: ClientError, now: float) -> Deferral:
        """Turn a service error into a shared backoff when it is about capacity or rate."""
        code = _code(exc)
        retry_after = min(MAX_RETRY_AFTER_SECONDS, float(exc.response.get("retryAfterSeconds") or 1))
        if code in BACKOFF_CODES:
            self._held.pop(operation, None)  # reserved tokens are worthless once the service says no
        if code == "ThrottlingException":
            self.telemetry.metric(self.spec.fleet, "Throttles", 1, operation=operation)
            self.budget.backoff(operation, now + retry_after, "throttled")
        elif code == "ServiceQuotaExceededException":
            retry_after = QUOTA_BACKOFF_SECONDS
            self.budget.backoff(operation, now + retry_after, "memory_quota")
            self._no_room_until = max(self._no_room_until, now + retry_after)
        elif code == "InsufficientCapacityException":
            retry_after = CAPACITY_BACKOFF_SECONDS
            self.budget.backoff(operation, now + retry_after, "insufficient_capacity")
            self._no_room_until = max(self._no_room_until, now + retry_after)
        self._emit({"event": "api_error", "operation": operation, "code": code,
                    "error_message": exc.response.get("Error", {}).get("Message"), "retry_after": retry_after})
        return Deferral(operation, retry_after, f"error:{code}")

    # ------------------------------------------------------------------ persistence and telling

    def _save(self, slot: core.Slot, slots: dict[str, core.Slot]) -> None:
        self._write(slots, [slot])

    def _write(self, slots: dict[str, core.Slot], changed: list[core.Slot]) -> None:
        self.ledger.write(self.spec.fleet, self.fence, puts=changed)
        for slot in changed:
            slots[slot.slot_id] = slot

    def _persist(self, before: dict[str, core.Slot], after: dict[str, core.Slot], meta: dict[str, Any]) -> None:
        puts = [slot for slot_id, slot in after.items() if before.get(slot_id) != slot]
        deletes = sorted(before.keys() - after.keys())
        if puts or deletes or meta:
            self.ledger.write(self.spec.fleet, self.fence, puts=puts, deletes=deletes, meta=meta or None)

    def _send_letters(self, slots: dict[str, core.Slot], only: Optional[list[str]] = None,
                      orphans: Optional[dict[str, Any]] = None) -> None:
        """Send the dead letters the ledger holds (``Slot.letter``, written with the DEAD slot) and
        forget each one the queue took. One the queue refuses stays for the next tick's first step
        (``letters_due``): before, the letter was sent before the DEAD slot was written, and a
        refused SendMessage (the queue's key, a policy) crashed every tick, the slot never reached
        DEAD and was asked again each minute; a crash loop's letter refused once was never sent
        (audit 13)."""
        for slot_id in sorted(only if only is not None else slots):
            slot = slots.get(slot_id)
            if slot is None or slot.letter is None or not self._letter_time():
                continue
            if self._dead_letter(slot.letter):
                slot.letter = None
                self._save(slot, slots)
        # Letters of slots a spec dropped since (kept in #stats): sent with the others.
        if orphans and only is None:
            left = dict(orphans)
            for key in sorted(orphans):
                if self._letter_time() and self._dead_letter(orphans[key]):
                    del left[key]
            if left != orphans:
                self.ledger.write(self.spec.fleet, self.fence, meta={"letters": left})
                orphans.clear()
                orphans.update(left)

    def _letter_time(self) -> bool:
        """Whether a dead letter may be sent now: none failed in this tick (a queue that hangs
        costs one send a tick, not one a letter: five letters of 15 s each killed every tick), and
        the invocation has the longest send left (the SQS client's attempts and timeouts)."""
        return not self._letters_blocked and self._hard_stop - self.clock() >= LETTER_SEND_SECONDS

    def _dead_letter(self, event: dict[str, Any]) -> bool:
        """Whether the dead-letter queue took ``event`` (True without a queue to send to)."""
        # uncovered: 725->exit, every Reconciler that dead-letters in the tests has a sink (the handler always passes one)
        if not self.dead_letters:
            return True
        try:
            # At least once: a letter whose clearing write fails is sent again by the next tick,
            # with the same letter_id (one id a dead-lettering), so a reader can drop the repeat.
            letter_id = ":".join(str(event.get(k)) for k in ("slot", "generation", "kind", "errors"))
            self.dead_letters({"fleet": self.spec.fleet, "letter_id": f"{self.spec.fleet}:{letter_id}",
                               **{k: v for k, v in event.items() if k != "time"}})
        except Exception as exc:  # noqa: BLE001 - any failure of the queue: told, kept, sent again
            self._letters_blocked = True
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else type(exc).__name__
            self._emit({"event": "dead_letter_failed", "slot": event.get("slot"), "code": code,
                        "error_message": str(exc)[:300], "reason": "kept in the ledger; sent again by the next tick"})
            return False
        return True

    def _deferred(self, deferral: Deferral) -> None:
        self.telemetry.metric(self.spec.fleet, "Deferrals", 1, operation=deferral.operation)

    def _note(self, slot: core.Slot, reason: str, intent: core.Intent) -> None:
        """Record why a slot waits, once per reason (not on every step)."""
        if core.noted(slot, reason):
            return
        core.note(slot, reason)
        self.ledger.write(self.spec.fleet, self.fence, puts=[slot])
        kind = "no_headroom_for_rolling_replacement" if intent.successor and reason == "max_vms_reached" else "run_deferred"
        self._emit(core._event(kind, slot, reason=reason))

    def _emit(self, event: dict[str, Any]) -> None:
        self.telemetry.event(self.spec.fleet, {"time": round(self._now(), 3), **event})

    def _now(self) -> float:
        """The service's time as this function's clock and the last answer's ``Date`` tell it:
        VM start times come from the service, so expiries and ages are reckoned on its clock,
        whatever this environment's clock says (a skew of 30 s would delay a replacement by 30 s)."""
        return self.clock() + self._offset

    def _learn_offset(self, response: Any) -> None:
        headers = (response or {}).get("ResponseMetadata", {}).get("HTTPHeaders", {}) if isinstance(response, dict) else {}
        date = headers.get("date")
        # uncovered: every answer (the emulator over HTTP, and AWS) has a Date header
        if not date:
            return
        try:
            from email.utils import parsedate_to_datetime

            service = parsedate_to_datetime(date).timestamp() + 0.5  # whole seconds: the middle of one
        # uncovered: a Date header email.utils cannot parse; neither the emulator nor AWS sends one
        except (TypeError, ValueError):
            return
        offset = service - self.clock()
        # uncovered: 761->exit, the service's clock more than 300 s from ours; the tests skew clocks by 30 s
        if abs(offset) <= MAX_CLOCK_OFFSET_SECONDS:
            self._offset = offset if abs(offset - self._offset) >= 1.0 else self._offset


_OPERATIONS = {
    "suspend": ("SuspendMicrovm", "suspend_microvm"),
    "terminate": ("TerminateMicrovm", "terminate_microvm"),
    "resume": ("ResumeMicrovm", "resume_microvm"),
}


def _unlisted_warm(slots: dict[str, core.Slot], observed: list[core.Observed], listed_at: float,
                   now: float, mine: Any = ()) -> list[str]:
    """VMs of parked slots, started and not parked yet (no suspend of ours accepted: one assumed
    RUNNING may have been refused), that the look did not show, young enough for that to be the
    list's lag (older ones are confirmed with GetMicrovm). A VM this tick started (``mine``) after
    the list, or less than a second of clock error before it, is waited for by the step that
    started it; one another tick started is this tick's to look at whenever it started: that tick
    may have lost the lease to this one between its run and its look (43 fleets, seed 81868: the
    deploy's tick ran a parked slot's VM 0.14 s before the scheduled tick took over and listed;
    nobody looked at the VM again, and it was parked by the next minute's tick, 24 s late)."""
    shown = {o.microvm_id for o in observed}
    return sorted(s.microvm_id for s in slots.values()
                  if s.role == core.WARM and s.microvm_id and s.microvm_id not in shown
                  and (s.phase == core.STARTING or (s.phase == core.PARKING and s.parking_since is None))
                  and s.vm_started_at is not None
                  and (s.vm_started_at < listed_at - 1.0 or s.microvm_id not in mine)
                  and now - s.vm_started_at < core.CONSISTENCY_SECONDS)


def _lost_answer(exc: Exception) -> bool:
    """Whether a failed call may have been carried out: a 5xx, or no answer after the request may
    have gone out (a read timeout, a dropped connection). A throttle, a 4xx or a connection that
    was never made proves it was not."""
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return status >= 500 or (status == 0 and _code(exc) not in REQUEST_FAILURES | BACKOFF_CODES | {"ConflictException"})
    return not isinstance(exc, (ConnectTimeoutError, EndpointConnectionError))


def _parked_for_base(slots: dict[str, core.Slot]) -> bool:
    """A base slot without a VM, and a parked VM it could take (``core.plan``'s handover)."""
    short = any(s.role == core.BASE and s.microvm_id is None and s.phase != core.DEAD for s in slots.values())
    return short and any(s.role == core.WARM and s.phase == core.PARKED and s.microvm_id and not s.draining
                         and not s.ending for s in slots.values())


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def _stray_keys(strays: dict[str, Any]) -> tuple:
    """What of the strays is worth a write: which VMs, how often seen (capped), suspended since."""
    return tuple(sorted((k, min(int(v.get("seen", 0)), 2), v.get("suspended_since") is None, v.get("state"))
                        for k, v in strays.items()))


def _epoch(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)
