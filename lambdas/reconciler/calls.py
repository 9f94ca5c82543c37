"""The intents of a plan turned into calls, each under the shared budget, and every answer turned back
into the core's transitions (:mod:`.core.transitions`). One executor per intent kind, in a table.

Every call that starts or ends a VM of ours, or moves one between slots, is written (fenced) before
it is made: a tick that lost its lease makes none, and a tick that dies after the call leaves the
next tick what it needs (a run's token, a suspend's doubt, an end that is ours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from . import answers, core
from .admission import Admission
from .budget import Deferral
from .core import BASE, WARM, Intent, IntentKind, Observed, Reason, Slot
from .letters import Outbox
from .looks import READ_LAG_SECONDS, Looks
from .ports import Server, Shell
from .run_requests import RequestFor
from .serving import serve_request
from .timing import STEP_RESERVE_SECONDS, Deadline, StepResult

#: The operation and client method of each call an intent makes.
OPERATIONS: dict[IntentKind, tuple[str, str]] = {
    IntentKind.RUN: ("RunMicrovm", "run_microvm"),
    IntentKind.SUSPEND: ("SuspendMicrovm", "suspend_microvm"),
    IntentKind.TERMINATE: ("TerminateMicrovm", "terminate_microvm"),
    IntentKind.RESUME: ("ResumeMicrovm", "resume_microvm"),
}
#: A parked slot's VM may run unparked this long until the next scheduled tick parks it (the
#: tick that starts it ends first): a run later in a tick waits for the next one.
PARK_LATE_SECONDS = 10.0
#: A suspend or terminate answered 409 or 404 is the VM's state (not RUNNING yet, gone): told,
#: never a shared backoff.
STATE_REFUSALS = ("ConflictException", "ResourceNotFoundException")


@dataclass
class Step:
    """What the calls of one step share: the slots (as written), the step's clock and its counts."""

    slots: dict[str, Slot]
    epoch: str
    now: float
    result: StepResult
    live: int
    planned: dict[IntentKind, int]
    suspends_only: bool = False
    runs: int = 0
    attempts: int = 0  # every RunMicrovm sent, failed ones too
    filled: int = 0
    out: set[str] = field(default_factory=set)  # operations the budget (or the service) said no to
    started_warm: list[str] = field(default_factory=list)
    at_max: set[str] = field(default_factory=set)  # slots whose run waits for room under max_vms
    later: set[str] = field(default_factory=set)  # parked slots whose run waits for the next tick
    ended: set[str] = field(default_factory=set)  # VMs whose TerminateMicrovm this step was accepted


