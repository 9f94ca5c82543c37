"""Slow calls and clock steps against a tick's bounds, on the production path (``index.handler``
with Powertools, the clients ``index.build()`` makes, the synthesized environment, the MicroVMs
emulator over HTTP on a virtual clock, moto):

* the tick's hard stop is ``start + deadline + overtime + HARD_STOP_GRACE_SECONDS`` (2 s),
  and no intent starts when ``clock + _slowest_intent`` (the longest intent of the tick so far)
  reaches it; the first step always runs;
* a step that parks one warm VM wakes when the next parked slot's VM is assumed RUNNING
  (2.6 s after its own RunMicrovm answer).

Slowness is virtual: a ``before-call`` handler on the handler's own clients (DynamoDB, SQS,
MicroVMs) advances the virtual clock before the request goes out (an answer that long in coming,
under the clients' read timeouts: no error, no retry). Every number comes from that call log, the
emulator's request log and VM histories and moto's items, never the reconciler's counters.

Failures pinned: one slow RunMicrovm stopped a short tick (5 s: 1 of 4 base VMs, 62 s below
min_vms) and cost a default tick its later runs (5 of 7), through ``_slowest_intent``; a clock
step forward did the same (1 of 6). The rule that holds them: the next intent is expected to take the
tick's second slowest intent's time; those three are guards now. Left as known limits (strict
xfails, docs/reconciler.md "No call past the invocation's time"): a late overtime step with one
slow list and one slow run makes calls after the function's 65 s (the 2 s grace left 6 s of the
8 s margin); a clock step back runs the tick past the Lambda's time (the hard stop is on
``time.time``); with short ticks (2 s, 5 s) a parked slot's run late in the overtime stays RUNNING
about 48-50 s, until the next minute's tick.
Held (guards): the same late step with only its run slow (7.5 s: answered at 64 s); a slow tick
does not slow the next one; parked VMs parked within 2.6 s of their own runs with many warm slots,
a slow RunMicrovm budget, list lag, slow starts (one 409 after assuming RUNNING), a slow
SuspendMicrovm budget, a client ending a VM before its assumed suspend (one refusal, the slot
refilled and parked in the tick); steps at most three a VM, lists and budget polls bounded.
Seen, not kept: with the emulator's TERMINATED linger cut to 0.2 s, the ended VM's suspend and
GetMicrovm answer 404 and the slot stays 'parking' on it until the next tick (documented: a 404
for a VM younger than CONSISTENCY_SECONDS proves nothing).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest

from lambdas.reconciler import core

from .harness import RECONCILER_CALLER, deployed_fleet, list_lag, peak_live, seconds_below
from .support import catch_crashes, on_every_build, sqs_client_of
from .support import ours
from .support import assert_no_duplicates



# --------------------------------------------------------------------------- helpers


class Calls:
    """Every AWS call the handler's clients start (operation, started, answered: the virtual
    clock), with ``slow(operation, at) -> seconds``: how late that call's answer comes."""

    def __init__(self, monkeypatch, ref: dict, slow: Callable[[str, float], float] = lambda op, at: 0.0) -> None:
        self.ref, self.slow = ref, slow
        self.log: list[tuple[str, float, float]] = []
        on_every_build(monkeypatch, self.install)

    def install(self, reconciler: Any) -> None:
        seen: set[int] = set()
        for client in (reconciler.ledger._ddb, getattr(reconciler.budget, "_ddb", None), reconciler.microvms,
                       sqs_client_of(reconciler)):
            if client is not None and id(client) not in seen:
                seen.add(id(client))
                client.meta.events.register("before-call", self._before)

    def _before(self, model: Any, **_: Any) -> None:
        clock = self.ref["fleet"].clock
        start = clock.now()
        seconds = self.slow(model.name, start)
        if seconds:
            clock.advance(seconds)
        self.log.append((model.name, start, clock.now()))

    def after(self, t: float) -> list[tuple[str, float, float]]:
        """Calls started or answered after ``t``."""
        return [(op, a, b) for op, a, b in self.log if a > t + 1e-6 or b > t + 1e-6]


