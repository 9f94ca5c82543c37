"""What may name a fleet, the stack name derived from it, and one place per name in an app.

A fleet's name becomes physical names (see docs/options.md, "name"):

* the MicroVM image ``<name>`` (``CreateMicrovmImage.imageName``: 1 to 64 of ``[a-zA-Z0-9-_]``,
  the service model of lambda-microvms 2025-09-09, ``shapes.ImageName``);
* the recipe parameter ``/rayito/agents/<name>/recipe`` (SSM names: letters, digits, ``_.-/``);
* the log group ``/aws/lambda-microvms/<name>`` and the metrics' ``fleet`` dimension;
* the stack ``RayitoFleet-<name>`` of ``app.py`` (CloudFormation: ``[A-Za-z][A-Za-z0-9-]*``, at most
  128 characters), which has no ``_``.

The image's rule is the narrowest of the first three, so it is the fleet name's rule; the stack
name is derived from the fleet name so that every valid name has one (``my_agent`` gives
``RayitoFleet-my-agent-<hash>``: the hash keeps ``my_agent`` and ``my-agent`` apart).

Pure functions, except :func:`claim`, which records which construct holds a physical name in
a CDK app and refuses a second holder in the same account and region.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import weakref
from dataclasses import dataclass
from typing import Any, Optional

FLEET_NAME_MAX = 64
_FLEET_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_STACK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")
STACK_PREFIX = "RayitoFleet-"
NAME_RULE = "1 to 64 letters (A-Z, a-z), digits, '-' or '_'"
NAME_USES = "it names the MicroVM image, the stack and /rayito/agents/<name>/recipe"


def fleet_name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot name a fleet (the text after ``name: ``), or None when it can."""
    if not isinstance(name, str):
        return f"{name!r} is not a string"
    if _FLEET_NAME.fullmatch(name):
        return None
    shown = repr(name)
    if name in (".", ".."):
        return (
            f"{shown} cannot name a fleet: a name must be {NAME_RULE} ({NAME_USES}); the product "
            "page deploys a fleet named . or .. without a recipe, this library names its image after it"
        )
    why = "is longer than 64 characters" if len(name) > FLEET_NAME_MAX else f"must be {NAME_RULE}"
    hint = suggested_name(name)
    return f"{shown} {why} ({NAME_USES})" + (f"; for example {hint!r}" if hint else "")


def is_fleet_name(name: object) -> bool:
    return fleet_name_problem(name) is None


def suggested_name(name: str) -> Optional[str]:
    """A valid name close to ``name`` (accents and full-width letters folded to ASCII, other
    characters become ``-``), or None."""
    folded = "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", folded).strip("-")[:FLEET_NAME_MAX].strip("-")
    return cleaned if cleaned and cleaned != name else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def is_stack_name(name: str) -> bool:
    return bool(_STACK_NAME.fullmatch(name))


def safe_stack_name(wanted: str) -> str:
    """``wanted`` when CloudFormation accepts it as a stack name; otherwise a name derived from it.

    Characters a stack name cannot have become ``-`` and a hash of ``wanted`` is appended, so two
    different inputs never meet on one stack name (``a_b`` and ``a-b`` differ).
    """
    if is_stack_name(wanted):
        return wanted
    body = re.sub(r"[^A-Za-z0-9-]+", "-", wanted)
    if not body[:1].isascii() or not body[:1].isalpha():
        body = "S-" + body
    suffix = "-" + _digest(wanted)
    return body[: 128 - len(suffix)] + suffix


def stack_name_for(fleet_name: str) -> str:
    """The stack name of ``app.py`` for a fleet: ``RayitoFleet-<name>``, made safe."""
    return safe_stack_name(STACK_PREFIX + fleet_name)


# ---------------------------------------------------------------------------- one holder a name


@dataclass(frozen=True)
class _Claim:
    kind: str
    name: str
    account: Optional[str]  # None: not known at synth (an environment-agnostic stack)
    region: Optional[str]
    path: str


_CLAIMS: "weakref.WeakKeyDictionary[Any, list[_Claim]]" = weakref.WeakKeyDictionary()

#: What two holders of one name would each make, for the error message.
_CLASHES = {
    "fleet": "two MicrovmImage named {name!r}, two writers of /rayito/agents/{name}/recipe and two "
    "reconcilers of one fleet",
    "image": "two MicrovmImage named {name!r}",
    "recipe parameter": "two writers of {name}",
}


def _overlap(a: Optional[str], b: Optional[str]) -> bool:
    return a is None or b is None or a == b


def claim(scope: Any, kind: str, name: str) -> None:
    """Record that the construct ``scope`` holds the ``kind`` named ``name`` in its account and region.

    Raises ``ValueError`` (one line, naming both construct paths) when another construct of the
    same app already holds it where the two could meet: the same account and region, or one not
    known at synth (an environment-agnostic stack may be deployed anywhere).
    """
    import aws_cdk as cdk

    stack = cdk.Stack.of(scope)
    account = None if cdk.Token.is_unresolved(stack.account) else stack.account
    region = None if cdk.Token.is_unresolved(stack.region) else stack.region
    mine = _Claim(kind, name, account, region, scope.node.path)
    root = scope.node.root
    held = _CLAIMS.setdefault(root, [])
    for other in held:
        if other.kind == kind and other.name == name and _overlap(other.account, account) and _overlap(other.region, region):
            where = (
                f"account {account or other.account or '(any)'}, region {region or other.region or '(any)'}"
            )
            clash = _CLASHES.get(kind, "two of them").format(name=name)
            raise ValueError(
                f"name: the {kind} {name!r} is defined twice in one app for the same place ({where}): "
                f"at {other.path} and at {mine.path}; that would deploy {clash}: give one of them "
                "another name, or put them in different accounts or regions"
            )
    held.append(mine)
