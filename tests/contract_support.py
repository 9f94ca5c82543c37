"""Contract tests from template to handler: what `make synth` writes, run as Lambda would run it.

* :func:`synth_example` runs app.py's ``main()`` (what ``npx cdk synth`` runs for ``make synth``)
  with cdk.json's context into a cloud assembly, and reads the stack's template from it.
* :func:`provision` makes the template's own DynamoDB tables and SQS queues in moto from their
  ``Properties`` (key schema, billing, TTL), under generated names as CloudFormation would.
* :func:`function_environment` resolves a function's ``Environment.Variables``: literal values
  are kept as synthesized; each ``Ref``/``Fn::GetAtt`` is answered by what the deploy would give
  (a provisioned table or queue, the emulator's image ARN and version, a role ARN). A reference it
  does not know fails the test, so a new one in the construct is noticed here.
* :func:`run_lambda` runs the function's handler string from the template in a new process
  (tests/lambda_runner.py: one execution environment, a real Lambda context), with only that
  environment, the asset's code (checked to be this repository's ``lambdas/`` byte for byte).
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .conftest import ROOT

#: Seconds a handler process may run before the test fails instead of hanging.
PROCESS_TIMEOUT_SECONDS = 240
ROLE_ARN = "arn:aws:iam::123456789012:role/rayito-contract"


def synth_example(outdir: Path) -> dict[str, Any]:
    """app.py on the default project with cdk.json's context and ``-c metrics=true`` (``make synth
    CDK_ARGS="-c metrics=true"``); the stack's template."""
    import importlib.util

    import aws_cdk as cdk

    # `make synth -c metrics=true` (CDK_ARGS): the fleet whose telemetry the contract reads (since
    # issue #15 custom metrics are opt-in; the default fleet publishes none)
    # and `-c base_artifact=<rayito-image.zip>`: the fleet builds the product's agent image
    from .cdk_helpers import stand_in_rayd

    context = {**json.loads((ROOT / "cdk.json").read_text())["context"], "metrics": "true",
               "base_artifact": stand_in_rayd()}
    spec = importlib.util.spec_from_file_location("rayito_app_contract", ROOT / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.chdir(ROOT):  # app.py's default project is relative, as under `make synth`
        code = module.main(cdk.App(outdir=str(outdir), context=context, analytics_reporting=False))
    assert code == 0, f"app.py exited {code}"
    manifest = json.loads((outdir / "manifest.json").read_text())
    (stack,) = [a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
    template = json.loads((outdir / stack["properties"]["templateFile"]).read_text())
    # Not put under the session's IAM gate: this stack is environment-agnostic (as `make synth`
    # makes it), and tests/iam_invariants.py's allow-list reads the resolved ARNs of a stack with
    # an account and region; the same fleet with one is gated by tests/test_fleet.py.
    return template


def image_template_env(outdir: Path, template: dict[str, Any]) -> dict[str, str]:
    """What rayd hands to every process of the fleet's image: the template env inside the
    composed zip the assembly stages (``asset.<hash>.zip``)."""
    import re

    from rayito_constructs.image_composition import template_env_of

    (image,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::MicrovmImage"]
    (digest,) = re.findall(r"([0-9a-f]{64})\.zip", json.dumps(image["Properties"]["CodeArtifact"]))
    return template_env_of((outdir / f"asset.{digest}.zip").read_bytes())


def function(template: dict[str, Any], handler: str) -> tuple[str, dict[str, Any]]:
    """The one ``AWS::Lambda::Function`` with this handler string: (logical id, resource)."""
    (found,) = [(k, r) for k, r in template["Resources"].items()
                if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == handler]
    return found


def asset_code(outdir: Path, resource: dict[str, Any], source: Path) -> Path:
    """The function's code as staged in the assembly, checked equal to ``source`` (this repository's
    folder): the same files, byte for byte, caches aside. Returns ``source``'s parent folder level
    that plays Lambda's /var/task (so coverage measures the repository's files)."""
    key = resource["Properties"]["Code"]["S3Key"]  # "<asset hash>.zip", staged as asset.<hash>/
    asset = outdir / f"asset.{key.removesuffix('.zip')}"
    assert asset.is_dir(), f"{asset} is not staged in the assembly"
    staged = {p.relative_to(asset).as_posix() for p in asset.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    # the asset's top is either the function's folder or (a package) the folder above it
    top = source if (asset / "index.py").is_file() else source.parent
    ours = {p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and (top == source or p.is_relative_to(source))}
    assert staged == ours, f"the staged code differs from {source}: {sorted(staged ^ ours)}"
    for name in staged:
        assert filecmp.cmp(asset / name, top / name, shallow=False), f"{name} differs from the staged asset"
    return top


@dataclass
class Provisioned:
    """Physical names of what :func:`provision` made, by logical id."""

    names: dict[str, str] = field(default_factory=dict)
    arns: dict[str, str] = field(default_factory=dict)


def provision(template: dict[str, Any], ddb: Any, sqs: Any, types: tuple[str, ...] = ("AWS::DynamoDB::Table", "AWS::SQS::Queue")) -> Provisioned:
    """The template's tables and queues in moto, from their own properties."""
    out = Provisioned()
    suffix = uuid.uuid4().hex[:8]
    for logical, resource in template["Resources"].items():
        if resource["Type"] not in types:
            continue
        props = resource["Properties"]
        name = f"{logical[:40]}-{suffix}"
        if resource["Type"] == "AWS::DynamoDB::Table":
            args: dict[str, Any] = {"TableName": name, "KeySchema": props["KeySchema"],
                                    "AttributeDefinitions": props["AttributeDefinitions"]}
            if props.get("BillingMode") == "PAY_PER_REQUEST":
                args["BillingMode"] = "PAY_PER_REQUEST"
            else:
                args["ProvisionedThroughput"] = props["ProvisionedThroughput"]
            ddb.create_table(**args)
            ttl = props.get("TimeToLiveSpecification")
            if ttl and ttl.get("Enabled"):
                ddb.update_time_to_live(TableName=name, TimeToLiveSpecification={
                    "Enabled": True, "AttributeName": ttl["AttributeName"]})
            out.names[logical] = name
            out.arns[logical] = f"arn:aws:dynamodb:us-east-1:123456789012:table/{name}"
        else:
            attributes = {k: str(v) for k, v in props.items() if k in ("MessageRetentionPeriod", "VisibilityTimeout")}
            url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
            out.names[logical] = url  # a queue's Ref is its URL
            out.arns[logical] = f"arn:aws:sqs:us-east-1:123456789012:{name}"
    return out


def function_environment(resource: dict[str, Any], resolve: Callable[[dict[str, Any]], Optional[str]]) -> dict[str, str]:
    """``Environment.Variables`` with each intrinsic answered by ``resolve`` (None: unknown, fails)."""
    out = {}
    for key, value in resource["Properties"].get("Environment", {}).get("Variables", {}).items():
        if isinstance(value, str):
            out[key] = value
            continue
        resolved = resolve(value)
        assert resolved is not None, f"{key}: the template sets it from {value}, which this test cannot resolve"
        out[key] = resolved
    return out


def lambda_environment(resource: dict[str, Any], logical: str, variables: dict[str, str],
                       endpoints: dict[str, str]) -> dict[str, str]:
    """What the Lambda runtime gives the process: its own variables, the function's, and (here
    only) the endpoints of moto and the emulator. Nothing of the test's own environment leaks in
    but the PATH and coverage's measurement of subprocesses."""
    props = resource["Properties"]
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR") or k.startswith("COVERAGE_")}
    runtime = {
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_LAMBDA_FUNCTION_NAME": logical, "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(props.get("MemorySize", 128)),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{props['Runtime']}", "LAMBDA_TASK_ROOT": "/var/task",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
    }
    return {**base, **runtime, **variables, **{f"AWS_ENDPOINT_URL_{k}": v for k, v in endpoints.items()}}


@dataclass
class Run:
    """One execution environment's invocations: outcomes and everything it printed."""

    results: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    records: list[dict[str, Any]]
    stdout: str
    stderr: str

    def logs(self, message: Optional[str] = None) -> list[dict[str, Any]]:
        lines = [r for r in self.records if "_aws" not in r and "message" in r]
        return [r for r in lines if message is None or r["message"] == message]

    def metrics(self, name: str) -> list[tuple[float, str]]:
        """(value, unit) of every EMF point of ``name``, as CloudWatch would read it."""
        out = []
        for record in self.records:
            for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
                for metric in directive["Metrics"]:
                    if metric["Name"] == name:
                        values = record[name] if isinstance(record[name], list) else [record[name]]
                        out += [(float(v), metric.get("Unit", "None")) for v in values]
        return out

    def units(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for record in self.records:
            for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
                for metric in directive["Metrics"]:
                    out.setdefault(metric["Name"], set()).add(metric.get("Unit", "None"))
        return out


def layer_folders(template: dict[str, Any], resource: dict[str, Any]) -> list[str]:
    """Where the function's layers are on this machine, in the order Lambda puts them on the path
    (``/opt/python``): the product layer (``ProductLayer``) as built for this machine from the same
    pins as the synthesized one (its asset key says which), and public layers by ARN left out (the
    Powertools layer's code is the test environment's own aws-lambda-powertools, pinned alike)."""
    import hashlib

    from rayito_constructs.wheels import LAMBDA, host_platform, layer_folder, layer_key

    staged = hashlib.sha256(layer_key(LAMBDA).encode()).hexdigest()  # the CDK hashes a custom asset hash
    out = []
    for layer in resource["Properties"].get("Layers", []):
        if isinstance(layer, dict) and "Ref" in layer:
            content = template["Resources"][layer["Ref"]]["Properties"]["Content"]
            assert content["S3Key"] == f"{staged}.zip", "the product layer's pins changed since the synth"
            out.append(str(layer_folder(host_platform())))
    return out


def run_lambda(code: Path, resource: dict[str, Any], env: dict[str, str], events: list[Any],
               *, timeout_seconds: Optional[float] = None, pause_seconds: float = 0.0,
               layers: tuple[str, ...] = ()) -> Run:
    """Invoke the handler of ``resource`` with ``events`` in one new execution environment
    (``layers``: the folders of its layers, :func:`layer_folders`)."""
    props = resource["Properties"]
    spec = {"code": str(code), "handler": props["Handler"], "events": events, "layers": list(layers),
            "timeout_seconds": timeout_seconds if timeout_seconds is not None else props.get("Timeout", 3),
            "function_name": env.get("AWS_LAMBDA_FUNCTION_NAME", "contract"), "memory_mb": props.get("MemorySize", 128),
            "pause_seconds": pause_seconds}
    proc = subprocess.run([sys.executable, "-m", "tests.lambda_runner", json.dumps(spec)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT_SECONDS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results, errors, records = [], [], []
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            results.append(json.loads(line[7:]))
        elif line.startswith("ERROR "):
            errors.append(json.loads(line[6:]))
        elif line.startswith("{"):
            records.append(json.loads(line))
    assert len(results) + len(errors) == len(events), proc.stdout[-4000:] + proc.stderr[-4000:]
    return Run(results, errors, records, proc.stdout, proc.stderr)


@contextlib.contextmanager
def refusing_port() -> Iterator[str]:
    """A port bound and not listening: every connection is refused (held bound, so no one takes it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
