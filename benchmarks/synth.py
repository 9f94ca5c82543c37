"""Synth time and template size for 1, 10 and 50 fleets in one app, against a hand-written baseline.

    .venv/bin/python -m benchmarks.synth [--sizes 1 10 50] [--repeat 3] [--json]

"ours" builds each fleet with ``AgentFleet`` (project model, recipe encoding, policies, grants,
cdk-nag acknowledgements). "baseline" writes the same CloudFormation resources by hand with L1
constructs and literal policy documents: what the resources cost to synthesize with no library at
all. Both run in this one process, after a warm-up, so jsii's start-up is not counted. Reported:
the median wall time of ``app.synth()`` including construction, the template size, and the marginal
cost per fleet (the slope between the smallest and the largest size).
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

from rayito_constructs import AgentFleet, AgentProject
from rayito_constructs.recipe import plan_recipe

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "mi-agente"


def _example_without_budgets() -> Path:
    """The example agent without its egress budgets, so every variant has the same resources as
    the baseline (the budgets' table and alarms are not part of it)."""
    folder = Path(tempfile.mkdtemp(prefix="rayito-bench-")) / "mi-agente"
    atexit.register(shutil.rmtree, folder.parent, True)
    shutil.copytree(SOURCE, folder)
    text = (folder / "rayito-agent.toml").read_text()
    (folder / "rayito-agent.toml").write_text(text.split("[[egress.budgets]]")[0])
    return folder


EXAMPLE = _example_without_budgets()
ENV = cdk.Environment(account="123456789012", region="us-east-1")


def _stack(outdir: str) -> tuple[cdk.App, cdk.Stack]:
    app = cdk.App(outdir=outdir, analytics_reporting=False)
    stack = cdk.Stack(
        app, "Bench", env=ENV, synthesizer=cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False)
    )
    return app, stack


def ours(count: int, outdir: str, full: bool = False) -> cdk.App:
    """The fleet stack of the baseline's resources (recipe, policies, execution role)."""
    app, stack = _stack(outdir)
    for i in range(count):
        AgentFleet(stack, f"Fleet{i}", project=AgentProject.load(EXAMPLE, name=f"agente-{i}"),
                   reconciler=full, build_image=full)
    return app


def ours_full(count: int, outdir: str) -> cdk.App:
    """The whole fleet: its image and the reconciler (function, schedule, dead letters, alarms)."""
    return ours(count, outdir, full=True)


