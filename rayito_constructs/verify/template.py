"""Resolve the values of a deployed template (pure): ``Ref``, ``Fn::GetAtt``, ``Fn::Join`` and
``Fn::Sub`` against the stack's physical ids and a few known attributes. Anything else is
:class:`Unresolved`: verify then says it cannot compute the value instead of guessing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional


class Unresolved(ValueError):
    """A value that depends on something verify cannot know."""


def resolve(value: Any, *, pseudo: Mapping[str, str], physical: Mapping[str, str],
            attribute: Callable[[str, str], Optional[str]]) -> Any:
    """The value with every intrinsic function replaced, or :class:`Unresolved`."""
    return _Resolver(pseudo, physical, attribute).go(value)


@dataclass(frozen=True)
class _Resolver:
    pseudo: Mapping[str, str]
    physical: Mapping[str, str]
    attribute: Callable[[str, str], Optional[str]]

    def go(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self.go(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) != 1:
            return {k: self.go(x) for k, x in v.items()}
        (key, arg), = v.items()
        function = _FUNCTIONS.get(key)
        if function is not None:
            return function(self, arg)
        if key.startswith("Fn::") or key == "Condition":
            raise Unresolved(key)
        return {key: self.go(arg)}

    def ref(self, arg: Any) -> Any:
        if arg in self.pseudo:
            return self.pseudo[arg]
        if arg in self.physical:
            return self.physical[arg]
        raise Unresolved(f"Ref {arg}")

    def get_att(self, arg: Any) -> Any:
        lid, attr = (arg.split(".", 1) if isinstance(arg, str) else arg)
        found = self.attribute(lid, attr)
        if found is None:
            raise Unresolved(f"Fn::GetAtt {lid}.{attr}")
        return found

    def join(self, arg: Any) -> Any:
        sep, parts = arg
        return str(sep).join(str(self.go(p)) for p in self.go(parts))

    def sub(self, arg: Any) -> Any:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        variables = {k: self.go(x) for k, x in variables.items()}

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if "." in name:
                return str(self.go({"Fn::GetAtt": name.split(".", 1)}))
            return str(self.go({"Ref": name}))
        return re.sub(r"\$\{([^}]+)\}", one, text)


#: The intrinsic functions :func:`resolve` computes.
_FUNCTIONS: dict[str, Callable[[_Resolver, Any], Any]] = {
    "Ref": _Resolver.ref,
    "Fn::GetAtt": _Resolver.get_att,
    "Fn::Join": _Resolver.join,
    "Fn::Sub": _Resolver.sub,
}
