"""Run every check against one deployed fleet and gather the report."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import boto3
from botocore.exceptions import BotoCoreError

from . import basics, egress, iam, image, quotas, recipe, reconciler
from . import launch as launching
from .aws import ATTEMPTS, AwsError, Clients, unable
from .context import Context
from .deployed import REGION_NAME, DeployedFleet, TargetNotFound, find_stack, fleets_of, load_resources
from .report import Finding, Report, Status, fail


class BadInput(TargetNotFound):
    """Input verify cannot work with (exit status 2); ``str()`` is one line."""


@dataclass(frozen=True)
class Options:
    """What to verify and how.

    :param target: a fleet name or a stack name (or ARN).
    :param region: Default: the SDK's (``AWS_REGION``, the profile).
    :param launch: start one VM and wait for it to answer (costs money). Default: False.
    :param launch_role: a role to assume for the launch, scoped to SandboxLauncherPolicy.
        Default: the caller's own credentials.
    :param launch_timeout: seconds to wait for the VM to answer. Default: 180.
    :param project: the agent folder, to compare the recipe with. Default: none.
    :param fleet: the fleet to check when the stack holds several. Default: the only one.
    """

    target: str
    region: Optional[str] = None
    launch: bool = False
    launch_role: Optional[str] = None
    launch_timeout: float = launching.DEFAULT_TIMEOUT_SECONDS
    project: Optional[Path] = None
    fleet: Optional[str] = None


CHECKS: tuple[tuple[str, Callable[[Context], list[Finding]]], ...] = (
    ("quotas", quotas.check),
    ("image", image.check),
    ("iam", iam.check),
    ("recipe", recipe.check),
    ("reconciler", reconciler.check),
    ("egress", egress.check),
)


def verify(options: Options, *, session: Optional[boto3.Session] = None, attempts: int = ATTEMPTS,
           clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
           probe: Optional[launching.Probe] = None, on_note: Optional[Callable[[str], None]] = None) -> Report:
    """Check one deployed fleet. Raises :class:`TargetNotFound` or :class:`BadInput` for input that
    names nothing verify can check (exit status 2); every AWS error becomes a finding."""
    try:
        session = session or boto3.Session()
        region = options.region or session.region_name
    except BotoCoreError as exc:  # a profile that does not exist, a config file that does not parse
        raise BadInput(f"verify: {exc}") from None
    if not region:
        raise BadInput("verify: no region: pass --region or set AWS_REGION")
    if not REGION_NAME.match(region):
        raise BadInput(f"verify: --region {region!r} is not a region name (like us-east-1)")
    if not options.target or not options.target.strip():
        raise BadInput("verify: give a fleet name or a stack name")
    clients = Clients(session, region, attempts)
    report = Report(options.target, region=region)
    found, who = basics.identity(clients)
    report.add(found)
    if who is None:
        return report
    report.account = who.get("Account")
    report.add(basics.region(clients))
    try:
        stack, asked = find_stack(clients, options.target)
    except AwsError as error:
        report.add(unable("stack", error, f"find the stack {options.target}"))
        return report
    load_resources(clients, stack)
    report.stack = stack.name
    report.add(basics.stack_status(stack))
    fleet = _select(stack, options.fleet, asked, clients, who)
    ctx = Context(clients, fleet, project=options.project, clock=clock, sleep=sleep)
    ctx.account = who.get("Account")
    ctx.caller_arn = who.get("Arn")
    ctx.partition = str(who.get("Arn", "arn:aws:")).split(":")[1] or "aws"
    report.fleet = ctx.fleet_name
    for name, body in CHECKS:
        report.add(*_guard(name, lambda body=body: body(ctx)))
    if options.launch:
        spec = ctx.spec()
        note = launching.cost_line(spec.memory_mib, options.launch_timeout)
        report.notes.append(note)
        if on_note:
            on_note(note)
        finding = _guard("launch", lambda: [launching.check(ctx, role_arn=options.launch_role,
                                                          timeout=options.launch_timeout, probe=probe)])
        if finding and "credentials" in finding[0].data:
            report.notes.append(finding[0].data["credentials"])
            if on_note:
                on_note(finding[0].data["credentials"])
        report.add(*finding)
    return report


def _guard(name: str, body: Callable[[], list[Finding]]) -> list[Finding]:
    """A check never ends the run: an AWS error is a finding, so is a bug (with its location)."""
    try:
        return body()
    except AwsError as error:
        return [unable(name, error, f"run the {name} check")]
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return [fail(name, f"internal error in the {name} check: {type(exc).__name__}: {exc} "
                     f"({Path(where.filename).name}:{where.lineno})", "report it with verify --json's output")]


def _select(stack, explicit: Optional[str], asked: Optional[str], clients: Clients, who: dict) -> DeployedFleet:
    """The fleet to check: the one named by ``--fleet`` (``explicit``), else the stack's only one
    (named ``asked`` when its name cannot be read), else the one named ``asked``."""
    prefixes = fleets_of(stack)
    if not prefixes:
        if stack.status.endswith("_COMPLETE") and not stack.status.startswith(("ROLLBACK", "DELETE")) \
                and stack.resources_error is None:
            raise BadInput(f"verify: stack {stack.name} holds no rayito fleet (no fleet policies, recipe or reconciler)")
        return DeployedFleet(stack, "", explicit or asked)  # partially deployed: each check says what is missing
    fleets = [DeployedFleet(stack, p) for p in prefixes]
    names = {_name_of(f, clients, who): f for f in fleets}
    if explicit:
        if explicit in names:
            return names[explicit]
        raise BadInput(f"verify: stack {stack.name} holds no fleet {explicit!r} "
                       f"(it holds {', '.join(sorted(str(n) for n in names))})")
    if len(fleets) == 1:
        if fleets[0].name is None:
            fleets[0].name = asked
        return fleets[0]
    if asked in names:
        return names[asked]
    listed = ", ".join(sorted(str(n) for n in names))
    raise BadInput(f"verify: stack {stack.name} holds {len(fleets)} fleets ({listed}): pass --fleet NAME")


def _name_of(fleet: DeployedFleet, clients: Clients, who: dict) -> Optional[str]:
    ctx = Context(clients, fleet)
    ctx.account = who.get("Account")
    return ctx.fleet_name


__all__ = ["BadInput", "Options", "Status", "TargetNotFound", "verify"]
