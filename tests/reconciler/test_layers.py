"""The Lambdas' imports run one way: no circle in lambdas/, the pure core imports nothing of the shell
(nor boto3), and the teardown and pruner do not import the reconciler's handler."""

from __future__ import annotations

from ..import_graph import circles
from ..import_graph import imports as _imports


def imports() -> dict[str, set[str]]:
    """Each module of lambdas/ and the modules of lambdas/ (or outside packages) it imports."""
    return _imports("lambdas")


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
