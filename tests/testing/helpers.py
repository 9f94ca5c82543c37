"""Calls that also check every answer against the model's output shape."""

from __future__ import annotations

from typing import Any

from ..emulator_helpers import assert_fits_model

BASE = "arn:aws:lambda:us-east-1:aws:microvm-image:al2023-1"
ROLE = "arn:aws:iam::123456789012:role/agent"


def run(client: Any, image: str, **kw: Any) -> dict[str, Any]:
    response = client.run_microvm(imageIdentifier=image, **kw)
    assert_fits_model("RunMicrovm", response)
    return response


def get(client: Any, vm_id: str) -> dict[str, Any]:
    response = client.get_microvm(microvmIdentifier=vm_id)
    assert_fits_model("GetMicrovm", response)
    return response


def state(client: Any, vm_id: str) -> str:
    return get(client, vm_id)["state"]


def error(call: Any) -> dict[str, Any]:
    """The error response of a call that must fail."""
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        return exc.response
    raise AssertionError("the call succeeded")


# ---------------------------------------------------------------------------------------------
# The stand-in rayd


#: How the scaffolded app is changed: the product's ``custom`` scaffold (``rayito agent init``)
#: serves ``raw`` on a hard-coded 127.0.0.1:9100; here it speaks ``json`` (so ``invoke()`` works),
#: listens where the host tells it (``port_env``: several VMs share this machine) and sleeps on
#: ``sleep N`` (to hold a slot).
APP_PORT_LINE = "PORT = 9100"
APP_PROMPT_LINE = '        prompt = json.loads(self.rfile.read(length) or b"{}").get("prompt", "")'


def scaffold_agent(folder: Any, *, name: str = "eco", extra_toml: str = "") -> Any:
    """``rayito agent init --runtime custom`` (the product's own ``scaffold_files`` and
    ``write_scaffold``) into ``folder``, made to answer without a model key (see above)."""
    from rayito.cli._agent_scaffold import PROVIDER_PRESETS, ScaffoldRequest, scaffold_files, write_scaffold

    files = scaffold_files(ScaffoldRequest(name=name, runtime="custom", language="python", provider="bedrock",
                                           model_id=PROVIDER_PRESETS["bedrock"][1], region="us-east-1"))
    toml, app = files["rayito-agent.toml"], files["serve.py"]
    assert 'protocol = "raw"' in toml and APP_PORT_LINE in app and APP_PROMPT_LINE in app, "the scaffold changed"
    files["rayito-agent.toml"] = toml.replace('protocol = "raw"', 'protocol = "json"\nport_env = "PORT"') + extra_toml
    files["serve.py"] = app.replace(APP_PORT_LINE, "import os\nimport time\n\nPORT = int(os.environ.get('PORT', '9100'))").replace(
        APP_PROMPT_LINE, APP_PROMPT_LINE + '\n        if prompt.startswith("sleep "):\n'
                                           '            time.sleep(float(prompt.split()[1]))')
    folder.mkdir(parents=True, exist_ok=True)
    write_scaffold(folder, files, force=False)
    return folder


def raw_health(endpoint: str, port: int, *, timeout: float = 5.0) -> Any:
    """rayd's ``Health`` on ``<endpoint>:<port>`` (plaintext, local credentials), or the gRPC error."""
    import grpc
    from rayito.v1 import health_pb2, health_pb2_grpc

    with grpc.secure_channel(f"{endpoint}:{port}", grpc.local_channel_credentials()) as channel:
        try:
            return health_pb2_grpc.HealthServiceStub(channel).Health(health_pb2.HealthRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return exc


def host_request(endpoint: str, port: int, jwe: str, method: str, path: str, body: Any = None,
                 *, vm_port: int = 8088, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """HTTP/1.1 to ``<endpoint>:<port>`` as the product sends it to the AWS proxy: the JWE and the
    VM port in ``x-aws-proxy-*`` headers, one request per connection."""
    import http.client
    import json as _json

    connection = http.client.HTTPConnection(endpoint, port, timeout=timeout)
    try:
        data = None if body is None else _json.dumps(body).encode()
        connection.request(method, path, body=data, headers={
            "x-aws-proxy-auth": jwe, "x-aws-proxy-port": str(vm_port), "Content-Type": "application/json",
            "Connection": "close"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def wait_until(predicate: Any, timeout: float = 15.0, every: float = 0.1) -> Any:
    """``predicate()``'s first true value, polled every ``every`` s; fails after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not true after {timeout} s: {predicate}")
