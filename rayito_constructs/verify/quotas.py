"""Quotas: the applied Service Quotas of the MicroVM operations and memory (service code
``lambda``) against what the fleet needs: ``max_vms`` x memory (parked slots are members too)
against the memory quota, and the reconciler's control-plane budgets against the operation rates.

Quota codes and defaults: ``shared/research/microvms.md`` section 6.1 (read by third-party tools
from ``service-quotas list-service-quotas --service-code lambda``, consistent across three
repositories; the RunMicrovm 5/5 and SuspendMicrovm 2/2 values were measured as applied in a real
account, ``rayito-ground-truth.md`` section 2). Codes are unconfirmed by an AWS page, so a quota is
also recognized by its name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from .aws import AwsError, unable
from .context import Context
from .report import Finding, fail, ok, warn

SERVICE_CODE = "lambda"
#: operation -> (rate code, burst code, documented default rate, documented default burst)
RATE_QUOTAS: dict[str, tuple[str, str, float, float]] = {
    "RunMicrovm": ("L-535CA9B6", "L-91B95582", 5, 5),
    "ResumeMicrovm": ("L-118C44B3", "L-25EEC0A4", 5, 5),
    "SuspendMicrovm": ("L-90045317", "L-139F9A48", 2, 2),
    "TerminateMicrovm": ("L-74787B8A", "L-2CCA0501", 10, 10),
    "GetMicrovm": ("L-CE98C9E3", "L-C9C2110E", 100, 100),
    "CreateMicrovmAuthToken": ("L-7712260B", "L-D65D9F16", 50, 50),
}
MEMORY_QUOTA = "L-CD1C0CC4"
#: Documented default memory quota, GB: 1,024 in the four large regions, 400 elsewhere.
MEMORY_DEFAULT_GB = {"us-east-1": 1024, "us-east-2": 1024, "us-west-2": 1024, "ap-northeast-1": 1024}
MEMORY_DEFAULT_GB_ELSEWHERE = 400
#: Share of the memory quota one fleet may take at max_vms before verify warns (the quota is per
#: account and region, shared with every other fleet and client).
MEMORY_WARN_SHARE = 0.8
#: The reconciler's default share of each documented quota (lambdas/reconciler/budget.py).
DEFAULT_SHARE = 0.95


@dataclass(frozen=True)
class Quota:
    code: str
    name: str
    value: float
    unit: str
    source: str  # applied | default


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def read_quotas(ctx: Context) -> dict[str, Quota]:
    """Applied quotas of service code ``lambda`` by code; the ones not listed are asked one by one
    (GetServiceQuota, then GetAWSDefaultServiceQuota). Raises :class:`AwsError` on the listing."""
    found: dict[str, Quota] = {}
    for page in ctx.clients.pages("service-quotas", "list_service_quotas", ServiceCode=SERVICE_CODE):
        for q in page.get("Quotas", []):
            found[q["QuotaCode"]] = Quota(q["QuotaCode"], q.get("QuotaName", ""), float(q.get("Value", 0)),
                                          q.get("Unit", "None"), "applied")
    wanted = [MEMORY_QUOTA] + [code for rate, burst, _, _ in RATE_QUOTAS.values() for code in (rate, burst)]
    for code in wanted:
        if code in found or _by_name(found, code) is not None:
            continue
        for operation, source in (("get_service_quota", "applied"), ("get_aws_default_service_quota", "default")):
            try:
                q = ctx.clients.call("service-quotas", operation, ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]
            except AwsError as error:
                if error.kind == "not_found" or error.code == "NoSuchResourceException":
                    continue
                raise
            found[code] = Quota(code, q.get("QuotaName", ""), float(q.get("Value", 0)), q.get("Unit", "None"), source)
            break
    return found


def _by_name(quotas: dict[str, Quota], code: str) -> Optional[Quota]:
    """A quota recognized by its name when its code differs from the one we know."""
    for operation, (rate_code, burst_code, _, _) in RATE_QUOTAS.items():
        if code in (rate_code, burst_code):
            want_burst = code == burst_code
            for q in quotas.values():
                name = _norm(q.name)
                if _norm(operation) in name and ("burst" in name) == want_burst:
                    return q
    if code == MEMORY_QUOTA:
        for q in quotas.values():
            name = _norm(q.name)
            if "memory" in name and "microvm" in name:
                return q
    return None


def quota(quotas: dict[str, Quota], code: str) -> Optional[Quota]:
    return quotas.get(code) or _by_name(quotas, code)


def memory_mib(q: Quota) -> float:
    """The memory quota in MiB: the value is in GB unless its unit says otherwise (1 GB = 1,024 MiB)."""
    unit = q.unit.lower()
    if "mega" in unit or unit in ("mb", "mib"):
        return q.value
    if "tera" in unit:
        return q.value * 1024 * 1024
    return q.value * 1024


def reconciler_budgets(env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """The control-plane budgets the reconciler runs with: its BUDGETS overrides over its defaults
    (the reconciler's own code when it can be imported, else the documented quotas at 95%)."""
    try:
        overrides = {k: (float(v[0]), float(v[1])) for k, v in json.loads(env.get("BUDGETS") or "{}").items()}
    except (ValueError, TypeError, IndexError, AttributeError):
        overrides = {}
    try:
        from .._lambdas.reconciler.budget import _Gcra  # type: ignore[import-not-found]

        return {k: (float(r), float(b)) for k, (r, b) in _Gcra(overrides).budgets.items()}
    except Exception:  # noqa: BLE001 - an older or newer reconciler: fall back to the documented quotas
        defaults = {op: (rate * DEFAULT_SHARE, max(1.0, burst - 1)) for op, (_, _, rate, burst) in RATE_QUOTAS.items()}
        return {**defaults, **overrides}


def check(ctx: Context) -> list[Finding]:
    try:
        quotas = read_quotas(ctx)
    except AwsError as error:
        return [unable("quotas", error, "read the applied quotas of service code lambda")]
    return [check_memory(ctx, quotas), check_rates(ctx, quotas)]


def check_memory(ctx: Context, quotas: dict[str, Quota]) -> Finding:
    spec = ctx.spec()
    q = quota(quotas, MEMORY_QUOTA)
    default_gb = MEMORY_DEFAULT_GB.get(ctx.region, MEMORY_DEFAULT_GB_ELSEWHERE)
    if q is None:
        return warn("quotas.memory", f"no MicroVM memory quota found ({MEMORY_QUOTA}); the documented default "
                    f"here is {default_gb} GB", "check Service Quotas > AWS Lambda by hand", default_gb=default_gb)
    limit = memory_mib(q)
    data: dict[str, Any] = {"quota": q.__dict__, "limit_mib": limit, "spec": spec.__dict__}
    if spec.memory_mib is None or spec.max_vms is None:
        return warn("quotas.memory", f"memory quota {q.value:g} ({q.unit}); the fleet's size or memory is unknown",
                    "deploy the reconciler or save the recipe so verify can read the fleet's size", **data)
    peak = spec.max_vms * spec.memory_mib
    floor = ((spec.min_vms or 0) + (spec.warm_vms or 0)) * spec.memory_mib
    data.update(peak_mib=peak, floor_mib=floor)
    lower = f" (below the documented {default_gb} GB: a new account?)" if limit < default_gb * 1024 else ""
    what = (f"max_vms {spec.max_vms} x {spec.memory_mib} MiB = {peak / 1024:g} GB (parked slots included) "
            f"against the quota of {limit / 1024:g} GB{lower}")
    fix = f"request an increase of {q.code} (Service Quotas > AWS Lambda) or lower max_vms"
    if floor > limit:
        return fail("quotas.memory", f"min_vms + warm_vms alone need {floor / 1024:g} GB: {what}", fix, **data)
    if peak > limit:
        return fail("quotas.memory", f"the fleet cannot reach max_vms: {what}", fix, **data)
    if peak > MEMORY_WARN_SHARE * limit:
        return warn("quotas.memory", f"{what}: over {MEMORY_WARN_SHARE:.0%} of a quota every fleet and client "
                    "of the account and region shares", fix, **data)
    return ok("quotas.memory", what, **data)


def check_rates(ctx: Context, quotas: dict[str, Quota]) -> Finding:
    env = ctx.reconciler_env()
    budgets = reconciler_budgets(env) if env else {}
    rows, over, missing, low = [], [], [], []
    for operation, (rate_code, burst_code, default_rate, default_burst) in RATE_QUOTAS.items():
        rate_q, burst_q = quota(quotas, rate_code), quota(quotas, burst_code)
        row: dict[str, Any] = {"operation": operation, "rate_quota": rate_q.value if rate_q else None,
                               "burst_quota": burst_q.value if burst_q else None,
                               "documented": [default_rate, default_burst]}
        if rate_q is None:
            missing.append(operation)
        elif rate_q.value < default_rate or (burst_q is not None and burst_q.value < default_burst):
            low.append(f"{operation} {rate_q.value:g}/s")
        budget = budgets.get(operation)
        if budget is not None:
            row["budget"] = list(budget)
            rate_over = rate_q is not None and budget[0] > rate_q.value + 1e-9
            burst_over = burst_q is not None and budget[1] > burst_q.value + 1e-9
            if rate_over or burst_over:
                limit_rate = rate_q.value if rate_q else budget[0]
                limit_burst = burst_q.value if burst_q else budget[1]
                over.append((operation, budget, limit_rate, limit_burst))
        rows.append(row)
    data = {"operations": rows, "reconciler": bool(env)}
    if over:
        names = ", ".join(f"{op} {b[0]:g}/s burst {b[1]:g} > {r:g}/s burst {u:g}" for op, b, r, u in over)
        suggestion = ", ".join(f"'{op}': ({r * DEFAULT_SHARE:.3g}, {max(1, u - 1):g})" for op, _, r, u in over)
        return fail("quotas.rates", f"the reconciler's budgets exceed the applied quotas: {names}",
                    f"pass control_plane_budgets={{{suggestion}}} to AgentFleet, or request quota increases", **data)
    note = f"; below the documented defaults: {', '.join(low)} (a new account?)" if low else ""
    if missing:
        return warn("quotas.rates", f"no applied quota found for {', '.join(missing)}{note}",
                    "check Service Quotas > AWS Lambda by hand (codes are from third-party listings)", **data)
    if not env:
        return warn("quotas.rates", f"applied operation quotas read; no reconciler budgets to compare them with{note}",
                    "nothing to do unless the fleet should have a reconciler (reconciler=True)", **data)
    return ok("quotas.rates", f"the reconciler's budgets fit the applied quotas of {len(rows)} operations{note}", **data)
