"""Reading a policy document without the simulator (pure): which Allow statement covers an action on a
resource. Used only to tell the simulator's known false deny from a real one; the verdicts
themselves come from IAM's simulator."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable, Optional


def statements(document: Any) -> list[dict[str, Any]]:
    if not isinstance(document, dict):
        return []
    found = document.get("Statement", [])
    return [s for s in (found if isinstance(found, list) else [found]) if isinstance(s, dict)]


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in (value if isinstance(value, list) else [value])]


@lru_cache(maxsize=1024)
def _pattern(glob: str, case_insensitive: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(f"^{body}$", re.IGNORECASE if case_insensitive else 0)


def matches(patterns: Iterable[str], value: str, *, case_insensitive: bool = False) -> bool:
    """IAM wildcard matching (``*`` and ``?``); actions match case-insensitively."""
    return any(_pattern(p, case_insensitive).match(value) for p in patterns)


def _covers(statement: dict[str, Any], action: str, resource: str) -> bool:
    if "Action" in statement:
        if not matches(_as_list(statement["Action"]), action, case_insensitive=True):
            return False
    elif "NotAction" in statement:
        if matches(_as_list(statement["NotAction"]), action, case_insensitive=True):
            return False
    else:
        return False
    if "Resource" in statement:
        return matches(_as_list(statement["Resource"]), resource)
    if "NotResource" in statement:
        return not matches(_as_list(statement["NotResource"]), resource)
    return False


def granting_statement(documents: Iterable[Any], action: str, resource: str) -> Optional[str]:
    """The Sid (or ``#<index>``) of an Allow statement that covers ``action`` on ``resource``,
    conditions aside; None when no statement does or a Deny statement covers it."""
    found = None
    for document in documents:
        for index, statement in enumerate(statements(document)):
            if not _covers(statement, action, resource):
                continue
            if statement.get("Effect") == "Deny":
                return None
            if statement.get("Effect") == "Allow" and found is None:
                found = str(statement.get("Sid") or f"#{index}")
    return found
