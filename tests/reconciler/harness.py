"""The reconciler as it runs in AWS, here: the Lambda handler (``index.handler``) with a Lambda
context, its default telemetry (Powertools, or the fallback when the layer is missing), the
clients ``index.build()`` makes (one attempt each, the bundled model), and the environment the
construct synthesizes for the example fleet, with only the table names, the queue URL and the
image ARN swapped for moto's and the emulator's.

Only time is virtual: the built reconciler's ``clock`` and ``sleep`` are the emulator's
:class:`VirtualClock`, and the Lambda context's remaining time counts down on it. Everything the
tests assert comes from the emulator (calls, VMs), moto (ledger items, dead letters in SQS) and
stdout (log lines and EMF records as Powertools prints them).

The stores: the ledger and the budget are the handler's own DynamoDB ones on moto, unless a test
is marked ``@pytest.mark.stores("memory")`` (a module's ``pytestmark``): then, after
``index.build()``, the built reconciler's ledger and budget are the in-memory ones
(:class:`MemoryLedger`, :class:`MemoryBudget`, held to the DynamoDB stores' behaviour by
test_stores_memory.py), one of each per deployed fleet, shared by its execution environments and
its server as the tables are. For the files whose subject is what the reconciler decides over
many ticks (room, successors, overtime, lifetimes, ownership, parking): a DynamoDB call to moto
costs about 10 ms of CPU, and those scenarios made about 15 of them a tick, 60% of their time.
Everything else the handler builds (the MicroVMs client, the recipe and token reads, the dead
letters in SQS, the server's Lambda client, Powertools) is the same either way.
"""

from __future__ import annotations

import contextvars
import dataclasses
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import time
import uuid
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from lambdas.reconciler import index
from lambdas.reconciler.budget import DynamoDBBudget, MemoryBudget
from lambdas.reconciler.ledger import DynamoDBLedger, MemoryLedger
from rayito_constructs.testing import MicrovmsEmulator, VirtualClock
from rayito_constructs.testing.serving import VirtualServer, serving_spans

from ..moto_server import client as aws_client
from ..lambda_invoke import lambda_functions
from ..moto_server import untraced_requests

#: Environment keys whose template values are CloudFormation references, and what stands for them.
SUBSTITUTED = {"LEDGER_TABLE", "BUDGET_TABLE", "DEAD_LETTER_QUEUE_URL", "IMAGE_ARN", "EXECUTION_ROLE_ARN",
               "IMAGE_VERSION", "SERVER_FUNCTION"}
ROLE_ARN = "arn:aws:iam::123456789012:role/mi-agente-microvm"

#: The stores a fleet deployed now gets: "dynamodb" (moto's tables, the handler's own stores) or
#: "memory"; set for each test from its ``stores`` mark (tests/reconciler/conftest.py).
STORES: contextvars.ContextVar[str] = contextvars.ContextVar("stores", default="dynamodb")


#: Synthesized environments shared by the workers of one run (a synth costs about 5 CPU-s).
SYNTH_CACHE = Path(__file__).resolve().parents[2] / ".make" / "test-synth-cache"


@lru_cache(maxsize=None)
def _sources_digest() -> str:
    """What a synthesized template depends on: the library, the Lambdas it bundles, the example
    agent, the CDK's version. A change to any of them is a new cache key."""
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(version("aws-cdk-lib").encode())
    for folder in ("rayito_constructs", "lambdas", "examples"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@lru_cache(maxsize=None)
def synthesized_environment(metrics: bool = True, **overrides: Any) -> tuple[tuple[str, Any], ...]:
    """The reconciler function's ``Environment.Variables`` from the example fleet's template,
    synthesized with ``metrics`` (on here, so the tests can read the EMF the handler prints; the
    default fleet's ``metrics=False`` is run in tests/test_monitoring_runtime.py). Synthesized once
    per run for all its xdist workers (the first under a file lock, the others read its answer),
    keyed by the sources' digest and the arguments."""
    # One run's workers share an answer, never two runs: the synth also records the template for
    # the session's cfn-lint gate (tests/conftest.py), which a run must not skip.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"
    folder = SYNTH_CACHE / run
    folder.mkdir(parents=True, exist_ok=True)
    for old in SYNTH_CACHE.iterdir():  # earlier runs' answers
        if old != folder and old.is_dir() and old.stat().st_mtime < time.time() - 3600:
            shutil.rmtree(old, ignore_errors=True)
    key = json.dumps([metrics, sorted(overrides.items())], default=repr)
    path = folder / (hashlib.sha256((_sources_digest() + key).encode()).hexdigest()[:32] + ".json")
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return tuple((k, v) for k, v in json.loads(path.read_text()))
        value = _synthesize_environment(metrics, **overrides)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(value))
        partial.replace(path)
    return value


