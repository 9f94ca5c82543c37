"""Egress budgets under load: N processes on one target through one shared envelope, beside
per-process local buckets.

    .venv/bin/python -m benchmarks.egress [--processes 1 2 4 8] [--seconds 3] [--rate 20] [--burst 5] [--json]

Each worker process takes tokens for the same target as fast as it can for ``--seconds``, through
``BudgetClient`` on a moto DynamoDB server (real HTTP, real boto3) started here on 127.0.0.1.
Reported per N: decisions per second, grants per second reaching the target (and the envelope's
bound ``rate x seconds + burst``), store calls per grant and per denial, store writes per grant,
and what N local token buckets (one per process, the cheap and wrong design) would let through.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from typing import Any

TARGET = "https://api.example.com"


def worker(endpoint: str, table: str, rate: float, burst: float, seconds: float, start_at: float, queue: Any) -> None:
    import boto3

    from rayito_constructs.egress import BudgetClient, Envelope, Granted

    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    client = BudgetClient(table, ddb, envelopes=[Envelope(TARGET, rate, burst)])
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    grants = decisions = 0
    while time.time() < end:
        decision = client.acquire(f"{TARGET}/v1/items")
        decisions += 1
        if isinstance(decision, Granted):
            grants += 1
    s = client.stats
    queue.put({"grants": grants, "decisions": decisions, "calls": s.calls, "writes": s.writes,
               "store_denials": s.denials, "cache_denials": s.cache_denials})


def run(processes: int, seconds: float, rate: float, burst: float) -> dict[str, Any]:
    import boto3
    from moto.server import ThreadedMotoServer

    from rayito_constructs.egress import BudgetClient
    from tests.moto_server import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x")
        table = f"egress-{processes}-{time.time_ns()}"
        BudgetClient.create_table(ddb, table)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        start_at = time.time() + 3.0  # every process starts together, after its imports
        workers = [ctx.Process(target=worker, args=(endpoint, table, rate, burst, seconds, start_at, queue))
                   for _ in range(processes)]
        for w in workers:
            w.start()
        results = [queue.get(timeout=120) for _ in workers]
        for w in workers:
            w.join()
    finally:
        server.stop()
    grants = sum(r["grants"] for r in results)
    store_denials = sum(r["store_denials"] for r in results)
    denial_calls = sum(r["calls"] for r in results) - grants  # calls that did not end in a grant
    refill_intervals = seconds * rate
    return {
        "processes": processes,
        "seconds": seconds,
        "envelope": f"{rate:g}/s burst {burst:g}",
        "decisions_per_second": round(sum(r["decisions"] for r in results) / seconds),
        "grants_per_second": round(grants / seconds, 2),
        "grants": grants,
        "envelope_bound": rate * seconds + burst,
        "within_envelope": grants <= rate * seconds + burst,
        "store_writes_per_grant": round(sum(r["writes"] for r in results) / grants, 3) if grants else None,
        "store_calls_per_grant": round(sum(r["calls"] for r in results) / grants, 3) if grants else None,
        "store_calls_per_process_per_refill_interval_denying": round(denial_calls / (processes * refill_intervals), 3),
        "store_denials": store_denials,
        "cache_denials": sum(r["cache_denials"] for r in results),
        "local_buckets_would_allow": processes * (rate * seconds + burst),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--burst", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [run(n, args.seconds, args.rate, args.burst) for n in args.processes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    keys = ["processes", "decisions_per_second", "grants", "envelope_bound", "local_buckets_would_allow",
            "store_writes_per_grant", "store_calls_per_grant", "store_calls_per_process_per_refill_interval_denying"]
    print("  ".join(f"{k}" for k in keys))
    for row in rows:
        print("  ".join(f"{row[k]!s:>{len(k)}}" for k in keys))


if __name__ == "__main__":
    main()
