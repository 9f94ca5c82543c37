"""The product's unmodified CLI (``python -m rayito.cli agent status|invoke|stop <name>``) against
a fleet the stand-in serves, over the TLS front: nothing of the client is touched, only its
environment (the endpoints, the test CA for gRPC and for Python's ``ssl``, the fleet's token).

The fleet is deployed in this process as ``rayito agent deploy`` deploys it (``AgentFleet.start``:
the warm slot first, then the member; the recipe saved; the deploying process detaches, its slot
kept in a pool file). Port 443 needs root (CI and this machine run as root); without it the test
says so and is skipped.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from typing import Iterator

import pytest

from rayito_constructs.testing import MicrovmsEmulator

WARM = """
[scaling]
min_vms = 1
max_vms = 2
warm_vms = 1
scale_in_after_seconds = 60
"""


@pytest.fixture
def tls_hosted(product_env, monkeypatch) -> Iterator[MicrovmsEmulator]:
    emulator = MicrovmsEmulator(host_vms=True, tls_front=True, pending_seconds=0.5, consistency_seconds=0,
                                app_exit_report_seconds=1.0, terminating_seconds=1.0)
    try:
        emulator.start()
    except PermissionError as exc:
        pytest.skip(f"the TLS front needs port 443 on a loopback address: {exc}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA_MICROVMS", emulator.endpoint_url)
    try:
        yield emulator
    finally:
        emulator.stop()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rayito.cli", *args], env=env, capture_output=True, text=True,
                          timeout=180)


def test_the_unmodified_cli_reads_invokes_and_stops_the_fleet(tls_hosted, session, product_env, tmp_path) -> None:
    import os

    from rayito import AgentProject
    from rayito._agent._fleet import AgentFleet
    from rayito._agent._fleet_recipe import recipe_of
    from rayito._agent._fleet_recipe_aws import SsmRecipeStore, store_recipe
    from rayito._payload import generate_access_token
    from rayito._pool_backends import JsonFilePoolBackend

    from .helpers import host_request, scaffold_agent

    folder = scaffold_agent(tmp_path / "eco", extra_toml=WARM)
    tls_hosted.create_image("eco", rayd=True, app_dir=folder)
    secrets = session.client("secretsmanager")
    try:
        secrets.create_secret(Name="rayito/provider-key", SecretString="not-a-real-key")
    except secrets.exceptions.ResourceExistsException:
        pass
    project = AgentProject.load(str(folder))
    token = generate_access_token()
    seams = tls_hosted.vm_host.seams
    store = SsmRecipeStore(session=session)
    fleet = AgentFleet(project, access_token=token, session=session, recipe_store=store,
                       service=seams.project_service(project, session=session, image_version="1.0"),
                       pool_backend=JsonFilePoolBackend(tmp_path / "pool.json"), **seams.fleet(session=session))
    fleet.start()
    assert fleet.wait_warm(60, 0.5)
    assert store_recipe(store, recipe_of(project, name="eco", image_version="1.0", scaling=project.scaling,
                                         renew_gateway_keys=False)) == "saved"
    fleet.detach()
    states = {vm["microvmId"]: vm["state"] for vm in tls_hosted.microvms()}
    assert sorted(states.values()) == ["RUNNING", "SUSPENDED"]
    (parked,) = [vm for vm, state in states.items() if state == "SUSPENDED"]
    slot = tls_hosted.vm_host.guest(parked)
    assert [c.rpc for c in slot.calls() if c.rpc != "Health"] == ["Network.UpdateNetwork", "Code.Execute"]

    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "GRPC_", "RAYITO_"))}
    env.update(product_env)
    env.update(seams.environment(tls_hosted.endpoint_url))
    env["RAYITO_ACCESS_TOKEN"] = token
    assert set(env) >= {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "SSL_CERT_FILE", "AWS_ENDPOINT_URL_LAMBDA_MICROVMS"}

    status = _cli(env, "agent", "status", "eco")
    assert status.returncode == 0, status.stderr
    assert "members: 2 (min 1, max 2)" in status.stdout
    assert f"sandbox_id={parked} state=unknown" in status.stdout  # suspended: not woken to ask

    # The member is busy with a long session (HTTP/1.1 through its endpoint, as the proxy routes
    # it): its /ping says HealthyBusy, so the CLI takes the parked slot. It wakes it through its
    # endpoint (auto-resume: no ResumeMicrovm), opens its gateway, serves it and invokes it.
    (member,) = [vm for vm in states if vm != parked]
    jwe = tls_hosted.client().create_microvm_auth_token(microvmIdentifier=member, expirationInMinutes=5,
                                                        allowedPorts=[{"port": 8088}])["authToken"]["X-aws-proxy-auth"]
    endpoint = tls_hosted.vm_host.guest(member).endpoint
    pool = concurrent.futures.ThreadPoolExecutor(1)
    long = pool.submit(host_request, endpoint, seams.port, jwe, "POST", "/invocations", {"prompt": "sleep 120"})
    deadline = time.monotonic() + 30
    while b"HealthyBusy" not in host_request(endpoint, seams.port, jwe, "GET", "/ping")[2]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    invoked = _cli(env, "agent", "invoke", "eco", "Hola")
    assert not long.done()  # the member was busy the whole time
    assert invoked.returncode == 0, invoked.stderr
    assert invoked.stdout.startswith("Recibido: Hola")
    assert f"session_id=rs1.{parked}." in invoked.stderr  # the fleet's handle names the VM
    assert slot.resume_generation == 1
    assert not [r for r in tls_hosted.requests if r.operation == "ResumeMicrovm"]
    assert "Configure.Configure" in [c.rpc for c in slot.calls()]
    assert any(p.tag == "rayito-agent-serve" and p.running for p in slot.processes.values())

    stopped = _cli(env, "agent", "stop", "eco")
    assert stopped.returncode == 0, stopped.stderr
    assert "parados 2 VM(s)" in stopped.stdout
    assert {vm["state"] for vm in tls_hosted.microvms()} <= {"TERMINATING", "TERMINATED"}
    assert store.load("/rayito/agents/eco/recipe") is None
    assert isinstance(long.exception(timeout=30), OSError)  # the long session ended with its VM
    pool.shutdown()
