"""One tick's observation cache: what each source said of each VM, and when, and the looks it makes.

Every look lands in one map, ``VM -> source -> (VM as seen, when)``, with five sources:

* ``LIST``: a ListMicrovms (every page of the image) -- the tick's full view;
* ``PEEK``: a GetMicrovm of a parked slot's VM a step waits for, instead of a whole list;
* ``CONFIRM``: a GetMicrovm of a VM of ours a list missed, or that ended early (its reason);
* ``RUN``: a RunMicrovm's answer (the VM as it started: ours by its token);
* ``ASSUMED``: a parked slot's VM this tick started, assumed RUNNING ``PENDING_POLL_SECONDS`` after
  its run's answer (measured PENDING: p50 1.85 s, p95 2.13 s; 3.59 s with 20 runs at once), so it is
  suspended without a look of its own; a refused suspend (409: still PENDING) ends every
  assumption of the tick;
* ``FACT``: the fleet's server said the VM serves or is warmed (``ready#`` in the ledger): it was
  RUNNING then (its rayd answered), so a warmed parked VM is suspended without a look either.

A plan sees the newest of LIST, PEEK and RUN since the last list, the confirmations of the VMs it
asks about, and the assumptions. A VM whose suspend's answer was lost is shown only by a *read*
(LIST, PEEK, CONFIRM) made ``READ_LAG_SECONDS`` after that suspend was sent: anything older shows
the VM as it was before the suspend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Iterable, Mapping, Optional

from . import answers
from .admission import Admission
from .budget import WATCH_OPERATION, Deferral
from .core import (
    GONE,
    PARKING,
    PENDING_POLL_SECONDS,
    SHARED_BACKOFFS,
    STARTING,
    WARM,
    Observed,
    Plan,
    Ready,
    Reason,
    Slot,
    to_confirm,
    unlisted_warm,
    watch_news,
    watch_order,
)
from .ports import Shell
from .timing import MIN_WAIT_SECONDS, Deadline, StepResult

#: A step that wakes for tokens it reserved acts on the last list if it is at most this old (with
#: the VMs it started since): reserved calls go out on time instead of waiting for a list of their
#: own, which would bunch them up behind others'.
OBSERVATION_TTL_SECONDS = 2.0
#: ... and, when the shared ListMicrovms budget has no token for a step holding due tokens, at most
#: this old (our own VMs come from the ledger and the run answers; only others' are older). Such a
#: step ends and resumes nothing: a parked VM it shows SUSPENDED a client may have resumed since.
STALE_OBSERVATION_SECONDS = 10.0
#: GetMicrovm confirmations are reused within a tick for this long (a VM a list missed is asked once).
CONFIRM_TTL_SECONDS = 20.0
#: A step may look at the last list plus GetMicrovm answers this long after the list was made.
PEEK_TTL_SECONDS = 12.0
#: At most this many GetMicrovm peeks replace one ListMicrovms...
MAX_PEEKS = 1
#: ... and at most this many confirmations a step.
MAX_CONFIRMS_PER_STEP = 25
#: A ListMicrovms that failed on the service's side is asked again after this long in a tick.
LIST_RETRY_SECONDS = 5.0
#: GetMicrovm and ListMicrovms see the service as it was up to 0.5 s ago (measured): a read this
#: long after an answer cannot show the state from before the request.
READ_LAG_SECONDS = 0.6
#: Assumed RUNNING this long after the run's answer (a float edge is no reason to wait a poll).
EPSILON = 1e-6


class Source(StrEnum):
    LIST = "list"
    PEEK = "peek"
    CONFIRM = "confirm"
    RUN = "run"
    ASSUMED = "assumed"
    FACT = "fact"


#: The sources that read the VM (its state as the service has it, ``READ_LAG_SECONDS`` late).
READS = (Source.LIST, Source.PEEK, Source.CONFIRM)


@dataclass(frozen=True)
class Look:
    """One source's word on one VM (``vm`` None: asked, nothing read)."""

    vm: Optional[Observed]
    at: float


@dataclass
class Choice:
    """The look a step plans on, or the deferral that kept it from one."""

    observed: Optional[list[Observed]] = None
    deferral: Optional[Deferral] = None
    suspends_only: bool = False  # a look from before tokens came due: ends and resumes nothing
    fresh: bool = False  # a list or a peek made for this step


