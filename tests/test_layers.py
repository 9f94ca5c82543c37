"""The library's imports run one way: the plain model (the project, its options, the recipe, the
cost estimate...) imports no aws-cdk-lib and nothing of the library above it, and no module of
rayito_constructs is in an import circle, counting the imports made inside functions."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from .conftest import ROOT
from .import_graph import circles, imports

#: The plain model: what ``plan``, ``app.py``'s context and the agents' egress package read
#: without aws-cdk-lib (``import rayito_constructs`` loads the constructs on first use only).
MODEL = (
    "cloudwatch_limits", "cost", "egress_targets", "errors", "fleet_file", "names", "options",
    "overrides", "policy_eval", "product", "project", "rates", "recipe",
)


@pytest.mark.parametrize("module", MODEL)
def test_the_model_imports_no_aws_cdk(module: str) -> None:
    """In a fresh interpreter: another test's import of aws_cdk cannot hide one."""
    code = (f"import sys, rayito_constructs.{module}; "
            "print(sorted(m for m in sys.modules if m == 'aws_cdk' or m.startswith(('aws_cdk.', 'constructs'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"rayito_constructs.{module} imports {run.stdout.strip()}"


def test_the_model_imports_only_the_model() -> None:
    """No arrow runs back up: a model module imports (anywhere in it) no construct, CLI, verify,
    egress or testing module."""
    graph = imports("rayito_constructs")
    model = {f"rayito_constructs.{m}" for m in MODEL}
    for name in sorted(model):
        above = {t for t in graph[name] if t in graph and t not in model and t != "rayito_constructs"}
        assert not above, f"{name} imports {sorted(above)}"


def test_no_import_circle_in_rayito_constructs() -> None:
    assert circles(imports("rayito_constructs")) == []


def test_mypy_checks_the_whole_model_strictly() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    checked = {f.removeprefix("rayito_constructs/").removesuffix(".py") for f in config["files"]
               if f.startswith("rayito_constructs/")}
    assert checked == set(MODEL) and config["strict"] is True
