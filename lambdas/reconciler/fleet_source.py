"""What the fleet is now: the product's recipe at ``/rayito/agents/<fleet>/recipe``, read each tick.

The recipe is the fleet's desired state for the product's client (``AgentFleet.connect`` reads its
project and scaling) and for the reconciler alike, so the two never disagree on what the fleet is:
the reconciler starts and serves each VM from the project the recipe embeds, keeps the recipe's
``scaling``, and runs the recipe's image version. It is read with the product's own decoder
(``decode_recipe``, ``recipe_project``), never parsed here.

Absent (``ParameterNotFound``), the fleet is off: ``rayito agent stop <fleet>`` ends every VM and
deletes the recipe, and the reconciler starts nothing until a deploy writes it again
(docs/reconciler.md, "Stop"). Unreadable (a throttle, KMS, a value the product cannot decode), the
last recipe this environment read stands, and the tick says why.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from rayito._agent._fleet_recipe import RecipeWarning, decode_recipe, recipe_parameter_name, recipe_project
from rayito._agent._project_domain import AgentProject
from rayito._agent._scaling_domain import ScalingOptions
from rayito._payload import validate_access_token
from rayito.exceptions import SandboxException

from . import answers
from .core import FleetSpec, Slot
from .product_launch import ProductLaunch


@dataclass(frozen=True)
class Deployed:
    """The fleet as its recipe describes it."""

    project: AgentProject
    scaling: ScalingOptions
    image_version: Optional[str]
    digest: str
    """The sha256 of the stored value: a deploy that changed the recipe changes it."""


@dataclass(frozen=True)
class Absent:
    """No recipe: the fleet was stopped (or never deployed)."""


@dataclass(frozen=True)
class Unreadable:
    """The recipe could not be read now; ``reason`` says why (never the value)."""

    reason: str


Read = Union[Deployed, Absent, Unreadable]


@dataclass
class RecipeSource:
    """Reads one fleet's recipe with the reconciler's SSM client (one attempt a call)."""

    ssm: Any
    fleet: str
    last: Optional[Deployed] = None

    @property
    def parameter(self) -> str:
        name = recipe_parameter_name(self.fleet)
        if name is None:  # uncovered: the construct refuses fleet names the product cannot name a recipe for
            raise ValueError(f"fleet {self.fleet!r} has no recipe parameter name")
        return name

    def read(self) -> Read:
        """The recipe now (the value decoded only when it changed)."""
        try:
            answer = self.ssm.get_parameter(Name=self.parameter, WithDecryption=True)
        except answers.ClientError as exc:
            code = answers.error_code(exc)
            if code == "ParameterNotFound":
                return Absent()
            return Unreadable(f"ssm:{code}")
        except answers.BotoCoreError as exc:
            return Unreadable(f"ssm:{type(exc).__name__}")
        value = (answer.get("Parameter") or {}).get("Value")
        if not isinstance(value, str):  # uncovered: SSM always answers a Value for a parameter it has
            return Unreadable("recipe_unreadable")
        digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
        if self.last is not None and self.last.digest == digest:
            return self.last
        return self.decode(value, digest)

    def current(self) -> Union[Deployed, str]:
        """The recipe to act on now: the value read, or the last one read when a read fails; else
        why there is none (``fleet_stopped``, ``recipe_unreadable:<why>``)."""
        read = self.read()
        if isinstance(read, Absent):
            return "fleet_stopped"
        if isinstance(read, Unreadable):
            return self.last if self.last is not None else f"recipe_unreadable:{read.reason}"
        return read

    def decode(self, value: str, digest: str) -> Read:
        try:
            recipe = decode_recipe(value)
            project = recipe_project(recipe)
        except RecipeWarning as warning:
            return Unreadable(warning.code)
        except SandboxException:  # uncovered: the product raises RecipeWarning for every value it cannot read
            return Unreadable("recipe_unreadable")
        self.last = Deployed(project, recipe.scaling, recipe.image_version, digest)
        return self.last


#: How long the fleet's access token is used before it is read again: a rotated token reaches the
#: VMs started this long after the rotation at most.
TOKEN_TTL_SECONDS = 300.0


@dataclass
class TokenSource:
    """The fleet's access token (Secrets Manager, the stack's ``rayito/agents/<fleet>/access-token``),
    read once per ``TOKEN_TTL_SECONDS``; only its sha256 leaves the function, in run payloads."""

    secrets: Any
    secret_id: str
    clock: Callable[[], float]
    value: Optional[str] = None
    read_at: float = float("-inf")

    def get(self) -> Union[str, Unreadable]:
        if self.value is not None and self.clock() - self.read_at < TOKEN_TTL_SECONDS:
            return self.value
        try:
            answer = self.secrets.get_secret_value(SecretId=self.secret_id)
        except (answers.ClientError, answers.BotoCoreError) as exc:
            if self.value is not None:  # a failed re-read keeps the token the VMs already carry
                return self.value
            return Unreadable(f"secretsmanager:{answers.error_code(exc)}")
        value = answer.get("SecretString")
        if not isinstance(value, str) or not value:
            return Unreadable("access_token_empty")
        try:
            validate_access_token(value)  # the product's rule: a VM started with any other would refuse every client
        except SandboxException:
            return Unreadable("access_token_invalid")
        self.value, self.read_at = value, self.clock()
        return value


@dataclass(frozen=True)
class Desired:
    """One tick's fleet: the spec the core plans with and how each slot's VM is started."""

    spec: FleetSpec
    launch: ProductLaunch
    deployed: Deployed


@dataclass
class FleetSource:
    """The fleet's desired state at each tick: the recipe's project, scaling and image version over
    what the environment says (``spec_from_env``), and the product's launch for its VMs."""

    env: Mapping[str, str]
    base: FleetSpec
    recipe: RecipeSource
    token: TokenSource
    region: str
    _launch: Optional[ProductLaunch] = None

    def desired(self) -> Union[tuple[FleetSpec, Callable[[Slot], dict[str, Any]]], str]:
        """The spec and the slots' run parameters now (``ports.FleetState``), or why there is none."""
        got = self.now()
        return got if isinstance(got, str) else (got.spec, got.launch)

    def now(self) -> Union[Desired, str]:
        """The fleet now, or why there is none (``fleet_stopped``, ``recipe_unreadable:<why>``,
        ``access_token_unreadable:<why>``): a tick without one makes no MicroVMs call."""
        read = self.recipe.current()
        if isinstance(read, str):
            return read
        token = self.token.get()
        if isinstance(token, Unreadable):
            return f"access_token_unreadable:{token.reason}"
        launch = self._launch_for(read, token)
        return Desired(spec_for(self.base, read, launch), launch, read)

    def _launch_for(self, deployed: Deployed, token: str) -> ProductLaunch:
        launch = self._launch
        version = deployed.image_version or self.base.image_version
        if (launch is None or launch.project is not deployed.project or launch.access_token != token
                or launch.image_version != version):
            launch = ProductLaunch(deployed.project, deployed.scaling, token, self.base.image_arn, self.region,
                                   image_version=version, execution_role_arn=self.base.execution_role_arn)
            self._launch = launch
        return launch


def spec_for(base: FleetSpec, deployed: Deployed, launch: ProductLaunch) -> FleetSpec:
    """``base`` (the environment's) with what the recipe decides: the scaling, the image version,
    the idle policy every VM gets, and the lifetime the product gives its VMs: ``rayd``'s
    deadline, its payload's ``lifecycle.timeout_s`` (a shorter ``MAX_LIFETIME_SECONDS`` caps it)."""
    scaling = deployed.scaling
    idle = deployed.project.serve.idle
    lifetime = min(base.max_lifetime_seconds, launch.logical_lifetime("member"))
    return dataclasses.replace(
        base, min_vms=scaling.min_vms, max_vms=scaling.max_vms, warm_vms=scaling.warm_vms,
        idle_seconds=int(idle.max_idle_seconds) if idle is not None else None,
        image_version=deployed.image_version or base.image_version, max_lifetime_seconds=int(lifetime), serve=True,
        rayd_deadline=launch.rayd_deadline("member"))
