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


def test_a_take_is_kept_when_the_bucket_runs_dry_after_it() -> None:
    """The first VM looked at was taken: returned at once (the list that follows shows the others),
    with no token spent on the rest."""
    looks, shell = _looks({"a": "RUNNING", "b": "SUSPENDED"}, _Admission(grants=1))
    (seen,) = looks.watch(["a", "b"])
    assert seen.microvm_id == "a" and seen.state == "RUNNING" and shell.asked == ["a"]
    assert looks.look("a", Source.PEEK) is not None


def test_the_next_watch_starts_where_a_dry_bucket_stopped_this_one() -> None:
    """Two parked VMs, one token: the first watch reads ``a``; the next starts with ``b`` (read
    longest ago: never), and sees its take."""
    admission = _Admission(grants=1)
    looks, shell = _looks({"a": "SUSPENDED", "b": "SUSPENDED"}, admission)
    assert looks.watch(["a", "b"]) == [] and shell.asked == ["a"]
    shell.states["b"] = "RUNNING"
    admission.grants = 1
    shell.clock += 5
    (seen,) = looks.watch(["a", "b"])
    assert seen.microvm_id == "b" and shell.asked == ["a", "b"]


def test_a_token_reserved_a_moment_ahead_is_waited_for() -> None:
    """The bucket reserves the token 0.4 s ahead: the watch waits for it and looks."""
    admission = _Admission(grants=0, after=Deferral(WATCH_OPERATION, 0.4, "reserved"))
    looks, shell = _looks({"a": "RUNNING"}, admission)
    (seen,) = looks.watch(["a"])
    assert seen.microvm_id == "a" and shell.clock == pytest.approx(100.4)


def test_a_token_reserved_past_the_ticks_bound_is_not_waited_for() -> None:
    admission = _Admission(grants=0, after=Deferral(WATCH_OPERATION, 0.4, "reserved"))
    looks, shell = _looks({"a": "RUNNING"}, admission)
    looks.deadline = _Deadline(left=0.2)  # type: ignore[assignment]
    assert looks.watch(["a"]) == [] and shell.asked == [] and shell.clock == 100.0


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetMicrovm")


def test_a_vm_the_service_no_longer_knows_is_a_change() -> None:
    looks, _ = _looks({"a": _client_error("ResourceNotFoundException", 404)}, _Admission(grants=1))
    (seen,) = looks.watch(["a"])
    assert seen.state == core.GONE and seen.reason == "not_found"


@pytest.mark.parametrize("error", [_client_error("ThrottlingException", 429), EndpointConnectionError(endpoint_url="x")])
def test_a_failed_look_ends_the_watch_keeping_nothing_unread(error) -> None:
    """A throttle (told to the budget: every reconciler backs off) or a dropped connection (told):
    the watch stops there; the VM after it is not asked about."""
    admission = _Admission(grants=2)
    looks, shell = _looks({"a": error, "b": "RUNNING"}, admission)
    assert looks.watch(["a", "b"]) == [] and shell.asked == ["a"]
    if isinstance(error, ClientError):
        assert admission.refusals == ["ThrottlingException"]
    else:
        assert [e["operation"] for e in shell.told] == ["GetMicrovm"]
