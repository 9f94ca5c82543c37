"""The agent project: an agent folder and its ``rayito-agent.toml``, after overrides.

``AgentProject.load(folder, **overrides)`` reads the file, applies explicit overrides (the same
ones ``rayito agent deploy`` takes as flags), checks every option of the product page against its
limit and records where each value came from (``explicit``, ``project``, ``recipe`` or
``default``). Parsing and validation are pure: no AWS call, no CDK.

The rules are the model's: ``AgentProject(...)``, ``AgentProject.model_validate``,
``project.model_copy(update=...)``, :meth:`AgentProject.load` and :meth:`AgentProject.from_recipe`
all refuse the same inputs with the same one-line messages (:class:`ProjectError`).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal, Mapping, Optional

from pydantic import ConfigDict, StrictBool, field_validator, model_validator

from .envrules import credential_problem, credential_shape, secret_reason
from .errors import FleetWarning, Problem, ProjectError, did_you_mean, show
from .names import fleet_name_problem, stack_name_for
from .options import (
    EgressOptions,
    GatewayOptions,
    ImageOptions,
    Rule,
    ScalingOptions,
    ServeOptions,
    ValidatedModel,
    max_concurrency_limit,
    rules_error,
    value_error,
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

#: The key a problem is reported under, for an override whose name differs from its field.
PROBLEM_KEY = {"allow_out": "allow"}

_SECTIONS: dict[str, type[ValidatedModel]] = {
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
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
ENV_MAX_ENTRIES = 100  # the image's environment variable map holds at most 100 entries
ENV_VALUE_MAX = 4096


# ---------------------------------------------------------------------------- the rules


def env_rules(env: Mapping[Any, Any]) -> list[Rule]:
    """Names, values and count of the plain environment variables."""
    problems: list[Rule] = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            problems.append(("env", f"env: {show(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", ("env",)))
        elif not isinstance(value, str):
            problems.append((f"env.{key}", f"env.{key}: {show(value)} is not a string (quote it)", ("env",)))
        elif len(value) > ENV_VALUE_MAX:
            problems.append((
                f"env.{key}",
                f"env.{key}: value of {len(value)} characters is above the limit of {ENV_VALUE_MAX}",
                ("env",),
            ))
        elif shape := credential_shape(value):  # names the variable and the shape, never the value
            problems.append((f"env.{key}", f"env.{key}: {credential_problem(key, shape)}", ("env",)))
    if len(env) > ENV_MAX_ENTRIES:
        problems.append(("env", f"env: {len(env)} variables is above the limit of {ENV_MAX_ENTRIES}", ("env",)))
    return problems


def secret_env_rules(secret_env: Iterable[Any], env: Mapping[Any, Any]) -> list[Rule]:
    problems: list[Rule] = []
    for name in secret_env:
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            problems.append(("secret_env", f"secret_env: {show(name)} is not a valid variable name", ("secret_env",)))
        elif name in env:
            problems.append((
                "secret_env",
                f"secret_env: {name} is also in env; a variable is either plain or secret",
                ("secret_env", "env"),
            ))
    return problems


def gateway_rules(gateways: Iterable[GatewayOptions]) -> list[Rule]:
    seen = [g.name for g in gateways]
    return [
        ("gateways", f"gateways: {name!r} is declared more than once", ())
        for name in sorted({n for n in seen if seen.count(n) > 1})
    ]


def fleet_rules(target: str, serve: ServeOptions, scaling: ScalingOptions, image: ImageOptions) -> list[Rule]:
    """Rules across tables: the ``max_concurrency`` cap, dedicated sessions, AgentCore's no-fleet."""
    problems: list[Rule] = []
    if target == "agentcore":
        defaults = {**ServeOptions().model_dump(), **ScalingOptions().model_dump()}
        given = {**serve.model_dump(), **scaling.model_dump()}
        for key in FLEET_OPTIONS:
            if given[key] != defaults[key]:
                problems.append((
                    key,
                    f"{key}: option_not_supported: {show(given[key])} given, but AgentCore Runtime "
                    "creates one microVM per session and has no fleet to size",
                    (key, "target"),
                ))
        return problems
    limit = max_concurrency_limit(image.memory_mib)
    if serve.max_concurrency > limit:
        problems.append((
            "max_concurrency",
            f"max_concurrency: {serve.max_concurrency} is above the limit of {limit} for "
            f"{image.memory_mib} MiB ({vcpus_for(image.memory_mib)} vCPU x 8 connections, minus 1 kept "
            "for /ping); raise memory_mib to raise the cap",
            ("max_concurrency", "memory_mib"),
        ))
    if scaling.sessions == "dedicated" and serve.max_concurrency > 1:
        problems.append((
            "max_concurrency",
            f"max_concurrency: {serve.max_concurrency} is above the limit of 1 with sessions = 'dedicated' "
            "(a VM never serves two sessions)",
            ("max_concurrency", "sessions"),
        ))
    return problems


