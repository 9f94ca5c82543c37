"""Slot ids asked for again, dead letters kept until sent, ``step_failed`` retries, the shared
backoff's plausibility, ListMicrovms pages waited for within a tick and the account's "no room",
on inputs and timings their own tests do not use. The production path only: ``index.handler`` with Powertools, the
clients ``index.build()`` makes, the synthesized environment, the MicroVMs emulator over HTTP on a
virtual clock, moto. Every number comes from the emulator's VM histories and request log, moto's
items, the SQS queue and stdout, never from the reconciler's own counters.

A Lambda timeout is modelled where it matters (``LambdaTimeout``): once an invocation's 65 s have
passed, its next AWS call (or sleep) raises ``LambdaKilled`` (a ``BaseException``: no handler of
the reconciler catches it, no ``finally`` write lands), and the next invocation runs in a new
execution environment, as Lambda does after a timeout.

Failures pinned (the numbers measured for each beside its test; the first four held, the last a
known limit, told):

* a queue that hangs (each SendMessage waits out the client's 3 x 5 s) with five letters kept:
  every tick's first step sends them all before its runs, 75 s, and every tick is killed at 65 s;
  after a redrive, 0 RunMicrovm and 0 VMs for 8 minutes;
* a letter kept for a slot the spec then drops is deleted with the slot, never sent;
* a letter the queue took whose clearing write fails is sent again by the next tick (2 messages
  for one dead-lettering; the docs do not say a letter may arrive twice);
* a store answering 2.5 s late runs a tick 110.8 s (the step's intents loop never looks at the
  deadline): past the Lambda's 65 s;
* a ListMicrovms of 25 pages on a fleet's share of the list budget (9/s among 20 fleets) never
  completes: the pages read are dropped at the deadline, every tick, and the fleet never starts a VM.

Held and kept (cheap, next to a break): warm_vms flapping 3 -> 0 -> 3 -> 1 -> 3 with clients
taking parked VMs; an in-doubt slot dropped and asked for again; a base slot refused for room
while warm_vms is lowered; a quota backoff written by a clock 25 s ahead; 20 pages on the shared
list budget. Held and not kept: min_vms 5 -> 1 -> 5 -> 2 -> 5 (10 s); InsufficientCapacity coming
and going every 3 s for 5 minutes (9 runs for 7 VMs, no handover churn); another fleet's 402 while
this fleet's base VM ends (one handover, the pool 63 s short: the documented "the account's");
clocks 0 and 200 s ahead; a slow store at 1 s a call (58.9 s ticks).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Optional

import pytest

from lambdas.reconciler import index

from .support import _ended_sessions, _errors, _held_twice, _ours, _requests, _reused_tokens, _shape
from .harness import (
    RECONCILER_CALLER,
    deployed_fleet,
    peak_live,
    seconds_below,
)
from .support import (
    catch_crashes,
    error_answer,
    leaked,
    on_every_build,
    room_taken_from_the_base_vm,
    sqs_client_of,
)



# --------------------------------------------------------------------------- helpers


def _events(fleet, kind: str) -> list[dict]:
    return [e for i in fleet.invocations for e in i.events(kind)]


def _drain_queue(fleet) -> list[dict]:
    """Every message in the dead-letter queue (received and deleted)."""
    out = []
    while True:
        got = fleet.sqs.receive_message(QueueUrl=fleet.env["DEAD_LETTER_QUEUE_URL"], MaxNumberOfMessages=10,
                                        WaitTimeSeconds=0, VisibilityTimeout=0).get("Messages", [])
        if not got:
            return out
        for m in got:
            out.append(json.loads(m["Body"]))
            fleet.sqs.delete_message(QueueUrl=fleet.env["DEAD_LETTER_QUEUE_URL"], ReceiptHandle=m["ReceiptHandle"])


class LambdaKilled(BaseException):
    """The Lambda runtime ended the invocation at its timeout (nothing of the handler catches it)."""


class LambdaTimeout:
    """The function's 65 s timeout on the virtual clock: the first AWS call (DynamoDB, SQS,
    MicroVMs) an invocation makes after it raises :class:`LambdaKilled`; the next invocation runs
    in a new execution environment (Lambda restarts the runtime after a timeout)."""

    def __init__(self, monkeypatch, fleet_ref: dict, timeout: float = 65.0) -> None:
        self.timeout = timeout
        self.deadline: Optional[float] = None
        self.kills: list[float] = []
        self.ref = fleet_ref
        on_every_build(monkeypatch, self.install)
        handler = index.handler

        def wrapped(event: Any, context: Any) -> Any:
            fleet = self.ref["fleet"]
            self.deadline = fleet.clock.now() + self.timeout
            try:
                return handler(event, context)
            except LambdaKilled:
                self.kills.append(fleet.clock.now())
                fleet._environment = None  # a new execution environment next time
                return {"killed": True}
            finally:
                self.deadline = None

        monkeypatch.setattr(index, "handler", wrapped)

    def check(self, **_: Any) -> None:
        fleet = self.ref.get("fleet")
        if fleet is not None and self.deadline is not None and fleet.clock.now() >= self.deadline:
            raise LambdaKilled()

    def install(self, reconciler: Any) -> None:
        for client in (reconciler.ledger._ddb, reconciler.microvms, sqs_client_of(reconciler)):
            client.meta.events.register_first("before-call", self.check)


def hang_sqs(monkeypatch, timeout: Optional[LambdaTimeout], clock_ref: dict, seconds: float = 15.0) -> dict:
    """Every SendMessage of the handler's SQS client hangs: the client's three attempts each wait
    out the 5 s read timeout (STORE_CONFIG), then the call raises ReadTimeoutError."""
    from botocore.exceptions import ReadTimeoutError

    state = {"on": True, "hung": 0}

    def hang(**_: Any) -> Any:
        if not state["on"]:
            return None
        if timeout is not None:
            timeout.check()
        state["hung"] += 1
        clock_ref["fleet"].clock.advance(seconds)
        raise ReadTimeoutError(endpoint_url="sqs (injected: no answer within the read timeout, 3 attempts)")

    on_every_build(monkeypatch, lambda r: sqs_client_of(r).meta.events.register("before-call.sqs.SendMessage", hang))
    return state


def refuse_sqs(monkeypatch) -> dict:
    state = {"on": True, "refused": 0}

    def refuse(**_: Any) -> Optional[tuple]:
        if state["on"]:
            state["refused"] += 1
            return error_answer("KMS.AccessDeniedException", 400)
        return None

    on_every_build(monkeypatch, lambda r: sqs_client_of(r).meta.events.register("before-call.sqs.SendMessage", refuse))
    return state


# --------------------------------------------------------------------------- 2. dead letters kept until sent


# Found (a strict xfail until fixed): 5 slots dead-lettered with their letters kept; after the app was fixed and a redrive, 8 of 8
# ticks killed at the Lambda's 65 s (each at 75 s: five SendMessage of 15 s each in the first step), 0
# RunMicrovm and 0 VMs RUNNING for 8 minutes; tick.py:485-489 sends every kept letter in the tick's first
# step, before its runs (tick.py:509), with no deadline check; each send is bounded only by STORE_CONFIG
# (index.py:48, 3 attempts x 5 s)
# Fixed: letters go after the step's calls, one failed send blocks the others for the tick, each send
# needs 6 s of the invocation left, and the queue's client makes one attempt of at most 5 s (index.LETTER_CONFIG).
def test_a_hanging_queue_with_letters_pending_does_not_stop_the_fleet(aws, monkeypatch) -> None:
    """The app of every VM exits 20 s after its start (a crash loop) while SQS hangs (each
    SendMessage waits out the client's three 5 s read timeouts): the five base slots are
    dead-lettered (kind ``crash``), their letters kept in the ledger (``dead_letter_failed``). The
    app is fixed and the operator redrives (``{"action": "redrive"}``). SQS still hangs: the
    letters must wait, the fleet must not (docs: "timeouts so a hung store cannot hold the tick",
    index.STORE_CONFIG): five base VMs RUNNING within a few minutes of the redrive."""
    catch_crashes(monkeypatch)
    ref: dict = {}
    timeout = LambdaTimeout(monkeypatch, ref)
    sqs = hang_sqs(monkeypatch, timeout, ref)
    with deployed_fleet(aws, env=_shape(5, 0, 6), pending_seconds=2) as fleet:
        ref["fleet"] = fleet
        crash = fleet.emulator.inject("RunMicrovm", "crash", after_seconds=20, times=None)
        fleet.every_minute(monkeypatch, 6)
        dead = sorted(k for k, s in fleet.ledger_slots().items() if s["phase"] == "dead")
        fleet.emulator.remove_fault(crash)
        kills_before = len(timeout.kills)
        redrive = fleet.invoke(monkeypatch, {"action": "redrive"})
        back = fleet.clock.now()
        fleet.every_minute(monkeypatch, 8)
        found = dict(dead=len(dead), redriven=len(redrive.result.get("redriven") or []),
                     running_8min_after=_ours(fleet)["RUNNING"],
                     runs_after_redrive=len(_requests(fleet, "RunMicrovm", since=back)),
                     ticks_killed_after=len(timeout.kills) - kills_before, hung_sends=sqs["hung"],
                     kill_times=[round(k - back, 1) for k in timeout.kills[kills_before:]])
        assert found["dead"] == 5 and found["redriven"] == 5, found
        assert found["running_8min_after"] == 5 and found["ticks_killed_after"] == 0, found


# Found (a strict xfail until fixed): base-0 and base-1 dead-lettered (ValidationException, kind request) with their letters kept while
# SQS refused; min_vms 2 -> 1, then SQS back: 1 message (base-0), base-1's dead-lettering never told;
# core.py:601 deletes the dropped slot with its Slot.letter, and tick.py:485-489 sends only the letters
# of slots still in the ledger
# Fixed: the letter of a slot a plan drops moves to #stats (``letters``) in the same write, and is sent from there.
def test_a_letter_kept_for_a_slot_the_spec_then_drops_is_still_sent(aws, monkeypatch) -> None:
    """Two base slots dead-lettered (every RunMicrovm refused ValidationException: kind ``request``,
    no doubt) while SQS refuses every
    SendMessage: both letters kept in the ledger. A deploy lowers min_vms to 1 (base-1 dropped),
    then SQS is back. Each dead-lettering was told once to the queue: two messages."""
    catch_crashes(monkeypatch)
    sqs = refuse_sqs(monkeypatch)
    with deployed_fleet(aws, env=_shape(2, 0, 3), pending_seconds=2) as fleet:
        fault = fleet.emulator.inject("RunMicrovm", "Validation", times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 2)
        dead = sorted(k for k, s in fleet.ledger_slots().items() if s["phase"] == "dead" and s.get("letter"))
        fleet.env["MIN_VMS"] = "1"
        fleet.every_minute(monkeypatch, 1)
        sqs["on"] = False
        fleet.emulator.remove_fault(fault)
        fleet.every_minute(monkeypatch, 2)
        letters = Counter(m["slot"] for m in _drain_queue(fleet))
        found = dict(dead_with_letter=dead, letters=dict(letters), refused=sqs["refused"])
        assert dead == ["base-0", "base-1"], found
        assert letters == {"base-0": 1, "base-1": 1}, found


# Found (a strict xfail until said): 1 dead-lettering, 2 messages in the queue: the queue took the letter, the write that forgets it
# failed once (step_failed where step), the letter stayed in the ledger and the next tick's first step
# sent it again; tick.py:1210-1212 sends, then clears with a separate write; docs/reconciler.md 'Errors'
# says the letter is 'kept and sent again', not that it may arrive twice (at-least-once, undocumented)
# Said and made readable: letters are at least once (as SQS is); each carries a letter_id, the same on a resend.
def test_a_letter_sent_whose_clearing_write_fails_is_sent_again_with_the_same_id(aws, monkeypatch) -> None:
    """A slot dead-lettered (every RunMicrovm answered 500); the queue takes its letter, and the
    fenced write that forgets the letter fails (a DynamoDB 500 after the client's attempts: told,
    ``step_failed``, the step taken again). One dead-lettering: at least once, so a second message
    may come, with the same ``letter_id`` (docs/reconciler.md, "Errors")."""
    catch_crashes(monkeypatch)
    state = {"sent": 0, "failed": 0}

    def sent(**_: Any) -> None:
        state["sent"] += 1

    def fail_after_send(params: Any = None, **_: Any) -> Optional[tuple]:
        if state["sent"] == 1 and not state["failed"]:
            docs = [json.loads(i["Put"]["Item"]["doc"]["S"]) for i in json.loads(params["body"]).get("TransactItems", [])
                    if "Put" in i]
            if docs and docs[0]["phase"] == "dead" and docs[0].get("letter") is None:
                state["failed"] += 1
                return error_answer("InternalServerError", 500, "Internal server error")
        return None

    def install(r: Any) -> None:
        sqs_client_of(r).meta.events.register("after-call.sqs.SendMessage", sent)
        r.ledger._ddb.meta.events.register("before-call.dynamodb.TransactWriteItems", fail_after_send)

    on_every_build(monkeypatch, install)
    with deployed_fleet(aws, env=_shape(1, 0, 2), pending_seconds=2) as fleet:
        fleet.emulator.inject("RunMicrovm", "InternalServer", times=None, caller=RECONCILER_CALLER)
        fleet.every_minute(monkeypatch, 3)
        letters = _drain_queue(fleet)
        told = [e["where"] for e in _events(fleet, "step_failed")]
        found = dict(failed_writes=state["failed"], sends=state["sent"], letters=len(letters), step_failed=told)
        assert state["failed"] == 1, found
        assert 1 <= len(letters) <= 2 and len({m["letter_id"] for m in letters}) == 1, (found, letters)


# --------------------------------------------------------------------------- 6. the account's no room


def test_a_base_slot_without_room_gets_a_vm_when_warm_vms_is_lowered(aws, monkeypatch) -> None:
    """min 1 / warm 1 / max 2, the account's memory quota holds 3 VMs: the base VM, the parked
    one and a client's VM of another app. The base VM ends (a client ends it) and another app's
    session takes the room it freed; the same minute a deploy lowers warm_vms to 0 (``drain``).
    The base slot's run is refused (402): the parked VM is there, so the base slot takes it
    (docs: "Refused for room"; "base slots are filled first whenever there is not room"),
    drained or not. Held: the drained parked VM is never a donor (core.py donors exclude
    ``draining``), but its terminate frees the room at once (TERMINATING does not count toward
    the quota) and the base run is not refused."""
    drain = True
    catch_crashes(monkeypatch)
    with deployed_fleet(aws, env=_shape(1, 1, 2), pending_seconds=2, memory_quota_mib=3 * 4096) as fleet:
        _, parked_vm, ended = room_taken_from_the_base_vm(fleet, monkeypatch)
        if drain:
            fleet.env["WARM_VMS"] = "0"
        fleet.every_minute(monkeypatch, 3)
        resumed = [r for r in _requests(fleet, "ResumeMicrovm") if r.microvm_id == parked_vm]
        terminated = [r for r in _requests(fleet, "TerminateMicrovm") if r.microvm_id == parked_vm]
        refused = [r for r in _requests(fleet, "RunMicrovm", since=ended) if r.status == 402]
        below = round(seconds_below(fleet, 1, ended + 60, fleet.clock.now()), 1)
        found = dict(below_min_from_next_tick=below, resumed=len(resumed), parked_terminated=len(terminated),
                     runs_refused_402=len(refused), peak_mine=peak_live(fleet, mine=True), errors=len(_errors(fleet)))
        assert found["below_min_from_next_tick"] <= 3.0 and found["peak_mine"] <= 2, found



# --------------------------------------------------------------------------- 1. slot ids asked for again


def _members_touched(fleet, members: dict[str, float]) -> list[tuple[str, str, float]]:
    """Suspend/terminate/resume calls of ours on a VM after it became a member (a client's)."""
    return [(r.operation, r.microvm_id, round(r.time, 1)) for r in fleet.emulator.requests
            if r.caller == RECONCILER_CALLER and r.microvm_id in members and r.time > members[r.microvm_id]
            and r.operation in ("SuspendMicrovm", "TerminateMicrovm", "ResumeMicrovm")]


@pytest.mark.parametrize("role,steps", [
    ("warm", [3, 0, 3, 1, 3]),
    # Held as well (10 s, not kept): ("base", [5, 1, 5, 2, 5]) with max 24.
])
def test_a_spec_flapping_never_sends_a_token_twice(aws, monkeypatch, role, steps) -> None:
    """warm_vms 3 -> 0 -> 3 -> 1 -> 3 (min 1, max 12), or min_vms 5 -> 1 -> 5 -> 2 -> 5 (warm 1,
    max 24), two minutes each, a client taking a parked VM before each change: no RunMicrovm
    ever sends a token that made a VM before, no VM in two slots, no member (a client's session,
    a base VM above the lowered min) suspended, resumed or terminated, and the spec met at the end."""
    catch_crashes(monkeypatch)
    env = _shape(1, steps[0], 12) if role == "warm" else _shape(steps[0], 1, 24)
    key = "WARM_VMS" if role == "warm" else "MIN_VMS"
    with deployed_fleet(aws, env=env, pending_seconds=2, client_token_ttl_seconds=7200) as fleet:
        t0 = fleet.clock.now()
        client = fleet.emulator.direct_client(caller="client")
        members: dict[str, float] = {}
        fleet.every_minute(monkeypatch, 2)
        for value in steps[1:]:
            parked = sorted(s["microvm_id"] for s in fleet.ledger_slots().values()
                            if s["role"] == "warm" and s["phase"] == "parked")
            if parked:
                client.resume_microvm(microvmIdentifier=parked[0])
                members[parked[0]] = fleet.clock.now()
            fleet.every_minute(monkeypatch, 1)
            for s in fleet.ledger_slots().values():
                if s["role"] == "member":
                    members.setdefault(s["microvm_id"], fleet.clock.now())
            fleet.env[key] = str(value)
            fleet.every_minute(monkeypatch, 2)
        fleet.every_minute(monkeypatch, 1)
        for s in fleet.ledger_slots().values():
            if s["role"] == "member":
                members.setdefault(s["microvm_id"], fleet.clock.now())
        slots = fleet.ledger_slots()
        want_base, want_warm = (1, steps[-1]) if role == "warm" else (steps[-1], 1)
        base_running = sum(1 for k, s in slots.items() if s["role"] == "base" and s["phase"] == "running")
        parked = sum(1 for s in slots.values() if s["role"] == "warm" and s["phase"] == "parked")
        tokens = Counter(vm["clientToken"] for vm in fleet.emulator.microvms_ever()
                         if (vm["clientToken"] or "").startswith("rz1-"))
        found = dict(reused=_reused_tokens(fleet, t0), held_twice=_held_twice(fleet),
                     touched=_members_touched(fleet, members), token_twice=[t for t, n in tokens.items() if n > 1],
                     base_running=base_running, parked=parked, collisions=len(_events(fleet, "token_collision")),
                     leaked=leaked(fleet), errors=len(_errors(fleet)), members=len(members))
        assert found["reused"] == [] and found["held_twice"] == [] and found["touched"] == [], found
        assert found["token_twice"] == [] and found["collisions"] == 0 and found["leaked"] == [], found
        assert (base_running, parked) == (want_base, want_warm), found




def test_an_in_doubt_slot_dropped_and_asked_for_again_keeps_one_vm_per_token(aws, monkeypatch) -> None:
    """min 3 / max 5: base-2's RunMicrovm makes its VM but the answer is lost (500 after the
    call was carried out), and the tick ends before the retry (a 1.5 s tick). A deploy lowers
    min_vms to 2 (base-2 dropped while in doubt), then raises it to 3. The lost call's VM is
    found by its token (a member once base-2 is dropped, never a stray), base-2 asked for again
    runs a token of its own, and no token makes two VMs. (A 7.5 s invocation: its calls end 6 s
    before its end, at 1.5 s.)"""
    catch_crashes(monkeypatch)
    with deployed_fleet(aws, env=_shape(3, 0, 5), pending_seconds=2, client_token_ttl_seconds=7200) as fleet:
        runs: list = []

        def on_request(record: Any) -> None:
            if record.operation == "RunMicrovm" and record.caller == RECONCILER_CALLER:
                runs.append(record)
                if len(runs) == 2:
                    fleet.emulator.inject("RunMicrovm", "lost_response", times=1)

        fleet.emulator.subscribe(on_request)
        t0 = fleet.clock.now()
        fleet.invoke(monkeypatch, timeout=7.5)
        doubted = {k: s for k, s in fleet.ledger_slots().items() if s["microvm_id"] is None}
        fleet.clock.advance(30)
        fleet.env["MIN_VMS"] = "2"
        fleet.every_minute(monkeypatch, 2)
        fleet.env["MIN_VMS"] = "3"
        fleet.every_minute(monkeypatch, 2)
        lost_token = runs[2].client_token
        lost_vm = next(vm["microvmId"] for vm in fleet.emulator.microvms_ever() if vm["clientToken"] == lost_token)
        slots = fleet.ledger_slots()
        holders = [k for k, s in slots.items() if lost_vm in (s["microvm_id"], s["retiring_id"])]
        tokens = Counter(vm["clientToken"] for vm in fleet.emulator.microvms_ever()
                         if (vm["clientToken"] or "").startswith("rz1-"))
        found = dict(in_doubt=sorted(doubted), lost_vm_holders=holders, token_twice=[t for t, n in tokens.items() if n > 1],
                     reused=[r for r in _reused_tokens(fleet, t0 + 30) if r[0] > 5], leaked=leaked(fleet), ours=dict(_ours(fleet)),
                     strays=len(_events(fleet, "stray_vm")), errors=len(_errors(fleet)))
        assert found["in_doubt"] == ["base-2"], found
        assert holders == [f"member-{lost_vm}"] and not found["token_twice"] and not found["leaked"], found
        assert not found["reused"], found  # strays: 1 (the lost call's VM listed before its token was asked again)
        assert found["ours"] == {"RUNNING": 4}, found


# --------------------------------------------------------------------------- 3. step_failed: a slow store


def slow_store(monkeypatch, ref: dict, seconds: float, timeout: Optional[LambdaTimeout] = None) -> dict:
    """Every DynamoDB request of the handler answers ``seconds`` late (under the 5 s read timeout:
    no error, no retry), a store in a brownout."""
    state = {"on": True, "calls": 0}

    def slow(**_: Any) -> None:
        if state["on"]:
            if timeout is not None:
                timeout.check()
            state["calls"] += 1
            ref["fleet"].clock.advance(seconds)

    on_every_build(monkeypatch, lambda r: r.ledger._ddb.meta.events.register("before-call.dynamodb", slow))
    return state


# Found (a strict xfail until fixed): every DynamoDB answer 2.5 s late, min 8 / warm 4 / max 14 from empty: the first invocation ran
# 110.8 s (its last MicroVMs call at 103.3 s), the second 45.5 s; with the 65 s timeout modelled
# (LambdaTimeout) 2 of the first 3 invocations were killed and the fleet was 41.2 s below min_vms after
# minute 2 (no duplicate, nothing leaked; 1.0 s late: 58.9 s, held). tick.py:509 (step's intents loop)
# makes every run, write and suspend of the plan without looking at self._deadline; only the loop in
# Reconciler.tick checks it, between steps
# Fixed: no call starts past the tick's deadline and overtime (Reconciler._hard_stop: the invocation's
# time less its 8 s margin), between steps and between a step's intents.
def test_a_slow_store_never_runs_a_tick_past_the_lambda_timeout(aws, monkeypatch) -> None:
    """Every DynamoDB answer comes ``seconds`` late (well under STORE_CONFIG's 5 s read timeout).
    A fleet of min 8 / warm 4 / max 14 from empty: each invocation ends before the function's 65 s
    timeout (docs: steps "never later than the invocation's time less its 8 s margin")."""
    seconds = 2.5
    catch_crashes(monkeypatch)
    ref: dict = {}
    store = slow_store(monkeypatch, ref, seconds)
    with deployed_fleet(aws, env=_shape(8, 4, 14), pending_seconds=2) as fleet:
        ref["fleet"] = fleet
        lengths, last_calls = [], []
        for _ in range(3):
            start = fleet.clock.now()
            fleet.invoke(monkeypatch)
            lengths.append(round(fleet.clock.now() - start, 1))
            calls = [r.time for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.time >= start]
            last_calls.append(round(max(calls) - start, 1) if calls else None)
            fleet.clock.advance(max(0.0, start + 60 - fleet.clock.now()))
        found = dict(invocation_seconds=lengths, last_microvms_call=last_calls, ddb_calls=store["calls"],
                     ours=dict(_ours(fleet)))
        assert max(lengths) <= 65.0, found



# --------------------------------------------------------------------------- 5. ListMicrovms pages within the tick


@pytest.mark.parametrize("listed,share", [
    pytest.param(1210, 20, id="25-pages", marks=pytest.mark.xfail(strict=True, reason=(
        "known limit (told: list_incomplete; docs/reconciler.md 'Errors'): 25 pages at 0.45 pages/s (9/s shared by 20 fleets): 4 ticks of 23 ListMicrovms each, every "
        "list dropped at the deadline, 0 RunMicrovm, 0 VMs in 4 minutes; tick.py:809-812 (_list) returns the "
        "Deferral once a page's token comes due past self._deadline, dropping the pages read, so a list "
        "longer than a tick never completes and each tick spends its share again"))),
    pytest.param(960, 20, id="20-pages"),  # held: 20 pages in 44 s, inside the 50 s tick
])
def test_a_list_of_many_pages_on_a_shared_list_budget_completes(aws, monkeypatch, listed, share) -> None:
    """``listed`` TERMINATED VMs of the image still listed (25 or 20 pages), and the stack's
    ListMicrovms budget (9 a second, burst 9: DEFAULT_BUDGETS at the default share) shared by
    ``share`` fleets listing at once: each gets about 9/share pages a second (modelled with this
    fleet's own BUDGETS entry: [9/share, 1]). A fleet of min 2 / warm 1 / max 5 from empty must
    start its VMs within a few minutes."""
    catch_crashes(monkeypatch)
    rate = round(9.0 / share, 3)
    env = _shape(2, 1, 5, BUDGETS=json.dumps({"ListMicrovms": [rate, 1]}))
    with deployed_fleet(aws, env=env, pending_seconds=2, memory_quota_mib=1 << 30) as fleet:
        _ended_sessions(fleet, listed)
        fleet.clock.advance(10)
        ticks = fleet.every_minute(monkeypatch, 4)
        states = _ours(fleet)
        found = dict(pages=-(-listed // 50), rate=rate, running=states["RUNNING"], parked=states["SUSPENDED"],
                     lists=[t.calls.get("ListMicrovms", 0) for t in ticks], runs=len(_requests(fleet, "RunMicrovm")),
                     errors=len(_errors(fleet)))
        assert (found["running"], found["parked"]) == (2, 1), found



# --------------------------------------------------------------------------- 4. the shared backoff's plausibility


@pytest.mark.parametrize("ahead", [25.0])  # held too: 0 and 200 s ahead
def test_a_quota_backoff_from_a_clock_somewhat_ahead_holds_every_fleet(aws, monkeypatch, ahead) -> None:
    """Two fleets share the stack's budget table; the account has no memory left (every run 402).
    Fleet A's Lambda clock runs ``ahead`` (within the 300 s its answers' Dates correct): its run's
    402 writes the 60 s quota backoff, which fleet B (right clock) must believe: no RunMicrovm of
    B within 55 s of A's 402 (docs: "every reconciler backs off (60 s ...)")."""
    catch_crashes(monkeypatch)
    env = _shape(1, 0, 2)
    with deployed_fleet(aws, env=env, pending_seconds=2, memory_quota_mib=0) as a:
        with deployed_fleet(aws, emulator=a.emulator, fleet="otro", env={**env, "BUDGET_TABLE": a.env["BUDGET_TABLE"]}) as b:
            a._environment, a._built_env = a.reconciler(monkeypatch), (dict(a.env), True)
            a._environment.clock = lambda: a.clock.now() + ahead
            a.invoke(monkeypatch, timeout=12)  # a 4 s tick: A meets the 402 and ends
            refused = [r.time for r in a.emulator.requests if r.operation == "RunMicrovm" and r.status == 402]
            b.every_minute(monkeypatch, 1)
            b_runs = [round(r.time - refused[0], 1) for r in b.emulator.requests if r.operation == "RunMicrovm"
                      and r.time > refused[0] and r.client_token and r.client_token not in
                      {x.client_token for x in a.emulator.requests if x.time <= refused[0]}]
            found = dict(a_refused=len(refused), b_first_run_after=b_runs[:1], b_runs_in_60s=sum(1 for t in b_runs if t < 55))
            assert found["a_refused"] >= 1 and found["b_runs_in_60s"] == 0, found



def test_a_list_the_tick_cannot_finish_is_told(aws, monkeypatch) -> None:
    """Eight pages on a ListMicrovms share of 0.1 a second (80 s of pages, more than a 50 s tick): the
    known limit above is told, once a tick (``list_incomplete``, with the pages read), and the
    tick ends without a crash or a RunMicrovm on a partial list."""
    catch_crashes(monkeypatch)
    env = _shape(1, 0, 2, BUDGETS=json.dumps({"ListMicrovms": [0.1, 1]}))
    with deployed_fleet(aws, env=env, pending_seconds=2, memory_quota_mib=1 << 30) as fleet:
        _ended_sessions(fleet, 380)
        fleet.clock.advance(10)
        tick = fleet.invoke(monkeypatch)
        told = tick.events("list_incomplete")
        assert len(told) == 1 and 1 <= told[0]["pages_read"] < 8, told
        assert not tick.calls.get("RunMicrovm") and "crashed" not in tick.result, tick.result
