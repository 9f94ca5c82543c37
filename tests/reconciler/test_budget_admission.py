"""Bad input, skew and kills (#11) against the shared budget's single admission line,
reserve-before-list, skip-instead-of-takeover and in-doubt refusals, through ``index.handler``
against the emulator and moto where a failure would show there."""

from __future__ import annotations

import math

import pytest

from lambdas.reconciler.budget import DEFAULT_BUDGETS, DEFAULT_SHARE, DynamoDBBudget, Granted, MemoryBudget

from ..moto_server import client as aws_client
from .harness import deployed_fleet
from .support import dynamodb_dates_on





#: Budgets a hand-edited or mis-generated BUDGETS environment can hold (json.loads takes NaN and
#: Infinity): a zero rate divided by zero on every tick, a negative or NaN rate admitted every
#: call (the stored arrival time never grows), a burst under 1 never admitted one token by the
#: DynamoDB store (the fleet never listed), a string crashed ``index.build``.
BAD_BUDGETS = ('{"RunMicrovm": [0, 5], "ListMicrovms": [NaN, 10], "GetMicrovm": [-100, 100],'
               ' "SuspendMicrovm": [2, 0.5], "ResumeMicrovm": [Infinity, 5], "TerminateMicrovm": "x",'
               ' "CreateMicrovmAuthToken": [50, -1]}')


def test_a_bad_budgets_environment_keeps_the_documented_quotas_and_says_so(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"BUDGETS": BAD_BUDGETS}) as fleet:
        first = fleet.invoke(monkeypatch)
        assert "skipped" not in first.result
        assert len(fleet.ours()) == 2  # it still converges (min 1, warm 1)
        rejected = first.events("budgets_rejected")
        assert rejected and set(rejected[0]["operations"]) == {
            "RunMicrovm", "ListMicrovms", "GetMicrovm", "SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm",
            "CreateMicrovmAuthToken"}
        # Each bad entry fell back to the documented quota's share, not to "no limit".
        budget = fleet._environment.budget
        for operation, (rate, burst) in DEFAULT_BUDGETS.items():
            assert budget.budgets[operation] == (rate * DEFAULT_SHARE, max(1.0, burst - 1))


@pytest.mark.parametrize("value", ["55", {"5": 1, "7": 2}, [5, True], [5], [5, 5, 5], ["5", "5"], None, 5])
def test_only_a_pair_of_numbers_is_a_bucket(value) -> None:
    """Iterating whatever came read "55" as (5, 5), a mapping as its keys and True as 1."""
    from lambdas.reconciler.budget import valid_shape

    assert valid_shape(value) is None
    assert valid_shape([5, 5]) == (5.0, 5.0) and valid_shape((0.5, 2)) == (0.5, 2.0)


@pytest.mark.parametrize("store", ["memory", "dynamodb"])
@pytest.mark.parametrize("cost", [0, -3, math.nan, 1.5])
def test_an_ask_of_no_tokens_is_refused_loudly(aws, store, cost) -> None:
    """A cost of 0 took no token, a negative one gave tokens back (the stored arrival time went
    down): a caller's bug, raised, nothing written."""
    budget = _budget(aws, store)
    with pytest.raises(ValueError, match="cost"):
        budget.acquire("RunMicrovm", 1000.0, cost=cost, horizon=2.0)
    assert budget.remaining("RunMicrovm", 1000.0) == 4.0


@pytest.mark.parametrize("store", ["memory", "dynamodb"])
def test_a_reservation_larger_than_the_burst_is_never_granted(aws, store) -> None:
    """With a horizon, the memory store granted 10 tokens on a burst of 4, all usable at one
    instant (10 calls at once against a quota of 4 + rate x 0); DynamoDB refused them. Both now
    refuse (as without a horizon), and the bucket is untouched."""
    budget = _budget(aws, store)
    refused = budget.acquire("RunMicrovm", 1000.0, cost=10, horizon=2.0)
    assert not isinstance(refused, Granted) and refused.reason == "budget_empty"
    assert budget.remaining("RunMicrovm", 1000.0) == 4.0
    assert budget.acquire("RunMicrovm", 1000.0, cost=4, horizon=2.0) == Granted("RunMicrovm", 4, 0.0)


def _budget(aws, store):
    shape = {"RunMicrovm": (4.75, 4)}
    if store == "memory":
        return MemoryBudget(shape)
    import uuid

    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    return DynamoDBBudget(ddb, table, shape)


@pytest.mark.parametrize("raw", ["not json", "[5, 5]", "5"])
def test_a_budgets_environment_that_is_no_object_keeps_every_default(raw, monkeypatch) -> None:
    from lambdas.reconciler import index
    from lambdas.reconciler.telemetry import MemoryTelemetry

    env = {"BUDGETS": raw, "FLEET_NAME": "f", "IMAGE_ARN": "arn:aws:lambda:us-east-1:123456789012:microvm-image:f",
           "MIN_VMS": "1", "MAX_VMS": "2", "LEDGER_TABLE": "l", "BUDGET_TABLE": "b", "ACCESS_TOKEN_SECRET": "t"}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    telemetry = MemoryTelemetry()
    reconciler = index.build(env, telemetry=telemetry)
    assert reconciler.budget.rejected == {"BUDGETS": repr(raw)}
    assert [e["event"] for e in telemetry.events] == ["budgets_rejected"]
    assert reconciler.budget.budgets["RunMicrovm"] == (5 * DEFAULT_SHARE, 4.0)


