"""Egress budgets under load: N processes send requests to one target through one shared envelope.

    .venv/bin/python -m benchmarks.egress [--processes 1 2 4 8 16 32] [--seconds 5] [--rate 20]
                                          [--burst 5] [--skew 0] [--json | --markdown]

Each worker process sends HTTP requests as fast as the budget lets it (``requests`` through
``budget_session``, a deferred request waiting the ``retry_after_seconds`` it was given) to a
local HTTP target, through ``BudgetClient`` on a moto DynamoDB server (real HTTP, real boto3,
the production store client). Every worker first imports everything, makes its client and warms
it up (one acquire: the envelope read once, the store's clock learnt), then waits at a barrier;
the window starts after the barrier, so every worker is inside it and the numbers are the steady
state.

Counted where it happened, not by the code under test: grants are the requests the target
received; store calls are the requests the store answered (per operation). A row is only judged
(``within_envelope``) when its window is sound: every worker made its first decision within the
first tenth of the window and did work; otherwise ``window_ok`` is false and
``within_envelope`` is null. ``--skew S`` spreads the workers' clocks over [-S, +S] seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import time
from typing import Any

TARGET_PATH = "/v1/items"


def worker(endpoint: str, table: str, target: str, rate: float, burst: int, skew: float, barrier: Any, start: Any,
           seconds: float, results: Any) -> None:
    from rayito_constructs.egress import BudgetClient, EgressDeferred, Envelope, budget_session
    from tests.egress_support import ddb

    client = BudgetClient(table, ddb(endpoint, read_timeout=5.0), envelopes=[Envelope(target, rate, burst)],
                          clock=lambda: time.time() + skew)
    session = budget_session(client)
    # Warm up outside the window: the envelope read (or created) once, the store's clock learnt.
    client.acquire(f"{target}{TARGET_PATH}")
    if client._calibrating is not None:
        client._calibrating.join(timeout=30)
    barrier.wait(timeout=600)
    while start.value == 0.0:
        time.sleep(0.001)
    begin, end = start.value, start.value + seconds
    while time.time() < begin:
        time.sleep(0.0005)
    first = None
    sent = deferred = 0
    reasons: dict[str, int] = {}
    while True:
        now = time.time()
        if now >= end:
            break
        first = first if first is not None else now
        try:
            session.get(f"{target}{TARGET_PATH}", timeout=10)
            sent += 1
        except EgressDeferred as exc:
            deferred += 1
            reasons[exc.deferral.reason] = reasons.get(exc.deferral.reason, 0) + 1
            time.sleep(max(0.0, min(exc.deferral.retry_after_seconds, end - time.time())))
    s = client.stats
    bounds = client._time.bounds(client._clock()) if client._time is not None else None
    results.put({"clock_doubt": None if bounds is None else bounds[1] - bounds[0], "first": first, "sent": sent, "deferred": deferred, "reasons": reasons, "calls": s.calls,
                 "cache_denials": s.cache_denials, "skew": skew})


def max_in_window(times: list[float], length: float) -> int:
    times = sorted(times)
    best, j = 0, 0
    for i in range(len(times)):
        while times[i] - times[j] > length:
            j += 1
        best = max(best, i - j + 1)
    return best


def run(processes: int, seconds: float, rate: float, burst: int, skew: float) -> dict[str, Any]:
    from rayito_constructs.egress import BudgetClient
    from tests.egress_support import Upstream, counting_store, ddb

    ctx = multiprocessing.get_context("spawn")
    upstream = Upstream()
    try:
        with counting_store() as store:
            table = f"egress-{processes}-{time.time_ns()}"
            BudgetClient.create_table(ddb(store.endpoint), table)
            barrier, start, results = ctx.Barrier(processes + 1), ctx.Value("d", 0.0), ctx.Queue()
            skews = [0.0] if processes == 1 else [skew * (2 * i / (processes - 1) - 1) for i in range(processes)]
            workers = [ctx.Process(target=worker, args=(store.endpoint, table, upstream.url, rate, burst, skews[i],
                                                         barrier, start, seconds, results), daemon=True)
                       for i in range(processes)]
            for w in workers:
                w.start()
            barrier.wait(timeout=600)  # every worker has its client: the window starts after this
            time.sleep(1.5)  # the workers' clients learn the store's time in the background meanwhile
            before = store.snapshot()
            begin = time.time() + 0.2
            start.value = begin
            out = []
            for _ in workers:
                try:
                    out.append(results.get(timeout=seconds + 120))
                except queue.Empty:
                    break
            after = store.snapshot()
            for w in workers:
                w.join(timeout=30)
                if w.is_alive():
                    w.kill()
    finally:
        upstream.close()
    end = begin + seconds
    arrivals = [t for _, _, t in upstream.seen]
    inside = [t for t in arrivals if begin <= t <= end + 1.0]
    grants = len(inside)
    deferrals = sum(r["deferred"] for r in out)
    calls = sum((after - before).values())
    late = [r for r in out if r["first"] is None or r["first"] > begin + 0.1 * seconds]
    idle = [r for r in out if r["sent"] + r["deferred"] == 0]
    window_ok = len(out) == processes and not late and not idle
    bound = rate * seconds + burst
    reasons: dict[str, int] = {}
    for r in out:
        for k, v in r["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    return {
        "processes": processes,
        "seconds": seconds,
        "envelope": f"{rate:g}/s burst {burst}",
        "skew_seconds": skew,
        "window_ok": window_ok,
        "workers_reported": len(out),
        "late_or_idle_workers": len(late) + len(idle),
        "grants_at_target": grants,
        "envelope_bound": bound,
        "within_envelope": (grants <= bound) if window_ok else None,
        "used_of_bound": round(grants / bound, 3) if window_ok else None,
        "max_in_any_second": max_in_window(inside, 1.0),
        "max_allowed_in_a_second": rate + burst,
        "deferrals": deferrals,
        "store_clock_doubt_ms_max": round(1000 * max((r["clock_doubt"] or 0.0) for r in out), 1) if out else None,
        "deferral_reasons": reasons,
        "store_calls": calls,
        "store_calls_by_operation": dict(after - before),
        "store_calls_per_grant": round(calls / grants, 3) if grants else None,
        "store_calls_per_denial": round(max(0, calls - grants) / deferrals, 3) if deferrals else None,
        "store_calls_per_process_per_token": round(calls / (processes * grants), 3) if grants else None,
        "local_buckets_would_allow": processes * bound,
    }


COLUMNS = ["processes", "skew_seconds", "window_ok", "grants_at_target", "envelope_bound", "within_envelope",
           "used_of_bound", "max_in_any_second", "store_calls_per_grant", "store_calls_per_denial", "deferrals",
           "local_buckets_would_allow"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=5)
    parser.add_argument("--skew", type=float, default=0.0)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true")
    output.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in args.processes:
        rows.append(run(n, args.seconds, args.rate, args.burst, args.skew))
        if not args.json and not args.markdown:
            print(json.dumps({k: rows[-1][k] for k in COLUMNS}), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for row in rows:
            print("| " + " | ".join(str(row[k]) for k in COLUMNS) + " |")


if __name__ == "__main__":
    main()
