"""cfn-lint for the session gate (tests/conftest.py), run beside the tests.

cfn-lint takes about a second of CPU per template and the suite synthesizes about 80 distinct
ones. Linted at the end, that second is added to the run's wall time; linted here, in one
low-priority process per pytest worker that starts when the first template is recorded, it fills
the time the tests spend waiting (for a Lambda-like subprocess, a client's timeout, the CDK's Node
process). The findings are the same: every distinct template is linted once, whole, with the
same configuration, and the session still fails on any finding.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Iterator, Optional

#: cfn-lint's settings for every template (W3005: the DependsOn CDK adds on purpose).
REGIONS = ["us-east-1"]
IGNORE_CHECKS = ["W3005"]


def _lower_priority() -> None:
    os.nice(10)  # the tests come first; the linter takes what they leave


@contextlib.contextmanager
def _not_measured() -> Iterator[None]:
    """Start the linter outside coverage (make test measures every subprocess through these
    variables): cfn-lint is none of our code, and measuring it cost half again its CPU."""
    saved = {key: os.environ.pop(key) for key in _COVERAGE_VARIABLES if key in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


_COVERAGE_VARIABLES = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")


_RUNNER: Any = None


def lint_text(text: str) -> list[str]:
    """cfn-lint's findings for one template (JSON text): 'RULE message' each.

    What ``cfnlint.api.lint`` does, with one ``Runner`` (its rules) for every template of the
    process, as cfn-lint's command line does for many files: ``lint`` loads every rule again for
    each template, 0.4 of its 1.1-2 CPU-s on a fleet's template."""
    global _RUNNER
    from cfnlint.api import ManualArgs
    from cfnlint.config import ConfigMixIn
    from cfnlint.decode.decode import decode_str
    from cfnlint.runner import Runner

    template, matches = decode_str(text)
    if not matches and template is not None:
        if _RUNNER is None:
            _RUNNER = Runner(ConfigMixIn(**ManualArgs(regions=REGIONS, ignore_checks=IGNORE_CHECKS)))
        matches = list(_RUNNER.validate_template(template))
    return [f"{m.rule.id} {m.message} ({'/'.join(str(p) for p in getattr(m, 'path', None) or [])})" for m in matches or []]


class BackgroundLinter:
    """Lints each distinct template once, in a child process, as it is recorded."""

    def __init__(self) -> None:
        self._pool: Optional[ProcessPoolExecutor] = None
        self._futures: dict[str, Future] = {}

    def submit(self, template: dict) -> str:
        """Start linting ``template`` (once per distinct text); returns its key."""
        text = json.dumps(template, sort_keys=True)
        if text not in self._futures:
            if self._pool is None:
                # spawn: a fork of a worker would copy its threads (servers) and its Node pipes
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority)
            with _not_measured():  # the child starts on the first submit
                self._futures[text] = self._pool.submit(lint_text, text)
        return text

    def findings(self, text: str, timeout: float = 600.0) -> list[str]:
        return self._futures[text].result(timeout=timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
