"""The reconciler benchmark over fleet counts and seeds, every run shown: the table of docs/performance.md.

    .venv/bin/python -m benchmarks.reconciler_table [--fleets 1 10 37 100 300] [--seeds 1 2 3 4 5]
        [--jobs 2] [--results results.jsonl] [--markdown]
    .venv/bin/python -m benchmarks.reconciler_table --pairs 33/1452575 1/5059040 --sides ours --hours 0.15

Each (fleets, seed, side) is ``python -m benchmarks.reconciler --fleets N --seed S --side SIDE
--json`` in a process of its own; results are appended to ``--results`` as they come (a run that
is already there is not repeated), so a long table can be stopped and resumed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from benchmarks.reconciler import _quantile

KEYS = [
    ("hours", "h"), ("convergence_seconds", "conv s"), ("lower_bound_seconds", "bound s"),
    ("convergence_ratio", "conv/bound"), ("violations_max_vms", "> max"), ("violations_max_vms_by_others", "of which others"),
    ("duplicate_vms", "dup"), ("dips_below_min", "dips s"),
    ("dips_below_min_without_headroom", "of which max=min"), ("foreign_vms_touched", "foreign"),
    ("amplification", "ampl"), ("throttles_under_default_quotas", "429"), ("requests_held", "held"),
    ("refills", "refills"), ("refill_seconds_median", "refill p50 s"), ("refill_seconds_p99", "refill p99 s"),
    ("refills_held_by_max_vms", "held at max"), ("abandoned_running_hours_beyond_idle_per_day", "abandoned h/day"),
    ("api_calls_ratio", "calls/min"), ("watch_gets_per_fleet_hour", "watch gets/fleet-h"),
    ("cpu_seconds_per_fleet_day", "CPU s/fleet-day"), ("lambda_seconds_per_fleet_day", "Lambda s/fleet-day"),
    ("wall_seconds", "wall s"), ("peak_memory_mb", "MB"),
]


def run(fleets: int, seed: int, side: str, hours: float) -> dict[str, Any]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.reconciler", "--fleets", str(fleets), "--seed", str(seed),
         "--side", side, "--hours", str(hours), "--json"],
        capture_output=True, text=True, timeout=6 * 3600,
    )
    if result.returncode != 0:
        return {"fleets": fleets, "seed": seed, "side": side, "error": result.stderr[-2000:]}
    data = json.loads(result.stdout)[side]
    return {"fleets": fleets, "seed": seed, "side": side, "hours": hours,
            "process_seconds": round(time.perf_counter() - started, 1), **data}


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per run; a convergence above issue #11's goal (1.2 x bound + 2) in bold."""
    head = "| fleets | seed | side | " + " | ".join(label for _, label in KEYS) + " |"
    lines = [head, "|" + "---:|" * 3 + "---:|" * len(KEYS)]
    for row in sorted(rows, key=lambda r: (r["fleets"], r["seed"], r["side"] != "ours")):
        if "error" in row:
            lines.append(f"| {row['fleets']} | {row['seed']} | {row['side']} | error |" + " |" * (len(KEYS) - 1))
            continue
        cells = []
        for key, _ in KEYS:
            value = row.get(key)
            over = (key == "convergence_seconds" and value is not None and row.get("convergence_goal_seconds") is not None
                    and value > row["convergence_goal_seconds"])
            if isinstance(value, float) and key in ("dips_below_min", "dips_below_min_without_headroom", "wall_seconds"):
                value = f"{value:,.0f}"
            elif isinstance(value, float) and key in ("convergence_seconds", "lower_bound_seconds", "peak_memory_mb"):
                value = f"{value:,.1f}"
            elif isinstance(value, int):
                value = f"{value:,}"
            cells.append("–" if value is None else f"**{value}**" if over else str(value))
        lines.append(f"| {row['fleets']} | {row['seed']} | {row['side']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", pooled(rows)])


def pooled(rows: list[dict[str, Any]]) -> str:
    """Issue #33's refill goals are per fleet count: every take's refill of every seed run at that
    count, pooled (a run at 1 fleet sees 0-20 takes with room, too few for a percentile of its own)."""
    lines = ["| fleets | side | runs | refills | refill p50 s | refill p99 s | refill max s | held at max |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["fleets"], row["side"]), []).append(row)
    for (fleets, side), runs in sorted(groups.items()):
        seconds = sorted(x for r in runs for x in r.get("refill_seconds") or [])
        held = sum(r.get("refills_held_by_max_vms") or 0 for r in runs)
        cells = [_quantile(seconds, 0.5), _quantile(seconds, 0.99), seconds[-1] if seconds else None]
        lines.append(f"| {fleets} | {side} | {len(runs)} | {len(seconds)} | "
                     + " | ".join("–" if c is None else str(c) for c in cells) + f" | {held} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", type=int, nargs="+", default=[1, 10, 37, 100, 300])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--sides", nargs="+", default=["ours", "naive"])
    parser.add_argument("--pairs", nargs="+", default=[], metavar="FLEETS/SEED",
                        help="these (fleets, seed) pairs instead of every fleet count with every seed")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--results", type=Path, default=Path("reconciler-table.jsonl"))
    parser.add_argument("--markdown", action="store_true", help="only print the table of the results so far")
    args = parser.parse_args()
    done: list[dict[str, Any]] = []
    if args.results.exists():
        done = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    have = {(r["fleets"], r["seed"], r["side"]) for r in done if "error" not in r}
    try:
        pairs = [tuple(int(x) for x in pair.split("/")) for pair in args.pairs]
    except ValueError:
        parser.error("--pairs: FLEETS/SEED, two whole numbers")
    if any(len(pair) != 2 or pair[0] < 1 for pair in pairs):
        parser.error("--pairs: FLEETS/SEED with at least 1 fleet")
    if not pairs:
        pairs = [(f, s) for f in sorted(args.fleets, reverse=True) for s in args.seeds]
    if not args.markdown:
        todo = [(f, s, side) for f, s in pairs for side in args.sides if (f, s, side) not in have]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool, args.results.open("a") as out:
            futures = [pool.submit(run, *job, args.hours) for job in todo]
            for future in as_completed(futures):
                row = future.result()
                out.write(json.dumps(row) + "\n")
                out.flush()
                done.append(row)
                print(f"{row['fleets']:>4} fleets seed {row['seed']} {row['side']:>5}: "
                      + ("error" if "error" in row else f"{row['wall_seconds']} s, {row['peak_memory_mb']} MB"), flush=True)
    asked = set(pairs)
    wanted = [r for r in done if (r["fleets"], r["seed"]) in asked and r["side"] in args.sides]
    print(markdown(wanted))


if __name__ == "__main__":
    main()
