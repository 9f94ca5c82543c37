"""The API calls of parking (#11): the VMs a tick started for parked slots are assumed RUNNING
2.6 s after their runs, with no look of their own; a look (GetMicrovm for one VM, a list for
more) is left for slow starts, whose suspend is refused, and the tests use slow starts (PENDING
4 s) where they need it. Suspends act on what was seen when their tokens come due after it
(``suspends_only``: nothing ended or resumed on it), and ``parking_unseen`` says there was no
look of its own for our suspends. A served fleet (the
product's ``rayito`` 0.17 launch, the fleet's server warming each parked slot's VM) suspends a
parked slot's VM only after the server's warm answer (``Ready`` in the ledger: RUNNING + 0.78 s
in ``VirtualServer``), read by a step that wakes 3 s after the ask, then every 2 s; that answer
stands in for the look and the assumption (no PENDING poll, no refused suspend of a slow start):
the tests choreograph it where they choreographed those. Everything through ``index.handler``
(Powertools, one-attempt clients) against the emulator and moto on a virtual clock."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from lambdas.reconciler import core

from .harness import RECONCILER_CALLER, act_during_sleep, deployed_fleet, list_lag, peak_live
from .support import ours
from .support import assert_no_duplicates

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")





#: SuspendMicrovm at one a 4 s (burst 1): the second parked slot's suspend comes due 4 s after the
#: first (at 7 s), after the step's own list at 5 s.
SLOW_SUSPENDS = '{"SuspendMicrovm": [0.25, 1]}'
#: SuspendMicrovm at one a second (burst 1): the second parked slot's suspend comes due 1 s after the
#: first, before any other list: it is sent by a suspends-only step standing on the tick's first list
#: and the server's warm answers (both VMs RUNNING).
SECOND_SUSPENDS = '{"SuspendMicrovm": [1, 1]}'


def test_a_client_resuming_a_parked_vm_before_a_suspends_only_step_keeps_its_session(aws, monkeypatch) -> None:
    """Both parked slots' VMs are warmed by the server (its answer at 2.78 s, read at 3 s: RUNNING,
    no look); warm-0's is suspended at once, warm-1's on the next suspend token (one a second), on
    the same list. Between the two, a client resumes warm-0's VM (now SUSPENDED): the
    suspends-only step sees it RUNNING (the server's answer), within the park grace, and leaves it
    alone (never suspended again); the next tick makes it a member and refills the pool. (With one
    suspend a 4 s, as written, the step lists at 5 s before warm-1's suspend at 7 s: that list
    shows warm-0 SUSPENDED and the scenario is gone.)"""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5", "BUDGETS": SECOND_SUSPENDS}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        resumed: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not resumed:
                vm = record.microvm_id
                fleet.clock.advance(1.5)  # SUSPENDING -> SUSPENDED (1 s here)
                fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=vm)
                resumed.append(vm)

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        suspends = ours(fleet, "SuspendMicrovm")
        assert len(suspends) == 2 and suspends[0].microvm_id == resumed[0] != suspends[1].microvm_id
        assert first.calls.get("ListMicrovms") == 1  # the second suspend stood on the first list
        assert all(r.time >= fleet.server.warmed[r.microvm_id] for r in suspends)  # after the warm answers
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        # The client's session was never suspended again, and it is a member now.
        assert [r for r in ours(fleet, "SuspendMicrovm") if r.microvm_id == resumed[0]] == suspends[:1]
        assert fleet.emulator.state_of(resumed[0]) == "RUNNING"
        slots = fleet.ledger_slots()
        assert any(s["role"] == "member" and s["microvm_id"] == resumed[0] for s in slots.values())
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 2}
        assert_no_duplicates(fleet)


def test_a_vm_that_ends_between_the_look_and_its_suspend_is_replaced(aws, monkeypatch) -> None:
    """warm-1's VM, warmed (the server's answer: RUNNING), ends (a client terminates it at warm-0's
    suspend, 3 s: a crash or expiry looks the same) before its suspend comes due at 4 s on the same
    look: the suspend is refused (Conflict) and told; the next look (the next tick's list, 60 s:
    the refusal of a suspend sent on the server's answer is not an assumption refused, no look in
    the tick) shows the VM ended, and a new VM is started for the slot and parked; no more than
    max_vms, no duplicate. (With one suspend a 4 s, as written, the step's own list at 5 s shows
    the VM ended before its suspend: nothing is refused.)"""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "4", "BUDGETS": SECOND_SUSPENDS}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        ended: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not ended:
                slots = fleet.ledger_slots()
                other = [s["microvm_id"] for k, s in slots.items()
                         if s["role"] == "warm" and s["microvm_id"] and s["microvm_id"] != record.microvm_id]
                fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=other[0])
                ended.append(other[0])

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        refused = [r for r in ours(fleet, "SuspendMicrovm") if r.microvm_id == ended[0]]
        assert refused and {r.status for r in refused} == {409}
        assert [e for e in first.events("api_error") if e.get("microvm_id") == ended[0]]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}
        assert peak_live(fleet) <= 4
        assert_no_duplicates(fleet)


@pytest.mark.parametrize("warm", [2, 3])
def test_parked_slots_vms_a_lagging_list_misses_are_still_parked_in_the_tick(aws, monkeypatch, warm) -> None:
    """Lists omit VMs younger than 6 s (#11.2's lagging lists): the one look at the VMs a tick
    started for its parked slots is a list when there are several, and that list misses them.
    They must still be looked at (GetMicrovm answers for each, lists do not lag them) and parked
    in the same tick, not left RUNNING until the next one."""
    env = {"MIN_VMS": "1", "WARM_VMS": str(warm), "MAX_VMS": str(warm + 2)}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        list_lag(fleet, 6)
        t0 = fleet.clock.now()
        fleet.invoke(monkeypatch)
        suspends = ours(fleet, "SuspendMicrovm")
        assert len(suspends) == warm, fleet.emulator.calls
        assert all(r.time <= t0 + 15 for r in suspends)
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": warm}
        assert_no_duplicates(fleet)


def test_a_throttled_peek_is_told_and_the_step_lists_instead(aws, monkeypatch) -> None:
    """A slow start (PENDING 4 s) with the GetMicrovm budget spent (one token in 600 s, taken by a
    client: any GetMicrovm of the reconciler would be throttled, 429). Written for the peek at a
    parked slot's VM whose assumed suspend was refused (told, the step listing instead). A served
    fleet has no such peek: the server waits for the VM to run and says when it is warmed
    (RUNNING 4 s, warmed 4.78 s), and the step that reads that answer (5 s) suspends it. So:
    no GetMicrovm at all (nothing throttled, nothing to tell), no refused suspend, one suspend
    after the warm answer, and the VM parked in the tick."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"},
                        pending_seconds=4, fresh_launches=0) as fleet:
        fleet.emulator.set_rate_limit("GetMicrovm", 1 / 600, 1, surge=0)
        try:  # the one token of the bucket: taken by a client of the test
            fleet.emulator.direct_client(caller="client").get_microvm(microvmIdentifier="nope")
        except Exception:
            pass
        t0 = fleet.clock.now()
        run = fleet.invoke(monkeypatch)
        assert ours(fleet, "GetMicrovm") == []
        suspends = ours(fleet, "SuspendMicrovm")
        assert [r.status for r in suspends] == [200]
        assert fleet.server.warmed[suspends[0].microvm_id] <= suspends[0].time <= t0 + 7
        assert not run.events("api_error") and not run.metrics("Throttles")
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}


