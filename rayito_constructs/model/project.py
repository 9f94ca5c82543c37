"""The agent project: a Rayito agent folder as ``rayito agent deploy`` reads it, after its flags.

``AgentProject.load(folder, **flags)`` runs the product's own loader, detection and deploy flags
(:mod:`rayito_constructs.model.product`): a folder the product deploys loads here unchanged, one it
refuses is refused with its reason, in one line that names the key or flag and the value. What
this library adds to a fleet (per-target egress envelopes, the stack's switches) comes from
``rayito-constructs.toml`` next to the project file (:mod:`rayito_constructs.model.fleet_file`), never
from ``rayito-agent.toml``, whose loader refuses keys it does not know.

The refusals this library adds to the product's, because a fleet it deploys would break
otherwise (docs/options.md, "Refused here, accepted by the product"):

* ``[image] memory_mib`` must be a MicroVM size class the stack can build and the product accepts
  (2048, 4096 or 8192): the product's floor is 2048, and an image build takes only the classes;
* the fleet's name (``[image] template``, else ``name``) names the image and the recipe: 1 to 64
  of ``[A-Za-z0-9_-]``.

Loading is pure: no AWS call, no CDK, nothing written into the folder.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Union

from .errors import FleetWarning, Problem, ProjectError, did_you_mean, show
from .fleet_file import FleetFile
from .names import fleet_name_problem, stack_name_for
from .options import EgressOptions, max_concurrency_limit, vcpus_for
from .overrides import name_what_was_typed
from .product import (
    FLAG_NAMES,
    PRODUCT_VERSION,
    DeployFlags,
    ProductProject,
    RecipeWarning,
    ScalingOptions,
    MISSING,
    decode,
    has_project_file,
    load,
    value_at,
)

PROJECT_FILE = "rayito-agent.toml"
Source = Literal["explicit", "project", "recipe", "default"]

#: The MicroVM size classes a fleet's image may have: the service's classes from the product's
#: floor of 2048 MiB up.
FLEET_MEMORY_CLASSES_MIB = (2048, 4096, 8192)
#: The product's default serve port of the agent host (``ServeOptions.port``).
ARCHITECTURE = "ARM_64"


@dataclass(frozen=True)
class Serve:
    """How one VM serves sessions: the product's ``ServeOptions`` after the flags."""

    port: int
    timeout_seconds: float
    idle: Optional[int]
    """Idle seconds before a VM is suspended (``[serve] idle_seconds``; ``None``: never)."""
    max_concurrency: int
    queue_max: int
    queue_timeout_seconds: float


@dataclass(frozen=True)
class Scaling:
    """How many VMs the fleet keeps: the recipe's ``scaling``, and the idle policy of ``[serve]``."""

    min_vms: int
    max_vms: int
    warm_vms: int
    sessions: str
    scale_in_after_seconds: int
    idle: Optional[int]


@dataclass(frozen=True)
class Image:
    """The fleet's MicroVM image: named after the fleet, ARM_64 (the product's only one)."""

    name: str
    memory_mib: int
    architecture: str = ARCHITECTURE


