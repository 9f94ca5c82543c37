"""Target identifiers: which envelopes a request pays.

A target is the scheme and host of a URL, canonical: lowercased; international names mapped and
encoded by IDNA 2008 with UTS #46 (``straße.de`` is ``xn--strae-oqa.de``, not the old
``strasse.de``); IP literals in one spelling (``[0:0:0:0:0:0:0:1]`` is ``[::1]``,
``2130706433``, ``0x7f.1`` and ``0177.0.0.1`` are ``127.0.0.1``, ``[::ffff:127.0.0.1]`` is
``127.0.0.1``); without user info, trailing dot or default port. An envelope may also declare a
path class (a path prefix, whole segments) and a query class (``?region``: each value of the
parameter gets a bucket of its own with the class's envelope).

Paths are matched after RFC 3986 normalization (percent-decoding of unreserved characters, then
dot segments removed) and, because servers are lenient in ways a budget must not be dodged by,
with runs of ``/`` collapsed, ``\\`` and encoded slashes read as ``/``, ``;parameters`` dropped
(before dot segments are removed: ``/v1/x/..;/search`` is ``/v1/search``, as on Tomcat) and case
folded: ``/v1/x/../search``, ``/v1/%73earch``, ``//v1/search`` and ``/V1/Search``
all fall under the class ``/v1/search``. Reading a request as belonging to a class can only add
a charge, never remove one (:mod:`rayito_constructs.egress.client` charges every envelope a request belongs to).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence
from urllib.parse import unquote, unquote_plus, urlsplit

import idna

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
#: Distinct values of one query class a request may carry (``?region=eu&region=us`` pays both
#: buckets); more is refused rather than charged to an unbounded number of buckets.
MAX_CLASS_VALUES = 4
#: Longer query-class values are kept as a hash, so a bucket key stays a DynamoDB key.
MAX_CLASS_VALUE_CHARS = 128

_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_HOST_ASCII = re.compile(r"^[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
_DIGITS = re.compile(r"^[0-9]+\Z")
_HEX = re.compile(r"^0[xX][0-9a-fA-F]*\Z")
_AUTHORITY = re.compile(r"^\s*(?:[A-Za-z][A-Za-z0-9+.-]*:)?[/\\]{2}")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")
#: Longest redacted URL :func:`redact` returns.
MAX_REDACTED_CHARS = 256


class TargetError(ValueError):
    """Not something a target can be made of."""


@dataclass(frozen=True)
class Url:
    """A URL read as a target: canonical origin, path and the raw query."""

    scheme: str
    host: str
    port: Optional[int]
    path: str
    query: str

    @property
    def origin(self) -> str:
        host = self.host
        if self.port is not None and self.port != DEFAULT_PORTS[self.scheme]:
            host = f"{host}:{self.port}"
        return f"{self.scheme}://{host}"


@dataclass(frozen=True)
class Declared:
    """A declared envelope's target: an origin, an optional path class, an optional query class."""

    key: str
    origin: str
    segments: tuple[str, ...]
    query_name: Optional[str]


@dataclass(frozen=True)
class Bucket:
    """One token bucket: the envelope it draws on (``envelope``) and, for a query class, the value."""

    envelope: str
    value: Optional[str] = None

    @property
    def target(self) -> str:
        return self.envelope if self.value is None else f"{self.envelope}={self.value}"

    @property
    def item(self) -> str:
        return "bucket" if self.value is None else f"bucket={self.value}"


# ------------------------------------------------------------------------------------ hosts

def _ipv4_number(part: str, whole: str) -> int:
    if _HEX.match(part):
        return int(part[2:] or "0", 16)
    if not _DIGITS.match(part):
        raise TargetError(f"{whole!r} is not an IPv4 address (part {part!r})")
    if len(part) > 1 and part.startswith("0"):
        if not re.match(r"^[0-7]+$", part):
            raise TargetError(f"{whole!r} is not an IPv4 address (part {part!r} is not octal)")
        return int(part, 8)
    return int(part)