def running_at(fleet, vm_id: str) -> float:
    vm = next(v for v in fleet.emulator.microvms_ever() if v["microvmId"] == vm_id)
    return next(at for at, state, _ in vm["history"] if state == "RUNNING")


def _rel(log: list[tuple[str, float, float]], t0: float) -> list[tuple[str, float, float]]:
    return [(op, round(a - t0, 2), round(b - t0, 2)) for op, a, b in log]


# --------------------------------------------------------------------------- 1. the hard stop's grace


@contextmanager
def _late_step(aws, monkeypatch, ref: dict, slow: Callable[[str, float], float]) -> Iterator[tuple[Any, "Calls", float]]:
    """min 2 / max 3 and one RunMicrovm token every 56.5 s: the second run's token comes due in
    the overtime; one invocation, its calls slowed by ``slow``."""
    calls = Calls(monkeypatch, ref, slow)
    env = {"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3", "BUDGETS": '{"RunMicrovm": [%r, 1]}' % (1 / 56.5)}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        t0 = ref["t0"] = fleet.clock.now()
        fleet.invoke(monkeypatch)
        yield fleet, calls, t0


@pytest.mark.xfail(strict=True, reason=(
    "broken (7852f4c): min 2 / max 3, RunMicrovm budget one per 56.5 s: the overtime step at 56.5 s "
    "(deadline 50 + overtime 7 = 57) lists in 2.2 s, then its RunMicrovm starts at 58.7 s (past 57, under "
    "the hard stop 59: _intent_estimate is 0.0, every intent before was instant) and answers 6.5 s late "
    "(under the 15 s read timeout): the write after the run, the budget's UpdateItems and the lease "
    "release are started at 65.2 s, after the function's 65 s timeout (Lambda kills the invocation "
    "there). tick.py: _hard_stop = start + deadline + overtime + HARD_STOP_GRACE_SECONDS (line 195) "
    "leaves 6 s of the 8 s margin, and step()'s 'clock + _intent_estimate >= _hard_stop' (its intents loop) "
    "cannot see the first slow intent coming; with the hard stop at 57 s this run is not started "
    "(58.7 >= 57); docs/reconciler.md still says no intent is carried out past the deadline and overtime"))
