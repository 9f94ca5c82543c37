"""The product, ``rayito`` 0.17: the one module that calls its code for formats it defines.

A fleet this library deploys must be a Rayito fleet: the product's client and CLI read its recipe
and its loader reads its folder. So the project file, the detection, the flags of
``rayito agent deploy`` and the recipe are the product's own functions, called here in the order
``rayito agent deploy`` calls them (``rayito/cli/agent.py``, ``deploy``), never copied:

1. ``--env`` pairs and the secret-name rule of the flag (``reject_secret_env_flags``);
2. the folder: the project file and detection (``project_for``: what deploy validates, not
   ``AgentProject.load``, since detection may add ``runtime`` keys);
3. the serve flags, then the project flags (memory, env, allow-out, secret env), then the scaling
   flags (``scaling_of``), in that order (``--max-sessions`` is checked against the file's memory,
   as deploy checks it);
4. the secret env and the preflight that adds the default ``source.exclude`` patterns, with ports
   that make no AWS call: a synth cannot look up secrets, so every gateway secret is taken to
   exist under its declared name (what a deploy would find, unless it renames one with
   ``--secret``, which this library does not offer);
5. the fleet's scaling as the recipe records it (``fleet_settings_of``).

Nothing here calls AWS, writes a file or opens a socket. The product's errors become
:class:`~rayito_constructs.model.errors.Problem` lines that name the key or flag, the value and the
product's own reason.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from rayito import AgentDeployOptions
from rayito import AgentProject as ProductProject
from rayito import ScalingOptions
from rayito._agent._deploy_facade import DeployPorts, preflight
from rayito._agent._deploy_plan import deploy_scaling, project_for
from rayito._agent._detect_report import DetectionReport
from rayito._agent._fleet_base import fleet_settings_of
from rayito._agent._fleet_recipe import (
    RECIPE_ENCODING_GZIP,
    FleetRecipe,
    RecipeWarning,
    canonical_json,
    decode_recipe,
    encode_recipe,
    recipe_document,
    recipe_from_document,
    recipe_of,
    recipe_parameter_name,
    recipe_project,
)
from rayito._agent._project_file import read_project_document
from rayito._agent._secret_env_deploy import prepare_secret_env
from rayito._agent._secret_env_project import parse_secret_env_flags, parse_secret_env_from_flags
from rayito.cli._agent_deploy import apply_project_flags, apply_serve_flags, parse_pairs, reject_secret_env_flags
from rayito.cli.agent import detect_overrides_of, scaling_of
from rayito.exceptions import SandboxException

from .errors import Problem, ProjectError, show

__all__ = [
    "PRODUCT_VERSION", "DeployFlags", "FleetRecipe", "Loaded", "ProductProject", "RecipeWarning",
    "ScalingOptions", "canonical_json", "decode", "encode", "encoding_of", "load", "recipe", "recipe_parameter_name",
]

#: The product's version this library runs (the recipe's ``savedBy`` is ``python/<it>``).
PRODUCT_VERSION = importlib.metadata.version("rayito")
#: The project files the product reads, first found wins (``rayito._limits.PROJECT_FILES``).
PROJECT_FILES = ("rayito-agent.toml", "rayito-agent.json")

T = TypeVar("T")


@dataclass(frozen=True)
class DeployFlags:
    """The flags of ``rayito agent deploy`` this library takes, with the product's names and types
    (``None`` or empty: not given, the file or the product's default decides).

    Scaling flags reach only the recipe's top-level ``scaling`` (as in the product), the others
    the project the recipe embeds.
    """

    min_vms: Optional[int] = None
    max_vms: Optional[int] = None
    warm: Optional[int] = None
    sessions: Optional[str] = None
    scale_in_after: Optional[int] = None
    max_sessions: Optional[int] = None
    queue: Optional[int] = None
    queue_timeout: Optional[float] = None
    idle: Optional[int] = None
    timeout: Optional[float] = None
    port: Optional[int] = None
    memory: Optional[int] = None
    env: tuple[str, ...] = ()
    """``NAME=VALUE`` pairs (``--env``): added to the file's ``[env]``, a flag wins."""
    secret_env: tuple[str, ...] = ()
    """``NAME=<secret id>[#key]`` (``--secret-env``): a Secrets Manager id, never a value."""
    secret_env_from: tuple[str, ...] = ()
    allow_out: tuple[str, ...] = ()
    """Hosts (``--allow-out``): they replace the file's ``[network] allow_out``."""
    save_recipe: Optional[bool] = None
    renew_gateway_keys: Optional[bool] = None
    framework: Optional[str] = None
    language: Optional[str] = None
    entry: Optional[str] = None
    protocol: Optional[str] = None
    model_id: Optional[str] = None
    model_provider: Optional[str] = None
    model_base_url: Optional[str] = None
    graph: Optional[str] = None

    def given(self) -> dict[str, object]:
        """The flags that were given, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) not in (None, ())}


#: Each flag's spelling on the command line of ``rayito agent deploy``.
FLAG_NAMES: dict[str, str] = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(DeployFlags)}
FLAG_NAMES.update({"save_recipe": "--no-save-recipe", "entry": "--entry"})

_SERVE_FLAGS = (("max_sessions", "max_sessions"), ("idle", "idle_seconds"), ("queue", "queue"),
                ("queue_timeout", "queue_timeout"), ("timeout", "timeout"), ("port", "port"))
_SCALING_FLAGS = ("min_vms", "max_vms", "warm", "sessions", "scale_in_after")


@dataclass(frozen=True)
class Loaded:
    """A folder as ``rayito agent deploy`` would deploy it with the flags given."""

    project: ProductProject
    """After detection, flags, secret env and preflight: the project the recipe embeds."""
    scaling: ScalingOptions
    """The fleet's scaling (the recipe's ``scaling``): flags over the file over the defaults."""
    scaling_flags: Optional[ScalingOptions]
    """What the scaling flags set (``None``: none was given; the project decides)."""
    report: Optional[DetectionReport]
    document: Mapping[str, Any]
    """The project file as read (``{}`` without one), to show values in errors and sources."""
    renew_gateway_keys: bool
    save_recipe: bool


class _AssumeSecretsExist:
    """The preflight's secret store at synth: every gateway secret exists under its declared name
    (a synth makes no AWS call; the reconciler reads them at run time with its own grants)."""

    def exists(self, name: str) -> bool:
        return True

    def create(self, name: str, value: str, *, metadata: Any = None) -> None:  # pragma: no cover
        raise AssertionError("the synth-time preflight never creates a secret")


class _NoAws:
    """The preflight's AWS at synth: unused, since nothing is built by the product here
    (``build_image=False``: no bucket lookup, no base image read)."""

    def _unused(self, *args: Any) -> Any:  # pragma: no cover
        raise AssertionError("the synth-time preflight makes no AWS call")

    @property
    def resolved_region(self) -> str:  # pragma: no cover - read only to find a bucket for a build
        raise AssertionError("the synth-time preflight makes no AWS call")

    account_id = bucket_exists = artifact_stack_bucket = image_exists = _unused


def load(folder: Path, flags: DeployFlags, *, region: Optional[str]) -> Loaded:
    """``folder`` with ``flags`` as ``rayito agent deploy`` reads them; raises :class:`ProjectError`
    with the product's reason (one problem: the product stops at its first)."""
    document = _document(folder)
    env = _step(lambda: parse_pairs(list(flags.env), "--env"), flag="env", value=flags.env)
    _step(lambda: reject_secret_env_flags(env), flag="env", value=flags.env)
    overrides = _step(lambda: detect_overrides_of(flags.framework, flags.language, flags.entry, flags.protocol,
                                                  flags.model_id, flags.model_provider, flags.model_base_url,
                                                  graph=flags.graph),
                      flag="framework", value=None)
    project, report = _step(lambda: project_for(folder, None, overrides, region), document=document)
    project = _serve_flags(project, flags)
    secret_env = _step(lambda: parse_secret_env_flags(list(flags.secret_env)), flag="secret_env", value=flags.secret_env)
    secret_from = _step(lambda: parse_secret_env_from_flags(list(flags.secret_env_from)),
                        flag="secret_env_from", value=flags.secret_env_from)
    project = _project_flags(project, flags, env, secret_env, secret_from)
    scaling_flags = _scaling_flags(project, flags)
    options = AgentDeployOptions(scaling=scaling_flags, build_image=False,
                                 renew_gateway_keys=bool(flags.renew_gateway_keys),
                                 save_recipe=flags.save_recipe is not False)
    project = _step(lambda: prepare_secret_env(project, None, check_env=False).project, document=document)
    ports = DeployPorts(aws=_NoAws(), store=_AssumeSecretsExist(), environ={})
    flight = _step(lambda: preflight(project, options, ports, region=region, session=None),
                   flag="renew_gateway_keys" if flags.renew_gateway_keys else None, value=True, document=document)
    scaling = fleet_settings_of(flight.project, deploy_scaling(flight.project, options)).scaling
    return Loaded(project=flight.project, scaling=scaling, scaling_flags=scaling_flags, report=report,
                  document=document, renew_gateway_keys=options.renew_gateway_keys, save_recipe=options.save_recipe)


