"""Contract from template to handler: the reconciler as `make synth` deploys it, run as Lambda runs it.

The example fleet is synthesized by app.py (what `make synth` runs); the reconciler function's
handler string, timeout, staged code (checked equal to lambdas/reconciler), environment and the
scheduler's input come from that template; its tables and dead-letter queue are made in moto from
the template's own properties. The handler then runs in a new process per execution environment
(tests/lambda_runner.py) with a real Lambda context (the function's timeout, counting down on the
real clock), its default telemetry (Powertools), its own clients (index.build: retries, timeouts,
the bundled service model) against the MicroVMs emulator and moto over HTTP.

Everything asserted comes from the other side: the requests the emulator saw, the VMs it holds,
the messages in moto's SQS queue, the ledger items in moto's table, and the EMF records on stdout
with their units. The reconciler's own counters (its return value) are not evidence here.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rayito_constructs.testing import MicrovmsEmulator

from rayito_constructs.testing.serving import VirtualServer

from .. import contract_support as cs
from ..conftest import ROOT
from ..lambda_invoke import lambda_functions
from ..moto_server import client as aws_client
from ..moto_server import moto_server
from .harness import put_fleet_state

HANDLER = "reconciler.index.handler"


@pytest.fixture(scope="module")
def deployed(example_assembly):
    outdir, template = example_assembly
    logical, resource = cs.function(template, HANDLER)
    code = cs.asset_code(outdir, resource, ROOT / "lambdas" / "reconciler")
    (schedule,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Scheduler::Schedule"
                   and r["Properties"]["Target"]["Arn"] == {"Fn::GetAtt": [logical, "Arn"]}]
    event = json.loads(schedule["Properties"]["Target"]["Input"])
    with moto_server() as aws, lambda_functions() as (lambda_url, functions):
        yield {"template": template, "logical": logical, "resource": resource, "code": code, "event": event,
               "aws": aws, "lambda": lambda_url, "functions": functions,
               "layers": tuple(cs.layer_folders(template, resource))}


class World:
    """One deploy of the example fleet: moto's tables and queue from the template, a new emulator."""

    def __init__(self, deployed: dict[str, Any], emulator: MicrovmsEmulator, *, image_version: str = "1.0",
                 watch: bool = False) -> None:
        self.d = deployed
        self.emulator = emulator
        self.ddb = aws_client("dynamodb", deployed["aws"])
        self.sqs = aws_client("sqs", deployed["aws"])
        self.made = cs.provision(deployed["template"], self.ddb, self.sqs)
        self.fleet = deployed["resource"]["Properties"]["Environment"]["Variables"]["FLEET_NAME"]
        self.image = emulator.create_image(self.fleet, memory_mib=4096, hooks=True)  # the product's base: hooks on
        self.image_version = image_version
        images = {k for k, r in deployed["template"]["Resources"].items() if r["Type"] == "AWS::Lambda::MicrovmImage"}

        def resolve(value: dict[str, Any]) -> Any:
            if "Ref" in value and value["Ref"] in self.made.names:
                return self.made.names[value["Ref"]]
            attribute = value.get("Fn::GetAtt")
            if attribute and attribute[0] in images:
                return {"ImageArn": self.image, "LatestActiveImageVersion": self.image_version}.get(attribute[1])
            if attribute and attribute[1] == "Arn" and deployed["template"]["Resources"][attribute[0]]["Type"] == "AWS::IAM::Role":
                return cs.ROLE_ARN
            if "Ref" in value and deployed["template"]["Resources"][value["Ref"]]["Type"] == "AWS::Lambda::Function":
                return f"{self.fleet}-server"  # the only function the reconciler names: its server
            return None

        self.variables = cs.function_environment(deployed["resource"], resolve)
        self.env = cs.lambda_environment(deployed["resource"], deployed["logical"], self.variables, {
            "DYNAMODB": deployed["aws"], "SQS": deployed["aws"], "LAMBDA_MICROVMS": emulator.endpoint_url,
            "SSM": deployed["aws"], "SECRETS_MANAGER": deployed["aws"], "LAMBDA": deployed["lambda"]})
        if not watch:
            # The parked-slot watch keeps a tick with a parked slot alive its whole TICK_SECONDS (50 s
            # of real time here) to look at it every WATCH_SECONDS; the fault scenarios are about
            # runs, so they tick without it. Normal operation keeps the synthesized value.
            self.env["WATCH_SECONDS"] = "0"
        # What the deploy leaves: the fleet's recipe (the writer's, with the version it built) and
        # token; the server (its own contract: tests/test_fleet_product.py) as it answers in time.
        put_fleet_state(deployed["aws"], self.fleet, self.variables["ACCESS_TOKEN_SECRET"], image_version=image_version)
        from lambdas.reconciler.ledger import DynamoDBLedger

        self.server = VirtualServer(emulator, DynamoDBLedger(self.ddb, self.variables["LEDGER_TABLE"]))
        deployed["functions"].register(self.variables["SERVER_FUNCTION"], self.server.ask)

    def invoke(self, *events: Any, timeout_seconds: float | None = None, pause_seconds: float = 0.0) -> cs.Run:
        """A new execution environment (a cold start) that gets ``events`` one after the other."""
        return cs.run_lambda(self.d["code"], self.d["resource"], self.env, list(events) or [self.d["event"]],
                             timeout_seconds=timeout_seconds, pause_seconds=pause_seconds, layers=self.d["layers"])

    def converged(self) -> bool:
        v = self.variables
        states = sorted("SUSPENDED" if vm["state"] == "SUSPENDING" else vm["state"] for vm in self.live())
        return states == sorted(["RUNNING"] * int(v["MIN_VMS"]) + ["SUSPENDED"] * int(v["WARM_VMS"]))

    def schedule(self, rounds: int = 6, until: Any = None) -> list[cs.Run]:
        """The scheduler's ticks until the fleet is whole (at most ``rounds`` execution environments
        of two ticks each, a second apart: however slow the machine, never a fixed count of ticks
        that a loaded machine could fall short of). Every run's errors must be empty."""
        runs = []
        for _ in range(rounds):
            runs.append(self.invoke(self.d["event"], self.d["event"], pause_seconds=1.0))
            assert runs[-1].errors == [], runs[-1].errors
            if self.converged() and (until is None or until()):
                break
        return runs

    # ground truth -------------------------------------------------------------------------
    def requests(self, operation: str) -> list[Any]:
        return [r for r in self.emulator.requests if r.operation == operation]

    def live(self) -> list[dict[str, Any]]:
        return [vm for vm in self.emulator.microvms() if vm["imageArn"] == self.image and vm["state"] != "TERMINATED"]

    def ever(self) -> list[dict[str, Any]]:
        return [vm for vm in self.emulator.microvms_ever() if vm["imageArn"] == self.image]

    def dead_letters(self) -> list[dict[str, Any]]:
        queue = self.variables["DEAD_LETTER_QUEUE_URL"]
        messages = self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    def ledger(self) -> list[dict[str, Any]]:
        table = self.variables["LEDGER_TABLE"]
        return self.ddb.scan(TableName=table, ConsistentRead=True)["Items"]

    def ledger_dead(self) -> int:
        """Slots the ledger (moto's table) holds as dead-lettered."""
        return sum(1 for item in self.ledger() if item["key"]["S"].startswith("slot#")
                   and json.loads(item["doc"]["S"]).get("phase") == "dead")

    def assert_converged(self) -> None:
        """min_vms running and warm_vms parked, each started with what the template says."""
        v = self.variables
        states = sorted(vm["state"] for vm in self.live())
        want = ["RUNNING"] * int(v["MIN_VMS"]) + ["SUSPENDED"] * int(v["WARM_VMS"])
        assert [s if s != "SUSPENDING" else "SUSPENDED" for s in states] == sorted(want), states
        api = self.emulator.client()
        for vm in self.live():
            seen = api.get_microvm(microvmIdentifier=vm["microvmId"])
            assert seen["executionRoleArn"] == v["EXECUTION_ROLE_ARN"] == cs.ROLE_ARN
            assert seen["imageVersion"] == self.image_version
            # Every VM as the product starts it: the service suspends it when idle (a call resumes it).
            assert seen["idlePolicy"]["maxIdleDurationSeconds"] == int(v["IDLE_SECONDS"])
            assert seen["idlePolicy"]["autoResumeEnabled"] is True


