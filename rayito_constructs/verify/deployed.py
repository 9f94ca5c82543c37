"""What a stack deployed, read from CloudFormation itself: the stack (DescribeStacks), its
resources (ListStackResources) grouped by fleet, and its outputs.

Nothing here depends on a resource's name: resources are found by type and by the logical id
that CDK derives from the construct path (``<fleet construct>SandboxLauncherPolicy<hash>``), so a
fleet inside a user's own stack (no outputs) is found like one in a ``FleetStack``. Outputs, when
present, win: they are what the stack says about itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from ..model.names import is_fleet_name, stack_name_for
from .aws import AwsError, Clients

#: Regions that offer Lambda MicroVMs (shared/research/rayito-ground-truth.md section 8, from the
#: AWS documentation quoted by the Rayito notes, section 13): launch regions on 2026-06-22, more on
#: 2026-08-19.
MICROVM_REGIONS = {
    "us-east-1": "2026-06-22", "us-east-2": "2026-06-22", "us-west-2": "2026-06-22",
    "eu-west-1": "2026-06-22", "ap-northeast-1": "2026-06-22",
    "ap-south-1": "2026-08-19", "ap-southeast-1": "2026-08-19", "ap-southeast-2": "2026-08-19",
    "eu-central-1": "2026-08-19", "eu-north-1": "2026-08-19",
}
REGIONS_AS_OF = "2026-08-19"

STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,127}\Z")
REGION_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}\Z")
FLEET_STACK_PREFIX = "RayitoFleet-"  # app.py names its stack RayitoFleet-<fleet name>
_HASH = "[0-9A-F]{8}"
#: Resources that mark a fleet, and the part of the logical id after the fleet construct's prefix.
_MARKERS = (
    ("AWS::IAM::ManagedPolicy", re.compile(rf"^(.*?)(SandboxLauncherPolicy|CallerPolicy|ImagePublisherPolicy){_HASH}$")),
    ("Custom::RayitoRecipe", re.compile(rf"^(.*?)Recipe(Resource)?{_HASH}$")),
    ("AWS::Lambda::Function", re.compile(rf"^(.*?)Reconciler(Function)?{_HASH}$")),
)
_TERMINAL_OK = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "IMPORT_COMPLETE")


class TargetNotFound(Exception):
    """Bad input: no stack or fleet by that name (exit status 2). ``str()`` is one line;
    ``region`` is the region searched."""

    def __init__(self, message: str, region: Optional[str] = None) -> None:
        super().__init__(message)
        self.region = region


@dataclass(frozen=True)
class StackResource:
    logical_id: str
    type: str
    physical_id: Optional[str]
    status: str
    reason: Optional[str] = None


@dataclass
class DeployedStack:
    name: str
    stack_id: str
    region: str
    status: str
    status_reason: Optional[str]
    outputs: dict[str, str]
    created: Optional[datetime]
    updated: Optional[datetime]
    resources: list[StackResource] = field(default_factory=list)
    resources_error: Optional[AwsError] = None

    @property
    def account(self) -> Optional[str]:
        parts = self.stack_id.split(":")
        return parts[4] if len(parts) > 5 else None

    def of_type(self, type_: str, prefix: str = "") -> list[StackResource]:
        return [r for r in self.resources if r.type == type_ and r.logical_id.startswith(prefix)]


@dataclass
class DeployedFleet:
    """One fleet of a stack: the resources whose logical ids start with its construct's prefix."""

    stack: DeployedStack
    prefix: str
    name: Optional[str] = None

    # ------------------------------------------------------------------ lookups by type and id

    def resource(self, type_: str, *parts: str) -> Optional[StackResource]:
        """The fleet's resource of ``type_`` whose logical id holds ``parts`` in order after the prefix."""
        pattern = re.compile("^" + re.escape(self.prefix) + "".join(f".*?{re.escape(p)}" for p in parts) + f".*{_HASH}$")
        found = [r for r in self.own(type_) if pattern.match(r.logical_id)]
        return found[0] if found else None

    def own(self, type_: str) -> list[StackResource]:
        """The stack's resources of ``type_`` under this fleet's prefix, less those of a fleet whose
        construct id extends it (``AgentCanary``'s are not ``Agent``'s)."""
        longer = [q for q in fleets_of(self.stack) if q != self.prefix and q.startswith(self.prefix)]
        return [r for r in self.stack.of_type(type_, self.prefix) if not r.logical_id.startswith(tuple(longer))]

    def stack_resource(self, type_: str, *parts: str) -> Optional[StackResource]:
        """A resource of the whole stack (the ledger, the budget table, the recipe writer)."""
        pattern = re.compile("".join(f".*?{re.escape(p)}" for p in parts))
        found = [r for r in self.stack.of_type(type_) if pattern.match(r.logical_id)]
        return found[0] if found else None

    def output(self, key: str) -> Optional[str]:
        """A stack output, only when the stack holds this fleet alone (a ``FleetStack``)."""
        if len(fleets_of(self.stack)) > 1:
            return None
        value = self.stack.outputs.get(key)
        return value if value and not value.startswith("none") else None

    def physical(self, type_: str, *parts: str) -> Optional[str]:
        r = self.resource(type_, *parts)
        return r.physical_id if r and r.physical_id else None

    def policy_arn(self, kind: str) -> Optional[str]:
        """``SandboxLauncherPolicy``, ``CallerPolicy`` or ``ImagePublisherPolicy``."""
        return self.output(f"{kind}Arn") or self.physical("AWS::IAM::ManagedPolicy", kind)

    @property
    def recipe_resource(self) -> Optional[StackResource]:
        return self.resource("Custom::RayitoRecipe", "Recipe")

    @property
    def reconciler_function(self) -> Optional[str]:
        return self.output("ReconcilerFunctionName") or self.physical("AWS::Lambda::Function", "ReconcilerFunction")

    @property
    def dead_letter_queue_url(self) -> Optional[str]:
        return self.output("ReconcilerDeadLetterQueueUrl") or self.physical("AWS::SQS::Queue", "Reconciler", "DeadLetters")

    @property
    def egress_table(self) -> Optional[str]:
        return self.output("EgressBudgetTableName") or self.physical("AWS::DynamoDB::Table", "EgressBudget")

    @property
    def metadata_table(self) -> Optional[str]:
        return self.output("MetadataIndexTableName") or self.physical("AWS::DynamoDB::Table", "MetadataIndex")

    @property
    def alarms(self) -> list[StackResource]:
        return self.own("AWS::CloudWatch::Alarm")

    @property
    def recipe_writer_function(self) -> Optional[str]:
        r = self.stack_resource("AWS::Lambda::Function", "RecipeWriter")
        return r.physical_id if r else None


