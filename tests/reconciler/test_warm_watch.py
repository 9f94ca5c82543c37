"""The parked-slot watch: while a tick lives, its parked slots' VMs are looked at every
``WATCH_SECONDS`` (GetMicrovm, from the budget's own ``GetMicrovm:watch`` bucket), so a slot a
client takes is refilled within seconds, not at the next scheduled tick. Through ``index.handler``
with its synthesized environment, the emulator over HTTP and moto; every time from the emulator's
records (ground truth)."""

from __future__ import annotations

from typing import Any, Optional

from .harness import act_during_sleep, act_during_sleeps, deployed_fleet

SPEC = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}


def _parked(fleet: Any) -> list[dict[str, Any]]:
    return [vm for vm in fleet.ours() if vm["state"] == "SUSPENDED" and not vm.get("idleSuspended")]


def _refilled_at(fleet: Any, after: float, taken: str) -> Optional[float]:
    """When a new VM of ours (not the taken one) was first SUSPENDED after ``after``."""
    times = [at for vm in fleet.emulator.microvms_ever() if vm["microvmId"] != taken and vm["imageArn"] == fleet.image
             for at, state, _ in vm["history"] if state == "SUSPENDED" and at > after]
    return min(times) if times else None


def _take_at(fleet: Any, at: float, parked: dict[str, Any]) -> list[float]:
    """A client resumes ``parked`` while the tick sleeps past ``at``: the list gets when it did."""
    took: list[float] = []

    def take() -> None:
        fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=parked["microvmId"])
        took.append(fleet.clock.now())

    act_during_sleep(fleet, at, take)
    return took


def _tick_with_a_take(fleet: Any, monkeypatch: Any) -> tuple[dict[str, Any], float, list[float], Any]:
    """The fleet filled (two ticks), then a tick during which a client takes its parked VM 20 s
    in: the VM taken, the tick's start, when it was taken, and the tick's invocation."""
    fleet.every_minute(monkeypatch, 2)
    (parked,) = _parked(fleet)
    start = fleet.clock.now()
    took = _take_at(fleet, start + 20, parked)
    invocation = fleet.invoke(monkeypatch)
    assert took, "the tick ended before the take"
    return parked, start, took, invocation


def test_a_take_during_a_tick_is_refilled_within_seconds(aws, monkeypatch) -> None:
    """A client resumes the parked VM 20 s into a tick: with the watch (5 s) a new VM is parked
    within 12 s of the take (the watch's period, a fresh list, PENDING, the warming, SUSPENDING),
    in the same tick; the watch goes on with the new VM, and its read of it SUSPENDED parks the
    slot in the tick (``vm_parked``)."""
    with deployed_fleet(aws, env={**SPEC, "WATCH_SECONDS": "5"}, pending_seconds=2) as fleet:
        parked, _, took, invocation = _tick_with_a_take(fleet, monkeypatch)
        fleet.clock.advance(5)  # the refill's suspend lands
        refilled = _refilled_at(fleet, took[0], parked["microvmId"])
        assert refilled is not None and refilled - took[0] <= 12.0, (took, refilled)
        assert invocation.calls.get("RunMicrovm") == 1 and invocation.calls.get("SuspendMicrovm") == 1
        assert 9 <= invocation.calls.get("GetMicrovm", 0) <= 12, invocation.calls  # one per 5 s, 57 s of the minute
        (refill,) = [vm for vm in _parked(fleet) if vm["microvmId"] != parked["microvmId"]]
        assert [e["microvm_id"] for e in invocation.events("vm_parked")] == [refill["microvmId"]]


