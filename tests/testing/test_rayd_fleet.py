"""A fleet of the product's agent served by the stand-in: the product's ``ProjectService`` serves a
``custom`` project (the real agent host from the wheel, the scaffolded app behind it) and its
``AgentFleet`` reads, invokes, scales in and stops it, unmodified, in-process.

The fleet's VMs are made as the product's own ``AgentFleet._create_member`` makes them
(``ProjectService.deploy`` with the fleet's token and ``fleet_lifetime``), the recipe saved as
``deploy`` saves it (``recipe_of`` + ``store_recipe``, SecureString in moto's SSM). The client
reaches the VMs through its seams (``seams.fleet()``: ``SandboxDirectory(sandbox_class=...)``,
``transport_factory=``, ``pool_factory=``), the plaintext front of each VM's endpoint.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import pytest

from .helpers import host_request

SCALING = """
[serve]
max_concurrency = 1
queue_max = 1
queue_timeout_seconds = 1

[scaling]
min_vms = 1
max_vms = 2
scale_in_after_seconds = 60
"""


@pytest.fixture
def fleet_project(tmp_path, hosted) -> Any:
    """The project, and its image in the emulator: the product's base with its folder as the app."""
    from rayito import AgentProject

    from .helpers import scaffold_agent

    folder = scaffold_agent(tmp_path / "eco", extra_toml=SCALING)
    hosted.create_image("eco", rayd=True, app_dir=folder)
    return AgentProject.load(str(folder))


def _deploy(hosted: Any, session: Any, project: Any, token: str, count: int) -> list[Any]:
    """``count`` members as the fleet creates them, and the recipe as ``deploy`` saves it."""
    from rayito._agent._fleet_base import fleet_lifetime
    from rayito._agent._fleet_recipe import recipe_of
    from rayito._agent._fleet_recipe_aws import SsmRecipeStore, store_recipe

    _secret(session)
    service = hosted.vm_host.seams.project_service(project, session=session, image_version="1.0")
    deployments = []
    for _ in range(count):  # one after the other: the first started is the base member (position)
        deployments.append(service.deploy(access_token=token, session=session,
                                          lifetime=fleet_lifetime(project, project.scaling)))
    store = SsmRecipeStore(session=session)
    assert store_recipe(store, recipe_of(project, name=project.name, image_version="1.0", scaling=project.scaling,
                                         renew_gateway_keys=False)) == "saved"
    return deployments


def _secret(session: Any) -> None:
    """The model gateway's secret (``[gateways.model] secret = "provider-key"``), read when the
    client configures the gateway: moto lives for the module."""
    secrets = session.client("secretsmanager")
    try:
        secrets.create_secret(Name="rayito/provider-key", SecretString="not-a-real-key")
    except secrets.exceptions.ResourceExistsException:
        pass


def test_a_served_project_answers_through_its_fleet(hosted, session, fleet_project) -> None:
    from rayito._agent._fleet import AgentFleet
    from rayito._agent._fleet_recipe_aws import SsmRecipeStore
    from rayito._payload import generate_access_token

    token = generate_access_token()
    deployments = _deploy(hosted, session, fleet_project, token, 2)
    base, extra = (d.sandbox_id for d in deployments)
    guest = hosted.vm_host.guest(base)
    # What serving took, in the product's order (Configure for the model gateway, host.json, the
    # markers cleared, the host started in the background, its ready marker polled).
    served = [c.rpc for c in guest.calls() if c.rpc != "Health"]
    assert served[:5] == ["Network.UpdateNetwork", "Configure.Configure", "Configure.ConfigureStatus",
                          "Filesystem.Write", "Process.Start"]
    assert "Filesystem.Stat" in served
    assert ("port", "agent host 8088") in [(kind, what) for kind, what, _ in guest.rewrites]
    host = next(p for p in guest.processes.values() if p.tag == "rayito-agent-serve")
    assert host.running and "agent host" in host.description

    store = SsmRecipeStore(session=session)
    fleet = AgentFleet.connect("eco", access_token=token, recipe_store=store, session=session,
                               **hosted.vm_host.seams.fleet(session=session))
    status = fleet.status()
    assert (status.min_vms, status.max_vms, status.scaling_source) == (1, 2, "recipe")
    assert [(m.sandbox_id, m.extra) for m in status.members] == [(base, False), (extra, True)]
    assert {m.state for m in status.members} == {"healthy"}
    assert fleet.invoke("Hello").text == "Recibido: Hello"

    # Three sessions at once, one slot per VM (max_concurrency=1), no room to grow (max_vms=2):
    # two run, the third gives up after queue_timeout_seconds in the client's queue.
    from rayito.exceptions import CapacityException

    def invoke(prompt: str) -> Any:
        try:
            return fleet.invoke(prompt).text
        except CapacityException as error:
            return error

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(invoke, ["sleep 3", "sleep 3", "sleep 3"]))
    assert sorted(a for a in answers if isinstance(a, str)) == ["Recibido: sleep 3"] * 2
    (refused,) = [a for a in answers if not isinstance(a, str)]
    assert refused.code == "agent_capacity"

    # The extra VM served one of them: held for the invocation, then given scale_in_after_seconds
    # (SetTimeout EXACT); rayd ends it at that deadline (test_rayd.py waits one out).
    calls = hosted.vm_host.guest(extra).calls("Lifecycle.SetTimeout")
    assert calls[-1].detail == "timeout_ms=60000 mode=TIMEOUT_MODE_EXACT", [c.detail for c in calls]
    assert any(c.detail.startswith("timeout_ms=660000") for c in calls)  # max(60, limits.timeout + 60) s
    deadline = hosted.vm_host.guest(extra).lifecycle.deadline_ms / 1000
    assert deadline - calls[-1].time == pytest.approx(60, abs=1)
    assert not hosted.vm_host.guest(base).calls("Lifecycle.SetTimeout")  # a base member keeps its life

    assert fleet.stop() == 2
    assert {vm["state"] for vm in hosted.microvms()} <= {"TERMINATING", "TERMINATED"}
    assert store.load("/rayito/agents/eco/recipe") is None


