"""``rayito-constructs``: see what a fleet will be before deploying it.

* ``plan <agent-folder> [overrides] [--json]``: every resolved option with its origin, the recipe
  parameter (name, encoding, size), warnings with their codes and a monthly cost estimate.
* ``assembly [cdk.out]``: what a synth made: stacks, resources by type, outputs.

Invalid input exits with status 2 and one line per problem on stderr, nothing on stdout; a
problem with a flag starts with the flag (``--max-vms: 65 is above the limit of 64``). A folder
without ``rayito-agent.toml`` is planned with a warning on stderr. Output into a closed pipe
(``plan ... | head -1``) ends the command quietly, as SIGPIPE ends other Unix tools.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from .cost import FLEET_PRICES_CHECKED, RECIPE_PRICES_CHECKED, REGION, estimate
from .errors import ProjectError
from .options import max_concurrency_limit
from .overrides import name_what_was_typed, read_overrides
from .project import AgentProject
from .recipe import plan_recipe
from .verify.parser import add_parser as add_verify_parser

EXIT_INVALID = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {message}\n")
        raise SystemExit(EXIT_INVALID)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rayito-constructs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = commands.add_parser("plan", help="show what the fleet of an agent folder will be")
    plan.add_argument("folder", help="the agent folder (with its rayito-agent.toml)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    flags = [
        ("--name", "name", "fleet name (default: the folder's name)"),
        ("--target", "target", "microvm (default) or agentcore"),
        ("--memory", "memory_mib", "MiB per VM: 512, 1024, 2048, 4096 or 8192"),
        ("--max-sessions", "max_concurrency", "sessions at a time in one VM"),
        ("--queue", "queue_max", "requests that wait when a VM is full"),
        ("--queue-timeout", "queue_timeout_seconds", "how long a request waits (seconds, or 1m)"),
        ("--min-vms", "min_vms", "VMs always alive"),
        ("--max-vms", "max_vms", "VMs at most"),
        ("--warm", "warm_vms", "parked (suspended) slots"),
        ("--sessions", "sessions", "shared or dedicated"),
        ("--scale-in-after", "scale_in_after_seconds", "idle seconds before a VM above min_vms ends"),
        ("--idle", "idle", "idle time before a VM is suspended (seconds, 10m, or none)"),
    ]
    for flag, dest, text in flags:
        plan.add_argument(flag, dest=dest, metavar=dest.upper().split("_")[0], help=text)
    plan.add_argument("--env", action="append", metavar="NAME=VALUE", help="a plain env variable")
    plan.add_argument(
        "--secret-env", action="append", metavar="NAME=SECRET", help="a secret env variable (only its name is kept)"
    )
    plan.add_argument("--allow-out", action="append", metavar="HOST", help="a host the agent may reach")
    plan.add_argument("--no-save-recipe", dest="save_recipe", action="store_false", default=None,
                      help="save no recipe")

    assembly = commands.add_parser("assembly", help="summarize a synthesized cloud assembly")
    assembly.add_argument("outdir", nargs="?", default="cdk.out")
    assembly.add_argument("--json", action="store_true")
    add_verify_parser(commands)
    return parser


def plan_document(project: AgentProject) -> dict[str, Any]:
    """The ``plan --json`` object of a project."""
    recipe = plan_recipe(project)
    cost = estimate(project, has_recipe=recipe.encoded is not None)
    warnings = [w.to_dict() for w in (*project.warnings, *recipe.warnings)]
    return {
        "name": project.name,
        "stack_name": project.stack_name,
        "target": project.target,
        "serve": project.serve.model_dump(mode="json") if project.has_fleet else None,
        "scaling": _scaling(project) if project.has_fleet else None,
        "scaling_source": project.scaling_source,
        "image": {
            "memory_mib": project.image.memory_mib,
            "architecture": project.image.architecture,
            "version": project.image.version,
            "max_concurrency_limit": max_concurrency_limit(project.image.memory_mib),
        },
        "env": sorted(project.env),
        "secret_env": list(project.secret_env),
        "egress_allow": list(project.egress.allow),
        "egress_budgets": [
            {"target": b.target, "rate_per_second": round(b.rate_per_second, 6), "burst": b.burst}
            for b in project.egress.budgets
        ],
        "gateways": [g.name for g in project.gateways],
        "sources": dict(sorted(project.sources.items())),
        "recipe": recipe.to_dict(),
        "warnings": warnings,
        "cost": cost.to_dict(),
    }


def _scaling(project: AgentProject) -> dict[str, Any]:
    scaling = project.scaling.model_dump(mode="json")
    scaling["idle_seconds"] = scaling.pop("idle")
    return scaling


def _render(doc: dict[str, Any], out: TextIO) -> None:
    sources = doc["sources"]
    rows: list[tuple[str, Any, str]] = [("name", doc["name"], sources.get("name", "default"))]
    rows.append(("target", doc["target"], sources.get("target", "default")))
    for section in ("serve", "scaling"):
        for key, value in (doc[section] or {}).items():
            rows.append((key, "none" if value is None else value, sources.get(key.replace("idle_seconds", "idle"), "default")))
    rows.append(("memory_mib", doc["image"]["memory_mib"], sources.get("memory_mib", "default")))
    rows.append(("architecture", doc["image"]["architecture"], sources.get("architecture", "default")))
    rows.append(("env", ", ".join(doc["env"]) or "-", sources.get("env", "default")))
    rows.append(("secret_env", ", ".join(doc["secret_env"]) or "-", sources.get("secret_env", "default")))
    rows.append(("egress allow", ", ".join(doc["egress_allow"]) or "-", sources.get("allow_out", "default")))
    for budget in doc["egress_budgets"]:
        rate = f"{budget['rate_per_second'] * 60:g}/minute, burst {budget['burst']}"
        rows.append((f"budget {budget['target']}", rate, sources.get("budgets", "default")))
    rows.append(("gateways", ", ".join(doc["gateways"]) or "-", sources.get("gateways", "default")))
    width = max(len(r[0]) for r in rows)
    vwidth = min(48, max(len(str(r[1])) for r in rows))
    out.write(f"Fleet {doc['name']} ({doc['target']}), scaling from: {doc['scaling_source']}\n")
    out.write(f"Stack {doc['stack_name']} (app.py)\n\n")
    out.write(f"  {'option'.ljust(width)}  {'value'.ljust(vwidth)}  from\n")
    for key, value, origin in rows:
        out.write(f"  {key.ljust(width)}  {str(value).ljust(vwidth)}  {origin}\n")
    recipe = doc["recipe"]
    out.write("\nRecipe\n")
    if recipe is None:
        out.write("  none is saved (see warnings)\n")
    else:
        out.write(
            f"  {recipe['parameter_name']}  SecureString, standard tier, {recipe['encoding']}, "
            f"{recipe['bytes']} of 4096 bytes\n"
        )
    out.write("\nWarnings\n")
    for warning in doc["warnings"] or [{"code": "-", "message": "none"}]:
        out.write(f"  {warning['code']}: {warning['message']}\n")
    _render_cost(doc["cost"], out)


def _usd(amount: Optional[float]) -> str:
    return "not priced" if amount is None else f"${amount:,.2f}"


def _render_cost(cost: dict[str, Any], out: TextIO) -> None:
    out.write(
        f"\nMonthly cost, list prices {REGION} (fleet checked {FLEET_PRICES_CHECKED}, recipe "
        f"checked {RECIPE_PRICES_CHECKED}); assumptions: docs/options.md#cost\n"
    )
    if cost["priced"]:
        out.write(f"  running VM        ${cost['vm_hour_usd']:.3f}/hour each ({cost['memory_mib']} MiB)\n")
        out.write(f"  suspended VM      ${cost['suspended_vm_day_usd']:.3f}/day each (snapshot storage only)\n")
    else:
        out.write(
            f"  running VM        not priced: the page prices 2048 and 4096 MiB, not {cost['memory_mib']}\n"
        )
    idle = cost["assumptions"].get("idle_seconds")
    how = (
        f"{cost['base_vm_hours']:.1f} VM-hours running, {cost['base_suspended_vm_days']:.1f} VM-days suspended (idle {idle} s)"
        if idle
        else f"{cost['base_vm_hours']:.1f} VM-hours running, no idle suspension"
    )
    out.write(f"  base VMs          {_usd(cost['base_vms_monthly_usd'])}  ({how})\n")
    if idle:
        out.write(f"    without idle    {_usd(cost['base_vms_without_idle_monthly_usd'])}\n")
    out.write(f"  parked slots      {_usd(cost['warm_slots_monthly_usd'])}  (snapshot storage only)\n")
    out.write(
        f"  recipe            ${cost['recipe_parameter_monthly_usd'] + cost['recipe_kms_monthly_usd']:.2f}  "
        f"(standard parameter free; ~{cost['recipe_kms_requests_per_month']} KMS requests, "
        "20,000 free a month)\n"
    )
    out.write(f"  idle fleet        {_usd(cost['baseline_monthly_usd'])}  (no traffic all month)\n")
    out.write(f"  all max_vms busy  {_usd(cost['peak_monthly_usd'])}  (every VM running all month)\n")


def _plan(args: argparse.Namespace, out: TextIO) -> int:
    raw = {
        key: value
        for key, value in vars(args).items()
        if key not in {"command", "folder", "json"} and value is not None
    }
    try:
        project = AgentProject.load(args.folder, **read_overrides(raw))
    except ProjectError as exc:
        raise ProjectError(name_what_was_typed(exc.problems, set(raw), context=False)) from None
    for warning in project.warnings:
        if warning.code == "no_project_file":
            sys.stderr.write(f"rayito-constructs: warning: {warning.code}: {warning.message}\n")
    doc = plan_document(project)
    if args.json:
        out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    else:
        _render(doc, out)
    return 0


def assembly_summary(outdir: Path) -> dict[str, Any]:
    """Stacks of a cloud assembly with their resource counts by type and their outputs."""
    manifest = json.loads((outdir / "manifest.json").read_text())
    stacks = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        template_file = outdir / artifact["properties"]["templateFile"]
        template = json.loads(template_file.read_text())
        counts: dict[str, int] = {}
        for resource in template.get("Resources", {}).values():
            counts[resource["Type"]] = counts.get(resource["Type"], 0) + 1
        stacks[artifact_id] = {
            "template": str(template_file),
            "bytes": template_file.stat().st_size,
            "resources": dict(sorted(counts.items())),
            "outputs": sorted(template.get("Outputs", {})),
        }
    return stacks


def _assembly(args: argparse.Namespace, out: TextIO) -> int:
    outdir = Path(args.outdir)
    if not (outdir / "manifest.json").is_file():
        sys.stderr.write(f"assembly: {str(outdir)!r} has no manifest.json; run the synth first\n")
        return EXIT_INVALID
    stacks = assembly_summary(outdir)
    if args.json:
        out.write(json.dumps(stacks, indent=2) + "\n")
        return 0
    for name, stack in stacks.items():
        total = sum(stack["resources"].values())
        out.write(f"{name}: {total} resources, {stack['bytes']} bytes ({stack['template']})\n")
        for kind, count in stack["resources"].items():
            out.write(f"  {count:3d}  {kind}\n")
        if stack["outputs"]:
            out.write(f"  outputs: {', '.join(stack['outputs'])}\n")
    return 0


def _verify(args: argparse.Namespace, out: TextIO) -> int:
    # verify's checks need boto3 and AWS credentials; plan and assembly never load them.
    try:
        verify_cli = importlib.import_module(".verify.cli", __package__)
    except ModuleNotFoundError as exc:
        if exc.name not in {"boto3", "botocore"}:
            raise
        sys.stderr.write(
            f"verify: needs {exc.name}, which this environment lacks: pip install 'boto3>=1.44' "
            "(installed with rayito-constructs; `make synth` alone installs only what a synth needs)\n"
        )
        return EXIT_INVALID
    return int(verify_cli.run(args, out))


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        if args.command == "plan":
            return _plan(args, out)
        if args.command == "verify":
            return _verify(args, out)
        return _assembly(args, out)
    except ProjectError as exc:
        for problem in exc.problems:
            sys.stderr.write(f"{problem.message}\n")
        return EXIT_INVALID


def run() -> None:
    """The ``rayito-constructs`` command: :func:`main`, quiet on a closed pipe.

    Writing into a pipe whose reader has gone (``plan ... | head -1``) ends the process as
    SIGPIPE ends ``cat``: no traceback, exit status 141 where the signal cannot be restored.
    """
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        code = 128 + 2
    except BrokenPipeError:
        # Python may still flush at exit: point stdout at /dev/null so that it cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 128 + 13
    raise SystemExit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
