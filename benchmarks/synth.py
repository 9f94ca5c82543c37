"""Synth time: the example as a whole process, first and warm, against the peer CDK libraries;
then 1, 10 and 50 fleets in one app, against a hand-written baseline.

    .venv/bin/python -m benchmarks.synth [--repeat 3] [--sizes 1 10 50] [--json]
        [--before FOLDER] [--peers-python PYTHON] [--no-fleets] [--cdk-validation default|on|off]

**Whole process** (what ``make synth`` waits for, without the CDK CLI's own Node start): ``python
app.py`` in a process of its own, as ``npx cdk synth`` runs it (``CDK_OUTDIR``, and cdk.json's
context as ``CDK_CONTEXT_JSON``), the example with the product (``rayito``) as a dependency.
*First* is a fresh interpreter with a cold cache of this library's own asset builds (a new, empty
``RAYITO_CONSTRUCTS_CACHE``: the product layer is the one ``fetch-wheels`` built in the wheelhouse,
as ``make synth`` sets it up, or is built into the cache from a wheelhouse without it); *warm* is
the next run with that cache. Each is repeated ``--repeat`` times (a new cache each time); the medians of
wall time and of CPU time (the process and its children, jsii's Node, also when jsii leaves Node
to exit on its own: this process adopts and reaps it) are reported.

* ``--before FOLDER``: the same for another checkout's ``app.py`` (``git archive <commit> | tar -x
  -C FOLDER``), with this interpreter: the synth time before a change.
* ``--cdk-validation``: the CDK's built-in CloudFormation validation (cfn-lint in WebAssembly,
  about 5 CPU-s of any synth process that runs it) as each app ships it (``default``: app.py runs
  it only with ``CDK_VALIDATION=true``, the peers and ``--before`` always), or ``on``/``off`` for
  every app alike.
* ``--peers-python PYTHON``: an interpreter with the peer libraries installed (``lambda-microvm-cdk``,
  ``cdk-github-microvm-runners``; docs/performance.md says how): their apps in
  ``benchmarks/peer_apps/`` as whole processes, first and warm alike (they keep no cache of their own).

**Fleets in one app** (one process, after a warm-up, so jsii's start is not counted): "ours" builds
each fleet with ``AgentFleet(reconciler=False, build_image=False)`` (the product's loader, the
recipe, policies, grants, cdk-nag acknowledgements); "ours full fleet" adds the reconciler;
"baseline" writes the same CloudFormation resources as "ours" by hand with L1 constructs and literal
policy documents. Each fleet is a copy of the example (made in a temporary folder, never in
``examples/``) with its own ``name`` and no egress budgets, so the variants have the same resources.
Reported: the median wall time and CPU time (this process and jsii's Node, read from /proc) of
construction plus ``app.synth()``, the template size, and the marginal cost per fleet (the slope
between the smallest and the largest size).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

from rayito_constructs import AgentFleet, AgentProject
from rayito_constructs.model.fleet_file import FLEET_FILE
from rayito_constructs.model.project import PROJECT_FILE
from rayito_constructs.model.recipe import plan_recipe

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "mi-agente"
PEER_APPS = Path(__file__).resolve().parent / "peer_apps"
ENV = cdk.Environment(account="123456789012", region="us-east-1")
_SCRATCH = Path(tempfile.mkdtemp(prefix="rayito-bench-"))
atexit.register(shutil.rmtree, _SCRATCH, True)


# ------------------------------------------------------------------ whole processes


def _context(root: Path) -> str:
    """cdk.json's context of a checkout, as ``npx cdk synth`` hands it to the app."""
    return json.dumps(json.loads((root / "cdk.json").read_text())["context"])


def _become_subreaper() -> None:
    """Make this process adopt the orphans of the synths it runs (Linux). jsii stops its Node
    process by waiting 5 s for it to exit, then terminates it without waiting: on a loaded machine
    Node is orphaned, and its CPU time (most of a synth's) was never counted."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _children() -> set[int]:
    """This process's children (Linux; elsewhere none are seen)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            found.update(int(c) for c in (task / "children").read_text().split())
    return found


