"""The Lambdas' imports run one way: no circle in lambdas/, the pure core imports nothing of the shell
(nor boto3), and the teardown and pruner do not import the reconciler's handler."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports() -> dict[str, set[str]]:
    """Each module of lambdas/ and the modules of lambdas/ (or outside packages) it imports."""
    mods = {}
    for path in (ROOT / "lambdas").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                children = {f"{target}.{a.name}" for a in node.names} & mods.keys()
                graph[name] |= children or ({target} & mods.keys())
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= {a.name for a in node.names} if isinstance(node, ast.Import) else {node.module or ""}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}
    found: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if seen.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in seen:
                walk(nxt, path + [nxt])
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            walk(node, [node])
    return found


def test_no_import_circle_in_lambdas() -> None:
    assert circles(imports()) == []


def test_the_core_imports_nothing_of_the_shell_nor_aws() -> None:
    graph = imports()
    for name, targets in graph.items():
        if name.startswith("lambdas.reconciler.core"):
            outside = {t for t in targets if t.startswith("lambdas.") and not t.startswith("lambdas.reconciler.core")}
            assert not outside and not {t for t in targets if t.split(".")[0] in ("boto3", "botocore")}, (name, targets)


def test_teardown_and_pruner_do_not_import_the_reconcilers_handler() -> None:
    graph = imports()
    for name in ("lambdas.reconciler.teardown", "lambdas.reconciler.pruner", "lambdas.reconciler.custom_resource"):
        assert "lambdas.reconciler.index" not in graph[name] and "lambdas.reconciler.tick" not in graph[name], name