def fleets_of(stack: DeployedStack) -> list[str]:
    """The construct prefixes of the fleets in a stack (``Fleet`` in a ``FleetStack``).

    Every fleet has its own ``SandboxLauncherPolicy``: a prefix with one is a fleet, even when it
    extends another fleet's (``AgentCanary`` next to ``Agent``). Any other marker's prefix that
    extends one found (``FleetReconciler`` under ``Fleet``) is the same fleet's; without a
    launcher policy (a stack still deploying, or one that failed) the other markers tell."""
    prefixes: list[str] = []
    launchers: set[str] = set()
    for type_, pattern in _MARKERS:
        for r in stack.of_type(type_):
            match = pattern.match(r.logical_id)
            if not match or match.group(1).endswith("RecipeWriter"):
                continue
            if match.lastindex and match.group(2) == "SandboxLauncherPolicy" and type_ == "AWS::IAM::ManagedPolicy":
                launchers.add(match.group(1))
            if match.group(1) not in prefixes:
                prefixes.append(match.group(1))
    return [p for p in prefixes if p in launchers or not any(p != q and p.startswith(q) for q in prefixes)]


def describe(clients: Clients, name: str, region: Optional[str] = None) -> Optional[DeployedStack]:
    """The stack named ``name`` (or its id), None when it does not exist; raises :class:`AwsError`."""
    try:
        found = clients.call("cloudformation", "describe_stacks", region=region, StackName=name)["Stacks"]
    except AwsError as error:
        if error.kind == "not_found" or (error.code == "ValidationError" and "does not exist" in error.message):
            return None
        raise
    if not found:
        return None
    s = found[0]
    return DeployedStack(
        name=s["StackName"],
        stack_id=s.get("StackId", ""),
        region=region or clients.region,
        status=s.get("StackStatus", ""),
        status_reason=s.get("StackStatusReason"),
        outputs={o["OutputKey"]: o.get("OutputValue", "") for o in s.get("Outputs", []) or []},
        created=s.get("CreationTime"),
        updated=s.get("LastUpdatedTime"),
    )


