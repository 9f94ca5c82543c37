"""Real processes on one target through moto over HTTP, with the store's real clock: skewed
clocks (30 s both ways) and a process killed and replaced mid-window take no token that is not
there. Asserted on each grant's true time, not on the processes' counters."""

from __future__ import annotations

import multiprocessing
import queue
import time
import uuid
from typing import Any, Iterator

import pytest

from rayito_constructs.egress import BudgetClient

from .egress_support import conforms, counting_store, ddb, hammer

API = "https://api.example.com"
RATE, BURST = 5.0, 3


@pytest.fixture(scope="module")
def store() -> Iterator:
    with counting_store() as s:
        yield s


def collect(results: Any, workers: int, timeout: float = 300) -> tuple[list[tuple[float, float]], list[Any]]:
    grants, done = [], []
    deadline = time.monotonic() + timeout
    while len(done) < workers:
        try:
            kind, *rest = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"{workers - len(done)} worker(s) did not finish") from None
        if kind == "grant":
            grants.append((rest[0], rest[1]))
        elif kind == "done":
            done.append(rest)
        else:
            raise AssertionError(f"the store was unavailable to a worker: {kind}")
    return grants, done


ENOUGH = 3 * BURST  # the burst and twice as many refills: then the run ends, however long it took


def run(store, skews: list[float], seconds: float = 120.0) -> list[tuple[float, float]]:
    ctx = multiprocessing.get_context("spawn")
    table = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), table)
    barrier, start, results = ctx.Barrier(len(skews) + 1), ctx.Value("d", 0.0), ctx.Queue()
    granted = ctx.Value("i", 0)
    procs = [ctx.Process(target=hammer, args=(store.endpoint, table, API, RATE, BURST, skew, barrier, start, seconds,
                                              results, None, granted, ENOUGH), daemon=True) for skew in skews]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=300)  # every process has imported everything
        start.value = time.time() + 1.0
        grants, _ = collect(results, len(procs))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return grants


@pytest.mark.parametrize("skews", [[0.0, 30.0, -30.0], [0.4, -0.7, 3.0]], ids=["30s-both-ways", "sub-second"])
def test_skewed_processes_take_no_token_that_is_not_there(store, skews) -> None:
    grants = run(store, skews)
    # Each grant is known only within (sent, answered); a round trip of slack, no more.
    assert conforms(grants, rate=RATE, burst=BURST) is None
    # The run goes on until enough was granted (how fast depends on this machine, which no test
    # here asserts: test_egress.py measures use of the envelope in virtual time).
    assert len(grants) >= ENOUGH


def test_a_process_killed_and_replaced_mid_window_gets_no_fresh_burst(store) -> None:
    ctx = multiprocessing.get_context("spawn")
    table = f"egress-{uuid.uuid4().hex[:8]}"
    BudgetClient.create_table(ddb(store.endpoint), table)
    # One queue each: a process killed while it writes to a queue leaves that queue locked.
    barrier, start, go = ctx.Barrier(3), ctx.Value("d", 0.0), ctx.Event()
    results, replacement = ctx.Queue(), ctx.Queue()
    first = ctx.Process(target=hammer, args=(store.endpoint, table, API, RATE, BURST, 0.0, barrier, start, 30.0, results),
                        daemon=True)
    second = ctx.Process(target=hammer, args=(store.endpoint, table, API, RATE, BURST, 0.0, barrier, start, 2.0,
                                              replacement, go), daemon=True)
    first.start()
    second.start()
    grants: list[tuple[float, float]] = []
    try:
        barrier.wait(timeout=300)
        start.value = time.time() + 0.5
        deadline = time.monotonic() + 300
        while len(grants) < BURST + 3:  # mid-window: the burst spent, tokens coming at the rate
            assert time.monotonic() < deadline, "the first process got no grants"
            kind, *rest = results.get(timeout=300)
            if kind == "grant":
                grants.append((rest[0], rest[1]))
        first.kill()  # no goodbye, no flush: a VM that died
        first.join(timeout=30)
        killed_at = time.time()
        start.value = killed_at  # the replacement starts at once, mid-window
        go.set()
        more, _ = collect(replacement, 1)
        grants += more
    finally:
        for p in (first, second):
            if p.is_alive():
                p.kill()
            p.join(timeout=30)
    assert conforms(grants, rate=RATE, burst=BURST) is None
    # Nothing the replacement wrote changed the envelope: a restart is no new version.
    assert [h["version"] for h in BudgetClient(table, ddb(store.endpoint), calibrate=False).envelopes(API)] == [0]