def baseline(count: int, outdir: str) -> cdk.App:
    """The same resources, hand-written: no model, no helpers, literal documents."""
    app, stack = _stack(outdir)
    arn = "arn:aws:{svc}:us-east-1:123456789012:{rest}"
    role = iam.CfnRole(
        stack, "WriterRole",
        assume_role_policy_document={"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]},
    )
    log_group = logs.CfnLogGroup(stack, "WriterLogs", retention_in_days=90)
    function = lambda_.CfnFunction(
        stack, "Writer", role=role.attr_arn, runtime="python3.14", handler="index.handler",
        architectures=["arm64"], timeout=60, memory_size=256,
        code=lambda_.CfnFunction.CodeProperty(s3_bucket="cdk-hnb659fds-assets-123456789012-us-east-1", s3_key="writer.zip"),
        logging_config=lambda_.CfnFunction.LoggingConfigProperty(log_format="JSON", log_group=log_group.ref),
    )
    writer_statements = [{"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Resource": log_group.attr_arn}]
    value = plan_recipe(AgentProject.load(EXAMPLE)).encoded.value
    for i in range(count):
        name = f"agente-{i}"
        recipe_arn = arn.format(svc="ssm", rest=f"parameter/rayito/agents/{name}/recipe")
        image = arn.format(svc="lambda", rest=f"microvm-image:{name}")
        exec_role = iam.CfnRole(
            stack, f"Exec{i}",
            assume_role_policy_document={"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
                "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}, "ArnLike": {"aws:SourceArn": image + "*"}}}]},
            policies=[iam.CfnRole.PolicyProperty(policy_name="logs", policy_document={"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": arn.format(svc="logs", rest=f"log-group:/aws/lambda-microvms/{name}:*")}]})],
        )
        microvm = [
            {"Sid": "ListMicrovms", "Effect": "Allow", "Action": "lambda:ListMicrovms", "Resource": "*"},
            {"Sid": "Microvms", "Effect": "Allow", "Action": ["lambda:RunMicrovm", "lambda:GetMicrovm", "lambda:SuspendMicrovm",
             "lambda:ResumeMicrovm", "lambda:TerminateMicrovm", "lambda:CreateMicrovmAuthToken"], "Resource": "*"},
            {"Sid": "PassNetworkConnectors", "Effect": "Allow", "Action": "lambda:PassNetworkConnector",
             "Resource": "arn:aws:lambda:us-east-1:aws:network-connector:aws-network-connector:*"},
            {"Sid": "PassExecutionRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": exec_role.attr_arn,
             "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}},
            {"Sid": "AgentRecipe", "Effect": "Allow", "Action": ["ssm:GetParameter", "ssm:DeleteParameter"], "Resource": recipe_arn},
        ]
        write = {"Sid": "AgentRecipeWrite", "Effect": "Allow", "Action": "ssm:PutParameter", "Resource": recipe_arn}
        images = {"Sid": "MicrovmImages", "Effect": "Allow", "Action": ["lambda:CreateMicrovmImage", "lambda:UpdateMicrovmImage"],
                  "Resource": [image, image + ":*"]}
        for pid, statements in (("Caller", [*microvm, write]), ("Launcher", microvm), ("Publisher", [images, write])):
            iam.CfnManagedPolicy(stack, f"{pid}{i}", policy_document={"Version": "2012-10-17", "Statement": statements})
        writer_statements.append({"Effect": "Allow", "Action": ["ssm:PutParameter", "ssm:DeleteParameter"], "Resource": recipe_arn})
        cdk.CfnCustomResource(stack, f"Recipe{i}", service_token=function.attr_arn).add_property_override(
            "ParameterName", f"/rayito/agents/{name}/recipe")
        stack.node.find_child(f"Recipe{i}").add_property_override("Value", value)
    iam.CfnPolicy(stack, "WriterPolicy", roles=[role.ref], policy_name="writer",
                  policy_document={"Version": "2012-10-17", "Statement": writer_statements})
    return app


def measure(build: Callable[[int, str], cdk.App], count: int, repeat: int) -> dict[str, float]:
    times, size = [], 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as outdir:
            start = time.perf_counter()
            assembly = build(count, outdir).synth()
            times.append(time.perf_counter() - start)
            path = Path(assembly.get_stack_by_name("Bench").template_full_path)
            size = path.stat().st_size
            resources = len(json.loads(path.read_text())["Resources"])
    return {"fleets": count, "seconds": round(statistics.median(times), 3), "template_bytes": size,
            "resources": resources}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    measure(ours, 1, 1)  # warm up jsii and the imports
    measure(baseline, 1, 1)
    report = {}
    for name, build in (("ours", ours), ("ours full fleet", ours_full), ("baseline", baseline)):
        # A whole fleet is 23 resources: CloudFormation's 500 per stack allow 21.
        sizes = [min(n, 21) for n in args.sizes] if build is ours_full else args.sizes
        rows = [measure(build, n, args.repeat) for n in sizes]
        first, last = rows[0], rows[-1]
        span = last["fleets"] - first["fleets"] or 1
        report[name] = {
            "rows": rows,
            "marginal_seconds_per_fleet": round((last["seconds"] - first["seconds"]) / span, 4),
            "marginal_bytes_per_fleet": round((last["template_bytes"] - first["template_bytes"]) / span),
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{'':16}{'fleets':>7}{'seconds':>10}{'template bytes':>16}{'resources':>11}")
    for name, data in report.items():
        for row in data["rows"]:
            print(f"{name:16}{row['fleets']:>7}{row['seconds']:>10.3f}{row['template_bytes']:>16,}{row['resources']:>11}")
        print(f"{name:16} marginal per fleet: {data['marginal_seconds_per_fleet']*1000:.1f} ms, "
              f"{data['marginal_bytes_per_fleet']:,} bytes")


if __name__ == "__main__":
    main()
