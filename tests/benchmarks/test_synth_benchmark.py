"""The synth benchmark (benchmarks/synth.py, the numbers of docs/performance.md's "Synth") builds
what it says: one example copy per fleet with its own name, never written into examples/, the
variants with the same fleets, and a whole-process run that reads what app.py wrote. (How long
it takes is the benchmark's business, not the tests'.)"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks import synth as bench
from rayito_constructs import AgentProject

from ..conftest import EXAMPLE, ROOT


def test_each_fleet_is_a_copy_of_the_example_with_its_own_name() -> None:
    before = {p.name: p.read_bytes() for p in EXAMPLE.iterdir() if p.is_file()}
    folders = [bench.fleet_folder(i) for i in range(3)]
    assert [AgentProject.load(f).name for f in folders] == ["agente-0", "agente-1", "agente-2"]
    assert all(EXAMPLE not in f.parents and not AgentProject.load(f).egress.budgets for f in folders)
    assert {p.name: p.read_bytes() for p in EXAMPLE.iterdir() if p.is_file()} == before  # examples/ untouched


def test_the_variants_synthesize_the_same_fleets() -> None:
    with tempfile.TemporaryDirectory() as outdir:
        assembly = bench.ours(2, outdir).synth()
        ours = json.loads(Path(assembly.get_stack_by_name("Bench").template_full_path).read_text())
    with tempfile.TemporaryDirectory() as outdir:
        assembly = bench.baseline(2, outdir).synth()
        theirs = json.loads(Path(assembly.get_stack_by_name("Bench").template_full_path).read_text())
    recipes = [r for r in ours["Resources"].values() if r["Type"] == "Custom::RayitoRecipe"]
    assert sorted(r["Properties"]["ParameterName"] for r in recipes) == [
        "/rayito/agents/agente-0/recipe", "/rayito/agents/agente-1/recipe"]
    assert sum(r["Type"] == "AWS::CloudFormation::CustomResource" for r in theirs["Resources"].values()) == 2


def test_a_whole_process_run_reports_what_app_py_wrote(tmp_path) -> None:
    env = {**bench._base_env(), "CDK_CONTEXT_JSON": bench._context(ROOT),
           "RAYITO_CONSTRUCTS_CACHE": str(tmp_path / "cache")}
    run = bench.run_once([sys.executable, "app.py"], ROOT, env)
    assert run["resources"] > 20 and run["template_bytes"] > 10_000
    assert run["cpu_seconds"] > 0 and run["seconds"] > 0
    assert bench.ratios({"ours (example, app.py)": {"first": {"seconds": 9.0, "cpu_seconds": 2.2},
                                                    "warm": {"seconds": 1.0, "cpu_seconds": 1.0}},
                         "peer": {"first": {"seconds": 2.0, "cpu_seconds": 2.0}, "warm": {"seconds": 3.0, "cpu_seconds": 1.0}},
                         "absent": {"not_measured": "no --peers-python given"}}) == {
        "ours / peer, first, CPU": 1.1, "ours / peer, warm, CPU": 1.0}


def test_the_cdks_validation_is_set_for_every_app_alike_or_left_as_shipped(monkeypatch) -> None:
    monkeypatch.setenv("CDK_VALIDATION", "false")  # the suite's own setting never leaks into a measurement
    assert "CDK_VALIDATION" not in bench._base_env()
    assert bench._base_env("default") == bench._base_env()
    assert bench._base_env("on")["CDK_VALIDATION"] == "true"
    assert bench._base_env("off")["CDK_VALIDATION"] == "false"