@pytest.mark.stores("dynamodb")  # a skewed clock is learned from DynamoDB's answers
@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_a_skewed_clock_parks_on_one_look_and_suspends_only_on_it(aws, monkeypatch, skew) -> None:
    """A cold execution environment whose clock is 30 s off: the list's age, the runs' answers,
    the suspend tokens' due time and the server's answers (their ``at``) are all reckoned on the
    shared clock (learned from the first answers), so the tick parks its VMs without a look of
    their own, once the server warmed them (2.78 s; 30 s ahead, every answer would read as due at
    once and PENDING VMs be suspended; 30 s behind, none would be read in the tick), sends the
    second suspend 4 s after the first, on the list the step made at 5 s (2 s old: a 30 s skew
    read as a list 32 s old would list again), and parks both, as with no skew (measured: lists
    at 0 and 5 s, suspends at 3 and 7 s)."""
    from .support import dynamodb_dates_on

    env = {"MIN_VMS": "2", "WARM_VMS": "2", "MAX_VMS": "5", "BUDGETS": SLOW_SUSPENDS}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        reconciler = fleet.reconciler(monkeypatch)
        dynamodb_dates_on(reconciler, fleet.clock)
        reconciler.clock = lambda: fleet.clock.now() + skew
        fleet._environment, fleet._built_env = reconciler, (dict(fleet.env), True)
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        assert first.calls == {"ListMicrovms": 2, "RunMicrovm": 4, "SuspendMicrovm": 2}
        suspends = ours(fleet, "SuspendMicrovm")
        assert [r.status for r in suspends] == [200, 200]
        assert all(fleet.server.warmed[r.microvm_id] <= r.time <= fleet.server.warmed[r.microvm_id] + 4.5
                   for r in suspends), (suspends, fleet.server.warmed)
        assert 3.9 <= suspends[1].time - suspends[0].time <= 4.5
        # As with no skew: the tick's list, the step's own at 5 s, and no list for the second suspend.
        assert [round(r.time - t0, 3) for r in ours(fleet, "ListMicrovms")] == [0.0, 5.0]
        fleet.clock.advance(60)
        second = fleet.invoke(monkeypatch)
        assert second.calls == {"ListMicrovms": 1}
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 2}
        assert_no_duplicates(fleet)