def _ipv4(host: str) -> Optional[str]:
    """The dotted-quad of a host that ends in a number (WHATWG URL's IPv4 parser, as
    ``inet_aton`` reads it: ``2130706433``, ``0x7f.1``, ``0177.0.0.1``); None for a name."""
    parts = host.split(".")
    last = parts[-1]
    if not (_DIGITS.match(last) or _HEX.match(last)):
        return None
    if len(parts) > 4 or any(p == "" for p in parts):
        raise TargetError(f"{host!r} is not an IPv4 address")
    numbers = [_ipv4_number(p, host) for p in parts]
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise TargetError(f"{host!r} is not an IPv4 address (a part is out of range)")
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n * 256 ** (3 - i)
    return str(ipaddress.IPv4Address(value))


def _ipv6(text: str) -> str:
    address, _, zone = text.partition("%")
    zone = unquote(zone[2:] if zone.startswith("25") else zone)
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError as exc:
        raise TargetError(f"[{text}] is not an IPv6 address ({exc})") from None
    if ip.ipv4_mapped is not None and not zone:
        return str(ip.ipv4_mapped)
    return f"[{ip.compressed}{'%' + zone if zone else ''}]"


def canonical_host(host: str) -> str:
    """One spelling per host: IP literals canonical, names lowercased and IDNA 2008 (UTS #46)."""
    if host.startswith("[") and host.endswith("]"):
        return _ipv6(host[1:-1])
    try:
        text = unquote(host, errors="strict")
    except UnicodeDecodeError:
        raise TargetError(f"{host!r}: the host is not UTF-8 once percent-decoded") from None
    if text.endswith("."):
        text = text[:-1]
    if not text:
        raise TargetError(f"{host!r} has no host")
    if _CONTROL.search(text) or any(c in text for c in "/?#@[]\\%"):
        raise TargetError(f"{host!r}: the host has characters no host name has")
    if ":" in text:
        return _ipv6(text)
    if text.isascii():
        text = text.lower()
        dotted = _ipv4(text)
        if dotted is not None:
            return dotted
        if not _HOST_ASCII.match(text):
            raise TargetError(f"{host!r} is not a host name (letters, digits, '-', '_' and dots)")
        name = text
    else:
        try:
            name = idna.encode(text, uts46=True, transitional=False).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise TargetError(f"{host!r}: the host is not a valid name ({exc})") from None
        dotted = _ipv4(name)  # full-width digits map to an address under UTS #46
        if dotted is not None:
            return dotted
    if len(name) > 253 or any(len(label) > 63 for label in name.split(".")):
        raise TargetError(f"{host!r} is longer than a host name may be (253, labels 63)")
    return name


# ------------------------------------------------------------------------------------ paths

