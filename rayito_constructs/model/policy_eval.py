"""An offline evaluator of IAM identity policies: is ``action`` on ``resource``, with this request
context, allowed by these policy documents? Pure and stdlib only.

What it is for: the proof that the product's own AWS calls are allowed by the fleet's policies
(tests/test_product_iam.py records every call and asks this module), ``rayito-constructs verify``
telling the simulator's known false deny from a real one, and the invariants' tests. No library
kept on PyPI passed the table of cases this proof needs (``tests/test_policy_eval.py``):
principalmapper 1.1.5 does not import on Python 3.10 and later and matches resources
case-insensitively and unescaped; moto 5.2's ``IAMPolicy`` ignores conditions and ``NotResource``;
sibyl-aws 0.3 evaluates only its own few condition keys (``shared/research/product-iam.md``, 5.1).

The semantics, from the IAM JSON policy reference ("Policy evaluation logic", "Condition
operators", "Policy variables"):

* **Decision**: an explicit ``Deny`` in any document wins, then an ``Allow`` in any document, else
  the implicit deny. With ``boundaries`` (a permissions boundary), an Allow must also be allowed by
  the boundary's documents. Resource policies, SCPs and session policies are out of scope.
* **Action** / ``NotAction``: case-insensitive, ``*`` and ``?`` wildcards.
* **Resource** / ``NotResource``: case-sensitive, ``*`` and ``?`` wildcards that match across
  ``:`` and ``/``; policy variables ``${key}`` are substituted from the context (``${*}``, ``${?}``
  and ``${$}`` are the literal characters); a variable whose key is absent makes that entry match
  nothing. Version ``2008-10-17`` documents have no variables. A statement with neither
  ``Resource`` nor ``NotResource`` matches nothing (identity policies must name one).
* **Condition**: every operator and every key must match (AND); one of a key's values is enough
  (OR); negated operators (``StringNotEquals``...) match when none of the values does. Keys are
  case-insensitive. ``...IfExists`` matches when the key is absent; an absent key fails every
  other operator but the negated ones and ``Null``. ``ForAllValues:`` holds for an absent or empty
  key, ``ForAnyValue:`` does not. A single-valued operator on a multi-valued key matches when any
  value does.
* Operators: ``String*``, ``Arn*`` (``ArnEquals`` and ``ArnLike`` both match each of the six
  colon-separated parts with wildcards), ``Numeric*``, ``Date*``, ``Bool``, ``Null``,
  ``IpAddress``/``NotIpAddress``, ``BinaryEquals``. An operator this module does not know
  raises :class:`PolicyError`: it never allows by accident.
* ``Principal``/``NotPrincipal`` (resource and trust policies) raise :class:`PolicyError`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping, Optional, Sequence

Context = Mapping[str, Any]


class PolicyError(ValueError):
    """A document this evaluator cannot decide on (an unknown operator, a principal)."""


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


@lru_cache(maxsize=8192)
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def glob_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's wildcard match: ``*`` any run of characters (``:`` and ``/`` included), ``?`` one."""
    return _glob(pattern, ignore_case).match(value) is not None


def action_matches(pattern: str, action: str) -> bool:
    """IAM's action match: case-insensitive, with wildcards (``ssm:Put*``, ``SSM:p?tparameter``)."""
    return glob_match(pattern, action, ignore_case=True)


_VARIABLE = re.compile(r"\$\{([^}]*)\}")
#: Placeholders for a literal ``*`` and ``?`` inside a pattern (an escape or a variable's value).
_STAR, _QUESTION = "\x00", "\x01"


def _lookup(context: Context, key: str) -> Any:
    lowered = key.lower()
    for name, value in context.items():
        if name.lower() == lowered:
            return value
    return None


def _substitute(pattern: str, context: Context) -> Optional[str]:
    """``pattern`` with its variables replaced (their values taken literally); None when a
    variable's key is absent or multi-valued."""
    missing = False

    def value_of(match: re.Match[str]) -> str:
        nonlocal missing
        key = match.group(1)
        if key in ("*", "?", "$"):
            return {"*": _STAR, "?": _QUESTION, "$": "$"}[key]
        value = _lookup(context, key)
        if value is None or isinstance(value, (list, tuple)):
            missing = True
            return ""
        return str(value).replace("*", _STAR).replace("?", _QUESTION)

    out = _VARIABLE.sub(value_of, pattern)
    return None if missing else out


