"""Recipe: the SecureString at ``/rayito/agents/<name>/recipe`` is there, is a SecureString under
the right key, decodes as the product's client decodes it (``rayito``'s ``decode_recipe``), is the fleet's, equals what
the stack meant to write, and the launcher's policy may read it (simulated). Or it is reported as
not saved, with why (the stack saves none, or the writer's error from its log).

"What the stack meant to write" is, in order: a SHA-256 the stack exposes (an output or a property
of the recipe resource), the recipe resource's ``Value`` in the deployed template (its intrinsic
functions resolved), or, with ``--project FOLDER``, the recipe that folder plans today.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

from ..model.errors import ProjectError
from ..model.product import canonical_json, encoding_of
from ..model.project import AgentProject
from ..model.recipe import plan_recipe
from .aws import AwsError, unable
from .context import Context, RecipeRead, recipe_properties
from .iam import Probe, simulate
from .report import Finding, fail, ok, warn

DEFAULT_KEY = "alias/aws/ssm"
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_HASH_KEY = re.compile(r"(sha256|hash|digest)", re.IGNORECASE)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def expected_hash(ctx: Context, props: Optional[dict[str, Any]]) -> tuple[Optional[str], str]:
    """(SHA-256 of what the stack meant to write, where it comes from), or (None, why not). The
    hash is of the stored value, or of the recipe document the stack shipped (canonical JSON)."""
    for key, value in ctx.fleet.stack.outputs.items():
        if "recipe" in key.lower() and _HASH_KEY.search(key) and _HEX64.match(str(value).lower()):
            return str(value).lower(), f"stack output {key}"
    for key, value in (props or {}).items():
        if _HASH_KEY.search(key) and isinstance(value, str) and _HEX64.match(value.lower()):
            return value.lower(), f"recipe resource property {key}"
    value = (props or {}).get("Value")
    if isinstance(value, str):
        return sha256(value), "the recipe resource's Value in the deployed template"
    if value is not None:
        return None, "the template's recipe value depends on something verify cannot resolve"
    return None, "the stack exposes no recipe hash"


def _project_doc(folder: Path, deployed: dict[str, Any]) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The recipe the project folder plans, with the deployed image version when the project's
    own is unset (a stack that builds its image fills it in at deploy)."""
    try:
        project = AgentProject.load(folder)
    except ProjectError as exc:
        return None, "; ".join(p.message for p in exc.problems)
    except (OSError, ValueError) as exc:
        return None, str(exc)
    deployed_version = (deployed.get("image") or {}).get("version")
    doc = plan_recipe(project, deployed_version if isinstance(deployed_version, str) else None).document or {}
    return json.loads(json.dumps(doc)), None


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Key paths where two documents differ (never the values: they may be private)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return out
    return [] if a == b else [path or "(document)"]


#: What the writer answers when it saved nothing, and what to do about it (product page codes).
NOT_SAVED_FIXES = {
    "recipe_too_large": "shorten instructions or env until the compressed recipe fits 4,096 bytes, then deploy again",
    "recipe_access_denied": "let the recipe writer's role put the parameter (an SCP, a boundary or the key's policy "
                            "may deny it), then deploy again",
}
SAVED_OUTCOMES = ("saved", "kept")


def _deploy_outcome(ctx: Context) -> Optional[tuple[str, str]]:
    """What the last deploy did with the recipe, when the stack says (``RecipeOutcome``,
    ``RecipeReason`` outputs): (outcome, reason)."""
    outcome = ctx.fleet.output("RecipeOutcome")
    if not outcome:
        return None
    return outcome, ctx.fleet.output("RecipeReason") or ""


def check(ctx: Context) -> list[Finding]:
    name = ctx.recipe_parameter_name()
    if name is None:
        return [_not_saved(ctx)]
    outcome = _deploy_outcome(ctx)
    if outcome is not None and outcome[0] not in SAVED_OUTCOMES:
        code, reason = outcome
        return [fail("recipe", f"the last deploy did not save {name}: {code}" + (f" ({reason})" if reason else ""),
                     NOT_SAVED_FIXES.get(code, "read the recipe writer's log, fix the cause and deploy again "
                                             "(recipe_failure='fail' makes such a deploy roll back)"),
                     parameter=name, outcome=code, reason=reason)]
    try:
        read = ctx.recipe()
    except AwsError as error:
        if error.kind == "not_found":
            why = _writer_error(ctx)
            return [fail("recipe", f"{name} is not in Parameter Store although the stack writes it"
                         + (f": the writer said {why}" if why else " (deleted since the deploy?)"),
                         "deploy the stack again (after Parameter Store frees a deleted name, about 30 s)",
                         parameter=name, writer_error=why)]
        return [unable("recipe", error, f"read {name} (ssm:GetParameter with decryption)")]
    assert read is not None
    findings = [_content(ctx, read)]
    findings.append(_key(ctx, read))
    findings.append(_launcher_can_read(ctx, read))
    return findings


