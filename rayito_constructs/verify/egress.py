"""Egress budgets: every target the fleet's image (or ``--project``) declares has its envelope in the
egress table, with its version and the tokens left now (read, never taken), and none of the
egress alarms is in ALARM (docs/egress-budgets.md; the table layout is ``BudgetClient``'s)."""

from __future__ import annotations

import json
from typing import Any, Optional

from ..egress.client import ENVELOPES_ENV
from ..model.egress_targets import TargetError, declared_target
from ..model.project import AgentProject
from .aws import AwsError, unable
from .context import Context
from .reconciler import alarms
from .report import Finding, fail, ok, warn


def declared(ctx: Context) -> tuple[Optional[list[dict[str, Any]]], str]:
    """The declared envelopes ``[{target, rate_per_second, burst}]`` and where they come from: the
    image the stack deployed (its ``RAYITO_EGRESS_ENVELOPES`` in the template env rayd hands the
    agents, recorded on the image resource as ``RayitoTemplateEnv`` metadata), else
    ``--project``."""
    images = [r for r in (ctx.template().get("Resources") or {}).values()
              if isinstance(r, dict) and r.get("Type") == "AWS::Lambda::MicrovmImage"]
    for image in images:
        # The template env composed into the image's zip (AgentImage records it as metadata), or,
        # for an image built before, its EnvironmentVariables.
        baked = (image.get("Metadata") or {}).get("RayitoTemplateEnv")
        text = _variable(baked if isinstance(baked, dict) else
                         (image.get("Properties") or {}).get("EnvironmentVariables"), ENVELOPES_ENV)
        if isinstance(text, str):
            try:
                return list((json.loads(text) or {}).get("budgets") or []), "image"
            except ValueError:
                return None, "image"
    if ctx.project is not None:
        try:
            project = AgentProject.load(ctx.project)
        except Exception:  # noqa: BLE001 - reported as unknown below
            return None, "project"
        return [{"target": b.target, "rate_per_second": b.rate_per_second, "burst": b.burst}
                for b in project.egress.budgets], "project"
    return ([], "image") if images else (None, "none")


def _variable(variables: Any, name: str) -> Any:
    """One variable of an image's ``EnvironmentVariables`` (a list of Key/Value, or a map)."""
    if isinstance(variables, dict):
        return variables.get(name)
    for item in variables or []:
        if isinstance(item, dict) and item.get("Key") == name:
            return item.get("Value")
    return None


def _num(item: dict[str, Any], key: str) -> Optional[float]:
    value = item.get(key)
    if isinstance(value, dict):
        value = value.get("N")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def remaining(bucket: dict[str, Any], now: float, rate: float, burst: float) -> float:
    """Tokens left now (GCRA: ``burst`` less what the arrival time ``tat`` says is still owed)."""
    if (_num(bucket, "backoff_until") or 0) > now:
        return 0.0
    tat = max(_num(bucket, "tat") or now, now)
    return round(max(0.0, min(burst, burst - (tat - now) * rate)), 3)


def check(ctx: Context) -> list[Finding]:
    table = ctx.fleet.egress_table
    envelopes, source = declared(ctx)
    if not table:
        if envelopes:
            return [fail("egress", f"the {source} declares {len(envelopes)} egress budgets but the stack has no egress table",
                         "deploy the fleet's stack completely")]
        return [warn("egress", "not deployed: no [[egress.budgets]] declared",
                     "nothing to do unless agents should share per-target rate envelopes (docs/egress-budgets.md)")]
    if envelopes is None:
        return [warn("egress", f"table {table} deployed, but the declared targets are unknown (no image declares them)",
                     "pass --project <agent folder>")]
    if not envelopes:
        return [warn("egress", f"table {table} deployed but the {source} declares no budgets",
                     "deploy the stack again from the project that declares them")]
    findings = []
    now = ctx.clock()
    for envelope in envelopes:
        target = str(envelope.get("target", ""))
        try:
            key = declared_target(target)
        except TargetError as exc:
            findings.append(fail("egress", f"{target}: not a target ({exc})", "fix the declaration and deploy again"))
            continue
        try:
            findings.append(_target(ctx, table, key, envelope, now))
        except AwsError as error:
            if error.kind == "not_found":
                return [fail("egress", f"the egress table {table} does not exist", "deploy the fleet's stack again")]
            findings.append(unable("egress", error, f"read the envelope of {key} in {table}"))
    findings.append(alarms(ctx, "egress.alarms", lambda lid: "EgressBudget" in lid))
    return findings