def _serve_flags(project: ProductProject, flags: DeployFlags) -> ProductProject:
    kwargs = {arg: getattr(flags, name) for name, arg in _SERVE_FLAGS}
    try:
        return apply_serve_flags(project, **kwargs)
    except SandboxException as exc:
        # The product applies them together; which one it refused is found by applying the given
        # ones one by one (a refusal only the whole set meets names them all).
        raise _flag_error(exc, [name for name, arg in _SERVE_FLAGS if kwargs[arg] is not None],
                          lambda name: apply_serve_flags(project, **{a: (kwargs[a] if n == name else None)
                                                                     for n, a in _SERVE_FLAGS}),
                          flags) from None


def _project_flags(project: ProductProject, flags: DeployFlags, env: Mapping[str, str],
                   secret_env: Any, secret_from: Any) -> ProductProject:
    args: dict[str, Any] = {"memory": flags.memory, "env": env, "allow_out": list(flags.allow_out),
                            "secret_env": secret_env, "secret_env_from": secret_from}
    empty: dict[str, Any] = {"memory": None, "env": {}, "allow_out": [], "secret_env": {}, "secret_env_from": ()}
    names = {"memory": "memory", "env": "env", "allow_out": "allow_out", "secret_env": "secret_env",
             "secret_env_from": "secret_env_from"}
    try:
        return apply_project_flags(project, **args)
    except SandboxException as exc:
        given = [key for key in args if args[key] not in (None, {}, [], ())]
        raise _flag_error(exc, [names[k] for k in given],
                          lambda name: apply_project_flags(project, **{**empty, name: args[name]}), flags) from None


