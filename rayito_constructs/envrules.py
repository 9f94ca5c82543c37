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


# ---------------------------------------------------------------------------------------------
# Values shaped like credentials.
#
# The name rule above cannot see ``DATABASE_URL = "postgres://admin:pw@host/db"`` or
# ``GITHUB_TOKEN_FILE = "ghp_..."``. A plain ``[env]`` or ``env=`` value ends up in the image's
# environment (a template property) and in the recipe, readable by anyone with
# ``cloudformation:GetTemplate`` or ``ssm:GetParameter``: a value with one of these shapes is an
# error at plan and at synth. The message names the variable and the shape, never the value.
# The formats are the vendors' published token prefixes; each pattern asks for enough characters
# after the prefix that an ordinary word (``sk-learn``, ``xoxo``) does not match.

CREDENTIAL_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----")),
    ("a URL with a user and password", re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@:]*:[^\s/@]+@[^\s/@]")),
    ("a URL with a token as its user", re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9_\-]{20,}@[^\s/@]")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}|\bxapp-[0-9]-[A-Za-z0-9\-]{10,}")),
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/")),
    ("an API secret key (sk-...)", re.compile(r"\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_\-]{20,}")),
    ("a Stripe key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("an npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+")),
    ("an Authorization header value", re.compile(r"^\s*(?:Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=\-]{16,}\s*$", re.I)),
    # Audit round 9: connection strings (ADO.NET/ODBC/JDBC, query strings) carry the password as a
    # key=value pair, Azure's its account key; more vendors' published prefixes.
    ("a connection string with a password",
     # not a placeholder (${DB_PASSWORD}, %(pw)s, <secret>, ***) nor a switch (password=true)
     re.compile(r"(?:^|[;?&\s])(?:password|passwd|pwd)\s*=\s*(?!\s*(?:[;&]|$))"
                r"(?!(?:true|false|yes|no|on|off|none|null|required|optional)\s*(?:[;&]|$)|[$%{<*])[^;&\s]", re.I)),
    ("an Azure account or shared access key",
     re.compile(r"(?:AccountKey|SharedAccessKey)\s*=\s*[A-Za-z0-9+/]{20,}={0,2}|[?&]sig=[A-Za-z0-9%+/]{20,}", re.I)),
    ("a SendGrid API key", re.compile(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}")),
    ("a PyPI token", re.compile(r"\bpypi-AgE[A-Za-z0-9_\-]{20,}")),
    ("a DigitalOcean token", re.compile(r"\bdo[por]_v1_[a-f0-9]{64}\b")),
    ("a Shopify token", re.compile(r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[A-Za-z0-9_\-]{20,}")),
)


def credential_shape(value: str) -> str | None:
    """What kind of credential ``value`` looks like, or ``None``. Never returns the value."""
    if not isinstance(value, str) or not value:
        return None
    for shape, pattern in CREDENTIAL_SHAPES:
        if pattern.search(value):
            return shape
    return None


def credential_problem(name: str, shape: str) -> str:
    """Why a credential-shaped value of ``name`` is refused: the shape, never the value."""
    return (
        f"the value looks like a credential ({shape}); plain env values are stored in the image and "
        f"the recipe, readable by anyone who may read the template or the recipe: move {name} to "
        f"secret_env (--secret-env {name}=<secret>)"
    )
