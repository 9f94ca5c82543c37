"""Who owns which VM at scale, in every shape and through spec changes, on the production path
(``index.handler`` with Powertools, its own clients, the synthesized environment, the MicroVMs
emulator over HTTP on a virtual clock, moto), at fleet sizes, quotas and spec changes the other
tests do not try. Every number comes from the emulator's VM histories and request log, moto's items or
stdout, never from the reconciler's own counters.

Failures ruled out (the numbers measured for each stay beside its test):

* a slot the spec drops and later asks for again starts at generation 0, so its first run reuses
  the client token of the slot's earlier generation-0 VM: a warm slot takes back a client's
  session (a member) and suspends it; a base slot takes back a member VM (held by two slots);
* under the account's room refusals (the memory quota's 402, InsufficientCapacity), a parked slot
  that comes before a base slot in the start order is the one refused every tick: no base slot is
  ever refused, so none takes a parked VM, and base VMs stay below ``min_vms`` with parked VMs
  SUSPENDED;
* a ListMicrovms of more than ten pages (over 500 VMs of the image listed, TERMINATED ones
  included for 20 minutes) never completes: the fleet stops reconciling.

The scenarios that held and stay here are cheap and next to a break (nine pages; a quota order
that happens to put a base slot at the refusal)."""

from __future__ import annotations


import pytest

from .harness import RECONCILER_CALLER, deployed_fleet, seconds_below, serving
from .support import _ended_sessions, _errors, _held_twice, _ours, _requests, _reused_tokens, _shape

# What the reconciler decides over ticks: the stores in memory (harness.py).
pytestmark = pytest.mark.stores("memory")

















# --------------------------------------------------------------------------- spec changes: slots asked for again


# Found (a strict xfail until fixed): "min 1 / warm 2 / max 4; a client resumes warm-1's parked VM at 120 s (a member from then on); "
# warm_vms 2 -> 0 at 240 s (both parked slots drained, deleted), 0 -> 2 at 420 s: warm-1 comes back at
# generation 0, its RunMicrovm at 420.0 s reuses the token of 0 s and the service returns the client's
# RUNNING VM, which the reconciler suspends at 422.6 s (SUSPENDED at 424.0 s), held by warm-1 and its
# member slot at once; warm-0's run returns its own TERMINATED predecessor. core.plan step 3
# (core.py:554) makes a new Slot(generation=0) for an id a drained slot left, and client_token
# (core.py:253) depends on the slot id and generation only". Fixed: a slot id the spec drops leaves its next
# generation in the ledger (#stats ``retired``, core.retired_generations); asked for again, it starts there.
def test_a_warm_slot_asked_for_again_never_takes_back_a_clients_session(aws, monkeypatch) -> None:
    """warm_vms lowered to 0 and raised again after a client took a parked slot: the recreated
    slots must start new VMs; the client's session (a member) is never suspended."""
    with deployed_fleet(aws, env=_shape(1, 2, 4), pending_seconds=2, client_token_ttl_seconds=3600) as fleet:
        t0 = fleet.clock.now()
        fleet.every_minute(monkeypatch, 2)
        session = fleet.ledger_slots()["warm-1"]["microvm_id"]
        resumed = fleet.clock.now()
        fleet.emulator.direct_client(caller="client").resume_microvm(microvmIdentifier=session)
        fleet.every_minute(monkeypatch, 2)
        fleet.env["WARM_VMS"] = "0"
        fleet.every_minute(monkeypatch, 3)
        raised = fleet.clock.now()
        fleet.env["WARM_VMS"] = "2"
        fleet.every_minute(monkeypatch, 3)
        suspended = [round(r.time - t0, 1) for r in _requests(fleet, "SuspendMicrovm")
                     if r.microvm_id == session and r.time > resumed]
        found = {"session_suspended_at": suspended, "held_twice": _held_twice(fleet),
                 "reused": _reused_tokens(fleet, raised), "errors": len(_errors(fleet))}
        assert found == {"session_suspended_at": [], "held_twice": [], "reused": [], "errors": 0}, found


