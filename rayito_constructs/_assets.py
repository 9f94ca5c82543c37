"""Where the Lambda code of this library lives, installed or in a checkout, and where synth puts the
files it makes for assets."""

from __future__ import annotations

import importlib.util
import os
import tempfile
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


def content_file(data: bytes, name: str) -> Path:
    """``data`` at a path named by ``name`` (its content: same bytes, same path, same asset hash),
    written once, atomically, so that parallel synths share it."""
    folder = Path(tempfile.gettempdir()) / "rayito-constructs-images"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file() or path.read_bytes() != data:
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(data)
        os.replace(partial, path)
    return path
