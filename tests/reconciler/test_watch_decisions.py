"""The parked-slot watch's pure decisions (``core.watch``) and its looks (``Looks.watch``) with a
scripted budget and service: when the next look is due (past ``tick_seconds`` too, up to the last
moment a take can still be acted on), which parked VM is looked at first, and what a watch keeps
when the shared bucket runs dry half-way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from lambdas.reconciler import core
from lambdas.reconciler.budget import WATCH_OPERATION, Deferral, Granted
from lambdas.reconciler.core.watch import MIN_WATCH_GAP_SECONDS
from lambdas.reconciler.looks import Looks, Source


@pytest.mark.parametrize(("looked", "now", "period", "last", "due"), [
    (10.0, 10.0, 5.0, 57.0, 15.0),  # within the tick: a period after the last look
    (10.0, 13.0, 5.0, 57.0, 15.0),  # a step at 13 s that read nothing new does not put it off
    (10.0, 16.0, 5.0, 57.0, 16.0),  # overdue (a step woke for something else first): at once
    (52.0, 52.0, 5.0, 57.0, 57.0),  # the period would pass the last moment: the last look there
    (55.0, 55.5, 5.0, 57.0, 57.0),
    (56.5, 56.5, 5.0, 57.0, None),  # closer than MIN_WATCH_GAP_SECONDS to it: no more looks
    (50.0, 57.0, 5.0, 57.0, None),  # the last moment has come: none
    (10.0, 10.0, 0.0, 57.0, None),  # no watch
])
def test_the_next_watch_is_a_period_after_the_last_look_or_the_last_moment_a_take_can_be_acted_on(
        looked, now, period, last, due) -> None:
    assert core.next_watch(looked, now, period, last) == due
    assert MIN_WATCH_GAP_SECONDS == 1.0


def test_the_watch_looks_first_at_the_vm_read_longest_ago() -> None:
    read = {"a": 30.0, "b": 10.0, "c": 20.0}
    assert core.watch_order(["a", "b", "c", "d"], read) == ["d", "b", "c", "a"]  # never read: first
    assert core.watch_order(["x", "y"], {}) == ["x", "y"]  # ties keep the order given


def _slot(phase: core.Phase, vm: str = "vm-1", role: core.Role = core.WARM, parking_since: Optional[float] = 100.0,
          park_doubt_since: Optional[float] = None) -> core.Slot:
    return core.Slot("warm-0", role, phase=phase, microvm_id=vm, parking_since=parking_since,
                     park_doubt_since=park_doubt_since)


@pytest.mark.parametrize(("slot", "watched"), [
    (_slot(core.PARKED), True),
    (_slot(core.PARKING), True),  # our suspend accepted: a client can take it once it lands
    (_slot(core.PARKING, parking_since=None), False),  # suspend not sent, or refused
    (_slot(core.PARKING, park_doubt_since=99.0), False),  # its answer lost: the plan settles the doubt
    (_slot(core.STARTING), False),
    (_slot(core.PARKED, role=core.BASE), False),
    (_slot(core.PARKED, vm=""), False),
])
def test_the_watch_looks_at_parked_vms_and_those_whose_suspend_was_accepted(slot, watched) -> None:
    assert core.watched_vms([slot]) == ({"vm-1": slot} if watched else {})


def test_the_watched_vms_come_in_id_order() -> None:
    slots = [_slot(core.PARKED, vm) for vm in ("c", "a", "b")]
    assert list(core.watched_vms(slots)) == ["a", "b", "c"]


@pytest.mark.parametrize(("phase", "state", "read_at", "news"), [
    (core.PARKED, "SUSPENDED", 200.0, False),
    (core.PARKED, "PENDING", 200.0, True),  # a client's resume
    (core.PARKED, "RUNNING", 200.0, True),
    (core.PARKED, core.GONE, 200.0, True),
    (core.PARKED, "TERMINATED", 200.0, True),
    (core.PARKING, "SUSPENDING", 101.0, False),  # our suspend, under way
    (core.PARKING, "SUSPENDED", 102.0, False),
    (core.PARKING, "RUNNING", 100.3, False),  # the read has not caught up with the suspend
    (core.PARKING, "RUNNING", 130.0, False),  # ... within the park grace, the plan would wait too
    (core.PARKING, "RUNNING", 130.5, True),  # past it: a client's
    (core.PARKING, "TERMINATING", 101.0, True),  # a failed /suspend hook ends the VM
])
def test_a_read_is_news_when_the_plan_would_act_on_it(phase, state, read_at, news) -> None:
    assert core.PARK_GRACE_SECONDS == 30.0
    assert core.watch_news(_slot(phase), core.Observed("vm-1", state, 0.0), read_at) is news


@pytest.mark.parametrize(("phase", "state", "vm", "parks"), [
    (core.PARKING, "SUSPENDED", "vm-1", True),
    (core.PARKING, "SUSPENDING", "vm-1", False),  # not landed yet
    (core.PARKING, "SUSPENDED", "vm-2", False),  # another slot's VM
    (core.PARKED, "SUSPENDED", "vm-1", False),  # parked already: nothing to write
])
def test_a_suspend_the_watch_saw_land_parks_the_slot(phase, state, vm, parks) -> None:
    change = core.parked_by_watch(core.FleetSpec(fleet="f", image_arn="arn:image", min_vms=1, max_vms=3, warm_vms=1),
                                  _slot(phase), core.Observed(vm, state, 0.0), 105.0)
    if not parks:
        assert change is None
        return
    assert change is not None and change.slot is not None and change.slot.phase == core.PARKED
    assert [e["event"] for e in change.events] == ["vm_parked"] and not change.intents


# ------------------------------------------------------------------ Looks.watch, scripted


@dataclass
class _Spec:
    fleet: str = "f"
    image_arn: str = "arn:image"


@dataclass
class _Shell:
    states: dict[str, Any]  # a VM's state, or the exception its GetMicrovm raises
    clock: float = 100.0
    asked: list[str] = field(default_factory=list)
    spec: _Spec = field(default_factory=_Spec)
    api_calls: int = 0
    told: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return self.clock

    def pause(self, seconds: float) -> None:
        self.clock += seconds

    def emit(self, event: dict[str, Any]) -> None:
        self.told.append(event)

    def api(self, method: str, **kwargs: Any) -> Any:
        assert method == "get_microvm"
        vm = kwargs["microvmIdentifier"]
        self.asked.append(vm)
        if isinstance(self.states[vm], Exception):
            raise self.states[vm]
        return {"state": self.states[vm], "startedAt": 0}


@dataclass
class _Admission:
    """Tokens of the watch's bucket as scripted: ``grants`` left now, then ``after`` (a Deferral)."""

    grants: int
    after: Optional[Deferral] = None
    asks: int = 0
    refusals: list[str] = field(default_factory=list)

    def refused(self, operation: str, failure: Any, now: float) -> Deferral:
        self.refusals.append(failure.code)
        return Deferral(operation, 1.0, f"error:{failure.code}")

    def admit(self, operation: str, now: float, want: int = 1) -> Any:
        assert operation == WATCH_OPERATION
        self.asks += 1
        if self.grants > 0:
            self.grants -= 1
            return Granted(operation, 1)
        deferral = self.after or Deferral(operation, 1.0, "budget_empty")
        if deferral.reason == "reserved":
            self.after = None  # the reserved token: granted once its time came
            self.grants = 1
        return deferral