@dataclass
class Looks:
    """The tick's looks at the fleet's VMs (see the module)."""

    shell: Shell
    admission: Admission
    deadline: Deadline
    told: set[str]
    seen: dict[str, dict[Source, Look]] = field(default_factory=dict)
    listed_at: Optional[float] = None
    listed: list[str] = field(default_factory=list)
    peeked_at: Optional[float] = None
    refused: bool = False  # a suspend of an assumed VM was refused: nothing more is assumed
    too_early: list[str] = field(default_factory=list)  # ... the VMs so refused, to be looked at
    relooked: set[str] = field(default_factory=set)  # parked slots' VMs a list missed, looked at again
    peek_ids: list[str] = field(default_factory=list)  # VMs the next step asks GetMicrovm about
    park_at: Optional[float] = None  # when a parked slot's PENDING VM is worth a look (to park it)
    suspend_failed: set[str] = field(default_factory=set)  # not sent again in this tick
    watched_at: dict[str, float] = field(default_factory=dict)  # parked VMs: when the watch last read each

    # ------------------------------------------------------------------ the cache

    def record(self, source: Source, vm_id: str, vm: Optional[Observed], at: float) -> None:
        self.seen.setdefault(vm_id, {})[source] = Look(vm, at)

    def look(self, vm_id: str, source: Source) -> Optional[Look]:
        return self.seen.get(vm_id, {}).get(source)

    def read_at(self, vm_id: str) -> float:
        """When a read last showed the VM."""
        reads = [look.at for s, look in self.seen.get(vm_id, {}).items() if s in READS and look.vm is not None]
        return max(reads) if reads else float("-inf")

    def view(self, *sources: Source) -> list[Observed]:
        """The newest of ``sources`` per VM since the last list (the listed VMs first, in order)."""
        if self.listed_at is None:  # uncovered: a view before the tick's first list; every caller lists first
            return []
        since = self.listed_at
        out: dict[str, Observed] = {}
        listed = set(self.listed)
        for vm_id in [*self.listed, *[v for v in self.seen if v not in listed]]:
            # The server's answer outlives a list that does not show the VM: that list lags behind
            # it (an ended VM stays listed 20 minutes), and the answer is the newest word on it.
            looks = [look for s, look in self.seen.get(vm_id, {}).items()
                     if s in sources and look.vm is not None
                     and (look.at >= since or (s == Source.FACT and vm_id not in listed))]
            if looks:
                out[vm_id] = max(looks, key=lambda look: look.at).vm  # type: ignore[assignment]
        return list(out.values())

    def list_view(self) -> list[Observed]:
        """The last list with every word on its VMs since: a read (a peek, the watch), a run's
        answer, the server's: a plan on it must not take a list made before the watch saw our
        suspend land for news (RUNNING on a parked slot is a client's take)."""
        return self.view(Source.LIST, Source.RUN, Source.PEEK, Source.FACT)

    def facts_seen(self, facts: Mapping[str, Ready], slots: Mapping[str, Slot], now: float) -> None:
        """The server's answers as looks: a VM it found ready was RUNNING when it said so."""
        held = {s.microvm_id: s for s in slots.values() if s.microvm_id}
        for vm_id, fact in facts.items():
            slot = held.get(vm_id)
            if slot is None or not fact.ready or fact.at > now or self.look(vm_id, Source.FACT) is not None:
                continue
            started = slot.vm_started_at if slot.vm_started_at is not None else fact.at
            self.record(Source.FACT, vm_id, Observed(vm_id, "RUNNING", started), fact.at)

    def last_look_at(self) -> Optional[float]:
        return self.peeked_at if self.peeked_at is not None else self.listed_at

    def run_answered(self, vm: Observed, at: float) -> None:
        """A run's answer: the VM is ours (by its token) and started as it says."""
        self.record(Source.RUN, vm.microvm_id, vm, at)

    def assumable(self, vm_id: str) -> bool:
        """A VM this tick started (its run answered), not assumed RUNNING yet, in a tick where no
        assumption was refused."""
        return self.look(vm_id, Source.RUN) is not None and self.look(vm_id, Source.ASSUMED) is None and not self.refused

    def assumed(self, vm_id: str) -> bool:
        """Assumed RUNNING, and no suspend said otherwise."""
        return self.look(vm_id, Source.ASSUMED) is not None and not self.refused

    def refuse(self, vm_id: str) -> None:
        """A suspend sent on the assumption was refused (still PENDING: a slow start, as a fresh
        image version's first launches; or ended): the VM is looked at before its next suspend,
        and no VM is assumed RUNNING any more in this tick (its starts are slow)."""
        self.too_early.append(vm_id)
        self.refused = True

    # ------------------------------------------------------------------ choosing a look

    def choose(self, now: float, ready: bool, answers_only: bool = False) -> Choice:
        """The look a step plans on: a list a step may reuse when reserved tokens came due (at
        most ``OBSERVATION_TTL_SECONDS`` old, or ``PEEK_TTL_SECONDS`` when only suspends came due:
        the VMs to park are our own, seen RUNNING by it, and a suspend of one that ended since is
        refused); a peek when the last step waited only for parked slots' VMs; else a list. With
        no list to be had (the shared budget is empty) and tokens due, the last list at most
        ``STALE_OBSERVATION_SECONDS`` old, ending and resuming nothing."""
        listed_age = now - self.listed_at if self.listed_at is not None else None
        parking_only = self.admission.parking_only(now)
        if answers_only and listed_age is not None and listed_age <= PEEK_TTL_SECONDS:
            # Woken only for the server's answers (the ledger, read already): the last list with
            # them, ending and resuming nothing on it (a client may have taken a parked VM since).
            return Choice(self.list_view(), suspends_only=True)
        if ready and listed_age is not None and listed_age <= OBSERVATION_TTL_SECONDS:
            return Choice(self.list_view())
        if ready and (looked := self.last_look(now, parking_only)) is not None:
            return Choice(looked, suspends_only=parking_only)
        if not ready and (peeked := self.peek(now)) is not None:
            return Choice(peeked, fresh=True)
        observed = self.list_image(now)
        if not isinstance(observed, Deferral):
            return Choice(observed, fresh=True)
        if (ready and listed_age is not None and observed.reason == "budget_empty"
                and listed_age <= STALE_OBSERVATION_SECONDS):
            return Choice(self.list_view(), suspends_only=True)
        return Choice(deferral=observed)

    def last_look(self, now: float, parking_only: bool) -> Optional[list[Observed]]:
        if self.listed_at is None or now - self.listed_at > PEEK_TTL_SECONDS:
            return None
        at = self.last_look_at()
        if at is None or now - at > (PEEK_TTL_SECONDS if parking_only else OBSERVATION_TTL_SECONDS):
            return None
        return self.list_view()

    def list_image(self, now: float) -> list[Observed] | Deferral:
        """Every page of the image's VMs (TERMINATED ones stay listed 20 minutes: churn multiplies
        them). A page after the first waits for its token within the tick, the pages read kept (a
        retry of the whole list past the budget's burst read about one page more each time: 484
        ListMicrovms a tick with 510 VMs listed)."""
        items: list[Observed] = []
        token: Optional[str] = None
        pages = 0
        while True:
            decision = self.admission.admit("ListMicrovms", self.shell.now() if token else now)
            if isinstance(decision, Deferral):
                wait = decision.retry_after_seconds
                if token and (not wait < float("inf") or not self.deadline.reaches(wait)):
                    self._incomplete(pages, len(items))
                    return decision
                if not token:
                    return decision
                self.shell.pause(max(MIN_WAIT_SECONDS, wait))
                continue
            kwargs: dict[str, Any] = {"imageIdentifier": self.shell.spec.image_arn, "maxResults": 50}
            if token:
                kwargs["nextToken"] = token
            try:
                page = self.shell.api("list_microvms", **kwargs)
            except answers.ClientError as exc:
                return self._list_failed(exc, now)
            except answers.BotoCoreError as exc:
                self.shell.emit({"event": "api_error", "operation": "ListMicrovms", "code": type(exc).__name__})
                return Deferral("ListMicrovms", 1.0, "error:" + type(exc).__name__)
            pages += 1
            items += [Observed(i["microvmId"], i["state"], answers.epoch(i["startedAt"]), i.get("imageVersion"))
                      for i in page.get("items") or []]
            token = page.get("nextToken")
            if not token:
                break
        self.listed_at, self.peeked_at, self.listed = now, None, [o.microvm_id for o in items]
        for vm in items:
            self.record(Source.LIST, vm.microvm_id, vm, now)
        return list(items)

    def _incomplete(self, pages: int, listed: int) -> None:
        """A list longer than the tick's share of the ListMicrovms budget allows never completes (a
        known limit: docs/reconciler.md, "Errors"): said once a tick."""
        if "list_incomplete" not in self.told:
            self.told.add("list_incomplete")
            self.shell.emit({"event": "list_incomplete", "pages_read": pages, "listed_so_far": listed,
                             "reason": "the ListMicrovms budget left no token for the next page before the tick's deadline"})

    def _list_failed(self, exc: answers.ClientError, now: float) -> Deferral:
        """A refused list: a 4xx ends the tick's looks (asking again will not help), a 5xx is asked
        again after ``LIST_RETRY_SECONDS``, a throttle or refusal for room backs off as told."""
        failure = answers.failure(exc)
        deferral = self.admission.refused("ListMicrovms", failure, now)
        if failure.code in SHARED_BACKOFFS:
            return deferral
        if 400 <= (failure.status or 500) < 500:
            return Deferral("ListMicrovms", float("inf"), deferral.reason)
        return Deferral("ListMicrovms", LIST_RETRY_SECONDS, deferral.reason)

    def get(self, vm_id: str, now: float) -> Observed | answers.ClientError | answers.BotoCoreError:
        """One GetMicrovm (the budget admitted it), as the VM seen or the error."""
        try:
            vm = self.shell.api("get_microvm", microvmIdentifier=vm_id)
        except (answers.ClientError, answers.BotoCoreError) as exc:
            return exc
        return Observed(vm_id, vm["state"], answers.epoch(vm["startedAt"]), vm.get("imageVersion"), vm.get("stateReason"))

    def peek(self, now: float) -> Optional[list[Observed]]:
        """The last list with GetMicrovm's word on the VMs the last step waited for (None: list)."""
        ids, self.peek_ids = self.peek_ids, []
        if not ids or self.listed_at is None or now - self.listed_at > PEEK_TTL_SECONDS:
            return None
        read = False
        for vm_id in ids:
            if self.assumable(vm_id) or self.assumed(vm_id):
                continue  # no read: assumed RUNNING by the step (for_plan)
            if isinstance(self.admission.admit("GetMicrovm", now), Deferral):  # uncovered: the GetMicrovm budget (100/s) empty during a peek; no test exhausts it
                return None
            got = self.get(vm_id, now)
            if isinstance(got, answers.ClientError):
                self.admission.refused("GetMicrovm", answers.failure(got), now)  # told; a throttle backs off everyone
                return None
            if isinstance(got, answers.BotoCoreError):  # uncovered: a dropped connection or timeout on a peek (the emulator's faults answer over HTTP)
                self.shell.emit({"event": "api_error", "operation": "GetMicrovm", "code": type(got).__name__})
                return None
            self.record(Source.PEEK, vm_id, got, now)
            read = True
        if not read:  # nothing read (every VM assumed RUNNING): not a look of its own
            return self.list_view()
        self.peeked_at = now
        return self.list_view()

    def watch(self, slots: Mapping[str, Slot]) -> tuple[list[Observed], list[Observed]]:
        """GetMicrovm on the VMs the watch looks at (``slots``, by VM id: :func:`.core.watched_vms`),
        the one read longest ago first (:func:`.core.watch_order`), until one read is news
        (:func:`.core.watch_news`: a client took it, it ended; GONE when the service no longer knows
        it): that one (recorded as a look) is returned at once, and the fresh list that follows
        shows the others. A token of the shared bucket reserved a moment ahead is waited for
        (within the tick); with none, or an error, the watch stops there, keeping what it read (the
        next watch starts with the VMs this one did not reach). Returns the news (empty: nothing
        changed, or nothing could be read now) and every VM read."""
        read: list[Observed] = []
        last = {vm: max(self.watched_at.get(vm, float("-inf")), self.read_at(vm)) for vm in slots}
        for vm_id in watch_order(slots, last):
            if not self._watch_token(self.shell.now()):
                return [], read
            at = self.shell.now()
            got = self.get(vm_id, at)
            if isinstance(got, answers.ClientError) and answers.error_code(got) == "ResourceNotFoundException":
                got = Observed(vm_id, GONE, 0.0, reason="not_found")
            elif isinstance(got, answers.ClientError):
                self.admission.refused("GetMicrovm", answers.failure(got), at)
                return [], read
            elif isinstance(got, answers.BotoCoreError):
                self.shell.emit({"event": "api_error", "operation": "GetMicrovm", "code": type(got).__name__})
                return [], read
            self.watched_at[vm_id] = at
            self.record(Source.PEEK, vm_id, got, at)
            read.append(got)
            if watch_news(slots[vm_id], got, at):
                return [got], read
        return [], read

    def _watch_token(self, now: float) -> bool:
        """A token of the watch's bucket now, or after a wait for one reserved a moment ahead
        (while the tick may still act on what the look shows); False: none."""
        decision = self.admission.admit(WATCH_OPERATION, now)
        if isinstance(decision, Deferral) and decision.reason == "reserved" and self.deadline.reaches(decision.retry_after_seconds):
            self.shell.pause(max(MIN_WAIT_SECONDS, decision.retry_after_seconds))
            decision = self.admission.admit(WATCH_OPERATION, self.shell.now())
        return not isinstance(decision, Deferral)

    # ------------------------------------------------------------------ what the plan sees

    def confirm(self, slots: Mapping[str, Slot], observed: list[Observed], now: float) -> list[Observed]:
        """``observed`` with GetMicrovm's answers about the VMs of ours the look did not show (old
        enough for the answer to mean something) and those that ended early: their state, GONE
        when the service no longer knows them; nothing (live, unknown) when the get fails or the
        budget says wait."""
        shown = {o.microvm_id: o for o in observed}
        out: list[Observed] = []
        asked = 0
        for vm_id in to_confirm(slots, shown, now):
            cached = self.look(vm_id, Source.CONFIRM)
            if cached is not None and now - cached.at <= CONFIRM_TTL_SECONDS:  # uncovered: a VM a list misses in two steps less than CONFIRM_TTL_SECONDS apart
                if cached.vm is not None:
                    out.append(cached.vm)
                continue
            if asked >= MAX_CONFIRMS_PER_STEP or isinstance(self.admission.admit("GetMicrovm", now), Deferral):  # uncovered: more than 25 VMs missing from one list, or the GetMicrovm budget empty
                continue
            asked += 1
            got = self.get(vm_id, now)
            seen: Optional[Observed] = None
            if isinstance(got, Observed):
                seen = got
            elif isinstance(got, answers.ClientError) and answers.error_code(got) == "ResourceNotFoundException":
                seen = Observed(vm_id, GONE, 0.0, reason="not_found")
            elif isinstance(got, answers.ClientError):  # uncovered: a GetMicrovm error other than 404 while confirming a missed VM
                self.admission.refused("GetMicrovm", answers.failure(got), now)
            else:
                self.shell.emit({"event": "api_error", "operation": "GetMicrovm", "code": type(got).__name__})
            self.record(Source.CONFIRM, vm_id, seen, now)
            if seen is not None:
                out.append(seen)
                self.shell.emit({"event": "vm_confirmed", "microvm_id": vm_id, "state": seen.state,
                                 "end_reason": seen.reason})
        if not out:
            return observed
        known = {o.microvm_id for o in out}  # a get's answer is newer than the list's line
        return [o for o in observed if o.microvm_id not in known] + out

    def for_plan(self, observed: list[Observed], slots: Mapping[str, Slot], now: float) -> list[Observed]:
        """``observed`` with the assumptions of the step and without unread doubts."""
        return self._doubts_hidden(self._assume_running(observed, slots, now), slots)

    def _assume_running(self, observed: list[Observed], slots: Mapping[str, Slot], now: float) -> list[Observed]:
        """Parked slots' VMs this tick started that no read has shown more than PENDING yet, once
        ``PENDING_POLL_SECONDS`` have passed since their runs were answered: assumed RUNNING (once
        per VM and tick), so their suspends go out without a look of their own. The assumption is
        for that suspend only: once it was sent (accepted, or its answer lost) a look that misses
        the VM must not read as RUNNING (past the park grace: a parked VM taken for a client's)."""
        seen = {o.microvm_id: o for o in observed}
        assumed: dict[str, Observed] = {}
        for slot in slots.values():
            vm_id = slot.microvm_id
            if slot.role != WARM or slot.phase not in (STARTING, PARKING) or not vm_id:
                continue
            shown = seen.get(vm_id)
            if (shown is not None and shown.state != "PENDING") or slot.parking_since is not None \
                    or slot.park_doubt_since is not None:
                continue
            run = self.look(vm_id, Source.RUN)
            if self.assumable(vm_id) and slot.phase == STARTING and run is not None and run.vm is not None:
                if now - run.at < PENDING_POLL_SECONDS - EPSILON:
                    continue
                self.record(Source.ASSUMED, vm_id, Observed(vm_id, "RUNNING", run.vm.started_at, run.vm.image_version), now)
            if self.assumed(vm_id):
                assumed[vm_id] = self.look(vm_id, Source.ASSUMED).vm  # type: ignore[union-attr,assignment]
        if not assumed:
            return observed
        return [o for o in observed if o.microvm_id not in assumed] + list(assumed.values())

    def _doubts_hidden(self, observed: list[Observed], slots: Mapping[str, Slot]) -> list[Observed]:
        """A VM whose suspend's answer was lost is shown only as a read ``READ_LAG_SECONDS`` after
        that suspend was sent shows it: a reused list, a look from before it or a run's answer
        shows the VM as it was before, which would settle the doubt wrongly (``not_landed``: the
        suspend sent again on a session a client may have resumed since). Hidden, the VM is live
        and unknown until such a read."""
        doubted = {s.microvm_id: s.park_doubt_since for s in slots.values() if s.park_doubt_since is not None and s.microvm_id}
        if not doubted:
            return observed
        return [o for o in observed if o.microvm_id not in doubted
                or self.read_at(o.microvm_id) >= doubted[o.microvm_id] + READ_LAG_SECONDS]

    # ------------------------------------------------------------------ the next look

    def owed(self, now: float) -> Optional[tuple[float, list[str]]]:
        """A look planned at a parked slot's VM that this step does not make (it spends tokens that
        came due on the last look): still owed after it."""
        if self.park_at is None or self.park_at <= now + EPSILON:
            return None
        return self.park_at, list(self.peek_ids)

    def plan_next(self, plan: Plan, observed: Iterable[Observed], started_warm: list[str], result: StepResult,
                  owed: Optional[tuple[float, list[str]]]) -> None:
        """What the next step looks at, and when: parked slots' VMs still PENDING, the ones this
        step started, and young ones the look missed (lists lag new VMs: GetMicrovm, once per VM
        and tick), each worth a look ``PENDING_POLL_SECONDS`` after its run's answer at most (a
        step that parked earlier VMs meanwhile must not put that look off). One VM (or the missed
        ones, or VMs to be assumed RUNNING) is a GetMicrovm; more, a list."""
        now = result.now
        if self.shell.spec.serve:
            # The fleet's server waits for each VM to run and says when it is warmed (a fact, in
            # the ledger): parked slots' VMs need no look of their own to be parked.
            plan = Plan(plan.slots, plan.intents, plan.events, plan.gauges, plan.live_vms, pending_warm=[])
            started_warm = []
        pending = list(plan.pending_warm) + [vm for vm in started_warm if vm and vm not in plan.pending_warm]
        listed_at = self.listed_at if self.listed_at is not None else now
        shown = {o.microvm_id for o in observed}
        mine = {vm for vm in self.seen if self.look(vm, Source.RUN) is not None}
        unlisted = [vm for vm in unlisted_warm(plan.slots, shown, listed_at, now, mine=mine)
                    if vm not in started_warm and vm not in self.relooked]
        self.relooked.update(unlisted)
        for vm in unlisted + self.too_early:
            if vm not in pending:  # uncovered: a VM both missed by the look and refused its suspend in one step
                pending.append(vm)
            result.add(now + PENDING_POLL_SECONDS, Reason.LOOK)
        self.too_early = []
        only_pending = bool(pending) and all(w.reason in (Reason.LOOK, Reason.BUDGET) for w in result.waits)
        peek_all = (len(pending) <= MAX_PEEKS or (bool(unlisted) and len(pending) <= MAX_CONFIRMS_PER_STEP)
                    or all(self.assumable(vm) for vm in pending))
        self.peek_ids = pending if only_pending and peek_all else []
        self.park_at = None
        if pending or started_warm:
            soonest = plan.wake_at(*[r for r in Reason if r != Reason.TRANSITION])
            park_at = now + (PENDING_POLL_SECONDS if started_warm or soonest is None
                             else max(PENDING_POLL_SECONDS, soonest - now))
            assumable = [run.at + PENDING_POLL_SECONDS for vm in pending
                         if self.assumable(vm) and (run := self.look(vm, Source.RUN)) is not None]
            if assumable:
                park_at = max(now + MIN_WAIT_SECONDS, min([park_at, *assumable]))
                result.add(park_at, Reason.PARK)
            else:
                result.add(park_at, Reason.PARK_DUE)
            self.park_at = park_at
        if owed is not None:
            at, peeks = owed
            self.park_at = at if self.park_at is None else min(self.park_at, at)
            self.peek_ids = self.peek_ids + [vm for vm in peeks if vm not in self.peek_ids]
            result.add(self.park_at, Reason.PARK_DUE)
            result.add(max(now, at), Reason.PARK)
