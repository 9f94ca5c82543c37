"""A small evaluator of the CloudWatch Logs Insights language, for the subset the saved queries use
(``rayito_constructs.queries``): ``fields`` (with ``as``), ``filter`` (``=``, ``!=``, ``<``, ``>``,
``<=``, ``>=``, ``in [...]``, ``and``, ``or``, ``not``, parentheses, ``ispresent()``), ``stats``
(``count(*)``, ``count()``, ``count_distinct()``, ``sum()``, ``min()``, ``max()``, ``avg()``, ``by``
fields and ``bin(<n><unit>)``, each with ``as``), ``sort`` and ``limit``.

It is strict on purpose: an unknown command, function, operator or a stray token is an error, so a
query that would not parse in CloudWatch does not pass here either. Log events are the JSON lines
a function printed, as Logs Insights discovers their fields (top-level keys), plus ``@timestamp``
(milliseconds) and ``@message`` (the line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<number>-?\d+(?:\.\d+)?(?![A-Za-z_]))
    | (?P<duration>\d+(?:ms|s|m|h|d))
    | (?P<op><=|>=|!=|=|<|>|\(|\)|\[|\]|,|\*|\|)
    | (?P<name>@?[A-Za-z_][A-Za-z0-9_.]*|`[^`]+`)
    )""", re.VERBOSE)
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_AGGREGATES = {"count", "count_distinct", "sum", "min", "max", "avg"}
_KEYWORDS = {"and", "or", "not", "in", "as", "by", "asc", "desc"}


class QueryError(ValueError):
    """The query does not parse in this subset."""


def tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            raise QueryError(f"cannot read {text[position:position + 20]!r}")
        kind = match.lastgroup
        value = match.group(kind)  # type: ignore[arg-type]
        tokens.append((kind, value))  # type: ignore[arg-type]
        position = match.end()
    return tokens


