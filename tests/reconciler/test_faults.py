"""Transport faults and refusals of the calls other than RunMicrovm, through ``index.handler``
(issue #17's tick.py error paths): a call that times out on the wire (botocore's
``ReadTimeoutError``: the emulator answers after the client's read timeout, and still carries the
call out, as a slow service would), a 409 on SuspendMicrovm / TerminateMicrovm (the VM moved on),
and a refused GetMicrovm before an idle stray is ended. Every fault is injected in the emulator for
the handler's access key only; every assertion comes from the emulator, moto or stdout.
"""

from __future__ import annotations

from collections import Counter

import pytest
from botocore.config import Config

from lambdas.reconciler import index

from .harness import RECONCILER_CALLER, deployed_fleet
from .support import kill_a_tick_after, room_taken_from_the_base_vm

#: The client's read timeout in these tests (production: 15 s) and the emulator's delay past it: an
#: ordinary answer of the in-process emulator is far below 2 s even on a loaded machine.
READ_TIMEOUT = 2.0
LATE = 3.0



@pytest.fixture
def short_timeout(monkeypatch) -> None:
    """The production client config (one attempt, the standard mode) with a short read timeout,
    so a late answer is a real socket timeout within a fraction of a second."""
    config = index.MICROVMS_CONFIG.merge(Config(read_timeout=READ_TIMEOUT, connect_timeout=2))
    monkeypatch.setattr(index, "MICROVMS_CONFIG", config)


def _tokens_unique(fleet) -> None:
    tokens = Counter(vm["clientToken"] for vm in fleet.ours())
    assert all(n == 1 for n in tokens.values()), tokens


def test_a_run_that_times_out_is_in_doubt_and_its_retry_makes_no_second_vm(aws, monkeypatch, short_timeout) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "2", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.emulator.inject("RunMicrovm", "latency", seconds=LATE, times=1, caller=RECONCILER_CALLER)
        runs = fleet.every_minute(monkeypatch, 3)
        errors = [e for r in runs for e in r.events("api_error") if e["operation"] == "RunMicrovm"]
        assert [e["code"] for e in errors] == ["ReadTimeoutError"]
        # The timed-out call made its VM; the retry with the same token returned it: 2 VMs, 2 tokens.
        _tokens_unique(fleet)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 2}
        assert not fleet.dead_letters()


@pytest.mark.parametrize("operation", ["ListMicrovms", "GetMicrovm", "SuspendMicrovm", "TerminateMicrovm"])
def test_a_call_that_times_out_is_told_and_the_fleet_recovers(aws, monkeypatch, short_timeout, operation) -> None:
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5"}) as fleet:
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}
        fleet.emulator.inject(operation, "latency", seconds=LATE, times=1, caller=RECONCILER_CALLER)
        want = {"RUNNING": 1, "SUSPENDED": 2}
        if operation == "SuspendMicrovm":
            parked = [vm["microvmId"] for vm in fleet.live(("SUSPENDED",))]
            fleet.emulator.client().resume_microvm(microvmIdentifier=parked[0])  # a client takes one: refill
            want = {"RUNNING": 2, "SUSPENDED": 2}
        if operation == "TerminateMicrovm":
            fleet.env.update(WARM_VMS="1")  # a surplus parked slot is ended
            want = {"RUNNING": 1, "SUSPENDED": 1}
        if operation == "GetMicrovm":
            fleet.emulator.crash(fleet.ours()[0]["microvmId"], reason="Container Stopped with Exit Code: 1")
        runs = fleet.every_minute(monkeypatch, 3)
        errors = [e for r in runs for e in r.events("api_error") if e["operation"] == operation
                  and not e.get("assumed_running")]  # the harness's 12 s PENDING refuses those
        assert [e["code"] for e in errors] == ["ReadTimeoutError"]
        fleet.every_minute(monkeypatch, 2)
        assert Counter(vm["state"] for vm in fleet.live()) == want
        _tokens_unique(fleet)
        assert not fleet.dead_letters()


