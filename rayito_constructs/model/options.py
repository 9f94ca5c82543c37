"""The fleet settings the product's project file does not hold, as typed models.

``rayito-agent.toml`` is the product's, and its loader refuses any key it does not know; what
this library adds to a fleet (per-target egress envelopes, the stack's operations switches) lives
in props, ``-c`` context and, when a file is wanted, ``rayito-constructs.toml`` next to it
(:mod:`rayito_constructs.model.fleet_file`). The models are strict: a string where a number belongs is
an error, not a guess, and a broken model raises
:class:`~rayito_constructs.model.errors.ProjectError` (a ``ValueError``) whose ``problems`` are the
one-line messages ``plan`` prints.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional, Self, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from .egress_targets import declared_target
from .errors import Problem, ProjectError, did_you_mean, show

from .rates import MAX_BURST, RateError, parse_rate

#: The documented MicroVM size classes (``resources[0].minimumMemoryInMiB`` of an image).
MEMORY_CLASSES_MIB = (512, 1024, 2048, 4096, 8192)
DEFAULT_MEMORY_MIB = 2048

MAX_VMS_LIMIT = 64
QUEUE_MAX_LIMIT = 256
QUEUE_TIMEOUT_LIMIT = 900
SCALE_IN_MINIMUM = 60
IDLE_MINIMUM = 60  # IdlePolicy.maxIdleDurationSeconds has a minimum of 60 in the service model
MICROVM_MAX_LIFETIME_SECONDS = 28_800  # a MicroVM lives at most 8 hours


def vcpus_for(memory_mib: int) -> int:
    """The vCPUs the page counts for a memory size: one per 2 GiB, and one below 2 GiB."""
    return max(1, memory_mib // 2048)


def max_concurrency_limit(memory_mib: int) -> int:
    """Sessions one VM admits: 8 connections per vCPU minus the one the service keeps for /ping."""
    return 8 * vcpus_for(memory_mib) - 1


# ---------------------------------------------------------------------------- rule errors

RULES = "rayito_rules"
"""The pydantic error type of a model-level rule: ``ctx["problems"]`` holds ``(key, message,
related keys)`` triples, each message one line that starts with its key."""
VALUE = "rayito_value"
"""The pydantic error type of a field rule: ``ctx["detail"]`` is the message after ``key: ``."""

Rule = tuple[str, str, tuple[str, ...]]


def rules_error(problems: Sequence[Rule]) -> PydanticCustomError:
    """One pydantic error carrying every broken cross-field rule of a model."""
    return PydanticCustomError(
        RULES, "{summary}", {"summary": "; ".join(p[1] for p in problems), "problems": list(problems)}
    )


def value_error(detail: str) -> PydanticCustomError:
    """A field's error with our own wording (``detail`` follows ``key: ``)."""
    return PydanticCustomError(VALUE, "{detail}", {"detail": detail})


# ---------------------------------------------------------------------------- durations