def _literal_aware_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    body = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape("*" if c == _STAR else "?" if c == _QUESTION else c)
        for c in pattern
    )
    return re.match(f"^{body}$", value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def _pattern_match(pattern: str, value: str, context: Context, variables: bool, ignore_case: bool = False) -> bool:
    if not variables or "${" not in pattern:
        return glob_match(pattern, value, ignore_case=ignore_case)
    substituted = _substitute(pattern, context)
    return substituted is not None and _literal_aware_match(substituted, value, ignore_case)


def _plain(pattern: str, context: Context, variables: bool) -> Optional[str]:
    """A condition value with its variables replaced, for the exact-match operators."""
    if not variables or "${" not in pattern:
        return pattern
    substituted = _substitute(pattern, context)
    if substituted is None:
        return None
    return substituted.replace(_STAR, "*").replace(_QUESTION, "?")


def _arn_match(pattern: str, value: str, context: Context, variables: bool) -> bool:
    parts, values = pattern.split(":", 5), str(value).split(":", 5)
    if len(parts) != 6 or len(values) != 6:
        return False
    return all(_pattern_match(p, v, context, variables) for p, v in zip(parts, values, strict=True))


def _number(value: Any) -> float:
    return float(value)


def _date(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    text = str(value)
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text):  # epoch seconds
        return dt.datetime.fromtimestamp(float(text), dt.timezone.utc)
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _bool(value: Any) -> str:
    return str(value).lower()


def _ip(policy: Any, value: Any) -> bool:
    return ipaddress.ip_address(str(value)) in ipaddress.ip_network(str(policy), strict=False)


#: Positive operators: (policy value, request value, context, variables) -> match.
_POSITIVE = {
    "StringEquals": lambda p, v, c, x: (q := _plain(str(p), c, x)) is not None and str(v) == q,
    "StringEqualsIgnoreCase": lambda p, v, c, x: (q := _plain(str(p), c, x)) is not None and str(v).lower() == q.lower(),
    "StringLike": lambda p, v, c, x: _pattern_match(str(p), str(v), c, x),
    "ArnEquals": lambda p, v, c, x: _arn_match(str(p), str(v), c, x),
    "ArnLike": lambda p, v, c, x: _arn_match(str(p), str(v), c, x),
    "NumericEquals": lambda p, v, c, x: _number(v) == _number(p),
    "NumericLessThan": lambda p, v, c, x: _number(v) < _number(p),
    "NumericLessThanEquals": lambda p, v, c, x: _number(v) <= _number(p),
    "NumericGreaterThan": lambda p, v, c, x: _number(v) > _number(p),
    "NumericGreaterThanEquals": lambda p, v, c, x: _number(v) >= _number(p),
    "DateEquals": lambda p, v, c, x: _date(v) == _date(p),
    "DateLessThan": lambda p, v, c, x: _date(v) < _date(p),
    "DateLessThanEquals": lambda p, v, c, x: _date(v) <= _date(p),
    "DateGreaterThan": lambda p, v, c, x: _date(v) > _date(p),
    "DateGreaterThanEquals": lambda p, v, c, x: _date(v) >= _date(p),
    "Bool": lambda p, v, c, x: _bool(v) == _bool(p),
    "BinaryEquals": lambda p, v, c, x: str(v) == str(p),
    "IpAddress": lambda p, v, c, x: _ip(p, v),
}
#: Negated operators and the positive one they negate.
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
    "NumericNotEquals": "NumericEquals",
    "DateNotEquals": "DateEquals",
    "NotIpAddress": "IpAddress",
}