def _synthesize_environment(metrics: bool, **overrides: Any) -> tuple[tuple[str, Any], ...]:
    from aws_cdk.assertions import Template

    from rayito_constructs import AgentProject, FleetStack

    from ..cdk_helpers import new_app, stack_props
    from ..conftest import EXAMPLE

    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE, **overrides), metrics=metrics,
                       **stack_props())
    template = Template.from_stack(stack).to_json()
    (function,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
                   and r["Properties"].get("Handler") == "reconciler.index.handler"]
    return tuple(sorted(function["Properties"]["Environment"]["Variables"].items()))


class LambdaContext:
    """What Lambda passes the handler: the deadline counts down on the virtual clock."""

    def __init__(self, clock: VirtualClock, timeout_seconds: float) -> None:
        self._clock = clock
        self._deadline = clock.now() + timeout_seconds
        self.function_name = "MiAgenteReconciler"
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
        self.memory_limit_in_mb = 256
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = "/aws/lambda/MiAgenteReconciler"
        self.log_stream_name = "2026/11/30/[$LATEST]0"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock.now()) * 1000))


@dataclass
class Invocation:
    result: dict[str, Any]
    records: list[dict[str, Any]]
    calls: dict[str, int]

    def events(self, kind: Optional[str] = None) -> list[dict[str, Any]]:
        lines = [r for r in self.records if "_aws" not in r and "message" in r]
        return [r for r in lines if kind is None or r["message"] == kind]

    def metrics(self, name: str) -> list[tuple[float, str]]:
        """(value, unit) of every EMF point of ``name``."""
        out = []
        for record in self.records:
            for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
                for metric in directive["Metrics"]:
                    if metric["Name"] == name:
                        values = record[name] if isinstance(record[name], list) else [record[name]]
                        out += [(float(v), metric.get("Unit", "None")) for v in values]
        return out


