"""Proof from the product's own calls: every AWS call the product (``rayito`` 0.17.1) makes on the
paths of a role is allowed by that role's managed policy, as this library synthesizes it for a
fleet, and nothing else the policy holds goes unused.

``tests/product_paths.py`` runs the paths (the CLI and the client's classes, unmodified) against
moto and the MicroVMs emulator with the stand-in rayd, recording every call; each call becomes the
IAM requests it is authorized as (``rayito_constructs.testing.aws_calls``), and each request is
decided against the three synthesized policy documents by ``rayito_constructs.model.policy_eval``. The
path x policy table of docs/iam.md is written from here (``RAYITO_WRITE_DOCS=1``) and a stale one
fails. What could not be recorded here is said in :data:`TRACED` and in the doc.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from rayito_constructs import AgentProject, FleetStack
from rayito_constructs.model.policy_eval import evaluate
from rayito_constructs.testing import MicrovmsEmulator
from rayito_constructs.testing.aws_calls import AwsCallRecorder, IamRequest

from .cdk_helpers import new_app, stack_props
from .contract_support import provision
from .moto_server import moto_server, put_secret
from .product_paths import (
    BUCKET,
    EXTRA_TOML,
    FLEET,
    PRODUCT_BUILD_ROLE,
    REGION,
    ROLES,
    PathRun,
    Resolver,
    Runner,
    World,
    aws_env,
    boto_session,
    dump,
    rayd_zip,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "iam.md"
BEGIN, END = "<!-- product-paths:begin -->", "<!-- product-paths:end -->"
#: Which role runs which path: a caller does both (the product's union), so every path is also
#: decided under CallerPolicy.
UNDER = {"launcher": ("SandboxLauncherPolicy", "CallerPolicy"), "publisher": ("ImagePublisherPolicy", "CallerPolicy"),
         "caller": ("CallerPolicy",)}


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> Iterator[tuple[World, list[PathRun]]]:
    from rayito._images_publish_domain import IMAGE_HOOKS
    from rayito._payload import generate_access_token

    from .testing.helpers import scaffold_agent

    workdir = tmp_path_factory.mktemp("product-iam")
    folder = scaffold_agent(workdir / FLEET, name=FLEET, extra_toml=EXTRA_TOML)
    app = new_app(base_artifact=None)  # the product publishes the image here (rayito image publish)
    from aws_cdk.assertions import Template

    stack = FleetStack(app, "Eco", project=AgentProject.load(str(folder)), metadata_index=True, **stack_props())
    template = Template.from_stack(stack).to_json()
    saved = dict(os.environ)
    # fresh_launches=0: the product's publishes make fresh versions, whose first launches the
    # emulator keeps PENDING 26-65 s as measured; the warm slot (a version's third launch) then
    # missed wait_warm(60) about one run in four. This test is about IAM, not launch times.
    emulator = MicrovmsEmulator(host_vms=True, tls_front=True, pending_seconds=0.5, consistency_seconds=0,
                                app_exit_report_seconds=1.0, terminating_seconds=1.0, image_build_seconds=0,
                                fresh_launches=0)
    try:
        emulator.start()
    except PermissionError as exc:
        pytest.skip(f"the CLI's paths need the TLS front (port 443 on a loopback address): {exc}")
    try:
        with moto_server() as moto:
            env = aws_env(moto)
            env.update(emulator.vm_host.seams.environment(emulator.endpoint_url))
            env["HOME"] = str(workdir)  # the CLI's pool files and caches stay in the test's folder
            os.environ.update({k: v for k, v in env.items() if k.startswith(("AWS_", "GRPC_", "SSL_"))})
            session = boto_session()
            table = provision(template, session.client("dynamodb"), session.client("sqs"), ("AWS::DynamoDB::Table",))
            index = next(k for k in table.names if k.startswith("FleetMetadataIndex"))
            values = {}
            for logical in table.names:
                values[(logical, "Ref")] = table.names[logical]
                values[(logical, "Arn")] = table.arns[logical]
            token = generate_access_token()
            world = World(moto, emulator, folder, session, token, template, Resolver(template, values),
                          table.names[index], env)
            _setup(world, IMAGE_HOOKS)
            with AwsCallRecorder() as recorder:
                recorder.register(session)  # made before the recorder: its clients are made later
                runner = Runner(recorder, {**env, "RAYITO_ACCESS_TOKEN": token}, workdir)
                _run_paths(world, runner)
            dump(runner.paths, Path(os.environ.get("RAYITO_PATHS_DUMP", workdir / "calls.json")))
            yield world, runner.paths
    finally:
        emulator.stop()
        os.environ.clear()
        os.environ.update(saved)


def _setup(world: World, hooks: Any) -> None:
    """What an admin did before (``rayito setup``): the artifact bucket, the base image
    ``rayito-base-caps`` built with ``rayito setup``'s build role, the secrets the project names
    and the fleet's access token in the secret the stack makes."""
    s3 = world.session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="rayito/images/rayd-base.zip", Body=rayd_zip())
    (workdir := world.folder.parent).joinpath("rayd.zip").write_bytes(rayd_zip())
    secrets = world.session.client("secretsmanager")
    for name, value in (("rayito/provider-key", "not-a-real-key"), ("team/openai", "sk-not-real"),
                        (f"rayito/agents/{FLEET}/access-token", world.token), ("rayito/other-key", "x"),
                        ("rayito/agents/otra/access-token", "y")):
        put_secret(secrets, name, value)
    client = world.emulator.client()
    client.create_microvm_image(
        name="rayito-base-caps", baseImageArn=f"arn:aws:lambda:{REGION}:aws:microvm-image:al2023-1",
        baseImageVersion="1", buildRoleArn=PRODUCT_BUILD_ROLE, hooks=hooks,
        codeArtifact={"uri": f"s3://{BUCKET}/rayito/images/rayd-base.zip"},
        resources=[{"minimumMemoryInMiB": 2048}], additionalOsCapabilities=["ALL"])
    world.emulator.builds_run(FLEET, app_dir=world.folder)  # what the agent image's artifact holds
    assert workdir.is_dir()


