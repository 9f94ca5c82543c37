"""One account, N fleets, a day on the virtual clock: our reconciler beside a naive one.

    .venv/bin/python -m benchmarks.reconciler --fleets 100 --seed 1 [--hours 24] [--json]

Both run in the same process against their own MicroVMs emulator (same seed, same workload, the
documented default quotas), through the emulator's direct client (boto3's method names and error
shapes, no serialization: the tests cover the wire). The day holds:

* expiries: every VM lives at most ``--lifetime`` seconds (default 8 hours), so each slot is
  replaced about three times;
* spikes: every ``--spike-every`` minutes a random fleet's clients take parked slots (resume) and
  start VMs of their own up to ``max_vms``; client VMs end by themselves 10–40 minutes later;
* faults: VMs that crash young (one fleet's VMs crash-loop all day), lost RunMicrovm responses
  (the VM is made, the answer is an error), an InsufficientCapacity burst and a throttling storm
  (RunMicrovm at a fifth of its quota for ten minutes).

"ours" is ``lambdas.reconciler`` (slot ledger, shared budget with reservations, deterministic
client tokens, one tick a minute per fleet, steps within a tick). "naive" ticks each fleet alone
every minute: it counts live VMs, starts the missing ones with random client tokens, retries a
failed call with local exponential backoff (1, 2, 4, 8 s), and parks the newest RUNNING VMs above
``min_vms``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

from botocore.exceptions import ClientError

from lambdas.reconciler.budget import MemoryBudget
from lambdas.reconciler.core import FleetSpec
from lambdas.reconciler.ledger import MemoryLedger
from lambdas.reconciler.telemetry import MemoryTelemetry
from lambdas.reconciler.tick import Reconciler
from rayito_constructs.testing import DEFAULT_RATE_LIMITS, MicrovmsEmulator, VirtualClock

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
TICK = 60.0
TICK_DEADLINE = 50.0
PENDING = 12.0
SUSPENDING = 1.0


# --------------------------------------------------------------------------------------- fleets


def make_fleets(count: int, rng: random.Random) -> list[FleetSpec]:
    specs = []
    for i in range(count):
        min_vms = rng.randint(1, 8)
        warm = rng.randint(0, 4)
        max_vms = min(64, min_vms + warm + rng.randint(0, 12))
        specs.append(FleetSpec(fleet=f"fleet-{i:03d}", image_arn="", min_vms=min_vms, max_vms=max_vms, warm_vms=warm))
    return specs


# --------------------------------------------------------------------------------------- naive


@dataclass
class Naive:
    """Each fleet alone; random tokens; local exponential backoff; no ledger."""

    spec: FleetSpec
    client: Any
    clock: Any
    rng: random.Random
    calls: Counter = field(default_factory=Counter)
    throttles: int = 0
    units: dict[str, list[str]] = field(default_factory=dict)  # unit of work -> tokens tried
    queue: list[str] = field(default_factory=list)  # units still to start in this tick
    backoff: float = 1.0

    def _call(self, method: str, **kwargs: Any) -> Any:
        self.calls[method] += 1
        try:
            return getattr(self.client, method)(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ThrottlingException":
                self.throttles += 1
            raise

    def list(self) -> list[dict[str, Any]]:
        items, token = [], None
        while True:
            kwargs = {"imageIdentifier": self.spec.image_arn, "maxResults": 50}
            if token:
                kwargs["nextToken"] = token
            page = self._call("list_microvms", **kwargs)
            items += page["items"]
            token = page.get("nextToken")
            if not token:
                return items

    def step(self) -> Optional[float]:
        """One tick, or the continuation of its retries: seconds to the next continuation."""
        try:
            vms = [v for v in self.list() if v["state"] in LIVE]
        except ClientError:
            return self._retry()
        if not self.queue:
            running = sorted((v for v in vms if v["state"] in ("PENDING", "RUNNING")), key=lambda v: v["startedAt"])
            parked = [v for v in vms if v["state"] in ("SUSPENDING", "SUSPENDED")]
            missing = min(self.spec.min_vms + self.spec.warm_vms - len(vms), self.spec.max_vms - len(vms))
            self.queue = [uuid.UUID(int=self.rng.getrandbits(128)).hex for _ in range(max(0, missing))]
            extra = len([v for v in running if v["state"] == "RUNNING"]) - self.spec.min_vms
            for vm in [v for v in running if v["state"] == "RUNNING"][::-1][: max(0, min(extra, self.spec.warm_vms - len(parked)))]:
                try:
                    self._call("suspend_microvm", microvmIdentifier=vm["microvmId"])
                except ClientError:
                    pass
        while self.queue:
            unit = self.queue[0]
            token = f"naive-{uuid.UUID(int=self.rng.getrandbits(128))}"
            self.units.setdefault(unit, []).append(token)
            try:
                self._call("run_microvm", imageIdentifier=self.spec.image_arn, clientToken=token)
            except ClientError:
                return self._retry()
            self.queue.pop(0)
            self.backoff = 1.0
        return None

    def _retry(self) -> Optional[float]:
        if self.backoff > 8:
            self.queue, self.backoff = [], 1.0  # give up until the next tick
            return None
        wait, self.backoff = self.backoff, self.backoff * 2
        return wait


# --------------------------------------------------------------------------------------- the day


@dataclass
class Side:
    name: str
    emulator: MicrovmsEmulator
    clock: VirtualClock
    actors: list[Any]
    kind: str
    samples: int = 0
    violations: int = 0
    dips: int = 0
    converged_at: Optional[float] = None
    storm_throttles: int = 0


def build(kind: str, specs: list[FleetSpec], seed: int, lifetime: int) -> Side:
    clock = VirtualClock()
    emulator = MicrovmsEmulator(clock=clock, seed=seed, pending_seconds=PENDING, suspending_seconds=SUSPENDING,
                                terminating_seconds=3, terminated_linger_seconds=600, memory_quota_mib=4 * 1024 * 1024)
    client = emulator.direct_client()
    ledger, budget = MemoryLedger(), MemoryBudget()
    actors = []
    rng = random.Random(seed)
    for spec in specs:
        image = emulator.create_image(spec.fleet, memory_mib=512)
        spec = FleetSpec(**{**spec.__dict__, "image_arn": image, "max_lifetime_seconds": lifetime})
        if kind == "ours":
            actors.append(Reconciler(spec=spec, microvms=client, ledger=ledger, budget=budget,
                                     telemetry=MemoryTelemetry(), clock=clock.now))
        else:
            actors.append(Naive(spec=spec, client=client, clock=clock, rng=random.Random(rng.getrandbits(64))))
    return Side(kind, emulator, clock, actors, kind)


def desired_reached(side: Side) -> bool:
    by_image: dict[str, Counter] = defaultdict(Counter)
    for vm in side.emulator.microvms():
        by_image[vm["imageArn"]][vm["state"]] += 1
    for actor in side.actors:
        states = by_image[actor.spec.image_arn]
        if states["RUNNING"] < actor.spec.min_vms or states["SUSPENDED"] < actor.spec.warm_vms:
            return False
    return True


def sample(side: Side) -> None:
    counts: dict[str, Counter] = defaultdict(Counter)
    for vm in side.emulator.microvms():
        counts[vm["imageArn"]][vm["state"]] += 1
    for actor in side.actors:
        states = counts[actor.spec.image_arn]
        side.samples += 1
        if sum(states[s] for s in LIVE) > actor.spec.max_vms:
            side.violations += 1


def simulate(side: Side, specs: list[FleetSpec], seed: int, hours: float, spike_every: float) -> None:
    """A discrete-event day: scheduled ticks and their steps, client spikes, faults, sampling."""
    rng = random.Random(seed * 7919 + 1)
    clock, emulator = side.clock, side.emulator
    start = clock.now()
    end = start + hours * 3600
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(at: float, kind: str, index: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, index))

    for i in range(len(side.actors)):
        # The deploy invokes each fleet's reconciler once (on demand); the schedule then ticks
        # every minute at its own phase.
        push(start, "tick", i)
        phase = rng.uniform(0, TICK)
        push(start + max(phase, 1.0), "tick", i)
    push(start, "sample")
    for k in range(int(hours * 60 / spike_every)):
        push(start + 1800 + k * spike_every * 60 + rng.uniform(0, 60), "spike", rng.randrange(len(side.actors)))
    crash_fleet = rng.randrange(len(side.actors))
    push(start + 2 * 3600, "storm_on")
    push(start + 2 * 3600 + 600, "storm_off")
    push(start + 5 * 3600, "capacity_on")
    push(start + 5 * 3600 + 300, "capacity_off")
    push(start + 600, "lost_responses")
    push(start + 900, "crash_loop", crash_fleet)
    tick_started: dict[int, float] = {}
    client_ends: list[tuple[float, str]] = []
    capacity_fault = None
    direct = emulator.direct_client()

    while events:
        at, _, kind, index = heapq.heappop(events)
        if at > end:
            break
        if at > clock.now():
            clock.advance(at - clock.now())
        if kind == "tick":
            if at > start:
                push(at + TICK, "tick", index)
            actor = side.actors[index]
            if side.kind == "ours":
                if not actor.begin_tick(lease_seconds=TICK_DEADLINE + 15, deadline_seconds=TICK_DEADLINE):
                    continue
                tick_started[index] = at
            kind = "step"
        if kind == "step":
            actor = side.actors[index]
            wake = actor.step().wake_after if side.kind == "ours" else actor.step()
            if side.kind == "ours":
                if wake is None or clock.now() + wake > tick_started[index] + TICK_DEADLINE:
                    actor.end_tick()
                    continue
            elif wake is None:
                continue
            push(clock.now() + max(wake, 0.001), "step", index)
        elif kind == "sample":
            sample(side)
            if side.converged_at is None and desired_reached(side):
                side.converged_at = at - start
            while client_ends and client_ends[0][0] <= at:
                _, vm_id = heapq.heappop(client_ends)
                try:
                    direct.terminate_microvm(microvmIdentifier=vm_id)
                except ClientError:
                    pass
            push(at + (1 if side.converged_at is None else 60), "sample")
        elif kind == "spike":
            spec = side.actors[index].spec
            vms = [v for v in emulator.microvms() if v["imageArn"] == spec.image_arn and v["state"] in LIVE]
            for vm in [v for v in vms if v["state"] == "SUSPENDED"][: rng.randint(1, 3)]:
                try:
                    direct.resume_microvm(microvmIdentifier=vm["microvmId"])
                    heapq.heappush(client_ends, (at + rng.uniform(600, 2400), vm["microvmId"]))
                except ClientError:
                    pass
            room = spec.max_vms - len(vms)
            for _ in range(max(0, min(room, rng.randint(0, 3)))):
                try:
                    vm = direct.run_microvm(imageIdentifier=spec.image_arn, clientToken=f"client-{uuid.uuid4()}")
                    heapq.heappush(client_ends, (at + rng.uniform(600, 2400), vm["microvmId"]))
                except ClientError:
                    pass
        elif kind == "storm_on":
            side.storm_throttles = -sum(emulator.throttled.values())  # type: ignore[attr-defined]
            rate, burst = DEFAULT_RATE_LIMITS["RunMicrovm"]
            emulator.set_rate_limit("RunMicrovm", rate / 5, 1)
        elif kind == "storm_off":
            side.storm_throttles += sum(emulator.throttled.values())  # type: ignore[attr-defined]
            emulator.set_rate_limit("RunMicrovm", *DEFAULT_RATE_LIMITS["RunMicrovm"])
        elif kind == "capacity_on":
            capacity_fault = emulator.inject("RunMicrovm", "InsufficientCapacity", probability=0.3, times=None)
        elif kind == "capacity_off" and capacity_fault is not None:
            emulator.remove_fault(capacity_fault)
        elif kind == "lost_responses":
            emulator.inject("RunMicrovm", "lost_response", probability=0.02, times=None)
        elif kind == "crash_loop":
            # One fleet's app crash-loops from now on: every new VM of its image dies 20 s in.
            image = side.actors[index].spec.image_arn
            for vm in emulator.microvms():
                if vm["imageArn"] == image and vm["state"] in LIVE:
                    emulator.crash(vm["microvmId"], reason="app_crashloop")
            emulator.inject("RunMicrovm", "crash", image=image, after_seconds=20, times=None)


def lower_bound(specs: list[FleetSpec]) -> float:
    """The soonest the quotas allow every fleet to reach its desired state from empty."""
    rate, burst = DEFAULT_RATE_LIMITS["RunMicrovm"]
    s_rate, s_burst = DEFAULT_RATE_LIMITS["SuspendMicrovm"]
    total = sum(s.min_vms + s.warm_vms for s in specs)
    warm = sum(s.warm_vms for s in specs)
    runs_done = max(0.0, total - burst) / rate
    suspends_done = PENDING + max(0.0, warm - s_burst) / s_rate if warm else 0.0
    return round(max(runs_done + PENDING, suspends_done) + (SUSPENDING if warm else 0.0), 3)


def report(side: Side, specs: list[FleetSpec]) -> dict[str, Any]:
    emulator = side.emulator
    vms = [vm for vm in emulator.microvms_ever()]
    if side.kind == "ours":
        tokens = Counter(vm["clientToken"] for vm in vms if (vm["clientToken"] or "").startswith("rz1-"))
        duplicates = sum(count - 1 for count in tokens.values())
        attempts = sum(sum(a.telemetry.metrics["RunMicrovmAttempts"]) for a in side.actors)
        units = len(tokens)
        throttles = int(sum(v for (name, _), v in _merge(a.telemetry.by_operation for a in side.actors).items() if name == "Throttles"))
        calls = sum(a.api_calls for a in side.actors)
    else:
        by_token = Counter(vm["clientToken"] for vm in vms)
        duplicates = 0
        units = 0
        for tokens in (t for a in side.actors for t in a.units.values()):
            made = sum(by_token[t] for t in tokens)
            units += 1 if made else 0
            duplicates += max(0, made - 1)
        attempts = sum(a.calls["run_microvm"] for a in side.actors)
        throttles = sum(a.throttles for a in side.actors)
        calls = sum(sum(a.calls.values()) for a in side.actors)
    runs_needed = units
    suspends_needed = sum(1 for vm in vms if vm.get("wasSuspended"))
    ticks = len(side.actors) * int(HOURS_RUN * 3600 / TICK)
    minimum = runs_needed + suspends_needed + ticks
    return {
        "violations_max_vms": side.violations,
        "samples": side.samples,
        "duplicate_vms": duplicates,
        "amplification": round(attempts / units, 4) if units else None,
        "run_attempts": attempts,
        "units_filled": units,
        "throttles_received": throttles,
        "throttles_under_default_quotas": sum(emulator.throttled.values()) - side.storm_throttles,
        "convergence_seconds": side.converged_at,
        "lower_bound_seconds": lower_bound(specs),
        "api_calls": calls,
        "api_calls_minimum": minimum,
    }


def _merge(dicts: Any) -> dict[Any, float]:
    merged: dict[Any, float] = defaultdict(float)
    for d in dicts:
        for k, v in d.items():
            merged[k] += v
    return merged


HOURS_RUN = 24.0


def main() -> None:
    global HOURS_RUN
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--lifetime", type=int, default=28_800)
    parser.add_argument("--spike-every", type=float, default=10.0, help="minutes between client spikes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    HOURS_RUN = args.hours
    specs = make_fleets(args.fleets, random.Random(args.seed))
    out: dict[str, Any] = {}
    for kind in ("ours", "naive"):
        side = build(kind, specs, args.seed, args.lifetime)
        started = time.perf_counter()
        simulate(side, specs, args.seed, args.hours, args.spike_every)
        out[kind] = report(side, specs)
        out[kind]["wall_seconds"] = round(time.perf_counter() - started, 2)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    keys = list(out["ours"])
    print(f"{'':24}{'ours':>14}{'naive':>14}")
    for key in keys:
        print(f"{key:24}{str(out['ours'][key]):>14}{str(out['naive'][key]):>14}")


if __name__ == "__main__":
    main()
