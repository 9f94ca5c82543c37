"""``rayito-constructs``: see what a fleet will be before deploying it.

* ``plan <agent-folder> [flags of rayito agent deploy] [--json]``: the product's project after the
  flags, every resolved option with its origin, the recipe (the product's document, its encoding
  and size), warnings with their codes and a monthly cost estimate; ``plan --recipe FILE``: the
  same for a recipe value as stored (one ``rayito agent deploy`` saved, say).
* ``assembly [cdk.out]``: what a synth made: stacks, resources by type, outputs.

Invalid input exits with status 2 and one line per problem on stderr, nothing on stdout; a
problem with a flag starts with the flag (``--max-vms: 65 is above the limit of 64``). A folder
without ``rayito-agent.toml`` is planned with a warning on stderr. Output into a closed pipe
(``plan ... | head -1``) ends the command quietly, as SIGPIPE ends other Unix tools.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from .model.cost import FLEET_PRICES_CHECKED, RECIPE_PRICES_CHECKED, REGION, estimate
from .model.errors import FleetWarning, Problem, ProjectError
from .model.fleet_file import FLEET_FILE
from .model.overrides import name_what_was_typed, read_overrides
from .model.product import PRODUCT_VERSION
from .model.project import AgentProject
from .model.recipe import RecipePlan, no_reconciler, plan_recipe, reconciler_needs_recipe, reconciler_on
from .verify.parser import add_parser as add_verify_parser

EXIT_INVALID = 2

#: ``rayito agent deploy``'s flags that take one value, with the product's names.
FLAGS = [
    ("--min-vms", "min_vms", "VMs always alive"),
    ("--max-vms", "max_vms", "VMs at most"),
    ("--warm", "warm", "parked (suspended) slots"),
    ("--sessions", "sessions", "shared or dedicated"),
    ("--scale-in-after", "scale_in_after", "idle seconds before a VM above min_vms ends"),
    ("--max-sessions", "max_sessions", "sessions at a time in one VM"),
    ("--queue", "queue", "requests that wait when a VM is full"),
    ("--queue-timeout", "queue_timeout", "seconds a request waits in the queue"),
    ("--idle", "idle", "idle seconds before a VM is suspended"),
    ("--timeout", "timeout", "seconds an invocation may run (the VMs' lifetime follows it)"),
    ("--port", "port", "the agent host's port"),
    ("--memory", "memory", "MiB per VM: 2048, 4096 or 8192"),
    ("--framework", "framework", "detection: the agent framework"),
    ("--language", "language", "detection: python or typescript"),
    ("--entry", "entry", "detection: the entry point"),
    ("--protocol", "protocol", "detection: the app's protocol"),
    ("--model-id", "model_id", "detection: the model"),
    ("--model-provider", "model_provider", "detection: the model gateway's preset"),
    ("--model-base-url", "model_base_url", "detection: the LLM gateway's URL"),
    ("--graph", "graph", "detection: the langgraph.json graph"),
]
#: The flags that may be given several times.
REPEATED_FLAGS = [
    ("--env", "env", "a plain env variable, NAME=VALUE"),
    ("--secret-env", "secret_env", "a secret env variable, NAME=<Secrets Manager id>[#key]"),
    ("--secret-env-from", "secret_env_from", "every key of a secret, <id>[,prefix=P][,keys=A|B]"),
    ("--allow-out", "allow_out", "a host the agent may reach (replaces [network] allow_out)"),
]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2 (:class:`_UsageError`)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {message}\n")
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(SystemExit):
    """A usage error (exit status 2), its line kept for ``verify --json``."""

    def __init__(self, line: str) -> None:
        super().__init__(EXIT_INVALID)
        self.line = line


def _verify_json_of_usage_error(argv: Sequence[str], line: str, out: TextIO) -> None:
    """``verify ... --json`` prints JSON on every outcome, a flag argparse refuses included."""
    from .verify.cli import json_of_bad_input

    rest = list(argv[1:])
    target = next((a for i, a in enumerate(rest) if not a.startswith("-")
                   and (i == 0 or rest[i - 1] not in _VERIFY_VALUED)), None)
    region = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--region"), None)
    region = region or next((a.split("=", 1)[1] for a in rest if a.startswith("--region=")), None)
    json_of_bad_input(target, region, line, out)


def _is_json_flag(arg: str) -> bool:
    """``--json`` as argparse takes it: whole, abbreviated (``--js``), or given a value (a usage
    error of its own, still asking for JSON)."""
    flag = arg.split("=", 1)[0]
    return len(flag) >= 3 and "--json".startswith(flag)


#: verify's flags that take a value (the value is not the target).
_VERIFY_VALUED = {"--region", "--launch-role", "--launch-timeout", "--project", "--fleet"}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rayito-constructs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = commands.add_parser("plan", help="show what the fleet of an agent folder will be")
    plan.add_argument("folder", nargs="?", help="the agent folder (with its rayito-agent.toml)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--recipe", metavar="FILE",
                      help="plan the fleet a stored recipe value describes (as rayito agent deploy saved it; - for stdin)")
    plan.add_argument("--region", help="the region detection names a model gateway for (rayito's --region)")
    # The flags of `rayito agent deploy`, with its names (FLAGS: how each is read).
    for flag, dest, text in FLAGS:
        plan.add_argument(flag, dest=dest, metavar=dest.upper().split("_")[0], help=text)
    for flag, dest, text in REPEATED_FLAGS:
        plan.add_argument(flag, dest=dest, action="append", metavar=dest.upper(), help=text)
    plan.add_argument("--no-save-recipe", dest="save_recipe", action="store_false", default=None,
                      help="save no recipe")
    plan.add_argument("--renew-gateway-keys", dest="renew_gateway_keys", action="store_true", default=None,
                      help="the recipe asks connecting clients to renew the Bedrock gateway keys")

    fetch = commands.add_parser("fetch-wheels", help="download the Lambda functions' product layer wheels and build "
                                "the layer from them (offline synths that build nothing)")
    fetch.add_argument("dest", help="the folder to download into (then: RAYITO_CONSTRUCTS_WHEELHOUSE=<it>)")
    fetch.add_argument("--host", action="store_true", help="also this machine's wheels (to run the functions in tests)")

    assembly = commands.add_parser("assembly", help="summarize a synthesized cloud assembly")
    assembly.add_argument("outdir", nargs="?", default="cdk.out")
    assembly.add_argument("--json", action="store_true")
    add_verify_parser(commands)
    return parser


def plan_document(project: AgentProject) -> dict[str, Any]:
    """The ``plan --json`` object of a project."""
    # An app builds the fleet's image only when given rayd (``-c base_artifact``, AgentImage's
    # ``rayd=``); ``plan`` reads no app's context, so it plans for the default: the fleet runs
    # the image ``rayito agent deploy`` published (the product ignores a folder's Dockerfile).
    recipe = plan_recipe(project)
    warnings = [*project.warnings, *recipe.warnings, *_reconciler_warnings(project, recipe), *_image_warnings(project)]
    kept = reconciler_on(project.fleet.stack.reconciler, recipe)
    cost = estimate(project, has_recipe=recipe.encoded is not None, kept=kept)
    serve = dataclasses.asdict(project.serve)
    serve["idle_seconds"] = serve.pop("idle")
    scaling = dataclasses.asdict(project.scaling)
    scaling.pop("idle")
    return {
        "name": project.name,
        "stack_name": project.stack_name,
        "product": {"package": "rayito", "version": PRODUCT_VERSION, "runtime": project.runtime},
        "serve": {**serve, "max_concurrency_limit": project.max_concurrency_limit},
        "scaling": scaling,
        "scaling_source": project.scaling_source,
        "image": dataclasses.asdict(project.image),
        "env": sorted(project.env),
        "secret_env": dict(sorted(project.secret_env.items())),
        "allow_out": list(project.allow_out),
        "egress_budgets": [
            {"target": b.target, "rate_per_second": round(b.rate_per_second, 6), "burst": b.burst}
            for b in project.egress.budgets
        ],
        "gateways": list(project.gateways),
        "secrets": _secrets(project),
        "sources": dict(sorted(project.sources.items())),
        "recipe": recipe.to_dict(),
        "warnings": [w.to_dict() for w in warnings],
        "cost": cost.to_dict(),
    }


def _reconciler_warnings(project: AgentProject, recipe: RecipePlan) -> list[FleetWarning]:
    """What the synth says of the reconciler (``AgentFleet``): without a recipe it is off by
    default (``no_reconciler``), and ``[stack] reconciler = true`` is refused."""
    reconciler = project.fleet.stack.reconciler
    if reconciler is None:
        told = no_reconciler(recipe)
        return [told] if told is not None else []
    if reconciler and recipe.encoded is None:
        raise ProjectError([Problem("reconciler", f"{FLEET_FILE}: stack.{reconciler_needs_recipe(recipe)}")])
    return []


def _secrets(project: AgentProject) -> dict[str, list[str]]:
    """The Secrets Manager ids the fleet's sessions read (the gateways' keys, ``secret_env``), as
    the product reads them: the stack grants them and never creates them."""
    from .model.secrets import session_secrets

    secrets = session_secrets(project)
    return {"gateways": list(secrets.gateways), "secret_env": list(secrets.secret_env)}


def _image_warnings(project: AgentProject) -> list[FleetWarning]:
    """When the folder's ``[stack]`` has the stack build the image (``base_artifact`` or
    ``base_image``; ``plan`` reads no ``-c`` context), the folder is checked as synth checks it:
    one the product's build refuses is refused here in the same line, and the product's notes on
    what its build context holds (files that usually carry secrets) are warnings with a code."""
    import warnings

    from .image_composition import image_problem

    if project.folder is None or not project.fleet.stack.builds_image:
        return []
    with warnings.catch_warnings(record=True) as noted:
        warnings.simplefilter("always")
        problem = image_problem(project)
    if problem is not None:
        raise ProjectError([Problem("source", problem)])
    # The product collects the context twice (its template, then the files it copies): one note.
    notes = [" ".join(str(w.message).split()) for w in noted if issubclass(w.category, UserWarning)]
    return [FleetWarning("build_context_secrets", f"the product's build: {note}") for note in notes[:1]]


def _render(doc: dict[str, Any], out: TextIO) -> None:
    sources = doc["sources"]
    rows: list[tuple[str, Any, str]] = [("name", doc["name"], sources.get("name", "default"))]
    for section in ("serve", "scaling"):
        for key, value in doc[section].items():
            if key != "max_concurrency_limit":
                rows.append((key, "none" if value is None else value, sources.get(key, "default")))
    rows.append(("memory_mib", doc["image"]["memory_mib"], sources.get("memory_mib", "default")))
    rows.append(("env", ", ".join(doc["env"]) or "-", sources.get("env", "default")))
    secrets = ", ".join(f"{k} <- {v}" for k, v in doc["secret_env"].items())
    rows.append(("secret_env", secrets or "-", sources.get("secret_env", "default")))
    rows.append(("allow_out", ", ".join(doc["allow_out"]) or "-", sources.get("allow_out", "default")))
    for budget in doc["egress_budgets"]:
        rate = f"{budget['rate_per_second'] * 60:g}/minute, burst {budget['burst']}"
        rows.append((f"budget {budget['target']}", rate, "rayito-constructs.toml"))
    rows.append(("gateways", ", ".join(doc["gateways"]) or "-", "project"))
    width = max(len(r[0]) for r in rows)
    vwidth = min(48, max(len(str(r[1])) for r in rows))
    product = doc["product"]
    out.write(f"Fleet {doc['name']} ({product['runtime']} runtime, rayito {product['version']}), "
              f"scaling from: {doc['scaling_source']}\n")
    out.write(f"Stack {doc['stack_name']} (app.py)\n\n")
    out.write(f"  {'option'.ljust(width)}  {'value'.ljust(vwidth)}  from\n")
    for key, value, origin in rows:
        out.write(f"  {key.ljust(width)}  {str(value).ljust(vwidth)}  {origin}\n")
    needed = [*doc["secrets"]["gateways"], *doc["secrets"]["secret_env"]]
    if needed:
        out.write("\nSecrets the sessions read (the stack grants them and never creates them: create each "
                  "named one before the first session, as rayito agent deploy --create-secret would; an ARN "
                  "names one that exists)\n")
        for secret_id in dict.fromkeys(needed):
            out.write(f"  {secret_id}\n")
    recipe = doc["recipe"]
    out.write("\nRecipe\n")
    if not recipe["saved"]:
        out.write(f"  none is saved: {recipe['reason']}\n")
    else:
        version = recipe["image_version"] or "none"
        out.write(
            f"  {recipe['parameter_name']}  SecureString, standard tier, {recipe['schema']}, {recipe['encoding']}, "
            f"{recipe['bytes']} of 4096 bytes ({recipe['json_bytes']} as JSON), image version {version}\n"
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
    if not cost["assumptions"]["kept_by_the_stack"]:
        how = "no reconciler: the stack keeps no VM, clients start them"
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
    if args.recipe is not None:
        project = _from_recipe(args)
    else:
        if args.folder is None:
            raise ProjectError([Problem("folder", "plan: give the agent folder (or --recipe FILE)")])
        raw = {
            key: value
            for key, value in vars(args).items()
            if key not in {"command", "folder", "json", "recipe"} and value is not None
        }
        try:
            project = AgentProject.from_flags(args.folder, flags=read_overrides(raw))
        except ProjectError as exc:
            raise ProjectError(name_what_was_typed(exc.problems, set(raw), context=False)) from None
    for warning in project.warnings:
        if warning.code == "no_project_file":
            sys.stderr.write(f"rayito-constructs: warning: {warning.code}: {warning.message}\n")
    doc = plan_document(project)
    if args.json:
        out.write(json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n")
    else:
        _render(doc, out)
    return 0


def _from_recipe(args: argparse.Namespace) -> AgentProject:
    """The project a stored recipe value describes (the reverse of a deploy)."""
    given = [k for k, v in vars(args).items() if k not in {"command", "json", "recipe"} and v is not None]
    if given:
        raise ProjectError([Problem("recipe", f"plan --recipe: it plans the recipe as stored; {', '.join(given)} "
                                              "cannot be given with it")])
    try:
        value = sys.stdin.read() if args.recipe == "-" else Path(args.recipe).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectError([Problem("recipe", f"plan --recipe: cannot read {args.recipe!r} ({exc.__class__.__name__})")]) from None
    return AgentProject.from_recipe(value.strip())


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
    # verify's checks (their AWS clients, the IAM simulation) load only when verify runs.
    return int(importlib.import_module(".verify.cli", __package__).run(args, out))


def _fetch_wheels(args: argparse.Namespace, out: TextIO) -> int:
    from .wheels import LAMBDA, LayerBuildError, fetch, host_platform

    platforms = [LAMBDA, host_platform()] if args.host else [LAMBDA]
    try:
        fetch(Path(args.dest), platforms)
    except LayerBuildError as exc:
        sys.stderr.write(f"fetch-wheels: {exc}\n")
        return EXIT_INVALID
    out.write(f"fetch-wheels: the product layer's wheels for {', '.join(p.tag for p in platforms)} and the layer "
              f"for {LAMBDA.tag} are in {args.dest}\n")
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    out = out or sys.stdout
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(given)
    except _UsageError as exc:
        if given[:1] == ["verify"] and any(_is_json_flag(a) for a in given[1:]):
            _verify_json_of_usage_error(given, exc.line, out)
        raise
    try:
        if args.command == "plan":
            return _plan(args, out)
        if args.command == "verify":
            return _verify(args, out)
        if args.command == "fetch-wheels":
            return _fetch_wheels(args, out)
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