def _build_role(world: World) -> str:
    """The role ``rayito image publish --build-role-arn`` passes: the stack's build role when the
    fleet builds its image, else ``rayito setup``'s."""
    document = world.documents["ImagePublisherPolicy"]
    roles = [r for s in document["Statement"] if s.get("Sid") == "PassBuildRole" for r in _list(s["Resource"])]
    return next((r for r in roles if r != PRODUCT_BUILD_ROLE), PRODUCT_BUILD_ROLE)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _run_paths(world: World, run: Runner) -> None:
    from rayito import DynamoDbIndex
    from rayito._agent._fleet import AgentFleet
    from rayito._agent._fleet_recipe_aws import SsmRecipeStore
    from rayito._agent._scaling_domain import ScalingOptions
    from rayito._pool_backends import JsonFilePoolBackend
    from rayito import AgentProject as ProductProject

    folder, zip_path = str(world.folder), str(world.folder.parent / "rayd.zip")
    role = _build_role(world)
    publish = ("image", "publish", "--artifact", zip_path, "--image-name", FLEET, "--bucket", BUCKET,
               "--build-role-arn", role, "--base-image-version", "1")
    # ---------------------------------------------------------------- publisher
    run.cli("image publish (new image)", "publisher", *publish)
    run.cli("image publish --base-image-version latest", "publisher",
            *[a if a != "1" else "latest" for a in publish])
    run.cli("image publish --force (update)", "publisher", *publish, "--force")
    run.cli("agent build", "publisher", "agent", "build", "--bucket", BUCKET, "--file", folder, "--force")
    run.cli("image prune", "publisher", "image", "prune", "--image-name", FLEET, "--keep", "1", "--wait-timeout", "30")
    # ---------------------------------------------------------------- caller
    run.cli("agent deploy --renew-gateway-keys", "caller", "agent", "deploy", folder, "--bucket", BUCKET, "--yes",
            "--renew-gateway-keys", timeout=600)
    # ---------------------------------------------------------------- launcher, the CLI
    run.cli("agent status", "launcher", "agent", "status", FLEET)
    run.cli("agent invoke", "launcher", "agent", "invoke", FLEET, "Hola")
    run.cli("agent invoke --stream", "launcher", "agent", "invoke", FLEET, "Hola", "--stream")
    # ---------------------------------------------------------------- launcher, the client's classes
    session, seams = world.session, world.emulator.vm_host.seams
    store = SsmRecipeStore(session=session)
    fleet = run.inprocess("AgentFleet.connect + status", "launcher", "AgentFleet.connect(name).status()",
                          lambda: _connected(AgentFleet, world, store))
    run.inprocess("invoke", "launcher", "fleet.invoke(prompt)", lambda: fleet.invoke("Hola").text)
    run.inprocess("read the fleet's access token", "launcher",
                  "aws secretsmanager get-secret-value --secret-id rayito/agents/eco/access-token",
                  lambda: session.client("secretsmanager").get_secret_value(SecretId=f"rayito/agents/{FLEET}/access-token"))
    project = ProductProject.load(folder)
    service = seams.project_service(project, session=session)
    warm = AgentFleet(project, access_token=world.token, session=session, recipe_store=store, service=service,
                      scaling=ScalingOptions(min_vms=0, max_vms=2, warm_vms=1),
                      pool_backend=JsonFilePoolBackend(world.folder.parent / "pool.json"), **seams.fleet(session=session))

    def take_warm_slot() -> Any:
        warm.start()
        try:
            assert warm.wait_warm(60, 0.5)
        except AssertionError:
            warm.stop()  # a pool left open retries its warm-up against the stopped emulator
            raise
        return warm.invoke("Hola").text

    run.inprocess("take a warm slot", "launcher", "AgentFleet(...).start(), then invoke() takes the parked slot", take_warm_slot)
    run.inprocess("stop (warm fleet)", "launcher", "fleet.stop()", warm.stop)
    index = DynamoDbIndex(world.table, session=session)
    dedicated = ScalingOptions(min_vms=0, max_vms=2, sessions="dedicated")
    first = AgentFleet(project, access_token=world.token, session=session, recipe_store=store, session_index=index,
                       service=seams.project_service(project, session=session), scaling=dedicated,
                       **seams.fleet(session=session))
    run.inprocess("a session with the index (placed)", "launcher",
                  "AgentFleet(..., session_index=DynamoDbIndex(table), sessions='dedicated').invoke(session_id=...)",
                  lambda: first.invoke("Hola", session_id="chat-1").text)
    other = AgentFleet(project, access_token=world.token, session=session, recipe_store=store, session_index=index,
                       service=seams.project_service(project, session=session), scaling=dedicated,
                       **seams.fleet(session=session))
    run.inprocess("a session with the index (found by another process)", "launcher",
                  "another AgentFleet with the same index: invoke(session_id=...) finds the VM",
                  lambda: other.invoke("Hola", session_id="chat-1").text)
    world.found_by_index = other  # type: ignore[attr-defined]
    run.inprocess("stop (dedicated fleet)", "launcher", "fleet.stop()", first.stop)
    other.stop()
    run.cli("agent stop", "launcher", "agent", "stop", FLEET)


