"""The floor script's arithmetic: each folder on its own, a file counted in every folder above it."""

from __future__ import annotations

from tests import coverage_floor as cf


def _file(statements: int, covered: int, branches: int, covered_branches: int) -> dict:
    return {"summary": {"num_statements": statements, "covered_lines": covered, "num_branches": branches,
                        "covered_branches": covered_branches}}


def test_each_folder_is_held_on_its_own() -> None:
    files = {
        "lambdas/a/index.py": _file(100, 100, 10, 10),
        "lambdas/b/index.py": _file(100, 90, 10, 8),  # 90% lines, 80% branches
        "rayito_constructs/egress/client.py": _file(50, 50, 4, 4),
        "rayito_constructs/other.py": _file(10, 0, 2, 0),  # not held to the floor
    }
    result = cf.tallies(files, ["lambdas/a", "lambdas/b", "lambdas", "rayito_constructs/egress"])
    assert result["lambdas"].lines_percent == 95.0 and result["lambdas"].branches_percent == 90.0
    problems = cf.below_floor(result)
    assert problems == ["lambdas/b: lines 90.0% is below the floor of 95%",
                        "lambdas/b: branches 80.0% is below the floor of 90%"]


def test_a_folder_with_nothing_measured_fails() -> None:
    assert cf.below_floor(cf.tallies({}, ["lambdas/new"])) == [
        "lambdas/new: no measured file (is it in [tool.coverage.run] source?)"]


def test_every_lambda_folder_is_checked() -> None:
    folders = cf.checked_folders()
    assert {"lambdas/reconciler", "lambdas/recipe_writer", "lambdas", "rayito_constructs/egress"} <= set(folders)


def test_nothing_is_pending_so_every_folder_below_the_floor_fails_the_run() -> None:
    """Issue #17: lambdas/reconciler reached the floor (round 4); nothing is reported-only now."""
    assert cf.PENDING == {}
    problems = cf.below_floor(cf.tallies({"lambdas/reconciler/tick.py": _file(100, 94, 10, 8)},
                                         ["lambdas/reconciler", "lambdas"]))
    assert cf.failing(problems) == problems and len(problems) == 4
    assert cf.failing(problems, {"lambdas/reconciler": "x", "lambdas": "y"}) == []