@dataclass
class Fleet:
    """One deployed fleet: the handler's environment, its stores and the emulator."""

    emulator: MicrovmsEmulator
    clock: VirtualClock
    aws: str
    env: dict[str, str]
    ddb: Any = None
    sqs: Any = None
    invocations: list[Invocation] = field(default_factory=list)
    server: Optional[VirtualServer] = None  # the fleet's server, in virtual time
    _built_env: Any = None
    _environment: Any = None  # this fleet's warm execution environment (its built reconciler)
    _stdout: io.StringIO = field(default_factory=io.StringIO)
    memory: Optional[tuple[MemoryLedger, MemoryBudget]] = None  # the stores, when they are in memory

    @property
    def fleet(self) -> str:
        return self.env["FLEET_NAME"]

    @property
    def image(self) -> str:
        return self.env["IMAGE_ARN"]

    def reconciler(self, monkeypatch: Any, *, powertools: bool = True) -> Any:
        """``index.build()`` as the handler makes it, on the virtual clock."""
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)
        if not powertools:
            monkeypatch.setitem(sys.modules, "aws_lambda_powertools", None)
        _fresh_powertools_logger()
        reconciler = index.build()
        if self.memory is not None:
            ledger, budget = self.memory
            budget.budgets = reconciler.budget.budgets  # the shapes this environment read; the state stays
            reconciler.ledger, reconciler.budget = ledger, budget
        # Virtual time is real time here: the wall clock and the deadline's monotonic one.
        reconciler.clock = reconciler.monotonic = self.clock.now
        reconciler.sleep = self.clock.advance
        return reconciler

    def invoke(self, monkeypatch: Any, event: Optional[dict[str, Any]] = None, *, timeout: float = 65.0,
               powertools: bool = True, cold: Optional[bool] = None) -> Invocation:
        """One invocation of ``index.handler``, as the scheduler sends it: in a new execution
        environment the first time and whenever the environment changed (a deploy), in the
        same warm one otherwise, as Lambda does (``cold`` forces either)."""
        out = self._stdout  # one stdout per execution environment, as in Lambda
        start = out.tell()
        before = dict(self.emulator.calls)
        with redirect_stdout(out):
            changed = self._built_env != (self.env, powertools)
            if changed:
                deploy_fleet_state(self)  # a deploy writes the recipe of the spec it deploys
            if cold or (cold is None and changed) or self._environment is None:
                self._environment = self.reconciler(monkeypatch, powertools=powertools)
                self._built_env = (dict(self.env), powertools)
            if cold is False and index._RECONCILER is not None:
                self._environment = index._RECONCILER  # the test set up this environment itself
            index._RECONCILER = self._environment
            result = index.handler(event if event is not None else {"source": "schedule"},
                                   LambdaContext(self.clock, timeout))
        records = [json.loads(line) for line in out.getvalue()[start:].splitlines() if line.startswith("{")]
        calls = {k: v - before.get(k, 0) for k, v in self.emulator.calls.items() if v != before.get(k, 0)}
        invocation = Invocation(result, records, calls)
        self.invocations.append(invocation)
        return invocation

    def every_minute(self, monkeypatch: Any, minutes: int, **kwargs: Any) -> list[Invocation]:
        """The schedule: one invocation a minute (each tick uses up to TICK_SECONDS of it)."""
        out = []
        for _ in range(minutes):
            start = self.clock.now()
            out.append(self.invoke(monkeypatch, **kwargs))
            rest = start + 60 - self.clock.now()
            if rest > 0:
                self.clock.advance(rest)
        return out

    # ------------------------------------------------------------------ ground truth

    def live(self, states: tuple[str, ...] = ("PENDING", "RUNNING", "SUSPENDING", "SUSPENDED")) -> list[dict]:
        return [vm for vm in self.emulator.microvms() if vm["state"] in states and vm["imageArn"] == self.image]

    def ours(self) -> list[dict]:
        """Live VMs a token of this fleet's reconciler started."""
        return [vm for vm in self.live() if (vm["clientToken"] or "").startswith("rz1-")]

    def dead_letters(self) -> list[dict[str, Any]]:
        messages = self.sqs.receive_message(QueueUrl=self.env["DEAD_LETTER_QUEUE_URL"], MaxNumberOfMessages=10,
                                            WaitTimeSeconds=0).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    def ledger_slots(self) -> dict[str, dict[str, Any]]:
        if self.memory is not None:
            slots, _ = self.memory[0].peek(self.fleet)
            return {k: json.loads(json.dumps(slot.to_dict(), sort_keys=True)) for k, slot in slots.items()}
        items = self.ddb.query(TableName=self.env["LEDGER_TABLE"], KeyConditionExpression="fleet = :f",
                               ExpressionAttributeValues={":f": {"S": self.fleet}}, ConsistentRead=True)["Items"]
        return {i["key"]["S"][5:]: json.loads(i["doc"]["S"]) for i in items if i["key"]["S"].startswith("slot#")}


#: Environment keys a test sets that the recipe, not the environment, carries to the reconciler.
RECIPE_KEYS = ("MIN_VMS", "MAX_VMS", "WARM_VMS", "IDLE_SECONDS")


def put_fleet_state(aws: str, fleet: str, token_secret: str, *, image_version: Optional[str] = "1.0",
                    scaling: Optional[dict[str, Any]] = None) -> str:
    """The example's recipe for ``fleet`` (the product's document and encoding, as the stack's writer
    stores it, with ``image_version``), and the fleet's token (made once); returns the token."""
    from rayito._payload import generate_access_token

    from rayito_constructs import AgentProject
    from rayito_constructs.model.product import encode, recipe

    from ..conftest import EXAMPLE
    from ..moto_server import put_secret

    secrets, ssm = aws_client("secretsmanager", aws), aws_client("ssm", aws)
    try:
        token = str(secrets.get_secret_value(SecretId=token_secret)["SecretString"])
    except secrets.exceptions.ResourceNotFoundException:  # type: ignore[attr-defined]
        token = generate_access_token()
        put_secret(secrets, token_secret, token)
    project = AgentProject.load(EXAMPLE, **(scaling or {}))
    product = dataclasses.replace(project.product, name=fleet)
    _, value = encode(recipe(product, project.product_scaling, renew_gateway_keys=False, image_version=image_version))
    assert value is not None
    ssm.put_parameter(Name=f"/rayito/agents/{fleet}/recipe", Value=value, Type="SecureString", Tier="Standard",
                      Overwrite=True)
    return token