# Found (a strict xfail until fixed): "min 3 / max 6; min_vms 3 -> 1 at 120 s (base-1 and base-2's VMs become members), 1 -> 3 at 240 s: "
# base-1 and base-2 come back at generation 0 and their RunMicrovm calls (240.0 s) reuse the first
# tokens: the service returns the two members' RUNNING VMs, each then held by a base slot and a
# member slot, and no new VM is made (core.py:554, core.py:253)". Fixed as above.
def test_a_base_slot_asked_for_again_starts_a_vm_of_its_own(aws, monkeypatch) -> None:
    """min_vms lowered and raised back: the members (base VMs above the lowered min) are never
    touched again, so the new base slots must run VMs of their own."""
    with deployed_fleet(aws, env=_shape(3, 0, 6), pending_seconds=2, client_token_ttl_seconds=3600) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fleet.env["MIN_VMS"] = "1"
        fleet.every_minute(monkeypatch, 2)
        raised = fleet.clock.now()
        fleet.env["MIN_VMS"] = "3"
        fleet.every_minute(monkeypatch, 2)
        found = {"held_twice": len(_held_twice(fleet)), "reused": _reused_tokens(fleet, raised),
                 "ours_running": _ours(fleet)["RUNNING"]}
        assert found == {"held_twice": 0, "reused": [], "ours_running": 5}, found


@pytest.mark.stores("dynamodb")  # it rewrites the ledger's #stats item
def test_an_old_token_answered_with_a_vm_another_slot_holds_is_never_attached_twice(aws, monkeypatch) -> None:
    """A ledger written before slots kept their generations (no ``retired`` in ``#stats``): base
    slots asked for again send their generation-0 tokens, and the service answers with the VMs the
    members hold. Never held twice: each such slot moves to a new token (``token_collision``) and
    runs a VM of its own; the members are never touched."""
    with deployed_fleet(aws, env=_shape(3, 0, 6), pending_seconds=2, client_token_ttl_seconds=3600) as fleet:
        fleet.every_minute(monkeypatch, 2)
        fleet.env["MIN_VMS"] = "1"
        fleet.every_minute(monkeypatch, 2)
        members = {s["microvm_id"] for s in fleet.ledger_slots().values() if s["role"] == "member"}
        fleet.ddb.update_item(TableName=fleet.env["LEDGER_TABLE"], Key={"fleet": {"S": fleet.fleet}, "key": {"S": "#stats"}},
                              UpdateExpression="REMOVE retired")
        raised = fleet.clock.now()
        fleet.env["MIN_VMS"] = "3"
        fleet.every_minute(monkeypatch, 2)
        collisions = [r for i in fleet.invocations for r in i.events("token_collision")]
        touched = [r for r in fleet.emulator.requests if r.microvm_id in members and r.time >= raised
                   and r.operation in ("SuspendMicrovm", "TerminateMicrovm", "ResumeMicrovm")]
        found = {"members": len(members), "collisions": len(collisions), "held_twice": len(_held_twice(fleet)),
                 "ours_running": _ours(fleet)["RUNNING"], "touched": len(touched), "errors": len(_errors(fleet))}
        assert found == {"members": 2, "collisions": 2, "held_twice": 0, "ours_running": 5, "touched": 0,
                         "errors": 0}, found


# --------------------------------------------------------------------------- the account's room: base slots first


def _capacity_after(runs: int):
    """An emulator option hook: InsufficientCapacity on every RunMicrovm of ours after ``runs``."""
    def arm(fleet) -> None:
        seen = []

        def on_request(record) -> None:
            if record.operation == "RunMicrovm" and record.caller == RECONCILER_CALLER and record.status == 200:
                seen.append(record)
                if len(seen) == runs:
                    fleet.emulator.inject("RunMicrovm", "InsufficientCapacity", times=None, caller=RECONCILER_CALLER)
        fleet.emulator.subscribe(on_request)
    return arm