@pytest.mark.stores("dynamodb")  # it empties a bucket in the budget's table
def test_a_handover_due_on_a_suspends_only_step_waits_for_a_fresh_list(aws, monkeypatch) -> None:
    """A time-driven resume on a suspends-only step: base-0's VM comes within the handover lead of
    its end (no headroom: a client VM and two members fill max_vms) just when a deferred suspend
    comes due after a list 11 s old. The parked VM the list shows SUSPENDED was resumed by a client
    since: a handover on that list would put the client's session in base-0. The handover waits
    for a fresh list, which shows the VM taken: it is a member, never resumed by us nor in a slot."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5", "MAX_LIFETIME_SECONDS": "600",
           "SUCCESSOR_LEAD_SECONDS": "200", "IDLE_SECONDS": "", "BUDGETS": '{"SuspendMicrovm": [0.1, 1]}'}
    # The timeline below was written when 600 s lifetimes were not staggered: first lifetimes all
    # 600 s (staggered since, 413-600 s: a parked slot's successor would come due at 213 s).
    monkeypatch.setattr(core.lifetimes, "MIN_STAGGER_STEP_SECONDS", float("inf"))
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        client = fleet.emulator.direct_client(caller="client")
        t0 = fleet.clock.now()

        def at(seconds: float) -> None:
            fleet.clock.advance(max(0.0, t0 + seconds - fleet.clock.now()))

        def parked(slot: str) -> str:
            return fleet.ledger_slots()[slot]["microvm_id"]

        fleet.invoke(monkeypatch)
        at(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}
        assert {s["lifetime"] for s in fleet.ledger_slots().values()} == {600}  # not staggered (above)
        # The product parks a warm VM for 360 s at most (its pool's idle policy: ended after that
        # long SUSPENDED); the donor is parked at 129 s, so it is still parked at 470 s.
        at(120)
        client.resume_microvm(microvmIdentifier=parked("warm-1"))  # warm-1 taken: refilled at 125
        at(125)
        fleet.invoke(monkeypatch)
        at(185)
        fleet.invoke(monkeypatch)
        donor = parked("warm-1")
        assert fleet.emulator.state_of(donor) == "SUSPENDED"
        at(390)
        own_vm = client.run_microvm(imageIdentifier=fleet.image, clientToken="client-own")["microvmId"]
        at(402)
        fleet.invoke(monkeypatch)  # base-0 wants a successor, no headroom: hand over at 480
        at(465)
        client.terminate_microvm(microvmIdentifier=own_vm)
        client.resume_microvm(microvmIdentifier=parked("warm-0"))  # warm-0 taken: refilled at 470
        at(470)
        # The SuspendMicrovm budget is busy until 481 (other fleets parking): the refilled slot's
        # suspend (its VM warmed by the server at 472.78, read at 473) comes due after the
        # handover's time, on the list of 470.
        fleet.ddb.put_item(TableName=fleet.env["BUDGET_TABLE"],
                           Item={"operation": {"S": "SuspendMicrovm"}, "tat": {"N": repr(t0 + 481)}})
        taken: list[float] = []

        def on_request(record: Any) -> None:
            if record.operation == "ListMicrovms" and record.caller == RECONCILER_CALLER and not taken:
                taken.append(record.time)  # the list has shown the donor SUSPENDED
                client.resume_microvm(microvmIdentifier=donor)  # a client takes the parked VM

        fleet.emulator.subscribe(on_request)
        run = fleet.invoke(monkeypatch)
        lists = [r.time - t0 for r in ours(fleet, "ListMicrovms", t0 + 470)]
        suspends = [r.time - t0 for r in ours(fleet, "SuspendMicrovm", t0 + 470)]
        assert taken and suspends and suspends[0] >= 480.9  # on its budget, after the handover's time
        assert not [t for t in lists if taken[0] - t0 < t < suspends[0]]  # the suspend stood on the list
        assert [t for t in lists if t >= suspends[0]]  # the handover waited for a fresh list
        assert not [r for r in ours(fleet, "ResumeMicrovm") if r.microvm_id == donor]
        assert not run.events("vm_handed_over")
        slots = fleet.ledger_slots()
        assert any(s["role"] == "member" and s["microvm_id"] == donor for s in slots.values())
        assert slots["base-0"]["microvm_id"] != donor
        assert fleet.emulator.state_of(donor) == "RUNNING"
        assert_no_duplicates(fleet)


def test_a_suspend_deferred_past_the_peek_ttl_lists_again_first(aws, monkeypatch) -> None:
    """SuspendMicrovm at one per 20 s: the second parked slot's suspend comes due 20 s after the
    step that assumed its VM RUNNING, past PEEK_TTL_SECONDS (12 s) after the last list: the step
    lists again before it (a VM may have ended or been taken since), and both VMs are parked."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "4", "BUDGETS": '{"SuspendMicrovm": [0.05, 1]}'}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        first = fleet.invoke(monkeypatch)
        suspends = [r.time for r in ours(fleet, "SuspendMicrovm")]
        lists = [r.time for r in ours(fleet, "ListMicrovms")]
        assert len(suspends) == 2 and suspends[1] - suspends[0] >= 19.9
        assert [t for t in lists if suspends[0] < t <= suspends[1]]  # a fresh list before the second
        assert first.calls == {"ListMicrovms": 2, "RunMicrovm": 3, "SuspendMicrovm": 2}
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}


