"""Where the Lambda code of this library lives, installed or in a checkout."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def lambda_code_dir(name: str) -> Path:
    """The folder of one function's code (``lambdas/<name>`` in the repository)."""
    spec = importlib.util.find_spec("rayito_constructs._lambdas")
    roots = list(spec.submodule_search_locations or []) if spec else []
    roots.append(str(Path(__file__).resolve().parent.parent / "lambdas"))
    for root in roots:
        folder = Path(root) / name
        if (folder / "index.py").is_file():
            return folder
    raise FileNotFoundError(f"the code of the {name} function is missing from this installation")
