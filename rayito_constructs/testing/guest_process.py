"""A process a stand-in VM runs (``ProcessService.Start``), and the process trees of a VM.

Output is always drained, whether a client listens or not (a background process whose stream the
client cancelled must keep running, and a full pipe would block it): every chunk goes to the
VM's log file and to a bounded in-memory list the ``Start`` stream reads from.
Freezing (``SIGSTOP``), thawing (``SIGCONT``) and killing (``SIGKILL``) act on every descendant
of a VM's processes, found through ``/proc``: the agent host starts the app in a session of its
own (``agent_host/process.py``), so process groups alone would miss it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

#: Chunks of output a process keeps for readers (older ones are only in the log file).
KEPT_CHUNKS = 4096
_LOG = logging.getLogger(__name__)
_PPID = re.compile(r"^PPid:\s+(\d+)", re.MULTILINE)


class GuestProcess:
    """One started process: its ``Popen``, its output and how it ended."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, tag: str = "",
                 timeout_ms: int = 0, description: str = "") -> None:
        self.tag = tag
        self.description = description or " ".join(argv)
        self.started_at = time.time()
        self._cond = threading.Condition()
        self._chunks: collections.deque[tuple[int, bytes, bytes]] = collections.deque(maxlen=KEPT_CHUNKS)
        self._seq = 0
        self.exit_code: Optional[int] = None
        self.signal: Optional[int] = None
        self.timed_out = False
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab", buffering=0)  # noqa: SIM115 - closed when the process ends
        cwd.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
        self.pid = self.popen.pid
        self._readers = [
            threading.Thread(target=self._drain, args=(self.popen.stdout, True), daemon=True, name=f"rayd-out-{self.pid}"),
            threading.Thread(target=self._drain, args=(self.popen.stderr, False), daemon=True, name=f"rayd-err-{self.pid}"),
        ]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._reap, args=(timeout_ms,), daemon=True, name=f"rayd-wait-{self.pid}").start()

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def _drain(self, pipe: object, is_stdout: bool) -> None:
        assert pipe is not None
        while True:
            data = pipe.read1(65536)  # type: ignore[attr-defined]
            if not data:
                break
            with contextlib.suppress(OSError, ValueError):
                self._log.write(data)
            with self._cond:
                self._seq += 1
                self._chunks.append((self._seq, data if is_stdout else b"", b"" if is_stdout else data))
                self._cond.notify_all()

    def _reap(self, timeout_ms: int) -> None:
        try:
            code = self.popen.wait(timeout=timeout_ms / 1000 if timeout_ms > 0 else None)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            kill_trees([self.pid])
            code = self.popen.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        with self._cond:
            if code < 0:
                self.signal, self.exit_code = -code, 128 - code
            else:
                self.exit_code = code
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            self._log.close()

    def events(self, active: Callable[[], bool], *, poll_seconds: float = 0.2) -> Iterator[tuple[str, object]]:
        """``("data", (seq, stdout, stderr))`` for every chunk, then ``("end", None)`` once the
        process ended; stops early when ``active()`` turns false (the client cancelled)."""
        seen = 0
        while True:
            with self._cond:
                fresh = [chunk for chunk in self._chunks if chunk[0] > seen]
                ended = self.exit_code is not None
                if not fresh and not ended:
                    self._cond.wait(poll_seconds)
                    fresh = [chunk for chunk in self._chunks if chunk[0] > seen]
                    ended = self.exit_code is not None
            for chunk in fresh:
                seen = chunk[0]
                yield "data", chunk
            if ended and not fresh:
                yield "end", None
                return
            if not active():
                return

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.exit_code is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left if left is not None else 1.0)
            return self.exit_code


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them (through ``PPid`` in ``/proc``)."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as handle:
                match = _PPID.search(handle.read())
        except OSError:
            continue
        if match:
            parent[int(entry.name)] = int(match.group(1))
    found = {pid for pid in roots if pid in parent}
    frontier = set(found)
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def signal_trees(roots: Iterable[int], signum: int) -> set[int]:
    """Send ``signum`` to every process of the trees; returns the pids signalled."""
    pids = descendants(roots)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    return pids


def kill_trees(roots: Iterable[int]) -> set[int]:
    """``SIGSTOP`` the trees first (nothing forks meanwhile), then ``SIGKILL`` them."""
    roots = list(roots)
    stopped = signal_trees(roots, signal.SIGSTOP)
    for pid in stopped | descendants(stopped):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def stop_trees(roots: Iterable[int], *, timeout: float = 5.0) -> set[int]:
    """``SIGSTOP`` the trees and return once every process signalled is :func:`frozen`.

    ``kill`` only queues the signal: a sleeping process wakes (``R``) to take it and stops when
    next scheduled, which on a loaded machine can be after the VM already reports SUSPENDED. A
    suspended VM runs nothing, so the freeze waits, ``timeout`` at most."""
    roots = list(roots)
    pids = signal_trees(roots, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    waiting = set(pids)
    while waiting:
        waiting = {pid for pid in waiting if not frozen(pid)}
        if not waiting:  # what forked while the trees were read is stopped too, until nothing new
            born = descendants(roots) - pids
            for pid in born:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            pids |= born
            waiting = born
        if waiting and time.monotonic() >= deadline:
            _LOG.warning("guest processes %s not stopped %.1f s after SIGSTOP", sorted(waiting), timeout)
            break
        if waiting:
            time.sleep(0.005)
    return pids


_SIGSTOP_BIT = 1 << (signal.SIGSTOP - 1)
_PENDING = re.compile(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", re.MULTILINE)


def frozen(pid: int) -> bool:
    """The process runs no more code of its own: stopped (``T``, ``t``), ended (``Z``, ``X``,
    gone), or waiting in the kernel (``D``) with ``SIGSTOP`` pending, which it takes before it
    returns to user space (a parent in ``vfork`` waits so until its child execs, and a stopped
    child never does)."""
    state = process_state(pid)
    if state in (None, "T", "t", "Z", "X"):
        return True
    if state != "D":
        return False
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            masks = _PENDING.findall(handle.read())
    except OSError:
        return True
    return any(int(mask, 16) & _SIGSTOP_BIT for mask in masks)


def process_state(pid: int) -> Optional[str]:
    """The one-letter state in ``/proc/<pid>/stat`` (``T`` stopped, ``S``/``R`` running...)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