def test_a_look_that_still_says_pending_looks_again_and_parks_in_the_tick(aws, monkeypatch) -> None:
    """A slow start (PENDING 4 s) and every read 1.5 s late (on top of the measured 0.5 s). Written
    for the look after a refused assumed suspend that still said PENDING (looked at again). A
    served fleet looks at no parked VM to park it: the server waits for the VM to run and answers
    when it is warmed (4.78 s); the steps that read no answer yet (3 s) wait for it (every 2 s), the
    one that reads it (5 s) suspends the VM, in the same tick; no stale read is needed or made
    (no GetMicrovm), no suspend of a PENDING VM (no refusal), no second VM."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"},
                        pending_seconds=4, fresh_launches=0) as fleet:
        fleet.emulator.stale_seconds = 1.5
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        assert not ours(fleet, "GetMicrovm") and first.calls.get("SuspendMicrovm") == 1, first.calls
        suspends = ours(fleet, "SuspendMicrovm")
        assert [r.status for r in suspends] == [200]
        assert fleet.server.warmed[suspends[0].microvm_id] <= suspends[0].time <= t0 + 7
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
        assert_no_duplicates(fleet)


def test_a_vm_neither_lists_nor_gets_show_is_looked_at_again_once_per_tick(aws, monkeypatch) -> None:
    """A slow start (PENDING 4 s), lists 60 s late and every GetMicrovm refused (500). Written for
    the looks at parked slots' VMs the list missed after a refused assumed suspend (once, not every
    poll). A served fleet needs no look of its own to park them: the server's warm answers (4.78
    s, read at 5 s) show both RUNNING, and the tick parks them on its first list and those answers:
    no GetMicrovm (none refused), no other list, no suspend refused, none sent twice."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "4"},
                        pending_seconds=4, fresh_launches=0) as fleet:
        lag = list_lag(fleet, 60)
        refused = fleet.emulator.inject("GetMicrovm", "InternalServer", times=None, caller=RECONCILER_CALLER)
        first = fleet.invoke(monkeypatch)
        assert not ours(fleet, "GetMicrovm") and first.calls.get("ListMicrovms") == 1, first.calls
        suspends = ours(fleet, "SuspendMicrovm")
        assert [r.status for r in suspends] == [200, 200] and len({r.microvm_id for r in suspends}) == 2
        assert all(r.time >= fleet.server.warmed[r.microvm_id] for r in suspends)
        assert not first.events("api_error")
        fleet.emulator.remove_fault(lag)
        fleet.emulator.remove_fault(refused)
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}
        assert_no_duplicates(fleet)