def _items(ctx: Context, table: str, key: str) -> list[dict[str, Any]]:
    items = [i for page in ctx.clients.pages("dynamodb", "query", TableName=table,
                                             KeyConditionExpression="#t = :t", ExpressionAttributeNames={"#t": "target"},
                                             ExpressionAttributeValues={":t": {"S": key}}) for i in page.get("Items", [])]
    if "?" in key:
        # A query class: one bucket per value (``?region=eu``), all drawing on this envelope.
        items += [i for page in ctx.clients.pages(
            "dynamodb", "scan", TableName=table, FilterExpression="begins_with(#t, :p)",
            ExpressionAttributeNames={"#t": "target"}, ExpressionAttributeValues={":p": {"S": key + "="}},
            limit_pages=10) for i in page.get("Items", [])]
    return items


def _buckets(items: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """The token buckets among an envelope's items, by the target they count: ``item = "bucket"``
    (an origin's or a path class's bucket; for a query class, the envelope itself when it has no
    ``tat``) and ``item = "bucket=<value>"`` (one value of a query class); older tables keep one
    partition per class value instead (``<key>=<value>``)."""
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        kind, target = item.get("item", {}).get("S", ""), item.get("target", {}).get("S", "")
        if kind.startswith("bucket="):
            found[f"{target}={kind[len('bucket='):]}"] = item
        elif kind == "bucket":
            found[target] = item
    classes = [name for name in found if name != key]
    if "?" in key and classes and key in found and "tat" not in found[key]:
        del found[key]  # the query class's envelope record, not a bucket of its own
    return found


def _target(ctx: Context, table: str, key: str, envelope: dict[str, Any], now: float) -> Finding:
    rate_d, burst_d = float(envelope.get("rate_per_second") or 0), float(envelope.get("burst") or 0)
    items = _items(ctx, table, key)
    buckets = _buckets(items, key)
    history = sorted((i for i in items if i.get("item", {}).get("S", "").startswith("envelope#")),
                     key=lambda i: i["item"]["S"])
    envelope_item = next((i for i in items if i.get("item", {}).get("S") == "bucket"
                          and i.get("target", {}).get("S") == key), {})
    declared_text = f"{rate_d * 60:g}/minute burst {burst_d:g}"
    data: dict[str, Any] = {"target": key, "declared": {"rate_per_second": rate_d, "burst": burst_d},
                            "buckets": len(buckets), "history": len(history)}
    if not buckets:
        return ok("egress", f"{key}: not used yet, the first request writes the declared envelope "
                  f"({declared_text}, {burst_d:g} available)", **data)
    rows = []
    for name, bucket in sorted(buckets.items()):
        rate = _num(bucket, "rate") or _num(envelope_item, "rate") or rate_d
        burst = _num(bucket, "burst") or _num(envelope_item, "burst") or burst_d
        version = _num(bucket, "version") if _num(bucket, "version") is not None else _num(envelope_item, "version")
        rows.append({"bucket": name, "version": int(version or 0), "rate_per_second": rate,
                     "burst": burst, "remaining": remaining(bucket, now, rate, burst),
                     "backoff_until": _num(bucket, "backoff_until"),
                     "backoff_reason": (bucket.get("backoff_reason") or {}).get("S")})
    data["envelopes"] = rows
    main = next((r for r in rows if r["bucket"] == key), rows[0])
    classes = f" ({len(rows)} class buckets, least left {min(r['remaining'] for r in rows):g})" if len(rows) > 1 else ""
    what = (f"{key}: envelope v{main['version']} {main['rate_per_second'] * 60:g}/minute burst {main['burst']:g}, "
            f"{main['remaining']:g} left now{classes}")
    if history:
        last = history[-1]
        data["last_change"] = {"version": last["item"]["S"].split("#", 1)[-1], "reason": (last.get("reason") or {}).get("S")}
        if (main["rate_per_second"], main["burst"]) != (rate_d, burst_d):
            what += f"; set by {data['last_change']['reason'] or 'an operator'} (declared {declared_text})"
    backoff = [r for r in rows if (r["backoff_until"] or 0) > now]
    if backoff:
        until = int(backoff[0]["backoff_until"] - now)
        return warn("egress", f"{what}; in backoff for {until} s more ({backoff[0]['backoff_reason']})",
                    "nothing to do if the target asked for it (429/503); otherwise clear it with put_envelope", **data)
    return ok("egress", what, **data)