def _emulator(**options: Any) -> MicrovmsEmulator:
    # measured behaviour (lists that lag, lingering TERMINATED VMs), quick lifecycle so real time is short
    options.setdefault("pending_seconds", 0.3)
    options.setdefault("suspending_seconds", 0.2)
    options.setdefault("terminating_seconds", 0.2)
    options.setdefault("app_exit_report_seconds", 0.5)  # measured 15 s of RUNNING after the app exits
    options.setdefault("fresh_launch_seconds", (0.3, 0.6))  # measured 26-65 s for a new version's first VMs
    return MicrovmsEmulator(seed=options.pop("seed", 17), **options)


UNITS = {"WaitTime": "Seconds", "ClaimToComplete": "Seconds", "LiveBaseVMs": "Count", "Deficit": "Count",
         "RetryAmplification": "None", "RunMicrovmAttempts": "Count"}


def test_the_template_names_what_the_handler_needs(deployed) -> None:
    """Every reference of the environment is something the deploy makes, and the code staged is ours."""
    env = deployed["resource"]["Properties"]["Environment"]["Variables"]
    assert {k for k, v in env.items() if not isinstance(v, str)} == {
        "IMAGE_ARN", "IMAGE_VERSION", "EXECUTION_ROLE_ARN", "LEDGER_TABLE", "BUDGET_TABLE", "DEAD_LETTER_QUEUE_URL",
        "SERVER_FUNCTION"}
    assert deployed["event"] == {"source": "schedule", "fleet": "mi-agente"}  # the schedule names its fleet (#13)
    assert deployed["resource"]["Properties"]["Timeout"] > float(env["TICK_SECONDS"]) + 8  # the margin index.py keeps


