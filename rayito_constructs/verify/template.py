"""Resolve the values of a deployed template (pure): ``Ref``, ``Fn::GetAtt``, ``Fn::Join`` and
``Fn::Sub`` against the stack's physical ids and a few known attributes. Anything else is
:class:`Unresolved`: verify then says it cannot compute the value instead of guessing."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional


class Unresolved(ValueError):
    """A value that depends on something verify cannot know."""


def resolve(value: Any, *, pseudo: Mapping[str, str], physical: Mapping[str, str],
            attribute: Callable[[str, str], Optional[str]]) -> Any:
    """The value with every intrinsic function replaced, or :class:`Unresolved`."""
    def go(v: Any) -> Any:
        if isinstance(v, list):
            return [go(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) != 1:
            return {k: go(x) for k, x in v.items()}
        (key, arg), = v.items()
        if key == "Ref":
            if arg in pseudo:
                return pseudo[arg]
            if arg in physical:
                return physical[arg]
            raise Unresolved(f"Ref {arg}")
        if key == "Fn::GetAtt":
            lid, attr = (arg.split(".", 1) if isinstance(arg, str) else arg)
            found = attribute(lid, attr)
            if found is None:
                raise Unresolved(f"Fn::GetAtt {lid}.{attr}")
            return found
        if key == "Fn::Join":
            sep, parts = arg
            return str(sep).join(str(go(p)) for p in go(parts))
        if key == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            variables = {k: go(x) for k, x in variables.items()}

            def sub(match: re.Match[str]) -> str:
                name = match.group(1)
                if name.startswith("!"):
                    return "${" + name[1:] + "}"
                if name in variables:
                    return str(variables[name])
                if "." in name:
                    return str(go({"Fn::GetAtt": name.split(".", 1)}))
                return str(go({"Ref": name}))
            return re.sub(r"\$\{([^}]+)\}", sub, text)
        if key.startswith("Fn::") or key == "Condition":
            raise Unresolved(key)
        return {key: go(arg)}
    return go(value)