def test_a_late_step_slow_once_makes_no_call_past_the_lambda_timeout(aws, monkeypatch) -> None:
    """A run's token comes due in the overtime (56.5 s); that step's list answers 2.2 s late and
    its run 6.5 s late (a MicroVMs brownout, no error). No call may start or be answered after
    the invocation's 65 s."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    fired: list[str] = []

    def slow(op: str, at: float) -> float:
        late = at - ref["t0"] >= 50
        if late and op == "ListMicrovms" and "list" not in fired:
            fired.append("list")
            return 2.2
        if late and op == "RunMicrovm" and "run" not in fired:
            fired.append("run")
            return 6.5
        return 0.0

    with _late_step(aws, monkeypatch, ref, slow) as (fleet, calls, t0):
        runs = [round(a - t0, 2) for op, a, _ in calls.log if op == "RunMicrovm"]
        assert fired == ["list", "run"] and len(runs) <= 2, (fired, runs)
        assert not calls.after(t0 + 65.0), dict(runs=runs, past_65=_rel(calls.after(t0 + 65.0), t0))


def test_a_late_step_slow_once_within_the_old_margin_holds(aws, monkeypatch) -> None:
    """Held (the control): the same late step, its list on time and its run 7.5 s late: the run
    starts at 56.5 s and is answered at 64 s, inside the 65 s (the margin's 8 s less the 0.5 s the
    step started before the overtime's end); nothing after it."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    fired: list[str] = []

    def slow(op: str, at: float) -> float:
        if at - ref["t0"] >= 50 and op == "RunMicrovm" and not fired:
            fired.append("run")
            return 7.5
        return 0.0

    with _late_step(aws, monkeypatch, ref, slow) as (fleet, calls, t0):
        assert fired and not calls.after(t0 + 65.0), _rel(calls.after(t0 + 60), t0)
        assert len(fleet.ours()) == 2
        # No busy loop while it waits 56.5 s for the token: 18 UpdateItems (9 overtime polls of
        # the budget, 0.5 s apart, from 52.5 s), 2 lists, 12 DynamoDB writes in all; and one list
        # more when the server's answer comes (the base VM counts once it serves).
        counts = Counter(op for op, _, _ in calls.log)
        assert counts["UpdateItem"] <= 24 and counts["ListMicrovms"] <= 4, counts


# --------------------------------------------------------------------------- 2. the slowest intent


def _short_tick_fill(aws, monkeypatch, slow_run: float) -> dict[str, Any]:
    """A 5 s tick (function timeout 20 s, hard stop 14 s), min 4 / max 5 from empty, the first
    RunMicrovm answered ``slow_run`` late; the next minute's tick."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    fired: list[float] = []

    def slow(op: str, at: float) -> float:
        if op == "RunMicrovm" and not fired and slow_run:
            fired.append(at)
            return slow_run
        return 0.0

    calls = Calls(monkeypatch, ref, slow)
    env = {"MIN_VMS": "4", "WARM_VMS": "0", "MAX_VMS": "5", "TICK_SECONDS": "5"}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch, timeout=20)
        started_first = len(ours(fleet, "RunMicrovm"))
        fleet.clock.advance(max(0.0, t0 + 60 - fleet.clock.now()))
        fleet.invoke(monkeypatch, timeout=20)
        fleet.clock.advance(3)
        return dict(result=first.result, runs_first_tick=started_first, below=round(seconds_below(fleet, 4, t0, t0 + 62), 2),
                    past_20=_rel([c for c in calls.after(t0 + 20) if c[1] < t0 + 59], t0), ours=Counter(vm["state"] for vm in fleet.ours()),
                    peak=peak_live(fleet), serve=fleet.server.serve_seconds)


# Found (a strict xfail until fixed): TICK_SECONDS=5 (function timeout 20 s, hard stop 5 + 7 + 2 =
# 14 s), min 4 / max 5 from empty, the first RunMicrovm answered 7.5 s late: _slowest_intent = 7.5,
# the second intent's check 7.55 + 7.5 >= 14 breaks the step and the tick loop ('steps and clock +
# _slowest_intent >= _hard_stop', tick.py:222) ends the tick after 1 step at 7.55 s, 6.5 s before
# its hard stop and 12.5 s before the Lambda's end, with 3 base slots empty; they wait for the next
# minute: 1 RunMicrovm in the first tick, 62 s below min_vms with room (1 of 5); with every intent
# after the slow one taking 0 s, the check before 7852f4c (clock >= 12 s) would have started the
# other three at 7.5 s (reasoned, not measured here)
# Fixed: the next intent is expected to take the tick's second slowest intent's time (_intent_took),
# not its slowest: one slow answer or clock step no longer stands for every later intent.
def test_one_slow_run_in_a_short_tick_does_not_leave_the_fleet_below_min(aws, monkeypatch) -> None:
    """One RunMicrovm answered 7.5 s late (a brownout, no error) in a 5 s tick: the other base
    slots, whose calls are quick, still start in that tick (before its hard stop)."""
    found = _short_tick_fill(aws, monkeypatch, 7.5)
    assert found["runs_first_tick"] == 4 and found["below"] <= 12.0, found


def test_a_slow_tick_does_not_slow_the_next_one(aws, monkeypatch) -> None:
    """Held: the same slow first tick; the next minute's tick starts with its own slowest intent
    (0): the three missing base VMs start at its first step, never above max_vms, no call past
    the first invocation's 20 s, one VM per token."""
    found = _short_tick_fill(aws, monkeypatch, 7.5)
    assert found["ours"] == {"RUNNING": 4} and found["peak"] <= 5 and not found["past_20"], found


def test_a_short_tick_without_a_slow_call_fills_at_once(aws, monkeypatch) -> None:
    """Held (the baseline of the two above): no slow call, all four in the first step (2 s PENDING,
    then the agent host's start on each)."""
    found = _short_tick_fill(aws, monkeypatch, 0.0)
    assert found["runs_first_tick"] == 4 and found["below"] <= 2.5 + found["serve"], found


# --------------------------------------------------------------------------- 3. a clock that jumps


def _jumping_clock(fleet, monkeypatch, at: float, by: float) -> dict:
    """The warm environment's clock (``time.time`` in Lambda: it steps with NTP) jumps ``by`` at
    ``at`` (the first sleep that spans it), the virtual clock (real time) does not."""
    fleet._environment, fleet._built_env = fleet.reconciler(monkeypatch), (dict(fleet.env), True)
    state = {"by": 0.0, "jumped": None}
    fleet._environment.clock = lambda: fleet.clock.now() + state["by"]
    advance = fleet.clock.advance

    def sleep(seconds: float) -> None:
        wake = fleet.clock.now() + seconds
        if state["jumped"] is None and wake >= at:
            advance(max(0.0, at - fleet.clock.now()))
            state["by"], state["jumped"] = by, fleet.clock.now()
        advance(max(0.0, wake - fleet.clock.now()))

    fleet._environment.sleep = sleep
    return state


def test_a_clock_step_back_keeps_every_call_within_the_lambda_timeout(aws, monkeypatch) -> None:
    catch_crashes(monkeypatch)
    ref: dict = {}
    calls = Calls(monkeypatch, ref)
    env = {"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "8", "BUDGETS": '{"RunMicrovm": [0.1, 1]}'}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        t0 = fleet.clock.now()
        state = _jumping_clock(fleet, monkeypatch, t0 + 20, -30.0)
        fleet.invoke(monkeypatch, cold=False)
        assert state["jumped"] is not None
        late = _rel(calls.after(t0 + 65.0), t0)
        assert not late, dict(real_seconds=round(fleet.clock.now() - t0, 2), past_65=late)
        assert peak_live(fleet) <= 8
        assert_no_duplicates(fleet)


# Found (a strict xfail until fixed): min 6 / warm 0 / max 8 from empty, default 50 s tick; the
# reconciler's clock steps 30 s forward while its first RunMicrovm is on the wire (no real time
# passes): that intent measures 30 s, _slowest_intent = 30, the second intent's check (30 + 30 >=
# 59, tick.py:532) breaks the step and the tick loop's (tick.py:222) ends the tick: 1 RunMicrovm, 5
# base slots left for the next minute, 62 s below min_vms (t0 to t0 + 62) with the room and 65 s of
# invocation left; before 7852f4c the step went on
# Fixed: the next intent is expected to take the tick's second slowest intent's time (_intent_took),
# not its slowest: one slow answer or clock step no longer stands for every later intent.
def test_a_clock_step_forward_does_not_stop_the_fill(aws, monkeypatch) -> None:
    catch_crashes(monkeypatch)
    env = {"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "8"}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        t0 = fleet.clock.now()
        fleet._environment, fleet._built_env = fleet.reconciler(monkeypatch), (dict(fleet.env), True)
        state = {"by": 0.0}
        fleet._environment.clock = lambda: fleet.clock.now() + state["by"]

        def jump(model: Any, **_: Any) -> None:
            if model.name == "RunMicrovm" and not state["by"]:
                state["by"] = 30.0

        fleet._environment.microvms.meta.events.register("before-call", jump)
        first = fleet.invoke(monkeypatch, cold=False)
        runs = len(ours(fleet, "RunMicrovm"))
        fleet.clock.advance(max(0.0, t0 + 60 - fleet.clock.now()))
        fleet.invoke(monkeypatch, cold=False)
        fleet.clock.advance(3)
        below = round(seconds_below(fleet, 6, t0, t0 + 62), 2)
        found = dict(result=first.result, runs_first_tick=runs, below=below, ours=Counter(vm["state"] for vm in fleet.ours()))
        assert state["by"] and found["ours"] == {"RUNNING": 6}, found
        assert runs == 6 and below <= 2.5 + fleet.server.serve_seconds, found


# --------------------------------------------------------------------------- 4. parking, d2d3367


@pytest.mark.parametrize("warm,runs,suspends,lag,pending", [
    pytest.param(6, "[0.5, 1]", "[2, 1]", 0.0, 2, id="6-warm-one-run-a-2s"),
    pytest.param(6, "[0.5, 1]", "[2, 1]", 1.0, 2, id="6-warm-list-lag"),
    pytest.param(6, "[0.5, 1]", "[2, 1]", 0.0, 4, id="6-warm-slow-start-409"),
    pytest.param(10, "[1.6, 2]", "[2, 1]", 0.0, 2, id="10-warm"),
    pytest.param(6, "[3, 4]", "[0.25, 1]", 0.0, 2, id="6-warm-slow-suspends"),
    pytest.param(8, "[0.7, 1]", "[2, 1]", 0.0, 3, id="8-warm-pending-3s"),
])
def test_many_parked_slots_with_a_slow_run_budget_park_soon_without_a_busy_loop(
        aws, monkeypatch, warm, runs, suspends, lag, pending) -> None:
    """Held: min 1, ``warm`` parked slots, max warm + 2, from empty, runs spread by the shared
    RunMicrovm budget. Every parked slot's VM is suspended as soon as its server's answer is looked
    for (3 s after its run's answer) once it is warmed (or, warmed later, at the next poll of the
    answers, 2 s on; or the suspend token after the one before), the whole pool in the first tick;
    the steps stay few (no 50 ms busy loop: at most three a VM), never above max_vms, no duplicate."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    calls = Calls(monkeypatch, ref)
    env = {"MIN_VMS": "1", "WARM_VMS": str(warm), "MAX_VMS": str(warm + 2),
           "BUDGETS": '{"RunMicrovm": %s, "SuspendMicrovm": %s}' % (runs, suspends)}
    with deployed_fleet(aws, env=env, pending_seconds=pending, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        if lag:
            list_lag(fleet, lag)
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        parked = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "warm"}
        run_at = {r.microvm_id: r.time for r in ours(fleet, "RunMicrovm") if r.microvm_id in parked}
        suspended = {r.microvm_id: r.time for r in ours(fleet, "SuspendMicrovm") if r.status == 200}
        assert set(suspended) == parked and len(run_at) == warm, (run_at, suspended)
        gap = 1 / float(suspends.strip("[]").split(",")[0])
        late, previous = {}, float("-inf")
        for vm in sorted(parked, key=suspended.get):
            warmed = fleet.server.warmed[vm]
            expected = run_at[vm] + core.SERVE_EXPECTED_SECONDS
            due = max(expected if warmed <= expected else warmed + core.SERVE_POLL_SECONDS, previous + gap)
            if suspended[vm] > due + 0.15:
                late[vm[-6:]] = round(suspended[vm] - due, 3)
            previous = suspended[vm]
        steps = first.result.get("steps", 0)
        found = dict(late=late, steps=steps, calls=first.calls, ddb=sum(1 for op, _, _ in calls.log if op not in
                     ("ListMicrovms", "RunMicrovm", "SuspendMicrovm", "GetMicrovm")),
                     runs=sorted(round(t - t0, 2) for t in run_at.values()),
                     suspends=sorted(round(t - t0, 2) for t in suspended.values()))
        assert not late, found
        # A slow start (PENDING past the 2.6 s assumption) costs looks: lists polled while PENDING.
        assert steps <= 3 * (warm + 1) and first.calls.get("ListMicrovms", 0) <= (4 if pending <= 2 else 6), found
        assert [r.status for r in ours(fleet, "SuspendMicrovm")].count(409) <= 1, found
        fleet.clock.advance(2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": warm}
        assert peak_live(fleet) <= warm + 2
        assert_no_duplicates(fleet)


_LATE_RUN = (
    "broken (not new in these commits, but what 7852f4c's grace and d2d3367's wake were for): TICK_SECONDS={t} "
    "(timeout {to} s: deadline {t} + overtime 7 = {until} s, hard stop {hs} s), min 1 / warm {w}, runs one a 2 s: "
    "the last parked slot's run at {run} s is assumed RUNNING at {assume} s, past the overtime's end "
    "({until} s): _overtime_wake bounds every wake by until = start + deadline + overtime (tick.py:240), "
    "not by the hard stop, so no step parks it; it stays RUNNING until the next minute's tick suspends it "
    "at 60.0 s ({running} s RUNNING as a parked slot's VM); step() starts a parked slot's run it cannot "
    "park within the tick")


@pytest.mark.parametrize("tick_seconds,warm", [
    pytest.param(2, 4),
    pytest.param(1, 6),
    pytest.param(5, 6),
])
def test_short_ticks_park_their_pool_soon_with_few_steps_and_no_call_past_the_timeout(aws, monkeypatch, tick_seconds, warm) -> None:
    """``tick_seconds`` of 1-5 (the construct's timeout tick + 15 s), min 1, ``warm`` parked
    slots, runs one a 2 s (the last ones' parks fall in the overtime or past it), three minutes.
    No call after the function's timeout, steps few (at most three a VM a tick), every parked
    VM suspended within 2.6 s (+0.6) of being RUNNING (warmed about 0.8 s after it runs: its
    server's answer is looked for 3 s after its run's answer), never above max_vms, no duplicate."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    calls = Calls(monkeypatch, ref)
    env = {"MIN_VMS": "1", "WARM_VMS": str(warm), "MAX_VMS": str(warm + 2), "TICK_SECONDS": str(tick_seconds),
           "BUDGETS": '{"RunMicrovm": [0.5, 1]}'}
    timeout = tick_seconds + 15
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        t0 = fleet.clock.now()
        results = []
        for minute in range(3):
            start = fleet.clock.now()
            results.append(fleet.invoke(monkeypatch, timeout=timeout).result)
            past = _rel([c for c in calls.after(start + timeout) if c[1] < start + 60], start)
            assert not past, (minute, past)
            fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        parked = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "warm"}
        run_at = {r.microvm_id: r.time for r in ours(fleet, "RunMicrovm") if r.microvm_id in parked}
        suspended = {r.microvm_id: r.time for r in ours(fleet, "SuspendMicrovm") if r.status == 200}
        assert set(suspended) == parked and len(parked) == warm, (run_at, suspended)
        assert all(r.get("steps", 0) <= 3 * (warm + 1) for r in results), results
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": warm}
        assert peak_live(fleet) <= warm + 2
        assert_no_duplicates(fleet)
        running = {round(run_at[vm] - t0, 2): round(suspended[vm] - running_at(fleet, vm), 2) for vm in parked}
        assert all(v <= 2.6 + 0.6 for v in running.values()), dict(run_to_seconds_running=running, results=results)



# Found (a strict xfail until fixed): the default 50 s tick (hard stop 59 s), min 7 / max 8 from
# empty, RunMicrovm budget one per 8 s, the first RunMicrovm (sent at 0 s) answered 14 s late (under
# its 15 s read timeout): _slowest_intent = 14 for the rest of the tick; the next runs at 18, 26,
# 34, 42 s, then the tick ends at 46.0 s: the token due at 50 s (before the deadline, 9 s before the
# hard stop, for an intent that takes 0 s) is never used ('steps and clock + _slowest_intent >=
# _hard_stop', tick.py:222: 50 + 14 >= 59); 5 of 7 base VMs in the tick, 2 left to the next minute
# Fixed: the next intent is expected to take the tick's second slowest intent's time (_intent_took),
# not its slowest: one slow answer or clock step no longer stands for every later intent.
def test_one_slow_intent_early_in_a_default_tick_does_not_cost_the_later_runs(aws, monkeypatch) -> None:
    """One RunMicrovm answered 14 s late at the tick's start; the runs the budget allows before
    the deadline still start in the tick (6 of 7: the 7th token, at 58 s, is past the overtime)."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    fired: list[float] = []

    def slow(op: str, at: float) -> float:
        if op == "RunMicrovm" and not fired:
            fired.append(at)
            return 14.0
        return 0.0

    Calls(monkeypatch, ref, slow)
    env = {"MIN_VMS": "7", "WARM_VMS": "0", "MAX_VMS": "8", "BUDGETS": '{"RunMicrovm": [0.125, 1]}'}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ref["fleet"] = fleet
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        runs = [round(r.time - t0, 2) for r in ours(fleet, "RunMicrovm")]
        found = dict(result=first.result, runs=runs, tick_seconds=round(fleet.clock.now() - t0, 2))
        assert fired and len(runs) >= 6, found


def test_a_refused_suspend_after_assuming_running_with_many_parked_slots(aws, monkeypatch) -> None:
    """Held: min 1 / warm 6 / max 8, runs one a 2 s; a client ends the second parked slot's VM
    right after its run (a crash looks the same): its suspend, sent on the assumption, is refused;
    nothing more is assumed in the tick (the later VMs are looked at: GetMicrovm, lists polled),
    the slot gets a new VM, and every VM of the pool is parked in the tick, each within two polls
    (2 x 2.6 s) of being RUNNING; steps and lists bounded, never above max_vms, no duplicate."""
    catch_crashes(monkeypatch)
    env = {"MIN_VMS": "1", "WARM_VMS": "6", "MAX_VMS": "8", "BUDGETS": '{"RunMicrovm": [0.5, 1]}'}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ended: list[str] = []
        seen: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "RunMicrovm" and record.caller == RECONCILER_CALLER and record.status == 200:
                seen.append(record.microvm_id)
                if len(seen) == 3 and not ended:  # base-0 and warm-0 first, at once
                    fleet.emulator.terminating_seconds = 0.1  # TERMINATED listed for minutes, as in AWS
                    fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=record.microvm_id)
                    ended.append(record.microvm_id)

        fleet.emulator.subscribe(on_request)
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        statuses = [r.status for r in ours(fleet, "SuspendMicrovm")]
        parked = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "warm"}
        suspended = {r.microvm_id: r.time for r in ours(fleet, "SuspendMicrovm") if r.status == 200}
        running = {vm[-6:]: round(suspended[vm] - running_at(fleet, vm), 2) for vm in parked if vm in suspended}
        found = dict(result=first.result, calls=first.calls, statuses=statuses, running=running,
                     tick=round(fleet.clock.now() - t0, 2))
        assert ended and ended[0] not in parked and set(suspended) >= parked and len(parked) == 6, found
        assert sum(1 for st in statuses if st >= 400) <= 1, found
        assert all(v <= 2 * 2.6 + 0.6 for v in running.values()), found
        assert first.result["steps"] <= 3 * 8 and first.calls.get("ListMicrovms", 0) <= 6, found
        fleet.clock.advance(2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 6}, found
        assert peak_live(fleet) <= 8
        assert_no_duplicates(fleet)