def test_normal_operation_converges_and_tells_in_emf_with_units(deployed) -> None:
    with _emulator() as emulator:
        world = World(deployed, emulator, watch=True)
        first = world.invoke(deployed["event"], deployed["event"])  # a cold start, then the next minute warm
        assert first.errors == []
        world.assert_converged()
        runs = world.requests("RunMicrovm")
        want = int(world.variables["MIN_VMS"]) + int(world.variables["WARM_VMS"])
        assert [r.status for r in runs] == [200] * want  # one request per VM: the second tick starts none
        assert len({r.client_token for r in runs}) == want
        assert len(world.requests("SuspendMicrovm")) == int(world.variables["WARM_VMS"])
        assert world.dead_letters() == []
        # EMF as CloudWatch reads it: namespace, the fleet dimension, and the unit of each metric
        units = first.units()
        for name, unit in UNITS.items():
            assert units.get(name) == {unit}, (name, units.get(name))
        emf = [r for r in first.records if "_aws" in r]
        assert all(d["Namespace"] == "Rayito/Fleet" for r in emf for d in r["_aws"]["CloudWatchMetrics"])
        assert all(r["fleet"] == world.fleet for r in emf)
        assert first.metrics("LiveBaseVMs")[-1] == (float(world.variables["MIN_VMS"]), "Count")
        # the timeline: one run_requested per VM the emulator made, as Powertools logs it
        requested = first.logs("run_requested")
        assert len(requested) == want and all(r["service"] == "rayito-reconciler" for r in requested)
        assert {r["level"] for r in first.logs()} <= {"INFO", "WARNING"}
        # The next tick finds the slot parked and watches its VM (GetMicrovm every WATCH_SECONDS, as
        # synthesized) until its invocation's hard bound: a context of 20 s here, where the
        # template's 65 s would hold the test a minute; the two ticks above park it and end.
        time.sleep(1.0)  # the list shows the VM SUSPENDED
        parked = {vm["microvmId"] for vm in world.live() if vm["state"] == "SUSPENDED"}
        before = len(world.requests("GetMicrovm"))
        watching = world.invoke(deployed["event"], timeout_seconds=20)
        assert watching.errors == [] and len(parked) == int(world.variables["WARM_VMS"])
        looks = [r for r in world.requests("GetMicrovm")[before:] if r.microvm_id in parked and r.status == 200]
        assert len(looks) >= 2 * len(parked), looks
        world.assert_converged()


@pytest.mark.parametrize("kind", ["InternalServer", "InsufficientCapacity"])
def test_a_refused_run_is_retried_by_the_reconciler_not_the_client(deployed, kind) -> None:
    with _emulator() as emulator:
        world = World(deployed, emulator)
        emulator.inject("RunMicrovm", kind, times=1)
        ticks = world.schedule()
        world.assert_converged()
        runs = world.requests("RunMicrovm")
        failed = [r for r in runs if r.status >= 500]
        assert len(failed) == 1 and failed[0].error.startswith(kind)
        want = int(world.variables["MIN_VMS"]) + int(world.variables["WARM_VMS"])
        assert len(runs) == want + 1  # the client made one attempt; the reconciler one more, later
        assert len(world.ever()) == want and world.dead_letters() == []
        assert any(r["message"] == "api_error" and r["operation"] == "RunMicrovm" for run in ticks for r in run.logs())