@pytest.mark.parametrize("skew", [30.0, -30.0, 0.0])
def test_a_cold_reconciler_with_a_skewed_clock_reserves_on_the_shared_clock(aws, monkeypatch, skew) -> None:
    """A tick reserves the ledger's due runs before the first list, so before any MicroVMs
    answer told a fresh execution environment the service's time. With its clock 30 s ahead, the
    shared RunMicrovm bucket looked idle to it (a whole burst again, on top of the one another
    fleet had just used); 30 s behind, the bucket looked written by a skewed clock and was reset.
    Either way 8 RunMicrovm reached the service at one instant against a burst of 5 (3 answered
    429, a backoff for every fleet). The offset is now learned from the stores' answers (DynamoDB
    dates them too) before the first reservation: 4 at once, the other fleet's 4 when they conform."""
    one = {"MIN_VMS": "4", "WARM_VMS": "0", "MAX_VMS": "4"}
    with deployed_fleet(aws, env=one) as a:
        with deployed_fleet(aws, emulator=a.emulator, fleet="otra", env={**one, "BUDGET_TABLE": a.env["BUDGET_TABLE"]}) as b:
            first = a.reconciler(monkeypatch)
            skewed = b.reconciler(monkeypatch)
            skewed.clock = lambda: a.clock.now() + skew
            for r in (first, skewed):
                dynamodb_dates_on(r, a.clock)
            for r in (first, skewed):
                assert r.begin_tick(120, 50)
                r._demand_from_ledger()
            before = a.emulator.calls.get("RunMicrovm", 0)
            for r in (first, skewed):
                r.step()
            at_once = a.emulator.calls.get("RunMicrovm", 0) - before
            assert a.emulator.throttled.get("RunMicrovm", 0) == 0
            assert at_once <= 5, at_once  # the documented burst (the budget's own is 4)
            for r in (first, skewed):
                r.end_tick()


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_an_overlapping_invocation_with_a_skewed_clock_weighs_the_holders_end_on_the_shared_clock(aws, monkeypatch, skew) -> None:
    """The holder's tick ends in 20 s. A cold newcomer whose clock was 30 s behind read that end as
    50 s away: too late to wait for, it skipped, and the fleet was uncovered from the holder's end
    to the next schedule (40 s); 30 s ahead, it read the end as past and took a live holder over.
    Ends are now written and weighed on the shared clock (learned from the lease read itself):
    it waits the 20 s and ticks, in both cases."""
    from contextlib import redirect_stdout

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0"}) as fleet:
        holder = fleet.reconciler(monkeypatch)
        assert holder.begin_tick(120, 20)
        with redirect_stdout(fleet._stdout):  # its execution environment's stdout, as invoke's
            newcomer = fleet.reconciler(monkeypatch)
        dynamodb_dates_on(newcomer, fleet.clock)
        newcomer.clock = lambda: fleet.clock.now() + skew
        slept: list[float] = []
        newcomer.sleep = lambda s: (slept.append(s), fleet.clock.advance(s))[1]
        fleet._environment, fleet._built_env = newcomer, (dict(fleet.env), True)
        run = fleet.invoke(monkeypatch)
        assert not run.events("tick_skipped") and not run.events("tick_takeover"), run.result
        (waiting,) = run.events("tick_waiting")
        assert 19 <= waiting["wait"] <= 21.5 and slept[0] == waiting["wait"]
        assert "skipped" not in run.result


def test_a_retried_token_throttled_for_minutes_stays_in_doubt_and_returns_the_first_vm(aws, monkeypatch) -> None:
    """A tick dies right after its RunMicrovm made a VM; then every RunMicrovm is a 429 for ten
    minutes (a throttling storm, the service's own limit). A 429 proves nothing about the token:
    the slot stays in doubt (counted, never dead-lettered for the rate's fault), every retry is the
    same token, and once the storm ends that token returns the first VM: one VM, no stray."""
    from .support import kill_a_tick_after

    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        kill_a_tick_after(fleet, monkeypatch, 2)  # ListMicrovms, RunMicrovm: killed before the answer is saved
        (lost,) = fleet.ours()
        fleet.clock.advance(60)
        fleet.emulator.set_rate_limit("RunMicrovm", 1 / 600, 1, surge=0)
        try:  # the one token of the storm's bucket: taken by a client of the test
            fleet.emulator.client().run_microvm(imageIdentifier="arn:aws:lambda:us-east-1:123456789012:microvm-image:nope")
        except Exception:
            pass
        fleet.every_minute(monkeypatch, 10, cold=True)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm" and (r.client_token or "").startswith("rz1-")]
        assert len(runs) >= 2 and {r.status for r in runs[1:]} == {429}
        assert len({r.client_token for r in runs}) == 1
        assert not fleet.dead_letters()
        slot = fleet.ledger_slots()["base-0"]
        assert slot["in_doubt_since"] is not None and slot["phase"] != "dead"
        assert [vm["microvmId"] for vm in fleet.ours()] == [lost["microvmId"]]
        fleet.emulator.remove_rate_limit("RunMicrovm")
        fleet.every_minute(monkeypatch, 12)  # past the 429s' retryAfter (at most 600 s)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm" and (r.client_token or "").startswith("rz1-")]
        assert len({r.client_token for r in runs}) == 1 and runs[-1].status == 200
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == lost["microvmId"]
        assert [vm["microvmId"] for vm in fleet.ours()] == [lost["microvmId"]]


