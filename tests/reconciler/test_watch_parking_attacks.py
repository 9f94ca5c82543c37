"""Attacks on the watch of a parked slot's VM from its suspend's acceptance (``core.watched_vms``,
``core.watch_news``, ``core.parked_by_watch``; docs/reconciler.md, "Refilling a parked slot a
client took"): a client's take of the refill at every moment around its suspend, a suspend that
ends the VM, a client that ends it, lists that lag the watch's reads, a tick that loses its lease
before the watch writes, a watch bucket that runs dry, ``warm_vms`` lowered while a slot parks,
and random clients. Through ``index.handler`` (harness.py) with the watch on (5 s).

Each scenario holds the same invariants, from the emulator's request log and VMs (ground truth):
the reconciler never suspends or ends a VM after a client resumed or ended it; no slot generation
has two live VMs and no VM is in two slots; never more of our VMs alive than ``max_vms``; no step
fails; and once the clients stop, the parked slots are full again (as ``max_vms`` leaves room)."""

from __future__ import annotations

import random
from typing import Any, Callable, Optional

import pytest

from .harness import RECONCILER_CALLER, act_during_sleeps, deployed_fleet, deploy_fleet_state, list_lag, peak_live
from .support import assert_no_duplicates

# What the reconciler decides over ticks: the stores in memory (harness.py), but where a test says.
pytestmark = pytest.mark.stores("memory")

ENV = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "5", "WATCH_SECONDS": "5"}

Timed = list[tuple[float, Callable[[], None]]]