@pytest.mark.parametrize("operation", ["SuspendMicrovm", "TerminateMicrovm"])
def test_a_conflict_on_suspend_or_terminate_is_told_without_a_shared_backoff(aws, monkeypatch, operation) -> None:
    """409 (the VM moved on since the list): told with the VM and the slot, no ``retry_after``
    (nothing about the account's rate or capacity), and the next step looks again. (The measured
    2 s PENDING: with the harness's 12 s, suspends of VMs assumed RUNNING are refused too.)"""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5"},
                        pending_seconds=2, fresh_launches=0) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fleet.emulator.inject(operation, "Conflict", times=1, caller=RECONCILER_CALLER)
        want = {"RUNNING": 1, "SUSPENDED": 1}
        if operation == "SuspendMicrovm":
            parked = [vm["microvmId"] for vm in fleet.live(("SUSPENDED",))]
            fleet.emulator.client().resume_microvm(microvmIdentifier=parked[0])
            want = {"RUNNING": 2, "SUSPENDED": 2}
        else:
            fleet.env.update(WARM_VMS="1")
        runs = fleet.every_minute(monkeypatch, 3)
        errors = [e for r in runs for e in r.events("api_error") if e["operation"] == operation]
        assert len(errors) == 1 and errors[0]["code"] == "ConflictException"
        assert errors[0]["microvm_id"] and errors[0]["slot"] and "retry_after" not in errors[0]
        refused = [r for r in fleet.emulator.requests if r.operation == operation and r.status == 409]
        assert [r.caller for r in refused] == [RECONCILER_CALLER]
        assert Counter(vm["state"] for vm in fleet.live()) == want


