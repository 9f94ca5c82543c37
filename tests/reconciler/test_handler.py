"""The deployed entry point, end to end: ``index.handler`` with the example fleet's synthesized
environment, Powertools telemetry (or its fallback) and ``index.build()``'s clients, against the
MicroVMs emulator and moto (DynamoDB, SQS). Every assertion comes from the emulator (calls, VMs,
their histories), moto (ledger items, dead letters) or stdout (log lines, EMF records): never
from the reconciler's own counters.

Each scenario of issue #11 is a test here, and so is each error path of issue #17.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from lambdas.reconciler import core, index
from lambdas.reconciler.ledger import FencedOut
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

from ..moto_server import untraced_requests
from .harness import RECONCILER_CALLER, deployed_fleet, list_lag, serving, synthesized_environment
from .support import assert_no_duplicates

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")



def assert_product_requests(fleet, requests) -> None:
    """Each request is one the product's client would send for the example (rayito 0.17)."""
    from rayito._payload import access_token_sha256

    from ..moto_server import client

    token = client("secretsmanager", fleet.aws).get_secret_value(SecretId=fleet.env["ACCESS_TOKEN_SECRET"])["SecretString"]
    for request in requests:
        payload = json.loads(request["runHookPayload"])
        assert payload["token_sha256"] == access_token_sha256(token) and token not in request["runHookPayload"]
        assert payload["metadata"] == {"rayito.agent.deployment": fleet.fleet, "rayito.agent.port": "8088"}
        assert payload["network"] == {"enforce": True} and payload["user"] == "user"
        cap = request["maximumDurationInSeconds"]
        assert payload["lifecycle"] == {"timeout_s": cap - 60, "cap_s": cap, "on_timeout": "kill", "auto_resume": False}
        assert cap <= 3660  # [serve] timeout_seconds (3,600) + 60: never the 8 hours of before
        assert request["idlePolicy"] == {"maxIdleDurationSeconds": 600, "suspendedDurationSeconds": cap - 600,
                                         "autoResumeEnabled": True}
        assert request["logging"] == {"disabled": {}}
        assert request.get("imageVersion") == "1.0" and request["executionRoleArn"] == fleet.env["EXECUTION_ROLE_ARN"]


def history(fleet, vm_id: str) -> list[str]:
    return [h[1] for h in fleet.emulator._vms[vm_id].history] if vm_id in fleet.emulator._vms else []


def client_vm(fleet, token: str = "client-session-1") -> str:
    """A fleet client starts a dedicated session VM from the fleet's image."""
    return fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken=token)["microvmId"]




# --------------------------------------------------------------------------- normal operation


def test_the_synthesized_fleet_converges_and_tells(aws, monkeypatch) -> None:
    watch = dict(synthesized_environment())["WATCH_SECONDS"]  # as synthesized: the parked slot watched
    with deployed_fleet(aws, env={"WATCH_SECONDS": watch}) as fleet:
        assert fleet.env["EXECUTION_ROLE_ARN"] and fleet.env["IDLE_SECONDS"] == "600" and watch == "5"
        first = fleet.invoke(monkeypatch)
        assert first.result["fleet"] == "mi-agente" and "skipped" not in first.result
        fleet.clock.advance(60)
        second = fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
        # RunMicrovm carried what the product's client sends for the project (its run payload: the
        # fleet token's sha256, the labels clients know members by, the logical deadline; the idle
        # policy on every VM; logging off), the recipe's version, and the fleet's execution role.
        requests = {vm["microvmId"]: fleet.emulator._vms[vm["microvmId"]].request for vm in fleet.ours()}
        assert_product_requests(fleet, requests.values())
        assert len(first.events("run_requested")) == 2
        # Each VM was handed to the fleet's server right after its run (one Invoke each: the base
        # slot's to serve, the parked slot's to warm), whose answer came when the VM ran (the
        # harness's 12 s PENDING) plus the agent's start: the base VM counted only from then, and
        # the parked one was suspended once warmed, never before (no refused suspend).
        asks = fleet.server.asks
        assert sorted(a["role"] for a in asks) == ["member", "warm"] and {a["attempt"] for a in asks} == {1}
        served = {e["role"]: e for e in first.events("vm_serving") + first.events("vm_warmed")}
        assert set(served) == {"base", "warm"} and all(e["after"] >= 12 for e in served.values())
        looks = {k: v for k, v in first.calls.items() if k != "GetMicrovm"}  # the watch's looks aside
        assert looks == {"ListMicrovms": first.calls["ListMicrovms"], "RunMicrovm": 2, "SuspendMicrovm": 1}
        assert [r.status for r in fleet.emulator.requests if r.operation == "SuspendMicrovm"] == [200]
        (suspend,) = [r for r in fleet.emulator.requests if r.operation == "SuspendMicrovm"]
        warmed = next(a for a in asks if a["role"] == "warm")
        assert suspend.microvm_id == warmed["microvm_id"]
        # Units as CloudWatch gets them from the EMF Powertools prints.
        for name, unit in {"WaitTime": "Seconds", "ClaimToComplete": "Seconds", "LiveBaseVMs": "Count",
                           "RetryAmplification": "None", "StrayVMs": "Count"}.items():
            points = first.metrics(name) + second.metrics(name)
            assert points and {u for _, u in points} == {unit}, (name, points)
        # At rest: one list, and the parked VM looked at every 5 s while the 50 s tick lives and
        # on through its overtime, the last look 2 s before the invocation's hard bound (57 s of
        # the 65 s function: 59 s less a step's reserve), so a take in the rest of the minute is
        # not left to the next tick's list.
        assert second.calls == {"ListMicrovms": 1, "GetMicrovm": second.calls["GetMicrovm"]}
        assert 11 <= second.calls["GetMicrovm"] <= 12
        assert_no_duplicates(fleet)