def _reap_orphans(own: set[int], grace_seconds: float = 10.0) -> float:
    """Reap the orphans the last synth left to this process (its children but ``own``: this
    process's own jsii Node), killing those still alive after ``grace_seconds``; their CPU seconds."""
    total, deadline = 0.0, time.monotonic() + grace_seconds
    while True:
        orphans = _children() - own
        if not orphans:
            return total
        for pid in orphans:
            with contextlib.suppress(ChildProcessError):
                done, _, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    total += usage.ru_utime + usage.ru_stime
                elif time.monotonic() >= deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def run_once(command: list[str], cwd: Path, env: dict[str, str]) -> dict[str, float]:
    """One synth process: its wall time and CPU time (its own, its waited children's and that
    of the children it left behind: jsii's Node), and the template bytes it wrote. Fails loudly
    when the synth fails."""
    _become_subreaper()
    own = _children()
    outdir = Path(tempfile.mkdtemp(dir=_SCRATCH, prefix="out-"))
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env={**env, "CDK_OUTDIR": str(outdir)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read() if process.stdout else b""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    orphans = _reap_orphans(own)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"synth failed ({' '.join(command)}):\n{output.decode(errors='replace')[-3000:]}")
    templates = list(outdir.glob("*.template.json"))
    size = sum(t.stat().st_size for t in templates)
    resources = sum(len(json.loads(t.read_text()).get("Resources", {})) for t in templates)
    shutil.rmtree(outdir, ignore_errors=True)
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime + orphans, "template_bytes": size,
            "resources": resources}


def whole_process(command: list[str], cwd: Path, env: dict[str, str], repeat: int, *,
                  own_cache: bool) -> dict[str, Any]:
    """First (cold cache of this library's asset builds) and warm runs, ``repeat`` times each."""
    first, warm = [], []
    for _ in range(repeat):
        run_env = dict(env)
        if own_cache:
            run_env["RAYITO_CONSTRUCTS_CACHE"] = tempfile.mkdtemp(dir=_SCRATCH, prefix="cache-")
        first.append(run_once(command, cwd, run_env))
        warm.append(run_once(command, cwd, run_env))

    def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
        return {"seconds": round(statistics.median(r["seconds"] for r in runs), 2),
                "cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in runs), 2),
                "all_seconds": [round(r["seconds"], 2) for r in runs],
                "template_bytes": runs[-1]["template_bytes"], "resources": runs[-1]["resources"]}

    return {"first": summary(first), "warm": summary(warm)}


#: ``--cdk-validation``: the ``CDK_VALIDATION`` every measured process gets. ``default``: none, so
#: each app runs as shipped (app.py without the CDK's built-in validation, the peers with it);
#: ``on`` and ``off`` measure every app alike, with it and without it.
CDK_VALIDATION: dict[str, Optional[str]] = {"default": None, "on": "true", "off": "false"}


def _base_env(validation: str = "default") -> dict[str, str]:
    """The environment ``make synth`` gives the app (Makefile): no bytecode written, Node 20's
    banner off, the product layer's wheelhouse; the account and region of ``cdk synth``; the
    CDK's built-in validation as ``validation`` (a key of :data:`CDK_VALIDATION`) says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDK_")}
    env.update(PYTHONDONTWRITEBYTECODE="1", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
               CDK_DEFAULT_ACCOUNT="123456789012", CDK_DEFAULT_REGION="us-east-1")
    value = CDK_VALIDATION[validation]
    if value is not None:
        env["CDK_VALIDATION"] = value
    env.setdefault("RAYITO_CONSTRUCTS_WHEELHOUSE", str(ROOT / ".make" / "wheels"))
    return env


def peer_source() -> Path:
    """The example's files with a Dockerfile: what ``lambda-microvm-cdk`` zips as its image source."""
    folder = _SCRATCH / "peer-source"
    if not folder.exists():
        shutil.copytree(SOURCE, folder)
        (folder / "Dockerfile").write_text("FROM scratch\nCOPY . /app\n")
    return folder