def _connected(fleet_class: Any, world: World, store: Any) -> Any:
    fleet = fleet_class.connect(FLEET, access_token=world.token, recipe_store=store, session=world.session,
                                **world.emulator.vm_host.seams.fleet(session=world.session))
    fleet.status()
    return fleet


# ====================================================================== the proof


def _decide(world: World, paths: list[PathRun]) -> list[tuple[PathRun, IamRequest, dict[str, Any]]]:
    images = {}
    for path in paths:
        images.update({k: v for r in path.records for k, v in (r.get("facts") or {}).items() if k.startswith("microvm-")})
    documents = world.documents
    out = []
    for path in paths:
        for request in path.requests(images):
            if request.exempt:
                continue
            decisions = {kind: evaluate([documents[kind]], request.action, request.resource, request.context)
                         for kind in ROLES.values()}
            out.append((path, request, decisions))
    return out


def test_every_path_ran_and_called_aws(proof) -> None:
    _, paths = proof
    assert len(paths) >= 15
    for path in paths:
        assert path.records, f"{path.name}: no AWS call recorded"


def test_every_recorded_call_is_allowed_by_its_roles_policy(proof) -> None:
    world, paths = proof
    denied = [f"{path.name} ({kind}): {request.action} on {request.resource} {dict(request.context) or ''}"
              for path, request, decisions in _decide(world, paths)
              for kind in UNDER[path.role] if not decisions[kind].allowed]
    assert denied == []