@dataclass
class Calls:
    """The executors of one tick's intents."""

    shell: Shell
    admission: Admission
    looks: Looks
    outbox: Outbox
    deadline: Deadline
    request_for: RequestFor
    server: Optional[Server] = None

    def table(self) -> dict[IntentKind, Callable[[Step, Intent], None]]:
        return {
            IntentKind.RUN: self.run,
            IntentKind.SERVE: self.serve,
            IntentKind.SUSPEND: self.suspend,
            IntentKind.TERMINATE: self.terminate,
            IntentKind.RESUME: self.resume,
            IntentKind.HANDOVER: self.handover,
        }

    def make(self, step: Step, intents: list[Intent]) -> None:
        """Each intent in order, while the tick has time for it (an intent expected to end past
        the hard bound waits for the next tick)."""
        table = self.table()
        began: Optional[float] = None
        for intent in intents:
            if began is not None:  # the intent before this one: how long its calls took
                self.deadline.took(self.deadline.clock() - began)
            if not self.deadline.allows_intent():
                break
            began = self.deadline.clock()
            if step.suspends_only and intent.kind in (IntentKind.TERMINATE, IntentKind.RESUME, IntentKind.HANDOVER):
                step.result.add(step.now, Reason.STEP)  # a parked VM a client may have taken since: after a fresh list
                continue
            table[intent.kind](step, intent)
        if began is not None:
            self.deadline.took(self.deadline.clock() - began)

    # ------------------------------------------------------------------ runs

    def run(self, step: Step, intent: Intent) -> None:
        slot = step.slots.get(intent.slot_id)
        spec = self.shell.spec
        if slot is None or "RunMicrovm" in step.out:
            return
        # Its VM's room (core.paid_successor): the end accepted frees one place, room only while
        # the others leave it under max_vms (clients' VMs may hold the image above it).
        paid = intent.paid_by is not None and intent.paid_by in step.ended and step.live - 1 < spec.max_vms
        if step.live >= spec.max_vms and not intent.retry and not paid:
            if intent.paid_by is not None:  # its end not accepted, or others hold the room: look again soon
                step.result.add(step.now + core.LATE_END_POLL_SECONDS, Reason.REPLACE)
            self.note(step, slot, "max_vms_reached", intent)
            step.at_max.add(slot.slot_id)
            return
        if step.runs >= spec.max_starts_per_step:
            step.result.add(step.now, Reason.STEP)
            return
        if slot.role == WARM and not intent.retry and self.deadline.overtime and not self.parks_in_time():
            self.note(step, slot, "no_time_to_park", intent)
            step.later.add(slot.slot_id)
            return
        want = max(1, min(step.planned[IntentKind.RUN] - step.runs, spec.max_starts_per_step - step.runs,
                          max(1, spec.max_vms - step.live)))
        before = self.shell.api_calls
        outcome = self.start(step, slot, intent, want)
        step.attempts += self.shell.api_calls - before
        if isinstance(outcome, Deferral):
            reason = Reason.BUDGET if outcome.reason in ("budget_empty", "reserved") else Reason.RETRY
            step.result.add(step.now + outcome.retry_after_seconds, reason)
            if outcome.reason == "budget_empty":
                self.admission.demand["RunMicrovm"] = want
            step.out.add("RunMicrovm")  # empty (or the service said no) for every run after this
            return
        step.runs += 1
        held = step.slots[intent.slot_id]
        if outcome == "started":
            step.live += 0 if intent.retry or paid else 1
            step.filled += 1
            if held.role == WARM and not spec.serve:  # served fleets park on the server's answer instead
                step.result.add(step.now + core.PENDING_POLL_SECONDS, Reason.LOOK)  # to park it once it runs
                step.started_warm.append(held.microvm_id or "")
        elif outcome == "in_doubt":
            step.live += 0 if intent.retry or paid else 1  # the VM may exist (a lost response): counted until proven
            step.result.add(step.now + core.retry_delay(held.errors), Reason.RETRY)
        elif outcome == "retry_later":
            step.result.add(step.now + core.retry_delay(max(1, held.errors)), Reason.RETRY)

    def parks_in_time(self) -> bool:
        """Whether a parked slot's VM run now, in the tick's overtime, is parked soon: by this tick
        (assumed RUNNING ``PENDING_POLL_SECONDS`` after its run), or by the next scheduled tick
        within ``PARK_LATE_SECONDS`` of running. Run later than that, it would run unparked until
        the next tick (a 2 s tick with a 17 s timeout: about 50 s RUNNING); left queued, the next
        tick runs and parks it. Before the soft bound a run always goes out (a tick shorter than a
        start would otherwise never run one)."""
        clock = self.deadline.clock()
        # A served fleet parks a VM on its server's answer (warmed), looked for this long after the run.
        parked_after = core.SERVE_EXPECTED_SECONDS if self.shell.spec.serve else core.PENDING_POLL_SECONDS
        if clock + parked_after <= self.deadline.hard - STEP_RESERVE_SECONDS:  # a step may still wake then
            return True
        next_tick = self.deadline.start + float(self.shell.spec.look_period_seconds)
        return bool(next_tick - (clock + parked_after) <= PARK_LATE_SECONDS)

    def start(self, step: Step, slot: Slot, intent: Intent, want: int) -> str | Deferral:
        """One RunMicrovm of the slot's generation: written (fenced) before the call, so a step
        killed after it leaves a slot the next step finishes with the same token and parameters."""
        now = step.now
        decision = self.admission.admit("RunMicrovm", now, want)
        if isinstance(decision, Deferral):
            self.note(step, slot, decision.reason, intent)
            return decision
        slot = core.admit_run(self.shell.spec, slot, intent, now, self.request_for)
        self.shell.write(step.slots, [slot])
        token = core.client_token(step.epoch, self.shell.spec.fleet, slot.slot_id, slot.generation)
        self.shell.emit(core.run_requested(self.shell.spec, slot, intent, now))
        if slot.queued_at is not None and not intent.retry:
            self.shell.metric("WaitTime", round(now - slot.queued_at, 3))
        try:
            vm = self.shell.api("run_microvm", clientToken=token, **(slot.request or {}))
        except (answers.ClientError, answers.BotoCoreError) as exc:
            return self.run_failed(step, slot, intent, exc)
        vm_id = str(vm["microvmId"])
        if self.collides(step, slot, vm_id):
            return "retry_later"
        seen = Observed(vm_id, str(vm["state"]), answers.epoch(vm["startedAt"]), vm.get("imageVersion"))
        self.looks.run_answered(seen, self.shell.now())
        self.apply(step, core.run_answered(slot, vm_id, seen.started_at, seen.state))
        if self.shell.spec.serve:
            self.ask_server(step, step.slots[slot.slot_id])  # the server waits for the VM to be ready itself
        return "started"

    def collides(self, step: Step, slot: Slot, vm_id: str) -> bool:
        """Whether the VM an answer names is another slot's (a member, a retiring VM): a token sent
        before, for a VM the ledger holds. Unreachable while every slot id's generations go on
        where the last left off (``core.retired_generations``); a ledger restored by hand could
        still send an old token."""
        holder = next((s for s in step.slots.values() if s.slot_id != slot.slot_id
                       and vm_id in (s.microvm_id, s.retiring_id)), None)
        if holder is None:
            return False
        self.apply(step, core.token_collision(slot, vm_id, holder.slot_id))
        return True

    def run_failed(self, step: Step, slot: Slot, intent: Intent, exc: Exception) -> str | Deferral:
        failure = answers.failure(exc)
        deferral: Optional[Deferral] = None
        if isinstance(exc, answers.ClientError):
            deferral = self.admission.refused("RunMicrovm", failure, step.now)
        else:
            self.shell.emit({"event": "api_error", "operation": "RunMicrovm", "code": failure.code,
                             "error_message": failure.message[:300]})
        if failure.code == core.transitions.THROTTLED:
            self.apply(step, core.run_failed(self.shell.spec, slot, intent, failure, step.now), emit_first=True)
            return deferral  # type: ignore[return-value]
        if failure.code == core.transitions.CONFLICT and failure.named_vm:
            # The token already made a VM (with other parameters): the service names it, it is ours.
            if self.collides(step, slot, failure.named_vm):  # uncovered: a 409 naming a VM another slot holds needs an old token sent with other parameters
                return "retry_later"
            self.apply(step, core.run_answered(slot, failure.named_vm, None, "unknown", reason="token_already_used"))
            return "started"
        change = core.run_failed(self.shell.spec, slot, intent, failure, step.now)
        self.apply(step, change, emit_first=True)
        after = step.slots[slot.slot_id]
        if after.letter is not None:
            self.outbox.send_slots(step.slots, [after.slot_id])
        if deferral is not None and failure.code in core.SHARED_BACKOFFS:
            return deferral
        if after.phase == core.DEAD:
            return "dead"
        return "in_doubt" if after.in_doubt_since is not None else "retry_later"

    def note(self, step: Step, slot: Slot, reason: str, intent: Intent) -> None:
        """Why a slot waits, told once per reason (not on every step)."""
        noted = core.note_wait(slot, reason)
        if noted is None:
            return
        self.shell.write(step.slots, [noted])
        kind = "no_headroom_for_rolling_replacement" if intent.successor and reason == "max_vms_reached" else "run_deferred"
        self.shell.emit(core.event(kind, noted, reason=reason))

    def apply(self, step: Step, change: core.Change, emit_first: bool = False) -> None:
        """A transition's slot written, its events told (before the write, or after)."""
        if emit_first:
            for told in change.events:
                self.shell.emit(told)
        self.shell.write(step.slots, [change.slot] if change.slot is not None else [])
        if not emit_first:
            for told in change.events:
                self.shell.emit(told)

    # ------------------------------------------------------------------ serving

    def serve(self, step: Step, intent: Intent) -> None:
        slot = step.slots.get(intent.slot_id)
        if slot is None or slot.microvm_id != intent.microvm_id:  # uncovered: a guard: the plan asks about its slots' VMs
            return
        self.ask_server(step, slot)

    def ask_server(self, step: Step, slot: Slot) -> None:
        """Ask the fleet's server to serve (base) or warm (parked) the slot's VM: the ask written
        (fenced) first, so its answer is matched to it; the step wakes when an answer may be in."""
        now = self.shell.now()
        asked = core.serve_asked(slot, now)
        self.shell.write(step.slots, [asked])
        if self.server is None:
            self.shell.emit(core.event("serve_not_asked", asked, reason="this reconciler has no server"))
            return
        try:
            self.server.ask(serve_request(self.shell.spec.fleet, asked, now))
        except (answers.ClientError, answers.BotoCoreError) as exc:
            self.shell.write(step.slots, [core.serve_ask_failed(asked, now)])
            self.shell.emit({"event": "api_error", "operation": "Invoke", "code": answers.error_code(exc),
                             "slot": slot.slot_id, "microvm_id": slot.microvm_id, "error_message": str(exc)[:300]})
            step.result.add(now + core.SERVE_POLL_SECONDS, core.answer_reason(asked))
            return
        self.shell.emit(core.event("serve_asked", asked, attempt=asked.serve_asks))
        step.result.add(now + core.SERVE_EXPECTED_SECONDS, core.answer_reason(asked))

    # ------------------------------------------------------------------ suspend, terminate, resume

    def suspend(self, step: Step, intent: Intent) -> None:
        slot = step.slots.get(intent.slot_id)
        if "SuspendMicrovm" in step.out or intent.microvm_id in self.looks.suspend_failed:
            return  # failed ambiguously in this tick (sent again once at most): the next tick's turn
        if slot is not None and slot.microvm_id != intent.microvm_id:  # uncovered: a guard: the plan drops the suspend of a VM it hands over
            return  # handed over since
        self.call(step, intent)

    def terminate(self, step: Step, intent: Intent) -> None:
        if "TerminateMicrovm" in step.out:  # uncovered: two ends in one step after the TerminateMicrovm budget said no (10/s)
            return
        if intent.slot_id not in step.slots:
            self.end_stray(step, intent)
            return
        self.call(step, intent)

    def resume(self, step: Step, intent: Intent) -> None:
        if "ResumeMicrovm" not in step.out:
            self.call(step, intent)

    def handover(self, step: Step, intent: Intent) -> None:
        """A parked slot's VM not parked yet moves to a base slot: a fenced write, no call."""
        base, donor = step.slots.get(intent.slot_id), step.slots.get(intent.donor or "")
        if base is None or donor is None or donor.microvm_id != intent.microvm_id:  # uncovered: a guard: the plan names slots of its ledger
            return
        base, donor = core.handover(base, donor, step.now)
        self.shell.write(step.slots, [base, donor])
        self.shell.emit(core.event("vm_handed_over", base, donor=donor.slot_id,
                                   reason="the account has no room for the base slot's run"))

    def call(self, step: Step, intent: Intent, resend: bool = True) -> None:
        """A suspend, terminate or resume of a slot's VM under the shared budget (a suspend proven
        not landed is sent again once, ``resend=False``, now)."""
        operation, method = OPERATIONS[intent.kind]
        now = step.now if resend else self.shell.now()
        decision = self.admission.admit(operation, now, step.planned[intent.kind] if resend else 1)
        if isinstance(decision, Deferral):
            self.deferred(step, intent, operation, decision)
            return
        sent = self.shell.now()
        slot = self.before_call(step, intent, sent)
        try:
            self.shell.api(method, microvmIdentifier=intent.microvm_id)
        except (answers.ClientError, answers.BotoCoreError) as exc:
            self.call_failed(step, intent, slot, exc, sent, resend)
            return
        if intent.kind == IntentKind.TERMINATE:
            step.ended.add(intent.microvm_id or "")
            if slot is not None and intent.microvm_id == slot.microvm_id:
                self.shell.write(step.slots, [core.end_accepted(slot, now)])
            self.shell.emit({"event": "vm_terminated", "slot": intent.slot_id, "microvm_id": intent.microvm_id,
                             "reason": intent.reason})
            return
        if slot is not None:  # uncovered: a suspend or resume is always of a slot's VM (only a stray's end has none)
            self.shell.write(step.slots, [core.park_answered(slot, now)])
        self.shell.emit({"event": "park_requested" if intent.kind == IntentKind.SUSPEND else "resume_requested",
                         "slot": intent.slot_id, "microvm_id": intent.microvm_id})

    def deferred(self, step: Step, intent: Intent, operation: str, decision: Deferral) -> None:
        step.out.add(operation)
        reason = Reason.PARK if intent.kind == IntentKind.SUSPEND else Reason.DEFERRED  # a VM to park: worth overtime
        step.result.add(step.now + decision.retry_after_seconds, reason)
        if decision.reason == "budget_empty":  # uncovered: a Suspend/Terminate/Resume budget empty beyond the reserve horizon (dozens of fleets parking)
            self.admission.demand[operation] = step.planned[intent.kind]

    def before_call(self, step: Step, intent: Intent, sent: float) -> Optional[Slot]:
        """What is written (fenced) before the call: a handover (the base slot takes the parked
        VM), the end asked for (ours, not a crash), a suspend's doubt (a tick that dies after
        sending it leaves the doubt to the next one)."""
        slot = step.slots.get(intent.slot_id)
        if slot is None:  # uncovered: only a stray's end has no slot, and it takes end_stray
            return None
        if intent.kind == IntentKind.RESUME and intent.donor and intent.donor in step.slots:
            base, donor = core.handover(slot, step.slots[intent.donor], step.now)
            self.shell.write(step.slots, [base, donor])
            self.shell.emit(core.handed_over(base, donor))
            return base
        if intent.kind == IntentKind.TERMINATE and intent.microvm_id == slot.microvm_id:
            slot = core.end_requested(slot, intent.reason)
            self.shell.write(step.slots, [slot])
        elif intent.kind == IntentKind.TERMINATE and intent.microvm_id == slot.retiring_id:
            slot = core.retiring_end_requested(slot, sent)
            self.shell.write(step.slots, [slot])
        elif intent.kind == IntentKind.SUSPEND:
            slot = core.park_sent(slot, sent)
            self.shell.write(step.slots, [slot])
        return slot

    def call_failed(self, step: Step, intent: Intent, slot: Optional[Slot], exc: Exception, sent: float,
                    resend: bool) -> None:
        operation = OPERATIONS[intent.kind][0]
        failure = answers.failure(exc)
        vm_id = intent.microvm_id or ""
        suspend = intent.kind == IntentKind.SUSPEND
        if isinstance(exc, answers.ClientError):
            assumed = suspend and self.looks.assumed(vm_id)
            if assumed and failure.code in STATE_REFUSALS:
                self.looks.refuse(vm_id)
            if suspend and failure.code == "ResourceNotFoundException":
                self.looks.suspend_failed.add(vm_id)  # gone: never sent again in the tick
            if failure.code not in STATE_REFUSALS:
                self.admission.refused(operation, failure, step.now)
            else:
                self.shell.emit({"event": "api_error", "operation": operation, "code": failure.code,
                                 "microvm_id": intent.microvm_id, "slot": intent.slot_id,
                                 "assumed_running": assumed or None})
        else:
            self.shell.emit({"event": "api_error", "operation": operation, "code": failure.code})
        if not (suspend and slot is not None):
            return
        if not failure.lost:
            self.shell.write(step.slots, [core.park_answered(slot, None)])  # refused: no doubt
            return
        if self.read_doubt(step, step.slots[slot.slot_id], sent) == "not_landed" and resend:
            # Proven not landed, before any client could resume: sent again once, now (or, without
            # a token now, by a step of this tick when the budget has one).
            self.call(step, intent, resend=False)
            return
        # Failed twice, or its doubt still open: not sent again in this tick.
        self.looks.suspend_failed.add(vm_id)

    def read_doubt(self, step: Step, slot: Slot, sent: float) -> Optional[str]:
        """A suspend sent at ``sent`` whose answer was lost: settled by a GetMicrovm as soon as a
        read cannot predate the suspend (``READ_LAG_SECONDS``). Returns what the read settled
        (``core.settle_park_doubt``), None when nothing was read."""
        wait = max(0.0, READ_LAG_SECONDS - (self.shell.now() - sent))
        if not self.deadline.reaches(wait):  # uncovered: a lost suspend answer less than READ_LAG_SECONDS before the tick's bound
            return None
        self.shell.pause(wait)
        now = self.shell.now()
        if isinstance(self.admission.admit("GetMicrovm", now), Deferral):  # uncovered: the GetMicrovm budget empty right after a lost suspend
            return None
        got = self.looks.get(slot.microvm_id or "", now)
        if isinstance(got, answers.ClientError):
            code = answers.error_code(got)
            if code != "ResourceNotFoundException":
                self.admission.refused("GetMicrovm", answers.failure(got), now)
            else:  # gone right after a lost suspend: told; the next list requeues the slot
                self.shell.emit({"event": "api_error", "operation": "GetMicrovm", "code": code,
                                 "microvm_id": slot.microvm_id, "slot": slot.slot_id})
            return None
        if isinstance(got, answers.BotoCoreError):  # uncovered: a dropped connection or timeout on this read (the emulator's faults answer over HTTP)
            self.shell.emit({"event": "api_error", "operation": "GetMicrovm", "code": type(got).__name__})
            return None
        change = core.settle_park_doubt(slot, got.state, self.shell.now())
        self.apply(step, change)
        return str(change.events[0]["outcome"]) if change.events else None

    # ------------------------------------------------------------------ strays

    def end_stray(self, step: Step, intent: Intent) -> None:
        """End an idle foreign VM (opt-in): GetMicrovm first, and only while it still says
        SUSPENDED; a lost lease ends nothing (the fence is checked by a write first)."""
        self.shell.write({}, [], meta={"last_stray_end": intent.microvm_id or ""})
        for operation in ("GetMicrovm", "TerminateMicrovm"):
            decision = self.admission.admit(operation, step.now)
            if isinstance(decision, Deferral):
                self.deferred(step, intent, "TerminateMicrovm", decision)  # uncovered: the Get/Terminate budget empty while ending a stray (opt-in policy)
                return
            try:
                if operation == "GetMicrovm":
                    vm = self.shell.api("get_microvm", microvmIdentifier=intent.microvm_id)
                    if vm.get("state") != "SUSPENDED":  # uncovered: a client resumes the stray between our list and our GetMicrovm
                        self.shell.emit({"event": "stray_spared", "microvm_id": intent.microvm_id, "state": vm.get("state")})
                        return
                else:
                    self.shell.api("terminate_microvm", microvmIdentifier=intent.microvm_id)
            except (answers.ClientError, answers.BotoCoreError) as exc:
                self.shell.emit({"event": "api_error", "operation": operation, "microvm_id": intent.microvm_id,
                                 "code": answers.error_code(exc)})
                return
        self.shell.emit({"event": "stray_terminated", "microvm_id": intent.microvm_id, "reason": intent.reason})
        self.shell.metric("StraysTerminated", 1)


def parked_for_base(slots: dict[str, Slot]) -> bool:
    """A base slot without a VM, and a parked slot's VM it could take (``core.plan``'s handover)."""
    short = any(s.role == BASE and s.microvm_id is None and s.phase != core.DEAD for s in slots.values())
    return short and any(core.parked_donor(s) or core.young_donor(s) for s in slots.values())


