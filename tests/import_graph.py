"""The import graph of a package folder, read from its source (ast): every import a module makes,
at the top or inside a function, for the layer tests (tests/test_layers.py,
tests/reconciler/test_layers.py). Imports under ``if TYPE_CHECKING:`` are left out: they are
annotations, never run."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(top: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module under ``top`` (``lambdas``, ``rayito_constructs``) and the modules of that folder
    (or outside packages) it imports."""
    mods = {}
    for path in (root / top).rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                children = {f"{target}.{a.name}" for a in node.names} & mods.keys()
                graph[name] |= children or ({target} & mods.keys())
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= {a.name for a in node.names} if isinstance(node, ast.Import) else {node.module or ""}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``, each as the path that closes it (empty: none)."""
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
