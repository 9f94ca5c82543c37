"""Requests per second the MicroVMs emulator answers on this machine, real and virtual clock.

    .venv/bin/python -m benchmarks.emulator [--requests 2000] [--threads 1 4] [--fleet 200] [--json]

Real boto3 clients over HTTP on 127.0.0.1 (one client per thread, keep-alive), rate limits off so
the server itself is measured, with the measured defaults otherwise (late reads included). The mix
is what a reconciler sends: ListMicrovms pages over a fleet of ``--fleet`` VMs, GetMicrovm, and
RunMicrovm + TerminateMicrovm pairs. The last row is a boto3 client handing its requests to the
emulator in process (``client(in_process=True)``: what ``benchmarks/reconciler.py`` uses). Besides
requests per second of wall time, requests per CPU-second of the process: the machine is shared,
and the second figure moves less with what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import boto3
from botocore.config import Config

from rayito_constructs.testing import MicrovmsEmulator, RealClock, VirtualClock


def _client(endpoint: str) -> Any:
    return boto3.client(
        "lambda-microvms", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="x",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=4),
    )


def run(clock_name: str, threads: int, requests: int, fleet: int, in_process: bool = False) -> dict[str, Any]:
    clock = VirtualClock() if clock_name == "virtual" else RealClock()
    with MicrovmsEmulator(clock=clock, rate_limits=False, pending_seconds=0, seed=1) as emu:
        image = emu.create_image("bench", 512)
        setup = _client(emu.endpoint_url)
        ids = [setup.run_microvm(imageIdentifier=image)["microvmId"] for _ in range(fleet)]
        if isinstance(clock, VirtualClock):
            clock.advance(1)  # past the late-read window, so lists hold the fleet
        per_thread = requests // threads
        counts = {"ListMicrovms": 0, "GetMicrovm": 0, "RunMicrovm": 0, "TerminateMicrovm": 0}
        lock = threading.Lock()

        def work(n: int) -> None:
            client = emu.client(in_process=True, max_pool_connections=4) if in_process else _client(emu.endpoint_url)
            local = dict.fromkeys(counts, 0)
            for i in range(n):
                kind = i % 4
                if kind == 0:
                    client.list_microvms(imageIdentifier=image, maxResults=50)
                    local["ListMicrovms"] += 1
                elif kind in (1, 2):
                    client.get_microvm(microvmIdentifier=ids[i % len(ids)])
                    local["GetMicrovm"] += 1
                else:
                    vm = client.run_microvm(imageIdentifier=image)["microvmId"]
                    client.terminate_microvm(microvmIdentifier=vm)
                    local["RunMicrovm"] += 1
                    local["TerminateMicrovm"] += 1
            with lock:
                for k, v in local.items():
                    counts[k] += v

        workers = [threading.Thread(target=work, args=(per_thread,)) for _ in range(threads)]
        start, cpu = time.perf_counter(), time.process_time()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    total = sum(counts.values())
    return {"clock": clock_name + (" in-process" if in_process else ""), "threads": threads, "requests": total,
            "seconds": round(elapsed, 3), "requests_per_second": round(total / elapsed),
            "requests_per_cpu_second": round(total / cpu), "fleet": fleet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--fleet", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [run(c, t, args.requests, args.fleet) for c in ("real", "virtual") for t in args.threads]
    rows.append(run("virtual", 1, args.requests, args.fleet, in_process=True))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'clock':20}{'threads':>8}{'requests':>10}{'seconds':>9}{'req/s':>8}{'req/cpu-s':>11}")
    for r in rows:
        print(f"{r['clock']:20}{r['threads']:>8}{r['requests']:>10}{r['seconds']:>9.2f}{r['requests_per_second']:>8}"
              f"{r['requests_per_cpu_second']:>11}")


if __name__ == "__main__":
    main()