@dataclass(frozen=True)
class AgentProject:
    """One agent folder, its flags and this library's fleet settings.

    Build it with :meth:`load` (a folder) or :meth:`from_recipe` (a recipe the product saved).
    """

    product: ProductProject
    """The product's project after detection, flags and preflight: what the recipe embeds."""
    product_scaling: ScalingOptions
    """The fleet's scaling as the recipe records it (flags over the file over the defaults)."""
    folder: Optional[Path] = None
    flags: DeployFlags = field(default_factory=DeployFlags)
    fleet: FleetFile = field(default_factory=FleetFile)
    save_recipe: bool = True
    renew_gateway_keys: bool = False
    sources: Mapping[str, Source] = field(default_factory=dict)
    warnings: tuple[FleetWarning, ...] = ()
    scaling_source: Source = "default"
    """Where the scaling came from: ``explicit`` (flags), ``project`` (the file), ``recipe`` or
    ``default``, as the product's ``FleetStatus.scaling_source``."""

    # ------------------------------------------------------------------ making one

    @classmethod
    def load(cls, folder: Union[str, os.PathLike[str]], *, region: Optional[str] = None,
             fleet_file: Optional[FleetFile] = None, **flags: Any) -> "AgentProject":
        """Read ``folder`` as ``rayito agent deploy <folder> <flags>`` would.

        :param flags: the deploy flags by their product names (``min_vms``, ``max_vms``, ``warm``,
            ``sessions``, ``scale_in_after``, ``max_sessions``, ``queue``, ``queue_timeout``,
            ``idle``, ``timeout``, ``port``, ``memory``, ``env``, ``secret_env``,
            ``secret_env_from``, ``allow_out``, ``save_recipe``, ``renew_gateway_keys``, and
            detection's ``framework``, ``language``, ``entry``, ``protocol``...): see
            :class:`~rayito_constructs.model.product.DeployFlags`.
        :param region: the region detection names a model gateway for (the product's
            ``--region``). Default: the file's ``[deploy] region``, else ``AWS_REGION``.
        :param fleet_file: this library's settings. Default: ``rayito-constructs.toml`` in the
            folder when there is one, else none.
        """
        try:
            return cls.from_flags(folder, region=region, fleet_file=fleet_file, flags=flags)
        except ProjectError as exc:  # named by the keyword given here (max_vms: ...), not --max-vms
            raise ProjectError(name_what_was_typed(exc.problems, set(flags), context=False, keyword=True)) from None

    @classmethod
    def from_flags(cls, folder: Union[str, os.PathLike[str]], *, region: Optional[str] = None,
                   fleet_file: Optional[FleetFile] = None, flags: Mapping[str, Any]) -> "AgentProject":
        """:meth:`load`, its problems naming ``rayito agent deploy``'s flags (``--max-vms: ...``),
        as ``plan`` and ``app.py`` report them (each then names what was typed there)."""
        path = Path(folder)
        if not path.is_dir():
            raise ProjectError([Problem("folder", f"folder: {str(folder)!r} is not a folder")])
        deploy_flags = flags_from({name: _pairs(name, value) for name, value in flags.items()})
        loaded = load(path, deploy_flags, region=region)
        settings = fleet_file if fleet_file is not None else FleetFile.read(path)
        warnings = [] if has_project_file(path) else [FleetWarning(
            "no_project_file", f"{path} has no {PROJECT_FILE}: the product's detection decided the project")]
        return cls._checked(
            product=loaded.project, product_scaling=loaded.scaling, folder=path.resolve(), flags=deploy_flags,
            fleet=settings, save_recipe=loaded.save_recipe, renew_gateway_keys=loaded.renew_gateway_keys,
            sources=_sources(loaded.document, deploy_flags), warnings=tuple(warnings),
            scaling_source=_scaling_source(loaded.document, deploy_flags))

    @classmethod
    def from_recipe(cls, value: str, *, fleet_file: Optional[FleetFile] = None) -> "AgentProject":
        """The project a recipe value (as the product stores it) rebuilds, as its client reads it;
        raises :class:`ProjectError` (``recipe_unreadable``) for a value it cannot read."""
        try:
            fleet_recipe, product = decode(value)
        except RecipeWarning as exc:
            raise ProjectError([Problem("recipe", f"recipe: not a recipe rayito {PRODUCT_VERSION} reads ({exc})")]) from None
        sources: dict[str, Source] = {key: "recipe" for key in _SOURCE_KEYS}
        return cls._checked(product=product, product_scaling=fleet_recipe.scaling, fleet=fleet_file or FleetFile(),
                            renew_gateway_keys=fleet_recipe.renew_gateway_keys, sources=sources,
                            scaling_source="recipe")

    @classmethod
    def _checked(cls, **kwargs: Any) -> "AgentProject":
        project = cls(**kwargs)
        problems = project._own_rules()
        if problems:
            raise ProjectError(problems)
        return project

    def _own_rules(self) -> list[Problem]:
        """What a fleet of this library needs beyond the product's rules (module docstring)."""
        problems = []
        memory = self.product.memory_mib
        if memory not in FLEET_MEMORY_CLASSES_MIB:
            key, typed = ("--memory", self.flags.memory) if self.flags.memory is not None else ("image.memory_mib", memory)
            classes = ", ".join(str(c) for c in FLEET_MEMORY_CLASSES_MIB)
            problems.append(Problem("memory", f"{key}: {show(typed)} is not a MicroVM size class the fleet's image "
                                              f"can have ({classes} MiB)"))
        why = fleet_name_problem(self.name)
        if why is not None:
            key = "image.template" if self.product.template else "name"
            problems.append(Problem(key, f"{key}: {why}"))
        return problems

    def with_flags(self, **flags: Any) -> "AgentProject":
        """The same folder with more flags (the ones given here win); needs a folder."""
        if self.folder is None:
            raise ValueError("with_flags: this project was rebuilt from a recipe, it has no folder")
        merged = {**self.flags.given(), **{k: v for k, v in flags.items() if v is not None}}
        return type(self).load(self.folder, fleet_file=self.fleet, **merged)

    # ------------------------------------------------------------------ what it is

    @property
    def name(self) -> str:
        """The fleet's name: the product's ``[image] template``, else ``name``; it names the image,
        the recipe parameter and the labels of the fleet's VMs."""
        return self.product.template or self.product.name

    @property
    def stack_name(self) -> str:
        """The stack ``app.py`` makes for this fleet."""
        return stack_name_for(self.name)

    @property
    def recipe_parameter_name(self) -> str:
        return f"/rayito/agents/{self.name}/recipe"

    @property
    def serve(self) -> Serve:
        s = self.product.serve
        return Serve(port=s.port, timeout_seconds=s.timeout_seconds,
                     idle=s.idle.max_idle_seconds if s.idle is not None else None,
                     max_concurrency=s.max_concurrency, queue_max=s.queue_max,
                     queue_timeout_seconds=s.queue_timeout_seconds)

    @property
    def scaling(self) -> Scaling:
        s = self.product_scaling
        return Scaling(min_vms=s.min_vms, max_vms=s.max_vms, warm_vms=s.warm_vms, sessions=s.sessions,
                       scale_in_after_seconds=int(s.scale_in_after_seconds), idle=self.serve.idle)

    @property
    def image(self) -> Image:
        return Image(name=self.name, memory_mib=self.product.memory_mib)

    @property
    def vcpus(self) -> int:
        return vcpus_for(self.product.memory_mib)

    @property
    def max_concurrency_limit(self) -> int:
        return max_concurrency_limit(self.product.memory_mib)

    @property
    def env(self) -> dict[str, str]:
        """Plain environment variables of the agent (``[env]`` and ``--env``)."""
        return dict(self.product.env)

    @property
    def secret_env(self) -> dict[str, str]:
        """Secret environment variables: name -> the Secrets Manager id the value comes from."""
        out = {}
        for name, ref in self.product.secret_env.items():
            out[name] = getattr(ref, "secret", None) or str(ref)
        return out

    @property
    def allow_out(self) -> tuple[str, ...]:
        """Hosts the agent may reach (``[network] allow_out``, or ``--allow-out``)."""
        return tuple(self.product.network.allow_out) if self.product.network is not None else ()

    @property
    def egress(self) -> EgressOptions:
        """The per-target egress envelopes (``rayito-constructs.toml``'s ``[egress]``)."""
        return self.fleet.egress

    @property
    def gateways(self) -> tuple[str, ...]:
        return tuple(self.product.gateways)

    @property
    def runtime(self) -> str:
        """The runtime's kind (``custom``, ``strands``, ``langgraph``...)."""
        runtime = self.product.to_dict().get("runtime")
        return str(runtime.get("kind")) if isinstance(runtime, Mapping) else "unknown"

    def to_product_dict(self) -> dict[str, object]:
        """The product's canonical project document (what the recipe's ``project`` holds)."""
        return self.product.to_dict()