_DURATION = re.compile(r"^\s*(-?\d+)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hr|hrs|hours?)?\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
NONE_WORDS = frozenset({"none", "off", "never"})


def parse_duration(value: object) -> object:
    """``"15m"`` → 900, ``"90"`` → 90, ``"none"`` → None; anything else is returned as is."""
    if isinstance(value, str):
        if value.strip().lower() in NONE_WORDS:
            return None
        match = _DURATION.match(value)
        if match:
            unit = (match.group(2) or "s")[0].lower()
            return int(match.group(1)) * _UNIT_SECONDS[unit]
    return value


def human_duration(seconds: int) -> str:
    """``900`` → ``15m``, ``28800`` → ``8h``, ``90`` → ``90s``."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _seconds(value: int, human: bool = False) -> str:
    text = f"{value} second{'' if value == 1 else 's'}"
    short = human_duration(value)
    return f"{text} ({short})" if human and not short.endswith("s") else text


def duration_forms(allow_none: bool) -> str:
    """How a duration may be written, for error messages."""
    forms = "a whole number of seconds (90) or a number with a unit (90s, 10m, 1h)"
    return forms + (", or none" if allow_none else "; none is not accepted here")


def check_duration(value: object, *, minimum: int, maximum: int, allow_none: bool, none_means: str = "") -> Optional[int]:
    """Read a duration (seconds, ``"10m"``, ``"none"``) and check its limits, in seconds.

    Every error names the unit and, where ``none`` is accepted, says so.
    """
    none_hint = f"; none {none_means}" if allow_none and none_means else ""
    if isinstance(value, str):
        parsed = parse_duration(value)
        if isinstance(parsed, str):
            raise value_error(f"{show(value)} is not a duration: {duration_forms(allow_none)}")
        value = parsed
    if value is None:
        if allow_none:
            return None
        raise value_error(f"none is not accepted: give {duration_forms(False).split(';')[0]}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise value_error(f"{show(value)} is not a duration: {duration_forms(allow_none)}")
    if value < minimum:
        raise value_error(f"{_seconds(value)} is below the minimum of {_seconds(minimum, human=True)}{none_hint}")
    if value > maximum:
        raise value_error(f"{_seconds(value)} is above the limit of {_seconds(maximum, human=True)}{none_hint}")
    return value


# ---------------------------------------------------------------------------- hosts

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def normalize_host(host: object) -> str:
    """A host the agent may reach, lowercased and IDNA-encoded; raises ``ValueError`` with why not.

    Accepted: a DNS name (``api.example.com``, ``localhost``), ``*.`` before a domain for its
    subdomains, an IPv4 or IPv6 address. Not a URL, not a port, not a path.
    """
    if not isinstance(host, str):
        raise ValueError(f"{show(host)} is not a host name")
    text = host.strip()
    if not text:
        raise ValueError(f"{show(host)} is empty: give a host such as api.example.com")
    if "://" in text or "/" in text:
        from urllib.parse import urlsplit

        guess = urlsplit(text if "://" in text else "https://" + text).hostname
        hint = f": give the host alone ({guess!r})" if guess else ""
        raise ValueError(f"{show(host)} is a URL, not a host{hint}")
    if any(c.isspace() for c in text):
        raise ValueError(f"{show(host)} has a space; give one host per --allow-out")
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        pass
    if ":" in text:
        raise ValueError(f"{show(host)} has a port or is not an address; give the host alone")
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    try:
        ascii_name = name.rstrip(".").encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"{show(host)} is not a valid host name") from None
    labels = ascii_name.split(".")
    if (
        len(ascii_name) > 253
        or not all(_LABEL.fullmatch(label) for label in labels)
        or (len(labels) > 1 and labels[-1].isdigit())
    ):
        raise ValueError(
            f"{show(host)} is not a valid host name (labels of 1 to 63 letters, digits or '-', "
            "separated by dots; *. only at the start)"
        )
    return ("*." if wildcard else "") + ascii_name


# ---------------------------------------------------------------------------- models


def problems_from(exc: ValidationError, model: type[BaseModel]) -> list[Problem]:
    """The one-line problems of a pydantic error raised while validating ``model``."""
    problems: list[Problem] = []
    for error in exc.errors(include_url=False):
        problems.extend(_problem(error, model))
    return problems


def _nested_model(model: type[BaseModel], loc: Sequence[Any]) -> tuple[type[BaseModel], list[Any]]:
    """Follow ``loc`` through nested option models; returns the innermost model and the rest."""
    rest = list(loc)
    while rest and isinstance(rest[0], str):
        field = model.model_fields.get(rest[0])
        inner = _option_model_of(field.annotation) if field is not None else None
        if inner is None:
            break
        model = inner
        rest = rest[1:]
        if rest and isinstance(rest[0], int):  # an entry of a tuple of models
            rest = rest[1:]
    return model, rest


def _option_model_of(annotation: Any) -> Optional[type["_Options"]]:
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, _Options):
            return candidate
    return None


def _key(loc: Sequence[Any], model: type[BaseModel]) -> str:
    """``('scaling', 'min_vms')`` → ``min_vms``; ``('egress', 'budgets', 0, 'rate')`` →
    ``budgets[0].rate``; ``('gateways', 1, 'name')`` → ``gateways[1].name``."""
    parts = list(loc)
    if parts and isinstance(parts[0], str) and parts[0] in getattr(model, "SECTION_FIELDS", ()):
        parts = parts[1:]  # a table of the project file: its keys are known by their own name
    key = ""
    for part in parts:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _problem(error: Mapping[str, Any], model: type[BaseModel]) -> list[Problem]:
    loc = tuple(error.get("loc", ()))
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == RULES:
        return [Problem(key, message, tuple(related)) for key, message, related in ctx["problems"]]
    given = error.get("input")
    inner, rest = _nested_model(model, loc)
    key = _key(loc, model) or (inner.SECTION if issubclass(inner, _Options) else "value")
    if kind == VALUE:
        return [Problem(key, f"{key}: {ctx['detail']}")]
    if kind == "extra_forbidden":
        return [_unknown_key(key, loc, inner, rest)]
    return [Problem(key, f"{key}: {_text(kind, key, given, ctx, error)}")]


def _unknown_key(key: str, loc: Sequence[Any], inner: type[BaseModel], rest: Sequence[Any]) -> Problem:
    """An unknown key, named where it stands: an entry of a list, a table, or the top."""
    field = str(rest[-1]) if rest else key
    hint = did_you_mean(field, inner.model_fields)
    if any(isinstance(part, int) for part in loc):  # an entry of [[gateways]] or [[egress.budgets]]
        return Problem(key, f"{key}: unknown key{hint}")
    if issubclass(inner, _Options):
        qualified = f"{inner.SECTION}.{field}"
        home = _table_of(field, exclude=inner)  # [stack] default_burst: a key of [egress]
        if home and not hint:
            hint = f"; {field} is a key of {home}"
        return Problem(qualified, f"{qualified}: unknown key in [{inner.SECTION}]{hint}")
    # A table's key written at the top (``metrics = true`` for ``[stack] metrics``): say where it goes.
    home = _table_of(field)
    if home and not hint:
        hint = f"; did you mean {home}?" if home.endswith(f".{field}]]") else f"; did you mean {home} {field}?"
    return Problem(field, f"{field}: unknown option{hint}")


def _table_of(field: str, exclude: Optional[type] = None) -> Optional[str]:
    """The table of a file of ours that has ``field`` (``[stack]``; ``[[egress.budgets]]``, an
    array of tables, for ``budgets``), or None."""
    found = []
    pending = list(_Options.__subclasses__())
    while pending:
        table = pending.pop()
        pending.extend(table.__subclasses__())
        if table is exclude or not table.SECTION:
            continue
        if field in table.model_fields:
            inner = _option_model_of(table.model_fields[field].annotation)
            array = inner is not None and getattr(table.model_fields[field].annotation, "__origin__", None) is tuple
            member = "." in table.SECTION  # egress.budgets: an entry of an array of tables
            found.append(f"[[{inner.SECTION}]]" if array and inner is not None
                         else f"[[{table.SECTION}]]" if member else f"[{table.SECTION}]")
    return sorted(found)[0] if found else None


_Text = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], str]
#: What a pydantic error of each type says after the key, from (the value, its ``ctx``, the error).
_TEXTS: dict[str, _Text] = {
    "greater_than_equal": lambda given, ctx, error: f"{show(given)} is below the minimum of {ctx['ge']}",
    "less_than_equal": lambda given, ctx, error: f"{show(given)} is above the limit of {ctx['le']}",
    "literal_error": lambda given, ctx, error: f"{show(given)} is not one of {ctx['expected']}",
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"),
                    lambda given, ctx, error: f"{show(given)} is not a whole number"),
    **dict.fromkeys(("bool_type", "bool_parsing"), lambda given, ctx, error: f"{show(given)} is not true or false"),
    "string_type": lambda given, ctx, error: f"{show(given)} is not a string",
    "string_pattern_mismatch": lambda given, ctx, error: f"{show(given)} does not match {ctx['pattern']}",
    **dict.fromkeys(("string_too_short", "string_too_long"), lambda given, ctx, error:
                    f"{show(given)} must be {error['msg'].lower().removeprefix('string should have ')}"),
    **dict.fromkeys(("tuple_type", "list_type"), lambda given, ctx, error: f"{show(given)} is not a list"),
    **dict.fromkeys(("dict_type", "model_type", "model_attributes_type"),
                    lambda given, ctx, error: f"{show(given)} is not a table"),
    "value_error": lambda given, ctx, error: f"{show(given)} {ctx.get('error', error['msg'])}",
    "missing": lambda given, ctx, error: "is required",
}


def _text(kind: str, key: str, given: Any, ctx: Mapping[str, Any], error: Mapping[str, Any]) -> str:
    if kind == "literal_error" and key == "memory_mib":
        classes = ", ".join(str(c) for c in MEMORY_CLASSES_MIB)
        return f"{show(given)} is not a MicroVM size class ({classes} MiB)"
    text = _TEXTS.get(kind)
    return text(given, ctx, error) if text is not None else f"{show(given)}: {error['msg']}"


class ValidatedModel(BaseModel):
    """A pydantic model whose every way of being made checks its rules and fails with one-line problems."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ProjectError(problems_from(exc, type(self))) from None

    # Nested models are validated by pydantic itself, not through this __init__ (which only
    # translates the error): tell pydantic it is the base one.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise ProjectError(problems_from(exc, cls)) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as exc:
            raise ProjectError(problems_from(exc, cls)) from None

    def model_copy(self, *, update: Optional[Mapping[str, Any]] = None, deep: bool = False) -> Self:
        """A copy; with ``update``, validated like a new model (pydantic's own copy checks nothing)."""
        if not update:
            return super().model_copy(deep=deep)
        data = {name: getattr(self, name) for name in self.model_fields_set}
        data.update(update)
        return type(self)(**data)


class _Options(ValidatedModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    SECTION: ClassVar[str] = ""
    """The table of ``rayito-agent.toml`` the model reads."""


class EgressBudgetOptions(_Options):
    """One per-target rate envelope (a ``[[egress.budgets]]`` entry)."""

    SECTION: ClassVar[str] = "egress.budgets"

    target: str
    """``https://api.example.com``, with an optional path class (``/v1/chat``) or query class
    (``?model``)."""
    rate: Union[str, int, float]
    """``"60/minute"``, ``"10/second"``..., or a number per second."""
    burst: int = Field(1, ge=1, le=MAX_BURST)

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return declared_target(value)

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: Union[str, int, float]) -> Union[str, int, float]:
        try:
            parse_rate(value)
        except RateError as exc:  # the report puts the value in front of the reason
            raise ValueError(exc.reason) from None
        return value

    @property
    def rate_per_second(self) -> float:
        return parse_rate(self.rate)


class EgressOptions(_Options):
    """How fast the fleet's agents may send requests to each target (the ``[egress]`` table of
    ``rayito-constructs.toml``). Where they may send them is the product's ``[network] allow_out``."""

    SECTION: ClassVar[str] = "egress"

    budgets: tuple[EgressBudgetOptions, ...] = ()
    """Per-target rate envelopes (``[[egress.budgets]]``). Default: none (no EgressBudget)."""
    default_rate: Union[str, int, float] = "60/minute"
    """Envelope of a target no budget declares. Default: 60/minute."""
    default_burst: int = Field(5, ge=1, le=MAX_BURST)

    @field_validator("default_rate")
    @classmethod
    def _default_rate(cls, value: Union[str, int, float]) -> Union[str, int, float]:
        return EgressBudgetOptions._rate(value)

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value

    @field_validator("budgets")
    @classmethod
    def _one_envelope_per_target(cls, value: tuple[EgressBudgetOptions, ...]) -> tuple[EgressBudgetOptions, ...]:
        """One envelope per target (essay 002): two entries whose targets are one target once
        normalized (``https://API.example.com`` and ``https://api.example.com:443/``, ``straße.de``
        and ``xn--strae-oqa.de``) would each write their envelope over the other's."""
        first: dict[str, int] = {}
        clashes = []
        for index, budget in enumerate(value):
            if budget.target in first:
                clashes.append(f"budgets[{first[budget.target]}] and budgets[{index}] both declare "
                               f"{budget.target!r}: one envelope per target, keep one of them")
            else:
                first[budget.target] = index
        if clashes:
            raise value_error("; ".join(clashes))
        return value


def egress_declaration(egress: EgressOptions) -> dict[str, Any]:
    """The envelopes as the agents' ``BudgetClient.from_declaration`` reads them (the image's
    ``RAYITO_EGRESS_ENVELOPES``): rates per second, targets normalized."""
    return {
        "budgets": [{"target": b.target, "rate_per_second": b.rate_per_second, "burst": b.burst} for b in egress.budgets],
        "default": {"rate_per_second": parse_rate(egress.default_rate), "burst": egress.default_burst},
    }


def option_models() -> Iterable[type[_Options]]:
    return (EgressOptions, EgressBudgetOptions)