def _scaling_flags(project: ProductProject, flags: DeployFlags) -> Optional[ScalingOptions]:
    values = [getattr(flags, name) for name in _SCALING_FLAGS]
    try:
        return scaling_of(project, *values)
    except SandboxException as exc:
        given = [name for name in _SCALING_FLAGS if getattr(flags, name) is not None]
        raise _flag_error(exc, given, lambda name: scaling_of(
            project, *[getattr(flags, n) if n == name else None for n in _SCALING_FLAGS]), flags,
            limit=_scaling_limit(_reason(exc), project, flags)) from None


#: The product's scaling refusals that name a limit without its value (``ScalingOptions``), and
#: how to say that value from the scaling the flags would make (flags over the project's).
_SCALING_LIMITS: tuple[tuple[str, Callable[[Mapping[str, int]], str]], ...] = (
    ("ScalingOptions.min_vms no puede superar a max_vms", lambda s: f"max_vms is {s['max_vms']}"),
    ("ScalingOptions.warm_vms no puede superar a max_vms - min_vms",
     lambda s: f"max_vms - min_vms is {s['max_vms']} - {s['min_vms']} = {s['max_vms'] - s['min_vms']}"),
)


def _scaling_limit(reason: str, project: ProductProject, flags: DeployFlags) -> Optional[str]:
    """The value of the limit a scaling refusal names (``max_vms is 2``), or None."""
    say = next((say for start, say in _SCALING_LIMITS if reason.startswith(start)), None)
    if say is None:
        return None
    current = fleet_settings_of(project, None).scaling  # what scaling_of puts under the flags
    given = {"min_vms": flags.min_vms, "max_vms": flags.max_vms, "warm_vms": flags.warm}
    return say({key: getattr(current, key) if value is None else value for key, value in given.items()})


