"""Overrides typed as text (CLI flags, ``cdk -c key=value``) turned into the values of ``AgentProject.load``.

One table decides how each option is read, so ``plan --min-vms 2`` and ``cdk synth -c min_vms=2``
mean the same thing and fail with the same message.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .errors import Problem, ProjectError, show
from .options import parse_duration


def _whole(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def _pairs(value: Any) -> Any:
    """``["A=1", "B=2"]`` or ``"A=1,B=2"`` → ``{"A": "1", "B": "2"}``; a mapping stays as is."""
    if isinstance(value, Mapping):
        return dict(value)
    items = value.split(",") if isinstance(value, str) else list(value)
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, val = str(item).partition("=")
        if not sep or not name:
            raise ValueError(f"{show(item)} is not NAME=VALUE")
        pairs[name.strip()] = val
    return pairs


def _names(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def _flag(value: Any) -> Any:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in {"true", "yes", "1", "on"}:
            return True
        if lowered in {"false", "no", "0", "off"}:
            return False
    return value


READERS: dict[str, Callable[[Any], Any]] = {
    "name": str,
    "target": str,
    "sessions": str,
    "memory_mib": _whole,
    "max_concurrency": _whole,
    "queue_max": _whole,
    "min_vms": _whole,
    "max_vms": _whole,
    "warm_vms": _whole,
    "queue_timeout_seconds": _duration,
    "scale_in_after_seconds": _duration,
    "idle": _duration,
    "env": _pairs,
    "secret_env": _pairs,
    "allow_out": _names,
    "save_recipe": _flag,
}


def read_overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Convert text overrides; unknown keys pass through for ``AgentProject.load`` to reject."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in raw.items():
        reader = READERS.get(key)
        if reader is None:
            values[key] = value
            continue
        try:
            values[key] = reader(value)
        except ValueError as exc:
            problems.append(Problem(key, f"{key}: {exc}"))
    if problems:
        raise ProjectError(problems)
    return values