@pytest.mark.parametrize("left", [0, 1, 2, 3])
def test_a_tick_killed_after_reserving_and_lists_that_lag_make_no_duplicate(aws, monkeypatch, left) -> None:
    """A tick reserves the ledger's due runs before the first list. A tick killed after that
    reservation (left 0: before its list), after its list (1), or between its two runs (2, 3:
    the answer of the last one never written down), then ListMicrovms that omit every VM younger
    than 3 minutes: the next ticks never start a second VM for a slot nor more than max_vms."""

    from .harness import list_lag
    from .support import kill_a_tick_after

    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        kill_a_tick_after(fleet, monkeypatch, left)
        list_lag(fleet, 180)
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 6, cold=True)
        made = [vm for vm in fleet.emulator.microvms() if (vm["clientToken"] or "").startswith("rz1-")]
        assert len(made) == 2, [(vm["microvmId"], vm["clientToken"], vm["state"]) for vm in made]
        assert {vm["state"] for vm in made} == {"RUNNING"}
        held = sorted(s["microvm_id"] for s in fleet.ledger_slots().values())
        assert held == sorted(vm["microvmId"] for vm in made)


@pytest.mark.parametrize("skew", [0.0, 1.0])
def test_two_processes_with_mixed_asks_share_the_rate_and_neither_starves(aws, skew) -> None:
    """Two reconcilers' processes on one DynamoDB bucket (each with its own guess of idle or busy),
    one of them with a clock ``skew`` off (what can be left after both learned the shared clock
    from answers dated in whole seconds), asks of 1-4 tokens with a 2 s horizon from 12 askers in
    a shuffled order (each process alone saturates the bucket): no asker starves (each served at
    least twice and at least half the mean in 15 s) and the calls stay within burst + rate x
    (window + |skew|) in every window. (15 s of asks is about 1,500 calls to moto's DynamoDB.)
    Each asker says who it is (``asker``): the first refused while the place in line is free
    reserves NEXT_IN_LINE_BONUS_SECONDS (2 s) further until granted. Without it the process ahead
    takes every refill: 0-1 grants each for the other's askers in 15 s at 1 s of skew, and at
    0.1 s too. With it, grants of the 12 askers (measured): skew 0: 2-4 (39 in all), 0.1: 3-4, 0.5: 2-4, 1.0: 2-4 (37), 1.5:
    2-4 (35), 1.9: 2-4 (36); 2.5 s, more than the bonus, starves the process behind again (the
    skew left after learning the service's clock is under a second)."""
    import random
    import uuid
    from collections import Counter

    shape = {"RunMicrovm": (4.75, 4)}
    ddb = aws_client("dynamodb", aws)
    table = f"budget-{uuid.uuid4().hex[:8]}"
    DynamoDBBudget.create_table(ddb, table)
    processes = [DynamoDBBudget(ddb, table, shape), DynamoDBBudget(ddb, table, shape)]
    askers = [(f"p{i % 2}-{i}", i % 2, 1 + i % 4) for i in range(12)]
    start = 1_790_000_000.0
    busy_until = {name: start for name, _, _ in askers}
    served: Counter = Counter()
    uses: list[tuple[float, int]] = []
    rng = random.Random(11)
    t = start
    while t < start + 15:
        rng.shuffle(askers)
        for name, process, cost in askers:
            if busy_until[name] > t:
                continue
            offset = skew if process == 1 else 0.0
            decision = processes[process].acquire("RunMicrovm", t + offset, cost=cost, horizon=2.0, asker=name)
            if isinstance(decision, Granted):
                at = t + decision.wait_seconds  # used when its own clock says: true time
                uses.append((at, cost))
                served[name] += 1
                busy_until[name] = at + 0.01
        t = round(t + 0.1, 6)
    grants = [served[name] for name, _, _ in askers]
    assert min(grants) >= max(2, sum(grants) / len(grants) / 2), served
    uses.sort()
    for i, (at, _) in enumerate(uses):
        for window in (0.5, 1.0, 5.0, 20.0):
            within = sum(c for u, c in uses[i:] if u < at + window - 1e-6)
            assert within <= 4 + 4.75 * (window + abs(skew)) + 1e-6, (at, window, within)
