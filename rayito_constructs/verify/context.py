"""What several checks read about one deployed fleet, each read made once (its error kept too)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..model.product import RecipeWarning, decode, recipe_document
from .aws import AwsError, Clients
from .deployed import DeployedFleet
from .template import Unresolved, resolve

#: An unversioned MicroVM image ARN (group 1), alone or with a version (``:3``) or ``:*`` after it.
_IMAGE_ARN = re.compile(r"^(arn:[a-z-]+:lambda:[a-z0-9-]+:\d{12}:microvm-image:[A-Za-z0-9._-]+)(:[0-9]+|:\*)?\Z")


@dataclass(frozen=True)
class FleetSpec:
    """The fleet's size as deployed, and where each number came from."""

    min_vms: Optional[int]
    max_vms: Optional[int]
    warm_vms: Optional[int]
    idle_seconds: Optional[int]
    memory_mib: Optional[int]
    sources: dict[str, str]


@dataclass(frozen=True)
class RecipeRead:
    """The recipe parameter as read: its value and type, the decoded document or why not."""

    name: str
    value: Optional[str]
    type: Optional[str]
    doc: Optional[dict[str, Any]]
    decode_error: Optional[str]


class Context:
    """Lazy, cached reads of one fleet. Every method raises :class:`AwsError` when AWS says no."""

    def __init__(self, clients: Clients, fleet: DeployedFleet, *, project: Optional[Path] = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.clients = clients
        self.fleet = fleet
        self.project = project
        self.clock = clock
        self.sleep = sleep
        self.account: Optional[str] = None
        self.caller_arn: Optional[str] = None
        self.partition = "aws"
        self._cache: dict[Any, tuple[bool, Any]] = {}

    def _once(self, key: Any, load: Callable[[], Any]) -> Any:
        if key not in self._cache:
            try:
                self._cache[key] = (True, load())
            except AwsError as error:
                self._cache[key] = (False, error)
        ok, value = self._cache[key]
        if not ok:
            raise value
        return value

    @property
    def region(self) -> str:
        return self.clients.region

    # ------------------------------------------------------------------ the reconciler's view

    def reconciler_config(self) -> Optional[dict[str, Any]]:
        """GetFunctionConfiguration of the reconciler; None when the fleet has none."""
        function = self.fleet.reconciler_function
        if not function:
            return None
        return self._once(("fn", function), lambda: self.clients.call(
            "lambda", "get_function_configuration", FunctionName=function))

    def reconciler_env(self) -> dict[str, str]:
        """The reconciler's environment, or {} when there is none or it cannot be read."""
        try:
            config = self.reconciler_config()
        except AwsError:
            return {}
        return dict(((config or {}).get("Environment") or {}).get("Variables") or {})

    # ------------------------------------------------------------------ names

    @property
    def fleet_name(self) -> Optional[str]:
        if self.fleet.name:
            return self.fleet.name
        name = self.fleet.output("FleetName") or self.reconciler_env().get("FLEET_NAME")
        if not name and self.fleet.recipe_resource and self.fleet.recipe_resource.physical_id:
            parts = self.fleet.recipe_resource.physical_id.split("/")
            name = parts[3] if len(parts) == 5 and parts[1:3] == ["rayito", "agents"] else None
        if not name:
            name = self._name_from_policies()
        self.fleet.name = name
        return name

    def _name_from_policies(self) -> Optional[str]:
        """The fleet's name from its policies' descriptions (``Rayito ...Policy: ... (<name>)``)."""
        for kind in ("SandboxLauncherPolicy", "CallerPolicy", "ImagePublisherPolicy"):
            arn = self.fleet.policy_arn(kind)
            if not arn:
                continue
            try:
                description = self._policy(arn).get("Description") or ""
            except AwsError:
                continue
            match = re.search(r"\(([A-Za-z0-9_.-]{1,64})\)$", description.strip())
            if match and match.group(1) != "every fleet":
                return match.group(1)
        return None

    def _policy(self, arn: str) -> dict[str, Any]:
        return self._once(("policy-meta", arn), lambda: self.clients.call("iam", "get_policy", PolicyArn=arn)["Policy"])

    def image_arn(self) -> Optional[str]:
        """The fleet's image: the stack's output, its image resource, the reconciler's IMAGE_ARN,
        the image its launcher policy runs, or the image named after the fleet (what
        ``AgentFleet`` defaults to: only when nothing deployed names it)."""
        arn = (self.fleet.output("ImageArn") or self.fleet.physical("AWS::Lambda::MicrovmImage")
               or self.reconciler_env().get("IMAGE_ARN") or self._launcher_image())
        if not arn and self.fleet_name and self.account:
            arn = f"arn:{self.partition}:lambda:{self.region}:{self.account}:microvm-image:{self.fleet_name}"
        return arn

    def _launcher_image(self) -> Optional[str]:
        """The unversioned image ARN the fleet's ``SandboxLauncherPolicy`` lets RunMicrovm use (a
        fleet on an image published elsewhere, ``image_arn=``, has no image resource, no output
        and, without a reconciler, no environment naming it); None when it cannot be read."""
        policy = self.fleet.policy_arn("SandboxLauncherPolicy")
        if not policy:
            return None
        try:
            document = self.policy_document(policy)
        except AwsError:
            return None
        for statement in document.get("Statement") or []:
            if not isinstance(statement, dict) or statement.get("Effect") != "Allow":
                continue
            actions = statement.get("Action") or []
            if "lambda:RunMicrovm" not in ([actions] if isinstance(actions, str) else actions):
                continue
            resources = statement.get("Resource") or []
            for resource in [resources] if isinstance(resources, str) else resources:
                match = _IMAGE_ARN.match(str(resource))
                if match:
                    return match.group(1)
        return None

    def execution_role_arn(self) -> Optional[str]:
        arn = self.fleet.output("ExecutionRoleArn") or self.reconciler_env().get("EXECUTION_ROLE_ARN")
        if not arn:
            name = self.fleet.physical("AWS::IAM::Role", "ExecutionRole")
            if name and self.account:
                arn = name if name.startswith("arn:") else f"arn:{self.partition}:iam::{self.account}:role/{name}"
        return arn

    def recipe_parameter_name(self) -> Optional[str]:
        """The recipe parameter this stack writes, None when it writes none."""
        resource = self.fleet.recipe_resource
        if resource and resource.physical_id and resource.physical_id.startswith("/rayito/agents/"):
            return resource.physical_id
        output = self.fleet.output("RecipeParameterName")
        if output and output.startswith("/"):
            return output
        if resource and self.fleet_name:
            return f"/rayito/agents/{self.fleet_name}/recipe"
        return None

    def arn(self, service: str, resource: str) -> str:
        """An ARN of this account (and region, except for IAM)."""
        region = "" if service == "iam" else self.region
        return f"arn:{self.partition}:{service}:{region}:{self.account or ''}:{resource}"

    # ------------------------------------------------------------------ reads

    def image(self) -> dict[str, Any]:
        arn = self.image_arn()
        return self._once(("image", arn), lambda: self.clients.call(
            "lambda-microvms", "get_microvm_image", imageIdentifier=arn))

    def image_versions(self) -> list[dict[str, Any]]:
        arn = self.image_arn()

        def load() -> list[dict[str, Any]]:
            return [item for page in self.clients.pages("lambda-microvms", "list_microvm_image_versions",
                                                          imageIdentifier=arn) for item in page.get("items", [])]
        return self._once(("versions", arn), load)

    def template(self) -> dict[str, Any]:
        """The deployed template (GetTemplate, as deployed)."""
        def load() -> dict[str, Any]:
            body = self.clients.call("cloudformation", "get_template", StackName=self.fleet.stack.stack_id
                                     or self.fleet.stack.name, TemplateStage="Original")["TemplateBody"]
            return body if isinstance(body, dict) else json.loads(body)
        return self._once("template", load)

    def policy_document(self, arn: str) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            policy = self._policy(arn)
            version = self.clients.call("iam", "get_policy_version", PolicyArn=arn,
                                        VersionId=policy["DefaultVersionId"])["PolicyVersion"]
            document = version["Document"]
            if isinstance(document, str):
                from urllib.parse import unquote

                document = json.loads(unquote(document))
            return document
        return self._once(("policy", arn), load)

    def recipe(self) -> Optional[RecipeRead]:
        """The recipe as stored (GetParameter WithDecryption), None when the stack writes none."""
        name = self.recipe_parameter_name()
        if not name:
            return None

        def load() -> RecipeRead:
            parameter = self.clients.call("ssm", "get_parameter", Name=name, WithDecryption=True)["Parameter"]
            value = parameter.get("Value")
            try:  # as the product's client reads it
                recipe, _ = decode(value or "")
                doc, error = recipe_document(recipe), None
            except RecipeWarning as exc:
                doc, error = None, f"{exc} (the product's client cannot read it)"
            return RecipeRead(name, value, parameter.get("Type"), doc, error)
        return self._once(("recipe", name), load)

    def recipe_doc(self) -> Optional[dict[str, Any]]:
        try:
            read = self.recipe()
        except AwsError:
            return None
        return read.doc if read else None

    def spec(self) -> FleetSpec:
        """min/max/warm/idle/memory from the reconciler's environment, else the recipe."""
        env = self.reconciler_env()
        doc = self.recipe_doc() or {}
        scaling = doc.get("scaling") or {}
        project = doc.get("project") or {}
        serve = project.get("serve") or {}
        # the product's [serve] idle_seconds: 0 is off, absent is its default of 300 s
        recipe_idle = (serve.get("idle_seconds") or None) if "idle_seconds" in serve else (300 if doc else None)
        sources: dict[str, str] = {}

        def pick(key: str, env_key: str, recipe_value: Any) -> Optional[int]:
            raw = env.get(env_key)
            if raw not in (None, ""):
                try:
                    sources[key] = "reconciler"
                    return int(float(raw))
                except ValueError:
                    pass
            if isinstance(recipe_value, (int, float)) and not isinstance(recipe_value, bool):
                sources[key] = "recipe"
                return int(recipe_value)
            return None

        memory = None
        try:
            versions = self.image_versions() if self.image_arn() else []
        except AwsError:
            versions = []
        active = _active(versions, env.get("IMAGE_VERSION"))
        for resource in (active or {}).get("resources") or []:
            memory = resource.get("minimumMemoryInMiB")
            sources["memory_mib"] = "image"
        if memory is None and doc:
            memory, sources["memory_mib"] = int((project.get("image") or {}).get("memory_mib", 2048)), "recipe"
        return FleetSpec(
            min_vms=pick("min_vms", "MIN_VMS", scaling.get("minVms")),
            max_vms=pick("max_vms", "MAX_VMS", scaling.get("maxVms")),
            warm_vms=pick("warm_vms", "WARM_VMS", scaling.get("warmVms")),
            idle_seconds=pick("idle", "IDLE_SECONDS", recipe_idle),
            memory_mib=memory,
            sources=sources,
        )


def _active(versions: list[dict[str, Any]], preferred: Optional[str]) -> Optional[dict[str, Any]]:
    """The version the fleet runs: ``preferred`` when listed, else the newest ACTIVE, SUCCESSFUL one."""
    usable = [v for v in versions if v.get("status") == "ACTIVE" and v.get("state") == "SUCCESSFUL"]
    for v in versions:
        if preferred and v.get("imageVersion") == preferred:
            return v
    return max(usable, key=lambda v: (str(v.get("createdAt") or ""), version_key(v.get("imageVersion"))), default=None)


def version_key(version: Any) -> tuple:
    """``1.10`` after ``1.9``: compare versions by their numeric parts."""
    parts = []
    for part in str(version or "").split("."):
        parts.append((0, int(part), "") if part.isdigit() else (1, 0, part))
    return tuple(parts)


def recipe_properties(ctx: "Context") -> Optional[dict[str, Any]]:
    """The recipe resource's properties in the deployed template, resolved where they can be
    (unresolvable ones are left as they are). None when the template has no recipe resource."""
    resource = ctx.fleet.recipe_resource
    if resource is None:
        return None
    declared = (ctx.template().get("Resources") or {}).get(resource.logical_id)
    if not isinstance(declared, dict):
        return None
    out = {}
    for key, value in (declared.get("Properties") or {}).items():
        try:
            out[key] = _resolve(ctx, value)
        except Unresolved:
            out[key] = value
    return out


def _resolve(ctx: "Context", value: Any) -> Any:
    stack = ctx.fleet.stack
    physical = {r.logical_id: r.physical_id for r in stack.resources if r.physical_id}
    types = {r.logical_id: r.type for r in stack.resources}
    pseudo = {"AWS::Region": ctx.region, "AWS::AccountId": ctx.account or "", "AWS::Partition": ctx.partition,
              "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": stack.name, "AWS::StackId": stack.stack_id}

    def attribute(lid: str, attr: str) -> Optional[str]:
        kind = types.get(lid)
        if kind == "AWS::Lambda::MicrovmImage":
            if attr == "ImageArn":
                return physical.get(lid)
            if attr == "LatestActiveImageVersion":
                # What the deploy saw: the reconciler got the same attribute in the same deploy.
                return ctx.reconciler_env().get("IMAGE_VERSION") or _latest(ctx)
        if kind == "AWS::KMS::Key" and attr == "Arn" and physical.get(lid):
            return ctx.arn("kms", f"key/{physical[lid]}")
        return None
    return resolve(value, pseudo=pseudo, physical=physical, attribute=attribute)


def _latest(ctx: "Context") -> Optional[str]:
    try:
        return ctx.image().get("latestActiveImageVersion")
    except AwsError:
        return None
