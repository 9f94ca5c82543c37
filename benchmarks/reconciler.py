"""One account, N fleets, a day on the virtual clock: our reconciler beside a careful user's,
every figure counted from what the MicroVMs emulator saw.

    .venv/bin/python -m benchmarks.reconciler --fleets 100 --seed 1 [--hours 24] [--json] [--side ours]

Each side runs in a process of its own (its wall time and peak memory are its own) against its own
emulator with the measured defaults (``rayito_constructs.testing.measured``) and the same day:

* **ours** is the reconciler as it runs in AWS, as far as a benchmark can: the construct's
  environment variables read by ``index.spec_from_env``, the handler's one-attempt client made
  from ``index.session()`` (the bundled model), the tick code, invoked through ``index.handler``
  with a Lambda context when the reconciler lets the handler's sleeps be driven (else
  ``Reconciler.tick``); one execution environment per concurrent invocation, kept warm between
  ticks; the ledger and the shared budget are the in-memory stores (DynamoDB's semantics, no
  moto: 300 fleets for a day would take hours).
* **naive** is what a careful user writes: each tick lists the image, starts what is missing with
  one client token per unit of work and the SDK's standard retries (3 attempts, back-off on the
  virtual clock), and parks the newest RUNNING VMs above ``min_vms``.

The day: every VM expires after 8 hours (``--lifetime`` makes them shorter); a client spike every 10 minutes (parked slots taken,
client VMs of the fleet's image up to ``max_vms``, ended 10-40 minutes later); another app
keeping VMs on some fleets' images (foreign VMs); overlapping ticks (duplicate deliveries,
deploys); Lambda environments whose clock is 30 s off; Lambdas killed mid-tick; lost RunMicrovm
responses; one app that crash-loops (from 2 fleets); a throttling storm; an hour of late lists (6 s); 500s that
make no VM; InsufficientCapacity; the memory quota reached (402); failing ``/suspend`` hooks; an
image rollout (fresh versions, slow first launches); a spec change. See docs/performance.md for
every key.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import random
import resource
import sys
import threading
import time
import uuid
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from botocore.exceptions import ClientError

from benchmarks.simulation import Killed, SimClock, Simulation
from rayito._payload import ACCESS_TOKEN_BYTES, encode_access_token
from rayito_constructs.testing import MicrovmsEmulator, RequestRecord, measured, sdk_sleeps_on
from rayito_constructs.testing import server as _server
from rayito_constructs.testing.server import install_in_process
from rayito_constructs.testing.serving import VirtualServer, serving_spans

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mi-agente"

_NULL = open(os.devnull, "w")  # noqa: SIM115 - telemetry lines of a day go nowhere

LIVE = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")
#: RUNNING to the agent host ready (rayd ready, then the host started): measured (``measured``).
SERVE_SECONDS = measured.AGENT_READY_AFTER_RUNNING_SECONDS + measured.AGENT_HOST_START_SECONDS
TICK = 60.0
TICK_SECONDS = 50  # the construct's default tick_seconds
LAMBDA_TIMEOUT = TICK_SECONDS + 15  # the construct's function timeout
MEMORY_MIB = 512
LIFETIME_SECONDS = 28_800  # every fleet VM's maximumDurationInSeconds: the service's cap (--lifetime)
MEMORY_QUOTA_MIB = 4 * 1024 * 1024  # room for every fleet, except in the 402 window
#: A live reconciler VM within this long of its end is a slot's retiring VM: its successor is no
#: duplicate (the reconciler's default successor lead is 900 s).
RETIRING_WINDOW = 1200.0
STORM = (2 * 3600.0, 2 * 3600.0 + 600)
LATE_LISTS = (3 * 3600.0, 4 * 3600.0)
NO_VM_500S = (4 * 3600.0, 4 * 3600.0 + 1800)
CAPACITY = (5 * 3600.0, 5 * 3600.0 + 300)
QUOTA_402 = (6 * 3600.0, 6 * 3600.0 + 600)
ROLLOUT = 7 * 3600.0
SPEC_CHANGE = 9 * 3600.0
RAISE_GRACE = 120.0
#: A lowered max_vms is enforced from this long after the change: the deploy invokes the changed
#: fleet's reconciler within 30 s of it (the only way a reconciler learns of the change before its
#: next scheduled tick), and a parked VM it ends stops counting at once (TERMINATING is not live).
#: Before, a sample at the very second of the change counted VMs no reconciler could have ended.
LOWER_GRACE = 35.0
#: A take the client abandons (it failed to reach the VM, or gave up): the VM gets no session and
#: the client never ends it; its idle policy is all that stops it running.
ABANDONED_TAKES = 0.25
DUPLICATE_DELIVERY = 0.02  # EventBridge Scheduler delivers at least once
KILL_PER_INVOCATION = 0.01
SKEWED_ENVIRONMENTS = 0.1
SKEW_SECONDS = 30.0

#: CPU seconds the emulator spent serving requests, per thread: the in-process client hands each
#: request to the emulator in the caller's thread, so an invocation's own CPU is its thread's CPU
#: less this (``Side.invoke``).
_EMULATOR_CPU: dict[int, float] = defaultdict(float)
_handle = _server.handle


def _timed_handle(*args: Any, **kwargs: Any) -> Any:
    started = time.thread_time()
    try:
        return _handle(*args, **kwargs)
    finally:
        _EMULATOR_CPU[threading.get_ident()] += time.thread_time() - started


_server.handle = _timed_handle


# =========================================================================================== fleets


@dataclass
class Fleet:
    index: int
    name: str
    min_vms: int
    max_vms: int
    warm_vms: int
    image: str = ""
    version: Optional[str] = None  # the IMAGE_VERSION a rollout sets
    changes: list[tuple[float, int, int, int]] = field(default_factory=list)  # (time, min, max, warm)

    def min_owed(self, t: float) -> int:
        """The ``min_vms`` a dip is counted against: a raised ``min_vms`` is owed from
        ``RAISE_GRACE`` seconds after the deploy that raised it (its on-demand tick and PENDING)."""
        owed = self.min_vms
        for at, min_vms, _, _ in self.changes:
            if at <= t:
                owed = min_vms if min_vms <= owed or t >= at + RAISE_GRACE else owed
        return owed

    def max_allowed(self, t: float) -> int:
        """The ``max_vms`` a sample is judged against: a lowered one from ``LOWER_GRACE`` seconds
        after the deploy that lowered it, a raised one at once."""
        allowed = self.max_vms
        for at, _, max_vms, _ in self.changes:
            if at <= t:
                allowed = max_vms if max_vms >= allowed or t >= at + LOWER_GRACE else allowed
        return allowed

    def spec_at(self, t: float) -> tuple[int, int, int]:
        spec = (self.min_vms, self.max_vms, self.warm_vms)
        for at, *values in self.changes:
            if at <= t:
                spec = tuple(values)  # type: ignore[assignment]
        return spec  # type: ignore[return-value]


def make_fleets(count: int, rng: random.Random) -> list[Fleet]:
    fleets = []
    for i in range(count):
        min_vms = rng.randint(1, 8)
        warm = rng.randint(0, 4)
        max_vms = min(64, min_vms + warm + rng.randint(0, 12))
        fleets.append(Fleet(i, f"fleet-{i:03d}", min_vms, max_vms, warm))
    return fleets


def lower_bound(fleets: list[Fleet], pending: float = measured.PENDING_SECONDS,
                suspending: float = measured.SUSPENDING_SECONDS, serve: float = 0.0, warm_up: float = 0.0) -> float:
    """The soonest the documented RunMicrovm and SuspendMicrovm quotas allow every fleet to reach its
    desired state from empty, with the measured PENDING and SUSPENDING times, and the measured
    RUNNING-to-ready times: ``serve`` for a base VM's agent host, ``warm_up`` for a parked slot's
    warming before its suspend."""
    rate, burst = measured.DOCUMENTED_RATE_LIMITS["RunMicrovm"]
    s_rate, s_burst = measured.DOCUMENTED_RATE_LIMITS["SuspendMicrovm"]
    total = sum(f.min_vms + f.warm_vms for f in fleets)
    warm = sum(f.warm_vms for f in fleets)
    runs_done = max(0.0, total - burst) / rate
    suspends_done = pending + warm_up + max(0.0, warm - s_burst) / s_rate if warm else 0.0
    parked = max(runs_done + pending + warm_up, suspends_done) + suspending if warm else 0.0
    return round(max(runs_done + pending + serve, parked), 3)


# =========================================================================================== sides


class Context:
    """The Lambda context the handler reads its deadline from."""

    def __init__(self, sim: Simulation, started: float) -> None:
        self._sim, self._end = sim, started + LAMBDA_TIMEOUT

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._end - self._sim.now()) * 1000))


class _Dying:
    """A store or telemetry seen through an execution environment that may be killed: once it is,
    every call raises :class:`Killed` (a killed Lambda writes nothing more, not even in finally)."""

    def __init__(self, env: "Environment", target: Any) -> None:
        self._env, self._target = env, target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        env = self._env

        def call(*args: Any, **kwargs: Any) -> Any:
            if env.dead:
                raise Killed(env.name)
            return value(*args, **kwargs)

        setattr(self, name, call)  # looked up once per environment
        return call


@dataclass(eq=False)
class Environment:
    """One Lambda execution environment: its own clock skew, client and state."""

    name: str
    fleet: Fleet
    skew: float
    client: Any
    reconciler: Any = None
    dead: bool = False
    busy: bool = False
    calls: int = 0
    kill_after: Optional[int] = None
    spec_key: str = ""
    retire_at: float = math.inf


class Side:
    """One side's account: the emulator, the simulation, the fleets' Lambdas and their clients."""

    kind = ""

    def __init__(self, fleets: list[Fleet], seed: int, hours: float, lifetime: int = LIFETIME_SECONDS) -> None:
        self.fleets = fleets
        self.seed = seed
        self.hours = hours
        self.lifetime = lifetime  # every fleet VM's maximumDurationInSeconds (--lifetime)
        self.rng = random.Random(seed * 7919 + 1)
        self.clock = SimClock()
        self.sim = Simulation(self.clock)
        self.start = self.clock.now()
        self.emulator = MicrovmsEmulator(clock=self.clock, seed=seed, memory_quota_mib=MEMORY_QUOTA_MIB,
                                         request_log_size=1000)
        self.pool: dict[str, list[Environment]] = defaultdict(list)
        self.envs = 0
        self.invocations = 0
        self.kills = 0
        self.invocation_errors: Counter = Counter()
        #: CPU seconds of the side's own code in its invocations (the emulator's share left out).
        self.own_cpu = 0.0
        self.first_error: Optional[str] = None
        self.abandoned: dict[str, float] = {}  # a VM taken and abandoned -> when it was taken
        self.lambda_seconds = 0.0  # the invocations' durations, as Lambda bills them
        self.log = Log(self)
        self.emulator.subscribe(self.log.record)
        for fleet in fleets:
            fleet.image = self.emulator.create_image(fleet.name, MEMORY_MIB, hooks=True)  # the product's image

    # ------------------------------------------------------------------ Lambda invocations

    def caller(self, fleet: Fleet, n: int) -> str:
        return f"{self.kind}-{fleet.index}-{n}"

    def environment(self, fleet: Fleet) -> Environment:
        now = self.sim.now()
        for env in list(self.pool[fleet.name]):
            if not env.busy and env.retire_at <= now:
                self.pool[fleet.name].remove(env)  # Lambda recycles execution environments
        idle = [e for e in self.pool[fleet.name] if not e.busy and not e.dead]
        if idle:
            return idle[0]
        self.envs += 1
        # After the first 10 minutes (convergence from empty is measured without it), a new
        # environment's clock is 30 s off now and then.
        skewed = now > self.start + 600 and self.rng.random() < SKEWED_ENVIRONMENTS
        skew = self.rng.choice([-1, 1]) * self.rng.uniform(SKEW_SECONDS / 2, SKEW_SECONDS) if skewed else 0.0
        env = Environment(f"{fleet.name}/{self.envs}", fleet, skew, None, retire_at=now + self.rng.uniform(3600, 3 * 3600))
        env.client = self.make_client(fleet, self.caller(fleet, self.envs), env)
        self.setup(env)
        self.pool[fleet.name].append(env)
        return env

    def make_client(self, fleet: Fleet, caller: str, env: Environment) -> Any:
        raise NotImplementedError

    def setup(self, env: Environment) -> None:
        pass

    def arm_kills(self, client: Any, env: Environment) -> None:
        def after_call(**_: Any) -> None:
            env.calls += 1
            if env.kill_after is not None and env.calls >= env.kill_after:
                env.dead = True  # the call reached the service; its answer dies with the Lambda
                raise Killed(env.name)

        client.meta.events.register("after-call.lambda-microvms", after_call)

    def invoke(self, fleet: Fleet, at: float, *, kill: bool = False) -> None:
        """An invocation of the fleet's reconciler Lambda at ``at``."""
        held: dict[str, Environment] = {}

        def run() -> None:
            me = threading.get_ident()
            cpu, served = time.thread_time(), _EMULATOR_CPU[me]
            try:
                invocation()
            finally:
                self.own_cpu += (time.thread_time() - cpu) - (_EMULATOR_CPU[me] - served)

        def invocation() -> None:
            env = self.environment(fleet)
            held["env"] = env
            env.busy = True
            env.calls = 0
            env.kill_after = self.rng.randint(1, 3) if kill else None
            self.invocations += 1
            began = self.sim.now()
            try:
                self.tick(env, began)
            except Exception as exc:  # noqa: BLE001 - a failed invocation; the next tick runs anyway
                self.invocation_errors[type(exc).__name__] += 1
                if self.first_error is None:
                    import traceback

                    self.first_error = traceback.format_exc()
            finally:
                self.lambda_seconds += self.sim.now() - began  # billed duration (virtual time)
                env.busy = False
                env.kill_after = None
                if env.dead:
                    self.kills += 1
                    self.pool[fleet.name].remove(env)

        task = self.sim.spawn_at(at, run, f"{self.kind}:{fleet.name}")

        def timeout() -> None:
            # The Lambda's own timeout: an invocation still running is frozen, then killed.
            if not task.done:
                if "env" in held:
                    held["env"].dead = True
                self.sim.kill(task)

        self.sim.call_at(at + LAMBDA_TIMEOUT, timeout)

    def tick(self, env: Environment, started: float) -> None:
        raise NotImplementedError

    def ready_at(self, vms: list[dict[str, Any]]) -> dict[str, float]:
        """When each VM could first take a session (its agent host ready): a VM of the side's own
        serves from its first RUNNING plus the measured start of the agent host (a careful user's
        image starts its app itself)."""
        ready = {}
        for vm in vms:
            running = next((at for at, state, _ in vm["history"] if state == "RUNNING"), None)
            if running is not None:
                ready[vm["microvmId"]] = running + SERVE_SECONDS
        return ready

    def ready_seconds(self) -> tuple[float, float]:
        """RUNNING to a member's agent host ready, and to a parked slot's VM warmed."""
        return SERVE_SECONDS, SERVE_SECONDS

    def env_vars(self, fleet: Fleet) -> dict[str, str]:
        min_vms, max_vms, warm_vms = fleet.spec_at(self.sim.now() - self.start)
        env = {
            "FLEET_NAME": fleet.name, "IMAGE_ARN": fleet.image, "MIN_VMS": str(min_vms), "MAX_VMS": str(max_vms),
            "WARM_VMS": str(warm_vms), "MAX_LIFETIME_SECONDS": str(self.lifetime), "SUCCESSOR_LEAD_SECONDS": "900",
            "MAX_START_ATTEMPTS": "3", "MAX_STARTS_PER_STEP": "10", "TICK_SECONDS": str(TICK_SECONDS),
            "LEDGER_TABLE": "ledger", "BUDGET_TABLE": "budget", "BUDGETS": "{}",
        }
        if fleet.version:
            env["IMAGE_VERSION"] = fleet.version
        return env

    # ------------------------------------------------------------------ the day

    def schedule(self) -> None:
        rng, start, sim = self.rng, self.start, self.sim
        end = start + self.hours * 3600
        for fleet in self.fleets:
            # The deploy invokes each fleet's reconciler once; the schedule then ticks every minute
            # at its own phase.
            self.invoke(fleet, start)
            sim.call_at(start + max(rng.uniform(0, TICK), 1.0), lambda f=fleet: self.scheduled(f, end))
        clients = Clients(self)
        for k in range(int(self.hours * 6)):
            at = start + 1800 + k * 600 + rng.uniform(0, 60)
            if at < end:
                fleet = rng.choice(self.fleets)
                sim.spawn_at(at, lambda f=fleet: clients.spike(f), "spike")
        for fleet in rng.sample(self.fleets, max(1, len(self.fleets) // 10)):
            sim.spawn_at(start + 1200 + rng.uniform(0, 600), lambda f=fleet: clients.other_app(f, end), "other-app")
        emu = self.emulator

        def window(span: tuple[float, float], on: Callable[[], Any], off: Callable[[], Any]) -> None:
            if start + span[0] < end:
                sim.call_at(start + span[0], on)
                sim.call_at(start + span[1], off)

        faults: dict[str, Any] = {}
        sim.call_at(start + 600, lambda: emu.inject("RunMicrovm", "lost_response", probability=0.02, times=None))
        crash_fleet = rng.choice(self.fleets)
        # One fleet's app crash-loops: never the only fleet, whose VMs would all end 15 minutes in
        # and leave nothing to measure (1 fleet: no take, no refill, 2 h 45 min of an empty fleet).
        # Drawn all the same, so that every later draw, and every larger run, stays as it was.
        if len(self.fleets) > 1:
            sim.call_at(start + 900, lambda: self.crash_loop(crash_fleet))
        sim.call_at(start + 900, lambda: emu.inject("SuspendMicrovm", "suspend_hook_failure", probability=0.01, times=None))
        window(STORM, lambda: emu.set_rate_limit("RunMicrovm", 1, 1, surge=0),
               lambda: emu.set_rate_limit("RunMicrovm", *measured.DOCUMENTED_RATE_LIMITS["RunMicrovm"]))
        window(LATE_LISTS, lambda: setattr(emu, "stale_seconds", 6.0), lambda: setattr(emu, "stale_seconds", 0.0))
        window(NO_VM_500S, lambda: faults.__setitem__("500", emu.inject("RunMicrovm", "InternalServer", probability=0.05, times=None)),
               lambda: emu.remove_fault(faults["500"]))
        window(CAPACITY, lambda: faults.__setitem__("cap", emu.inject("RunMicrovm", "InsufficientCapacity", probability=0.3, times=None)),
               lambda: emu.remove_fault(faults["cap"]))
        window(QUOTA_402, lambda: setattr(emu, "memory_quota_mib", emu.memory_in_use_mib() + 4 * MEMORY_MIB),
               lambda: setattr(emu, "memory_quota_mib", MEMORY_QUOTA_MIB))
        if start + ROLLOUT < end:
            rolled = rng.sample(self.fleets, max(1, len(self.fleets) * 3 // 10))
            sim.call_at(start + ROLLOUT, lambda: self.rollout(rolled))
        if start + SPEC_CHANGE < end:
            changed = rng.sample(self.fleets, max(1, len(self.fleets) // 5))
            for fleet in changed:
                min_vms, max_vms, warm = fleet.spec_at(SPEC_CHANGE)
                kind = rng.choice(["shrink_max", "grow_min", "shrink_warm", "shrink_min"])
                if kind == "shrink_max":
                    max_vms = max(min_vms + warm, max_vms // 2)
                elif kind == "grow_min":
                    min_vms = min(min_vms + rng.randint(1, 3), max_vms - warm)
                elif kind == "shrink_warm":
                    warm = max(0, warm - rng.randint(1, 2))
                else:
                    min_vms = max(1, min_vms - rng.randint(1, 2))
                fleet.changes.append((SPEC_CHANGE, min_vms, max_vms, warm))
            # The deploy invokes each changed fleet's reconciler on demand: it may overlap a tick.
            for fleet in changed:
                d = start + SPEC_CHANGE + rng.uniform(0, 30)
                sim.call_at(d, lambda f=fleet, d=d: self.invoke(f, d))

    def scheduled(self, fleet: Fleet, end: float) -> None:
        """EventBridge Scheduler's tick: at least once (a duplicate now and then); some invocations
        are killed mid-tick."""
        now = self.sim.now()
        late = now > self.start + 600
        self.invoke(fleet, now, kill=late and self.rng.random() < KILL_PER_INVOCATION)
        if late and self.rng.random() < DUPLICATE_DELIVERY:
            self.invoke(fleet, now + self.rng.uniform(0, 5))
        if now + TICK < end:
            self.sim.call_at(now + TICK, lambda: self.scheduled(fleet, end))

    def crash_loop(self, fleet: Fleet) -> None:
        """One fleet's app crash-loops from now on: every new VM of its image exits 20 s in."""
        for vm in self.emulator.microvms():
            if vm["imageArn"] == fleet.image and vm["state"] in LIVE:
                self.emulator.crash(vm["microvmId"], reason="app_crashloop")
        self.emulator.inject("RunMicrovm", "crash", image=fleet.image, after_seconds=20, times=None)
        self.log.crash_fleet = fleet.name

    def rollout(self, fleets: list[Fleet]) -> None:
        """A deploy built a new version of these fleets' images and set IMAGE_VERSION."""
        for fleet in fleets:
            fleet.version = self.emulator.publish_version(fleet.name)  # fresh: slow first launches
            d = self.sim.now() + self.rng.uniform(0, 30)
            self.sim.call_at(d, lambda f=fleet, d=d: self.invoke(f, d))

    def run(self) -> None:
        self.schedule()
        with open(os.devnull, "w") as null, sdk_sleeps_on(self.clock), contextlib.redirect_stdout(null), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Powertools' warnings, once per environment
            self.sim.run(self.start + self.hours * 3600)
        self.sim.close()


class Ours(Side):
    kind = "rec"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from lambdas.reconciler import index
        from lambdas.reconciler.budget import WATCH_OPERATION, Deferral, MemoryBudget
        from lambdas.reconciler.ledger import MemoryLedger
        from lambdas.reconciler.tick import Reconciler

        self.index, self.Reconciler = index, Reconciler
        self.fields = {f.name for f in dataclasses.fields(Reconciler)}
        self.ledger, self.budget = MemoryLedger(), MemoryBudget()
        self.watch_gets = 0  # GetMicrovm the parked-slot watches were granted (the budget's own bucket)
        acquire = self.budget.acquire

        def counted(operation: str, *args: Any, **kwargs: Any) -> Any:
            decision = acquire(operation, *args, **kwargs)
            if operation == WATCH_OPERATION and not isinstance(decision, Deferral):
                self.watch_gets += decision.cost
            return decision

        self.budget.acquire = counted  # type: ignore[method-assign]
        # The fleet's server (a function of its own in AWS), in virtual time: it answers each ask
        # in the ledger when the VM's agent host is ready (a base slot's) or its slot warmed.
        self.server = VirtualServer(self.emulator, self.ledger)
        self.recipes = Recipes(self)
        self.session = index.session()
        self.config = getattr(index, "MICROVMS_CONFIG", None)
        # The handler drives the tick's sleeps only if the reconciler takes a ``sleep``; else the
        # benchmark calls Reconciler.tick (the handler's only call) with the simulation's sleep.
        self.through_handler = "sleep" in self.fields and hasattr(index, "handler")
        os.environ["TICK_SECONDS"] = str(TICK_SECONDS)

    def make_client(self, fleet: Fleet, caller: str, env: Environment) -> Any:
        """The handler's client: from ``index.session()`` (the bundled model) with the handler's
        config (``index.MICROVMS_CONFIG`` when there is one, else botocore's default, as the
        handler makes it), its requests handed to the emulator in process."""
        options = {"config": self.config} if self.config is not None else {}
        client = self.session.client("lambda-microvms", endpoint_url="http://emulator.invalid", region_name=self.emulator.region,
                                     aws_access_key_id=caller, aws_secret_access_key="x", **options)
        install_in_process(client, self.emulator)
        _fast_timestamps(client)
        self.arm_kills(client, env)
        return client

    def telemetry(self, fleet: Fleet) -> Any:
        index = self.index
        if hasattr(index, "telemetry_for"):
            return index.telemetry_for(fleet.name)
        from lambdas.reconciler.telemetry import EmfTelemetry

        return EmfTelemetry(fleet.name, out=_NULL)

    def setup(self, env: Environment) -> None:
        self.rebuild(env)

    def rebuild(self, env: Environment) -> None:
        """The reconciler of an environment, from the construct's environment variables (a deploy
        that changes them starts new environments; a warm one keeps its spec until then)."""
        vars_ = self.env_vars(env.fleet)
        spec = self.index.spec_from_env(vars_)
        kwargs: dict[str, Any] = dict(
            spec=spec, microvms=env.client, ledger=_Dying(env, self.ledger), budget=_Dying(env, self.budget),
            telemetry=_Dying(env, self.telemetry(env.fleet)), clock=lambda: self.sim.now() + env.skew,
            dead_letters=lambda record: None, server=_Dying(env, self.server),
            state_source=self.recipes.source(env, vars_, spec),
        )
        if "sleep" in self.fields:
            kwargs["sleep"] = lambda seconds: self.clock.sleep_until(self.clock.now() + seconds)
        if "monotonic" in self.fields:
            kwargs["monotonic"] = self.sim.now  # the skew is the wall clock's; the deadline's clock has none
        if "siblings" in self.fields:
            kwargs["siblings"] = ()
        env.reconciler = self.Reconciler(**kwargs)
        env.spec_key = json.dumps(vars_, sort_keys=True)

    def ready_at(self, vms: list[dict[str, Any]]) -> dict[str, float]:
        """The server's answers: a base slot's VM serves from its agent host's ready marker; a
        parked slot's VM (warmed) only once resumed after it was parked (a base slot took it over:
        a client's take is no longer the fleet's)."""
        ready = dict(self.server.served)
        warmed = set(self.server.warmed) - set(ready)
        for vm in vms:
            if vm["microvmId"] not in warmed:
                continue
            parked = next((at for at, state, _ in vm["history"] if state == "SUSPENDED"), None)
            resumed = next((at for at, state, _ in vm["history"] if parked is not None and at > parked
                            and state == "RUNNING"), None)
            if resumed is not None:
                ready[vm["microvmId"]] = resumed
        return ready

    def ready_seconds(self) -> tuple[float, float]:
        return self.server.serve_seconds, self.server.warm_seconds

    def env_vars(self, fleet: Fleet) -> dict[str, str]:
        """The construct's environment: the scaling the stack deployed (the recipe, read each tick,
        is what the fleet is), the access token's secret and the server function."""
        return super().env_vars(fleet) | {"ACCESS_TOKEN_SECRET": f"rayito/agents/{fleet.name}/access-token",
                                          "SERVER_FUNCTION": f"{fleet.name}-server",
                                          "WATCH_SECONDS": os.environ.get("BENCH_WATCH_SECONDS", "5")}

    def tick(self, env: Environment, started: float) -> None:
        if env.spec_key != json.dumps(self.env_vars(env.fleet), sort_keys=True):
            self.rebuild(env)  # a deploy changed the environment: a new execution environment
        context = Context(self.sim, started)
        if self.through_handler:
            self.index._RECONCILER = env.reconciler
            try:
                self.index.handler({"source": "schedule"}, context)
            finally:
                # The handler's warm-environment global is this environment's only during its
                # invocation: a process that runs the benchmark and then the handler (the test
                # suite's worker) must not find a benchmark fleet's reconciler there.
                self.index._RECONCILER = None
        else:
            remaining = context.get_remaining_time_in_millis() / 1000
            deadline = min(float(TICK_SECONDS), max(1.0, remaining - 5))
            env.reconciler.tick(deadline_seconds=deadline, lease_seconds=remaining + 30,
                                sleep=lambda s: self.clock.sleep_until(self.clock.now() + s))

    def ledger_claims(self, fleet: Fleet) -> set[str]:
        """VMs the ledger says fill one of the fleet's base or parked slots."""
        try:
            slots, _ = self.ledger.load(fleet.name)
        except Exception:  # noqa: BLE001 - a ledger shape this benchmark does not know
            return set()
        claimed = set()
        for slot in slots.values():
            if getattr(slot, "role", None) in ("base", "warm"):
                for attr in ("microvm_id", "retiring_id"):
                    vm = getattr(slot, attr, None)
                    if vm:
                        claimed.add(vm)
        return claimed


class Recipes:
    """What a deploy leaves for each fleet's reconciler: the product's recipe of the example project,
    named after the fleet, with its scaling now (a spec change is a deploy that rewrites it) and its
    image version (a rollout), at ``/rayito/agents/<fleet>/recipe``; and the fleet's access token.
    SSM and Secrets Manager are in memory here (the ledger and the budget are too); the reconciler
    reads them with its own ``RecipeSource``/``TokenSource``, the product's decoder included."""

    def __init__(self, side: "Ours") -> None:
        self.side = side
        self.values: dict[tuple[str, tuple[int, int, int], Optional[str]], str] = {}
        self.reads = 0

    def value(self, fleet: Fleet) -> str:
        from rayito_constructs import AgentProject
        from rayito_constructs.model.product import encode, recipe

        spec = fleet.spec_at(self.side.sim.now() - self.side.start)
        key = (fleet.name, spec, fleet.version)
        if key not in self.values:
            project = AgentProject.load(EXAMPLE, min_vms=spec[0], max_vms=spec[1], warm=spec[2])
            product = dataclasses.replace(project.product, name=fleet.name)
            _, value = encode(recipe(product, project.product_scaling, renew_gateway_keys=False,
                                     image_version=fleet.version or "1.0"))
            assert value is not None
            self.values[key] = value
        return self.values[key]

    def source(self, env: Environment, vars_: dict[str, str], spec: Any) -> Any:
        from lambdas.reconciler.fleet_source import FleetSource, RecipeSource, TokenSource

        fleet, recipes = env.fleet, self
        token_value = encode_access_token(random.Random(f"token-{fleet.name}").randbytes(ACCESS_TOKEN_BYTES))

        class Parameters:
            def get_parameter(self, Name: str, WithDecryption: bool = False) -> dict[str, Any]:  # noqa: N803 - boto3's
                recipes.reads += 1
                return {"Parameter": {"Name": Name, "Value": recipes.value(fleet)}}

        class Secrets:
            def get_secret_value(self, SecretId: str) -> dict[str, Any]:  # noqa: N803 - boto3's
                return {"SecretString": token_value}

        token = TokenSource(_Dying(env, Secrets()), vars_["ACCESS_TOKEN_SECRET"], self.side.sim.now)
        return FleetSource(vars_, spec, RecipeSource(_Dying(env, Parameters()), fleet.name), token,
                           self.side.emulator.region)


class Naive(Side):
    """What a careful user writes: list, start what is missing with one token per unit of work and
    the SDK's standard retries, park the newest RUNNING VMs above ``min_vms``."""

    kind = "naive"

    def make_client(self, fleet: Fleet, caller: str, env: Environment) -> Any:
        client = self.emulator.client(in_process=True, access_key=caller, retries=3)  # the SDK's standard mode
        _fast_timestamps(client)
        self.arm_kills(client, env)
        return client

    def tick(self, env: Environment, started: float) -> None:
        fleet, client = env.fleet, env.client
        min_vms, max_vms, warm_vms = fleet.spec_at(self.sim.now() - self.start)
        try:
            items, token = [], None
            while True:
                page = client.list_microvms(imageIdentifier=fleet.image, maxResults=50, **({"nextToken": token} if token else {}))
                items += page["items"]
                token = page.get("nextToken")
                if not token:
                    break
        except ClientError:
            return
        live = [v for v in items if v["state"] in LIVE]
        parked = [v for v in live if v["state"] in ("SUSPENDING", "SUSPENDED")]
        running = sorted((v for v in live if v["state"] == "RUNNING"), key=lambda v: v["startedAt"])
        missing = min(min_vms + warm_vms - len(live), max_vms - len(live))
        for _ in range(max(0, missing)):
            try:
                client.run_microvm(imageIdentifier=fleet.image, clientToken=uuid.UUID(int=self.rng.getrandbits(128)).hex,
                                   maximumDurationInSeconds=self.lifetime)
            except ClientError:
                break
        for vm in running[::-1][: max(0, min(len(running) - min_vms, warm_vms - len(parked)))]:
            with contextlib.suppress(ClientError):
                client.suspend_microvm(microvmIdentifier=vm["microvmId"])


class Clients:
    """The fleets' clients (their own VMs, parked slots taken) and another app sharing an image."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.rng = random.Random(side.seed * 104729 + 7)

    def _client(self, who: str) -> Any:
        return self.side.emulator.direct_client(caller=who)

    def _live(self, client: Any, fleet: Fleet) -> list[dict[str, Any]]:
        items, token = [], None
        while True:
            page = client.list_microvms(imageIdentifier=fleet.image, maxResults=50, **({"nextToken": token} if token else {}))
            items += page["items"]
            token = page.get("nextToken")
            if not token:
                return [v for v in items if v["state"] in LIVE]

    def _true_live(self, fleet: Fleet) -> int:
        return sum(1 for v in self.side.emulator.microvms() if v["imageArn"] == fleet.image and v["state"] in LIVE)

    def spike(self, fleet: Fleet) -> None:
        client = self._client(f"client-{fleet.index}")
        rng, sim = self.rng, self.side.sim
        try:
            live = self._live(client, fleet)
        except ClientError:
            return
        ends = []
        # The product's client takes parked slots (rayd's labels tell them), never a member its idle
        # policy suspended: the emulator's truth stands in for the labels.
        idle = {v["microvmId"] for v in self.side.emulator.microvms() if v.get("idleSuspended")}
        for vm in [v for v in live if v["state"] == "SUSPENDED" and v["microvmId"] not in idle][: rng.randint(1, 3)]:
            try:
                client.resume_microvm(microvmIdentifier=vm["microvmId"])
            except ClientError:
                continue
            if rng.random() < ABANDONED_TAKES:
                self.side.abandoned[vm["microvmId"]] = sim.now()  # taken, then never used nor ended
            else:
                ends.append(vm["microvmId"])
        _, max_vms, _ = fleet.spec_at(sim.now() - self.side.start)
        # Clients are the scenario, not under test: they keep within max_vms by the service's truth.
        for _ in range(max(0, min(max_vms - self._true_live(fleet), rng.randint(0, 3)))):
            with contextlib.suppress(ClientError):
                ends.append(client.run_microvm(imageIdentifier=fleet.image, clientToken=f"client-{uuid.UUID(int=rng.getrandbits(128))}")["microvmId"])
        for vm in ends:
            sim.spawn_at(sim.now() + rng.uniform(600, 2400), lambda v=vm: self._end(client, v), "client-end")

    def _end(self, client: Any, vm: str) -> None:
        with contextlib.suppress(ClientError):
            client.terminate_microvm(microvmIdentifier=vm)

    def other_app(self, fleet: Fleet, end: float) -> None:
        """Another app on the same image keeps one VM of its own (2-hour lifetime) when there is room."""
        client = self._client(f"other-{fleet.index}")
        sim = self.side.sim
        mine: Optional[str] = None
        while sim.now() < end - 600:
            try:
                live = self._live(client, fleet)
                if mine not in {v["microvmId"] for v in live}:
                    mine = None
                _, max_vms, _ = fleet.spec_at(sim.now() - self.side.start)
                if mine is None and self._true_live(fleet) < max_vms:
                    mine = client.run_microvm(imageIdentifier=fleet.image, maximumDurationInSeconds=7200,
                                              clientToken=f"other-{uuid.UUID(int=self.rng.getrandbits(128))}")["microvmId"]
            except ClientError:
                pass
            self.side.clock.sleep_until(sim.now() + 600)


def _fast_timestamps(client: Any) -> None:
    """Timestamps parsed straight to UTC datetimes: the same instants botocore's default parser
    gives (through dateutil's slow ``tzlocal``), a third of the time per ListMicrovms page. It is
    a documented parser default (``ResponseParserFactory.set_parser_defaults``), not a stub."""
    import datetime as dt

    def parse(value: Any) -> dt.datetime:
        if isinstance(value, (int, float)):
            return dt.datetime.fromtimestamp(value, dt.timezone.utc)
        from botocore.utils import parse_timestamp

        return parse_timestamp(value)

    client._endpoint._response_parser_factory.set_parser_defaults(timestamp_parser=parse)


# =========================================================================================== ground truth


class Log:
    """What the emulator answered, aggregated as it happens (the request log would not fit a day)."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.calls: Counter = Counter()  # (kind, operation)
        self.errors: Counter = Counter()  # (kind, operation, code)
        self.throttles: Counter = Counter()  # (kind, in_storm)
        self.held: Counter = Counter()  # kind
        self.mutations: list[tuple[str, int, str, str, float]] = []  # (kind, fleet, operation, vm, time)
        self.quota_minutes: set = set()
        self.crash_fleet: Optional[str] = None

    def record(self, r: RequestRecord) -> None:
        kind, fleet = _who(r.caller)
        self.calls[kind, r.operation] += 1
        if r.error:
            self.errors[kind, r.operation, r.error] += 1
            if r.error == "ThrottlingException":
                t = r.time - self.side.start
                self.throttles[kind, STORM[0] <= t < STORM[1] + 5] += 1
            if r.error == "ServiceQuotaExceededException" and r.operation == "RunMicrovm":
                self.quota_minutes.add((kind, fleet, int((r.time - self.side.start) // 60)))
        elif r.operation in ("SuspendMicrovm", "ResumeMicrovm", "TerminateMicrovm") and r.microvm_id:
            self.mutations.append((kind, fleet, r.operation, r.microvm_id, r.time))
        if r.held_seconds:
            self.held[kind] += 1


def _who(caller: Optional[str]) -> tuple[str, int]:
    if not caller or "-" not in caller:
        return ("bench", -1)
    parts = caller.split("-")
    try:
        return parts[0], int(parts[1])
    except (IndexError, ValueError):
        return parts[0], -1


def report(side: Side, ledger_claims: dict[str, set[str]]) -> dict[str, Any]:
    """Every figure from the emulator's VM records and request log (and, for 'counted as its own
    slot's', from the ledger's contents, sampled during the day)."""
    kind, start, hours = side.kind, side.start, side.hours
    end = start + hours * 3600
    log = side.log
    vms = side.emulator.microvms_ever()
    by_image: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for vm in vms:
        by_image[vm["imageArn"]].append(vm)
    taken: dict[str, float] = {}
    touched: set[str] = set()
    suspended_own: set[str] = set()
    terminated_own: set[str] = set()
    resumed_own: set[str] = set()
    starter = {vm["microvmId"]: _who(vm["caller"]) for vm in vms}
    for who, fleet, operation, vm_id, t in log.mutations:
        if who in ("client", "other") and operation == "ResumeMicrovm":
            taken.setdefault(vm_id, t)
        if who != kind:
            continue
        own = starter.get(vm_id) == (kind, fleet)
        if not own:
            touched.add(vm_id)
        elif operation == "SuspendMicrovm":
            suspended_own.add(vm_id)
        elif operation == "TerminateMicrovm":
            terminated_own.add(vm_id)
        else:
            resumed_own.add(vm_id)
    ready = side.ready_at(vms)
    for fleet_name, claimed in ledger_claims.items():
        fleet = next(f for f in side.fleets if f.name == fleet_name)
        touched |= {vm for vm in claimed if starter.get(vm, ("?", -1)) != (kind, fleet.index)}

    samples = violations = violations_by_others = 0
    dips = dips_no_headroom = dips_at_max = 0.0
    duplicates_peak = 0
    duplicate_minutes = 0
    converged_each: dict[int, float] = {}
    refills: list[float] = []
    refills_unfinished = refills_held = 0
    list_pages = 0
    expected_gets = 0
    details: dict[str, Any] = {}
    for fleet in side.fleets:
        fleet_vms = by_image[fleet.image]
        own = [v for v in fleet_vms if _who(v["caller"]) == (kind, fleet.index)]
        for vm in own:
            reason = vm["stateReason"] or ""
            ended_by_us = vm["microvmId"] in terminated_own
            if vm["state"] in ("TERMINATING", "TERMINATED") and not ended_by_us and reason != measured.REASON_MAX_LIFETIME:
                expected_gets += 1  # an unexpected end a perfect reconciler confirms once
        # The crash-looping fleet's dips are left out: no reconciler can keep an app up that exits.
        timeline = _Timeline(fleet, own, fleet_vms, taken, start, side.emulator.timings.linger,
                             dips=fleet.name != log.crash_fleet, lifetime=side.lifetime, ready=ready)
        result = timeline.measure(end)
        details[fleet.name] = {k: v for k, v in result.items() if v} | {"own_vms": len(own)}
        samples += result["samples"]
        violations += result["violations"]
        violations_by_others += result["violations_by_others"]
        dips += result["dips"]
        dips_no_headroom += result["dips_no_headroom"]
        dips_at_max += result["dips_at_max"]
        duplicates_peak += result["duplicates_peak"]
        duplicate_minutes += result["duplicate_minutes"]
        list_pages += result["list_pages"]
        refills += result.pop("refills")
        refills_unfinished += result["refills_unfinished"]
        refills_held += result["refills_held_by_max_vms"]
        if result["converged_at"] is not None:
            converged_each[fleet.index] = result["converged_at"]
    convergence = _all_converged(side, by_image, taken, ready)

    units = sum(1 for v in vms if _who(v["caller"])[0] == kind)
    # A perfect reconciler gives a crash-looping slot a bounded number of starts (the reconciler's
    # default max_start_attempts, 3, per slot) and then dead-letters it: starts beyond are not owed.
    crash = next((f for f in side.fleets if f.name == log.crash_fleet), None)
    crash_starts = 0
    if crash is not None:
        onset = start + 900
        crash_own = [v for v in by_image[crash.image] if _who(v["caller"]) == (kind, crash.index)]
        owed = sum(1 for v in crash_own if v["startedAt"] < onset) + 3 * (crash.min_vms + crash.warm_vms)
        crash_starts = max(0, len(crash_own) - owed)
    runs = log.calls[kind, "RunMicrovm"]
    failed_runs_not_ours = sum(log.errors[kind, "RunMicrovm", code] for code in ("InternalServerException", "InsufficientCapacityException"))
    quota_probes = sum(1 for k, *_ in log.quota_minutes if k == kind)
    calls = sum(v for (k, _), v in log.calls.items() if k == kind)
    # The parked-slot watch's GetMicrovm buy refill latency (a chosen period, its own budget bucket):
    # reported apart, and left out of the ratio to the minimum the fleet's upkeep needs.
    watch_gets = int(getattr(side, "watch_gets", 0))
    minimum = (list_pages + (units - duplicates_peak - crash_starts) + failed_runs_not_ours + quota_probes
               + len(suspended_own) + len(terminated_own) + len(resumed_own) + expected_gets)
    throttles = log.throttles[kind, False] + log.throttles[kind, True]
    serve, warm_up = side.ready_seconds()
    bound = lower_bound(side.fleets, side.emulator.timings.pending, side.emulator.timings.suspending, serve, warm_up)
    abandoned_running = _running_beyond_idle(vms, side.abandoned, end)
    return {
        "violations_max_vms": violations,
        "violations_max_vms_by_others": violations_by_others,
        "samples": samples,
        "duplicate_vms": duplicates_peak,
        "duplicate_vm_minutes": duplicate_minutes,
        "dips_below_min": round(dips, 1),
        "dips_below_min_without_headroom": round(dips_no_headroom, 1),
        "dips_below_min_at_max_vms": round(dips_at_max, 1),
        "foreign_vms_touched": len(touched),
        "amplification": round(runs / units, 4) if units else None,
        "run_attempts": runs,
        "units_filled": units,
        "throttles_received": throttles,
        "throttles_under_default_quotas": log.throttles[kind, False],
        "requests_held": log.held[kind],
        "convergence_seconds": convergence,
        "lower_bound_seconds": bound,
        "convergence_goal_seconds": round(1.2 * bound + 2, 3),
        "convergence_ratio": round(convergence / bound, 3) if convergence is not None and bound else None,
        "fleets_never_converged": len(side.fleets) - len(converged_each),
        "refills": len(refills),
        "refill_seconds_median": _quantile(refills, 0.5),
        "refill_seconds_p99": _quantile(refills, 0.99),
        "refill_seconds_max": max(refills) if refills else None,
        "refill_seconds": sorted(refills),  # every take's, for figures pooled over runs (reconciler_table)
        "refills_unfinished": refills_unfinished,
        "refills_held_by_max_vms": refills_held,
        "abandoned_takes": len(side.abandoned),
        "abandoned_running_hours_beyond_idle_per_day": round(abandoned_running / 3600 * 24 / hours, 4),
        "api_calls": calls,
        "api_calls_minimum": minimum,
        "api_calls_ratio": round((calls - watch_gets) / minimum, 3) if minimum else None,
        "watch_gets": watch_gets,
        "watch_gets_per_fleet_hour": round(watch_gets / (len(side.fleets) * hours), 1),
        "invocations": side.invocations,
        "invocations_killed": side.kills,
        "invocation_errors": dict(side.invocation_errors),
        "_per_fleet": details,
        "_calls_by_operation": {op: n for (k, op), n in sorted(log.calls.items()) if k == kind},
        "_errors_by_operation": {f"{op} {code}": n for (k, op, code), n in sorted(log.errors.items()) if k == kind},
        "_minimum_parts": {"list_pages": list_pages, "runs": units - duplicates_peak - crash_starts,
                           "failed_runs_not_ours": failed_runs_not_ours, "quota_probes": quota_probes,
                           "suspends": len(suspended_own), "terminates": len(terminated_own),
                           "resumes": len(resumed_own), "gets": expected_gets},
        "_first_error": side.first_error,
    }


def _quantile(values: list[float], q: float) -> Optional[float]:
    """The ``q`` quantile (nearest rank) of ``values``, None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _running_beyond_idle(vms: list[dict[str, Any]], abandoned: dict[str, float], end: float) -> float:
    """Seconds RUNNING that no session used, until ``end``: each abandoned VM's RUNNING time after
    its take beyond its idle policy's window (``maxIdleDurationSeconds``; all of it without one)."""
    total = 0.0
    for vm in vms:
        taken = abandoned.get(vm["microvmId"])
        if taken is None:
            continue
        stop = min(end, vm.get("exitedAt") or math.inf)
        running = sum(min(b, stop) - max(a, taken) for a, b, state in _intervals(vm)
                      if state == "RUNNING" and min(b, stop) > max(a, taken))
        window = float(((vm.get("idlePolicy") or {}).get("maxIdleDurationSeconds")) or 0.0)
        total += max(0.0, running - window)
    return total


class _Timeline:
    """One fleet's VMs over the day, swept in time order (exact, from the VMs' state histories)."""

    def __init__(self, fleet: Fleet, own: list[dict[str, Any]], all_vms: list[dict[str, Any]],
                 taken: dict[str, float], start: float, linger: float, dips: bool = True,
                 lifetime: int = 28_800, ready: Optional[dict[str, float]] = None) -> None:
        self.fleet, self.start, self.linger, self.dips, self.lifetime = fleet, start, linger, dips, lifetime
        self.takes: list[float] = []  # when a client took one of the side's parked VMs
        self.parks: list[tuple[float, float]] = []  # (first parked at, started at) of the side's VMs
        # A VM is retiring for its successor's lead (the reconciler's rule, with the 900 s lead the
        # fleets are given and the minute's schedule) and 300 s more, up to RETIRING_WINDOW.
        from lambdas.reconciler.core.lifetimes import successor_lead

        self.retiring_window = min(RETIRING_WINDOW, successor_lead(lifetime, 900.0, 60.0) + 300.0)
        self.events: list[tuple[float, int, str, int]] = []
        for vm in all_vms:
            for a, b, state in _intervals(vm):
                if state in LIVE:
                    self._span(a, b, "live")
                self._span(a, a + linger if state == "TERMINATED" else b, "listed")
        for vm in own:
            cut = taken.get(vm["microvmId"], math.inf)
            ended = _end_of(vm)
            for a, b, what in _own_spans(vm, ready, cut):
                self._span(a, b, what)
            if vm["microvmId"] in taken and any(state == "SUSPENDED" for _, state, _ in vm["history"]):
                self.takes.append(cut)
            parked = next((a for a, _, what in _own_spans(vm, ready, cut) if what == "parked"), None)
            if parked is not None:
                self.parks.append((parked, vm["startedAt"]))
                self._span(vm["startedAt"], parked, "warming")  # a parked slot's VM on its way
            for a, b, state in _intervals(vm):
                b = min(b, cut)
                if a >= b:
                    continue
                if state in LIVE:
                    self._span(a, b, "own")
                    if ended is not None:
                        self._span(max(a, ended - self.retiring_window), b, "retiring")

    def _span(self, a: float, b: float, what: str) -> None:
        if b > a:
            self.events.append((a, 1, what, 1))
            self.events.append((b, 0, what, -1))

    def measure(self, end: float) -> dict[str, Any]:
        fleet, start = self.fleet, self.start
        counts: Counter = Counter()
        events = sorted(self.events)
        samples = [start + 60 * k for k in range(1, int((end - start) // 60) + 1)]
        changes = sorted(start + c[0] for c in fleet.changes)
        # The deploy's invocation at the start lists too (nothing can be started before a list:
        # the image may hold others' VMs): one list is owed there as well as at each minute after.
        marks = sorted([(t, 0, "sample", 0) for t in samples] + [(t, 0, "change", 0) for t in changes]
                       + [(start, 0, "first_list", 0)] + [(t, 0, "take", 0) for t in self.takes]
                       + [(t, 0, "parked_new", started) for t, started in self.parks])
        out = {"samples": 0, "violations": 0, "violations_by_others": 0, "dips": 0.0, "duplicates_peak": 0, "duplicate_minutes": 0,
               "list_pages": 0, "converged_at": None, "dip_spans": [], "dips_no_headroom": 0.0,
               "dips_at_max": 0.0, "refills": [], "refills_unfinished": 0, "refills_held_by_max_vms": 0}
        takes: list[list[float]] = []  # [taken at, seconds with no room since] of takes not refilled yet
        # The image's live VMs just before the events of the latest time swept: a stretch below
        # min_vms that begins while they were at max_vms began with no room for a successor.
        before: dict[str, Any] = {"time": None, "live": 0}
        stretch: dict[str, Any] = {"at_max": False, "end": None}  # the stretch below min_vms going on

        def dip(a: float, b: float) -> None:
            """A stretch below min_vms, [from, seconds] since the day's start (``--details``)."""
            out["dips"] += b - a
            min_vms, max_vms, _ = fleet.spec_at(a - start)
            if max_vms <= min_vms:  # no room for a successor before the old VM ends: a PENDING each
                out["dips_no_headroom"] += b - a
            if b <= a:
                return
            spans = out["dip_spans"]
            if spans and stretch["end"] is not None and abs(stretch["end"] - a) < 1e-6:
                spans[-1][1] = round(b - start - spans[-1][0], 3)  # contiguous: one stretch
            else:
                spans.append([round(a - start, 3), round(b - a, 3)])
                live = before["live"] if before["time"] == a else counts["live"]
                stretch["at_max"] = live >= fleet.max_allowed(a - start)
            stretch["end"] = b
            if stretch["at_max"]:
                out["dips_at_max"] += b - a
        converged = None
        last = start
        i = j = 0
        shrink_until, shrink_extra = -math.inf, 0
        while i < len(events) or j < len(marks):
            take_event = j >= len(marks) or (i < len(events) and events[i][0] <= marks[j][0])
            t = events[i][0] if take_event else marks[j][0]
            if t > end:
                break
            if converged is not None and self.dips and counts["running"] < fleet.min_owed(last - start):
                dip(last, t)
            self._held(takes, counts, last, t)
            last = t
            if take_event:
                if before["time"] != t:
                    before["time"], before["live"] = t, counts["live"]
                counts[events[i][2]] += events[i][3]
                i += 1
                self._refilled(out, takes, counts, t)
            else:
                _, _, what, value = marks[j]
                j += 1
                if what == "parked_new":
                    self._parked_new(out, takes, value, t)
                elif what == "change":
                    shrink_until, shrink_extra = self._change(t, shrink_until, shrink_extra)
                else:
                    self._mark(what, out, counts, takes, t, shrink_extra if t < shrink_until else 0)
                continue
            min_vms, max_vms, warm = fleet.spec_at(t - start)
            if converged is None and counts["running"] >= min_vms and counts["parked"] >= warm:
                converged = t
                out["converged_at"] = t - start
        if converged is not None and self.dips and last < end and counts["running"] < fleet.min_owed(last - start):
            dip(last, end)
        out["refills_unfinished"] = len(takes)
        return out

    def _mark(self, what: str, out: dict[str, Any], counts: Counter, takes: list[list[float]], t: float,
              shrink_extra: int) -> None:
        """A client's take, the first list, or the minute's sample at ``t``."""
        if what == "take":
            takes.append([t, 0.0])
            self._refilled(out, takes, counts, t)
        elif what == "first_list":
            out["list_pages"] += max(1, math.ceil(counts["listed"] / 50))
        else:
            self._sample(out, counts, t, shrink_extra)

    def _held(self, takes: list[list[float]], counts: Counter, last: float, t: float) -> None:
        """From ``last`` to ``t``, the takes waiting beyond the room under ``max_vms`` (the image's
        live VMs, the side's parked slots' VMs on their way left out: clients' VMs and base VMs
        starting count) are held: with room for one new VM and two takes, the later take's refill
        waits for a VM to end whatever the side does. Each take needs a VM of its own; the oldest
        get the room first (refills in order)."""
        if not takes:
            return
        room = max(0, self.fleet.max_allowed(last - self.start) - (counts["live"] - counts["warming"]))
        for take in takes[room:]:
            take[1] += t - last

    def _refilled(self, out: dict[str, Any], takes: list[list[float]], counts: Counter, t: float) -> None:
        """Parked VMs back at ``warm_vms`` at ``t``: every take waiting is refilled."""
        if takes and counts["parked"] >= self.fleet.spec_at(t - self.start)[2]:
            self._count_refills(out, takes, len(takes), t)

    def _parked_new(self, out: dict[str, Any], takes: list[list[float]], started: float, t: float) -> None:
        """A VM of the side, started at ``started``, parked for the first time at ``t``: the refill
        of the oldest take waiting (takes wait in the order they came), if that take came before
        the VM started (one of a client's several takes is refilled by the first new parked VM, not
        by the last of them; a VM on its way before the take refills nothing)."""
        if takes and takes[0][0] <= started:
            self._count_refills(out, takes, 1, t)

    @staticmethod
    def _count_refills(out: dict[str, Any], takes: list[list[float]], done: int, t: float) -> None:
        """The first ``done`` takes waiting, refilled at ``t``. A take whose refill had no room for a
        while (max_vms held it) is counted apart: how soon the room came back is the clients', and
        how soon it was seen, the schedule's."""
        out["refills"] += [round(t - taken, 3) for taken, blocked in takes[:done] if blocked <= 0]
        out["refills_held_by_max_vms"] += sum(1 for _, blocked in takes[:done] if blocked > 0)
        del takes[:done]


    def _change(self, t: float, shrink_until: float, shrink_extra: int) -> tuple[float, int]:
        """A spec change at ``t``: base VMs above a lowered min_vms may be serving and end by
        themselves, so for a lifetime they are no duplicates."""
        old = self.fleet.spec_at(t - self.start - 1e-6)
        new = self.fleet.spec_at(t - self.start)
        if new[0] + new[2] < old[0] + old[2]:
            return t + self.lifetime, (old[0] + old[2]) - (new[0] + new[2])
        return shrink_until, shrink_extra

    def _sample(self, out: dict[str, Any], counts: Counter, t: float, shrink_extra: int) -> None:
        """The minute's sample at ``t``: above max_vms (by the side or by others), the list pages
        owed, and the side's VMs beyond one per slot."""
        fleet = self.fleet
        min_vms, _max_vms, warm = fleet.spec_at(t - self.start)
        out["samples"] += 1
        if counts["live"] > fleet.max_allowed(t - self.start):
            out["violations"] += 1
            if counts["own"] - counts["retiring"] <= min_vms:
                # Nothing of the side's could have been ended (its base VMs may serve): clients'
                # and other apps' VMs of the image are what is above max_vms.
                out["violations_by_others"] += 1
        out["list_pages"] += max(1, math.ceil(counts["listed"] / 50))
        excess = max(0, counts["own"] - counts["retiring"] - (min_vms + warm + shrink_extra))
        out["duplicates_peak"] = max(out["duplicates_peak"], excess)
        out["duplicate_minutes"] += excess


def _intervals(vm: dict[str, Any]) -> list[tuple[float, float, str]]:
    history = vm["history"]
    spans = []
    for (a, state, _), nxt in zip(history, history[1:] + [(math.inf, None, None)], strict=True):
        spans.append((a, nxt[0], state))
    return spans


def _end_of(vm: dict[str, Any]) -> Optional[float]:
    """When the VM ended, or, for one still live when the day stops, when the service will end it
    (``startedAt + maximumDurationInSeconds``): a successor started within the retiring window of
    that expiry is a successor, not a duplicate, whether or not the expiry falls inside the day."""
    for at, state, _ in vm["history"]:
        if state in ("TERMINATING", "TERMINATED"):
            return at
    if vm.get("maximumDurationInSeconds") and vm.get("startedAt") is not None:
        return float(vm["startedAt"]) + float(vm["maximumDurationInSeconds"])
    return None


def _all_converged(side: Side, by_image: dict[str, list[dict[str, Any]]], taken: dict[str, float],
                   ready: Optional[dict[str, float]]) -> Optional[float]:
    """The first moment every fleet had ``min_vms`` VMs of its own serving and ``warm_vms`` parked."""
    events = []
    need = {}
    for fleet in side.fleets:
        need[fleet.index] = (fleet.min_vms, fleet.warm_vms)
        for vm in by_image[fleet.image]:
            if _who(vm["caller"]) != (side.kind, fleet.index):
                continue
            for a, b, what in _own_spans(vm, ready, taken.get(vm["microvmId"], math.inf)):
                events.append((a, 1, fleet.index, what))
                events.append((b, -1, fleet.index, what))
    events.sort(key=lambda e: (e[0], e[1]))
    counts: dict[tuple[int, str], int] = Counter()
    unmet = {i for i, (m, w) in need.items() if m > 0 or w > 0}
    if not unmet:
        return 0.0
    for at, delta, index, what in events:
        counts[index, what] += delta
        m, w = need[index]
        if counts[index, "running"] >= m and counts[index, "parked"] >= w:
            unmet.discard(index)
        else:
            unmet.add(index)
        if not unmet:
            return round(at - side.start, 3)
    return None


def _own_spans(vm: dict[str, Any], ready: Optional[dict[str, float]], cut: float) -> list[tuple[float, float, str]]:
    """When one of the side's VMs counted, until ``cut`` (a client took it): ``running`` while it
    serves (from its agent host ready, ``ready``, or its first RUNNING without one: RUNNING, or
    suspended by its idle policy, which a request wakes), ``parked`` while SUSPENDED by a
    SuspendMicrovm."""
    spans = []
    if ready is None:
        served = next((at for at, state, _ in vm["history"] if state == "RUNNING"), None)
    else:
        served = ready.get(vm["microvmId"])
    serving = serving_spans(vm)
    if served is not None:
        spans += [(max(a, served), min(b, cut), "running") for a, b in serving]
    for a, b, state in _intervals(vm):
        if state == "SUSPENDED" and not any(x <= a < y for x, y in serving):
            spans.append((a, min(b, cut), "parked"))
    return [(a, b, what) for a, b, what in spans if b > a]


# =========================================================================================== running


def run_side(kind: str, fleets_count: int, seed: int, hours: float, lifetime: int = LIFETIME_SECONDS) -> dict[str, Any]:
    fleets = make_fleets(fleets_count, random.Random(seed))
    side: Side = (Ours if kind == "ours" else Naive)(fleets, seed, hours, lifetime)
    claims: dict[str, set[str]] = defaultdict(set)
    if isinstance(side, Ours):
        for k in range(1, int(hours * 12) + 1):
            def sample(side: Ours = side) -> None:
                for fleet in side.fleets:
                    claims[fleet.name] |= side.ledger_claims(fleet)
            side.sim.call_at(side.start + k * 300, sample)
    started = time.perf_counter()
    cpu = time.process_time()
    side.run()
    result = report(side, claims)
    result["wall_seconds"] = round(time.perf_counter() - started, 2)
    result["cpu_seconds"] = round(time.process_time() - cpu, 2)
    # The side's own cost: CPU seconds of its invocations (client serialization and parsing, the
    # stores in memory, telemetry; the emulator's share left out) per fleet and day of the run.
    result["own_cpu_seconds"] = round(side.own_cpu, 2)
    result["cpu_seconds_per_fleet_day"] = round(side.own_cpu / (fleets_count * hours / 24), 3)
    result["peak_memory_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["lambda_environments"] = side.envs
    # Lambda time the fleets' reconcilers are billed for (a killed or timed-out one to its end).
    result["lambda_seconds_per_fleet_day"] = round(side.lambda_seconds / (fleets_count * hours / 24), 1)
    return result


def _result_of(proc: Any, queue: Any) -> tuple[str, Any]:
    """What a side's process put on its queue; a process that died without a word is a failure
    (a bare ``queue.get()`` would wait for it forever)."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=5)
        except queues.Empty:
            if not proc.is_alive():
                try:
                    return queue.get(timeout=5)
                except queues.Empty:
                    return "error", f"the process ended (exit code {proc.exitcode}) without a result"


def _child(kind: str, fleets: int, seed: int, hours: float, queue: Any, lifetime: int = 28_800) -> None:
    try:
        queue.put(("ok", run_side(kind, fleets, seed, hours, lifetime)))
    except BaseException as exc:  # noqa: BLE001
        import traceback

        queue.put(("error", f"{kind}: {exc!r}\n{traceback.format_exc()}"))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--lifetime", type=int, default=LIFETIME_SECONDS,
                        help="every fleet VM's maximumDurationInSeconds (60-28800; default the service's 8 hours)")
    parser.add_argument("--side", choices=["ours", "naive", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=1, help="sides run at once (each in its own process)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--details", action="store_true", help="per-fleet figures and the first invocation error")
    args = parser.parse_args(argv)
    if args.fleets < 1 or not 0 < args.hours <= 24 * 7 or args.jobs < 1 or not 60 <= args.lifetime <= 28_800:
        parser.error("--fleets must be >= 1, --hours within (0, 168], --jobs >= 1, --lifetime within [60, 28800]")
    kinds = ["ours", "naive"] if args.side == "both" else [args.side]
    context = multiprocessing.get_context("fork")
    out: dict[str, Any] = {}
    pending = list(kinds)
    running: list[tuple[str, Any, Any]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            kind = pending.pop(0)
            queue = context.Queue()
            proc = context.Process(target=_child, args=(kind, args.fleets, args.seed, args.hours, queue, args.lifetime))
            proc.start()
            running.append((kind, proc, queue))
        kind, proc, queue = running.pop(0)
        status, value = _result_of(proc, queue)
        proc.join(timeout=60)
        if status != "ok":
            sys.exit(f"benchmark failed: {value}")
        if not args.details:
            value = {k: v for k, v in value.items() if not k.startswith("_")}
        out[kind] = value
    out["scenario"] = {"fleets": args.fleets, "seed": args.seed, "hours": args.hours, "lifetime": args.lifetime,
                       "vms_desired": sum(f.min_vms + f.warm_vms for f in make_fleets(args.fleets, random.Random(args.seed)))}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    sides = [k for k in ("ours", "naive") if k in out]
    print(f"{'':32}" + "".join(f"{k:>14}" for k in sides))
    for key in [k for k in out[sides[0]] if not k.startswith("_") and not isinstance(out[sides[0]][k], list)]:
        print(f"{key:32}" + "".join(f"{str(out[k][key]):>14}" for k in sides))


if __name__ == "__main__":
    main()
