"""Target identifiers: which envelope a request belongs to.

A target is the scheme and host of a URL, lowercased, IDNA-encoded, without the default port,
and, where an envelope declares one, a path class (a path prefix) or a query class (a query
parameter whose value separates traffic): ``https://API.example.com:443/a?b=1`` and
``https://api.example.com/c`` are the one target ``https://api.example.com`` unless a class
separates them.
"""

from __future__ import annotations

from typing import Iterable, Optional
from urllib.parse import parse_qsl, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class TargetError(ValueError):
    """Not something a target can be made of."""


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL (or a bare host), normalized."""
    text = url.strip()
    if "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"{url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetError(f"{url!r} has no host")
    try:
        host = host.encode("idna").decode("ascii").lower()
    except UnicodeError as exc:
        raise TargetError(f"{url!r}: the host is not a valid name ({exc})") from None
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if port is not None and port != DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    return f"{scheme}://{host}"


def _path(url: str) -> str:
    text = url if "://" in url else "https://" + url
    path = urlsplit(text).path or "/"
    return path if path.startswith("/") else "/" + path


def _query(url: str) -> dict[str, str]:
    text = url if "://" in url else "https://" + url
    return dict(parse_qsl(urlsplit(text).query, keep_blank_values=True))


def declared_target(target: str) -> str:
    """Normalize a target as an envelope declares it: origin, optional path prefix, optional
    ``?name`` query class (``https://api.example.com/v1/chat?model``)."""
    base = origin(target)
    text = target if "://" in target else "https://" + target
    parts = urlsplit(text)
    path = parts.path.rstrip("/")
    query = parts.query
    if query and ("=" in query or "&" in query):
        raise TargetError(f"{target!r}: a query class is one parameter name (?model), not a query")
    return base + path + (f"?{query}" if query else "")


def normalize(url: str, declared: Iterable[str] = ()) -> str:
    """The target of a request URL: the most specific declared target it falls under (longest path
    prefix; a query class adds ``?name=value``), else its origin."""
    base = origin(url)
    path = _path(url)
    query = _query(url)
    best: Optional[tuple[int, str]] = None
    for target in declared:
        t_base, _, rest = target.partition("://")
        host_and_path = rest.split("?", 1)
        t_origin = f"{t_base}://{host_and_path[0].split('/', 1)[0]}"
        if t_origin != base:
            continue
        t_path = "/" + host_and_path[0].split("/", 1)[1] if "/" in host_and_path[0] else ""
        if t_path and not (path == t_path or path.startswith(t_path.rstrip("/") + "/")):
            continue
        name = host_and_path[1] if len(host_and_path) > 1 else None
        if name is not None and name not in query:
            continue
        score = len(t_path) * 2 + (1 if name else 0)
        resolved = base + t_path + (f"?{name}={query[name]}" if name else "")
        if best is None or score > best[0]:
            best = (score, resolved)
    return best[1] if best else base


def envelope_of(target: str) -> str:
    """The declared envelope a normalized target draws on (``?model=x`` → ``?model``)."""
    if "?" in target and "=" in target.split("?", 1)[1]:
        head, query = target.split("?", 1)
        return f"{head}?{query.split('=', 1)[0]}"
    return target
