"""Problems and warnings, shaped the way the product page and the house style want them.

A problem names the key, the value given and what is allowed, on one line. Every problem of an
input is collected before anything is raised, so a user fixes them all in one go.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: ``key`` and a one-line ``message`` that starts with it."""

    key: str
    message: str
    related: tuple[str, ...] = ()
    """For a rule across options (``min_vms <= max_vms``): every option it is about."""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class FleetWarning:
    """A warning with the product page's code (``recipe_too_large``, ``option_not_supported``...)."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class ProjectError(ValueError):
    """Raised when an agent project or its overrides are invalid; ``problems`` lists every one."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(p.message for p in self.problems))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'max_vms'?"`` for the nearest known key, or ``""`` when none is close."""
    known = list(choices)
    # Case first (-c MAX_VMS=5, Max_VMs in the file): keys are lower case, a shout is no typo.
    by_case = {k.casefold(): k for k in known}
    if word.casefold() in by_case:
        return f"; did you mean '{by_case[word.casefold()]}'?"
    close = difflib.get_close_matches(word.casefold(), known, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def show(value: object) -> str:
    """A value as a user typed it: strings quoted, everything else as is."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