def deploy_fleet_state(fleet: "Fleet", token: Optional[str] = None) -> None:
    """What a deploy leaves for the reconciler to read: the fleet's access token (the stack
    generates it) and its recipe (the recipe writer's: the product's recipe of the example, named
    after the fleet, with the scaling and idle policy the environment says), in moto."""
    import dataclasses

    from rayito._payload import generate_access_token

    from rayito_constructs import AgentProject
    from rayito_constructs.model.product import encode, recipe

    from ..conftest import EXAMPLE
    from ..moto_server import put_secret

    env = fleet.env
    secrets, ssm = aws_client("secretsmanager", fleet.aws), aws_client("ssm", fleet.aws)
    name = env["ACCESS_TOKEN_SECRET"]
    try:
        secrets.describe_secret(SecretId=name)
    except secrets.exceptions.ResourceNotFoundException:  # type: ignore[attr-defined]
        put_secret(secrets, name, token or generate_access_token())
    project = AgentProject.load(EXAMPLE, min_vms=int(env["MIN_VMS"]), max_vms=int(env["MAX_VMS"]),
                                warm=int(env.get("WARM_VMS") or 0))
    idle = env.get("IDLE_SECONDS")
    product = project.product
    serve = product.serve
    if not idle:
        serve = dataclasses.replace(serve, idle=None)
    elif serve.idle is None or int(idle) != serve.idle.max_idle_seconds:
        serve = AgentProject.load(EXAMPLE, idle=int(idle)).product.serve
    product = dataclasses.replace(product, name=fleet.fleet, serve=serve)
    _, value = encode(recipe(product, project.product_scaling, renew_gateway_keys=False,
                             image_version=env.get("IMAGE_VERSION") or None))
    assert value is not None
    ssm.put_parameter(Name=f"/rayito/agents/{fleet.fleet}/recipe", Value=value, Type="SecureString",
                      Tier="Standard", Overwrite=True)


def _fresh_powertools_logger() -> None:
    """A new execution environment: Powertools' Logger configures its stdlib logger only once per
    process (it marks it ``init``); forget that so this one writes to this invocation's stdout."""
    logger = logging.getLogger("rayito-reconciler")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    for attribute in ("init", "powertools_handler"):
        if hasattr(logger, attribute):
            delattr(logger, attribute)


def emulator_env(aws: str, endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_DYNAMODB": aws, "AWS_ENDPOINT_URL_SQS": aws,
        "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": endpoint, "AWS_ENDPOINT_URL_SSM": aws,
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": aws,
    }


