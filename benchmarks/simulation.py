"""A discrete-event simulation on the emulator's virtual clock, where code that sleeps really waits.

Each *task* (a Lambda invocation, a client's session) runs in a thread of its own, but only one
thread runs at a time: the scheduler resumes the task due next, and the task runs until it sleeps
(``SimClock.sleep_until``: the reconciler's own waits, botocore's retry back-off, a request the
emulator holds) or ends. So production code runs unchanged (its real sleeps, its real clients),
each caller pays for its own waits without moving anyone else's time, and a day of virtual time
takes as long as the work in it.
"""

from __future__ import annotations

import heapq
import threading
from typing import Any, Callable, Optional

from rayito_constructs.testing import VirtualClock


class Killed(BaseException):
    """A Lambda invocation killed mid-tick (timeout, out of memory): no ``finally`` writes either."""


class Task:
    __slots__ = ("fn", "name", "worker", "killed", "done")

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.worker: Optional["_Worker"] = None
        self.killed = False
        self.done = False


class _Worker:
    """A pooled thread that runs tasks handed to it, one at a time, in lock-step with the scheduler."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim
        self.task: Optional[Task] = None
        self.go = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._loop, daemon=True, name="sim-worker")
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.go.acquire()
            task = self.task
            if task is None:
                return  # shut down
            self.sim._local.task = task
            try:
                task.fn()
            except Killed:
                pass
            except BaseException as exc:  # noqa: BLE001 - surfaced by the scheduler
                self.sim.errors.append((task.name, exc))
            task.done = True
            self.task = None
            self.sim._local.task = None
            self.sim._idle.append(self)
            self.sim._back.release()


class Simulation:
    """Tasks and callbacks on a virtual clock, in time order (ties in the order they were added)."""

    def __init__(self, clock: "SimClock") -> None:
        self.clock = clock
        clock.sim = self
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._back = threading.Semaphore(0)
        self._idle: list[_Worker] = []
        self._workers: list[_Worker] = []
        self._local = threading.local()
        self.errors: list[tuple[str, BaseException]] = []

    # ------------------------------------------------------------------ scheduling

    def call_at(self, at: float, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in the scheduler at ``at`` (bookkeeping: it must not call the emulator)."""
        self._push(at, "call", fn)

    def spawn_at(self, at: float, fn: Callable[[], Any], name: str = "task") -> Task:
        """Start ``fn`` as a task at ``at``."""
        task = Task(fn, name)
        self._push(at, "task", task)
        return task

    def kill(self, task: Task) -> None:
        """``task`` raises :class:`Killed` when it next wakes (or at once if it has not started)."""
        task.killed = True

    def _push(self, at: float, kind: str, item: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, item))

    @property
    def current(self) -> Optional[Task]:
        return getattr(self._local, "task", None)

    def now(self) -> float:
        return self.clock.now()

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            at, _, kind, item = heapq.heappop(self._heap)
            self.clock.advance_to(at)
            if kind == "call":
                item()
            else:
                self._resume(item)
            if self.errors:
                name, exc = self.errors[0]
                raise RuntimeError(f"task {name} failed: {exc!r}") from exc
        self.clock.advance_to(until)

    def _resume(self, task: Task) -> None:
        if task.done:
            return
        if task.worker is None:
            if task.killed:
                task.done = True
                return
            worker = self._idle.pop() if self._idle else self._new_worker()
            worker.task, task.worker = task, worker
        task.worker.go.release()
        self._back.acquire()  # until the task sleeps or ends

    def _new_worker(self) -> _Worker:
        worker = _Worker(self)
        self._workers.append(worker)
        return worker

    def sleep_until(self, when: float) -> None:
        """Called from a task: wait (in virtual time) until ``when``."""
        task = self.current
        if task is None:
            self.clock.advance_to(when)  # not in a task: one timeline
            return
        if when > self.clock.now():
            self._push(when, "task", task)
            worker = task.worker
            self._back.release()
            worker.go.acquire()
        if task.killed:
            raise Killed(task.name)

    def close(self) -> None:
        for worker in self._workers:
            if worker.task is None:
                worker.go.release()


class SimClock(VirtualClock):
    """The virtual clock of a :class:`Simulation`: a sleep in a task yields to the scheduler."""

    sim: Optional[Simulation] = None

    def sleep_until(self, when: float) -> None:
        if self.sim is None:
            super().sleep_until(when)
        else:
            self.sim.sleep_until(when)