def _pairs(name: str, value: Any) -> Any:
    """``env`` and ``secret_env`` as a mapping too (NAME -> value or secret id), as ``-c
    env='{"A": "1"}'`` takes them: the flag's ``NAME=VALUE`` strings, each name and value checked."""
    if name not in ("env", "secret_env") or not isinstance(value, Mapping):
        return value
    problems = [Problem(name, f"{FLAG_NAMES[name]}: {key!r}: a name is a string without '='")
                for key in value if not isinstance(key, str) or "=" in key or not key.strip()]
    problems += [Problem(name, f"{FLAG_NAMES[name]}: {key}: {show(given)} is not a string")
                 for key, given in value.items() if not isinstance(given, str)]
    if problems:
        raise ProjectError(problems)
    return tuple(f"{key}={given}" for key, given in value.items())


def flags_from(flags: Mapping[str, Any]) -> DeployFlags:
    """Deploy flags from keyword arguments, each checked for its type; unknown names are errors."""
    known = {f.name: f for f in dataclasses.fields(DeployFlags)}
    problems = []
    values: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None:
            continue
        spec = known.get(name)
        if spec is None:
            problems.append(Problem(name, f"{name}: unknown flag of rayito agent deploy{did_you_mean(name, known)}"))
            continue
        checked = _typed(name, spec.type, value)
        if isinstance(checked, Problem):
            problems.append(checked)
        else:
            values[name] = checked
    if problems:
        raise ProjectError(problems)
    return DeployFlags(**values)


