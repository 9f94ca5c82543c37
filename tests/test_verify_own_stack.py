"""``verify`` on a user's own stack holding three fleets, with no outputs: each found by type and
logical id; a fleet without reconciler or egress budgets, one that saves no recipe, one whose image
is published elsewhere (and missing). What is not there is a WARN (or a FAIL where the fleet
cannot work without it), never a crash."""

from __future__ import annotations

from typing import Iterator

import pytest

from .verify_fakes import _project

from rayito_constructs.verify import Status, TargetNotFound

from . import verify_world as vw
from .verify_world import finding, statuses

MISSING = f"arn:aws:lambda:us-east-1:{vw.ACCOUNT}:microvm-image:not-there"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vw.World]:
    root = tmp_path_factory.mktemp("own-stack")
    fleets = {
        "Bare": (_project(root, "bare", 'name = "bare"\n[scaling]\nmin_vms = 1\nmax_vms = 2\n'), {"reconciler": False}),
        "Quiet": (_project(root, "quiet", 'name = "quiet"\n', save_recipe=False), {"reconciler": False}),
        "Elsewhere": (_project(root, "elsewhere", 'name = "elsewhere"\n'), {"reconciler": False, "image_arn": MISSING}),
    }
    assembly = vw.synth("own-stack", vw.own_stack("MyApp", fleets))
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        world.deploy(assembly)
        yield world


def test_several_fleets_need_a_choice(world: vw.World) -> None:
    with pytest.raises(TargetNotFound) as caught:
        world.verify("MyApp")
    assert "holds 3 fleets (bare, elsewhere, quiet): pass --fleet NAME" in str(caught.value)
    with pytest.raises(TargetNotFound) as caught:
        world.verify("MyApp", fleet="other")
    assert "holds no fleet 'other'" in str(caught.value)


def test_a_fleet_without_reconciler_egress_or_index(world: vw.World) -> None:
    report = world.verify("MyApp", fleet="bare")
    got = statuses(report)
    assert report.fleet == "bare" and report.stack == "MyApp"
    assert got["reconciler"] == "WARN" and "not deployed" in finding(report, "reconciler").summary
    assert got["egress"] == "WARN" and got["iam.reconciler"] == "WARN" and got["image.version"] == "WARN"
    assert got["quotas.rates"] == "WARN"
    assert got["recipe"] == "OK" and got["image"] == "OK" and got["quotas.memory"] == "OK"
    assert finding(report, "recipe").data["parameter"] == "/rayito/agents/bare/recipe"
    assert not any("internal error" in f.summary for f in report.findings)


def test_no_recipe_saved(world: vw.World) -> None:
    report = world.verify("MyApp", fleet="quiet")
    recipe = finding(report, "recipe")
    assert recipe.status is Status.WARN and recipe.summary.startswith("not saved")
    assert "save_recipe" in recipe.fix
    assert not any("internal error" in f.summary for f in report.findings)


def test_an_image_that_does_not_exist(world: vw.World) -> None:
    report = world.verify("MyApp", fleet="elsewhere")
    image = finding(report, "image")
    assert image.status is Status.FAIL and "does not exist" in image.summary and report.exit_code == 1
    assert not any("internal error" in f.summary for f in report.findings)