def test_nothing_a_role_does_not_need(proof) -> None:
    """Every statement of each policy allows at least one recorded request of its role's paths."""
    world, paths = proof
    used: dict[str, set[str]] = {kind: set() for kind in ROLES.values()}
    for path, _, decisions in _decide(world, paths):
        for kind in UNDER[path.role]:
            used[kind].update(decisions[kind].allow_sids)
    unused = {kind: sorted({s["Sid"] for s in document["Statement"] if s["Effect"] == "Allow"} - used[kind])
              for kind, document in world.documents.items()}
    assert unused == {kind: [] for kind in ROLES.values()}


def test_the_launcher_is_denied_what_is_not_its_own(proof) -> None:
    """The launcher may not write the recipe (the deploy's PutParameter), publish an image (the
    publisher's Create/Update), nor read another fleet's secrets (the product's own reads of them)."""
    world, paths = proof
    launcher = world.documents["SandboxLauncherPolicy"]
    decided = _decide(world, paths)
    writes = [(r.action, r.resource) for p, r, _ in decided
              if r.action in ("ssm:PutParameter", "lambda:CreateMicrovmImage", "lambda:UpdateMicrovmImage",
                              "lambda:DeleteMicrovmImageVersion", "secretsmanager:PutSecretValue", "s3:PutObject")]
    assert {a for a, _ in writes} >= {"ssm:PutParameter", "lambda:CreateMicrovmImage", "lambda:UpdateMicrovmImage"}
    assert [w for w in writes if evaluate([launcher], *w).allowed] == []
    others = _other_fleet_reads(world)
    assert {r.resource.split(":secret:")[1][:-7] for r in others} == {"rayito/agents/otra/access-token", "rayito/other-key"}
    assert [r for r in others if evaluate([launcher], r.action, r.resource).allowed] == []
    assert all(evaluate([world.documents["CallerPolicy"]], r.action, r.resource).allowed is False for r in others)


def _other_fleet_reads(world: World) -> list[IamRequest]:
    """The product's own secret reads (``SecretCache`` of a gateway, ``secret_reader_for`` of a
    ``secret_env``) of another fleet's secrets, recorded."""
    from rayito._agent._secret_env_reader import secret_reader_for

    from .product_paths import PathRun

    with AwsCallRecorder() as recorder:
        read = secret_reader_for(REGION)
        read("rayito/other-key", None)  # another project's gateway secret
        read("rayito/agents/otra/access-token", None)  # another fleet's token
    return PathRun("other fleet", "launcher", "", recorder.records).requests({})


def test_the_product_index_writes_and_reads_the_stacks_table(proof) -> None:
    """The product's DynamoDbIndex put one row per VM it started for a dedicated session, in its
    schema, on the table made from the synthesized template, and another fleet found the VM by it."""
    world, paths = proof
    rows = world.session.client("dynamodb").scan(TableName=world.table)["Items"]
    assert rows, "the product wrote no row"
    assert set(rows[0]) == {"pk", "image_arn", "image_version", "started_at_ms", "metadata", "sdk", "expires_at"}
    assert rows[0]["metadata"]["M"]["rayito.agent.session"]["S"]
    (placed,) = [p for p in paths if p.name == "a session with the index (placed)"]
    (found,) = [p for p in paths if p.name.startswith("a session with the index (found")]
    put = [r for r in placed.records if r["op"] == "PutItem"]
    assert put and put[0]["params"]["ConditionExpression"] == "attribute_not_exists(pk)"
    assert [r["op"] for r in found.records if r["service"] == "dynamodb"] == ["BatchGetItem"]
    assert not [r for r in found.records if r["op"] == "RunMicrovm"], "the second fleet started a VM instead of finding it"


