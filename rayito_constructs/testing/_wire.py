"""The ``lambda-microvms`` wire protocol, read from the installed botocore model.

Routes, status codes, input locations, constraints and error shapes all come from
``botocore/data/lambda-microvms/2025-09-09/service-2.json`` rather than being retyped, so the
emulator follows the SDK its users run.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional
from urllib.parse import parse_qs, unquote

from botocore.model import OperationModel, Shape

from .exceptions import WireError, validation
from .service_model import bundled_service_model, service_model

__all__ = ["WireError", "validation", "constraint", "service_model", "bundled_service_model", "routes", "match", "parse_input", "check", "encode_output"]

@dataclass(frozen=True)
class Route:
    operation: str
    method: str
    pattern: re.Pattern[str]
    status: int


def _compile(uri: str) -> re.Pattern[str]:
    path = uri.split("?", 1)[0]
    regex = ""
    for part in re.split(r"(\{[^}]+\})", path):
        if part.startswith("{"):
            name = part[1:-1]
            greedy = name.endswith("+")
            name = name.rstrip("+")
            regex += f"(?P<{name}>{'.+' if greedy else '[^/]+'})"
        else:
            regex += re.escape(part)
    return re.compile(f"^{regex}$")


@lru_cache(maxsize=1)
def routes() -> tuple[Route, ...]:
    """One route per operation of the model."""
    model = service_model()
    found = []
    for name in model.operation_names:
        op = model.operation_model(name)
        found.append(Route(name, op.http["method"], _compile(op.http["requestUri"]), int(op.http.get("responseCode", 200))))
    return tuple(found)


@lru_cache(maxsize=16)
def _routes_for(method: str) -> tuple[Route, ...]:
    return tuple(r for r in routes() if r.method == method)


def match(method: str, path: str) -> Optional[tuple[Route, dict[str, str]]]:
    """The operation a request names, with its URI labels (URL-decoded)."""
    for route in _routes_for(method):
        found = route.pattern.match(path)
        if found:
            return route, {k: unquote(v) for k, v in found.groupdict().items()}
    return None


def path_exists(path: str) -> bool:
    return any(r.pattern.match(path) for r in routes())


def parse_input(op: OperationModel, labels: Mapping[str, str], query: str, body: bytes) -> dict[str, Any]:
    """Decode a request into the operation's input members, then check them against the model."""
    shape = op.input_shape
    params: dict[str, Any] = {}
    if body:
        try:
            decoded = json.loads(body)
        except ValueError:
            raise validation("The request body is not valid JSON") from None
        if not isinstance(decoded, dict):
            raise validation("The request body must be a JSON object")
        params.update(decoded)
    if shape is None:
        return params
    qs = parse_qs(query, keep_blank_values=True)
    for name, member in shape.members.items():
        location = member.serialization.get("location")
        wire_name = member.serialization.get("name", name)
        if location == "uri":
            if wire_name in labels:
                params[name] = labels[wire_name]
        elif location == "querystring" and wire_name in qs:
            values = qs[wire_name]
            if member.type_name == "list":
                params[name] = values
            elif member.type_name == "integer":
                try:
                    params[name] = int(values[0])
                except ValueError:
                    raise validation(f"{name} must be an integer") from None
            elif member.type_name == "boolean":
                params[name] = values[0].lower() == "true"
            else:
                params[name] = values[0]
    check(shape, params, "")
    return params


def check(shape: Shape, value: Any, path: str) -> None:
    """Check a value against a model shape: what the service rejects and botocore lets through
    (maximums, enums, patterns), and everything else a hand-made request could get wrong."""
    checker = _CHECKS.get(shape.type_name)
    if checker is not None:
        checker(shape, value, path, path or shape.name)


def _check_structure(shape: Shape, value: Any, path: str, where: str) -> None:
    if not isinstance(value, dict):
        raise validation(f"{where} must be an object")
    for required in shape.required_members:
        if value.get(required) is None:
            raise validation(f"{_join(path, required)} is required")
    if shape.metadata.get("union") and sum(1 for k in value if k in shape.members) != 1:
        raise validation(f"{where} must set exactly one of {', '.join(shape.members)}")
    for key, member in shape.members.items():
        if key in value and value[key] is not None:
            check(member, value[key], _join(path, key))