# ---------------------------------------------------------------------------- the model


class AgentProject(ValidatedModel):
    """An agent and its fleet options, validated, with the origin of every value.

    Build it with :meth:`load` (from a folder), :meth:`from_recipe` (from a saved recipe) or
    directly (``AgentProject(name="bot", scaling=ScalingOptions(max_vms=3))``): every way checks
    the same rules and raises :class:`ProjectError` with one line per problem.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    SECTION_FIELDS: ClassVar[tuple[str, ...]] = ("serve", "scaling", "image", "egress")

    name: str
    """The fleet's name: 1 to 64 letters, digits, ``-`` or ``_`` (it names the MicroVM image,
    the stack of ``app.py`` and ``/rayito/agents/<name>/recipe``)."""
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
    renew_gateway_keys: StrictBool = False
    save_recipe: StrictBool = True
    sources: dict[str, Source] = {}
    """Where each option came from, by option name (``min_vms``, ``memory_mib``...). Built
    directly, the options given are ``explicit`` and the others ``default``."""
    warnings: tuple[FleetWarning, ...] = ()

    @field_validator("name", mode="plain")
    @classmethod
    def _name(cls, value: object) -> str:
        problem = fleet_name_problem(value)
        if problem:
            raise value_error(problem)
        return value  # type: ignore[return-value]

    @field_validator("env", mode="plain")
    @classmethod
    def _env(cls, value: object) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise value_error(f"{show(value)} is not a mapping of NAME to value")
        problems = env_rules(value)
        if problems:
            raise rules_error(problems)
        return dict(sorted(value.items()))

    @field_validator("secret_env", mode="before")
    @classmethod
    def _secret_env(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
            raise value_error(f"{show(value)} is not a list of variable names")
        problems = secret_env_rules(value, {})
        if problems:
            raise rules_error(problems)
        return tuple(sorted(set(value)))

    @model_validator(mode="before")
    @classmethod
    def _explicit_sources(cls, data: Any) -> Any:
        """Built directly (no ``sources``): what was given is ``explicit``, the rest ``default``."""
        if not isinstance(data, dict) or "sources" in data:
            return data
        sources: dict[str, str] = {}
        for section, model in _SECTIONS.items():
            given = data.get(section)
            fields = given.model_fields_set if isinstance(given, model) else set(given or {}) if isinstance(given, dict) else set()
            for field in model.model_fields:
                option = "allow_out" if (section, field) == ("egress", "allow") else field
                sources[option] = "explicit" if field in fields else "default"
        for key in ("name", "target", "env", "secret_env", "gateways", "instructions", "renew_gateway_keys", "save_recipe"):
            sources[key] = "explicit" if key in data else "default"
        return {**data, "sources": sources}

    @model_validator(mode="after")
    def _rules(self) -> "AgentProject":
        problems = [
            *fleet_rules(self.target, self.serve, self.scaling, self.image),
            *secret_env_rules(self.secret_env, self.env),
            *gateway_rules(self.gateways),
        ]
        if problems:
            raise rules_error(problems)
        return self

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, folder: str | os.PathLike[str], **overrides: Any) -> "AgentProject":
        """Read ``<folder>/rayito-agent.toml`` (optional) and apply explicit ``overrides``.

        Overrides are the library arguments of ``rayito agent deploy``'s flags: ``min_vms=2``,
        ``memory_mib=4096``, ``env={"LOG_LEVEL": "debug"}``, ``secret_env={"API_TOKEN": "..."}``
        (only the name is kept), ``save_recipe=False``, ``target="agentcore"``...

        Without a ``name``, the fleet is named after the folder (``.`` is the current folder's
        name). A folder without ``rayito-agent.toml`` is the warning ``no_project_file``.

        Raises :class:`ProjectError` listing every problem at once.
        """
        path = Path(folder)
        if not path.is_dir():
            raise ProjectError([Problem("folder", f"folder: {str(path)!r} is not a directory")])
        file = path / PROJECT_FILE
        data: dict[str, Any] = {}
        if file.is_file():
            data = _read_project_file(file)
        default_name = os.path.basename(os.path.abspath(path))  # "." is the current folder; links keep their name
        builder = _Builder(data, overrides, default_name, path, "project")
        if not file.is_file():
            builder.warnings.append(
                FleetWarning(
                    "no_project_file",
                    f"{str(path)!r} has no {PROJECT_FILE}: every option not given is its default "
                    f"(a single VM named {default_name!r}); is it the agent's folder?",
                )
            )
        return builder.build()

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

    def model_copy(self, *, update: Optional[Mapping[str, Any]] = None, deep: bool = False) -> "AgentProject":  # type: ignore[override]
        """A copy; with ``update``, checked like a new project, and what changed is ``explicit``.

        A mapping for a table (``update={"scaling": {"max_vms": 5}}``) changes only those keys.
        """
        if not update:
            return super().model_copy(deep=deep)
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(update)
        for key, value in update.items():
            if key in _SECTIONS and isinstance(value, Mapping):  # a mapping updates those keys of the table
                old = getattr(self, key)
                data[key] = {**{f: getattr(old, f) for f in type(old).model_fields}, **value}
        if "sources" not in update:
            sources = dict(self.sources)
            for key, value in update.items():
                if key in _SECTIONS:
                    old = getattr(self, key)
                    for field in type(old).model_fields:
                        given = value.get(field, getattr(old, field)) if isinstance(value, Mapping) else getattr(value, field, getattr(old, field))
                        if getattr(old, field) != given:
                            sources["allow_out" if (key, field) == ("egress", "allow") else field] = "explicit"
                elif key in type(self).model_fields and key not in ("sources", "warnings", "folder"):
                    sources[key] = "explicit"
            data["sources"] = sources
        return type(self)(**data)

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
    def stack_name(self) -> str:
        """The stack ``app.py`` deploys this fleet in: ``RayitoFleet-<name>``, made a valid stack
        name (``my_agent`` → ``RayitoFleet-my-agent-<hash>``)."""
        return stack_name_for(self.name)

    @property
    def has_fleet(self) -> bool:
        """False on AgentCore, which has no fleet."""
        return self.target == "microvm"


def _read_project_file(file: Path) -> dict[str, Any]:
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark (Windows editors) is not content
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ProjectError([
            Problem(PROJECT_FILE, f"{PROJECT_FILE}: not UTF-8 text (byte {raw[exc.start]:#04x} on line {line}); save it as UTF-8")
        ]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError([Problem(PROJECT_FILE, f"{PROJECT_FILE}: not valid TOML: {exc}")]) from None


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
        save_recipe = self._scalar("save_recipe", bool, True)
        self._model_rules(target, sections, gateways)
        if self.folder is not None and target == "microvm" and not (self.folder / "Dockerfile").is_file():
            self.warnings.append(
                FleetWarning(
                    "no_dockerfile",
                    f"{str(self.folder)!r} has no Dockerfile: AgentFleet builds no image from it and "
                    f"runs the MicroVM image named {name!r} already published in the account "
                    "(or the image_arn you give it)",
                )
            )
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
        origin = self._origin("target" in self.overrides, "target" in self.data)
        self.sources["target"] = origin
        if value not in ("microvm", "agentcore"):
            self._problem("target", f"{show(value)} is not one of 'microvm', 'agentcore'")
            return "microvm"
        return value

    def _origin(self, explicit: bool, in_file: bool) -> Source:
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

    def _section(self, section: str, model: type[ValidatedModel]) -> Any:
        raw = self.data.get(section, {})
        raw = dict(raw) if isinstance(raw, dict) else {}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        for field in model.model_fields:
            override_key = "allow_out" if (section, field) == ("egress", "allow") else field
            known_here = OPTION_TABLE.get(override_key, ("?",))[0] == section
            if override_key in self.overrides and known_here:
                value = self.overrides[override_key]
                values[field] = tuple(value) if isinstance(value, (list, tuple)) else value
            self.sources[override_key] = self._origin(override_key in self.overrides and known_here, field in raw)
        try:
            return model.model_validate(values)
        except ProjectError as exc:
            self.problems.extend(exc.problems)
            broken = {_field_of(p.key, section) for p in exc.problems}
        # Keep going without the broken keys, so rules that do not involve them still report.
        good = {k: v for k, v in values.items() if k not in broken}
        try:
            return model.model_validate(good)
        except ProjectError as exc:
            reported = {p.message for p in self.problems}
            self.problems.extend(
                p for p in exc.problems
                if p.message not in reported and not broken & {_field_of(p.key, section), *p.related}
            )
            return model()

    def _scalar(self, key: str, kind: type, default: Any) -> Any:
        explicit = key in self.overrides
        value = self.overrides.get(key, self.data.get(key, default))
        self.sources[key] = self._origin(explicit, key in self.data)
        if value is not None and not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            wanted = {str: "a string", bool: "true or false"}[kind]
            self._problem(key, f"{show(value)} is not {wanted}")
            return default
        return value

    def _name(self) -> str:
        explicit = "name" in self.overrides or "name" in self.data
        name = self._scalar("name", str, self.default_name)
        problem = fleet_name_problem(name)
        if problem and not explicit:
            where = "the folder name" if self.folder is not None else "the recipe's name"
            self._problem(
                "name",
                f"{where} {problem}; set name = \"...\" in {PROJECT_FILE} "
                "(or pass --name / -c name=...)",
            )
        elif problem and not any(p.key == "name" for p in self.problems):
            self._problem("name", problem)
        return name

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
        self.sources["env"] = self._origin(bool(explicit), bool(raw))
        return dict(sorted(env.items()))

    def _env_entry(self, key: Any, value: Any) -> bool:
        problems = env_rules({key: value})
        self.problems.extend(Problem(k, m) for k, m, _ in problems)
        return not problems

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
            problems = secret_env_rules([name], env)
            self.problems.extend(Problem(k, m) for k, m, _ in problems)
            if not problems and name not in names:
                names.append(name)
        self.sources["secret_env"] = self._origin(bool(explicit), bool(raw))
        return tuple(sorted(names))

    def _gateways(self) -> tuple[GatewayOptions, ...]:
        raw = self.data.get("gateways", [])
        self.sources["gateways"] = self._origin(False, bool(raw))
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
            except ProjectError as exc:
                for problem in exc.problems:
                    key = f"gateways[{index}].{problem.key.removeprefix('gateways.')}"
                    text = problem.message.split(": ", 1)[1].replace(" in [gateways]", "")
                    self.problems.append(Problem(key, f"{key}: {text}"))
        return tuple(sorted(gateways, key=lambda g: g.name))

    def _model_rules(self, target: str, sections: Mapping[str, Any], gateways: Iterable[GatewayOptions]) -> None:
        """The model's rules across tables, on what could be read; a rule about a key already
        reported is left out (its value was replaced by the default to keep going)."""
        broken = {_field_of(p.key, "") for p in self.problems}
        reported = {p.message for p in self.problems}
        rules = [
            *fleet_rules(target, sections["serve"], sections["scaling"], sections["image"]),
            *gateway_rules(gateways),
        ]
        for key, message, related in rules:
            if not broken & set(related) and message not in reported:
                self.problems.append(Problem(key, message))


def _field_of(key: str, section: str) -> str:
    """The option a problem's key is about: ``scaling.max_vm`` → ``max_vm``, ``budgets[0].rate``
    → ``budgets``, ``env.X`` → ``env``."""
    if section and key.startswith(section + "."):
        key = key[len(section) + 1 :]
    elif key.split(".", 1)[0] in _SECTIONS and "." in key:
        key = key.split(".", 1)[1]
    return re.split(r"[.\[]", key, maxsplit=1)[0]
