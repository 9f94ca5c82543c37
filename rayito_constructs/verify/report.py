"""Findings and how they are shown: a table for people, JSON for machines (pure, no AWS)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, TextIO


class Status(str, Enum):
    """The outcome of one check. Only ``FAIL`` makes ``verify`` exit with status 1."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass
class Finding:
    """One line of the report: what was checked, the outcome, one line on how to fix it."""

    check: str
    status: Status
    summary: str
    fix: Optional[str] = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.value,
            "summary": self.summary,
            "fix": self.fix,
            "data": self.data,
        }


def ok(check: str, summary: str, **data: Any) -> Finding:
    return Finding(check, Status.OK, summary, None, data)


def warn(check: str, summary: str, fix: str, **data: Any) -> Finding:
    return Finding(check, Status.WARN, summary, fix, data)


def fail(check: str, summary: str, fix: str, **data: Any) -> Finding:
    return Finding(check, Status.FAIL, summary, fix, data)


def worst(findings: list[Finding]) -> Status:
    """FAIL if any fails, else WARN if any warns, else OK."""
    statuses = {f.status for f in findings}
    for status in (Status.FAIL, Status.WARN):
        if status in statuses:
            return status
    return Status.OK


@dataclass
class Report:
    """Everything ``verify`` found about one fleet."""

    target: str
    region: Optional[str] = None
    account: Optional[str] = None
    stack: Optional[str] = None
    fleet: Optional[str] = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Lines printed before the table (the launch's cost, which credentials it used)."""

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    def counts(self) -> dict[str, int]:
        return {s.value: sum(1 for f in self.findings if f.status is s) for s in Status}

    @property
    def exit_code(self) -> int:
        return 1 if any(f.status is Status.FAIL for f in self.findings) else 0

    def summary_line(self) -> str:
        c = self.counts()
        return f"verify: {c['OK']} OK, {c['WARN']} WARN, {c['FAIL']} FAIL"

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "region": self.region,
            "account": self.account,
            "stack": self.stack,
            "fleet": self.fleet,
            "notes": list(self.notes),
            "checks": [f.to_dict() for f in self.findings],
            "summary": self.counts(),
            "exit_code": self.exit_code,
        }


_COLORS = {Status.OK: "\033[32m", Status.WARN: "\033[33m", Status.FAIL: "\033[31m"}
_RESET = "\033[0m"


def render_table(report: Report, out: TextIO, *, color: bool = False) -> None:
    """The report for people: a header, one row per finding (its fix indented below), the summary."""
    where = ", ".join(p for p in (report.region, f"account {report.account}" if report.account else None) if p)
    title = f"Fleet {report.fleet}" if report.fleet else f"Target {report.target}"
    if report.stack:
        title += f", stack {report.stack}"
    out.write(f"{title}{f' ({where})' if where else ''}\n")
    for note in report.notes:
        out.write(f"{note}\n")
    out.write("\n")
    width = max([len(f.check) for f in report.findings] + [5])
    for finding in report.findings:
        status = finding.status.value.ljust(4)
        if color:
            status = f"{_COLORS[finding.status]}{status}{_RESET}"
        out.write(f"  {status}  {finding.check.ljust(width)}  {_one_line(finding.summary)}\n")
        if finding.fix and finding.status is not Status.OK:
            out.write(f"  {' ' * 4}  {' ' * width}  fix: {_one_line(finding.fix)}\n")
    out.write("\n" + report.summary_line() + "\n")


def render_json(report: Report, out: TextIO) -> None:
    out.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
