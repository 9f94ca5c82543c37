"""The agent project: an agent folder and its ``rayito-agent.toml``, after overrides.

``AgentProject.load(folder, **overrides)`` reads the file, applies explicit overrides (the same
ones ``rayito agent deploy`` takes as flags), checks every option of the product page against its
limit and records where each value came from (``explicit``, ``project``, ``recipe`` or
``default``). Parsing and validation are pure: no AWS call, no CDK.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from .envrules import credential_problem, credential_shape, secret_reason
from .errors import FleetWarning, Problem, ProjectError, did_you_mean, show
from .options import (
    MEMORY_CLASSES_MIB,
    EgressOptions,
    GatewayOptions,
    ImageOptions,
    ScalingOptions,
    ServeOptions,
    max_concurrency_limit,
    vcpus_for,
)

PROJECT_FILE = "rayito-agent.toml"

Source = Literal["explicit", "project", "recipe", "default"]
Target = Literal["microvm", "agentcore"]

#: Options that size a fleet: AgentCore Runtime creates one microVM per session and has none of
#: them ("There is no fleet on AgentCore").
FLEET_OPTIONS = (
    "max_concurrency",
    "queue_max",
    "queue_timeout_seconds",
    "min_vms",
    "max_vms",
    "warm_vms",
    "sessions",
    "scale_in_after_seconds",
    "idle",
)

#: Every option that can be overridden, with its table in ``rayito-agent.toml`` and its flag.
OPTION_TABLE: dict[str, tuple[str, str]] = {
    "name": ("", "--name"),
    "target": ("", "--target"),
    "memory_mib": ("image", "--memory"),
    "max_concurrency": ("serve", "--max-sessions"),
    "queue_max": ("serve", "--queue"),
    "queue_timeout_seconds": ("serve", "--queue-timeout"),
    "min_vms": ("scaling", "--min-vms"),
    "max_vms": ("scaling", "--max-vms"),
    "warm_vms": ("scaling", "--warm"),
    "sessions": ("scaling", "--sessions"),
    "scale_in_after_seconds": ("scaling", "--scale-in-after"),
    "idle": ("scaling", "--idle"),
    "env": ("env", "--env"),
    "secret_env": ("", "--secret-env"),
    "allow_out": ("egress", "--allow-out"),
    "save_recipe": ("", "--no-save-recipe"),
}

_SECTIONS: dict[str, type[BaseModel]] = {
    "serve": ServeOptions,
    "scaling": ScalingOptions,
    "image": ImageOptions,
    "egress": EgressOptions,
}
_TOP_LEVEL_KEYS = (
    "name",
    "target",
    "instructions",
    "secret_env",
    "renew_gateway_keys",
    "save_recipe",
    "serve",
    "scaling",
    "image",
    "env",
    "egress",
    "gateways",
)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
_ENV_MAX_ENTRIES = 100  # the image's environment variable map holds at most 100 entries
_ENV_VALUE_MAX = 4096


class AgentProject(BaseModel):
    """An agent and its fleet options, validated, with the origin of every value.

    Build it with :meth:`load` (from a folder) or :meth:`from_recipe` (from a saved recipe).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    folder: Optional[Path] = None
    target: Target = "microvm"
    serve: ServeOptions = ServeOptions()
    scaling: ScalingOptions = ScalingOptions()
    image: ImageOptions = ImageOptions()
    egress: EgressOptions = EgressOptions()
    env: dict[str, str] = {}
    secret_env: tuple[str, ...] = ()
    gateways: tuple[GatewayOptions, ...] = ()
    instructions: Optional[str] = None
    renew_gateway_keys: bool = False
    save_recipe: bool = True
    sources: dict[str, Source] = {}
    """Where each option came from, by option name (``min_vms``, ``memory_mib``...)."""
    warnings: tuple[FleetWarning, ...] = ()

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, folder: str | os.PathLike[str], **overrides: Any) -> "AgentProject":
        """Read ``<folder>/rayito-agent.toml`` (optional) and apply explicit ``overrides``.

        Overrides are the library arguments of ``rayito agent deploy``'s flags: ``min_vms=2``,
        ``memory_mib=4096``, ``env={"LOG_LEVEL": "debug"}``, ``secret_env={"API_TOKEN": "..."}``
        (only the name is kept), ``save_recipe=False``, ``target="agentcore"``...

        Raises :class:`ProjectError` listing every problem at once.
        """
        path = Path(folder)
        if not path.is_dir():
            raise ProjectError([Problem("folder", f"folder: {str(path)!r} is not a directory")])
        file = path / PROJECT_FILE
        data: dict[str, Any] = {}
        if file.is_file():
            try:
                data = tomllib.loads(file.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ProjectError([Problem(PROJECT_FILE, f"{PROJECT_FILE}: not valid TOML: {exc}")])
        default_name = os.path.basename(os.path.normpath(str(path)))
        return _Builder(data, overrides, default_name, path, "project").build()

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, name: str, source: Source = "project", **overrides: Any
    ) -> "AgentProject":
        """Build a project from the tables of a ``rayito-agent.toml`` already parsed."""
        return _Builder(dict(data), overrides, name, None, source).build()

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any], **overrides: Any) -> "AgentProject":
        """Rebuild a project from a decoded recipe; its values report the source ``recipe``."""
        from .recipe import recipe_to_project_data

        data = recipe_to_project_data(recipe)
        return _Builder(data, overrides, str(recipe.get("name", "")), None, "recipe").build()

    # ------------------------------------------------------------------ derived facts

    @property
    def scaling_source(self) -> Source:
        """Where the fleet's scaling comes from, as ``FleetStatus.scaling_source`` reports it."""
        origins = {self.sources.get(k, "default") for k in FLEET_OPTIONS}
        for origin in ("explicit", "project", "recipe"):
            if origin in origins:
                return origin  # type: ignore[return-value]
        return "default"

    @property
    def vcpus(self) -> int:
        """vCPUs the page counts for this project's memory size."""
        return vcpus_for(self.image.memory_mib)

    @property
    def recipe_parameter_name(self) -> str:
        """``/rayito/agents/<name>/recipe``."""
        return f"/rayito/agents/{self.name}/recipe"

    @property
    def has_fleet(self) -> bool:
        """False on AgentCore, which has no fleet."""
        return self.target == "microvm"