def test_without_the_powertools_layer_it_still_ticks_and_tells(aws, monkeypatch) -> None:
    with deployed_fleet(aws) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=1)
        run = fleet.invoke(monkeypatch, powertools=False)
        assert run.events("api_error") and run.events("api_error")[0]["error_message"]
        assert {u for _, u in run.metrics("WaitTime")} == {"Seconds"}
        assert len(fleet.live()) == 2


def test_redrive_through_the_handler(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0"}) as fleet:
        crash = fleet.emulator.inject("RunMicrovm", "crash", after_seconds=30,
                                      reason="Container Stopped with Exit Code: 1", times=None)
        fleet.every_minute(monkeypatch, 6)
        assert fleet.emulator.calls["RunMicrovm"] == 3  # max_start_attempts early ends, then dead
        letters = fleet.dead_letters()
        assert [d["event"] for d in letters] == ["slot_dead_lettered"]
        assert "Exit Code: 1" in letters[0]["reason"] and letters[0]["kind"] == "crash"
        fleet.every_minute(monkeypatch, 3)
        assert fleet.emulator.calls["RunMicrovm"] == 3  # not retried forever
        fleet.emulator.remove_fault(crash)
        redriven = fleet.invoke(monkeypatch, {"action": "redrive"})
        assert redriven.result["redriven"] == ["base-0"]
        assert fleet.ledger_slots()["base-0"]["phase"] == "queued"
        fleet.every_minute(monkeypatch, 1)
        assert len(fleet.live(("PENDING", "RUNNING"))) == 1


def test_a_newer_invocation_takes_the_lease_and_the_older_tick_stops(aws, monkeypatch) -> None:
    """A duplicate delivery, or a killed tick's lease: the newest invocation holds the fleet; the
    older one's next write is refused by the fence, before it calls anything else."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        older = fleet.reconciler(monkeypatch)
        assert older.begin_tick(120, 50)
        assert fleet.invoke(monkeypatch, {"action": "redrive"}).result["redriven"] == []
        newer = fleet.invoke(monkeypatch)
        assert "skipped" not in newer.result and len(fleet.ours()) == 2
        runs = fleet.emulator.calls["RunMicrovm"]
        fleet.emulator.client().terminate_microvm(microvmIdentifier=fleet.ours()[0]["microvmId"])
        fleet.clock.advance(5)
        with pytest.raises(FencedOut):
            older.step()  # it would replace the ended VM: its write is refused
        assert fleet.emulator.calls["RunMicrovm"] == runs


def test_an_overlapping_invocation_waits_for_the_holder_to_end(aws, monkeypatch) -> None:
    """The deploy's invocation and the first scheduled one overlap: the newer waits until the
    holder's tick says it ends (taken over at once, the holder would drop the budget tokens it
    reserved), then works for the rest of its own deadline. A killed holder holds the fleet back
    no longer than that."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        older = fleet.reconciler(monkeypatch)
        start = fleet.clock.now()
        assert older.begin_tick(120, 20)  # holds the lease; its tick ends in 20 s
        run = fleet.invoke(monkeypatch)
        (waiting,) = run.events("tick_waiting")
        assert 20 <= waiting["wait"] <= 20.1
        first = min(r.time for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER)
        assert first >= start + 20
        assert "skipped" not in run.result and len(fleet.ours()) == 2
        runs = fleet.emulator.calls["RunMicrovm"]
        fleet.emulator.client().terminate_microvm(microvmIdentifier=fleet.ours()[0]["microvmId"])
        fleet.clock.advance(5)
        with pytest.raises(FencedOut):
            older.step()  # it would replace the ended VM: the newer tick holds the fence
        assert fleet.emulator.calls["RunMicrovm"] == runs
        assert_no_duplicates(fleet)


@pytest.mark.parametrize("says", [600.0, -5.0])
def test_a_holder_that_ends_too_late_or_already_is_taken_over_at_once(aws, monkeypatch, says) -> None:
    """A holder whose tick would end after this one's could (a skewed clock, a longer timeout),
    or has ended without releasing (killed): no wait, the fence stops the holder."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "1"}) as fleet:
        older = fleet.reconciler(monkeypatch)
        start = fleet.clock.now()
        older.ledger.acquire_tick(fleet.fleet, "someone", start, 120, tick_until=start + says)
        run = fleet.invoke(monkeypatch)
        assert run.events("tick_waiting") == []
        assert min(r.time for r in fleet.emulator.requests) == pytest.approx(start, abs=0.01)
        assert len(fleet.ours()) == 1


class Killed(BaseException):
    """The Lambda was killed: nothing more runs in it, not even ``finally`` blocks' writes."""