def test_a_suspend_whose_answer_is_lost_never_suspends_the_session_a_client_resumed(aws, monkeypatch) -> None:
    """The service suspends warm-0's VM and the answer is lost (the emulator's lost response: the
    work done, then a 500); a client resumes the VM before the reconciler looks again. The
    reconciler's GetMicrovm 0.6 s after the failure reads SUSPENDED (the client's resume keeps it
    SUSPENDED until /resume returns): the suspend landed, and the VM seen RUNNING after the park
    grace is the client's (a member, the pool refilled), never suspended again. (Before, the slot
    was PARKING with no ``parking_since``, and the next step suspended the client's session.)"""
    env = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "4"}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.emulator.inject("SuspendMicrovm", "lost_response", times=1)
        resumed: list[str] = []

        def on_request(record: Any) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not resumed:
                fleet.clock.advance(1.5)  # SUSPENDING -> SUSPENDED (1 s here)
                fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=record.microvm_id)
                resumed.append(record.microvm_id)

        fleet.emulator.subscribe(on_request)
        first = fleet.invoke(monkeypatch)
        assert resumed and any(e.get("operation") == "SuspendMicrovm" for e in first.events("api_error"))
        assert [e["outcome"] for e in first.events("park_doubt_settled")] == ["landed"]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 3)
        assert [r.microvm_id for r in ours(fleet, "SuspendMicrovm")].count(resumed[0]) == 1
        assert fleet.emulator.state_of(resumed[0]) == "RUNNING"
        slots = fleet.ledger_slots()
        assert any(s["role"] == "member" and s["microvm_id"] == resumed[0] for s in slots.values())
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2, "SUSPENDED": 1}
        assert_no_duplicates(fleet)


@pytest.mark.parametrize("warm", [3])  # 1: test_a_throttled_peek_is_told_and_the_step_lists_instead
def test_a_slow_start_costs_one_refused_suspend_per_tick_and_still_parks_in_the_tick(aws, monkeypatch, warm) -> None:
    """PENDING 4 s (a slow image; a fresh version's first launches take up to a minute). Written
    for the parked slots' VMs assumed RUNNING at 2.6 s (one refused suspend, then looks). A served
    fleet suspends a parked slot's VM only after the server warmed it (RUNNING + 0.78 s: 4.78 s,
    read at 5 s): no refused call at all (none told ``assumed_running``), the VMs parked in the same
    tick on the suspend tokens (about two a second), no suspend lost."""
    env = {"MIN_VMS": "1", "WARM_VMS": str(warm), "MAX_VMS": str(warm + 2)}
    with deployed_fleet(aws, env=env, pending_seconds=4, fresh_launches=0) as fleet:
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        suspends = ours(fleet, "SuspendMicrovm")
        assert [r.status for r in suspends] == [200] * warm
        assert all(fleet.server.warmed[r.microvm_id] <= r.time < t0 + 7 for r in suspends), suspends
        assert not [e for e in first.events("api_error") if e.get("assumed_running")]
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": warm}
        assert_no_duplicates(fleet)