@dataclass
class Query:
    """A parsed query: its commands and every field it reads."""

    commands: list[tuple[str, Any]]
    fields_read: set[str] = field(default_factory=set)

    def run(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = [dict(e) for e in events]
        for command, spec in self.commands:
            rows = spec(rows)
        return rows


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0
        self.read: set[str] = set()
        self.aliases: set[str] = set()

    # ------------------------------------------------------------------ tokens

    def peek(self, offset: int = 0) -> tuple[str, str]:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def take(self, kind: Optional[str] = None, value: Optional[str] = None) -> tuple[str, str]:
        token = self.peek()
        if (kind and token[0] != kind) or (value is not None and token[1].lower() != value):
            raise QueryError(f"expected {value or kind}, found {token[1]!r}")
        self.i += 1
        return token

    def at(self, value: str) -> bool:
        return self.peek()[1].lower() == value

    # ------------------------------------------------------------------ query

    def query(self) -> Query:
        commands = [self.command()]
        while self.at("|"):
            self.take("op", "|")
            commands.append(self.command())
        if self.peek()[0] != "end":
            raise QueryError(f"unexpected {self.peek()[1]!r}")
        return Query(commands, self.read - self.aliases)

    def command(self) -> tuple[str, Any]:
        kind, name = self.take("name")
        name = name.lower()
        parse = {"fields": self.fields, "filter": self.filter, "stats": self.stats, "sort": self.sort,
                 "limit": self.limit, "display": self.display}.get(name)
        if parse is None:
            raise QueryError(f"unknown command {name!r}")
        return name, parse()

    def field_name(self) -> str:
        kind, value = self.take("name")
        if value.lower() in _KEYWORDS:
            raise QueryError(f"{value!r} is a keyword, not a field")
        return value.strip("`")

    def fields(self) -> Callable:
        items = [self.aliased(self.value())]
        while self.at(","):
            self.take("op", ",")
            items.append(self.aliased(self.value()))

        def run(rows: list[dict]) -> list[dict]:
            out = []
            for row in rows:
                new = dict(row)
                for name, getter in items:
                    new[name] = getter(row)
                out.append(new)
            return out

        return run

    def display(self) -> Callable:
        names = [self.field_name()]
        while self.at(","):
            self.take("op", ",")
            names.append(self.field_name())
        self.read.update(names)
        return lambda rows: [{n: r.get(n) for n in names} for r in rows]

    def aliased(self, value: tuple[str, Callable]) -> tuple[str, Callable]:
        name, getter = value
        if self.at("as"):
            self.take("name", "as")
            name = self.field_name()
            self.aliases.add(name)
        return name, getter

    def filter(self) -> Callable:
        predicate = self.expression()
        return lambda rows: [r for r in rows if _truthy(predicate(r))]

    def stats(self) -> Callable:
        aggregates = [self.aggregate()]
        while self.at(","):
            self.take("op", ",")
            aggregates.append(self.aggregate())
        keys: list[tuple[str, Callable]] = []
        if self.at("by"):
            self.take("name", "by")
            keys.append(self.aliased(self.group_key()))
            while self.at(","):
                self.take("op", ",")
                keys.append(self.aliased(self.group_key()))

        def run(rows: list[dict]) -> list[dict]:
            groups: dict[tuple, list[dict]] = {}
            for row in rows:
                groups.setdefault(tuple(json.dumps(g(row), default=str) for _, g in keys), []).append(row)
            out = []
            for members in groups.values():
                result = {name: getter(members[0]) for name, getter in keys}
                for name, compute in aggregates:
                    result[name] = compute(members)
                out.append(result)
            return out

        return run

    def group_key(self) -> tuple[str, Callable]:
        if self.peek()[1].lower() == "bin" and self.peek(1)[1] == "(":
            self.take("name")
            self.take("op", "(")
            kind, text = self.take()
            if kind not in ("duration", "number"):
                raise QueryError(f"bin() takes a period such as 1m, not {text!r}")
            self.take("op", ")")
            unit = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", text)
            if not unit or not unit.group(2):
                raise QueryError(f"bin() needs a unit: {text!r}")
            width = int(unit.group(1)) * _UNITS[unit.group(2)] * 1000
            self.read.add("@timestamp")
            return f"bin({text})", lambda row: int(row["@timestamp"] // width * width)
        name = self.field_name()
        self.read.add(name)
        return name, lambda row: row.get(name)

    def aggregate(self) -> tuple[str, Callable]:
        kind, function = self.take("name")
        function = function.lower()
        if function not in _AGGREGATES:
            raise QueryError(f"unknown stats function {function!r}")
        self.take("op", "(")
        if self.at("*"):
            if function != "count":
                raise QueryError(f"{function}(*) is not allowed")
            self.take("op", "*")
            argument = None
        else:
            argument = self.field_name()
            self.read.add(argument)
        self.take("op", ")")
        label = f"{function}({argument or '*'})"
        if self.at("as"):
            self.take("name", "as")
            label = self.field_name()
            self.aliases.add(label)

        def compute(rows: list[dict]) -> Any:
            values = [r.get(argument) for r in rows] if argument else [1 for _ in rows]
            present = [v for v in values if v is not None and v != ""]
            numbers = [float(v) for v in present if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if function == "count":
                return len(present)
            if function == "count_distinct":
                return len({json.dumps(v, sort_keys=True) for v in present})
            if not numbers:
                return None
            return {"sum": sum, "min": min, "max": max, "avg": lambda n: sum(n) / len(n)}[function](numbers)

        return label, compute

    def sort(self) -> Callable:
        name = self.field_name()
        self.read.add(name)
        descending = False
        if self.at("asc") or self.at("desc"):
            descending = self.take("name")[1].lower() == "desc"

        def run(rows: list[dict]) -> list[dict]:
            present = [r for r in rows if r.get(name) is not None]
            absent = [r for r in rows if r.get(name) is None]
            return sorted(present, key=lambda r: _key(r[name]), reverse=descending) + absent

        return run

    def limit(self) -> Callable:
        kind, text = self.take("number")
        n = int(text)
        if not 1 <= n <= 10_000:
            raise QueryError(f"limit {n} is not within 1 to 10000")
        return lambda rows: rows[:n]

    # ------------------------------------------------------------------ expressions

    def expression(self) -> Callable:
        left = self.conjunction()
        while self.at("or"):
            self.take("name", "or")
            right, before = self.conjunction(), left
            left = (lambda a, b: lambda r: _truthy(a(r)) or _truthy(b(r)))(before, right)
        return left

    def conjunction(self) -> Callable:
        left = self.negation()
        while self.at("and"):
            self.take("name", "and")
            right, before = self.negation(), left
            left = (lambda a, b: lambda r: _truthy(a(r)) and _truthy(b(r)))(before, right)
        return left

    def negation(self) -> Callable:
        if self.at("not"):
            self.take("name", "not")
            inner = self.negation()
            return lambda r: not _truthy(inner(r))
        return self.comparison()

    def comparison(self) -> Callable:
        _, left = self.value()
        if self.at("in") or (self.at("not") and self.peek(1)[1].lower() == "in"):
            negate = self.at("not")
            if negate:
                self.take("name", "not")
            self.take("name", "in")
            self.take("op", "[")
            options = [self.literal()]
            while self.at(","):
                self.take("op", ",")
                options.append(self.literal())
            self.take("op", "]")
            return lambda r: (left(r) in options) != negate
        token = self.peek()
        if token[0] == "op" and token[1] in ("=", "!=", "<", ">", "<=", ">="):
            self.take()
            _, right = self.value()
            compare = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b,
                       "<": lambda a, b: a is not None and b is not None and a < b,
                       ">": lambda a, b: a is not None and b is not None and a > b,
                       "<=": lambda a, b: a is not None and b is not None and a <= b,
                       ">=": lambda a, b: a is not None and b is not None and a >= b}[token[1]]
            return lambda r: compare(left(r), right(r))
        return left

    def literal(self) -> Any:
        kind, text = self.take()
        if kind == "string":
            return json.loads(text) if text.startswith('"') else text[1:-1]
        if kind == "number":
            return float(text) if "." in text else int(text)
        raise QueryError(f"expected a literal, found {text!r}")

    def value(self) -> tuple[str, Callable]:
        kind, text = self.peek()
        if kind in ("string", "number"):
            literal = self.literal()
            return text, lambda r: literal
        if text == "(":
            self.take("op", "(")
            inner = self.expression()
            self.take("op", ")")
            return "(...)", inner
        name = self.field_name()
        if self.at("("):
            if name.lower() != "ispresent":
                raise QueryError(f"unknown function {name!r}")
            self.take("op", "(")
            argument = self.field_name()
            self.take("op", ")")
            self.read.add(argument)
            return f"ispresent({argument})", lambda r: r.get(argument) is not None
        self.read.add(name)
        return name, lambda r: r.get(name)


def _truthy(value: Any) -> bool:
    return bool(value) and value is not None


def _key(value: Any) -> tuple:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def parse(text: str) -> Query:
    """Parse ``text``; raises :class:`QueryError` for anything outside the subset."""
    parser = _Parser(tokenize(text))
    return parser.query()


def events_from_lines(lines: list[str], start_ms: int = 1_700_000_000_000, step_ms: int = 1000,
                      stamps: Optional[list[int]] = None) -> list[dict[str, Any]]:
    """Log events as Logs Insights sees JSON lines: their keys as fields, ``@message``, and
    ``@timestamp`` (``stamps`` when given, else ``start_ms`` + ``step_ms`` per line: one stream's
    lines are in time order)."""
    events = []
    for index, line in enumerate(lines):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        stamp = stamps[index] if stamps is not None else start_ms + index * step_ms
        events.append({**data, "@message": line, "@timestamp": stamp})
    return events
