"""The floor script's arithmetic: each folder on its own, a file counted in every folder above it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import coverage_floor as cf

REPO = Path(__file__).resolve().parent.parent


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


def test_a_checked_file_is_held_on_its_own() -> None:
    files = {"rayito_constructs/model/egress_targets.py": _file(100, 94, 10, 10),
             "rayito_constructs/egress_targets_more.py": _file(100, 100, 10, 10)}  # not that file
    result = cf.tallies(files, ["rayito_constructs/model/egress_targets.py"])
    assert result["rayito_constructs/model/egress_targets.py"].files == 1
    assert cf.below_floor(result) == ["rayito_constructs/model/egress_targets.py: lines 94.0% is below the floor of 95%"]


def test_nothing_is_pending_so_every_folder_below_the_floor_fails_the_run() -> None:
    """Issue #17: nothing is reported-only, so every folder below the floor fails the run."""
    assert cf.PENDING == {}
    problems = cf.below_floor(cf.tallies({"lambdas/reconciler/tick.py": _file(100, 94, 10, 8)},
                                         ["lambdas/reconciler", "lambdas"]))
    assert cf.failing(problems) == problems and len(problems) == 4
    assert cf.failing(problems, {"lambdas/reconciler": "x", "lambdas": "y"}) == []


# ---------------------------------------------------------------- every uncovered range says why

_SOURCE = """\
def f(x):
    if x:                       # 2
        return 1                # 3
    try:                        # 4
        y = g()                 # 5
    except KeyError:            # 6
        # uncovered: g never raises KeyError in a test (needs a broken g)
        y = 0                   # 8
        y += 1                  # 9
    for i in range(x):          # 10
        y += i                  # 11
    if y:                       # 12  uncovered: y is never 0 here (the loop always runs)
        y -= 1                  # 13
    z = 1                       # 14
    w = 2                       # 15
    return y                    # 16
"""


def _data(missing: list[int], executed: list[int], branches: list[list[int]]) -> dict:
    return {"missing_lines": missing, "executed_lines": executed, "missing_branches": branches}


def _check(data: dict, source: str = _SOURCE) -> list[str]:
    return cf.unjustified({"lambdas/x/index.py": data}, ["lambdas/x", "lambdas"], read=lambda _path: source)


def test_ranges_are_runs_of_missing_statements_with_no_executed_one_between() -> None:
    data = _data([3, 6, 8, 9, 14, 15], [1, 2, 4, 5, 10, 11, 12, 13, 16], [])
    assert cf.uncovered_ranges(data) == [(3, 3), (6, 9), (14, 15)]


def test_a_marker_on_the_range_or_up_to_three_lines_above_justifies_it() -> None:
    # 6-9 is one range (nothing between ran); the comment on 7 is inside it.
    # 3 has no marker on it or on lines 1-2: reported. 14-15: the nearest marker (12) is 2 above 14.
    executed = [1, 2, 4, 5, 10, 11, 12, 13, 16]
    assert _check(_data([3, 6, 8, 9, 14, 15], executed, [])) == ["lambdas/x/index.py:3"]
    # a marker 4 lines above the range is too far: line 16 alone (12 is 4 above it)
    assert _check(_data([16], [1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15], [])) == ["lambdas/x/index.py:16"]


def test_a_partial_branch_needs_a_marker_at_its_head_or_its_target() -> None:
    executed = list(range(1, 17))
    data = _data([], executed, [[2, 3], [12, 14], [10, 12], [10, -1]])
    # 2->3: nothing on lines 1-3 -> reported. 12->14: the marker on 12 (the head). 10->12: the marker
    # on 12 (the target). 10->exit: the head (10) has the comment on 7 within three lines above.
    assert _check(data) == ["lambdas/x/index.py:2->3"]
    assert _check(_data([], executed, [[2, -1]])) == ["lambdas/x/index.py:2->exit"]


def test_pragma_no_cover_counts_and_files_outside_the_folders_are_not_checked() -> None:
    source = "def f(x):\n    if x:  # pragma: no cover - reason\n        return 1\n    return 0\n"
    assert _check(_data([3], [1, 2, 4], [[2, 3]]), source) == []
    outside = cf.unjustified({"rayito_constructs/fleet.py": _data([3], [1, 2, 4], [])}, ["lambdas"],
                             read=lambda _path: "")
    assert outside == []


def test_a_fully_covered_file_is_not_read() -> None:
    def read(_path: str) -> str:
        raise AssertionError("read a file with nothing uncovered")

    assert cf.unjustified({"lambdas/x/index.py": _data([], [1, 2], [])}, ["lambdas"], read=read) == []


def test_main_fails_on_a_bare_uncovered_line(tmp_path) -> None:
    """The whole script on a real (tiny) coverage data file: the floor holds, one line says nowhere
    why it is not covered, the run fails and names it; with the marker added, it passes.

    The script runs in a process of its own, outside `make test`'s measurement: a second
    ``coverage.Coverage`` reporting inside a measured pytest-xdist worker ended that worker's
    measurement, and every test after it on that worker counted as not run (the floor failed)."""
    import coverage

    package = tmp_path / "lambdas" / "tiny"
    package.mkdir(parents=True)
    body = ["def f(x):", "    if x:", "        return 1", "    return 0", ""]
    module = package / "index.py"
    filler = [f"V{i} = {i}" for i in range(40)]  # the function starts on line 41
    module.write_text("\n".join(filler + body))
    (tmp_path / "pyproject.toml").write_text(
        '[tool.coverage.run]\nbranch = true\nsource = ["lambdas"]\ndata_file = ".coverage"\n')
    # What running f(0) records (arcs; a negative number is a code object's entry or exit).
    arcs = [(-1, 1), *((i, i + 1) for i in range(1, 41)), (41, -1), (-41, 42), (42, 44), (44, -41)]
    data = coverage.CoverageData(basename=str(tmp_path / ".coverage"))
    data.add_arcs({str(module): set(arcs)})
    data.write()
    driver = (
        "import sys\nfrom pathlib import Path\nsys.path.insert(0, sys.argv[1])\n"
        "from tests import coverage_floor as cf\n"
        "cf.ROOT = Path(sys.argv[2])\ncf.checked_folders = lambda root: ['lambdas/tiny', 'lambdas']\n"
        "cf.LINES_FLOOR = cf.BRANCHES_FLOOR = 0.0  # this test is about the second check only\n"
        "sys.argv[1:] = sys.argv[3:]\nraise SystemExit(cf.main())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", driver, str(REPO), str(tmp_path), *flags], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    reported = run()  # listed, not failed: make test must not fail on a race's timing
    assert reported.returncode == 0 and "lambdas/tiny/index.py:43" in reported.stderr
    failed = run("--strict")
    assert failed.returncode == 1, failed.stderr
    assert "lambdas/tiny/index.py:43" in failed.stderr and "lambdas/tiny/index.py:42->43" in failed.stderr
    body[1] = "    if x:  # uncovered: f is only called with 0 here"
    module.write_text("\n".join(filler + body))
    passed = run("--strict")
    assert passed.returncode == 0, passed.stderr
    assert "every uncovered range and branch there says why" in passed.stdout