def _key_matches(operator: str, key: str, values: Sequence[Any], context: Context, variables: bool) -> bool:
    qualifier = None
    if ":" in operator:
        qualifier, operator = operator.split(":", 1)
        if qualifier not in ("ForAnyValue", "ForAllValues"):
            raise PolicyError(f"unknown set operator {qualifier!r} in {qualifier}:{operator}")
    if_exists = operator.endswith("IfExists") and operator != "IfExists"
    if if_exists:
        operator = operator[: -len("IfExists")]
    present = _lookup(context, key)
    if operator == "Null":
        if qualifier or if_exists:
            raise PolicyError(f"Null takes no set operator or IfExists ({key})")
        return (present is None) == (_bool(values[0]) == "true")
    negated = operator in _NEGATED
    positive = _NEGATED.get(operator, operator)
    test = _POSITIVE.get(positive)
    if test is None:
        raise PolicyError(f"unsupported condition operator {operator!r}")
    request_values = as_list(present)
    if present is None or (qualifier and not request_values):
        if if_exists or qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return negated

    def one(value: Any) -> bool:
        hit = any(test(p, value, context, variables) for p in values)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in request_values)
    return any(one(v) for v in request_values)


def condition_matches(condition: Optional[Mapping[str, Mapping[str, Any]]], context: Context,
                      *, variables: bool = True) -> bool:
    """Whether a statement's ``Condition`` block holds for the request context."""
    if not condition:
        return True
    return all(
        _key_matches(operator, key, as_list(values), context, variables)
        for operator, block in condition.items()
        for key, values in block.items()
    )


def statement_matches(statement: Mapping[str, Any], action: str, resource: str, context: Context,
                      *, variables: bool = True) -> bool:
    """Whether one statement applies to the request (its effect aside)."""
    if "Principal" in statement or "NotPrincipal" in statement:
        raise PolicyError("a statement with a principal: resource and trust policies are out of scope")
    if "Action" in statement:
        if not any(action_matches(str(a), action) for a in as_list(statement["Action"])):
            return False
    elif "NotAction" in statement:
        if any(action_matches(str(a), action) for a in as_list(statement["NotAction"])):
            return False
    else:
        return False
    if "Resource" in statement:
        if not any(_pattern_match(str(r), resource, context, variables) for r in as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement:
        if any(_pattern_match(str(r), resource, context, variables) for r in as_list(statement["NotResource"])):
            return False
    else:
        return False
    return condition_matches(statement.get("Condition"), context, variables=variables)


@dataclass(frozen=True)
class Decision:
    """The outcome of one request: allowed or not, and the Sids that decided it."""

    allowed: bool
    allow_sids: tuple[str, ...] = ()
    deny_sids: tuple[str, ...] = ()
    outside_boundary: bool = False

    @property
    def label(self) -> str:
        if self.allowed:
            return "allowed"
        if self.deny_sids:
            return "explicitDeny"
        return "implicitDeny"


def _matches(documents: Iterable[Mapping[str, Any]], action: str, resource: str,
             context: Context) -> tuple[list[str], list[str]]:
    allow: list[str] = []
    deny: list[str] = []
    for document in documents:
        variables = str(document.get("Version", "2012-10-17")) != "2008-10-17"
        for index, statement in enumerate(as_list(document.get("Statement"))):
            if not statement_matches(statement, action, resource, context, variables=variables):
                continue
            sid = str(statement.get("Sid") or f"#{index}")
            effect = statement.get("Effect")
            if effect == "Deny":
                deny.append(sid)
            elif effect == "Allow":
                allow.append(sid)
            else:
                raise PolicyError(f"statement {sid}: Effect {effect!r} is not Allow or Deny")
    return allow, deny


def evaluate(documents: Iterable[Mapping[str, Any]], action: str, resource: str,
             context: Optional[Context] = None, *,
             boundaries: Optional[Iterable[Mapping[str, Any]]] = None) -> Decision:
    """Decide one request against a principal's identity policies (and its boundary's)."""
    context = context or {}
    allow, deny = _matches(list(documents), action, resource, context)
    outside = False
    if boundaries is not None:
        bound_allow, bound_deny = _matches(list(boundaries), action, resource, context)
        deny += bound_deny
        outside = not bound_allow
    return Decision(allowed=bool(allow) and not deny and not outside, allow_sids=tuple(allow),
                    deny_sids=tuple(deny), outside_boundary=outside)


@dataclass(frozen=True)
class Request:
    """One request IAM authorizes: an action on a resource with its context."""

    action: str
    resource: str
    context: Mapping[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.action, self.resource, tuple(sorted((k, str(v)) for k, v in self.context.items())))
