"""Fleet lifecycle (#13) and ``verify`` (#16) with several fleets in one app: each test pins a
failure found on the production path (real handlers, real boto3 over HTTP to moto server mode
and the MicroVMs emulator)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from . import verify_world as vw
from .verify_fakes import _project
from .verify_world import statuses


# --------------------------------------------------------------------------- verify: fleets in one stack


@pytest.fixture(scope="module")
def two_fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vw.World]:
    """A user's own stack with two fleets whose construct ids share a prefix (``Agent`` and
    ``AgentCanary``: a production fleet and its canary)."""
    root = tmp_path_factory.mktemp("prefix-fleets")
    fleets = {
        "Agent": (_project(root, "agent", 'name = "agent"\n'), {"reconciler": False}),
        "AgentCanary": (_project(root, "canary", 'name = "canary"\n', save_recipe=False), {"reconciler": False}),
    }
    assembly = vw.synth("fleets-prefix-fleets", vw.own_stack("MyApp", fleets))
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        world.deploy(assembly)
        yield world


def test_verify_sees_both_fleets_when_one_construct_id_prefixes_the_other(two_fleets: vw.World) -> None:
    """``fleets_of`` drops every prefix that extends another one (meant for ``FleetReconciler``
    under ``Fleet``), so the sibling fleet ``AgentCanary`` vanishes: verify of the stack checks
    ``agent`` alone without asking for ``--fleet``, and ``--fleet canary`` is refused."""
    report = two_fleets.verify("MyApp", fleet="canary")
    assert report.fleet == "canary"
    recipe = [f for f in report.findings if f.check == "recipe"]
    assert recipe and recipe[0].summary.startswith("not saved"), statuses(report)


def test_verify_of_a_two_fleet_stack_asks_which_fleet(two_fleets: vw.World) -> None:
    """Without ``--fleet`` a stack of two fleets must be refused with the list of both (as for
    three fleets with unrelated ids); here it silently checks ``agent`` and reports the stack fine."""
    from rayito_constructs.verify import TargetNotFound

    with pytest.raises(TargetNotFound) as caught:
        two_fleets.verify("MyApp")
    assert "holds 2 fleets (agent, canary): pass --fleet NAME" in str(caught.value)


# --------------------------------------------------------------------------- verify: a shared image


@pytest.fixture(scope="module")
def shared_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vw.World]:
    """Two fleets of one stack on one image (``share_image=True``, one ledger table), each with
    min_vms 2 and max_vms 3, both converged by their real reconcilers."""
    root = tmp_path_factory.mktemp("shared-image")
    image = f"arn:aws:lambda:us-east-1:{vw.ACCOUNT}:microvm-image:shared-agent"
    toml = '[scaling]\nmin_vms = 2\nmax_vms = 3\n'
    fleets = {
        "Alpha": (_project(root, "alpha", 'name = "alpha"\n' + toml), {"image_arn": image, "share_image": True}),
        "Beta": (_project(root, "beta", 'name = "beta"\n' + toml), {"image_arn": image, "share_image": True}),
    }
    assembly = vw.synth("fleets-shared-image", vw.own_stack("SharedApp", fleets))
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        assert world.emulator.create_image("shared-agent", memory_mib=2048, hooks=True) == image  # the product's
        world.deploy(assembly)
        resources = world.moto("cloudformation").list_stack_resources(StackName="SharedApp")["StackResourceSummaries"]
        lam = world.moto("lambda")

        def function(prefix: str) -> dict[str, Any]:
            (name,) = [r["PhysicalResourceId"] for r in resources if r["ResourceType"] == "AWS::Lambda::Function"
                       and r["LogicalResourceId"].startswith(f"{prefix}Reconciler")
                       and "Teardown" not in r["LogicalResourceId"] and "Server" not in r["LogicalResourceId"]]
            return lam.get_function_configuration(FunctionName=name)

        for prefix in ("Alpha", "Beta", "Alpha", "Beta", "Alpha", "Beta"):
            config = function(prefix)
            world.function_config = lambda _stack, config=config: config  # type: ignore[method-assign]
            world._log_group = lambda _stack, config=config: f"/aws/lambda/{config['FunctionName']}"  # type: ignore[method-assign]
            world.tick("SharedApp")
            import time as _time
            _time.sleep(0.3)
        running = [vm for vm in world.emulator.microvms() if vm["state"] == "RUNNING"]
        assert len(running) == 4, [vm["state"] for vm in world.emulator.microvms()]
        yield world


def test_verify_of_a_healthy_fleet_on_a_shared_image_does_not_fail(shared_image: vw.World) -> None:
    """Each fleet runs its 2 base VMs, within its max_vms of 3 (the sibling's VMs, held by the
    sibling's ledger, count toward neither: docs/reconciler.md "Shared images"). verify counts every
    live VM of the image against this fleet's max_vms: 4 > 3, ``reconciler.fleet`` FAIL, exit 1."""
    report = shared_image.verify("SharedApp", fleet="alpha")
    fleet = [f for f in report.findings if f.check == "reconciler.fleet"]
    assert fleet and fleet[0].data["base_live"] == 2, fleet
    assert fleet[0].status.value != "FAIL", (fleet[0].summary, statuses(report))


# --------------------------------------------------------------------------- verify: the image it checks


@pytest.fixture(scope="module")
def image_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vw.World]:
    """A fleet without reconciler whose image is published elsewhere (``image_arn=``) and does not
    exist, in an account that holds an older image named after the fleet."""
    root = tmp_path_factory.mktemp("image-elsewhere")
    missing = f"arn:aws:lambda:us-east-1:{vw.ACCOUNT}:microvm-image:agent-images-v2"
    fleets = {"Elsewhere": (_project(root, "elsewhere", 'name = "elsewhere"\n'),
                            {"reconciler": False, "image_arn": missing})}
    assembly = vw.synth("fleets-image-elsewhere", vw.own_stack("ElsewhereApp", fleets))
    with pytest.MonkeyPatch.context() as monkeypatch, vw.world(monkeypatch) as world:
        world.emulator.create_image("elsewhere", memory_mib=2048)  # an old image, not the fleet's
        world.deploy(assembly)
        yield world


def test_verify_checks_the_fleets_image_not_one_named_after_it(image_elsewhere: vw.World) -> None:
    """The fleet runs ``agent-images-v2`` (its launcher policy and its recipe name it), which does
    not exist: ``image`` must FAIL (as tests/test_verify_own_stack.py expects). verify falls back to
    the image named after the fleet, finds the unrelated ``elsewhere`` image and reports it OK."""
    report = image_elsewhere.verify("ElsewhereApp")
    image = [f for f in report.findings if f.check == "image"]
    assert image and image[0].data.get("image_arn", "").endswith(":agent-images-v2"), (image, statuses(report))
    assert image[0].status.value == "FAIL" and report.exit_code == 1