def _not_saved(ctx: Context) -> Finding:
    outcome = {k: v for k, v in ctx.fleet.stack.outputs.items() if "recipe" in k.lower() and k != "RecipeParameterName"}
    said = ctx.fleet.stack.outputs.get("RecipeParameterName")
    why = "; ".join(f"{k}: {v}" for k, v in outcome.items()) or said or \
        "the stack has no recipe resource (save_recipe off, a fleet named '.' or '..', or recipe_too_large at synth)"
    return warn("recipe", f"not saved: {why}", "set save_recipe = true (and keep the recipe under 4,096 bytes "
                "compressed) to let clients connect by name; without it they need project=", outputs=outcome)


def _writer_error(ctx: Context) -> Optional[str]:
    """The last error the recipe writer logged (it logs the error code, never the value)."""
    function = ctx.fleet.recipe_writer_function
    group = None
    if function:
        try:
            config = ctx.clients.call("lambda", "get_function_configuration", FunctionName=function)
            group = (config.get("LoggingConfig") or {}).get("LogGroup") or f"/aws/lambda/{function}"
        except AwsError:
            group = None
    logs = ctx.fleet.stack_resource("AWS::Logs::LogGroup", "RecipeWriter")
    groups = [g for g in (group, logs.physical_id if logs else None) if g]
    for name in dict.fromkeys(groups):
        try:
            events = [e for page in ctx.clients.pages("logs", "filter_log_events", logGroupName=name,
                                                       filterPattern='?"error" ?"Outcome"', limit_pages=5)
                      for e in page.get("events", [])]
        except AwsError:
            continue
        for event in sorted(events, key=lambda e: e.get("timestamp", 0), reverse=True):
            try:
                line = json.loads(event.get("message", ""))
            except ValueError:
                continue
            if isinstance(line, dict):
                inner = line.get("message") if isinstance(line.get("message"), dict) else line
                if not isinstance(inner, dict):
                    continue
                if inner.get("error"):
                    return str(inner["error"])
                if inner.get("Outcome") and inner["Outcome"] not in (*SAVED_OUTCOMES, "deleted", "skipped"):
                    return f"{inner['Outcome']}: {inner.get('Reason', '')}".strip(": ")
                if inner.get("Outcome") in SAVED_OUTCOMES:
                    return None  # the newest line says it was saved: deleted since
    return None


def _content(ctx: Context, read: RecipeRead) -> Finding:
    data: dict[str, Any] = {"parameter": read.name, "type": read.type, "bytes": len(read.value or ""),
                            "sha256": sha256(read.value or "")}
    if read.type != "SecureString":
        return fail("recipe", f"{read.name} is a {read.type}, not a SecureString",
                    "delete it and deploy the stack again (the writer makes a SecureString)", **data)
    if read.doc is None:
        return fail("recipe", f"{read.name} does not decode: {read.decode_error}",
                    "deploy the stack again to rewrite it (recipe_unreadable for every client until then)", **data)
    if ctx.fleet_name and read.doc.get("name") not in (None, ctx.fleet_name):
        return fail("recipe", f"{read.name} is the recipe of {read.doc.get('name')!r}, not {ctx.fleet_name!r}",
                    "deploy the stack again to rewrite it", **data)
    try:
        props = recipe_properties(ctx)
    except AwsError as error:
        props, data["template_error"] = None, error.code
    expected, source = expected_hash(ctx, props)
    data["expected_from"] = source
    encoding = encoding_of(read.value or "") or "unknown encoding"  # it decoded: json or gzip+base64
    what = f"{read.name} decodes ({encoding}, {len(read.value or '')} bytes)"
    version = (props or {}).get("ImageVersion")
    stored_version = (read.doc.get("image") or {}).get("version")
    if isinstance(version, str) and version and stored_version != version:
        data["image_version"] = {"stack": version, "stored": stored_version}
        return fail("recipe", f"{what} but records image version {stored_version}, the stack deployed {version}",
                    "deploy the stack again: it rewrites the recipe with the version it built", **data)
    if expected is not None:
        data["expected_sha256"] = expected
        if not _same_content(expected, read):
            return fail("recipe", f"{what} but differs from what the stack wrote ({source})",
                        "deploy the stack again: it rewrites the recipe (was it changed by hand?)", **data)
        return ok("recipe", f"{what} and equals what the stack wrote ({source})", **data)
    if ctx.project is not None:
        planned, problem = _project_doc(ctx.project, read.doc)
        if planned is None:
            return warn("recipe", f"{what}; the project {ctx.project} could not be read: {problem}",
                        "pass the folder the stack was deployed from", **data)
        diff = _differences(planned, read.doc)
        data["differences"] = diff
        if diff:
            return fail("recipe", f"{what} but differs from the project's in {', '.join(diff[:5])}",
                        "deploy the stack again from this project folder", **data)
        return ok("recipe", f"{what} and equals the recipe of {ctx.project}", **data)
    return warn("recipe", f"{what}; nothing to compare it with: {source}",
                "pass --project <agent folder> to compare it with the recipe the folder plans", **data)


