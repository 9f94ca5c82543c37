"""``rayito-constructs verify <fleet-name-or-stack> [--region R] [--launch] [--json]``.

Exit status: 0 when nothing fails, 1 when a check fails, 2 on bad input (unknown stack or fleet,
bad flags). Output: a table for people, ``--json`` for machines on every outcome (bad input too:
the report's shape with no checks, ``error`` the one line and ``exit_code`` 2; the line also goes
to stderr); the launch's cost goes to stderr first, before anything is started.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, TextIO

from .parser import EXIT_INVALID, add_parser
from .report import Report, render_json, render_table
from .run import BadInput, Options, TargetNotFound, verify

__all__ = ["EXIT_INVALID", "add_parser", "json_of_bad_input", "options_from", "run"]


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"verify: --launch-timeout {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 10 <= value <= 3600:
        raise BadInput(f"verify: --launch-timeout {text!r} must be from 10 to 3600 seconds")
    return value


def options_from(args: argparse.Namespace) -> Options:
    project = None
    if args.project:
        project = Path(args.project)
        if not project.is_dir():
            raise BadInput(f"verify: --project {args.project!r} is not a folder")
    if args.launch_role and not args.launch_role.startswith("arn:"):
        raise BadInput(f"verify: --launch-role {args.launch_role!r} is not a role ARN (arn:aws:iam::<account>:role/<name>)")
    return Options(target=args.target, region=args.region, launch=args.launch, launch_role=args.launch_role,
                   launch_timeout=_timeout(args.launch_timeout), project=project, fleet=args.fleet)


def run(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None, **kwargs: Any) -> int:
    """Run ``verify`` for parsed arguments; returns the exit status. ``kwargs`` go to :func:`verify`."""
    out = out or sys.stdout
    err = err or sys.stderr

    def note(line: str) -> None:
        # A note that cannot be written (stderr closed, ``2>&1 | head``) must never stop verify
        # between starting a VM and terminating it.
        try:
            err.write(line + "\n")
            err.flush()
        except (OSError, ValueError):
            pass

    try:
        with _pipes_cannot_kill(args.launch):
            report = verify(options_from(args), on_note=note, **kwargs)
    except (TargetNotFound, BadInput) as exc:
        err.write(f"{exc}\n")
        if getattr(args, "json", False):
            json_of_bad_input(getattr(args, "target", None), getattr(exc, "region", None) or args.region, str(exc), out)
        return EXIT_INVALID
    try:
        if args.json:
            render_json(report, out)
        else:
            render_table(report, out, color=_color(out))
        out.flush()
    except BrokenPipeError:
        # A closed pipe (``| head``) is not an error of verify: keep quiet, keep the status.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    return report.exit_code


def json_of_bad_input(target: Optional[str], region: Optional[str], message: str, out: TextIO) -> None:
    """The report's JSON for input verify cannot check (an unknown fleet, a bad flag, a missing
    argument): no checks, the line as ``error``, exit 2."""
    document = Report(target or "", region=region).to_dict()
    document.update(error=message, exit_code=EXIT_INVALID)
    try:
        import json

        out.write(json.dumps(document, indent=2) + "\n")
        out.flush()
    except BrokenPipeError:
        pass


@contextlib.contextmanager
def _pipes_cannot_kill(launching: bool) -> Iterator[None]:
    """While a launched VM may be running, a closed pipe raises ``BrokenPipeError`` instead of
    killing the process (``rayito-constructs`` restores SIGPIPE's default so that ``plan | head``
    ends quietly; during ``--launch`` that default would end verify before it terminates its VM,
    leaving it to its 600 s lifetime)."""
    if not launching or not hasattr(signal, "SIGPIPE"):
        yield
        return
    try:
        previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals cannot be changed, and nothing was
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGPIPE, previous)


def _color(out: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