def load_resources(clients: Clients, stack: DeployedStack) -> None:
    """Fill ``stack.resources`` (ListStackResources, every page); an error is kept, not raised."""
    try:
        for page in clients.pages("cloudformation", "list_stack_resources", StackName=stack.stack_id or stack.name):
            for r in page.get("StackResourceSummaries", []):
                if not r.get("LogicalResourceId") or not r.get("ResourceType"):
                    continue
                stack.resources.append(StackResource(
                    r["LogicalResourceId"], r["ResourceType"], r.get("PhysicalResourceId") or None,
                    r.get("ResourceStatus", ""), r.get("ResourceStatusReason")))
    except AwsError as error:
        stack.resources_error = error


STACK_ARN = re.compile(r"^arn:aws[a-z-]*:cloudformation:[a-z0-9-]+:\d{12}:stack/[A-Za-z][A-Za-z0-9-]*/[0-9a-f-]+\Z")


def candidates(target: str) -> list[str]:
    """Stack names (or the stack ARN given) to try for a fleet name or stack name, in order."""
    if STACK_ARN.match(target):
        return [target]
    names = []
    if STACK_NAME.match(target):
        names.append(target)
    prefixed = FLEET_STACK_PREFIX + target
    if not target.startswith(FLEET_STACK_PREFIX) and STACK_NAME.match(prefixed):
        names.append(prefixed)
    elif not target.startswith(FLEET_STACK_PREFIX) and is_fleet_name(target):
        # app.py's stack for a name a stack cannot hold (my_agent: RayitoFleet-my-agent-<hash>):
        # found, and hinted in another region, like any other fleet's.
        names.append(stack_name_for(target))
    return names


def find_stack(clients: Clients, target: str) -> tuple[DeployedStack, Optional[str]]:
    """The stack for ``target`` and the fleet name asked for (None when ``target`` named the stack).

    Tries ``target`` as a stack name, then ``RayitoFleet-<target>``, then every stack whose
    ``FleetName`` output is ``target``. Raises :class:`TargetNotFound` (naming the regions where a
    stack of that name does exist, if any) or :class:`AwsError`.
    """
    for number, name in enumerate(candidates(target)):
        stack = describe(clients, name)
        if stack is not None:
            return stack, (None if number == 0 and name == target else target)
    for page in clients.pages("cloudformation", "describe_stacks", limit_pages=20):
        for s in page.get("Stacks", []):
            outputs = {o["OutputKey"]: o.get("OutputValue") for o in s.get("Outputs", []) or []}
            if outputs.get("FleetName") == target and s.get("StackStatus") != "DELETE_COMPLETE":
                stack = describe(clients, s["StackId"])
                if stack is not None:
                    return stack, target
    elsewhere = _other_regions(clients, candidates(target))
    hint = f"; it exists in {', '.join(elsewhere)}: pass --region {elsewhere[0]}" if elsewhere else ""
    tried = " or ".join(candidates(target)) or repr(target)
    raise TargetNotFound(
        f"verify: no stack {tried} and no stack with output FleetName = {target!r} in {clients.region}{hint}",
        region=clients.region,
    )


def _other_regions(clients: Clients, names: list[str]) -> list[str]:
    """The other MicroVM regions where a stack of one of ``names`` exists: one quick attempt per
    region, all regions at once (a region that does not answer or denies is no hint)."""
    from concurrent.futures import ThreadPoolExecutor

    quick = Clients(clients.session, clients.region, attempts=1)

    def look(region: str) -> Optional[str]:
        for name in names:
            try:
                if describe(quick, name, region=region) is not None:
                    return region
            except AwsError:
                return None
        return None

    regions = [r for r in MICROVM_REGIONS if r != clients.region]
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=len(regions)) as pool:
        return [r for r in pool.map(look, regions) if r]
