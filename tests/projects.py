"""Rayito agent folders for tests, in the product's format (``rayito.agent-project/1``).

:func:`write_project` writes a folder the product's loader reads: the example's ``custom`` runtime
app (``serve.py``, answering without a model key), its model gateway, and the tables a test gives,
merged over that base (a test's value wins). Tables that are this library's (``[egress]``,
``[stack]``) go to ``rayito-constructs.toml`` instead, since the product's loader refuses them.
:func:`scaffold` writes one of the product's own ``rayito agent init`` scaffolds.
"""

from __future__ import annotations

import atexit
import copy
import json
import shutil
import tempfile
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Mapping, Optional

#: Every folder :func:`scratch` makes lives under this one, removed when the process exits: a
#: helper called by hundreds of tests left 1,403 folders in /tmp over a day of runs.
_SCRATCH = Path(tempfile.mkdtemp(prefix="rayito-tests-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


def scratch(prefix: str) -> Path:
    """A fresh empty folder for a test's project, kept until the process exits (a synthesized
    stack's assets may still read it after the test that made it)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH))

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mi-agente"

#: The tables of rayito-constructs.toml (this library's), never of rayito-agent.toml.
OWN_TABLES = ("egress", "stack")

BASE: dict[str, Any] = {
    "schema": "rayito.agent-project/1",
    "runtime": {"kind": "custom", "requirements": "requirements.txt", "install": [],
                "app": {"command": ["python", "serve.py"], "port": 9100, "health_path": "/health",
                        "invoke_path": "/invoke", "protocol": "json", "port_env": "PORT"}},
    "source": {"path": ".", "exclude": [".venv", "node_modules", "__pycache__", ".git"]},
    "model": {"provider": "bedrock", "id": "us.anthropic.claude-haiku-4-5-20251001-v1:0", "region": "us-east-1",
              "gateway": "model"},
    "gateways": {"model": {"preset": "bedrock", "secret": "provider-key", "region": "us-east-1",
                           "models": ["us.anthropic.claude-haiku-4-5-20251001-v1:0"]}},
    "agent": {"instructions_file": "AGENTS.md"},
}


def write_project(folder: Path, *, name: str = "agente", toml: Optional[str] = None,
                  tables: Optional[Mapping[str, Any]] = None, dockerfile: bool = False) -> Path:
    """A product project in ``folder`` (made if needed): ``BASE`` with ``name``, then ``toml`` (text)
    and ``tables`` merged over it; ``[egress]``/``[stack]`` go to ``rayito-constructs.toml``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = copy.deepcopy(BASE)
    data["name"] = name
    given: dict[str, Any] = tomllib.loads(textwrap.dedent(toml)) if toml else {}
    _merge(given, dict(tables or {}))
    own = {k: given.pop(k) for k in OWN_TABLES if k in given}
    _merge(data, given)
    if "instructions" in data["agent"] and "instructions_file" not in dict(given.get("agent", {})):
        del data["agent"]["instructions_file"]  # the product takes one of the two
    (folder / "rayito-agent.toml").write_text(dumps(data))
    if own:
        (folder / "rayito-constructs.toml").write_text(dumps(own))
    for file in ("serve.py", "AGENTS.md", "requirements.txt"):
        shutil.copyfile(EXAMPLE / file, folder / file)
    if dockerfile:
        (folder / "Dockerfile").write_text("FROM scratch\n")
    return folder


def scaffold(folder: Path, runtime: str, language: str = "python", provider: str = "bedrock",
             name: Optional[str] = None) -> Path:
    """The product's own ``rayito agent init`` scaffold (``scaffold_files``/``write_scaffold``)."""
    from rayito._agent._project_file import project_name_of
    from rayito.cli._agent_scaffold import PROVIDER_PRESETS, ScaffoldRequest, scaffold_files, write_scaffold

    folder.mkdir(parents=True, exist_ok=True)
    model = PROVIDER_PRESETS[provider][1] or "gpt-4o-mini"
    request = ScaffoldRequest(name=name or project_name_of(folder), runtime=runtime, language=language,
                              provider=provider, model_id=model, region="us-east-1")
    write_scaffold(folder, scaffold_files(request), force=False)
    return folder


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def dumps(data: Mapping[str, Any]) -> str:
    """TOML for the plain data of a project file (tables, arrays of tables, scalars, lists)."""
    lines: list[str] = []
    _table(lines, [], data)
    return "\n".join(lines).strip() + "\n"


def _table(lines: list[str], path: list[str], data: Mapping[str, Any]) -> None:
    plain = {k: v for k, v in data.items() if not _is_table(v) and not _is_table_array(v)}
    if path and (plain or not data):
        lines.append(f"\n[{'.'.join(_key(p) for p in path)}]")
    for key, value in plain.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in data.items():
        if _is_table(value):
            _table(lines, [*path, key], value)
        elif _is_table_array(value):
            for item in value:
                lines.append(f"\n[[{'.'.join(_key(p) for p in [*path, key])}]]")
                for k, v in item.items():
                    lines.append(f"{_key(k)} = {_value(v)}")


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {value!r}")


#: The library's old option names, as tests of the reconciler and the constructs still spell the
#: shape of a fleet, and the flag of rayito agent deploy each one is now.
_FLAG_OF = {"warm_vms": "warm", "memory_mib": "memory", "max_concurrency": "max_sessions", "queue_max": "queue",
            "queue_timeout_seconds": "queue_timeout", "scale_in_after_seconds": "scale_in_after"}


def project_with(name: str = "agente", *, tables: Optional[Mapping[str, Any]] = None, dockerfile: bool = True,
                 **options: Any) -> Any:
    """An ``AgentProject`` of a fresh product folder named ``name`` with the scaling and serving
    ``options`` as deploy flags (``min_vms``, ``max_vms``, ``warm``/``warm_vms``, ``idle``...;
    ``idle=None``: no suspension, ``[serve] idle_seconds = 0``)."""
    from rayito_constructs import AgentProject

    all_tables = {k: dict(v) for k, v in (tables or {}).items()}
    flags = {_FLAG_OF.get(k, k): v for k, v in options.items()}
    if "idle" in flags and flags["idle"] is None:
        del flags["idle"]
        all_tables.setdefault("serve", {})["idle_seconds"] = 0
    root = scratch("project-")
    folder = write_project(root / name, name=name, tables=all_tables, dockerfile=dockerfile)
    return AgentProject.load(folder, **flags)
