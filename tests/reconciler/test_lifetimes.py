"""When a successor starts and how long a first VM lives: one pure module
(``lambdas/reconciler/core/lifetimes.py``) used by the Lambda, the construct's synth checks and the
cost estimate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lambdas.reconciler import core
from lambdas.reconciler.core import lifetimes
from lambdas.reconciler.core import FleetSpec


@pytest.mark.parametrize("lifetime,lead,period,effective", [
    (28_800, 900, 60, 900),  # the default: the lead asked for
    (1_200, 900, 60, 600),  # at most half a lifetime (two VMs a slot at most)
    (120, 900, 60, 70),  # but a look and a start when the lead asked for is that long
    (120, 60, 60, 60),  # not more than asked for
    (600, 900, 300, 310),  # a 5-minute schedule: its look and a start
])
def test_the_successor_lead(lifetime, lead, period, effective) -> None:
    assert lifetimes.successor_lead(lifetime, lead, period) == effective


@given(lifetime=st.integers(60, 28_800), lead=st.floats(0, 28_800), period=st.floats(1, 3_600))
def test_the_lead_is_never_more_than_asked_for_nor_under_half_a_lifetime_when_asked(lifetime, lead, period) -> None:
    effective = lifetimes.successor_lead(lifetime, lead, period)
    assert effective <= lead + 1e-9
    assert effective >= min(lead, lifetime / 2) - 1e-9
    assert lifetimes.replacement_cycle(lifetime, lead, period) == max(1.0, lifetime - effective)


@pytest.mark.parametrize("lifetime,slots,expect", [
    (28_800, 5, [28_800, 25_920, 23_040, 20_160, 17_280]),  # 8 h, then 7 h 12 min... spread over half a lifetime
    (28_800, 1, [28_800]),  # one slot: nothing to spread
    (300, 2, [300, 235]),  # short: the spread keeps the lead and a stagger step (300 - 150 - 20 = 130, 65 a slot)
    (400, 11, [400] * 11),  # 18 s a slot: under a stagger step, not spread at all
])
def test_first_lifetimes_are_spread_by_rank(lifetime, slots, expect) -> None:
    lead = lifetimes.successor_lead(lifetime, 900, 60)
    assert [lifetimes.first_lifetime(lifetime, lead, rank, slots) for rank in range(slots)] == expect


def test_a_look_in_time_starts_even_a_slow_first_launch_before_the_end() -> None:
    free = 1_000.0
    in_time = free + lifetimes.EXPIRY_WAKE_SECONDS + 60 + lifetimes.SLOW_START_SECONDS
    assert lifetimes.look_in_time(60, free, in_time) and not lifetimes.look_in_time(60, free, in_time - 0.1)


def test_the_overtime_is_the_timeout_beyond_the_tick_less_the_call_margin() -> None:
    assert lifetimes.OVERTIME_SECONDS == lifetimes.TIMEOUT_BEYOND_TICK_SECONDS - lifetimes.CALL_MARGIN_SECONDS == 9.0


@pytest.mark.parametrize("min_vms,warm_vms", [(6, 2), (1, 0), (0, 3), (5, 5), (3, 1)])
def test_parked_slots_are_spread_over_a_fleets_starts_from_the_first(min_vms, warm_vms) -> None:
    """SuspendMicrovm (2 a second) is the tightest quota: parked slots come early and evenly, so
    parking runs beside the starts instead of trailing them (convergence from empty)."""
    spec = FleetSpec(fleet="f", image_arn="arn", min_vms=min_vms, max_vms=min_vms + warm_vms, warm_vms=warm_vms)
    order = [s for s, _ in sorted(core.desired_slot_ids(spec), key=lambda s: core.slot_order(*s, spec))]
    assert sorted(order) == sorted(s for s, _ in core.desired_slot_ids(spec))
    warm = [i for i, s in enumerate(order) if s.startswith("warm-")]
    base = [s for s in order if s.startswith("base-")]
    assert base == [f"base-{i}" for i in range(min_vms)]  # each role keeps its own order
    if warm:
        assert warm[0] == 0  # the first start of the fleet is a parked slot's
        gaps = [b - a for a, b in zip(warm, warm[1:], strict=False)]
        assert not gaps or max(gaps) - min(gaps) <= 1  # evenly spread
    # first lifetimes are still spread (stagger), in the new order
    spread = [core.first_lifetime(spec, s, r) for s, r in core.desired_slot_ids(spec)]
    assert len(set(spread)) == (len(spread) if len(spread) > 1 else 1)


def test_slots_the_spec_asks_none_of_and_unstaggered_fleets() -> None:
    spec = FleetSpec("f", "arn", min_vms=2, max_vms=3, warm_vms=0)
    assert core.slot_order("warm-3", core.WARM, spec) == (3.0, True, "warm-3")  # a parked slot left after warm_vms 0
    assert core.slot_order("base-1", core.BASE) == (1.0, False, "base-1")  # without a spec
    flat = FleetSpec("f", "arn", min_vms=2, max_vms=3, stagger=False)
    assert core.first_lifetime(flat, "base-1", core.BASE) == 28_800
    assert core.first_lifetime(spec, "base-9", core.BASE) == 28_800  # not a slot of the spec


def test_the_construct_and_the_cost_estimate_use_the_same_rule() -> None:
    """rayito_constructs imports this module from the wheel (``rayito_constructs._lambdas``)."""
    from rayito_constructs.model import cost
    from rayito_constructs import reconciler as construct
    from rayito_constructs._lambdas.reconciler.core import lifetimes as shipped

    assert construct.effective_lead(1_200, 900, 60) == shipped.successor_lead(1_200, 900, 60) == 600
    assert construct._OVERTIME_SECONDS == shipped.OVERTIME_SECONDS
    running, _ = cost.base_vm_seconds(1, None, vm_lifetime_seconds=1_200, successor_lead_seconds=900)
    assert running == pytest.approx(cost.SECONDS_PER_MONTH / (1_200 - 600) * 1_200)