def _decode_unreserved(path: str) -> str:
    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(one, path)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4."""
    out: list[str] = []
    rest = path
    while rest:
        if rest.startswith("../"):
            rest = rest[3:]
        elif rest.startswith(("./", "/./")):
            rest = rest[2:]
        elif rest == "/.":
            rest = "/"
        elif rest.startswith("/../"):
            rest = rest[3:]
            if out:
                out.pop()
        elif rest == "/..":
            rest = "/"
            if out:
                out.pop()
        elif rest in (".", ".."):
            rest = ""
        else:
            cut = rest.find("/", 1)
            segment, rest = (rest, "") if cut < 0 else (rest[:cut], rest[cut:])
            out.append(segment)
    return "".join(out)


def canonical_path(path: str) -> str:
    """RFC 3986 normalization (unreserved characters decoded, other escapes uppercased, dot
    segments removed), runs of ``/`` collapsed, and ``;parameters`` dropped from every segment
    *before* dot segments are removed, as Tomcat, Jetty and Spring read a path: ``/v1/x/..;/search``
    and ``/v1/x/%2e%2e;/search`` are ``/v1/search`` there, so they are here."""
    text = _decode_unreserved(path.replace("\\", "/"))
    text = remove_dot_segments("/".join(segment.split(";", 1)[0] for segment in text.split("/")))
    text = re.sub(r"/{2,}", "/", text)
    return text if text.startswith("/") else "/" + text


def path_segments(path: str) -> tuple[str, ...]:
    """The segments a path class is matched on: canonical path (``;parameters`` dropped), encoded
    ``/`` and ``\\`` read as separators (then dot segments again), case folded."""
    text = canonical_path(path)
    text = re.sub(r"%(2F|5C)", "/", text, flags=re.I)
    text = canonical_path(text)
    return tuple(s.casefold() for s in text.split("/") if s)


def _class_value(value: str) -> str:
    text = unicodedata.normalize("NFC", value).strip().casefold()
    if len(text) > MAX_CLASS_VALUE_CHARS or _CONTROL.sub("", text.replace(" ", "")) != text.replace(" ", ""):
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]
    return text


def query_values(query: str) -> dict[str, list[str]]:
    """Parameters of a query, names decoded and case folded, ``&`` and ``;`` as separators."""
    out: dict[str, list[str]] = {}
    for pair in re.split(r"[&;]", query):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        out.setdefault(unquote_plus(name).strip().casefold(), []).append(unquote_plus(value))
    return out


# ------------------------------------------------------------------------------------ URLs

def parse(url: str) -> Url:
    """Read a URL (or a bare host) as a target."""
    if not isinstance(url, str):
        raise TargetError(f"{url!r} is not a URL")
    text = url.strip()
    if not text or _CONTROL.search(text):
        raise TargetError(f"{url!r} is empty or has spaces or control characters")
    text = text.replace("\\", "/")
    head = text.split("/", 1)[0]
    if text.startswith("//"):
        text = "https:" + text
    elif not head.endswith(":") or "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise TargetError(f"{url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TargetError(f"{url!r}: the scheme {scheme!r} is not one of http, https, ws, wss")
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:  # pragma: no cover - urlsplit refuses an unclosed '[' first
            raise TargetError(f"{url!r}: the IPv6 address has no closing ']'")
        host, rest = hostport[: end + 1], hostport[end + 1:]
        if rest and not rest.startswith(":"):
            raise TargetError(f"{url!r}: {rest!r} after the IPv6 address")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = hostport.partition(":")
        if ":" in port_text:
            raise TargetError(f"{url!r}: an IPv6 address must be in brackets")
    port = None
    if port_text:
        if not _DIGITS.match(port_text) or int(port_text) > 65535:
            raise TargetError(f"{url!r}: the port {port_text!r} is not 0 to 65535")
        port = int(port_text)
    return Url(scheme, canonical_host(host), port, canonical_path(parts.path or "/"), parts.query)


def _redact_pair(pair: str) -> str:
    if pair in ("", "&", ";"):
        return pair
    name, equals, _ = pair.partition("=")
    return f"{name}=***" if equals else "***"


def redact(url: object) -> str:
    """A URL as it may be logged, for one that is not a target: no user info (everything up to
    the last ``@`` before the query, so a password holding a ``/`` goes too), no query values
    (``?api_key=***``), no fragment, control characters escaped, at most 256 characters. Anything
    but a string is its type (``<bytes>``)."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    text, hash_, _ = url.partition("#")
    text, question, query = text.partition("?")
    match = _AUTHORITY.match(text)
    start = match.end() if match else 0
    at = text.rfind("@", start)
    if at >= 0:
        text = text[:start] + "***@" + text[at + 1:]
    if question:
        text += "?" + "".join(_redact_pair(p) for p in re.split(r"([&;])", query))
    if hash_:
        text += "#***"
    text = _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text[:MAX_REDACTED_CHARS]