@contextmanager
def deployed_fleet(aws: str, *, clock: Optional[VirtualClock] = None, emulator: Optional[MicrovmsEmulator] = None,
                   fleet: str = "mi-agente", overrides: Optional[dict[str, Any]] = None,
                   env: Optional[dict[str, str]] = None, metrics: bool = True, stores: Optional[str] = None,
                   **emulator_options: Any) -> Iterator[Fleet]:
    """The example fleet's reconciler environment (synthesized with ``metrics``) against moto and
    a (new) emulator; ``stores``: "dynamodb" or "memory" (default: the test's mark, :data:`STORES`)."""
    stores = stores or STORES.get()
    if stores not in ("dynamodb", "memory"):
        raise ValueError(f"stores: {stores!r} is neither 'dynamodb' nor 'memory'")
    clock = clock or (emulator.clock if emulator is not None else VirtualClock())
    own = emulator is None
    if own:
        emulator_options.setdefault("pending_seconds", 12)
        emulator_options.setdefault("suspending_seconds", 1)
        emulator_options.setdefault("terminating_seconds", 3)
        emulator = untraced_requests(MicrovmsEmulator(clock=clock, seed=emulator_options.pop("seed", 7),
                                                      **emulator_options).start())
    functions = lambda_functions()
    lambda_url, registry = functions.__enter__()
    try:
        template_env = dict(synthesized_environment(metrics, **(overrides or {})))
        tokens = {k for k, v in template_env.items() if not isinstance(v, str)}
        assert tokens <= SUBSTITUTED, f"the construct sets {tokens - SUBSTITUTED} from references: substitute them"
        ddb, sqs = aws_client("dynamodb", aws), aws_client("sqs", aws)
        suffix = uuid.uuid4().hex[:8]
        ledger, budget = f"ledger-{suffix}", f"budget-{suffix}"
        DynamoDBLedger.create_table(ddb, ledger)
        DynamoDBBudget.create_table(ddb, budget)
        queue = sqs.create_queue(QueueName=f"dlq-{suffix}")["QueueUrl"]
        if not emulator.has_image(fleet):
            emulator.create_image(fleet, memory_mib=4096, hooks=True)  # the product's image: hooks on
        values = {k: v for k, v in template_env.items() if isinstance(v, str)}
        values.update(LEDGER_TABLE=ledger, BUDGET_TABLE=budget, DEAD_LETTER_QUEUE_URL=queue,
                      IMAGE_ARN=emulator.image_arn(fleet), FLEET_NAME=fleet, SERVER_FUNCTION=f"{fleet}-server",
                      AWS_ENDPOINT_URL_LAMBDA=lambda_url)
        if "EXECUTION_ROLE_ARN" in template_env:
            values["EXECUTION_ROLE_ARN"] = ROLE_ARN
        if "IMAGE_VERSION" in template_env:
            values["IMAGE_VERSION"] = "1.0"  # the version the emulator's image has active
        values.update(emulator_env(aws, emulator.endpoint_url))
        # The parked-slot watch (GetMicrovm every WATCH_SECONDS while a tick lives) is the
        # construct's default; scenarios about other rules count their calls without it, and
        # test_warm_watch.py and the handler's test run it as synthesized.
        values["WATCH_SECONDS"] = "0"
        values.update(env or {})
        made = Fleet(emulator, clock, aws, values, ddb, sqs)
        if stores == "memory":
            made.memory = (MemoryLedger(), MemoryBudget())
        made.server = VirtualServer(emulator, made.memory[0] if made.memory else DynamoDBLedger(ddb, ledger))
        registry.register(values["SERVER_FUNCTION"], made.server.ask)
        deploy_fleet_state(made)
        yield made
    finally:
        index._RECONCILER = None
        functions.__exit__(None, None, None)
        if own:
            emulator.stop()


#: The access key the handler's clients sign with (``emulator_env``): the emulator's faults can
#: be narrowed to it, so a fault hits the reconciler and not the test's own client.
RECONCILER_CALLER = "testing"


def list_lag(fleet: Fleet, seconds: float) -> Any:
    """ListMicrovms answers to the reconciler omit VMs younger than ``seconds`` (eventually
    consistent lists), injected in the emulator so the lists show in its request log."""
    return fleet.emulator.inject("ListMicrovms", "list_lag", seconds=seconds, times=None, caller=RECONCILER_CALLER)


def at_first_call(fleet: "Fleet", operation: str, action: Callable[[Any], None]) -> list[str]:
    """Run ``action(record)`` once, right after the reconciler's first ``operation`` request is
    carried out (before its answer reaches the reconciler); returns the list that then holds that
    request's MicroVM ID (empty until it happens)."""
    seen: list[str] = []

    def on_request(record: Any) -> None:
        if record.operation == operation and record.caller == RECONCILER_CALLER and not seen:
            seen.append(record.microvm_id)
            action(record)

    fleet.emulator.subscribe(on_request)
    return seen


def fail_the_next_read(fleet: "Fleet") -> Callable[[Any], None]:
    """An ``at_first_call`` action: the reconciler's next GetMicrovm is answered 500."""
    return lambda record: fleet.emulator.inject("GetMicrovm", "InternalServer", times=1, caller=RECONCILER_CALLER)


