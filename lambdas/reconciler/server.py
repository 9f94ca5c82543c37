"""The fleet's server: what the product's client does to a VM after RunMicrovm, for the VMs the
reconciler starts (a function of its own: each ask is one asynchronous invocation).

* A **base** slot's VM is served as ``rayito agent deploy`` serves a fleet member: the product's
  ``ProjectService.deploy`` for the project, whose ``Sandbox.create`` opens the VM (its auth
  token, rayd's Health until ready), applies the project's network policy and gateways (reading
  the gateways' secrets), and whose ``serve`` writes the agent host's configuration, starts it with
  the ``secret_env`` values, and waits for its ready marker.
* A **parked** slot's VM is warmed as the product's pool warms a slot: ``Sandbox.create`` with the
  pool's launch arguments, then the pool's own settling cell and warm-up steps. The reconciler then
  suspends it; a client's take opens its gateways and serves it (``AgentFleet``).

The VM already exists (the reconciler ran it with its own client token, :mod:`.product_launch`): the
product's create path runs on a control plane whose ``run_microvm`` answers with that VM
(GetMicrovm) instead of starting one. Nothing of the product is copied or patched: its classes run
with the seams it offers (``sandbox_class=``, ``control_plane=``), and a subclass of its
``ProjectService`` that serves a VM only once (a second ask finds the host started, or ready).

The answer goes to the ledger (``ready#<VM id>``, :class:`.core.Ready`): ``ready`` with the time,
or ``failed`` with the reason (never a secret: the product's messages carry none). The event is
:func:`.serving.serve_request`'s.
"""

from __future__ import annotations

import json
import os
import threading
import time
from types import SimpleNamespace
from typing import Any, Optional

from rayito._agent._deployment_base import labels_for
from rayito._agent._fleet_base import fleet_lifetime, pool_config_for
from rayito._agent._project_base import AGENT_SERVE_TAG
from rayito._agent._project_domain import AgentProject
from rayito._agent._project_service import ProjectService
from rayito._agent._scaling_domain import ScalingOptions
from rayito._aws import LambdaMicrovmsControlPlane, LaunchRequest
from rayito._limits import AGENT_SERVICE_READY_MARKER_PATH
from rayito._models import SandboxInfo
from rayito._pool_base import launch_kwargs
from rayito.sandbox_sync import Sandbox
from rayito.sandbox_sync.pool import SandboxPool

from .aws import STORE_CONFIG, session
from .core import Ready
from .fleet_source import RecipeSource, TokenSource, Unreadable
from .ledger import DynamoDBLedger

#: The longest a reason kept in the ledger (the product's messages are one line; a traceback is not kept).
REASON_CHARACTERS = 300


class ReplayPlane(LambdaMicrovmsControlPlane):
    """The product's control plane, for one VM that already runs: ``run_microvm`` answers with it
    (a GetMicrovm), every other call (the auth token, a terminate) is the real one."""

    def __init__(self, client: Any, *, microvm_id: str, image_arn: str, session: Any = None) -> None:
        super().__init__(client, session=session)
        self._microvm_id = microvm_id
        self._image_arn = image_arn

    def resolve_template_arn(self, template: str) -> str:
        return self._image_arn

    def run_microvm(self, request: LaunchRequest) -> SandboxInfo:
        return self.get_microvm(self._microvm_id)


class OnceServing(ProjectService):
    """``ProjectService`` serving a VM once: a VM whose agent host is ready is served already, and
    one whose host was started (by an earlier ask that ran out of time) is waited for, not started
    twice (a second host cannot bind the port)."""

    def serve(self, sandbox: Any) -> Any:
        if sandbox.files.exists(AGENT_SERVICE_READY_MARKER_PATH):
            return None
        if any(process.tag == AGENT_SERVE_TAG for process in sandbox.commands.list()):
            self._wait_ready(sandbox)
            return None
        return super().serve(sandbox)


def _replaying(plane: ReplayPlane, opened: list[Any]) -> type:
    """A ``sandbox_class`` whose ``create`` is the product's, on ``plane``; what it opens goes to
    ``opened`` (closed after: an open sandbox keeps a thread that renews its auth token)."""

    def create(*args: Any, **kwargs: Any) -> Any:
        sandbox = Sandbox.create(*args, control_plane=plane, **kwargs)
        opened.append(sandbox)
        return sandbox

    return type("Replaying", (), {"create": staticmethod(create)})