class _Killable:
    """A client or store of an execution environment killed after ``calls`` MicroVMs calls."""

    def __init__(self, target: Any, state: dict[str, int], counts: bool) -> None:
        self._target, self._state, self._counts = target, state, counts

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute) or name.startswith("_") or name == "exceptions":
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._state["left"] <= 0:
                raise Killed(name)
            if self._counts:
                self._state["left"] -= 1
            return attribute(*args, **kwargs)

        return call


def test_an_invocation_that_cannot_wait_for_a_live_holder_skips_and_the_holder_still_acts(aws, monkeypatch) -> None:
    """#11 (37 fleets, seed 3): a holder mid-tick whose recorded end is plausible but later than
    an overlapping invocation can wait for. The newcomer skips (the holder covers the fleet until
    its end) instead of taking the lease over; so when it dies after its first call, the holder
    still starts the successor of a VM that ends (taken over, the holder stopped at its next
    write and the fleet waited for the next schedule: a 20.7 s dip)."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "1"}) as fleet:
        holder = fleet.reconciler(monkeypatch)
        assert holder.begin_tick(120, 50)  # its tick ends in 50 s
        holder.step()
        (first,) = fleet.ours()
        fleet.clock.advance(3)
        newcomer = fleet.reconciler(monkeypatch)
        state = {"left": 1}
        newcomer.microvms = _Killable(newcomer.microvms, state, counts=True)
        newcomer.ledger = _Killable(newcomer.ledger, state, counts=False)
        newcomer.telemetry = _Killable(newcomer.telemetry, state, counts=False)
        index._RECONCILER = newcomer
        try:
            run = fleet.invoke(monkeypatch, cold=False, timeout=40)  # 47 s to wait for, 34 s it could spare
        except Killed:
            run = None
        assert run is not None and run.result["skipped"] == "holder_covers_fleet", run
        (skipped,) = run.events("tick_skipped")
        assert skipped["reason"] == "holder_covers_fleet" and 46 < skipped["holder_ends_in"] <= 47
        assert run.calls == {}  # no MicroVMs call: the holder's lease and tokens are untouched
        fleet.emulator.client().terminate_microvm(microvmIdentifier=first["microvmId"])
        fleet.clock.advance(5)
        runs = fleet.emulator.calls["RunMicrovm"]
        holder.step()  # the holder still holds the fence: it replaces the ended VM
        assert fleet.emulator.calls["RunMicrovm"] == runs + 1
        assert [vm["microvmId"] for vm in fleet.ours()] != [first["microvmId"]] and len(fleet.ours()) == 1
        holder.end_tick()
        assert_no_duplicates(fleet)


# --------------------------------------------------------------------------- #11.1 ownership


@pytest.mark.parametrize("fault", ["InternalServer", "InsufficientCapacity", "throttle", "quota", "lost_response"])
def test_a_client_session_is_never_touched_after_a_failed_run(aws, monkeypatch, fault) -> None:
    """#11.1: a failed RunMicrovm, then a client starts a VM from the fleet's image: it is never
    attached to the waiting slot, never suspended, never terminated."""
    options = {"memory_quota_mib": 4096} if fault == "quota" else {}
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "6"}, **options) as fleet:
        if fault == "throttle":
            fleet.emulator.set_rate_limit("RunMicrovm", 0.2, 1, surge=0)
        elif fault == "quota":
            pass  # one 4096 MiB VM fits; the next RunMicrovm is a 402
        else:
            armed = fleet.emulator.inject("RunMicrovm", fault, times=2)
        fleet.invoke(monkeypatch, timeout=10)
        if fault == "throttle":
            fleet.emulator.set_rate_limit("RunMicrovm", 5, 5)
        elif fault != "quota":
            fleet.emulator.remove_fault(armed)
        if fault == "quota":
            fleet.emulator.memory_quota_mib = 3 * 4096  # the client's VM and one more fit
        sessions = [client_vm(fleet, f"client-{i}") for i in range(2)]
        for _ in range(8):
            fleet.clock.advance(60)
            fleet.invoke(monkeypatch)
        for vm_id in sessions:
            assert set(history(fleet, vm_id)) <= {"PENDING", "RUNNING"}, history(fleet, vm_id)
        held = {s["microvm_id"] for s in fleet.ledger_slots().values()}
        assert not held & set(sessions)
        assert_no_duplicates(fleet)
        assert len(fleet.live()) <= 6


def test_a_vm_id_is_never_in_two_slots(aws, monkeypatch) -> None:
    """#11.1: one run made no VM (500 before), the next one's answer was lost (500 after)."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=1)
        fleet.emulator.inject("RunMicrovm", "lost_response", times=1)
        fleet.every_minute(monkeypatch, 4)
        assert len(fleet.ours()) == 2
        assert_no_duplicates(fleet)


