"""The recipe is byte for byte what the product saves, and the product's client reads ours.

Proof from the product's side, unmodified: its own CLI (`rayito agent deploy`, in a process of
its own, against moto and the MicroVMs emulator over HTTP) saves the recipe of a project and its
flags, and the value is compared with what this library plans for the same project and flags;
the recipe writer's handler (its entry point, on moto's S3 and SSM, answering a local
CloudFormation endpoint) stores its value for the same projects with a deploy-time version, and
`AgentFleet.connect` (and, for two of them, `rayito agent status`) reads it back: the deployed
scaling, from the recipe, and the folder's project after the flags. `--min-vms 0 --warm 0 --no-build` keep the product's deploy from starting a VM (it has
no rayd to reach here); the recipe it saves is the one any deploy saves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from lambdas.recipe_writer import index as writer
from rayito_constructs import AgentProject, ProjectError
from rayito_constructs.model.product import decode, encoding_of
from rayito_constructs.model.recipe import VERSION_STAND_IN, plan_recipe
from rayito_constructs.testing import MicrovmsEmulator

from .conftest import EXAMPLE
from .moto_server import client, moto_server, put_secret
from .product_cli import TOKEN, product_env, rayito, status_json
from .projects import scaffold, write_project
from .recipe_writer_helpers import CloudFormationEndpoint, write_recipe

#: The stack's deployment bucket, where the recipe writer reads the document the stack ships.
BUCKET = "cdk-hnb659fds-assets-123456789012-us-east-1"
FLAGS = {"max_vms": 5, "sessions": "dedicated", "max_sessions": 1, "queue": 8, "queue_timeout": 12.5, "idle": 900,
         "timeout": 1800, "memory": 8192, "env": ["EXTRA=1"], "allow_out": ["c.example.com"],
         "secret_env": ["DB_URL=app/db#url"], "scale_in_after": 1200}


def cli_args(flags: dict[str, Any]) -> list[str]:
    """The same flags as `rayito agent deploy` takes them."""
    out: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            out += [flag, str(item)]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """moto (SSM, S3, STS, Secrets Manager) and the emulator, the secrets the projects name, the
    stack's deployment bucket and CloudFormation's response endpoint (the recipe writer's), and a
    working folder outside every project (the product's CLI may write .rayito/ there)."""
    cfn = CloudFormationEndpoint(tmp_path_factory.mktemp("cfn"))
    with moto_server() as moto, MicrovmsEmulator() as emulator:
        secrets = client("secretsmanager", moto)
        for name in ("rayito/provider-key", "app/db"):
            put_secret(secrets, name, '{"url": "postgres://db"}')
        client("s3", moto).create_bucket(Bucket=BUCKET)
        yield {"moto": moto, "emulator": emulator, "ssm": client("ssm", moto), "cwd": tmp_path_factory.mktemp("shell"),
               "env": product_env(moto, emulator.endpoint_url), "cfn": cfn}
    cfn.close()


def product_deploy(world: dict[str, Any], folder: Path, flags: dict[str, Any]) -> str:
    """The value `rayito agent deploy <folder> <flags> --min-vms 0 --warm 0 --no-build` saved."""
    done = rayito(["agent", "deploy", str(folder), *cli_args(flags), "--min-vms", "0", "--warm", "0", "--no-build"],
                  world["env"], world["cwd"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    name = AgentProject.load(folder, **flags, min_vms=0, warm=0).name
    value = world["ssm"].get_parameter(Name=f"/rayito/agents/{name}/recipe", WithDecryption=True)["Parameter"]["Value"]
    world["ssm"].delete_parameter(Name=f"/rayito/agents/{name}/recipe")
    return value


def big_project(root: Path) -> Path:
    return write_project(root / "grande", name="grande", tables={"agent": {"instructions": "Responde breve. " * 400}})


CASES = {
    "example": (lambda root: EXAMPLE, {}),
    "example-with-flags": (lambda root: EXAMPLE, FLAGS),
    "gzip-envelope": (big_project, {}),
    **{f"{r}-{lang}-{p}": ((lambda root, r=r, lang=lang, p=p: scaffold(root / f"{r}-{lang}-{p}", r, lang, p)), {})
       for r, lang, p in [("strands", "python", "bedrock"), ("strands", "typescript", "anthropic"),
                          ("strands-harness", "python", "bedrock"), ("langgraph", "python", "openai"),
                          ("deepagents", "python", "anthropic"), ("opencode", "python", "bedrock"),
                          ("hermes", "python", "bedrock"), ("custom", "python", "openai")]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_recipe_is_what_the_product_deploy_saves(world, tmp_path, case) -> None:
    make, flags = CASES[case]
    folder = make(tmp_path)
    theirs = product_deploy(world, folder, flags)
    project = AgentProject.load(folder, **flags, min_vms=0, warm=0)
    plan = plan_recipe(project)
    assert plan.encoded is not None and plan.encoded.value == theirs  # byte for byte
    assert plan.encoded.encoding == ("gzip+base64" if case == "gzip-envelope" else "json")
    assert plan.document["schema"] == "rayito.agent-recipe/1" and plan.document["savedBy"] == "python/0.17.1"


#: What the recipe writer's tests deploy besides the case's own flags: a fleet whose scaling is
#: none of the product's defaults (min 1, max 1, warm 0), so a client that fell back to them fails.
DEPLOYED = {"min_vms": 2, "max_vms": 5, "warm": 1}
#: Cases whose fleet the product's own CLI reads too (a process each: kept to two).
CLI_CASES = ("example-with-flags", "gzip-envelope")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_writers_value_is_read_by_the_product(world, tmp_path, monkeypatch, case) -> None:
    """For the example, each runtime and provider preset ``rayito agent init`` scaffolds, a
    recipe that needs the gzip envelope and one with flags: the value the recipe writer's handler
    stores at deploy (with the image version CloudFormation resolved) is read by the product's
    client, ``AgentFleet.connect``: its scaling comes from the recipe, the deployed one, and the
    project it rebuilds is the folder's after the flags. The product's CLI prints it too."""
    from rayito import AgentFleet
    from rayito import AgentProject as ProductLoader
    from rayito._agent._fleet_recipe_aws import load_recipe

    make, flags = CASES[case]
    folder = make(tmp_path)
    project = AgentProject.load(folder, **{**DEPLOYED, **flags})
    plan = plan_recipe(project, builds_image=True)  # the stack builds the image: its version comes at deploy
    answer = write_recipe(plan.document, image_version="7", moto=world["moto"], bucket=BUCKET, cfn=world["cfn"],
                          monkeypatch=monkeypatch)
    assert answer["Status"] == "SUCCESS" and answer["Data"]["Outcome"] == "saved", answer
    assert answer["Data"]["Encoding"] == ("gzip+base64" if case == "gzip-envelope" else "json")
    value = world["ssm"].get_parameter(Name=plan.parameter_name, WithDecryption=True)["Parameter"]["Value"]
    assert encoding_of(value) == answer["Data"]["Encoding"] and decode(value)[0].image_version == "7"
    try:
        # the product's client in this process, through its recipe_store seam (SSM on moto)
        fleet = AgentFleet.connect(project.name, access_token=TOKEN, recipe_store=_Ssm(world["ssm"]), directory=_NoVms())
        status = fleet.status()
        expected = project.scaling
        assert status.scaling_source == "recipe"
        assert (status.min_vms, status.max_vms, status.warm_vms) == (expected.min_vms, expected.max_vms,
                                                                     expected.warm_vms) == (2, 5, 1)
        assert fleet.scaling.sessions == expected.sessions == flags.get("sessions", "shared")
        _, rebuilt = load_recipe(_Ssm(world["ssm"]), project.name)  # what connect rebuilds the project with
        assert rebuilt.to_dict() == project.to_product_dict()  # the folder's, after the flags
        if not flags:  # unchanged: the product's own loader's project, with deploy's default excludes
            theirs = ProductLoader.load(folder).to_dict()
            ours = rebuilt.to_dict()
            assert {k: v for k, v in ours.items() if k != "source"} == {k: v for k, v in theirs.items() if k != "source"}
            assert set(theirs["source"]["exclude"]) <= set(ours["source"]["exclude"])
        if case in CLI_CASES:
            status_doc = status_json(project.name, world["env"], world["cwd"])  # the product's CLI
            assert status_doc["scalingSource"] == "recipe"
            assert (status_doc["minVms"], status_doc["maxVms"], status_doc["warmVms"]) == (2, 5, 1)
            text = rayito(["agent", "status", project.name], world["env"], world["cwd"])
            assert text.returncode == 0 and "(min 2, max 5)" in text.stdout, text.stdout + text.stderr
    finally:
        world["ssm"].delete_parameter(Name=plan.parameter_name)


class _Ssm:
    """The product's ``FleetRecipeStore`` protocol over moto's SSM (AWS's side, not the product's)."""

    def __init__(self, ssm: Any) -> None:
        self.ssm = ssm

    def load(self, parameter: str) -> Any:
        try:
            return self.ssm.get_parameter(Name=parameter, WithDecryption=True)["Parameter"]["Value"]
        except self.ssm.exceptions.ParameterNotFound:
            return None

    def save(self, parameter: str, value: str) -> None:  # pragma: no cover - a read-only test
        raise AssertionError("connect never saves a recipe")

    def delete(self, parameter: str) -> None:  # pragma: no cover
        raise AssertionError("connect never deletes a recipe")


class _NoVms:
    """The directory of a fleet with no VM listed (the emulator has none of this image)."""

    def list_members(self, template: str) -> list[Any]:
        return []


def test_plan_reads_a_recipe_the_product_saved(world, tmp_path, capsys) -> None:
    from rayito_constructs.cli import main

    theirs = product_deploy(world, EXAMPLE, FLAGS)
    saved = tmp_path / "recipe.json"
    saved.write_text(theirs)
    assert main(["plan", "--recipe", str(saved), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scaling_source"] == "recipe" and doc["scaling"]["max_vms"] == 5 and doc["scaling"]["min_vms"] == 0
    assert doc["recipe"]["bytes"] == len(theirs.encode()) and doc["serve"]["max_concurrency"] == 1
    assert doc["image"]["memory_mib"] == 8192
    rebuilt = AgentProject.from_recipe(theirs)
    assert plan_recipe(rebuilt).encoded.value == theirs  # and planning it again gives the same bytes
    saved.write_text('{"version": 1, "name": "mi-agente"}')  # this library's old format
    assert main(["plan", "--recipe", str(saved)]) == 2
    assert "recipe: not a recipe rayito 0.17.1 reads (recipe_unreadable)" in capsys.readouterr().err


def test_a_recipe_too_large_is_planned_as_the_product_decides(tmp_path) -> None:
    import random

    rng = random.Random(7)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9000))
    folder = write_project(tmp_path / "huge", name="huge", tables={"agent": {"instructions": noise}})
    plan = plan_recipe(AgentProject.load(folder))
    assert plan.encoded is None and [w.code for w in plan.warnings] == ["recipe_too_large"]
    assert "the previous one is deleted" in plan.reason
    from rayito._agent._fleet_recipe import encode_recipe

    assert encode_recipe(plan.document) is None  # the product's own answer


def test_a_deploy_time_version_must_still_fit(tmp_path) -> None:
    """Sized with the longest version the writer accepts: a recipe that fits only without it is
    too large at synth, not at deploy."""
    from rayito._agent._fleet_recipe import encode_recipe

    for size in range(2500, 3600, 25):
        folder = write_project(tmp_path / f"s{size}", name="s", tables={"agent": {"instructions": "y" * size}})
        plan = plan_recipe(AgentProject.load(folder), builds_image=True)
        with_version = writer.encode(plan.document, VERSION_STAND_IN)[0] if plan.encoded is not None else None
        assert plan.version_at_deploy and (plan.encoded is None) == (with_version is None)
        assert plan.document["image"] == {"name": "s"}  # the stack ships it without a version
        if plan.encoded is not None:
            assert encode_recipe(plan.document) is not None


def test_the_encoding_is_read_from_the_products_envelope(tmp_path) -> None:
    """``encoding_of`` names what the product stored: its JSON, its ``gzip+base64`` envelope, or
    nothing it reads (this library's old ``rz1:`` values, another envelope)."""
    from rayito._agent._fleet_recipe import decode_recipe

    small = plan_recipe(AgentProject.load(EXAMPLE)).encoded
    big = plan_recipe(AgentProject.load(big_project(tmp_path))).encoded
    assert small is not None and big is not None
    assert (encoding_of(small.value), small.encoding) == ("json", "json")
    assert (encoding_of(big.value), big.encoding) == ("gzip+base64", "gzip+base64")
    decode_recipe(big.value)  # the product reads what was named an envelope
    other = json.dumps({"schema": "rayito.agent-recipe/1", "encoding": "zstd", "data": ""})
    for value in ("rz1:eJzLSM3JyVcozy/KSQEAGgQEXQ==", "[1]", "", other):
        assert encoding_of(value) is None, value


def test_save_recipe_off_and_the_plan_says_why(tmp_path) -> None:
    plan = plan_recipe(AgentProject.load(EXAMPLE, save_recipe=False))
    assert plan.encoded is None and plan.warnings == () and "save_recipe is off" in plan.reason
    assert plan.to_dict() == {"parameter_name": "/rayito/agents/mi-agente/recipe", "saved": False,
                              "reason": plan.reason}


def test_the_old_format_is_gone(tmp_path) -> None:
    """A rayito-agent.toml of this library's old format is refused by the product, in one line."""
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "rayito-agent.toml").write_text('name = "old"\ntarget = "microvm"\n[scaling]\nidle = "10m"\n')
    (folder / "requirements.txt").write_text("")
    with pytest.raises(ProjectError) as info:
        AgentProject.load(folder)
    assert len(str(info.value).splitlines()) == 1