PEERS: dict[str, tuple[str, str, Callable[[], list[str]]]] = {
    "lambda-microvm-cdk": ("lambda_microvm_cdk", "lambda_microvm_cdk_app.py", lambda: [str(peer_source())]),
    "cdk-github-microvm-runners": ("cdk_github_microvm_runners", "github_microvm_runners_app.py", lambda: []),
}


def processes(repeat: int, before: Optional[Path], peers_python: Optional[str],
              validation: str = "default") -> dict[str, Any]:
    env = _base_env(validation)
    report: dict[str, Any] = {}
    ours_env = {**env, "CDK_CONTEXT_JSON": _context(ROOT)}
    report["ours (example, app.py)"] = whole_process([sys.executable, "app.py"], ROOT, ours_env, repeat, own_cache=True)
    if before is not None:
        before_env = {**env, "CDK_CONTEXT_JSON": _context(before)}
        report[f"before ({before.name}, app.py)"] = whole_process([sys.executable, "app.py"], before, before_env,
                                                                  repeat, own_cache=True)
    for peer, (module, app, args) in PEERS.items():
        if peers_python is None:
            report[peer] = {"not_measured": "no --peers-python given"}
            continue
        found = subprocess.run([peers_python, "-c", f"import {module}"], capture_output=True, env=env)
        if found.returncode != 0:
            report[peer] = {"not_measured": f"{peers_python} cannot import {module}"}
            continue
        report[peer] = whole_process([peers_python, str(PEER_APPS / app), *args()], _SCRATCH,
                                     {**env, "CDK_CONTEXT_JSON": _context(ROOT)}, repeat, own_cache=False)
    return report


# ------------------------------------------------------------------ fleets in one app


def fleet_folder(index: int) -> Path:
    """A copy of the example named ``agente-<index>``, without its egress budgets (the baseline has
    no budget table), in a temporary folder: the product's ``name`` is in rayito-agent.toml."""
    name = f"agente-{index}"
    folder = _SCRATCH / "fleets" / name
    if not folder.exists():
        shutil.copytree(SOURCE, folder)
        text = (folder / PROJECT_FILE).read_text()
        (folder / PROJECT_FILE).write_text(re.sub(r'(?m)^name = "mi-agente"$', f'name = "{name}"', text, count=1))
        (folder / FLEET_FILE).unlink(missing_ok=True)
    return folder


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
        AgentFleet(stack, f"Fleet{i}", project=AgentProject.load(fleet_folder(i)),
                   reconciler=full, build_image=False)
    return app


def ours_full(count: int, outdir: str) -> cdk.App:
    """The fleet as app.py makes it without a rayd: with its reconciler (function, schedule, dead
    letters, alarms), no image built."""
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
    encoded = plan_recipe(AgentProject.load(fleet_folder(0))).encoded
    value = encoded.value if encoded is not None else ""
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