def test_foreign_vms_count_toward_max_vms_but_never_fill_a_slot(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        sessions = [client_vm(fleet, f"client-{i}") for i in range(2)]
        fleet.clock.advance(5)  # listed once the service's reads catch up (foreign VMs count once seen)
        runs = fleet.every_minute(monkeypatch, 3)
        assert len(fleet.ours()) == 1 and len(fleet.live()) == 3  # max_vms holds, clients included
        assert any(e["reason"] == "max_vms_reached" for r in runs for e in r.events("run_deferred"))
        strays = [e for r in runs for e in r.events("stray_vm")]
        assert {e["microvm_id"] for e in strays} == set(sessions) and all("age" in e for e in strays)
        assert runs[-1].metrics("StrayVMs")[-1] == (2.0, "Count")
        fleet.emulator.client().terminate_microvm(microvmIdentifier=sessions[0])
        fleet.every_minute(monkeypatch, 2)
        assert len(fleet.ours()) == 2


# --------------------------------------------------------------------------- #11.2 consistency


def test_lists_that_omit_young_vms_make_no_duplicates_and_no_excess(aws, monkeypatch) -> None:
    """#11.2: lists omit VMs younger than 30 s: the run answers are what counts."""
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "2", "MAX_VMS": "6"}) as fleet:
        list_lag(fleet, 30)
        for _ in range(6):
            fleet.invoke(monkeypatch, cold=True)
            assert len(fleet.live()) <= 6
            fleet.clock.advance(20)
        assert len(fleet.ours()) == 5
        assert_no_duplicates(fleet)
        assert not fleet.dead_letters()


def test_a_vm_missing_from_a_list_is_confirmed_before_it_is_replaced(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        vms = sorted(vm["microvmId"] for vm in fleet.ours())
        r = fleet.reconciler(monkeypatch)
        hidden = {vms[0]}

        def hide(parsed: Any, **_: Any) -> None:
            parsed["items"] = [i for i in parsed["items"] if i["microvmId"] not in hidden]

        r.microvms.meta.events.register("after-call.lambda-microvms.ListMicrovms", hide)
        index._RECONCILER = r
        run = fleet.invoke(monkeypatch, cold=False)
        assert run.calls.get("GetMicrovm") == 1 and "RunMicrovm" not in run.calls
        fleet.emulator.client().terminate_microvm(microvmIdentifier=vms[0])  # now it really ends
        fleet.clock.advance(60)
        run = fleet.invoke(monkeypatch, cold=False)
        assert run.calls.get("GetMicrovm") == 1 and run.calls.get("RunMicrovm") == 1
        assert len(fleet.ours()) == 2


def test_lost_responses_count_as_live_until_seen(aws, monkeypatch) -> None:
    """#11.2: every answer lost: the slots are in doubt, counted live; the same tokens get the VMs."""
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        client_vm(fleet)  # a client's VM started at the same moment: never attached
        fleet.emulator.inject("RunMicrovm", "lost_response", times=3)
        fleet.every_minute(monkeypatch, 3)
        assert len(fleet.live()) <= 4 and len(fleet.ours()) == 3
        assert_no_duplicates(fleet)


def test_two_ticks_with_clocks_130_seconds_apart(aws, monkeypatch) -> None:
    """#11.2: a tick whose clock runs 130 s ahead takes the lease of one still working; the
    fence stops the first at its next write, before any call."""
    env = {"MIN_VMS": "5", "WARM_VMS": "0", "MAX_VMS": "5", "MAX_STARTS_PER_STEP": "2"}
    with deployed_fleet(aws, env=env) as fleet:
        slow = fleet.reconciler(monkeypatch)
        assert slow.begin_tick(lease_seconds=70, deadline_seconds=50)
        fast_clock = VirtualClock(fleet.clock.now() + 130)
        fast = fleet.reconciler(monkeypatch)
        fast.clock = fast_clock.now
        assert fast.tick(deadline_seconds=0)["steps"] == 1  # took the lease: 130 s ahead, it looks expired
        runs = fleet.emulator.calls["RunMicrovm"]
        assert runs == 2
        with pytest.raises(FencedOut):
            slow.step()  # it would start three more; its first write is refused
        assert fleet.emulator.calls["RunMicrovm"] == runs
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 2)
        assert len(fleet.live()) == 5
        assert_no_duplicates(fleet)


