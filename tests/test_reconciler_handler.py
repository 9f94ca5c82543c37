"""The deployed entry point, end to end: ``index.handler`` with the example fleet's synthesized
environment, Powertools telemetry and ``index.build()``'s clients, against the MicroVMs emulator
and moto (DynamoDB, SQS). Assertions come from the emulator, moto and stdout."""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import pytest

from .moto_server import moto_server
from .reconciler_harness import deployed_fleet


@pytest.fixture(scope="module")
def aws() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


def test_the_synthesized_fleet_converges_and_tells(aws, monkeypatch) -> None:
    with deployed_fleet(aws) as fleet:
        first = fleet.invoke(monkeypatch)
        assert first.result["fleet"] == "mi-agente" and "skipped" not in first.result
        fleet.clock.advance(60)
        fleet.invoke(monkeypatch)
        states = Counter(vm["state"] for vm in fleet.live())
        assert states == {"RUNNING": 1, "SUSPENDED": 1}  # min_vms 1, warm_vms 1 in the example
        # RunMicrovm carried what production always sends: the role, the idle policy, the version.
        for vm in fleet.ours():
            assert vm["clientToken"].startswith("rz1-")
        runs = [e for e in first.events("run_requested")]
        assert len(runs) == 2
        waits = first.metrics("WaitTime")
        assert waits and {unit for _, unit in waits} == {"Seconds"}
        print(first.calls)