def test_a_lost_response_makes_no_second_vm(deployed) -> None:
    with _emulator() as emulator:
        world = World(deployed, emulator)
        emulator.inject("RunMicrovm", "lost_response", times=1)
        world.schedule()
        world.assert_converged()
        want = int(world.variables["MIN_VMS"]) + int(world.variables["WARM_VMS"])
        assert len(world.ever()) == want  # the retry reused the token: the service made no duplicate
        tokens = [r.client_token for r in world.requests("RunMicrovm")]
        assert len(tokens) == want + 1 and len(set(tokens)) == want


def test_a_hung_call_times_out_on_the_clients_own_timeout(deployed) -> None:
    """A RunMicrovm that answers after the client's read timeout (15 s): the handler's client gives
    up (one attempt), the tick goes on, and the VM the service made anyway is not doubled."""
    from lambdas.reconciler.index import MICROVMS_CONFIG

    with _emulator() as emulator:
        world = World(deployed, emulator)
        emulator.inject("RunMicrovm", "latency", seconds=MICROVMS_CONFIG.read_timeout + 1, times=1)
        world.schedule()
        world.assert_converged()
        assert len(world.ever()) == int(world.variables["MIN_VMS"]) + int(world.variables["WARM_VMS"])


def test_a_crashing_app_is_replaced(deployed) -> None:
    with _emulator() as emulator:
        world = World(deployed, emulator)
        emulator.inject("RunMicrovm", "crash", after_seconds=0.5, times=1, image=world.image)
        world.schedule(until=lambda: any(vm["state"] == "TERMINATED" for vm in world.ever()))
        world.assert_converged()
        ended = [vm for vm in world.ever() if vm["state"] == "TERMINATED"]
        assert len(ended) == 1 and "Exit Code" in (ended[0]["stateReason"] or "")
        assert world.dead_letters() == []


def test_a_failing_suspend_hook_is_replaced(deployed) -> None:
    with _emulator() as emulator:
        world = World(deployed, emulator)
        emulator.inject("SuspendMicrovm", "suspend_hook_failure", times=1)
        world.schedule(until=lambda: any(vm["state"] == "TERMINATED" for vm in world.ever()))
        world.assert_converged()
        assert len([vm for vm in world.ever() if vm["state"] == "TERMINATED"]) == 1
        assert len(world.requests("SuspendMicrovm")) == int(world.variables["WARM_VMS"]) + 1


def test_an_unrunnable_version_is_dead_lettered_then_redriven(deployed) -> None:
    """The deploy names a version the service refuses: after MAX_START_ATTEMPTS the slots are
    dead-lettered into the template's queue; once the version exists, ``redrive`` (the documented
    operator action) and the next tick start them."""
    with _emulator() as emulator:
        world = World(deployed, emulator, image_version="7.0")
        attempts = int(world.variables["MAX_START_ATTEMPTS"])
        want = int(world.variables["MIN_VMS"]) + int(world.variables["WARM_VMS"])
        runs = []
        for _ in range(8):  # ticks until every slot used its attempts (however slow the machine)
            runs.append(world.invoke(deployed["event"], deployed["event"], pause_seconds=1.0))
            assert runs[-1].errors == []
            if len(world.requests("RunMicrovm")) >= want * attempts and world.ledger_dead() == want:
                break
        refused = world.requests("RunMicrovm")
        assert refused and all(r.status >= 400 for r in refused) and world.ever() == []
        assert len(refused) == want * attempts  # each slot tried exactly MAX_START_ATTEMPTS times
        letters = world.dead_letters()
        assert len(letters) == want, letters
        assert all(letter["fleet"] == world.fleet and letter["errors"] >= attempts for letter in letters)
        assert (float(want), "Count") in [point for run in runs for point in run.metrics("DeadLetteredSlots")]

        emulator.publish_version(world.fleet, "7.0")
        second = world.invoke({"action": "redrive"})
        assert second.errors == []
        assert sorted(second.results[0]["redriven"]) == sorted(letter["slot"] for letter in letters)
        assert second.logs("slots_redriven") and world.ledger_dead() == 0
        world.schedule()
        world.assert_converged()
        assert {vm["imageVersion"] for vm in world.live()} == {"7.0"}