class _Builder:
    """Collects problems, warnings and sources while turning raw tables into an AgentProject."""

    def __init__(
        self,
        data: dict[str, Any],
        overrides: Mapping[str, Any],
        default_name: str,
        folder: Optional[Path],
        file_source: Source,
    ) -> None:
        self.data = data
        self.overrides = dict(overrides)
        self.default_name = default_name
        self.folder = folder
        self.file_source: Source = file_source
        self.problems: list[Problem] = []
        self.warnings: list[FleetWarning] = []
        self.sources: dict[str, Source] = {}

    def build(self) -> AgentProject:
        self._check_keys()
        target = self._target()
        self._agentcore_filter(target)
        sections = {name: self._section(name, model) for name, model in _SECTIONS.items()}
        env = self._env()
        secret_env = self._secret_env(env)
        gateways = self._gateways()
        name = self._name()
        instructions = self._scalar("instructions", str, None)
        renew = self._scalar("renew_gateway_keys", bool, False)
        save_recipe = self._save_recipe()
        self._cross_checks(sections)
        if self.problems:
            raise ProjectError(self.problems)
        return AgentProject(
            name=name,
            folder=self.folder,
            target=target,
            serve=sections["serve"],
            scaling=sections["scaling"],
            image=sections["image"],
            egress=sections["egress"],
            env=env,
            secret_env=secret_env,
            gateways=gateways,
            instructions=instructions,
            renew_gateway_keys=renew,
            save_recipe=save_recipe,
            sources=self.sources,
            warnings=tuple(self.warnings),
        )

    # ------------------------------------------------------------------ helpers

    def _problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, f"{key}: {message}"))

    def _check_keys(self) -> None:
        for key in self.data:
            if key not in _TOP_LEVEL_KEYS:
                self._problem(key, f"unknown key in {PROJECT_FILE}{did_you_mean(key, _TOP_LEVEL_KEYS)}")
        for key in self.overrides:
            if key not in OPTION_TABLE:
                self._problem(key, f"unknown option{did_you_mean(key, OPTION_TABLE)}")
        for key in ("serve", "scaling", "image", "env", "egress"):
            if key in self.data and not isinstance(self.data[key], dict):
                self._problem(key, f"{show(self.data[key])} is not a table ([{key}])")
                self.data.pop(key)

    def _target(self) -> Target:
        value = self.overrides.get("target", self.data.get("target", "microvm"))
        origin = self._origin("target", "target" in self.overrides, "target" in self.data)
        self.sources["target"] = origin
        if value not in ("microvm", "agentcore"):
            self._problem("target", f"{show(value)} is not one of 'microvm', 'agentcore'")
            return "microvm"
        return value

    def _origin(self, key: str, explicit: bool, in_file: bool) -> Source:
        if explicit:
            return "explicit"
        return self.file_source if in_file else "default"

    def _agentcore_filter(self, target: Target) -> None:
        """On AgentCore the fleet options do not exist: explicit is an error, from file a warning."""
        if target != "agentcore":
            return
        for key in FLEET_OPTIONS:
            section = OPTION_TABLE[key][0]
            if key in self.overrides:
                self._problem(
                    key,
                    f"option_not_supported: {show(self.overrides[key])} given, but AgentCore "
                    "Runtime creates one microVM per session and has no fleet to size",
                )
                self.overrides.pop(key)
            table = self.data.get(section)
            if isinstance(table, dict) and key in table:
                self.warnings.append(
                    FleetWarning(
                        "option_not_supported",
                        f"{key} = {show(table[key])} in [{section}] is ignored: AgentCore Runtime "
                        "has no fleet (one microVM per session)",
                    )
                )
                table = dict(table)
                table.pop(key)
                self.data[section] = table

    def _section(self, section: str, model: type[BaseModel]) -> Any:
        raw = self.data.get(section, {})
        raw = dict(raw) if isinstance(raw, dict) else {}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        for field in model.model_fields:
            override_key = "allow_out" if (section, field) == ("egress", "allow") else field
            known_here = OPTION_TABLE.get(override_key, ("?",))[0] == section
            if override_key in self.overrides and known_here:
                value = self.overrides[override_key]
                values[field] = tuple(value) if isinstance(value, (list, tuple)) else value
            self.sources[override_key] = self._origin(
                field, override_key in self.overrides and known_here, field in raw
            )
        try:
            return model.model_validate(values)
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                self._pydantic_problem(section, model, error)
        # Keep going with defaults where the table is broken, so cross-field checks that do not
        # involve the broken keys still report their problems.
        good = {}
        for key, value in values.items():
            try:
                model.model_validate({key: value})
                good[key] = value
            except ValidationError:
                pass
        try:
            return model.model_validate(good)
        except ValidationError:
            return model()

    def _pydantic_problem(self, section: str, model: type[BaseModel], error: Mapping[str, Any]) -> None:
        loc = error["loc"]
        key = str(loc[0]) if loc else section
        for part in loc[1:]:
            key += f"[{part}]" if isinstance(part, int) else f".{part}"
        given = error.get("input")
        kind = error["type"]
        ctx = error.get("ctx", {})
        if kind == "extra_forbidden":
            self._problem(
                f"{section}.{key}", f"unknown key in [{section}]{did_you_mean(key, model.model_fields)}"
            )
        elif kind == "greater_than_equal":
            self._problem(key, f"{show(given)} is below the minimum of {ctx['ge']}")
        elif kind == "less_than_equal":
            self._problem(key, f"{show(given)} is above the limit of {ctx['le']}")
        elif kind == "literal_error" and key == "memory_mib":
            classes = ", ".join(str(c) for c in MEMORY_CLASSES_MIB)
            self._problem(key, f"{show(given)} is not a MicroVM size class ({classes} MiB)")
        elif kind == "literal_error":
            self._problem(key, f"{show(given)} is not one of {ctx['expected']}")
        elif kind in ("int_type", "int_parsing", "int_from_float"):
            self._problem(key, f"{show(given)} is not a whole number")
        elif kind in ("string_type",):
            self._problem(key, f"{show(given)} is not a string")
        elif kind == "string_pattern_mismatch":
            self._problem(key, f"{show(given)} does not match {ctx['pattern']}")
        elif kind in ("string_too_short", "string_too_long"):
            self._problem(key, f"{show(given)} must be {error['msg'].lower().removeprefix('string should have ')}")
        elif kind in ("tuple_type", "list_type"):
            self._problem(key, f"{show(given)} is not a list")
        elif kind == "value_error":
            self._problem(key, f"{show(given)} {ctx.get('error', error['msg'])}")
        elif kind == "missing":
            self._problem(key, "is required")
        else:
            self._problem(key, f"{show(given)}: {error['msg']}")

    def _scalar(self, key: str, kind: type, default: Any) -> Any:
        explicit = key in self.overrides
        value = self.overrides.get(key, self.data.get(key, default))
        self.sources[key] = self._origin(key, explicit, key in self.data)
        if value is not None and not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            wanted = {str: "a string", bool: "true or false"}[kind]
            self._problem(key, f"{show(value)} is not {wanted}")
            return default
        return value

    def _name(self) -> str:
        name = self._scalar("name", str, self.default_name)
        if name is None or name in (".", ".."):
            return name or "."
        if not _NAME.match(name):
            self._problem(
                "name",
                f"{show(name)} must be 1 to 64 letters, digits, '-' or '_' (it names the image and "
                "the recipe parameter); set name = \"...\" in rayito-agent.toml",
            )
        return name

    def _save_recipe(self) -> bool:
        return bool(self._scalar("save_recipe", bool, True))

    def _env(self) -> dict[str, str]:
        raw = self.data.get("env", {})
        env: dict[str, str] = {}
        for key, value in (raw if isinstance(raw, dict) else {}).items():
            if not self._env_entry(key, value):
                continue
            env[key] = value
            reason = secret_reason(key)
            if reason:
                self.warnings.append(
                    FleetWarning(
                        "env_looks_secret",
                        f"[env] {key} looks like a secret ({reason}); [env] values are stored as is "
                        "in the recipe, readable by anyone with ssm:GetParameter on it: move it to "
                        "secret_env",
                    )
                )
        explicit = self.overrides.get("env") or {}
        if not isinstance(explicit, Mapping):
            self._problem("env", f"{show(explicit)} is not a mapping of NAME to value")
            explicit = {}
        for key, value in explicit.items():
            if not self._env_entry(key, value):
                continue
            reason = secret_reason(key)
            if reason:
                self._problem(
                    "env",
                    f"{key} looks like a secret ({reason}); pass it with --secret-env {key}=<secret> "
                    "so the recipe keeps only its name",
                )
                continue
            env[key] = value
        self.sources["env"] = self._origin("env", bool(explicit), bool(raw))
        if len(env) > _ENV_MAX_ENTRIES:
            self._problem("env", f"{len(env)} variables is above the limit of {_ENV_MAX_ENTRIES}")
        return dict(sorted(env.items()))

    def _env_entry(self, key: Any, value: Any) -> bool:
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            self._problem("env", f"{show(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
            return False
        if not isinstance(value, str):
            self._problem(f"env.{key}", f"{show(value)} is not a string (quote it)")
            return False
        if len(value) > _ENV_VALUE_MAX:
            self._problem(f"env.{key}", f"value of {len(value)} characters is above the limit of {_ENV_VALUE_MAX}")
            return False
        if shape := credential_shape(value):  # names the variable and the shape, never the value
            self._problem(f"env.{key}", credential_problem(key, shape))
            return False
        return True

    def _secret_env(self, env: Mapping[str, str]) -> tuple[str, ...]:
        names: list[str] = []
        raw = self.data.get("secret_env", [])
        if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
            self._problem("secret_env", f"{show(raw)} is not a list of variable names")
            raw = []
        explicit = self.overrides.get("secret_env") or {}
        if isinstance(explicit, Mapping):
            explicit_names: Iterable[Any] = explicit.keys()  # values are secrets: dropped here
        elif isinstance(explicit, (list, tuple)):
            explicit_names = explicit
        else:
            self._problem("secret_env", "expects a mapping of NAME to secret, or a list of names")
            explicit_names = []
        for name in [*raw, *explicit_names]:
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                self._problem("secret_env", f"{show(name)} is not a valid variable name")
            elif name in env:
                self._problem("secret_env", f"{name} is also in env; a variable is either plain or secret")
            elif name not in names:
                names.append(name)
        self.sources["secret_env"] = self._origin("secret_env", bool(explicit), bool(raw))
        return tuple(sorted(names))

    def _gateways(self) -> tuple[GatewayOptions, ...]:
        raw = self.data.get("gateways", [])
        if not isinstance(raw, list):
            self._problem("gateways", f"{show(raw)} is not a list of [[gateways]] tables")
            return ()
        gateways: list[GatewayOptions] = []
        for index, entry in enumerate(raw):
            if not isinstance(entry, dict):
                self._problem(f"gateways[{index}]", f"{show(entry)} is not a table")
                continue
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
            try:
                gateways.append(GatewayOptions.model_validate(values))
            except ValidationError as exc:
                for error in exc.errors(include_url=False):
                    field = str(error["loc"][0]) if error["loc"] else "?"
                    prefix = f"gateways[{index}]"
                    if error["type"] == "missing":
                        self._problem(f"{prefix}.{field}", "is required")
                    elif error["type"] == "extra_forbidden":
                        hint = did_you_mean(field, GatewayOptions.model_fields)
                        self._problem(f"{prefix}.{field}", f"unknown key{hint}")
                    else:
                        self._problem(f"{prefix}.{field}", f"{show(error.get('input'))}: {error['msg']}")
        seen = [g.name for g in gateways]
        for name in sorted({n for n in seen if seen.count(n) > 1}):
            self._problem("gateways", f"{name!r} is declared more than once")
        self.sources["gateways"] = self._origin("gateways", False, bool(raw))
        return tuple(sorted(gateways, key=lambda g: g.name))

    def _cross_checks(self, sections: Mapping[str, Any]) -> None:
        serve: ServeOptions = sections["serve"]
        scaling: ScalingOptions = sections["scaling"]
        image: ImageOptions = sections["image"]
        broken = {p.key for p in self.problems}
        if scaling.min_vms > scaling.max_vms and not broken & {"min_vms", "max_vms"}:
            self._problem("min_vms", f"{scaling.min_vms} is above max_vms ({scaling.max_vms})")
        headroom = max(0, scaling.max_vms - scaling.min_vms)
        if scaling.warm_vms > headroom and not broken & {"warm_vms", "min_vms", "max_vms"}:
            self._problem(
                "warm_vms",
                f"{scaling.warm_vms} is above the limit of {headroom} (max_vms - min_vms = "
                f"{scaling.max_vms} - {scaling.min_vms})",
            )
        limit = max_concurrency_limit(image.memory_mib)
        if serve.max_concurrency > limit and not broken & {"max_concurrency", "memory_mib"}:
            self._problem(
                "max_concurrency",
                f"{serve.max_concurrency} is above the limit of {limit} for {image.memory_mib} MiB "
                f"({vcpus_for(image.memory_mib)} vCPU x 8 connections, minus 1 kept for /ping); "
                "raise memory_mib to raise the cap",
            )
        if scaling.sessions == "dedicated" and serve.max_concurrency > 1 and "max_concurrency" not in broken:
            self._problem(
                "max_concurrency",
                f"{serve.max_concurrency} is above the limit of 1 with sessions = 'dedicated' "
                "(a VM never serves two sessions)",
            )