def _same_content(expected: str, read: RecipeRead) -> bool:
    """The stored recipe is what the stack meant: its value hashes to ``expected``, or its
    document does (canonical JSON), as shipped: with the version it records, or without one when
    the writer filled it in at deploy."""
    if sha256(read.value or "") == expected:
        return True
    if read.doc is None:
        return False
    variants = [read.doc]
    if isinstance(read.doc.get("image"), dict):
        unversioned = json.loads(json.dumps(read.doc))
        unversioned["image"].pop("version", None)  # the document the stack shipped, before deploy
        variants.append(unversioned)
    return any(hashlib.sha256(canonical_json(doc).encode()).hexdigest() == expected for doc in variants)


def _same_key(actual: Optional[str], expected: str) -> bool:
    if not actual:
        return expected == DEFAULT_KEY
    if actual == expected:
        return True
    tail = lambda k: k.rsplit("/", 1)[-1] if k.startswith("arn:") or k.startswith("alias/") else k  # noqa: E731
    return tail(actual) == tail(expected) and actual.startswith("alias/") == expected.startswith("alias/")


def _key(ctx: Context, read: RecipeRead) -> Finding:
    try:
        found = [p for page in ctx.clients.pages("ssm", "describe_parameters", ParameterFilters=[
            {"Key": "Name", "Option": "Equals", "Values": [read.name]}]) for p in page.get("Parameters", [])]
    except AwsError as error:
        return unable("recipe.key", error, f"read the key of {read.name} (ssm:DescribeParameters)")
    actual = found[0].get("KeyId") if found else None
    try:
        props = recipe_properties(ctx) or {}
    except AwsError:
        props = {}
    wanted = props.get("KeyId")
    expected = wanted if isinstance(wanted, str) else DEFAULT_KEY
    data = {"key": actual, "expected": expected if isinstance(wanted, (str, type(None))) else "unresolved"}
    if wanted is not None and not isinstance(wanted, str):
        return warn("recipe.key", f"encrypted with {actual}; the stack's key could not be resolved",
                    "compare it with the fleet's recipe_key by hand", **data)
    if _same_key(actual, expected):
        return ok("recipe.key", f"encrypted with {actual or DEFAULT_KEY}, as the stack says", **data)
    return fail("recipe.key", f"encrypted with {actual}, the stack says {expected}",
                "deploy the stack again so the writer re-encrypts it with the fleet's key", **data)


def _launcher_can_read(ctx: Context, read: RecipeRead) -> Finding:
    arn = ctx.fleet.policy_arn("SandboxLauncherPolicy")
    if not arn:
        return fail("recipe.launcher", "SandboxLauncherPolicy is not deployed: nothing may read the recipe",
                    "deploy the fleet's stack completely")
    recipe_arn = ctx.arn("ssm", f"parameter{read.name}")
    probes = [Probe("ssm:GetParameter", recipe_arn, True, "read the recipe")]
    from .iam import recipe_key_arn

    key = recipe_key_arn(ctx)
    if key:
        probes.append(Probe("kms:Decrypt", key, True, "decrypt it through SSM",
                            (("kms:ViaService", (f"ssm.{ctx.region}.amazonaws.com",), "string"),)))
    try:
        answers = simulate(ctx, probes, documents=[ctx.policy_document(arn)])
    except AwsError as error:
        return unable("recipe.launcher", error, "simulate SandboxLauncherPolicy reading the recipe")
    denied = [a for a in answers if not a.passed]
    data = {"answers": [a.to_dict() for a in answers]}
    if denied:
        return fail("recipe.launcher", f"SandboxLauncherPolicy may not {', '.join(a.probe.action for a in denied)} "
                    f"{read.name}", "deploy the stack again (the AgentRecipe statement grants it)", **data)
    return ok("recipe.launcher", f"SandboxLauncherPolicy may read {read.name} (simulated)", **data)