def _tree_cpu() -> float:
    """CPU seconds of this process and its live descendants (jsii's Node processes), from /proc
    (Linux; elsewhere this process's own)."""
    own = time.process_time()
    total, pending = 0.0, [os.getpid()]
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    while pending:
        pid = pending.pop()
        try:
            children = []
            for task in Path(f"/proc/{pid}/task").iterdir():
                children += (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            pending.append(int(child))
    return own + total


def measure(build: Callable[[int, str], cdk.App], count: int, repeat: int) -> dict[str, float]:
    times, cpus, size, resources = [], [], 0, 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as outdir:
            start, cpu = time.perf_counter(), _tree_cpu()
            assembly = build(count, outdir).synth()
            times.append(time.perf_counter() - start)
            cpus.append(_tree_cpu() - cpu)
            path = Path(assembly.get_stack_by_name("Bench").template_full_path)
            size = path.stat().st_size
            resources = len(json.loads(path.read_text())["Resources"])
    return {"fleets": count, "seconds": round(statistics.median(times), 3),
            "cpu_seconds": round(statistics.median(cpus), 3), "template_bytes": size, "resources": resources}


def fleets(sizes: list[int], repeat: int) -> dict[str, Any]:
    measure(ours, 1, 1)  # warm up jsii and the imports
    measure(baseline, 1, 1)
    report = {}
    for name, build in (("ours", ours), ("ours full fleet", ours_full), ("baseline", baseline)):
        # A fleet with its reconciler is 31 resources: CloudFormation's 500 per stack allow 15.
        counts = [min(n, 15) for n in sizes] if build is ours_full else sizes
        rows = [measure(build, n, repeat) for n in counts]
        first, last = rows[0], rows[-1]
        span = last["fleets"] - first["fleets"] or 1
        report[name] = {
            "rows": rows,
            "marginal_seconds_per_fleet": round((last["seconds"] - first["seconds"]) / span, 4),
            "marginal_cpu_seconds_per_fleet": round((last["cpu_seconds"] - first["cpu_seconds"]) / span, 4),
            "marginal_bytes_per_fleet": round((last["template_bytes"] - first["template_bytes"]) / span),
        }
    return report


# ------------------------------------------------------------------ report


def _print(report: dict[str, Any]) -> None:
    print(f"the CDK's built-in validation: {report.get('cdk_validation', 'default')}")
    print(f"{'whole process':36}{'first s':>9}{'cpu s':>8}{'warm s':>9}{'cpu s':>8}{'template bytes':>16}{'resources':>11}")
    for name, data in report["processes"].items():
        if "not_measured" in data:
            print(f"{name:36}not measured: {data['not_measured']}")
            continue
        first, warm = data["first"], data["warm"]
        print(f"{name:36}{first['seconds']:>9.2f}{first['cpu_seconds']:>8.2f}{warm['seconds']:>9.2f}"
              f"{warm['cpu_seconds']:>8.2f}{warm['template_bytes']:>16,}{warm['resources']:>11}")
    for name, ratio in report.get("ratios", {}).items():
        print(f"  {name}: {ratio}")
    if "fleets" not in report:
        return
    print(f"\n{'fleets in one app':18}{'fleets':>7}{'seconds':>10}{'cpu s':>8}{'template bytes':>16}{'resources':>11}")
    for name, data in report["fleets"].items():
        for row in data["rows"]:
            print(f"{name:18}{row['fleets']:>7}{row['seconds']:>10.3f}{row['cpu_seconds']:>8.2f}"
                  f"{row['template_bytes']:>16,}{row['resources']:>11}")
        print(f"{name:18} marginal per fleet: {data['marginal_seconds_per_fleet'] * 1000:.1f} ms, "
              f"{data['marginal_cpu_seconds_per_fleet'] * 1000:.1f} CPU-ms, "
              f"{data['marginal_bytes_per_fleet']:,} bytes")


def ratios(measured: dict[str, Any]) -> dict[str, float]:
    """Ours over each other row, first and warm, in CPU seconds (the goal: at most 1.1). CPU, not
    wall: the machine is shared, and the same command's wall time varies threefold under load."""
    ours_row = measured["ours (example, app.py)"]
    out = {}
    for name, data in measured.items():
        if data is ours_row or "not_measured" in data:
            continue
        for kind in ("first", "warm"):
            out[f"ours / {name}, {kind}, CPU"] = round(ours_row[kind]["cpu_seconds"] / data[kind]["cpu_seconds"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--before", type=Path, help="another checkout whose app.py is measured the same way")
    parser.add_argument("--peers-python", help="an interpreter with the peer libraries installed")
    parser.add_argument("--no-fleets", action="store_true", help="only the whole processes")
    parser.add_argument("--cdk-validation", choices=sorted(CDK_VALIDATION), default="default",
                        help="the CDK's built-in validation of the whole processes: as each app ships it (default), "
                             "or on or off for all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report: dict[str, Any] = {"cdk_validation": args.cdk_validation,
                              "processes": processes(args.repeat, args.before, args.peers_python, args.cdk_validation)}
    report["ratios"] = ratios(report["processes"])
    if not args.no_fleets:
        report["fleets"] = fleets(args.sizes, args.repeat)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)


if __name__ == "__main__":
    main()