def test_a_refused_get_before_ending_an_idle_stray_ends_nothing_that_tick(aws, monkeypatch) -> None:
    """Opt-in stray ending asks GetMicrovm first; when that fails the stray is left for a later
    tick (never ended on the list's word alone)."""
    env = {"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "4", "TERMINATE_STRAYS": "1", "STRAY_GRACE_SECONDS": "600"}
    with deployed_fleet(aws, env=env) as fleet:
        idle = fleet.emulator.client().run_microvm(imageIdentifier=fleet.image, clientToken="idle")["microvmId"]
        fleet.clock.advance(13)
        fleet.emulator.client().suspend_microvm(microvmIdentifier=idle)
        fleet.every_minute(monkeypatch, 9)  # inside the grace: no GetMicrovm about the stray yet
        assert fleet.emulator.state_of(idle) == "SUSPENDED"
        fleet.emulator.inject("GetMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        runs = fleet.every_minute(monkeypatch, 6)
        errors = [e for r in runs for e in r.events("api_error") if e["operation"] == "GetMicrovm"]
        assert [(e["code"], e["microvm_id"]) for e in errors] == [("InternalServerException", idle)]
        ended = [(i, e["microvm_id"]) for i, r in enumerate(runs) for e in r.events("stray_terminated")]
        assert len(ended) == 1 and ended[0][1] == idle
        first_error = next(i for i, r in enumerate(runs) if r.events("api_error"))
        assert ended[0][0] > first_error  # a later tick, after a GetMicrovm that answered
        assert fleet.emulator.state_of(idle) in ("TERMINATING", "TERMINATED")


def test_a_deploy_that_changes_the_spec_tries_a_dead_slot_again(aws, monkeypatch) -> None:
    """A slot dead-lettered for a request error (the role may not run the image, say) waits for a
    redrive or a deploy that changes the fleet: the fix deployed, it is tried again with a new
    token and filled, with no redrive event needed."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        denied = fleet.emulator.inject("RunMicrovm", "AccessDenied", times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 5, cold=True)  # a new execution environment: the dead one is gone
        (letter,) = fleet.dead_letters()
        assert letter["kind"] == "request" and fleet.ledger_slots()["base-0"]["phase"] == "dead"
        generation = fleet.ledger_slots()["base-0"]["generation"]
        fleet.every_minute(monkeypatch, 2)  # no deploy: the dead slot stays dead, no RunMicrovm
        assert fleet.emulator.calls["RunMicrovm"] == 3
        fleet.emulator.remove_fault(denied)
        fleet.env.update(MAX_VMS="3")  # the deploy (a new environment) with a changed spec
        runs = fleet.every_minute(monkeypatch, 2)
        redriven = [e for r in runs for e in r.events("slot_redriven")]
        assert [(e["slot"], e["reason"]) for e in redriven] == [("base-0", "spec_changed")]
        slot = fleet.ledger_slots()["base-0"]
        assert slot["phase"] != "dead" and slot["generation"] == generation + 1
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1}
        _tokens_unique(fleet)


def test_a_parked_slots_pending_vm_is_parked_on_its_servers_answer_not_a_get(aws, monkeypatch) -> None:
    """A served fleet looks at no parked slot's PENDING VM (no GetMicrovm between lists, which a
    fleet without a server needed, and whose failure it fell back from with a list): the VM is
    warmed by the fleet's server, which waits for it to run, and parked on its answer. A failing
    GetMicrovm changes nothing."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "3"}) as fleet:
        fleet.emulator.inject("GetMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        run = fleet.invoke(monkeypatch)
        assert "GetMicrovm" not in run.calls and run.calls["SuspendMicrovm"] == 1
        assert [e["role"] for e in run.events("vm_warmed")] == ["warm"]
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 1}
        _tokens_unique(fleet)


def test_with_max_vms_equal_to_min_vms_a_successor_starts_the_second_its_predecessor_ends(aws, monkeypatch) -> None:
    """No headroom and nothing parked: the successor cannot start before the expiry (that would be
    above max_vms); the tick running at the expiry wakes one second after it instead of leaving the
    slot to the next scheduled minute."""
    env = {"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "1", "MAX_LIFETIME_SECONDS": "620",
           "SUCCESSOR_LEAD_SECONDS": "300", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        for _ in range(13):
            fleet.every_minute(monkeypatch, 1)
            assert len(fleet.live()) <= 1
        vms = sorted(fleet.emulator._ever, key=lambda vm: vm.started_at)
        assert len(vms) == 2 and vms[0].max_duration == 620
        ended = next(at for at, state, *_ in vms[0].history if state == "TERMINATING")
        assert 0 <= vms[1].started_at - ended <= 3
        assert len(fleet.live(("RUNNING",))) == 1


def test_a_redrive_of_a_slot_dead_in_doubt_asks_its_token_again_first(aws, monkeypatch) -> None:
    """A slot dead-lettered after 500s (each may have made a VM: in doubt) keeps its generation
    when redriven: the first call after it is the same token, which returns the VM a lost call
    made, if any; never a second VM for the slot."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "2"}) as fleet:
        outage = fleet.emulator.inject("RunMicrovm", "InternalServer", times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 3)
        (letter,) = fleet.dead_letters()
        assert letter["kind"] == "service" and letter["in_doubt"] is True
        before = fleet.ledger_slots()["base-0"]
        tokens = {r.client_token for r in fleet.emulator.requests if r.operation == "RunMicrovm"}
        assert len(tokens) == 1
        fleet.emulator.remove_fault(outage)
        redriven = fleet.invoke(monkeypatch, {"action": "redrive"})
        assert redriven.result["redriven"] == ["base-0"]
        after = fleet.ledger_slots()["base-0"]
        assert after["phase"] == "queued" and after["generation"] == before["generation"]
        fleet.every_minute(monkeypatch, 1)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert {r.client_token for r in runs} == tokens and runs[-1].status == 200
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1}


class _Killed(BaseException):
    """The Lambda was killed: nothing more runs in it, not even ``finally`` blocks' writes."""


class _KilledAfter:
    """A client or store of an execution environment that dies after ``left`` MicroVMs calls."""

    def __init__(self, target, state: dict, counts: bool) -> None:
        self._target, self._state, self._counts = target, state, counts

    def __getattr__(self, name: str):
        attribute = getattr(self._target, name)
        if not callable(attribute) or name.startswith("_") or name == "exceptions":
            return attribute

        def call(*args, **kwargs):
            if self._state["left"] <= 0:
                raise _Killed(name)
            if self._counts:
                self._state["left"] -= 1
            return attribute(*args, **kwargs)

        return call




@pytest.mark.parametrize("refusal", ["AccessDenied", "Validation"])
def test_a_retried_token_refused_before_it_is_looked_at_stays_in_doubt(aws, monkeypatch, refusal) -> None:
    """A tick dies right after its RunMicrovm made a VM (the answer never written down); every
    retry of that token is refused before the service looks at the token (403/400/404). The
    refusal proves nothing about the first call: the slot stays in doubt (counted, the same token,
    dead-lettered with its reason and ``in_doubt``), and a redrive asks that token again, which
    returns the VM the first call made. Taken as "no VM", the slot got a new token once
    redriven: a second VM for one slot, the first one left running as a stray."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        kill_a_tick_after(fleet, monkeypatch, 2)  # ListMicrovms, RunMicrovm: killed before the answer is saved
        (lost,) = fleet.ours()
        slot = fleet.ledger_slots()["base-0"]
        assert slot["phase"] == "starting" and slot["microvm_id"] is None
        fleet.clock.advance(60)
        fault = fleet.emulator.inject("RunMicrovm", refusal, times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 5, cold=True)  # a new execution environment: the dead one is gone
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert len({r.client_token for r in runs}) == 1  # never a new token while the VM may run
        assert [r.status for r in runs[1:]] == [{"AccessDenied": 403, "Validation": 400}[refusal]] * (len(runs) - 1)
        assert len(runs) == 4  # the first call, then max_start_attempts refusals: bounded
        (letter,) = fleet.dead_letters()
        assert letter["in_doubt"] is True and letter["kind"] == "request" and letter["reason"].startswith(refusal)
        slot = fleet.ledger_slots()["base-0"]
        assert slot["phase"] == "dead" and slot["in_doubt_since"] is not None
        assert [vm["microvmId"] for vm in fleet.ours()] == [lost["microvmId"]]  # nothing else started
        fleet.emulator.remove_fault(fault)
        assert fleet.invoke(monkeypatch, {"action": "redrive"}).result["redriven"] == ["base-0"]
        fleet.every_minute(monkeypatch, 1)
        runs = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert len({r.client_token for r in runs}) == 1 and runs[-1].status == 200
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == lost["microvmId"]
        assert [vm["microvmId"] for vm in fleet.ours()] == [lost["microvmId"]]


def test_a_retried_token_refused_for_capacity_proves_no_vm(aws, monkeypatch) -> None:
    """Capacity and the memory quota are refusals after the service weighed a VM for the token
    (one made earlier would have been returned): the doubt ends (``run_doubt_resolved``), the
    slot is no longer counted live, and the same token then makes the fleet's one VM."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=1, caller=RECONCILER_CALLER)
        runs = fleet.every_minute(monkeypatch, 3)
        resolved = [e for r in runs for e in r.events("run_doubt_resolved")]
        assert resolved and resolved[0]["reason"].startswith("no_vm:")
        calls = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert len({r.client_token for r in calls}) == 1 and calls[-1].status == 200
        assert len(fleet.ours()) == 1 and not fleet.dead_letters()


def test_a_conflict_naming_no_vm_on_an_in_doubt_retry_keeps_the_token(aws, monkeypatch) -> None:
    """A RunMicrovm whose answer was lost made a VM; the retry with the same token and parameters
    is answered 409 naming no VM (the emulator's Conflict fault; the service's answer there was
    never measured). That proves nothing about the VM the first call made: the slot stays in
    doubt with its token and asks again later, which returns that VM. Before, it took a new token
    (a new generation): a second VM, and the first one left running, foreign to the fleet."""
    with deployed_fleet(aws, env={"MIN_VMS": "1", "WARM_VMS": "0", "MAX_VMS": "3"}) as fleet:
        faults = fleet.emulator._faults
        take = faults.take

        def conflict_next(operation, kind, *args, **kwargs):
            fault = take(operation, kind, *args, **kwargs)
            if fault is not None and kind == "lost_response":  # the retry that follows gets the 409
                fleet.emulator.inject("RunMicrovm", "Conflict", times=1, caller=RECONCILER_CALLER)
            return fault

        monkeypatch.setattr(faults, "take", conflict_next)
        fleet.emulator.inject("RunMicrovm", "lost_response", times=1)
        runs = fleet.every_minute(monkeypatch, 4)
        calls = [r for r in fleet.emulator.requests if r.operation == "RunMicrovm"]
        assert [r.status for r in calls[:2]] == [500, 409]
        assert len({r.client_token for r in calls}) == 1, [r.client_token for r in calls]
        made = [vm["microvmId"] for vm in fleet.emulator.microvms_ever() if vm["imageArn"] == fleet.image]
        assert len(made) == 1  # the lost response's VM, and no other
        assert fleet.ledger_slots()["base-0"]["microvm_id"] == made[0]
        assert [vm["microvmId"] for vm in fleet.ours()] == made
        # Listed before the retry returned it, the VM is told as a stray once, and never touched.
        assert not [r for r in fleet.emulator.requests if r.operation in ("SuspendMicrovm", "TerminateMicrovm")]
        assert not fleet.dead_letters() and len([e for r in runs for e in r.events("run_accepted")]) == 1



def test_a_parked_vm_gone_before_its_suspend_is_not_suspended_again_in_the_tick(aws, monkeypatch) -> None:
    """Both parked slots' VMs are warmed by the server; right after warm-0's suspend a client ends
    warm-1's VM, gone from the service at once. Its suspend says 404: never sent again in the tick
    (the server's warm answer would still read as RUNNING on every later step), and the next
    tick replaces it."""
    env = {"MIN_VMS": "1", "WARM_VMS": "2", "MAX_VMS": "5"}
    with deployed_fleet(aws, env=env, pending_seconds=2, fresh_launches=0) as fleet:
        gone: list[str] = []

        def end_the_other(record) -> None:
            if record.operation == "SuspendMicrovm" and record.caller == RECONCILER_CALLER and not gone:
                (other,) = [s["microvm_id"] for s in fleet.ledger_slots().values()
                            if s["role"] == "warm" and s["microvm_id"] != record.microvm_id]
                gone.append(other)
                fleet.emulator.terminating_seconds = fleet.emulator.terminated_linger_seconds = 0.01
                fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=other)
                fleet.clock.advance(0.1)

        fleet.emulator.subscribe(end_the_other)
        fleet.invoke(monkeypatch)
        suspends = [r for r in fleet.emulator.requests if r.operation == "SuspendMicrovm" and r.caller == RECONCILER_CALLER]
        assert [r.status for r in suspends if r.microvm_id == gone[0]] == [404]
        fleet.clock.advance(60)
        fleet.every_minute(monkeypatch, 1)
        assert Counter(vm["state"] for vm in fleet.live()) == {"RUNNING": 1, "SUSPENDED": 2}



def test_a_handover_whose_resume_fails_is_resumed_again(aws, monkeypatch) -> None:
    """base-0's VM ends and a client's VM of another image takes the room it freed: base-0's run is
    refused for room (402), so it takes the parked slot's SUSPENDED VM (a handover) and resumes
    it. That ResumeMicrovm fails (500): base-0 holds a VM still SUSPENDED, and the next step
    resumes it again (no donor now: the VM is already base-0's), which serves as base-0's VM."""
    env = {"MIN_VMS": "1", "WARM_VMS": "1", "MAX_VMS": "2", "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2, memory_quota_mib=3 * 4096) as fleet:
        _, parked_vm, _ = room_taken_from_the_base_vm(fleet, monkeypatch)
        fleet.emulator.inject("ResumeMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)
        run = fleet.invoke(monkeypatch)
        assert [e["donor"] for e in run.events("vm_handed_over")] == ["warm-0"]
        resumes = [r.status for r in fleet.emulator.requests
                   if r.operation == "ResumeMicrovm" and r.caller == RECONCILER_CALLER and r.microvm_id == parked_vm]
        assert resumes == [500, 200]
        base = fleet.ledger_slots()["base-0"]
        assert (base["microvm_id"], base["phase"], base["handover_from"]) == (parked_vm, "running", None)
        assert fleet.emulator.state_of(parked_vm) == "RUNNING"