def _check_list(shape: Shape, value: Any, path: str, where: str) -> None:
    if not isinstance(value, list):
        raise validation(f"{where} must be a list")
    _size(where, len(value), shape.metadata, "items")
    for i, item in enumerate(value):
        check(shape.member, item, f"{where}[{i}]")


def _check_map(shape: Shape, value: Any, path: str, where: str) -> None:
    if not isinstance(value, dict):
        raise validation(f"{where} must be a map")
    _size(where, len(value), shape.metadata, "entries")
    for key, item in value.items():
        check(shape.key, key, f"{where} key")
        check(shape.value, item, f"{where}.{key}")


def _check_string(shape: Shape, value: Any, path: str, where: str) -> None:
    meta = shape.metadata
    if not isinstance(value, str):
        raise validation(f"{where} must be a string")
    _size(where, len(value), meta, "characters")
    if "enum" in meta and value not in meta["enum"]:
        raise validation(f"{where}: '{value}' is not one of {', '.join(meta['enum'])}")
    pattern = meta.get("pattern")
    if pattern and not _pattern(pattern).fullmatch(value):
        raise validation(f"{where}: '{value}' does not match {pattern}")


def _check_integer(shape: Shape, value: Any, path: str, where: str) -> None:
    meta = shape.metadata
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation(f"{where} must be an integer")
    if "min" in meta and value < meta["min"]:
        raise constraint(where, f"Member must have value greater than or equal to {meta['min']}", value)
    if "max" in meta and value > meta["max"]:
        raise constraint(where, f"Member must have value less than or equal to {meta['max']}", value)


def _check_boolean(shape: Shape, value: Any, path: str, where: str) -> None:
    if not isinstance(value, bool):
        raise validation(f"{where} must be a boolean")


#: How :func:`check` checks a value of each shape type (``(shape, value, path, where)``); the other
#: types (timestamps, blobs, doubles) pass as botocore serialized them.
_CHECKS: dict[str, Callable[[Shape, Any, str, str], None]] = {
    "structure": _check_structure,
    "list": _check_list,
    "map": _check_map,
    "string": _check_string,
    "integer": _check_integer,
    "long": _check_integer,
    "boolean": _check_boolean,
}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def constraint(where: str, rule: str, value: Any = None) -> WireError:
    """A ValidationException in the service's constraint wording: [M 2026-09-15] a 4,097-character
    ``runHookPayload`` -> "Member must have length less than or equal to 4096" (GT §6, Q11), the
    phrase AWS's request validation uses for every length (strings, lists, maps); values as
    "Member must have value less than or equal to N". Only numbers are echoed: a string may be
    long or sensitive (``runHookPayload`` is)."""
    shown = f" '{value}'" if isinstance(value, int) and not isinstance(value, bool) else ""
    return validation(f"1 validation error detected: Value{shown} at '{where}' failed to satisfy constraint: {rule}")


def _size(where: str, size: int, meta: Mapping[str, Any], unit: str) -> None:
    # ``unit`` (characters, items, entries) is not named: the service says "length" for all three.
    if "min" in meta and size < meta["min"]:
        raise constraint(where, f"Member must have length greater than or equal to {meta['min']}")
    if "max" in meta and size > meta["max"]:
        raise constraint(where, f"Member must have length less than or equal to {meta['max']}")


@lru_cache(maxsize=256)
def _pattern(pattern: str) -> re.Pattern[str]:
    # The model's patterns use \p{L}-style classes in a few places (tags); Python's re lacks them.
    return re.compile(pattern.replace(r"\p{L}", "A-Za-z\u00c0-\uffff").replace(r"\p{Z}", " ").replace(r"\p{N}", "0-9"))


def encode_output(op: OperationModel, data: Mapping[str, Any]) -> bytes:
    """Serialize an operation's output members as its JSON body (timestamps as epoch seconds;
    members that are None left out: nested views leave theirs out themselves)."""
    shape = op.output_shape
    if shape is None or not shape.members:
        return b"{}" if op.http.get("responseCode", 200) != 204 else b""
    members = shape.members
    return json.dumps({k: v for k, v in data.items() if v is not None and k in members}, default=_timestamp).encode()


def _timestamp(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