def _flag_error(exc: Exception, given: Sequence[str], alone: Callable[[str], object], flags: DeployFlags,
                limit: Optional[str] = None) -> ProjectError:
    """The product's refusal of the ``given`` flags, naming the one (or, when no one alone is
    refused, all) with its value, then the product's reason and, when the reason names a limit
    without its value (``no puede superar a max_vms``), that value: ``(max_vms is 2)``."""
    culprits = []
    for name in given:
        try:
            alone(name)
        except SandboxException:
            culprits.append(name)
    names = culprits if len(culprits) == 1 else list(given)
    typed = ", ".join(f"{FLAG_NAMES[name]}: {show_flag(getattr(flags, name), name)}" for name in names)
    told = f" ({limit})" if limit else ""
    return ProjectError([Problem(names[0], f"{typed}: {_reason(exc)}{told}", related=tuple(names))])


#: Flags whose values may hold a secret by mistake: an error shows only the names before ``=``.
_NAMES_ONLY = frozenset({"env", "secret_env", "secret_env_from"})


def show_flag(value: object, name: str = "") -> str:
    """A flag's value as typed (a repeated flag's values joined by spaces); for ``--env`` and
    the secret flags only the variables' names: a value refused as credential-shaped is never
    printed back (errors end up in CI logs)."""
    if isinstance(value, tuple):
        if name in _NAMES_ONLY:
            return " ".join(str(v).partition("=")[0].partition(",")[0] for v in value)
        return " ".join(repr(v) for v in value)
    return show(value)


def _step(call: Callable[[], T], *, flag: Optional[str] = None, value: object = None,
          document: Optional[Mapping[str, Any]] = None) -> T:
    try:
        return call()
    except SandboxException as exc:
        if flag is not None:
            text = " ".join(str(exc).split())  # the product's whole message: its own path says which entry
            raise ProjectError([Problem(flag, f"{FLAG_NAMES[flag]}: {show_flag(value, flag)}: {text}")]) from None
        raise ProjectError([file_problem(exc, document or {})]) from None


#: Product errors that carry no path (``AgentProject.__post_init__`` and friends): the key they
#: are about, by the start of their message.
_PATHLESS = (
    ("AgentProject.memory_mib", "image.memory_mib"),
    ("AgentProject.name", "name"),
    ("nombre", "name"),
    ("NetworkPolicy", "network"),
    ("AgentProject.network", "network"),
    ("AgentProject.env", "env"),
    ("AgentProject.secret_env", "secret_env"),
    ("ServeOptions", "serve"),
    ("ScalingOptions", "scaling"),
    ("renew_gateway_keys", "renew_gateway_keys"),
)