# ------------------------------------------------------------------ a tick that takes over mid-fill


@pytest.mark.parametrize("lag", [1.0, 0.0])
def test_a_tick_that_takes_over_parks_the_vm_the_old_tick_started_just_before(aws, monkeypatch, lag) -> None:
    """Found on the benchmark (43 fleets, seed 81868: convergence 77.0 s against a goal of 70.9 s).
    Tick A (5 s ticks) runs base-0, warm-0 and warm-1 at once, parks warm-0, and runs warm-2 when
    the shared budget (0.21 runs/s, burst 3) gives it its fourth token, just before its deadline;
    tick B (the next delivery, a new execution environment) takes the lease over right after that
    run, while warm-1's suspend still waits for the shared SuspendMicrovm budget (one a 4 s). B's
    first list misses warm-2's VM (``lag``: lists omit VMs younger than a second; 0: the
    emulator's own lag of up to 0.5 s), and warm-1's suspend comes due on that list. Before, B
    looked at warm-2's VM never (A started it, less than a second before B's list) or only in the
    step that planned it (the suspend's step, standing on the old list, dropped the look): it was
    parked by the next minute's tick. Held: B parks all three, the last within its own tick; one VM
    per slot, never above max_vms, B's tick lists twice at most."""
    env = {"MIN_VMS": "1", "WARM_VMS": "3", "MAX_VMS": "5", "TICK_SECONDS": "5",
           "BUDGETS": '{"RunMicrovm": [0.21, 3], "SuspendMicrovm": [0.25, 1]}'}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        if lag:
            list_lag(fleet, lag)
        t0 = fleet.clock.now()
        fleet._environment = fleet.reconciler(monkeypatch)  # A's execution environment
        fleet._built_env = (dict(fleet.env), True)
        runs: list[float] = []
        fleet.emulator.subscribe(lambda r: runs.append(r.time) if r.operation == "RunMicrovm" and r.status == 200 else None)
        second: list = []
        fired = act_during_sleep(fleet, t0 + 4.9, lambda: second.append(fleet.invoke(monkeypatch, cold=True, timeout=20)))
        first = fleet.invoke(monkeypatch, timeout=20)
        assert fired and second and len(runs) == 4 and runs[-1] < fired[0], (runs, fired)
        b = second[0]
        assert b.result.get("steps") and "skipped" not in b.result, b.result
        assert first.result.get("lease_lost"), first.result
        warm = {s["microvm_id"]: name for name, s in fleet.ledger_slots().items() if s["role"] == "warm"}
        assert len(warm) == 3, fleet.ledger_slots()
        suspends = {r.microvm_id: r.time for r in ours(fleet, "SuspendMicrovm") if r.status == 200}
        assert set(suspends) == set(warm), (suspends, warm)
        # Within B's tick (5 s and its overtime), not the next minute's.
        assert max(suspends.values()) <= fired[0] + 5 + 7 + 1e-6, (suspends, fired)
        fleet.clock.advance(2)  # the last suspend's SUSPENDING (1 s here)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 3}
        assert b.calls.get("ListMicrovms", 0) <= 2, b.calls
        assert peak_live(fleet) <= 5
        assert_no_duplicates(fleet)