_INT_FLAGS = {"min_vms", "max_vms", "warm", "scale_in_after", "max_sessions", "queue", "idle", "port", "memory"}
_FLOAT_FLAGS = {"queue_timeout", "timeout"}
_BOOL_FLAGS = {"save_recipe", "renew_gateway_keys"}
_LIST_FLAGS = {"env", "secret_env", "secret_env_from", "allow_out"}


def _typed(name: str, _annotation: object, value: Any) -> Any:
    flag = FLAG_NAMES[name]
    if name in _INT_FLAGS:
        if isinstance(value, bool) or not isinstance(value, int):
            return Problem(name, f"{flag}: {show(value)} is not a whole number")
        return value
    if name in _FLOAT_FLAGS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return Problem(name, f"{flag}: {show(value)} is not a number of seconds")
        return value
    if name in _BOOL_FLAGS:
        if not isinstance(value, bool):
            return Problem(name, f"{flag}: {show(value)} is not true or false")
        return value
    if name in _LIST_FLAGS:
        items = (value,) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            return Problem(name, f"{flag}: {show(value)} is not a list of strings")
        return tuple(items)
    if not isinstance(value, str):
        return Problem(name, f"{flag}: {show(value)} is not a string")
    return value


#: The keys ``plan`` shows with their origin, and the file key and flag each one comes from.
_SOURCE_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "name": ("name", ()),
    "max_concurrency": ("serve.max_concurrency", ("max_sessions",)),
    "queue_max": ("serve.queue_max", ("queue",)),
    "queue_timeout_seconds": ("serve.queue_timeout_seconds", ("queue_timeout",)),
    "timeout_seconds": ("serve.timeout_seconds", ("timeout",)),
    "port": ("serve.port", ("port",)),
    "idle_seconds": ("serve.idle_seconds", ("idle",)),
    "min_vms": ("scaling.min_vms", ("min_vms",)),
    "max_vms": ("scaling.max_vms", ("max_vms",)),
    "warm_vms": ("scaling.warm_vms", ("warm",)),
    "sessions": ("scaling.sessions", ("sessions",)),
    "scale_in_after_seconds": ("scaling.scale_in_after_seconds", ("scale_in_after",)),
    "memory_mib": ("image.memory_mib", ("memory",)),
    "env": ("env", ("env",)),
    "secret_env": ("secret_env", ("secret_env", "secret_env_from")),
    "allow_out": ("network.allow_out", ("allow_out",)),
}


def _sources(document: Mapping[str, Any], flags: DeployFlags) -> dict[str, Source]:
    given = flags.given()
    out: dict[str, Source] = {}
    for key, (file_key, flag_names) in _SOURCE_KEYS.items():
        if any(name in given for name in flag_names):
            out[key] = "explicit"
        elif value_at(document, file_key) is not MISSING:
            out[key] = "project"
        else:
            out[key] = "default"
    return out


def _scaling_source(document: Mapping[str, Any], flags: DeployFlags) -> Source:
    given = flags.given()
    if any(name in given for name in ("min_vms", "max_vms", "warm", "sessions", "scale_in_after")):
        return "explicit"
    return "project" if isinstance(document.get("scaling"), Mapping) else "default"
