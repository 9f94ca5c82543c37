"""Measure pruning and teardown through their real entry points, counted from what the MicroVMs
emulator saw (its request log and clock), not from what the code reports:

    .venv/bin/python -m tests.lifecycle_measure [--json]

* pruning an image at the quota of 50 versions before a build (keep 5: 46 deletes), through
  ``pruner.handler``: deletes, ConflictExceptions, the smallest gap between two deletes, the
  time on the emulator's clock;
* the same 46 deletes chained without waiting (what the pruner avoids): how many conflict;
* deleting fleets of 4, 30 and 100 VMs (base and parked), through ``teardown.handler``: the VMs
  ended, TerminateMicrovm calls, the most in any second, 429s, the time on the emulator's clock.

Not a test (no assertion on speed); the numbers are in docs/image.md and docs/teardown.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest


def _requests(emulator: Any, operation: str) -> list[Any]:
    return [r for r in emulator.requests if r.operation == operation]


def measure_prune(cfn: Any) -> dict[str, Any]:
    from lambdas.reconciler import pruner
    from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

    from .lifecycle_harness import pruner_world

    with MicrovmsEmulator(clock=VirtualClock(), seed=5, pending_seconds=2) as emulator:
        emulator.create_image("mi-agente", memory_mib=2048)
        for _ in range(49):
            emulator.publish_version("mi-agente", fresh=False)
        pruner._CLIENT = None
        world = pruner_world(emulator, emulator.clock, cfn)
        mp = pytest.MonkeyPatch()
        try:
            started = emulator.clock.now()
            _, answer, _ = world.invoke(mp, world.event("Update", old_digest="0" * 64), timeout=660)
            seconds = emulator.clock.now() - started
        finally:
            mp.undo()
            pruner._CLIENT = None
        deletes = _requests(emulator, "DeleteMicrovmImageVersion")
        ok = [r.time for r in deletes if r.error is None]
        items = emulator.client().list_microvm_image_versions(imageIdentifier=emulator.image_arn("mi-agente"))["items"]
        return {
            "case": "prune 50 versions before a build, keep 5",
            "outcome": answer["Data"]["Outcome"] if answer else None,
            "deletes": len(ok),
            "conflicts": sum(1 for r in deletes if r.error == "ConflictException"),
            "min_gap_seconds": round(min(b - a for a, b in zip(ok, ok[1:])), 3) if len(ok) > 1 else None,
            "versions_left": sum(1 for v in items if v["state"] not in ("DELETING", "DELETED")),
            "emulator_seconds": round(seconds, 1),
            "calls": {op: len(_requests(emulator, op)) for op in (
                "GetMicrovmImage", "ListMicrovmImageVersions", "ListMicrovms", "UpdateMicrovmImageVersion",
                "DeleteMicrovmImageVersion")},
        }


def measure_chained() -> dict[str, Any]:
    from rayito_constructs.testing import MicrovmsEmulator, VirtualClock

    with MicrovmsEmulator(clock=VirtualClock(), seed=5) as emulator:
        arn = emulator.create_image("mi-agente", memory_mib=2048)
        for _ in range(49):
            emulator.publish_version("mi-agente", fresh=False)
        client = emulator.client()
        conflicts = 0
        for n in range(1, 47):
            try:
                client.delete_microvm_image_version(imageIdentifier=arn, imageVersion=f"{n}.0")
            except client.exceptions.ConflictException:
                conflicts += 1
            emulator.clock.advance(0.2)  # back to back: a client's round trip
        return {"case": "46 deletes chained without waiting", "deletes": 46, "conflicts": conflicts}


def measure_teardown(aws: str, cfn: Any, vms: int) -> dict[str, Any]:
    from lambdas.reconciler import index, teardown

    from .lifecycle_harness import teardown_world
    from .reconciler.harness import deployed_fleet

    warm = max(1, vms // 4)
    env = {"MIN_VMS": str(vms - warm), "WARM_VMS": str(warm), "MAX_VMS": str(vms)}
    mp = pytest.MonkeyPatch()
    teardown._CLIENTS = None
    index._RECONCILER = None
    try:
        with deployed_fleet(aws, env=env) as fleet:
            world = teardown_world(fleet, cfn, aws)
            world.invoke(mp, world.event("Create"))
            fleet.every_minute(mp, 4)
            ours = [vm["microvmId"] for vm in fleet.ours()]
            states = sorted({fleet.emulator.state_of(vm) for vm in ours})
            before = len(_requests(fleet.emulator, "TerminateMicrovm"))
            started = fleet.clock.now()
            answer = world.invoke(mp, world.event("Delete"))
            seconds = fleet.clock.now() - started
            sent = sorted(r.time for r in _requests(fleet.emulator, "TerminateMicrovm")[before:])
            return {
                "case": f"teardown of {len(ours)} VMs ({vms - warm} base, {warm} parked)",
                "states_before": states,
                "outcome": answer.data.get("Outcome"),
                "ended": sum(1 for vm in ours if fleet.emulator.state_of(vm) == "TERMINATED"),
                "terminate_calls": len(sent),
                "max_terminates_in_a_second": max((sum(1 for t in sent if a <= t < a + 1) for a in sent), default=0),
                "throttled": fleet.emulator.throttled.get("TerminateMicrovm", 0),
                "emulator_seconds": round(seconds, 1),
                "calls": answer.calls,
            }
    finally:
        mp.undo()
        teardown._CLIENTS = None
        index._RECONCILER = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sizes", default="4,30,100", help="fleet sizes to tear down")
    args = parser.parse_args(argv)
    from .moto_server import moto_server
    from .recipe_writer_helpers import CloudFormationEndpoint

    results = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        cfn = CloudFormationEndpoint(Path(tmp))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                results.append(measure_prune(cfn))
                results.append(measure_chained())
            with moto_server() as aws:
                for size in [int(s) for s in args.sizes.split(",") if s]:
                    with contextlib.redirect_stdout(io.StringIO()):
                        results.append(measure_teardown(aws, cfn, size))
        finally:
            cfn.close()
    for result in results:
        print(json.dumps(result) if args.json else "  ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