# spread: the least time between the first and the last parked slot's run; within_3_5: every
# suspend within 3.5 s of its run (the server's answer read 3 s after the ask, made with the run's
# answer, and one suspend token), where the suspends do not queue.
@pytest.mark.parametrize("shape,budgets,spread,within_3_5", [
    ((1, 3, 6), '{"RunMicrovm": [1.6, 2], "SuspendMicrovm": [2, 1]}', 1.0, True),
    ((5, 2, 8), None, 0.6, True),  # the default budgets: warm-0 and three base slots at once, warm-1 0.6 s later
    ((6, 3, 12), '{"RunMicrovm": [3, 4]}', 1.0, False),  # warm-0 and warm-1 at once: the second suspend queues
])
def test_each_parked_slots_vm_is_parked_soon_after_its_own_run(aws, monkeypatch, shape, budgets, spread,
                                                               within_3_5) -> None:
    """Runs spread by the shared budget (1.6 a second, burst 2: warm-0 and base-0 at once, warm-1
    0.6 s later, warm-2 1.2 s later), suspends at two a second (burst 1). Each parked slot's VM is
    assumed RUNNING 2.6 s after its own run's answer and suspended then (or at the next suspend
    token): not all at the last run's 2.6 s (one look for all: later steps put earlier VMs off),
    nor 2.6 s after the step that parked the one before (2 fleets, seed 41: a VM run at 2.3 s is
    parked at 5.3 s, not 6.9 s, and the fleets converge in 7.3 s, not 8.3 s, the goal 8.5 s), nor
    at the look the plan of that step asked for its PENDING VM, 2.6 s after the step (1 fleet,
    seed 5059040, min 5 / warm 2 / max 8: warm-1's VM run at 0.632 s, parked at 5.2 s instead of
    3.232 s; convergence 6.6 s against a goal of 6.56 s).

    A served fleet: the server is asked to warm each VM with its run's answer and warms it 2.78 s
    after the run (RUNNING 2 s, + 0.78 s); the step wakes for each answer 3 s after its ask, so each
    VM is suspended 3 s after its own run (or at the next suspend token), never before the
    server's warm answer (measured: runs at 0, 1.25 s -> suspends at 3, 3.5 (token), 4.25 s; runs
    at 0, 0.632 s -> 3, 3.632 s; runs at 0, 0, 1.333 s -> 3, 3.526 (token), 4.333 s)."""
    min_vms, warm_vms, max_vms = shape
    env = {"MIN_VMS": str(min_vms), "WARM_VMS": str(warm_vms), "MAX_VMS": str(max_vms),
           **({"BUDGETS": budgets} if budgets else {})}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.invoke(monkeypatch)
        warm = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "warm"}
        runs = {r.microvm_id: r.time for r in ours(fleet, "RunMicrovm") if r.microvm_id in warm}
        suspends = {r.microvm_id: r.time for r in ours(fleet, "SuspendMicrovm") if r.status == 200}
        assert set(suspends) == warm and len(runs) == warm_vms, (runs, suspends)
        assert max(runs.values()) - min(runs.values()) >= spread  # the budget spread them
        asked = {}
        for ask in fleet.server.asks:
            asked.setdefault(ask["microvm_id"], ask["received_at"])
        warmed = fleet.server.warmed
        early = {vm: round(warmed[vm] - suspends[vm], 3) for vm in warm if suspends[vm] < warmed[vm]}
        assert not early, (early, warmed, suspends)  # never before the server warmed it
        # Each suspend by its own VM's answer (read 3 s after its ask, or when it was written if
        # later) or the suspend token after the one before (two a second with the default budgets
        # and here), whichever is later, and 0.1 s of slack.
        late, previous = {}, float("-inf")
        for vm in sorted(warm, key=suspends.get):
            due = max(asked[vm] + 3.0, warmed[vm], previous + 0.5)
            if suspends[vm] > due + 0.1:
                late[vm] = round(suspends[vm] - due, 3)
            previous = suspends[vm]
        assert not late, (late, runs, suspends)
        assert all(asked[vm] - runs[vm] < 0.1 for vm in warm), (asked, runs)  # asked with the run's answer
        if within_3_5:
            late = {vm: round(suspends[vm] - runs[vm], 3) for vm in warm if suspends[vm] - runs[vm] > 3.0 + 0.5 + 1e-6}
            assert not late, late
        fleet.clock.advance(2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": min_vms, "SUSPENDED": warm_vms}
        assert_no_duplicates(fleet)
