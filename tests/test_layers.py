"""The library's imports run one way: the plain model (the project, its options, the recipe, the
cost estimate...) imports no aws-cdk-lib and nothing of the library above it, and no module of
rayito_constructs is in an import circle, counting the imports made inside functions."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib


from .conftest import ROOT
from .import_graph import circles, imports

#: The plain model, rayito_constructs/model/: what ``plan``, ``app.py``'s context and the agents'
#: egress package read without aws-cdk-lib (``import rayito_constructs`` loads the constructs on first
#: use only). A module put in that folder is held to the rules below by being there.
MODEL = tuple(sorted(p.stem for p in (ROOT / "rayito_constructs" / "model").glob("*.py") if p.stem != "__init__"))


def test_the_model_is_the_folder() -> None:
    """The folders show the layers: the model's modules are the folder's (not a list kept apart)."""
    assert {"errors", "project", "product", "recipe", "options", "cost"} <= set(MODEL)
    assert not (ROOT / "rayito_constructs" / "project.py").exists()


def test_the_model_imports_no_aws_cdk() -> None:
    """In a fresh interpreter (another test's import of aws_cdk cannot hide one), each model module
    imported in turn: aws-cdk-lib absent after all of them is absent after each; present, the first
    module whose import brought it is named."""
    code = ("import importlib, json, sys\n"
            "cdk = lambda: sorted(m for m in sys.modules if m == 'aws_cdk' or m.startswith(('aws_cdk.', 'constructs')))\n"
            f"for module in {list(MODEL)!r}:\n"
            "    importlib.import_module('rayito_constructs.model.' + module)\n"
            "    if cdk():\n"
            "        print(json.dumps([module, cdk()])); break\n"
            "else:\n"
            "    print(json.dumps([None, []]))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    module, found = json.loads(run.stdout.strip().splitlines()[-1])
    assert module is None, f"rayito_constructs.model.{module} imports {found}"


def test_the_model_imports_only_the_model() -> None:
    """No arrow runs back up: a model module imports (anywhere in it) no construct, CLI, verify,
    egress or testing module."""
    graph = imports("rayito_constructs")
    model = {f"rayito_constructs.model.{m}" for m in MODEL}
    for name in sorted(model):
        above = {t for t in graph[name] if t in graph and t not in model
                 and t not in ("rayito_constructs", "rayito_constructs.model")}
        assert not above, f"{name} imports {sorted(above)}"


def test_no_import_circle_in_rayito_constructs() -> None:
    assert circles(imports("rayito_constructs")) == []


def test_mypy_checks_the_whole_model_strictly() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "rayito_constructs/model" in config["files"] and "lambdas" in config["files"]
    assert config["strict"] is True