def test_concurrent_ticks_hold_the_lease_one_at_a_time(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "4", "WARM_VMS": "0", "MAX_VMS": "4"}) as fleet:
        reconcilers = [fleet.reconciler(monkeypatch) for _ in range(3)]
        results: list[dict] = []
        threads = [threading.Thread(target=lambda r=r: results.append(r.tick(deadline_seconds=0))) for r in reconcilers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(results) == 3
        assert len(fleet.live()) <= 4
        assert_no_duplicates(fleet)


# --------------------------------------------------------------------------- #11.3 no dip


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
def test_no_dip_at_expiry_without_headroom(aws, monkeypatch) -> None:
    """#11.3: min 3 / warm 2 / max 5: no headroom for a successor, ever. Lifetimes are spread and
    a parked VM is handed to a base slot before its VM ends: RUNNING never below 3."""
    env = {"MIN_VMS": "3", "WARM_VMS": "2", "MAX_VMS": "5", "MAX_LIFETIME_SECONDS": "1500",
           "SUCCESSOR_LEAD_SECONDS": "300", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        lowest, handovers = 3, 0
        for _ in range(3 * 25):  # three lifetimes
            run = fleet.every_minute(monkeypatch, 1)[0]
            handovers += len(run.events("vm_handed_over"))
            lowest = min(lowest, len(serving(fleet)))
            assert len(fleet.live()) <= 5
        assert lowest >= 3
        assert handovers >= 1
        lifetimes = sorted({vm.max_duration for vm in fleet.emulator._ever})
        assert len(lifetimes) > 1  # the first VMs' lifetimes were spread
        assert_no_duplicates(fleet)


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
@pytest.mark.parametrize("lifetime", [1500, 1200])
def test_no_dip_at_expiry_with_headroom(aws, monkeypatch, lifetime) -> None:
    """min 3 / max 4: one slot of headroom. 1,200 s with a 300 s lead is under twice (2 x 300 +
    120) s: first lifetimes are spread over 480 s instead of half a lifetime (before, not at all:
    the three VMs expired together and RUNNING fell to 1)."""
    env = {"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "4", "MAX_LIFETIME_SECONDS": str(lifetime),
           "SUCCESSOR_LEAD_SECONDS": "300"}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        fleet.every_minute(monkeypatch, 2)
        lowest = 3
        for _ in range(2 * lifetime // 60):
            fleet.every_minute(monkeypatch, 1)
            lowest = min(lowest, len(fleet.live(("RUNNING", "SUSPENDING", "SUSPENDED"))))
            assert len(fleet.live()) <= 4
        assert lowest >= 3


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
def test_lowering_max_vms_ends_parked_vms_first(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "2", "MAX_VMS": "6"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        session = client_vm(fleet)
        fleet.every_minute(monkeypatch, 1)
        assert len(fleet.live()) == 5
        fleet.env.update(MAX_VMS="4", WARM_VMS="2")
        fleet.every_minute(monkeypatch, 2)
        states = Counter(vm["state"] for vm in fleet.live())
        assert sum(states.values()) == 4 and states["RUNNING"] == 3  # 2 base + the client's
        assert set(history(fleet, session)) <= {"PENDING", "RUNNING"}


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
def test_lowering_warm_vms_drains_parked_slots(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "2", "MAX_VMS": "6"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fleet.env.update(MIN_VMS="1", WARM_VMS="1")
        fleet.every_minute(monkeypatch, 3)
        states = Counter(vm["state"] for vm in fleet.live())
        assert states == {"RUNNING": 3, "SUSPENDED": 1}  # base VMs above min_vms may serve: kept
        roles = Counter(s["role"] for s in fleet.ledger_slots().values())
        assert roles == {"base": 1, "warm": 1, "member": 2}


# --------------------------------------------------------------------------- #11.4 production


def test_an_api_error_under_powertools_does_not_crash_the_tick(aws, monkeypatch) -> None:
    with deployed_fleet(aws) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=1)
        run = fleet.invoke(monkeypatch)
        (error,) = [e for e in run.events("api_error") if e["operation"] == "RunMicrovm"]
        assert error["code"] == "InternalServerException" and error["error_message"]
        assert "steps" in run.result


def test_the_handler_client_makes_one_request_per_call(aws, monkeypatch) -> None:
    """#11.4/#17: a throttled call is one request the emulator sees, and one the metrics count."""
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.emulator.set_rate_limit("RunMicrovm", 0.1, 1, surge=0)  # 429s, not held requests
        run = fleet.invoke(monkeypatch, timeout=20)
        throttled = fleet.emulator.throttled["RunMicrovm"]
        assert throttled >= 1
        sent = sum(v for v, _ in run.metrics("RunMicrovmAttempts"))
        assert sent == fleet.emulator.calls["RunMicrovm"]
        assert sum(v for v, _ in run.metrics("Throttles")) == throttled


# --------------------------------------------------------------------------- #11.5 bounded errors


def test_thirty_minutes_of_internal_errors_are_bounded_and_visible(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "1", "MAX_VMS": "4"}) as fleet:
        outage = fleet.emulator.inject("RunMicrovm", "InternalServer", times=None)
        runs = fleet.every_minute(monkeypatch, 30)
        calls = fleet.emulator.calls["RunMicrovm"]
        # 3 slots: max_start_attempts each, then probes 1, 2, 4, 8 minutes apart (then every 15)
        assert calls <= 3 * (3 + 5)
        letters = fleet.dead_letters()
        assert {d["slot"] for d in letters} == {"base-0", "base-1", "warm-0"}
        # One message a slot: its failed probes are in the timeline only (1, 2, 4, 8 minutes apart).
        assert len(letters) == 3
        probes = [e for r in runs for e in r.events("slot_dead_lettered") if e.get("probe")]
        assert len(probes) >= 3 * 3 and {e["slot"] for e in probes} == {"base-0", "base-1", "warm-0"}
        assert all("InternalServerException" in d["reason"] and d["kind"] == "service" for d in letters)
        amplification = [v for r in runs for v, _ in r.metrics("RetryAmplification")]
        assert amplification and max(amplification) >= calls / 3
        assert runs[-1].metrics("DeadLetteredSlots")[-1][0] == 3
        fleet.emulator.remove_fault(outage)
        fleet.clock.advance(900)
        fleet.every_minute(monkeypatch, 2)  # the probes find the service back
        assert len(fleet.ours()) == 3


def test_a_crash_at_601_seconds_is_a_crash_loop(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        fleet.emulator.inject("RunMicrovm", "crash", after_seconds=601, reason="app_crashloop", times=None)
        fleet.every_minute(monkeypatch, 45)
        assert fleet.emulator.calls["RunMicrovm"] == 3
        (letter,) = fleet.dead_letters()
        assert letter["kind"] == "crash" and "3 times" in letter["reason"]


@pytest.mark.parametrize("case", ["validation", "not_found", "access_denied", "conflict"])
def test_request_errors_dead_letter_after_max_start_attempts(aws, monkeypatch, case) -> None:
    """#17: RunMicrovm Validation / NotFound / AccessDenied / Conflict."""
    env = {"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}
    if case == "not_found":
        env["IMAGE_ARN"] = "arn:aws:lambda:us-east-1:123456789012:microvm-image:nadie"
    with deployed_fleet(aws, env=env) as fleet:
        kind = {"access_denied": "AccessDenied", "validation": "Validation", "conflict": "Conflict"}.get(case)
        if kind:  # in the emulator, so the refused requests show in its request log
            fleet.emulator.inject("RunMicrovm", kind, times=None, caller=RECONCILER_CALLER)
        for _ in range(5):
            fleet.invoke(monkeypatch)
            fleet.clock.advance(60)
        (letter,) = fleet.dead_letters()
        assert letter["kind"] == "request" and letter["errors"] == 3
        code = {"validation": "Validation", "not_found": "ResourceNotFound", "access_denied": "AccessDenied",
                "conflict": "Conflict"}[case]
        assert letter["reason"].startswith(code)
        assert fleet.ledger_slots()["base-0"]["phase"] == "dead"
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert len(runs) == 3 and {r.error for r in runs} == {f"{code}Exception"}
        assert {r.caller for r in runs} == {RECONCILER_CALLER} and fleet.live() == []


def test_a_list_the_service_refuses_ends_the_tick(aws, monkeypatch) -> None:
    """A bare image name (measured: ValidationException "Invalid ARN format"): one list a tick,
    told, never retried within the tick."""
    with deployed_fleet(aws, env={"IMAGE_ARN": "mi-agente"}) as fleet:
        runs = fleet.every_minute(monkeypatch, 2)
        assert fleet.emulator.calls == {"ListMicrovms": 2}
        assert [e["code"] for r in runs for e in r.events("api_error")] == ["ValidationException"] * 2


def test_a_conflict_naming_the_vm_gives_the_slot_its_vm(aws, monkeypatch) -> None:
    """The token already made a VM with other parameters: the service names it; it is ours."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        r = fleet.reconciler(monkeypatch)
        slots, stats = r.ledger.load("mi-agente")
        token = core.client_token(stats["epoch"], "mi-agente", "base-0", 0)
        made = fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken=token,
                                                   maximumDurationInSeconds=600)["microvmId"]
        index._RECONCILER = r
        fleet.invoke(monkeypatch, cold=False)
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == made
        assert len(fleet.live()) == 1


@pytest.mark.parametrize("operation", ["SuspendMicrovm", "TerminateMicrovm", "GetMicrovm", "ListMicrovms"])
def test_errors_of_other_calls_are_told_and_retried_later(aws, monkeypatch, operation) -> None:
    """#17: Suspend / Terminate / Get / List errors."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fault = fleet.emulator.inject(operation, "InternalServer", times=None)
        if operation == "SuspendMicrovm":
            parked = [vm["microvmId"] for vm in fleet.live(("SUSPENDED",))]
            fleet.emulator.client().resume_microvm(microvmIdentifier=parked[0])  # refill needs a park
        if operation == "TerminateMicrovm":
            fleet.env.update(WARM_VMS="1")  # a surplus parked slot is ended
        if operation == "GetMicrovm":
            fleet.emulator.crash(fleet.ours()[0]["microvmId"], reason="Container Stopped with Exit Code: 1")
        runs = fleet.every_minute(monkeypatch, 2)
        errors = [e for r in runs for e in r.events("api_error") if e["operation"] == operation]
        assert errors and errors[0]["code"] == "InternalServerException"
        fleet.emulator.remove_fault(fault)
        fleet.every_minute(monkeypatch, 2)
        want = {"RUNNING": 1, "SUSPENDED": 2}
        if operation == "SuspendMicrovm":
            want = {"RUNNING": 2, "SUSPENDED": 2}
        if operation == "TerminateMicrovm":
            want = {"RUNNING": 1, "SUSPENDED": 1}
        assert Counter(vm["state"] for vm in fleet.live()) == want


def test_insufficient_capacity_backs_off_every_reconciler(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "3", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        capacity = fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None)
        run = fleet.invoke(monkeypatch)
        # Each refusal holds every slot (every reconciler) for the shared 5 s backoff: one call per
        # backoff in a tick (its 50 s and the 7 s of overtime a slot without a VM may take), never
        # a slot dead-lettered for the account's capacity.
        errors = run.events("api_error")
        assert fleet.emulator.calls["RunMicrovm"] == len(errors) <= (50 + 7) / 5 + 1
        times = [e["time"] for e in errors]
        assert all(b - a >= 5 for a, b in zip(times, times[1:])) and errors[0]["retry_after"] == 5.0
        assert not fleet.dead_letters()
        fleet.emulator.remove_fault(capacity)
        fleet.clock.advance(31)
        fleet.every_minute(monkeypatch, 2)
        assert len(fleet.ours()) == 3


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
def test_a_long_wait_passes_the_admission_deadline_once(aws, monkeypatch) -> None:
    """Seven minutes of InsufficientCapacity: each slot's wait passes the admission deadline
    (300 s) once and says so once (`admission_deadline_exceeded`), not on each of its attempts
    after it (~25 before this was fixed)."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        capacity = fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None)
        runs = fleet.every_minute(monkeypatch, 7)
        told = [e["slot"] for r in runs for e in r.events("admission_deadline_exceeded")]
        assert sorted(told) == ["base-0", "base-1"], told
        assert fleet.emulator.calls["RunMicrovm"] > 50  # it kept trying, 5 s apart
        fleet.emulator.remove_fault(capacity)
        fleet.every_minute(monkeypatch, 2)
        assert len(fleet.ours()) == 2


def test_pagination_past_fifty(aws, monkeypatch) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "64"}) as fleet:  # the product's limit
        for i in range(60):
            client_vm(fleet, f"client-{i}")
            fleet.clock.advance(0.2)
        run = fleet.invoke(monkeypatch)
        assert run.calls["ListMicrovms"] >= 2
        assert run.metrics("StrayVMs")[-1][0] == 60
        assert len(fleet.ours()) == 2


def test_demand_waits_for_the_shared_budget_within_a_tick(aws, monkeypatch) -> None:
    """#17: a budget of 1 RunMicrovm a second: 6 runs go out over the tick's steps, never as a burst."""
    env = {"MIN_VMS": "6", "WARM_VMS": "0", "MAX_VMS": "6", "BUDGETS": '{"RunMicrovm":[1,1],"ListMicrovms":[2,2]}'}
    with deployed_fleet(aws, env=env) as fleet:
        run = fleet.invoke(monkeypatch)
        assert fleet.emulator.calls["RunMicrovm"] == 6 and not fleet.emulator.throttled
        starts = sorted(vm["startedAt"] for vm in fleet.live())
        assert all(b - a >= 0.9 for a, b in zip(starts, starts[1:]))  # one a second, as budgeted
        assert run.result["steps"] > 1 and run.calls["ListMicrovms"] < 6
        assert len(fleet.live()) == 6


# --------------------------------------------------------------------------- shared images


def test_two_fleets_on_one_image_each_count_their_own(aws, monkeypatch) -> None:
    clock = VirtualClock()
    with MicrovmsEmulator(clock=clock, seed=3, pending_seconds=5) as emulator:
        untraced_requests(emulator)  # coverage skips its request threads (tests/moto_server.py)
        emulator.create_image("compartida", memory_mib=2048, hooks=True)
        image = emulator.image_arn("compartida")
        base = {"IMAGE_ARN": image, "MAX_VMS": "3", "WARM_VMS": "0", "MIN_VMS": "3"}
        with deployed_fleet(aws, emulator=emulator, fleet="uno", env={**base, "SHARED_WITH": '["dos"]'}) as uno:
            env = {**base, "SHARED_WITH": '["uno"]', "LEDGER_TABLE": uno.env["LEDGER_TABLE"],
                   "BUDGET_TABLE": uno.env["BUDGET_TABLE"]}
            with deployed_fleet(aws, emulator=emulator, fleet="dos", env=env) as dos:
                for _ in range(3):
                    uno.invoke(monkeypatch)
                    dos.invoke(monkeypatch)
                    clock.advance(60)
                assert len(uno.ledger_slots()) == 3 and len(dos.ledger_slots()) == 3
                assert len(uno.live(("RUNNING",))) == 6  # both reached min_vms; neither saw strays
                last = dos.invocations[-1]
                assert last.metrics("StrayVMs")[-1][0] == 0


# --------------------------------------------------------------------------- strays (#13)


@pytest.mark.stores("memory")  # a decision over many ticks: the stores' own tests pin DynamoDB
def test_idle_strays_end_only_when_opted_in(aws, monkeypatch) -> None:
    env = {"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "4", "TERMINATE_STRAYS": "1", "STRAY_GRACE_SECONDS": "600"}
    with deployed_fleet(aws, env=env) as fleet:
        busy, idle = client_vm(fleet, "busy"), client_vm(fleet, "idle")
        fleet.clock.advance(13)
        fleet.emulator.client().suspend_microvm(microvmIdentifier=idle)
        runs = fleet.every_minute(monkeypatch, 15)
        assert fleet.emulator.state_of(busy) == "RUNNING"  # a RUNNING VM a client may be using
        assert fleet.emulator.state_of(idle) in ("TERMINATING", "TERMINATED")
        assert [e["microvm_id"] for r in runs for e in r.events("stray_terminated")] == [idle]
    with deployed_fleet(aws, env={**env, "TERMINATE_STRAYS": ""}) as fleet:
        idle = client_vm(fleet, "idle")
        fleet.clock.advance(13)
        fleet.emulator.client().suspend_microvm(microvmIdentifier=idle)
        fleet.every_minute(monkeypatch, 15)
        assert fleet.emulator.state_of(idle) == "SUSPENDED"


# --------------------------------------------------------------------------- the shared budget


def test_a_busy_shared_budget_is_waited_for_before_the_first_list(aws, monkeypatch) -> None:
    """Other fleets' reconcilers hold the account's RunMicrovm budget for the next 6 s. The ledger
    says two runs are due (an empty fleet), so the tick reserves their tokens before it lists and
    lists once, when they come due (#11: at 300 fleets, listing first and again after the wait
    was a quarter of all calls). Nothing goes past the quota."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        ddb, table, t0 = fleet.ddb, fleet.env["BUDGET_TABLE"], fleet.clock.now()
        ddb.put_item(TableName=table, Item={"operation": {"S": "RunMicrovm"}, "tat": {"N": repr(t0 + 6)}})
        run = fleet.invoke(monkeypatch)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        lists = [r.time for r in fleet.emulator.requests if r.operation == "ListMicrovms"]
        assert len(runs) == 2 and all(r.status == 200 for r in runs)
        assert min(r.time for r in runs) >= t0 + 3  # after the budget had room for them
        assert len([t for t in lists if t <= min(r.time for r in runs)]) == 1  # one list, when they came due
        assert lists[0] >= t0 + 3
        assert run.metrics("Deferrals")  # told
        assert len(fleet.ours()) == 2
        assert_no_duplicates(fleet)


def test_a_parked_slots_vm_is_parked_while_the_fleet_waits_for_run_tokens(aws, monkeypatch) -> None:
    """#11 (37 fleets): a fleet that waits for the shared RunMicrovm budget (here one token every
    10 s) still parks the VM it started for a parked slot as soon as it runs (SuspendMicrovm has
    its own quota). Left until the next run token came due, every fleet's suspends bunched up at
    the end of convergence, behind the last runs."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5", "BUDGETS": '{"RunMicrovm":[0.1,1]}'}
    # The measured 2 s PENDING (no slow first launches of a fresh version).
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        fleet.invoke(monkeypatch)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        suspends = [r for r in fleet.emulator.requests if r.operation == "SuspendMicrovm"]
        assert len(runs) == 3 and all(b.time - a.time >= 9.9 for a, b in zip(runs, runs[1:]))  # as budgeted
        # warm-0 first (parked slots come early), then base-0 10 s later: warm-0's VM is parked as
        # soon as it runs, while the fleet waits for the next token (it used to wait for that token).
        assert suspends and suspends[0].microvm_id == runs[0].microvm_id
        assert suspends[0].time <= runs[0].time + 5 < runs[1].time  # parked while the fleet waited
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert len(fleet.live(("SUSPENDED",))) == 2 and len(fleet.live(("RUNNING",))) == 1


def test_due_tokens_are_spent_on_a_recent_list_when_no_list_can_be_had(aws, monkeypatch) -> None:
    """A converged fleet loses a VM (the ledger still says both are there, so the tick lists
    first); the RunMicrovm budget is held by others for 6 s, and once the fleet has listed its
    ListMicrovms budget too: the tick waits for the run budget with no list on every try, and the
    token that comes due while no list can be had is spent on its last list (a few seconds old)
    instead of being given up."""
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        fleet.invoke(monkeypatch)
        fleet.clock.advance(60)
        assert len(fleet.ours()) == 2
        fleet.emulator.client().terminate_microvm(microvmIdentifier=fleet.ours()[0]["microvmId"])
        fleet.clock.advance(1)
        ddb, table, t0 = fleet.ddb, fleet.env["BUDGET_TABLE"], fleet.clock.now()

        def busy(operation: str, until: float) -> None:
            ddb.put_item(TableName=table, Item={"operation": {"S": operation}, "tat": {"N": repr(until)}})

        busy("RunMicrovm", t0 + 6)
        lists: list[float] = []

        def on_request(record: Any) -> None:
            if record.operation == "ListMicrovms" and record.caller == RECONCILER_CALLER and record.time >= t0:
                lists.append(record.time)
                if len(lists) == 1:
                    busy("ListMicrovms", record.time + 11)  # none for 10 s (its burst), none reserved for 8

        fleet.emulator.subscribe(on_request)
        before = len([r for r in fleet.emulator.requests if r.operation == "RunMicrovm"])
        run = fleet.invoke(monkeypatch)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"][before:]
        assert len(runs) == 1 and runs[0].status == 200
        assert runs[0].time >= t0 + 3  # after the budget had room for it
        assert runs[0].time < lists[0] + 8  # on the last list, before any new one could be had
        assert lists[0] == pytest.approx(t0, abs=0.01)
        assert not [t for t in lists if t0 < t < runs[0].time]  # no list while waiting
        assert run.metrics("Deferrals")
        assert len(fleet.ours()) == 2
        assert_no_duplicates(fleet)


def test_a_converging_fleet_parks_without_a_look_of_its_own(aws, monkeypatch) -> None:
    """#11 (API calls <= 1.1 x the minimum): a fleet converging from empty lists, starts its VMs,
    hands each to its server, and suspends its parked slots' VMs once the server says they are
    warmed (the measured 2 s PENDING, rayd's readiness and the settling cell: about 3 s), with no
    look of their own (the answer is a read: the VM ran then); it ends its tick, and the next
    tick's list sees them parked."""
    env = {"MIN_VMS": "2", "WARM_VMS": "2", "MAX_VMS": "5"}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        t0 = fleet.clock.now()
        first = fleet.invoke(monkeypatch)
        assert first.calls == {"ListMicrovms": 1, "RunMicrovm": 4, "SuspendMicrovm": 2}
        suspends = [r for r in fleet.emulator.requests if r.operation == "SuspendMicrovm"]
        assert {r.status for r in suspends} == {200} and all(r.time - t0 < 5 for r in suspends)
        fleet.clock.advance(60)
        second = fleet.invoke(monkeypatch)
        assert second.calls == {"ListMicrovms": 1}
        assert len(second.events("vm_parked")) == 2  # told by the tick that saw them parked
        assert len(fleet.live(("SUSPENDED",))) == 2 and len(fleet.live(("RUNNING",))) == 2
        assert_no_duplicates(fleet)