@dataclass
class _Deadline:
    left: float = 30.0

    def reaches(self, seconds: float) -> bool:
        return seconds < self.left


def _looks(states: dict[str, str], admission: _Admission) -> tuple[Looks, _Shell]:
    shell = _Shell(states)
    return Looks(shell, admission, _Deadline(), set()), shell  # type: ignore[arg-type]


def _parked(*vm_ids: str) -> dict[str, core.Slot]:
    """Parked slots holding ``vm_ids``, as the watch is given them (by VM id)."""
    return {vm: core.Slot(f"warm-{i}", core.WARM, phase=core.PARKED, microvm_id=vm) for i, vm in enumerate(vm_ids)}


def test_a_take_is_kept_when_the_bucket_runs_dry_after_it() -> None:
    """The first VM looked at was taken: returned at once (the list that follows shows the others),
    with no token spent on the rest."""
    looks, shell = _looks({"a": "RUNNING", "b": "SUSPENDED"}, _Admission(grants=1))
    (seen,), read = looks.watch(_parked("a", "b"))
    assert seen.microvm_id == "a" and seen.state == "RUNNING" and shell.asked == ["a"] and read == [seen]
    assert looks.look("a", Source.PEEK) is not None


def test_the_next_watch_starts_where_a_dry_bucket_stopped_this_one() -> None:
    """Two parked VMs, one token: the first watch reads ``a``; the next starts with ``b`` (read
    longest ago: never), and sees its take."""
    admission = _Admission(grants=1)
    looks, shell = _looks({"a": "SUSPENDED", "b": "SUSPENDED"}, admission)
    assert looks.watch(_parked("a", "b"))[0] == [] and shell.asked == ["a"]
    shell.states["b"] = "RUNNING"
    admission.grants = 1
    shell.clock += 5
    (seen,), _ = looks.watch(_parked("a", "b"))
    assert seen.microvm_id == "b" and shell.asked == ["a", "b"]


def test_a_token_reserved_a_moment_ahead_is_waited_for() -> None:
    """The bucket reserves the token 0.4 s ahead: the watch waits for it and looks."""
    admission = _Admission(grants=0, after=Deferral(WATCH_OPERATION, 0.4, "reserved"))
    looks, shell = _looks({"a": "RUNNING"}, admission)
    (seen,), _ = looks.watch(_parked("a"))
    assert seen.microvm_id == "a" and shell.clock == pytest.approx(100.4)


def test_a_token_reserved_past_the_ticks_bound_is_not_waited_for() -> None:
    admission = _Admission(grants=0, after=Deferral(WATCH_OPERATION, 0.4, "reserved"))
    looks, shell = _looks({"a": "RUNNING"}, admission)
    looks.deadline = _Deadline(left=0.2)  # type: ignore[assignment]
    assert looks.watch(_parked("a")) == ([], []) and shell.asked == [] and shell.clock == 100.0


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetMicrovm")


def test_a_vm_the_service_no_longer_knows_is_a_change() -> None:
    looks, _ = _looks({"a": _client_error("ResourceNotFoundException", 404)}, _Admission(grants=1))
    (seen,), _ = looks.watch(_parked("a"))
    assert seen.state == core.GONE and seen.reason == "not_found"


@pytest.mark.parametrize("error", [_client_error("ThrottlingException", 429), EndpointConnectionError(endpoint_url="x")])
def test_a_failed_look_ends_the_watch_keeping_nothing_unread(error) -> None:
    """A throttle (told to the budget: every reconciler backs off) or a dropped connection (told):
    the watch stops there; the VM after it is not asked about."""
    admission = _Admission(grants=2)
    looks, shell = _looks({"a": error, "b": "RUNNING"}, admission)
    assert looks.watch(_parked("a", "b")) == ([], []) and shell.asked == ["a"]
    if isinstance(error, ClientError):
        assert admission.refusals == ["ThrottlingException"]
    else:
        assert [e["operation"] for e in shell.told] == ["GetMicrovm"]