def end_the_vm(fleet: "Fleet") -> Callable[[Any], None]:
    """An ``at_first_call`` action: a client ends the request's VM, gone from the service 0.3 s later."""
    def end(record: Any) -> None:
        fleet.emulator.terminating_seconds = 0.1
        fleet.emulator.terminated_linger_seconds = 0.2
        fleet.emulator.direct_client(caller="client").terminate_microvm(microvmIdentifier=record.microvm_id)
    return end


def peak_live(fleet: "Fleet", mine: bool = False) -> int:
    """The most VMs of the fleet's image alive (not ending or ended) at once, over every VM's
    history (ground truth); ``mine``: only those a token of the reconciler started."""
    edges = []
    for vm in fleet.emulator.microvms_ever():
        if vm["imageArn"] != fleet.image or (mine and not (vm["clientToken"] or "").startswith("rz1-")):
            continue
        born = vm["history"][0][0]
        gone = next((at for at, state, _ in vm["history"] if state in ("TERMINATING", "TERMINATED")), float("inf"))
        edges += [(born, 1), (gone, -1)]
    edges.sort(key=lambda e: (e[0], e[1]))
    peak = count = 0
    for _, step in edges:
        count += step
        peak = max(peak, count)
    return peak


def _ready_at(fleet: "Fleet") -> dict[str, float]:
    """When each VM's agent host was ready: a member served, or a parked slot warmed."""
    if fleet.server is None:
        return {}
    return {**fleet.server.warmed, **fleet.server.served}


def serving(fleet: "Fleet") -> list[dict]:
    """The fleet's VMs that serve now: their agent host ready (the server said so, by now), RUNNING
    or suspended by their idle policy (a parked slot a client resumed serves: it was warmed)."""
    served = _ready_at(fleet)
    now = fleet.clock.now()
    return [vm for vm in fleet.live() if (vm["state"] == "RUNNING" or vm.get("idleSuspended"))
            and served.get(vm["microvmId"], float("inf")) <= now]


def seconds_below(fleet: "Fleet", floor: int, since: float, until: float) -> float:
    """Seconds between ``since`` and ``until`` with fewer than ``floor`` VMs of the fleet's image
    serving (RUNNING, or suspended by their idle policy: :func:`serving_spans`), over every VM's
    history (ground truth, as the benchmark's ``dips_below_min``)."""
    edges = []
    served = _ready_at(fleet)
    for vm in fleet.emulator.microvms_ever():
        if vm["imageArn"] != fleet.image or vm["microvmId"] not in served:
            continue  # a VM whose agent host never started serves no session
        for start, end in serving_spans(vm):
            start = max(start, served[vm["microvmId"]])
            if start < end:
                edges += [(start, 1)] + ([(end, -1)] if end != float("inf") else [])
    edges.sort()
    below, count, last = 0.0, 0, since
    for at, step in edges + [(until, 0)]:
        at = min(max(at, since), until)
        if count < floor:
            below += at - last
        count, last = count + step, at
    return below


def act_during_sleep(fleet: "Fleet", after: float, action: Callable[[], None]) -> list[float]:
    """The warm environment's reconciler sleeps on the virtual clock; ``action`` runs at ``after``
    (or when the sleep that spans it begins, if later): what happens while that tick sleeps. An
    action that advances the clock past the sleep's end delays the tick's wake to then. Returns
    the list that then holds when the action ran."""
    return act_during_sleeps(fleet, [(after, action)])


def act_during_sleeps(fleet: "Fleet", timed: list[tuple[float, Callable[[], None]]]) -> list[float]:
    """:func:`act_during_sleep` for several actions: each ``(at, action)`` of ``timed`` runs, in
    time order, in the sleep that spans ``at`` (or when the first sleep after it begins). An action
    may add to ``timed`` while the tick runs (a client retrying 0.1 s later). Returns the list
    that then holds when each ran."""
    done: list[float] = []
    advance = fleet.clock.advance

    def sleep(seconds: float) -> None:
        wake = fleet.clock.now() + seconds
        while due := sorted((t for t in timed if t[0] <= wake), key=lambda t: t[0]):
            timed.remove(due[0])
            advance(max(0.0, due[0][0] - fleet.clock.now()))
            done.append(fleet.clock.now())
            due[0][1]()
        advance(max(0.0, wake - fleet.clock.now()))

    fleet._environment.sleep = sleep
    return done