def test_a_sandbox_served_by_hand_queues_and_answers_429_with_retry_after(hosted, session, tmp_path) -> None:
    """``Sandbox.create`` with the project's arguments, then ``ProjectService(project).serve(sandbox)``
    (what ``deploy`` does, in two steps), then its ``AgentDeployment``. HTTP/1.1 to ``<endpoint>``
    with ``x-aws-proxy-port: 8088`` reaches the VM's agent host, as the AWS proxy routes it; above
    ``max_concurrency`` (1) and ``queue_max`` (1) its queue answers 429 with ``Retry-After`` (one
    waits and gets queue_timeout after 4 s, the next is busy at once). The proxy's token is checked."""
    from rayito import AgentProject
    from rayito._agent._project_base import deploy_create_args, template_name
    from rayito._payload import generate_access_token
    from rayito.sandbox_sync import Sandbox

    from .helpers import scaffold_agent

    folder = scaffold_agent(tmp_path / "eco", extra_toml=SCALING.replace("queue_timeout_seconds = 1", "queue_timeout_seconds = 4"))
    hosted.create_image("eco", rayd=True, app_dir=folder)
    project = AgentProject.load(str(folder))
    _secret(session)
    seams = hosted.vm_host.seams
    sandbox = Sandbox.create(template_name(project), **deploy_create_args(project, access_token=generate_access_token()),
                             transport=seams.transport, session=session)
    deployment = seams.project_service(project, session=session).serve(sandbox)
    assert deployment.status().state == "healthy" and deployment.invoke("Hello").text == "Recibido: Hello"
    assert sandbox.metadata == {"rayito.agent.deployment": "eco", "rayito.agent.port": "8088"}
    vm_id, port = deployment.sandbox_id, seams.port
    endpoint = hosted.vm_host.guest(vm_id).endpoint

    def jwe(*ports: int) -> str:
        minted = hosted.client().create_microvm_auth_token(microvmIdentifier=vm_id, expirationInMinutes=5,
                                                           allowedPorts=[{"port": p} for p in ports])
        return minted["authToken"]["X-aws-proxy-auth"]

    token = jwe(8088)
    status, _, body = host_request(endpoint, port, token, "GET", "/ping")
    assert status == 200 and json.loads(body)["status"] == "Healthy"
    assert host_request(endpoint, port, jwe(8080), "GET", "/ping")[0] == 403  # a token for rayd's port only
    assert host_request(endpoint, port, "forged", "GET", "/ping")[0] == 403
    assert host_request(endpoint, port, jwe(9100), "GET", "/ping", vm_port=9100)[0] == 502  # the app: loopback only

    def invocation() -> tuple[int, dict[str, str], bytes]:
        return host_request(endpoint, port, token, "POST", "/invocations", {"prompt": "sleep 6"})

    def busy() -> bool:
        return json.loads(host_request(endpoint, port, token, "GET", "/ping")[2])["status"] == "HealthyBusy"

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(invocation)
        _until(busy)
        others = [pool.submit(invocation)]
        time.sleep(0.5)
        others.append(pool.submit(invocation))  # the queue (queue_max=1) is full: busy at once
        refused = [other.result() for other in others]
    assert first.result()[0] == 200 and json.loads(first.result()[2])["text"] == "Recibido: sleep 6"
    assert sorted((r[0], r[1].get("retry-after"), json.loads(r[2])["error"]) for r in refused) == [
        (429, "1", "busy"), (429, "1", "queue_timeout")]


def _until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true after {timeout} s"
        time.sleep(0.1)