def file_problem(exc: Exception, document: Mapping[str, Any]) -> Problem:
    """A refusal of the project file (or of detection) as one line: the key, its value in the file
    when it has one, and the product's reason."""
    path = getattr(exc, "path", None)
    reason = _reason(exc)
    if not path:
        path = next((key for prefix, key in _PATHLESS if reason.startswith(prefix)), "rayito-agent.toml")
    value = value_at(document, path)
    code = getattr(exc, "code", None)
    # a value the product refused as secret-looking is never printed back
    shown = "" if value is MISSING or code == "secret_value" else f" = {show(value)}"
    tag = f" ({code})" if code else ""
    return Problem(path, f"{path}{shown}: {reason}{tag}")


def _reason(exc: Exception) -> str:
    """The product's message on one line, without its own leading ``<path>: ``."""
    text = " ".join(str(exc).split())
    path = getattr(exc, "path", None)
    if path and text.startswith(f"{path}: "):
        text = text[len(path) + 2:]
    return text


MISSING = object()
_INDEX = re.compile(r"^(.*)\[(\d+)\]$")


def value_at(document: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path of the file (``serve.idle_seconds``, ``runtime.app.port``,
    ``gateways.model.models[0]``), or a marker when it has none."""
    node: Any = document
    for part in path.split("."):
        match = _INDEX.match(part)
        key, index = (match.group(1), int(match.group(2))) if match else (part, None)
        if not isinstance(node, Mapping) or key not in node:
            return MISSING
        node = node[key]
        if index is not None:
            if not isinstance(node, list) or index >= len(node):
                return MISSING
            node = node[index]
    return node


def _document(folder: Path) -> Mapping[str, Any]:
    try:
        return read_project_document(folder).data
    except Exception:  # noqa: BLE001 - the loader below says what is wrong with it
        return {}


def has_project_file(folder: Path) -> bool:
    return any((folder / name).is_file() for name in PROJECT_FILES)


# ---------------------------------------------------------------------------- the recipe


def recipe(loaded_project: ProductProject, scaling: ScalingOptions, *, renew_gateway_keys: bool,
           image_version: Optional[str]) -> FleetRecipe:
    """The product's recipe of a fleet of ``loaded_project`` (``AgentFleet._save_recipe``)."""
    return recipe_of(loaded_project, name=fleet_name(loaded_project), image_version=image_version,
                     scaling=scaling, renew_gateway_keys=renew_gateway_keys)


def fleet_name(project: ProductProject) -> str:
    """The fleet's (and its image's and recipe's) name: ``[image] template``, else ``name``."""
    return project.template or project.name


def encode(fleet_recipe: FleetRecipe) -> tuple[dict[str, object], Optional[str]]:
    """The recipe document and the value the product stores (``None``: ``recipe_too_large``)."""
    document = recipe_document(fleet_recipe)
    return document, encode_recipe(document)


def with_version(document: Mapping[str, object], image_version: Optional[str]) -> FleetRecipe:
    """A recipe document (as :func:`encode` made it) with the image version known at deploy."""
    return dataclasses.replace(recipe_from_document(document), image_version=image_version)


def encoding_of(value: str) -> Optional[str]:
    """How a stored recipe value is encoded, by the product's own envelope: ``gzip+base64`` for
    its ``{"schema", "encoding", "data"}`` envelope, ``json`` for a plain recipe document, ``None``
    for a value that is neither (not a JSON object, or an envelope of another encoding)."""
    try:
        document = json.loads(value)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    if "encoding" not in document:  # the product's decode_recipe reads such a value as the document
        return "json"
    return RECIPE_ENCODING_GZIP if document.get("encoding") == RECIPE_ENCODING_GZIP else None


def decode(value: str) -> tuple[FleetRecipe, ProductProject]:
    """A stored recipe value and the project it rebuilds, as the product's client reads them;
    raises :class:`RecipeWarning` (``recipe_unreadable``)."""
    fleet_recipe = decode_recipe(value)
    return fleet_recipe, recipe_project(fleet_recipe)
