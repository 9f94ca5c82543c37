"""The reconciler's handler on a Lambda runtime whose SDK predates lambda-microvms.

``make test`` installs boto3/botocore 1.40.0 (requirements-lambda-runtime.txt) into
.make/lambda-runtime, as a Lambda runtime may bundle; the handler runs in a subprocess with the
path Lambda gives it (the function's code, then its layers: the product layer, which brings the SDK
the product was made for, then the runtime's old SDK), against the MicroVMs emulator over HTTP and
moto. The function also ships the service's model (``lambdas/reconciler/data``) for a runtime
without the layer's SDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid


from lambdas.reconciler.budget import DynamoDBBudget
from lambdas.reconciler.ledger import DynamoDBLedger
from rayito_constructs.testing import MicrovmsEmulator

from rayito_constructs.testing.serving import VirtualServer

from ..conftest import ROOT
from ..lambda_invoke import lambda_functions
from ..moto_server import client as aws_client
from ..moto_server import moto_server
from .harness import put_fleet_state

OLD_SDK = ROOT / ".make" / "lambda-runtime"


def run_in_old_runtime(code: str, env: dict[str, str], layers: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    assert (OLD_SDK / "botocore").is_dir(), "run `make test` (it installs requirements-lambda-runtime.txt)"
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), *layers, str(OLD_SDK)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_the_old_sdk_really_lacks_the_service() -> None:
    result = run_in_old_runtime(
        "import botocore, boto3; print(botocore.__version__); boto3.client('lambda-microvms', region_name='us-east-1')",
        {},
    )
    assert result.stdout.strip() == "1.40.0"
    assert "UnknownServiceError" in result.stderr


def test_handler_runs_a_tick_on_the_old_sdk() -> None:
    from rayito_constructs.wheels import host_platform, layer_folder

    layer = layer_folder(host_platform())  # what Lambda puts under /opt/python
    assert (layer / "botocore").is_dir(), "run `make test` (it builds the product layer for this machine)"
    with moto_server() as aws, MicrovmsEmulator(pending_seconds=0.2, suspending_seconds=0.1) as emulator, \
            lambda_functions() as (lambda_url, functions):
        image = emulator.create_image("viejo", hooks=True)
        ddb = aws_client("dynamodb", aws)
        suffix = uuid.uuid4().hex[:6]
        DynamoDBLedger.create_table(ddb, f"ledger-{suffix}")
        DynamoDBBudget.create_table(ddb, f"budget-{suffix}")
        queue = aws_client("sqs", aws).create_queue(QueueName=f"dlq-{suffix}")["QueueUrl"]
        put_fleet_state(aws, "viejo", "rayito/agents/viejo/access-token", image_version=None,
                        scaling={"min_vms": 2, "max_vms": 4, "warm": 1})
        functions.register("viejo-server", VirtualServer(emulator, DynamoDBLedger(ddb, f"ledger-{suffix}")).ask)
        env = {
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_DYNAMODB": aws, "AWS_ENDPOINT_URL_SQS": aws, "AWS_ENDPOINT_URL_SSM": aws,
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": aws, "AWS_ENDPOINT_URL_LAMBDA": lambda_url,
            "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": emulator.endpoint_url,
            "FLEET_NAME": "viejo", "IMAGE_ARN": image, "MIN_VMS": "2", "MAX_VMS": "4", "WARM_VMS": "1",
            "LEDGER_TABLE": f"ledger-{suffix}", "BUDGET_TABLE": f"budget-{suffix}", "DEAD_LETTER_QUEUE_URL": queue,
            "TICK_SECONDS": "8", "POWERTOOLS_METRICS_NAMESPACE": "Rayito/Fleet", "RAYITO_METRICS": "on",
            "ACCESS_TOKEN_SECRET": "rayito/agents/viejo/access-token", "SERVER_FUNCTION": "viejo-server",
        }
        code = (
            "import botocore, json\n"
            "from lambdas.reconciler import index\n"
            "result = index.handler({'source': 'schedule'}, None)\n"
            "print('RESULT', json.dumps(result), botocore.__version__)\n"
        )
        result = run_in_old_runtime(code, env, (str(layer),))
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.splitlines()
        (summary,) = [l for l in lines if l.startswith("RESULT ")]
        assert not summary.endswith(" 1.40.0")  # the product layer's SDK, ahead of the runtime's
        assert json.loads(summary.split(" ", 1)[1].rsplit(" ", 1)[0])["fleet"] == "viejo"
        import time

        # The parked slot may still be SUSPENDING when the tick's deadline came (0.1 s of the
        # emulator's real clock): its state is read until it lands, however slow the machine.
        deadline = time.monotonic() + 30
        while (states := sorted(vm["state"] for vm in emulator.microvms())) != ["RUNNING", "RUNNING", "SUSPENDED"]:
            if "SUSPENDING" not in states or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert states == ["RUNNING", "RUNNING", "SUSPENDED"], (states, result.stdout[-4000:])
        # What it tells: the timeline as structured log lines and EMF metrics with the fleet dimension.
        records = [json.loads(l) for l in lines if l.startswith("{")]
        timeline = [r for r in records if r.get("message") == "run_requested"]
        assert len(timeline) == 3 and all(r["fleet"] == "viejo" for r in timeline)
        emf = [r for r in records if "_aws" in r]
        names = {m["Name"] for r in emf for d in r["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
        assert {"LiveBaseVMs", "ParkedSlots", "Deficit", "WaitTime", "RetryAmplification"} <= names
        assert all(r["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Rayito/Fleet" for r in emf)
        assert any(r.get("fleet") == "viejo" for r in emf)


def test_emf_without_powertools() -> None:
    import io

    from lambdas.reconciler.telemetry import EmfTelemetry

    out = io.StringIO()
    telemetry = EmfTelemetry("sin-capa", out=out)
    telemetry.event("sin-capa", {"event": "run_requested", "slot": "base-0"})
    telemetry.metric("sin-capa", "Deficit", 2)
    telemetry.metric("sin-capa", "Throttles", 1, operation="RunMicrovm")
    telemetry.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["message"] == "run_requested" and lines[0]["fleet"] == "sin-capa"
    assert lines[1]["Deficit"] == 2 and lines[1]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Rayito/Fleet"
    assert lines[2]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["fleet", "service", "operation"]]