def serve_member(project: AgentProject, scaling: ScalingOptions, token: str, plane: ReplayPlane,
                 image_version: Optional[str]) -> None:
    """What ``AgentFleet`` does to create a member, on the VM ``plane`` names."""
    opened: list[Any] = []
    service = OnceServing(project, sandbox_class=_replaying(plane, opened), image_version=image_version)
    try:
        service.deploy(access_token=token, keep_on_failure=True, lifetime=fleet_lifetime(project, scaling))
    finally:
        for sandbox in opened:
            sandbox.close()


def warm_slot(project: AgentProject, scaling: ScalingOptions, token: str, plane: ReplayPlane,
              image_version: Optional[str]) -> None:
    """What the product's pool does to warm a slot, before it suspends it, on the VM ``plane``
    names: its launch arguments, its settling cell and its warm-up steps (the pool's own methods,
    on a stand-in for the pool that has what they read)."""
    labels = labels_for(project.name, project.serve.port, raw=False)  # as AgentFleet's pool labels its slots
    config = pool_config_for(project, scaling, token, labels, template_version=image_version)
    sandbox = Sandbox.create(**launch_kwargs(config), access_token=token, keep_on_failure=True, control_plane=plane)
    try:
        pool = SimpleNamespace(_stopping=threading.Event(), _config=config)
        SandboxPool._settle(pool, sandbox)  # type: ignore[arg-type]
        SandboxPool._run_warmup(pool, sandbox)  # type: ignore[arg-type]
    finally:
        sandbox.close()


class Server:
    """One execution environment of the server function: its clients and the fleet's recipe."""

    def __init__(self, env: Optional[dict[str, str]] = None, aws: Any = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.aws = aws or session()
        self.fleet = self.env["FLEET_NAME"]
        self.region = self.aws.region_name or self.env.get("AWS_REGION") or "us-east-1"
        self.recipe = RecipeSource(self.aws.client("ssm", config=STORE_CONFIG), self.fleet)
        self.token = TokenSource(self.aws.client("secretsmanager", config=STORE_CONFIG), self.env["ACCESS_TOKEN_SECRET"],
                                 time.monotonic)
        self.ledger = DynamoDBLedger(self.aws.client("dynamodb", config=STORE_CONFIG), self.env["LEDGER_TABLE"])
        self._microvms: Any = None

    def handle(self, ask: dict[str, Any]) -> dict[str, Any]:
        vm_id = str(ask["microvm_id"])
        started = time.time()
        try:
            self.serve(vm_id, "warm" if ask.get("role") == "warm" else "member")
            outcome, reason = "ready", None
        except Exception as exc:  # every failure is the answer, in the ledger (never a retry storm)
            outcome, reason = "failed", f"{type(exc).__name__}: {exc}"[:REASON_CHARACTERS]
        role = "warm" if ask.get("role") == "warm" else "member"
        fact = Ready(vm_id, outcome, time.time(), int(ask.get("attempt") or 0), reason, role)
        self.ledger.put_fact(self.fleet, fact)
        told = {"event": "vm_" + ("served" if outcome == "ready" else "not_served"), "fleet": self.fleet,
                "microvm_id": vm_id, "slot": ask.get("slot"), "role": ask.get("role"), "attempt": fact.attempt,
                "seconds": round(fact.at - started, 3), "reason": reason}
        print(json.dumps({k: v for k, v in told.items() if v is not None}, sort_keys=True), flush=True)
        return {"microvm_id": vm_id, "outcome": outcome}

    def serve(self, vm_id: str, role: str) -> None:
        read = self.recipe.current()
        if isinstance(read, str):
            raise RuntimeError(f"no recipe to serve the VM with: {read}")
        token = self.token.get()
        if isinstance(token, Unreadable):
            raise RuntimeError(f"the fleet's access token cannot be read: {token.reason}")
        if self._microvms is None:  # once per execution environment, on its first ask
            self._microvms = self.aws.client("lambda-microvms", region_name=self.region)
        plane = ReplayPlane(self._microvms, microvm_id=vm_id, image_arn=self.env["IMAGE_ARN"], session=self.aws)
        version = read.image_version or self.env.get("IMAGE_VERSION") or None
        if role == "warm":
            warm_slot(read.project, read.scaling, token, plane, version)
        else:
            serve_member(read.project, read.scaling, token, plane, version)


_SERVER: Optional[Server] = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global _SERVER
    if _SERVER is None:
        _SERVER = Server()
    return _SERVER.handle(event)


__all__ = ["OnceServing", "ReplayPlane", "Server", "handler", "serve_member", "warm_slot"]
