"""One MicroVM's lifecycle: its states, what moves it, and when (timings in ``measured.py``).

    RunMicrovm -> PENDING -> RUNNING <-> (SuspendMicrovm or idle) SUSPENDING -> SUSPENDED
    SUSPENDED -> (ResumeMicrovm, or traffic with autoResumeEnabled) -> PENDING once /resume returns
              (serving already; measured: GetMicrovm still said PENDING 0.1-0.5 s later) -> RUNNING
    any live state -> (TerminateMicrovm, maximum duration, app exit, failed /suspend hook,
                       idle suspended too long) -> TERMINATING -> TERMINATED

State is computed lazily from the clock: :func:`advance` applies every transition due by ``now``
in time order, so the emulator needs no timers, and a clock moved by a day does a day's work on the
next read. Every transition is kept in ``history`` (for consistent-but-late reads and for
benchmarks that want ground truth).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import measured
from .images import Image, ImageVersion
from .measured import Timings

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
ENDED = ("TERMINATING", "TERMINATED")
#: Not a state: the product's rayd exits at its logical deadline (the VM then ends as one whose
#: PID 1 exited, ``Container Stopped with Exit Code: 124``, the product's "timed out").
RAYD_EXIT = "rayd_exit"
RAYD_TIMEOUT_EXIT_CODE = 124
#: A VM resumed after its deadline gets this long before rayd exits (the stand-in's, assumed: Q5).
RAYD_RESUME_GRACE_SECONDS = 30.0


@dataclass(eq=False)
class Microvm:
    id: str
    endpoint: str
    image: Image
    version: ImageVersion
    started_at: float
    max_duration: int
    request: dict[str, Any]
    launch_seconds: float
    caller: Optional[str] = None
    """Who started it: the access key id of the request (see ``docs/testing.md``)."""
    idle: Optional[dict[str, Any]] = None
    state: str = "PENDING"
    since: float = 0.0
    reason: Optional[str] = None
    terminated_at: Optional[float] = None
    last_activity: float = 0.0
    resume_at: Optional[float] = None
    resumed: bool = False
    """PENDING after a resume (its ``/resume`` hook returned): it serves already, and turns RUNNING
    ``resume_pending`` later, not a launch later."""
    exit_at: Optional[float] = None
    exit_reason: Optional[str] = None
    suspend_hook_status: Optional[int] = None
    history: list[tuple[float, str, Optional[str]]] = field(default_factory=list)
    rayd_deadline: Optional[float] = None
    """The product's logical deadline (its run payload's ``lifecycle``, ``on_timeout="kill"``):
    rayd exits then if the VM runs, or a grace after it next runs (modelled for VMs that are not
    hosted; a hosted VM's stand-in rayd enforces its own)."""
    idle_suspended_at: list[float] = field(default_factory=list)
    """When its idle policy suspended it (ground truth: the service shows any SUSPENDED VM alike).
    Such a VM still serves: with auto-resume, a request wakes it."""
    observer: Optional[Callable[["Microvm", float, str], None]] = None
    """Called after every transition, under the backend's lock (``vm_host.Guest.observe``: a
    hosted VM's processes follow its state). It must not call the backend or block."""

    @property
    def memory_mib(self) -> int:
        return self.version.memory_mib

    @property
    def image_version(self) -> str:
        return self.version.version

    @property
    def client_token(self) -> Optional[str]:
        return self.request.get("clientToken")

    def record(self, at: float, state: str, reason: Optional[str] = None) -> None:
        self.state, self.since = state, at
        if reason:
            self.reason = reason
        if state == "TERMINATED":
            self.terminated_at = at
        if state == "RUNNING":
            if not self.resumed:  # a resumed VM's idle time counts from its hook's return (below)
                self.last_activity = at
            self.resume_at = None
            self.resumed = False
        self.history.append((at, state, self.reason))
        if self.observer is not None:
            self.observer(self, at, state)

    def seen_at(self, at: float) -> tuple[str, Optional[str], Optional[float]]:
        """State, reason and end time as the service's replicas knew them at ``at``."""
        if at >= self.since:
            return self.state, self.reason, self.terminated_at
        state, reason, ended = self.history[0][1], self.history[0][2], None
        for when, s, r in self.history:
            if when > at:
                break
            state, reason = s, r
            ended = when if s == "TERMINATED" else None
        return state, reason, ended


def next_event(vm: Microvm, t: Timings) -> Optional[tuple[float, str, Optional[str]]]:
    """The next transition due for ``vm`` (time, state, reason), or None."""
    if vm.state == "TERMINATED":
        return None
    if vm.state == "TERMINATING":
        return (vm.since + t.terminating, "TERMINATED", None)
    # maximumDurationInSeconds counts suspended time too (GT §5: "running + suspended").
    candidates = [(max(vm.started_at + vm.max_duration, vm.since), "TERMINATING", measured.REASON_MAX_LIFETIME)]
    if vm.exit_at is not None:
        # The app exited: RUNNING for about 15 s more, as measured (Q58/Q63).
        candidates.append((max(vm.exit_at + t.app_exit_report, vm.since), "TERMINATING", vm.exit_reason))
    elif vm.rayd_deadline is not None and vm.state == "RUNNING":
        # rayd (PID 1) exits at its deadline; resumed after it, a grace later (vm_host.RESUME_GRACE_MS).
        late = vm.since > vm.rayd_deadline
        candidates.append((vm.since + RAYD_RESUME_GRACE_SECONDS if late else vm.rayd_deadline, RAYD_EXIT, None))
    if vm.state == "PENDING":
        candidates.append((vm.since + (t.resume_pending if vm.resumed else vm.launch_seconds), "RUNNING", None))
    elif vm.state == "RUNNING" and vm.idle:
        candidates.append((vm.last_activity + vm.idle["maxIdleDurationSeconds"], "SUSPENDING", None))
    elif vm.state == "SUSPENDING":
        if vm.suspend_hook_status is not None:
            reason = measured.REASON_SUSPEND_HOOK.format(status=vm.suspend_hook_status)
            candidates.append((vm.since + t.suspend_hook_failure, "TERMINATING", reason))
        else:
            candidates.append((vm.since + t.suspending, "SUSPENDED", None))
    elif vm.state == "SUSPENDED":
        if vm.resume_at is not None:
            candidates.append((max(vm.resume_at, vm.since), "PENDING", None))
        elif vm.idle:
            candidates.append((vm.since + vm.idle["suspendedDurationSeconds"], "TERMINATING", measured.REASON_IDLE))
    return min(candidates, key=lambda c: c[0])


def advance(vm: Microvm, now: float, t: Timings) -> None:
    """Apply every transition due by ``now``, in time order."""
    for _ in range(64):  # a lifecycle has fewer transitions than this between two reads
        event = next_event(vm, t)
        if event is None or event[0] > now:
            return
        at, state, reason = event
        if state == "TERMINATING" and vm.state == "SUSPENDING":
            vm.suspend_hook_status = None
        if state == "PENDING" and vm.state == "SUSPENDED":
            vm.resumed = True  # the /resume hook returned: serving, the control plane says PENDING
            vm.last_activity = at
        if state == RAYD_EXIT:
            vm.exit_at, vm.exit_reason = at, measured.REASON_APP_EXIT.format(code=RAYD_TIMEOUT_EXIT_CODE)
            continue
        if state == "SUSPENDING":  # only its idle policy suspends a VM here (SuspendMicrovm is a call)
            vm.idle_suspended_at.append(at)
        vm.record(at, state, reason)