@pytest.mark.parametrize("shape,room,refusal", [
    # Found (a strict xfail until fixed): min 3 / warm 3 / max 6 under a memory quota of 4 VMs: the start order (core.slot_order) is
    # warm-0, base-0, warm-1, base-1, warm-2, base-2; warm-2 is the 402 every tick and the shared 60 s
    # backoff stops the step's other runs (tick.py:468), so base-2 is never refused and never takes a
    # parked VM (core.py:705 looks only at base slots' own refusals): 2 RUNNING, 2 SUSPENDED for 8
    # minutes, 360 s below min_vms 3 from minute 2, 0 ResumeMicrovm
    # Fixed: a parked slot refused for room puts base slots first for 60 s (core.plan, ROOM_REFUSED_SECONDS).
    pytest.param((3, 3, 6), 4, "quota", id="min3-warm3-quota4"),
    # Found (a strict xfail until fixed): as with the quota, InsufficientCapacity on every run after the 4th: warm-2 is refused
    # every step, base-2 never asked: 2 RUNNING, 2 SUSPENDED, 360 s below min_vms 3, 0 ResumeMicrovm
    # Fixed: a parked slot refused for room puts base slots first for 60 s (core.plan, ROOM_REFUSED_SECONDS).
    pytest.param((3, 3, 6), 4, "capacity", id="min3-warm3-capacity-after4"),
    # Found with the fix above, at scale: min 40 / warm 20 / max 64 with room for 50 (8192 MiB VMs under
    # a 400 GB quota): a base run refused mid-tick left three base slots for the next tick (61.7 s below
    # min_vms with 13 VMs parked). Fixed: the account's "no room" (its shared backoff, whichever fleet met
    # it) makes base slots take parked VMs, and a step that learns it plans again 0.5 s later.
    pytest.param((40, 20, 64), 50, "quota", id="min40-warm20-quota50"),
    # Held: the refusal falls on a base slot (base-1 comes before warm-1), which takes the parked VM.
    pytest.param((2, 2, 4), 3, "quota", id="min2-warm2-quota3"),
])
def test_under_room_refusals_base_slots_come_before_parked_ones(aws, monkeypatch, shape, room, refusal) -> None:
    """The account has room for ``room`` of the image's VMs: base slots are served first, a parked
    VM is handed to a base slot the account refuses (docs/reconciler.md, "Refused for room")."""
    options = {"memory_quota_mib": room * 4096} if refusal == "quota" else {}
    with deployed_fleet(aws, env=_shape(*shape), pending_seconds=2, **options) as fleet:
        if refusal == "capacity":
            _capacity_after(room)(fleet)
        t0 = fleet.clock.now()
        seen = []
        for _ in range(8):
            fleet.every_minute(monkeypatch, 1)
            states = _ours(fleet)
            # Serving: RUNNING, or idle-suspended (a handed-over parked VM keeps the pool's idle policy).
            seen.append((len(serving(fleet)), states["SUSPENDED"]))
        floor = min(shape[0], room)
        below = seconds_below(fleet, floor, t0 + 120, fleet.clock.now())
        found = {"below": below, "last": seen[-1][0] >= floor, "errors": len(_errors(fleet))}
        assert found == {"below": 0.0, "last": True, "errors": 0}, (found, seen, len(_requests(fleet, "ResumeMicrovm")))


# --------------------------------------------------------------------------- lists of many pages


@pytest.mark.parametrize("listed", [
    pytest.param(440, id="nine-pages"),  # held: 9 ListMicrovms pages a list
    # Found (a strict xfail until fixed): 510 TERMINATED VMs of the image still listed (clients' ended sessions; TERMINATED VMs stay
    # listed 20 minutes) and a fleet of min 2 / warm 1 / max 5: its tick sends 484 ListMicrovms and no
    # RunMicrovm (0 VMs of ours; 560 listed: 484 a tick, 3 ticks in a row). tick.py:728-757
    # (_list) admits every page at the step's time and returns the Deferral of a page whose token is only
    # reserved, dropping the pages read: past the budget's burst (10 pages) each retry reads one page.
    # Reached by churn too: min 30 / max 64 with 120 s VMs (not told at synth) listed 300 VMs at minute
    # 10, 30 more a minute, and in 27 minutes sent 5,622 ListMicrovms and was 419 s below min_vms
    # Fixed: a page after the first waits for its token within the tick (Reconciler._list).
    pytest.param(510, id="eleven-pages"),
    pytest.param(1210, id="twenty-five-pages"),  # more than twice the budget's burst of pages
])
def test_a_fleet_reconciles_with_many_ended_vms_listed(aws, monkeypatch, listed) -> None:
    with deployed_fleet(aws, env=_shape(2, 1, 5), pending_seconds=2, memory_quota_mib=1 << 30) as fleet:
        _ended_sessions(fleet, listed)
        fleet.clock.advance(10)
        tick = fleet.invoke(monkeypatch, cold=True)  # converges in one tick with nine pages
        fleet.clock.advance(10)
        states = _ours(fleet)
        lists = tick.calls.get("ListMicrovms", 0)
        pages = -(-(listed + 3) // 50)
        found = {"running": states["RUNNING"], "parked": states["SUSPENDED"], "lists_bounded": lists <= 3 * pages,
                 "errors": len(_errors(fleet))}
        assert found == {"running": 2, "parked": 1, "lists_bounded": True, "errors": 0}, (found, lists)
