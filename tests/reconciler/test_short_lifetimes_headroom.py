"""#11.3 no dip, with VM lifetimes shorter than the default successor lead allows for.

A lifetime under twice ``successor_lead_seconds`` (900 s by default) made every VM's successor due
at once, and one under 1,920 s was never staggered: VMs started together expired together. Each
case runs ``index.handler`` every minute (its default telemetry, the synthesized environment,
against the emulator and moto) for a lifetime and a half after the fill, and counts from the emulator's
VM histories the seconds below ``min_vms`` RUNNING (the benchmark's ``dips_below_min``)."""

from __future__ import annotations

import pytest

from lambdas.reconciler import core

from .harness import RECONCILER_CALLER, deployed_fleet, peak_live, seconds_below, serving

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")


@pytest.mark.parametrize(("lifetime", "min_vms", "max_vms"), [(600, 1, 2), (900, 5, 6), (1800, 3, 4)])
def test_short_lifetimes_never_dip_with_one_slot_of_headroom(aws, monkeypatch, lifetime, min_vms, max_vms) -> None:  
    """The default 900 s lead. Before: 600 s VMs (min 1 / max 2) were below min_vms 2 s at every
    end (the successor of a successor waited for the old VM's end, then for the next tick);
    900 s VMs (min 5 / max 6) and 1,800 s VMs (min 3 / max 4) all expired together, and the
    successors that found no headroom started after the ends."""
    env = {"MIN_VMS": str(min_vms), "WARM_VMS": "0", "MAX_VMS": str(max_vms),
           "MAX_LIFETIME_SECONDS": str(lifetime), "IDLE_SECONDS": ""}
    with deployed_fleet(aws, env=env, pending_seconds=2) as fleet:
        start = fleet.clock.now()
        fleet.every_minute(monkeypatch, 2)
        assert len(serving(fleet)) == min_vms
        fleet.every_minute(monkeypatch, 3 * lifetime // 120)  # one lifetime and a half
        assert seconds_below(fleet, min_vms, start + 120, fleet.clock.now()) == 0.0
        assert peak_live(fleet) <= max_vms
        runs = [r for r in fleet.emulator.requests if r.caller == RECONCILER_CALLER and r.operation == "RunMicrovm"]
        # A VM a slot for each (lifetime - lead) at most, not one a minute: no churn.
        lead = core.successor_lead(core.FleetSpec("f", "arn", min_vms, max_vms, max_lifetime_seconds=lifetime))
        assert len(runs) <= min_vms * (1 + (fleet.clock.now() - start) / (lifetime - lead)) + 1
