"""Short lifetimes (#11): ``successor_lead`` capped at half a
lifetime, first lifetimes spread down to lead + 120 s, the ``short_lifetime`` synth warning under two
schedule periods. Every case runs ``index.handler`` through ``tests/reconciler_harness.py`` (the
synthesized environment, its telemetry, the emulator and moto) and measures from the emulator's VM
histories: seconds below ``min_vms`` RUNNING (``seconds_below``), ``peak_live`` and the
reconciler's RunMicrovm calls. Each shape of ``test_short_lifetimes_never_dip`` falls below
``min_vms`` without the rules the comment above it names (the numbers beside each); the harness
runs on the virtual clock, so nothing depends on wall-clock speed."""

from __future__ import annotations

from typing import Any

import pytest

from .support import _holds

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")



def _run(aws, monkeypatch, **shape: Any) -> dict:  
    """Deploy, fill (two looks), then look every ``period`` seconds (ticks of ``tick`` seconds, the
    function's timeout 15 s longer, as the construct sets it) for a lifetime and a half (``looks``
    overrides); what the emulator saw from the fill on (``support._drive``, which adds hooks for
    faults)."""
    from .support import _drive

    return _drive(aws, monkeypatch, **shape)




# Each shape falls below min_vms without these rules (the numbers measured beside it): successors wait for room by the ends that free it (core.plan: ``frees``, the soonest-
# ending VM's successor first), parked VMs too old to take over are ended for room, the lead keeps
# a look and a start (core.successor_lead, with the schedule's period: SCHEDULE_SECONDS), and first
# lifetimes spread down to 20 s a slot (core.MIN_STAGGER_STEP_SECONDS).
@pytest.mark.parametrize("shape", [
    # 120 s VMs with min 1 / max 2 and a 30 s start: 90 s below min_vms in 13 min (2 s starts: 6 s;
    # 121 s with 30 s starts: 145 s): the capped lead (60 s) was one schedule period.
    pytest.param(dict(lifetime=120, min_vms=1, max_vms=2, pending_seconds=30), id="60s-lead"),
    pytest.param(dict(lifetime=121, min_vms=1, max_vms=2, pending_seconds=30), id="121s-slow-start"),
    # min 2 / max 3 with 300 s VMs (one slot of headroom): 5 s below in 8 min, 2-3 s at ends.
    pytest.param(dict(lifetime=300, min_vms=2, max_vms=3), id="two-slots-one-headroom"),
    # min 10 / max 11 with 1,200 s VMs: 48 s a slot was under the 60 s step, so nothing was spread:
    # all 10 first VMs ended at once, 4.26 s below, recurring (12.4 s in 72 min).
    pytest.param(dict(lifetime=1200, min_vms=10, max_vms=11, looks=25), id="ten-slots-unspread"),
    # 27 s a slot (with a 30 s stagger step: 8.4 s below); and three slots exactly 20 s
    # apart (180 s VMs, a 90 s lead: 9 s below with 30 s steps).
    pytest.param(dict(lifetime=600, min_vms=10, max_vms=11, looks=25), id="ten-slots-27s-apart"),
    pytest.param(dict(lifetime=180, min_vms=3, max_vms=4), id="three-slots-20s-apart"),
    # min 1 / warm 1 / max 2 with 600 s VMs: the parked VM (90 s left) was not handed over and the
    # base VM's successor started 1 s after its end: 3 s below at each end.
    pytest.param(dict(lifetime=600, min_vms=1, warm_vms=1, max_vms=2), id="warm-handover"),
    pytest.param(dict(lifetime=900, min_vms=5, warm_vms=5, max_vms=11, looks=20), id="half-parked"),
    # looked at every 5 minutes (FleetReconciler(schedule=5 min)), 600 s VMs with min 1 / max 2:
    # 2 s below at every end (the handler did not know the period; the capped lead was one period).
    pytest.param(dict(lifetime=600, min_vms=1, max_vms=2, period=300, looks=11), id="five-minute-schedule"),
    pytest.param(dict(lifetime=900, min_vms=2, max_vms=3, period=300, looks=11), id="five-minute-two-slots"),
    # Every 5 minutes with 50 s ticks, 700 s VMs of min 3 / max 4 fell 736 s below in 55 min (and
    # short_lifetime warns): each successor waits for an end, seen only at the next tick. Ticks
    # that watch the whole period (tick_seconds=285) hold.
    pytest.param(dict(lifetime=700, min_vms=3, max_vms=4, period=300, looks=11, tick=285), id="five-minute-long-ticks"),
])
def test_short_lifetimes_never_dip(aws, monkeypatch, shape) -> None:  
    _holds(_run(aws, monkeypatch, **shape))


def test_180s_vms_with_a_slow_start_hold(aws, monkeypatch) -> None:  
    """Held: 180 s VMs, min 1 / max 2, 30 s PENDING: never below min_vms, at most 2 live, 7 runs in 13 min."""
    _holds(_run(aws, monkeypatch, lifetime=180, min_vms=1, max_vms=2, pending_seconds=30))


@pytest.mark.parametrize("lifetime", [-5, 0, 28_801, 1.5, float("nan"), True, "600"])
def test_agent_fleet_checks_max_lifetime_without_a_reconciler(lifetime) -> None:
    """Found: AgentFleet(reconciler=False) took these without a word (its docstring says 1 to
    28,800; only FleetReconciler checked). Fixed: AgentFleet checks it whatever reconciler is."""
    from rayito_constructs import AgentFleet, AgentProject

    from ..cdk_helpers import new_app, new_stack
    from ..conftest import EXAMPLE

    with pytest.raises(ValueError, match="max_lifetime_seconds"):
        AgentFleet(new_stack(new_app()), "Fleet", project=AgentProject.load(EXAMPLE), max_lifetime_seconds=lifetime,
                   reconciler=False)
