"""The product's own command line, unmodified, pointed at moto and the MicroVMs emulator.

``rayito`` runs in a process of its own (``python -m rayito.cli``): the product keeps its AWS
clients per process, so each run gets its endpoints from its environment only, as a user's shell
would give them (``AWS_ENDPOINT_URL_<SERVICE>``), with test credentials and a fleet token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

#: A fleet access token for tests (the product's format: base64url of 32 bytes, no padding).
TOKEN = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
TIMEOUT_SECONDS = 120


def product_env(moto: str, microvms: str, *, token: Optional[str] = TOKEN) -> dict[str, str]:
    """The environment of a user's shell with the product's endpoints on loopback."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR") or k.startswith("COVERAGE_")}
    env = {**base, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL_SSM": moto, "AWS_ENDPOINT_URL_STS": moto,
           "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto, "AWS_ENDPOINT_URL_DYNAMODB": moto,
           "AWS_ENDPOINT_URL_LAMBDA_MICROVMS": microvms, "PYTHONDONTWRITEBYTECODE": "1"}
    if token is not None:
        env["RAYITO_ACCESS_TOKEN"] = token
    return env


def rayito(args: Sequence[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rayito <args>`` as a user runs it (``cwd``: where it may write ``.rayito/``)."""
    return subprocess.run([sys.executable, "-m", "rayito.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=TIMEOUT_SECONDS)


def status_json(name: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """``rayito --json agent status <name>``, parsed."""
    done = rayito(["--json", "agent", "status", name], env, cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