def test_a_take_of_the_refill_in_the_same_tick_is_refilled_within_seconds(aws, monkeypatch) -> None:
    """The refill of a take is watched from its park on: a client that takes it 20 s after the
    first take, in the same tick, is refilled within 12 s as well (not at the next tick's list,
    nor after the park grace of 30 s its unwatched suspend would have waited for). ``max_vms`` 4:
    room for the base VM, the two taken and the refill."""
    with deployed_fleet(aws, env={**SPEC, "MAX_VMS": "4", "WATCH_SECONDS": "5"}, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (parked,) = _parked(fleet)
        start = fleet.clock.now()
        client = fleet.emulator.direct_client(caller="client")
        taken: list[str] = []

        def take() -> None:
            (vm,) = _parked(fleet)
            client.resume_microvm(microvmIdentifier=vm["microvmId"])
            taken.append(vm["microvmId"])

        took = act_during_sleeps(fleet, [(start + 15, take), (start + 35, take)])
        invocation = fleet.invoke(monkeypatch)
        assert len(took) == 2 and taken[0] == parked["microvmId"], (took, taken)
        fleet.clock.advance(5)
        refilled = _refilled_at(fleet, took[1], taken[1])
        assert refilled is not None and refilled - took[1] <= 12.0, (took, refilled)
        assert invocation.calls.get("RunMicrovm") == 2, invocation.calls


def test_without_the_watch_a_take_waits_for_the_next_ticks_list(aws, monkeypatch) -> None:
    """``WATCH_SECONDS=0``: a tick at rest lists once and ends; a take between ticks is refilled
    by the next tick's list."""
    with deployed_fleet(aws, env={**SPEC, "WATCH_SECONDS": "0"}, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (parked,) = _parked(fleet)
        start = fleet.clock.now()
        assert fleet.invoke(monkeypatch).calls == {"ListMicrovms": 1}
        fleet.clock.advance(max(0.0, start + 20 - fleet.clock.now()))
        fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=parked["microvmId"])
        took = fleet.clock.now()
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        assert _refilled_at(fleet, took, parked["microvmId"]) is None
        fleet.invoke(monkeypatch)
        fleet.clock.advance(5)
        refilled = _refilled_at(fleet, took, parked["microvmId"])
        assert refilled is not None and refilled - took >= 40  # a schedule period, not seconds


def test_the_watch_takes_tokens_from_its_own_bucket_and_skips_without_one(aws, monkeypatch) -> None:
    """The watch's GetMicrovm come from the shared budget's ``GetMicrovm:watch`` bucket (30 a
    second account-wide): with no token the watch is skipped (no list instead, no other GetMicrovm),
    and the next tick's list still sees the take."""
    from lambdas.reconciler.budget import WATCH_BUDGET, WATCH_OPERATION

    assert WATCH_BUDGET == (30.0, 30.0)
    with deployed_fleet(aws, env={**SPEC, "WATCH_SECONDS": "5"}, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (parked,) = _parked(fleet)
        reconciler = fleet._environment
        original = reconciler.budget.acquire

        def acquire(operation: str, *args: Any, **kwargs: Any) -> Any:
            if operation == WATCH_OPERATION:
                from lambdas.reconciler.budget import Deferral

                return Deferral(operation, 1.0, "budget_empty")
            return original(operation, *args, **kwargs)

        monkeypatch.setattr(reconciler.budget, "acquire", acquire)
        start = fleet.clock.now()
        act_during_sleep(fleet, start + 20, lambda: fleet.emulator.direct_client(caller="client").resume_microvm(
            microvmIdentifier=parked["microvmId"]))
        invocation = fleet.invoke(monkeypatch)
        assert "GetMicrovm" not in invocation.calls and invocation.calls.get("ListMicrovms") == 1, invocation.calls
        assert "RunMicrovm" not in invocation.calls  # the take is not seen in this tick
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        fleet.invoke(monkeypatch)
        fleet.clock.advance(5)
        assert _refilled_at(fleet, start + 20, parked["microvmId"]) is not None


def test_a_take_after_tick_seconds_is_seen_by_the_watch_in_the_overtime(aws, monkeypatch) -> None:
    """A client resumes the parked VM 52 s into the minute, after the tick's 50 s: the watch goes
    on into the invocation's overtime (its last look 2 s before the hard bound, 57 s of the 65 s
    function), sees the take and runs the refill in that tick (parked there, or by the next
    scheduled tick), 12 s after the take at most (the next tick's list alone would see it
    8 s later)."""
    with deployed_fleet(aws, env={**SPEC, "WATCH_SECONDS": "5"}, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        (parked,) = _parked(fleet)
        start = fleet.clock.now()
        took = _take_at(fleet, start + 52, parked)
        invocation = fleet.invoke(monkeypatch)
        assert took and took[0] >= start + 50, took
        assert invocation.calls.get("RunMicrovm") == 1, invocation.calls  # run in the overtime
        fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        fleet.invoke(monkeypatch)
        refilled = _refilled_at(fleet, took[0], parked["microvmId"])
        assert refilled is not None and refilled - took[0] <= 12.0, (took, refilled)
