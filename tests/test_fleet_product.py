"""A fleet this library deploys is a Rayito fleet: the product's own client and CLI, unmodified, work
on it as on one ``rayito agent deploy`` made (issue #33).

The example fleet (``FleetStack`` from ``examples/mi-agente``) is deployed as far as this machine
allows: its recipe written by the recipe writer's code into moto's SSM, its access token in moto's
Secrets Manager, its image in the MicroVMs emulator running the product's base (the stand-in rayd,
the product's real agent host and the example's app on each VM, reached through a TLS front on
port 443 as the AWS proxy is), its reconciler (``index.handler`` with the environment the template
gives it, its own clients, the real clock) and its server (``reconciler.server.handler`` in a
process of its own per invocation, with the template's environment: Lambda's asynchronous Invoke is
the only AWS part stood in for, ``tests/lambda_invoke.py``).

Then the product's client (``AgentFleet.connect`` with the fleet's token and the seams the product
offers for tests) and its CLI (``python -m rayito.cli``, with only its environment pointed here)
read, invoke, take the parked slot and stop the fleet; nothing of them is replaced.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from lambdas.recipe_writer import index as writer
from lambdas.reconciler import index
from rayito_constructs import AgentProject, FleetStack
from rayito_constructs.model.recipe import plan_recipe
from rayito_constructs.testing import MicrovmsEmulator

from .cdk_helpers import new_app, stack_props
from .conftest import EXAMPLE
from .lambda_invoke import lambda_functions
from .moto_server import client, moto_server, put_secret
from .testing.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
FLEET = "mi-agente"
#: Each reconciler invocation gets this much time (the template's tick_seconds is 50: a test does
#: not wait that long for a fleet at rest).
INVOCATION_SECONDS = 20.0
#: ... and the next one comes this much later (the schedule's minute, shortened).
SCHEDULE_GAP_SECONDS = 2.0


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["Properties"]["Handler"]: r["Properties"] for r in template["Resources"].values()
            if r["Type"] == "AWS::Lambda::Function"}


class Context:
    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self.function_name, self.aws_request_id = "reconciler", "e2e"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@pytest.fixture(scope="module")
def world(tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    from aws_cdk.assertions import Template

    from rayito._payload import generate_access_token

    app = new_app()
    project = AgentProject.load(EXAMPLE)
    stack = FleetStack(app, "MiAgente", project=project, **stack_props())
    template = Template.from_stack(stack).to_json()
    functions = _functions(template)
    index._RECONCILER = None  # a new execution environment: nothing another test left in this process
    try:
        emulator = MicrovmsEmulator(host_vms=True, tls_front=True, consistency_seconds=0, terminating_seconds=1.0,
                                    app_exit_report_seconds=1.0)
        emulator.start()
    except PermissionError as exc:
        pytest.skip(f"the TLS front needs port 443 on a loopback address: {exc}")
    with moto_server() as moto, lambda_functions() as (lambda_url, invoked):
        try:
            aws_env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       **{f"AWS_ENDPOINT_URL_{s}": moto for s in ("DYNAMODB", "SQS", "SSM", "SECRETS_MANAGER", "STS")},
                       "AWS_ENDPOINT_URL_LAMBDA": lambda_url,
                       **emulator.vm_host.seams.environment(emulator.endpoint_url)}
            image = emulator.create_image(FLEET, memory_mib=4096, rayd=True, app_dir=EXAMPLE)
            ddb = client("dynamodb", moto)
            from lambdas.reconciler.budget import DynamoDBBudget
            from lambdas.reconciler.ledger import DynamoDBLedger

            DynamoDBLedger.create_table(ddb, "ledger")
            DynamoDBBudget.create_table(ddb, "budget")
            queue = client("sqs", moto).create_queue(QueueName="dead-letters")["QueueUrl"]
            token = generate_access_token()
            secrets = client("secretsmanager", moto)
            put_secret(secrets, f"rayito/agents/{FLEET}/access-token", token)
            put_secret(secrets, "rayito/provider-key", "not-a-real-key")  # the example's model gateway
            # The recipe as the stack's writer stores it, with the image version known at deploy.
            plan = plan_recipe(project, builds_image=True)
            value, _, _ = writer.encode(plan.document, "1.0")
            client("ssm", moto).put_parameter(Name=f"/rayito/agents/{FLEET}/recipe", Value=value, Type="SecureString",
                                              Tier="Standard", Overwrite=True)
            resolved = {"LEDGER_TABLE": "ledger", "BUDGET_TABLE": "budget", "DEAD_LETTER_QUEUE_URL": queue,
                        "IMAGE_ARN": image, "IMAGE_VERSION": "1.0", "SERVER_FUNCTION": f"{FLEET}-server",
                        "EXECUTION_ROLE_ARN": "arn:aws:iam::123456789012:role/mi-agente-microvm"}

            def env_of(handler: str) -> dict[str, str]:
                variables = functions[handler]["Environment"]["Variables"]
                return {k: (v if isinstance(v, str) else resolved[k]) for k, v in variables.items()}

            server_env = {**env_of("reconciler.server.handler"), **aws_env}
            server_runs: list[dict[str, Any]] = []

            def server(event: dict[str, Any]) -> None:
                """The server function: one invocation, one process (what Lambda's queue runs)."""
                spec = {"code": str(ROOT / "lambdas"), "handler": "reconciler.server.handler",
                        "timeout_seconds": 240, "function_name": f"{FLEET}-server", "events": [event]}
                done = subprocess.run([sys.executable, "-m", "tests.lambda_runner", json.dumps(spec)], cwd=ROOT,
                                      env={**_base_env(), **server_env}, capture_output=True, text=True, timeout=300)
                server_runs.append({"event": event, "stdout": done.stdout, "stderr": done.stderr})

            invoked.register(f"{FLEET}-server", server)
            yield {"emulator": emulator, "moto": moto, "token": token, "aws_env": aws_env, "invoked": invoked,
                   "reconciler_env": {**env_of("reconciler.index.handler"), **aws_env}, "server_runs": server_runs,
                   "server_env": server_env, "project": project, "template": template}
        finally:
            index._RECONCILER = None
            emulator.stop()


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GRPC_", "RAYITO_", "SSL_"))}


def tick(world: dict[str, Any], monkeypatch: Any) -> dict[str, Any]:
    """One scheduled invocation of the reconciler, in its warm execution environment."""
    for key, value in world["reconciler_env"].items():
        monkeypatch.setenv(key, value)
    return index.handler({"source": "schedule", "fleet": FLEET}, Context(INVOCATION_SECONDS))


def ledger(world: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = client("dynamodb", world["moto"]).query(
        TableName="ledger", KeyConditionExpression="fleet = :f", ExpressionAttributeValues={":f": {"S": FLEET}},
        ConsistentRead=True)["Items"]
    return {i["key"]["S"]: json.loads(i["doc"]["S"]) for i in items if "doc" in i}


def until(predicate: Any, world: dict[str, Any], monkeypatch: Any, ticks: int = 6) -> None:
    results = []
    for _ in range(ticks):
        if predicate():
            return
        results.append(tick(world, monkeypatch))
        world["invoked"].wait()
        time.sleep(SCHEDULE_GAP_SECONDS)
    assert predicate(), (results, ledger(world), [r["stdout"][-2000:] + r["stderr"][-2000:] for r in world["server_runs"]])


def converged(world: dict[str, Any]) -> bool:
    slots = ledger(world)
    return (slots.get("slot#base-0", {}).get("phase") == "running"
            and slots.get("slot#warm-0", {}).get("phase") == "parked")


def connect(world: dict[str, Any]) -> Any:
    import boto3
    from rayito._agent._fleet import AgentFleet
    from rayito._agent._fleet_recipe_aws import SsmRecipeStore

    session = boto3.Session()
    seams = world["emulator"].vm_host.seams
    return AgentFleet.connect(FLEET, access_token=world["token"], recipe_store=SsmRecipeStore(session=session),
                              session=session, **seams.fleet(session=session))


def test_the_reconciler_starts_and_serves_the_products_vms(world, monkeypatch) -> None:
    for key, value in world["aws_env"].items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    until(lambda: converged(world), world, monkeypatch)
    slots = ledger(world)
    base, parked = slots["slot#base-0"]["microvm_id"], slots["slot#warm-0"]["microvm_id"]
    vm_host = world["emulator"].vm_host
    # The base VM was served by the fleet's server as a deploy serves it: network, the model
    # gateway (its secret read with the server's credentials), the host's configuration, the host.
    # The server first looks (the ready marker, the host's process) so that a second ask never
    # starts a second host.
    served = [c.rpc for c in vm_host.guest(base).calls() if c.rpc != "Health"]
    assert served[:7] == ["Network.UpdateNetwork", "Configure.Configure", "Configure.ConfigureStatus",
                          "Filesystem.Stat", "Process.List", "Filesystem.Write", "Process.Start"], served
    assert any(p.tag == "rayito-agent-serve" and p.running for p in vm_host.guest(base).processes.values())
    # The parked slot's VM was warmed as the product's pool warms a slot, then suspended.
    warmed = [c.rpc for c in vm_host.guest(parked).calls() if c.rpc != "Health"]
    assert warmed[:2] == ["Network.UpdateNetwork", "Code.Execute"], warmed
    assert {vm["microvmId"]: vm["state"] for vm in world["emulator"].microvms()} == {base: "RUNNING", parked: "SUSPENDED"}
    assert {r["event"]["role"] for r in world["server_runs"]} == {"member", "warm"}
    print(f"converged (base serving, parked slot parked) in {time.monotonic() - started:.1f} s")


def ping_status(emulator, vm_id: str, jwe: str) -> str:
    """The agent host's ``/ping`` on the VM (``Healthy``, ``HealthyBusy`` when every session
    slot runs), through the VM's endpoint as the AWS proxy routes it."""
    from .testing.helpers import host_request

    status, _, body = host_request(emulator.vm_host.guest(vm_id).endpoint, emulator.vm_host.seams.port, jwe, "GET", "/ping")
    return json.loads(body).get("status", "") if status == 200 else f"HTTP {status}"


def test_the_products_client_reads_invokes_and_takes_the_parked_slot(world, monkeypatch) -> None:
    for key, value in world["aws_env"].items():
        monkeypatch.setenv(key, value)
    until(lambda: converged(world), world, monkeypatch)
    slots = ledger(world)
    base, parked = slots["slot#base-0"]["microvm_id"], slots["slot#warm-0"]["microvm_id"]
    fleet = connect(world)
    status = fleet.status()
    assert (status.min_vms, status.max_vms, status.warm_vms, status.scaling_source) == (1, 3, 1, "recipe")
    assert {m.sandbox_id for m in status.members} == {base, parked}
    assert fleet.invoke("Hello").text == "Hola: Hello"
    # Three sessions at once: the product's client puts each on the free member with the fewest
    # of its sessions in flight (choose_member), the parked slot among them, so one takes the
    # parked slot (resumed, its gateway opened, served by the client) whatever their order.
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        long = [pool.submit(fleet.invoke, "sleep 8") for _ in range(2)]
        third = pool.submit(fleet.invoke, "tercera")
        assert third.result(timeout=120).text == "Hola: tercera"
        assert [f.result(timeout=120).text for f in long] == ["Hola: sleep 8"] * 2
    assert world["emulator"].vm_host.guest(parked).resume_generation >= 1
    assert any(p.tag == "rayito-agent-serve" and p.running for p in world["emulator"].vm_host.guest(parked).processes.values())
    # The reconciler sees the taken slot, makes it a member (never touched again) and parks a new VM.
    until(lambda: ledger(world).get("slot#warm-0", {}).get("microvm_id") not in (None, parked)
          and ledger(world)["slot#warm-0"]["phase"] == "parked", world, monkeypatch)
    assert f"slot#member-{parked}" in ledger(world)
    fleet.detach()


def test_past_the_queue_a_vm_answers_429_with_retry_after(world, monkeypatch) -> None:
    """The agent host the server started is the product's: max_concurrency 2 sessions at a time,
    queue_max 4 waiting, then 429 with Retry-After (HTTP/1.1 through the VM's endpoint, as the AWS
    proxy routes it)."""
    from .testing.helpers import host_request

    for key, value in world["aws_env"].items():
        monkeypatch.setenv(key, value)
    until(lambda: converged(world), world, monkeypatch)
    base = ledger(world)["slot#base-0"]["microvm_id"]
    emulator = world["emulator"]
    jwe = emulator.client().create_microvm_auth_token(microvmIdentifier=base, expirationInMinutes=5,
                                                      allowedPorts=[{"port": 8088}])["authToken"]["X-aws-proxy-auth"]
    endpoint, port = emulator.vm_host.guest(base).endpoint, emulator.vm_host.seams.port

    def invocation(prompt: str) -> tuple[int, dict[str, str], bytes]:
        return host_request(endpoint, port, jwe, "POST", "/invocations", {"prompt": prompt})

    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        # 2 running, 4 queued, for 10 s: the seventh is sent within it, once the host says busy.
        held = [pool.submit(invocation, "sleep 10") for _ in range(6)]
        wait_until(lambda: ping_status(emulator, base, jwe) == "HealthyBusy", timeout=7, every=0.05)
        time.sleep(0.5)  # the four behind them reach the queue; whichever comes seventh is refused
        late = invocation("una de más")
        answers = [late, *(f.result(timeout=60) for f in held)]
    refused = [a for a in answers if a[0] != 200]
    assert sorted(a[0] for a in answers) == [200] * 6 + [429], [a[0] for a in answers]
    (status, headers, body), = refused
    assert headers.get("retry-after") and json.loads(body)["error"] == "busy", (status, headers, body)


def test_an_ask_again_for_a_vm_served_or_being_served_starts_no_second_host(world, monkeypatch) -> None:
    """The server asked again about the base VM it served (an answer the reconciler missed) finds
    the host's ready marker and starts nothing; asked while the host it started is not ready yet
    (an earlier ask that ran out of time), it waits for that host's marker instead of starting a
    second one, which could not bind the port. Both asks in one warm execution environment of the
    server function (its handler, in this process)."""
    import threading

    from rayito._limits import AGENT_SERVICE_READY_MARKER_PATH

    from lambdas.reconciler import server

    until(lambda: converged(world), world, monkeypatch)
    slot = ledger(world)["slot#base-0"]
    base = slot["microvm_id"]
    guest = world["emulator"].vm_host.guest(base)
    for key, value in world["server_env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(server, "_SERVER", None)
    ask = {"microvm_id": base, "role": "member", "slot": "base-0", "attempt": slot["serve_asks"]}
    starts, lists = len(guest.calls("Process.Start")), len(guest.calls("Process.List"))
    assert server.handler(ask, None) == {"microvm_id": base, "outcome": "ready"}
    assert len(guest.calls("Process.List")) == lists  # the marker was there: nothing more looked at
    marker = guest.path(AGENT_SERVICE_READY_MARKER_PATH)
    content = marker.read_bytes()
    marker.unlink()  # as before the host it runs was ready
    ready = threading.Timer(1.0, marker.write_bytes, [content])
    ready.start()
    try:
        assert server.handler(ask, None) == {"microvm_id": base, "outcome": "ready"}
    finally:
        ready.join()
    assert len(guest.calls("Process.List")) == lists + 1 and len(guest.calls("Process.Start")) == starts


def test_the_products_cli_sees_the_fleet_and_stop_keeps_it_off(world, monkeypatch) -> None:
    for key, value in world["aws_env"].items():
        monkeypatch.setenv(key, value)
    until(lambda: converged(world), world, monkeypatch)
    env = {**_base_env(), **world["aws_env"], "RAYITO_ACCESS_TOKEN": world["token"]}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rayito.cli", *args], env=env, capture_output=True, text=True,
                              timeout=180, cwd=str(ROOT / "tests"))

    status = cli("agent", "status", FLEET)
    assert status.returncode == 0, status.stderr
    assert "(min 1, max 3)" in status.stdout, status.stdout
    invoked = cli("agent", "invoke", FLEET, "Hola")
    assert invoked.returncode == 0, invoked.stderr
    assert invoked.stdout.startswith("Hola: Hola")
    stopped = cli("agent", "stop", FLEET)
    assert stopped.returncode == 0, stopped.stderr
    live = [vm for vm in world["emulator"].microvms() if vm["state"] not in ("TERMINATING", "TERMINATED")]
    assert live == [], live
    # Off means off: the recipe is gone, and the reconciler starts nothing until a deploy writes it.
    for _ in range(2):
        result = tick(world, monkeypatch)
        assert result["skipped"] == "fleet_stopped", result
    assert [vm for vm in world["emulator"].microvms() if vm["state"] not in ("TERMINATING", "TERMINATED")] == []
