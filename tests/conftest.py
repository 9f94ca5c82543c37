"""Shared fixtures: paths, the example project and a factory for agent folders."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Callable

import pytest

# Quiet jsii's Node 20 banner for a plain `pytest` too (make test sets it already).
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mi-agente"


@pytest.fixture
def agent_folder(tmp_path: Path) -> Callable[..., Path]:
    """Make an agent folder with the given rayito-agent.toml text (or none)."""

    def make(toml: str | None = None, name: str = "agente") -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "Dockerfile").write_text("FROM scratch\n")
        if toml is not None:
            (folder / "rayito-agent.toml").write_text(textwrap.dedent(toml))
        return folder

    return make


@pytest.fixture
def snapshot_json(snapshot):
    """syrupy JSON snapshots with asset hashes neutralized."""
    from syrupy.extensions.json import JSONSnapshotExtension

    from .cdk_helpers import neutralize

    return snapshot.with_defaults(extension_class=JSONSnapshotExtension, matcher=neutralize)