class Clients:
    """The product's clients, and what the reconciler did to their VMs after they acted."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.taken: dict[str, float] = {}  # VM id: when a client resumed or ended it
        self.violations: list[str] = []
        self.on: list[Callable[[Any], None]] = []  # called after every request
        fleet.emulator.subscribe(self._request)

    def _request(self, r: Any) -> None:
        if r.caller == "client" and r.operation in ("ResumeMicrovm", "TerminateMicrovm") and r.status == 200:
            self.taken.setdefault(r.microvm_id, r.time)
        if (r.caller == RECONCILER_CALLER and r.operation in ("SuspendMicrovm", "TerminateMicrovm")
                and r.microvm_id in self.taken):
            self.violations.append(f"{r.operation} of {r.microvm_id} at {r.time}, a client's since {self.taken[r.microvm_id]}")
        for hook in list(self.on):
            hook(r)

    def take(self, vm_id: str, timed: Optional[Timed] = None) -> None:
        """ResumeMicrovm; a VM still SUSPENDING is asked again 0.1 s later (``timed``), as a client
        retries a ConflictException."""
        try:
            self.fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=vm_id)
        except Exception as exc:  # noqa: BLE001 - the service's answer to a client
            if timed is None or "SUSPENDING" not in str(exc):
                raise
            timed.append((self.fleet.clock.now() + 0.1, lambda: self.take(vm_id, timed)))

    def end(self, vm_id: str) -> None:
        self.fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=vm_id)

    def after_refill_suspend(self, parked: str, action: Callable[[Any], None]) -> None:
        """``action(record)`` once, after the reconciler's first accepted SuspendMicrovm of a VM
        other than ``parked`` (the refill's)."""
        done: list[Any] = []

        def hook(r: Any) -> None:
            if (not done and r.caller == RECONCILER_CALLER and r.operation == "SuspendMicrovm" and r.status == 200
                    and r.microvm_id != parked):
                done.append(r)
                action(r)

        self.on.append(hook)


def _parked(fleet: Any) -> list[dict[str, Any]]:
    return [vm for vm in fleet.ours() if vm["state"] == "SUSPENDED" and not vm.get("idleSuspended")]


def _holds(fleet: Any, clients: Clients, invocations: list[Any], max_vms: int, warm: int) -> None:
    """The invariants (the module's docstring)."""
    assert not clients.violations, clients.violations
    assert_no_duplicates(fleet)
    assert peak_live(fleet, mine=True) <= max_vms
    for invocation in invocations:
        assert not invocation.result.get("step_failures") and not invocation.events("step_failed"), invocation.result
    parked = [vm for vm in _parked(fleet) if vm["microvmId"] not in clients.taken]
    others = len(fleet.ours()) - len(parked)
    assert len(parked) == min(warm, max_vms - others), (parked, others)


def _take_then(aws: Any, monkeypatch: Any, on_refill_suspend: Optional[Callable[..., None]] = None, *,
               env: Optional[dict[str, str]] = None, lag: Optional[float] = None,
               before: Optional[Callable[..., None]] = None, **emulator: Any) -> tuple[Any, Clients, list[Any]]:
    """Two minutes to a parked slot; a client takes it 15 s into the next tick, the refill runs and
    is suspended, and ``on_refill_suspend(fleet, clients, timed, record)`` acts from that accepted
    suspend on; four more scheduled ticks. Returns the fleet, its clients and the invocations."""
    with deployed_fleet(aws, env={**ENV, **(env or {})}, pending_seconds=2, **emulator) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (first,) = _parked(fleet)
        clients = Clients(fleet)
        start = fleet.clock.now()
        timed: Timed = [(start + 15, lambda: clients.take(first["microvmId"]))]
        if lag is not None:
            list_lag(fleet, lag)
        if on_refill_suspend is not None:
            clients.after_refill_suspend(first["microvmId"], lambda r: on_refill_suspend(fleet, clients, timed, r))
        if before is not None:
            before(fleet, clients, timed)
        act_during_sleeps(fleet, timed)
        invocations = [fleet.invoke(monkeypatch)]
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        invocations += fleet.every_minute(monkeypatch, 4)
        _holds(fleet, clients, invocations, int(fleet.env["MAX_VMS"]), int(fleet.env["WARM_VMS"]))
        return fleet, clients, invocations


def _take_refill(delay: float) -> Callable[..., None]:
    def act(fleet: Any, clients: Clients, timed: Timed, r: Any) -> None:
        timed.append((r.time + delay, lambda: clients.take(r.microvm_id, timed)))
    return act


@pytest.mark.parametrize("delay", [0.0, 1.3, 2.0, 5.5, 31.0])
@pytest.mark.parametrize("max_vms", [3, 5])
def test_a_take_of_the_refill_at_any_moment_after_its_suspend_is_accepted(aws, monkeypatch, delay, max_vms) -> None:
    """The refill of a take is taken too, ``delay`` after the service accepted its suspend: while
    SUSPENDING (the client retries until it lands), just after it lands (a watch read RUNNING within
    the park grace is no news), after the watch parked it, past the grace. Never suspended or ended
    once taken, no duplicate, and refilled again, or waiting for room at ``max_vms`` 3 (the base VM
    and two clients' sessions)."""
    _, clients, _ = _take_then(aws, monkeypatch, _take_refill(delay), env={"MAX_VMS": str(max_vms)})
    assert len(clients.taken) == 2


def test_a_take_right_after_the_watch_parks_the_refill_is_the_next_watchs_news(aws, monkeypatch) -> None:
    """A client resumes the refill the moment the watch's GetMicrovm read it SUSPENDED (so the tick
    parked the slot, ``vm_parked``, on a read older than the take): the next watch (5 s) reads it
    RUNNING, a take, and the slot runs its next VM at once."""
    taken_at: list[float] = []

    def before(fleet: Any, clients: Clients, timed: Timed) -> None:
        refill: list[str] = []

        def hook(r: Any) -> None:
            if r.caller != RECONCILER_CALLER:
                return
            if r.operation == "SuspendMicrovm" and r.status == 200 and not refill and clients.taken:
                refill.append(r.microvm_id)
            elif r.operation == "GetMicrovm" and refill and not taken_at and r.microvm_id == refill[0]:
                (vm,) = [v for v in fleet.emulator.microvms() if v["microvmId"] == r.microvm_id]
                if vm["state"] == "SUSPENDED":
                    clients.take(r.microvm_id)
                    taken_at.append(r.time)

        clients.on.append(hook)

    fleet, clients, invocations = _take_then(aws, monkeypatch, before=before)
    assert taken_at and len(clients.taken) == 2
    assert len(invocations[0].events("vm_parked")) == 2
    runs = [r.time for r in fleet.emulator.requests
            if r.operation == "RunMicrovm" and r.caller == RECONCILER_CALLER and r.time >= taken_at[0]]
    assert runs and runs[0] - taken_at[0] <= 5.0 + 1e-6, (taken_at, runs)


def test_a_suspend_whose_hook_fails_ends_the_parking_vm_and_the_slot_runs_another(aws, monkeypatch) -> None:
    """The refill's ``/suspend`` hook answers 500 after the service accepted the suspend: the VM
    ends. The watch reads it ending (news), and the slot runs and parks a new VM."""
    def before(fleet: Any, clients: Clients, timed: Timed) -> None:
        fleet.emulator.inject("SuspendMicrovm", "suspend_hook_failure", times=1, caller=RECONCILER_CALLER)

    _, _, invocations = _take_then(aws, monkeypatch, before=before)
    assert invocations[0].events("vm_parked")


@pytest.mark.parametrize("delay", [0.5, 3.0])
def test_a_client_that_ends_the_parking_refill_gets_no_call_on_it(aws, monkeypatch, delay) -> None:
    """A client ends the refill ``delay`` after its suspend was accepted (SUSPENDING, or parked
    by the watch): the reconciler sends it nothing more and parks another VM."""
    def act(fleet: Any, clients: Clients, timed: Timed, r: Any) -> None:
        timed.append((r.time + delay, lambda: clients.end(r.microvm_id)))

    _take_then(aws, monkeypatch, act)


@pytest.mark.parametrize(("lag", "delay"), [(8.0, 1.2), (20.0, 4.0), (45.0, 12.0)])
def test_lists_that_lag_the_watchs_reads_make_no_duplicate(aws, monkeypatch, lag, delay) -> None:
    """Lists omit VMs younger than ``lag``: the fresh list a take of the refill wakes does not
    show the refill the watch read, nor the VM the plan runs. No duplicate, no call on the taken
    VM, and the slot is parked again."""
    _, clients, _ = _take_then(aws, monkeypatch, _take_refill(delay), lag=lag)
    assert len(clients.taken) == 2


@pytest.mark.stores("dynamodb")
@pytest.mark.parametrize("after", [1.0, 4.5])
def test_a_tick_that_lost_its_lease_before_the_watch_parks_writes_nothing(aws, monkeypatch, after) -> None:
    """A newer tick takes the lease ``after`` the refill's suspend was accepted. 1 s: before the
    watch reads it SUSPENDED, whose write of the parked slot is then refused by the fence
    (``lease_lost``; the next tick parks it from its list). 4.5 s: after it. On DynamoDB's fence."""
    from lambdas.reconciler.ledger import DynamoDBLedger

    def act(fleet: Any, clients: Clients, timed: Timed, r: Any) -> None:
        def newer() -> None:
            now = fleet.clock.now()
            DynamoDBLedger(fleet.ddb, fleet.env["LEDGER_TABLE"]).acquire_tick(fleet.fleet, "newer", now, 120.0,
                                                                              tick_until=now + 1)
        timed.append((r.time + after, newer))

    _, _, invocations = _take_then(aws, monkeypatch, act)
    assert invocations[0].result.get("lease_lost") is (True if after < 2 else None), invocations[0].result
    assert len(invocations[0].events("vm_parked") + invocations[1].events("vm_parked")) == 1  # the refill's


@pytest.mark.parametrize("delay", [1.2, 6.0])
def test_a_watch_bucket_that_grants_one_look_in_three_keeps_every_invariant(aws, monkeypatch, delay) -> None:
    """The shared ``GetMicrovm:watch`` bucket grants one token in three: the watch stops where it
    is, keeping what it read; the refill is taken ``delay`` after its suspend. No duplicate, no
    call on the taken VM, parked again."""
    from lambdas.reconciler.budget import WATCH_OPERATION, Deferral

    def before(fleet: Any, clients: Clients, timed: Timed) -> None:
        budget = fleet._environment.budget
        original, asks = budget.acquire, [0]

        def acquire(operation: str, *args: Any, **kwargs: Any) -> Any:
            if operation == WATCH_OPERATION:
                asks[0] += 1
                if asks[0] % 3 != 1:
                    return Deferral(operation, 1.0, "budget_empty")
            return original(operation, *args, **kwargs)

        monkeypatch.setattr(budget, "acquire", acquire)

    _, clients, _ = _take_then(aws, monkeypatch, _take_refill(delay), before=before)
    assert len(clients.taken) == 2


@pytest.mark.parametrize("take_after", [None, 2.0])
def test_warm_vms_lowered_while_a_slot_parks_across_ticks(aws, monkeypatch, take_after) -> None:
    """The refill's suspend takes 20 s and the next tick (``warm_vms`` 0 now) starts with its slot
    PARKING; the watch parks it when it lands, and a client takes it ``take_after`` s later (or
    nobody does: the drained slot's VM is ended). Never ended once taken, no parked VM left."""
    with deployed_fleet(aws, env=ENV, pending_seconds=2, suspending_seconds=20) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (first,) = _parked(fleet)
        clients = Clients(fleet)
        refill: list[Any] = []
        clients.after_refill_suspend(first["microvmId"], refill.append)
        start = fleet.clock.now()
        act_during_sleeps(fleet, [(start + 36, lambda: clients.take(first["microvmId"]))])
        invocations = [fleet.invoke(monkeypatch)]
        assert refill
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        fleet.env.update(WARM_VMS="0")  # the deploy: a new execution environment, a new recipe
        deploy_fleet_state(fleet)
        fleet._environment, fleet._built_env = fleet.reconciler(monkeypatch), (dict(fleet.env), True)
        (vm,) = [v for v in fleet.emulator.microvms() if v["microvmId"] == refill[0].microvm_id]
        assert vm["state"] == "SUSPENDING"
        timed: Timed = []
        if take_after is not None:
            timed.append((refill[0].time + 20 + take_after, lambda: clients.take(refill[0].microvm_id, timed)))
        act_during_sleeps(fleet, timed)
        invocations.append(fleet.invoke(monkeypatch))
        assert len(clients.taken) == (1 if take_after is None else 2)
        fleet.clock.advance(max(0.0, start + 120 - fleet.clock.now()))
        invocations += fleet.every_minute(monkeypatch, 3)
        _holds(fleet, clients, invocations, 5, 0)
        assert (refill[0].microvm_id in {v["microvmId"] for v in fleet.live()}) is (take_after is not None)


@pytest.mark.parametrize(("seed", "max_vms"), [(21, 4), (22, 12), (23, 4), (24, 12)])
def test_random_clients_never_lose_a_session_to_the_watch(aws, monkeypatch, seed, max_vms) -> None:
    """Six minutes of clients that take (80%) or end (20%) a random SUSPENDING or SUSPENDED VM of
    the fleet at random moments (some right after a suspend or a watch's read), with lagging lists
    and slow suspends drawn from ``seed``; then three quiet minutes. Every invariant holds."""
    rng = random.Random(seed)
    env = {**ENV, "WARM_VMS": "2", "MAX_VMS": str(max_vms)}
    with deployed_fleet(aws, env=env, pending_seconds=2, seed=seed, suspending_seconds=rng.choice([0.5, 1.4, 4.0])) as fleet:
        fleet.every_minute(monkeypatch, 2)
        clients = Clients(fleet)
        if rng.random() < 0.6:
            list_lag(fleet, rng.choice([3.0, 8.0, 15.0]))
        timed: Timed = []
        act_during_sleeps(fleet, timed)

        def act() -> None:
            choices = [vm["microvmId"] for vm in fleet.ours()
                       if vm["microvmId"] not in clients.taken and vm["state"] in ("SUSPENDED", "SUSPENDING")]
            if choices:
                vm_id = rng.choice(choices)
                if rng.random() < 0.8:
                    clients.take(vm_id, timed)
                else:
                    clients.end(vm_id)

        def soon(r: Any) -> None:
            if r.caller == RECONCILER_CALLER and r.operation in ("SuspendMicrovm", "GetMicrovm") and rng.random() < 0.25:
                timed.append((r.time + rng.choice([0.0, 0.3, 1.0, 1.5, 2.5, 4.0]), act))

        clients.on.append(soon)
        invocations = []
        for _ in range(6):
            start = fleet.clock.now()
            timed.extend((start + rng.uniform(0, 58), act) for _ in range(rng.randint(0, 2)))
            invocations.append(fleet.invoke(monkeypatch))
            fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
            timed.clear()
        clients.on.clear()
        invocations += fleet.every_minute(monkeypatch, 3)
        assert clients.taken
        _holds(fleet, clients, invocations, max_vms, 2)


def test_a_parking_vm_handed_to_a_base_slot_by_a_step_that_then_fails_stays_the_base_slots(aws, monkeypatch) -> None:
    """The refill's suspend takes 50 s (its slot PARKING, watched, into the next tick); a client
    ends the base VM and no VM can be made (InsufficientCapacity): the next tick hands the parking
    VM to the base slot (``vm_handed_over``), and the ledger's next write after the handover fails
    (a step failure, retried). The watch's slots are the last plan's: the warm slot is never
    written back over the handover, the VM stays the base slot's alone, and is resumed for it."""
    from botocore.exceptions import ClientError

    with deployed_fleet(aws, env={**ENV, "MAX_VMS": "3"}, pending_seconds=2, suspending_seconds=50) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (first,) = _parked(fleet)
        (base,) = [vm for vm in fleet.ours() if vm["state"] == "RUNNING"]
        clients = Clients(fleet)
        start = fleet.clock.now()
        timed: Timed = [(start + 10, lambda: clients.take(first["microvmId"]))]

        def base_ends() -> None:
            fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None, caller=RECONCILER_CALLER)
            clients.end(base["microvmId"])

        refill: list[str] = []
        clients.after_refill_suspend(first["microvmId"], lambda r: (refill.append(r.microvm_id),
                                                                    timed.append((r.time + 1, base_ends))))
        act_during_sleeps(fleet, timed)
        ledger, failed = fleet.memory[0], []
        write = ledger.write

        def failing_after_the_handover(fleet_name: str, fence: Any, puts: Any = (), **kwargs: Any) -> None:
            puts = list(puts)
            if failed == [False]:
                failed[0] = True
                raise ClientError({"Error": {"Code": "InternalServerError", "Message": "injected"},
                                   "ResponseMetadata": {"HTTPStatusCode": 500}}, "TransactWriteItems")
            write(fleet_name, fence, puts=puts, **kwargs)
            if not failed and any(s.handover_from for s in puts):
                failed.append(False)

        monkeypatch.setattr(ledger, "write", failing_after_the_handover)
        invocations = [fleet.invoke(monkeypatch)]
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        invocations += fleet.every_minute(monkeypatch, 3)
        assert failed == [True] and refill
        handed = [e for i in invocations for e in i.events("vm_handed_over")]
        assert [(e["slot"], e["microvm_id"]) for e in handed] == [("base-0", refill[0])], handed
        assert invocations[1].result.get("step_failures") == 1, invocations[1].result
        assert not clients.violations, clients.violations
        assert_no_duplicates(fleet)
        holders = [k for k, s in fleet.ledger_slots().items() if refill[0] in (s["microvm_id"], s["retiring_id"])]
        assert holders == ["base-0"], holders
        (vm,) = [v for v in fleet.emulator.microvms() if v["microvmId"] == refill[0]]
        assert vm["state"] == "RUNNING"