def test_the_product_build_role_name_is_the_products(proof) -> None:
    """``permissions.PRODUCT_BUILD_ROLE_NAME`` is what the product's setup template names its role."""
    import re

    import rayito

    from rayito_constructs.permissions import PRODUCT_BUILD_ROLE_NAME

    text = (Path(rayito.__file__).parent / "_stacks" / "_templates" / "iam.yaml").read_text()
    (name,) = re.findall(r"BuildRole:\n(?:.*\n){0,3}?\s+RoleName: !Sub (\S+)", text)
    assert name.replace("${AWS::Region}", "{region}") == PRODUCT_BUILD_ROLE_NAME


# ====================================================================== the doc


def render(world: World, paths: list[PathRun]) -> str:
    """The doc's tables: what varies from run to run (how many polls, a VM's id) is left out."""
    decided = _decide(world, paths)
    kinds = list(ROLES.values())
    lines = [BEGIN, "", "| Path (role) | How it ran | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for path in paths:
        mine = [(r, d) for p, r, d in decided if p is path]
        cells = []
        for kind in kinds:
            # Which of the calls are denied varies with timing (a resume, a poll): the cell says only
            # whether the whole path is allowed; the second table names each request.
            cell = "allowed" if all(d[kind].allowed for _, d in mine) else "denied"
            cells.append(f"**{cell}**" if kind in UNDER[path.role] else cell)
        lines.append(f"| {path.name} ({path.role}) | `{path.how}` | " + " | ".join(cells) + " |")
    lines += ["", "Each request the paths made, the roles whose paths made it, and the statement of the role's own",
              "policy that allows it:", "", "| Request (action on resource) | Roles | Allowed by |", "|---|---|---|"]
    rows: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    for path, request, decisions in decided:
        roles, sids = rows.setdefault((request.action, _shown(request.resource)), (set(), set()))
        roles.add(path.role)
        sids.update(decisions[ROLES[path.role]].allow_sids or ("DENIED",))
    for (action, resource), (roles, sids) in sorted(rows.items()):
        lines.append(f"| `{action}` on `{resource}` | {', '.join(sorted(roles))} | {', '.join(sorted(sids))} |")
    lines += ["", END]
    return "\n".join(lines)


def _shown(resource: str) -> str:
    import re

    resource = re.sub(r"microvm-[0-9a-f-]{8,}", "microvm-<id>", resource)
    resource = re.sub(r"(secret:[^:]+)-[A-Za-z0-9]{6}$", r"\1-??????", resource)
    resource = re.sub(r"table/[A-Za-z0-9]+-[0-9a-f]{8}$", "table/<metadata index>", resource)
    resource = re.sub(r"rayito/(templates|images)/[0-9a-z-]{12,}\.zip", r"rayito/\1/<sha>.zip", resource)
    return resource


def test_the_docs_table_is_the_recorded_one(proof) -> None:
    world, paths = proof
    text = DOCS.read_text()
    table = render(world, paths)
    if os.environ.get("RAYITO_WRITE_DOCS") == "1":
        before, rest = text.split(BEGIN, 1)
        _, after = rest.split(END, 1)
        DOCS.write_text(before + table + after)
        return
    assert BEGIN in text and END in text
    current = text[text.index(BEGIN): text.index(END) + len(END)]
    assert current == table, "docs/iam.md's path table is stale: run RAYITO_WRITE_DOCS=1 pytest tests/test_product_iam.py"
