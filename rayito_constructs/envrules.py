"""The rule that tells whether an environment variable name looks like a secret.

It is the product page's ``--env`` rule, word for word:

* the name ends in ``_TOKEN``, ``_KEY``, ``_SECRET``, ``_PASSWORD`` (and the same family:
  ``_PASSPHRASE``, ``_APIKEY``);
* or one of its segments is ``PASS``, ``PASSWD``, ``PAT``, ``CREDENTIAL`` or ``CREDENTIALS``
  (``DB_PASS``, ``GITHUB_PAT``);
* or ``AUTH`` or ``BEARER`` is its last segment or stands next to ``TOKEN``, ``KEY`` or ``HEADER``
  (``X_AUTH``, ``AUTH_HEADER``).

``AUTH_MODE`` and ``AUTHOR_NAME`` are accepted: segments are compared whole, so ``AUTHOR`` is not
``AUTH``, and ``AUTH`` followed by ``MODE`` matches no clause. Segments are the parts between
underscores.

The page's patterns are read as written: ``*_TOKEN`` needs the underscore, so bare ``TOKEN``,
``KEY`` or ``SECRET`` are accepted (a one-segment ``PASS`` or ``AUTH`` still matches its own
clause), and the words are upper case as on the page, so ``github_token`` is accepted by this
rule: it is a name rule, and nothing secret belongs in ``env`` whatever its name.
"""

from __future__ import annotations

import re

SECRET_SUFFIXES = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSPHRASE", "APIKEY"})
SECRET_SEGMENTS = frozenset({"PASS", "PASSWD", "PAT", "CREDENTIAL", "CREDENTIALS"})
AUTH_WORDS = frozenset({"AUTH", "BEARER"})
AUTH_NEIGHBOURS = frozenset({"TOKEN", "KEY", "HEADER"})

_SPLIT = re.compile(r"[_\-.]+")


def segments(name: str) -> list[str]:
    """The upper-cased segments of an environment variable name."""
    return [s for s in _SPLIT.split(name.upper()) if s]


def secret_reason(name: str) -> str | None:
    """Why ``name`` looks like a secret, or ``None`` when it does not (the page's rule, as written)."""
    for suffix in sorted(SECRET_SUFFIXES):
        if name.endswith("_" + suffix):
            return f"it ends in _{suffix}"
    parts = [s for s in name.split("_") if s]
    if not parts:
        return None
    for part in parts:
        if part in SECRET_SEGMENTS:
            return f"it has a {part} segment"
    if parts[-1] in AUTH_WORDS:
        return f"{parts[-1]} is its last segment"
    for i, part in enumerate(parts):
        if part in AUTH_WORDS:
            neighbours = {parts[j] for j in (i - 1, i + 1) if 0 <= j < len(parts)}
            near = sorted(neighbours & AUTH_NEIGHBOURS)
            if near:
                return f"{part} stands next to {near[0]}"
    return None


def looks_secret(name: str) -> bool:
    """True when the ``--env`` rule rejects ``name``."""
    return secret_reason(name) is not None