def redacted_error(exc: BaseException, url: object) -> str:
    """The message of a :class:`TargetError` about ``url`` with the URL in it redacted
    (:func:`redact`): the messages quote the URL as given, credentials and all."""
    return str(exc).replace(repr(url), repr(redact(url)))


def from_parts(scheme: str, host: str, port: Optional[int], path: str, query: str) -> Url:
    """A target from a URL an HTTP client has already parsed (the host it will connect to)."""
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TargetError(f"the scheme {scheme!r} is not one of http, https, ws, wss")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if port is not None and not 0 <= port <= 65535:
        raise TargetError(f"the port {port!r} is not 0 to 65535")
    return Url(scheme, canonical_host(host), port, canonical_path(path or "/"), query)


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL (or a bare host), canonical."""
    return parse(url).origin


def declared(target: str) -> Declared:
    """Read a declared envelope's target: origin, optional path class, optional ``?name``."""
    url = parse(target)
    if "#" in target:
        raise TargetError(f"{target!r}: a target has no #fragment")
    name: Optional[str] = None
    if url.query:
        if "=" in url.query or "&" in url.query or ";" in url.query:
            raise TargetError(f"{target!r}: a query class is one parameter name (?model), not a query")
        name = unquote_plus(url.query).strip().casefold()
        if not name:
            raise TargetError(f"{target!r}: the query class has no name")
    elif target.rstrip().endswith("?"):
        raise TargetError(f"{target!r}: the query class has no name")
    segments = path_segments(url.path)
    key = url.origin + "".join("/" + s for s in segments) + (f"?{name}" if name else "")
    return Declared(key, url.origin, segments, name)


def declared_target(target: str) -> str:
    """Normalize a target as an envelope declares it (``https://api.example.com/v1/chat?model``)."""
    return declared(target).key


def route(url: Url, declarations: Iterable[Declared], *, charge_origin: bool) -> tuple[Bucket, ...]:
    """Every bucket a request pays, most specific first: each declared class it falls under (a
    query class once per distinct value), and its origin when no class takes it or when
    ``charge_origin`` (the origin has an envelope of its own)."""
    path = path_segments(url.path)
    query = None
    matched: list[tuple[tuple[int, int], list[Bucket]]] = []
    for d in declarations:
        if d.origin != url.origin or not d.segments and d.query_name is None:
            continue
        if path[: len(d.segments)] != d.segments:
            continue
        if d.query_name is None:
            matched.append(((len(d.segments), 0), [Bucket(d.key)]))
            continue
        if query is None:
            query = query_values(url.query)
        values = sorted({_class_value(v) for v in query.get(d.query_name, [])})
        if not values:
            continue
        if len(values) > MAX_CLASS_VALUES:
            raise TargetError(
                f"{url.origin}{url.path}: {len(values)} values of the query class ?{d.query_name}, "
                f"at most {MAX_CLASS_VALUES}")
        matched.append(((len(d.segments), 1), [Bucket(d.key, v) for v in values]))
    matched.sort(key=lambda m: m[0], reverse=True)
    buckets = [b for _, group in matched for b in group]
    if not buckets or charge_origin:
        buckets.append(Bucket(url.origin))
    return tuple(buckets)


def normalize(url: str, declared_targets: Iterable[str] = ()) -> str:
    """The most specific target of a request URL (a query class adds ``?name=value``), else its
    origin."""
    return route(parse(url), [declared(t) for t in declared_targets], charge_origin=False)[0].target


def envelope_of(target: str) -> str:
    """The envelope a bucket's target draws on (``...?model=x`` → ``...?model``)."""
    head, question, query = target.partition("?")
    if question and "=" in query:
        return f"{head}?{query.split('=', 1)[0]}"
    return target


def resolve(url_or_target: str, declarations: Sequence[Declared], *, own_origin: Iterable[str] = ()) -> tuple[Bucket, ...]:
    """:func:`route` of a URL, charging the origin when it is in ``own_origin``."""
    url = parse(url_or_target)
    return route(url, declarations, charge_origin=url.origin in set(own_origin))
