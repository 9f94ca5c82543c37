"""The product's RunMicrovm requests for this fleet's VMs (rayito 0.17, run here unmodified).

A fleet this stack keeps must be a Rayito fleet: each VM is started as the product's client
starts one for the project, so that ``rayd`` gets, in its ``/run`` payload, the fleet token's
sha256, the labels the client recognises members by (``rayito.agent.deployment``,
``rayito.agent.port``) and the logical lifecycle; and the VM gets the product's idle policy,
maximum duration and logging. The request is not rebuilt here: the product's own launch path
builds it (``ProjectService.deploy`` for a member, the pool's ``launch_kwargs`` for a warm slot,
both ending in ``Sandbox.create``), through the product's ``control_plane=`` seam, which records
the ``LaunchRequest`` where the product would call RunMicrovm and stops there. The reconciler
then sends it with its own deterministic ``clientToken`` (the product draws a random one).

A VM's lifetime, for the reconciler, is its logical one: ``rayd`` ends it at its run payload's
``lifecycle.timeout_s`` (the project's serve timeout), a minute before the maximum duration the
service enforces, and a successor must serve by then. A shorter lifetime (a fleet's first VMs are
spread so their ends do not coincide) is the product's request for that shorter serve timeout:
the product derives the lifecycle block, the maximum duration and the idle policy from it, as it
would for such a project.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Optional, cast

from rayito._agent._deployment_base import labels_for
from rayito._agent._fleet_base import fleet_lifetime, pool_config_for
from rayito._agent._project_domain import AgentProject
from rayito._agent._project_service import ProjectService
from rayito._aws import LaunchRequest
from rayito._pool_base import launch_kwargs
from rayito._agent._scaling_domain import ScalingOptions
from rayito.sandbox_sync import Sandbox

from .core import WARM, Slot, serving_life

#: The shortest serve timeout the product takes (``validate_timeout``): shorter first lifetimes
#: are not asked for.
MIN_TIMEOUT_SECONDS = 60


class _Captured(Exception):
    def __init__(self, request: LaunchRequest) -> None:
        super().__init__("captured")
        self.request = request


@dataclass
class _CapturePlane:
    """The product's control plane seam (``Sandbox.create(control_plane=...)``): it names the
    image and records the request instead of sending it."""

    region: str
    image_arn: str

    def resolve_template_arn(self, template: str) -> str:
        return self.image_arn

    def run_microvm(self, request: LaunchRequest) -> Any:
        raise _Captured(request)


@dataclass
class ProductLaunch:
    """How the product's client launches this fleet's VMs, for one project and scaling."""

    project: AgentProject
    scaling: ScalingOptions
    access_token: str
    image_arn: str
    region: str
    image_version: Optional[str] = None
    """The image version new VMs run (the recipe's; ``None``: the image's latest active one)."""
    execution_role_arn: Optional[str] = None
    """The fleet's execution role, added to the product's request (the agents' egress budget
    table is reached with it; the product's client starts its own VMs without one)."""
    _requests: dict[tuple[str, Optional[str], Optional[int]], LaunchRequest] = dataclasses.field(
        default_factory=dict, repr=False)

    def parameters(self, role: str, client_token: str, *, image_version: Optional[str] = None,
                   lifetime: Optional[int] = None) -> dict[str, Any]:
        """RunMicrovm parameters of a ``member`` (a base slot: the product's serving VM) or a
        ``warm`` slot, with ``client_token``; ``lifetime``: a shorter life (the serve timeout
        the product is asked for: ``lifetime`` less its margin)."""
        request = self._request(role, image_version, self._timeout(lifetime))
        params = dataclasses.replace(request, client_token=client_token).to_api()
        if self.execution_role_arn:
            params["executionRoleArn"] = self.execution_role_arn
        return params

    def for_slot(self, slot: Slot) -> dict[str, Any]:
        """A slot's RunMicrovm parameters without the client token (the shell adds it at the call):
        a ``base`` slot runs a member, a ``warm`` slot a parked slot of the pool, living
        ``slot.lifetime`` when that is shorter than the full lifetime (a fleet's first VMs)."""
        role = "warm" if slot.role == WARM else "member"
        lifetime = slot.lifetime if slot.lifetime and slot.lifetime < self.logical_lifetime(role) else None
        params = self.parameters(role, "", image_version=self.image_version, lifetime=lifetime)
        params.pop("clientToken", None)
        return params

    def __call__(self, slot: Slot) -> dict[str, Any]:
        return self.for_slot(slot)

    def logical_lifetime(self, role: str = "member", *, lifetime: Optional[int] = None) -> int:
        """How long after its start ``rayd`` ends the VM (the run payload's ``lifecycle.timeout_s``;
        the maximum duration when the product sends no lifecycle): :func:`.core.serving_life`."""
        request = self._request(role, None, self._timeout(lifetime))
        return serving_life(request.to_api(), int(request.maximum_duration_seconds))

    def rayd_deadline(self, role: str = "member") -> bool:
        """Whether ``rayd`` ends the VM before its maximum duration: the product sends a lifecycle
        only for a fleet that scales in (``fleet_lifetime``); otherwise the service ends it."""
        request = self._request(role, None, None)
        return self.logical_lifetime(role) < int(request.maximum_duration_seconds)

    def _timeout(self, lifetime: Optional[int]) -> Optional[int]:
        """The serve timeout the product is asked for so that ``rayd`` ends the VM ``lifetime``
        seconds after its start: never under the product's floor, and longer than the idle
        policy's idle time (the product refuses an idle policy that cannot fire)."""
        own = int(self.project.serve.timeout_seconds)
        if lifetime is None or int(lifetime) >= own:
            return None
        idle = self.project.serve.idle
        floor = int(idle.max_idle_seconds) + 1 if idle is not None else 0
        return max(MIN_TIMEOUT_SECONDS, floor, int(lifetime))

    def _request(self, role: str, image_version: Optional[str], timeout: Optional[int]) -> LaunchRequest:
        key = (role, image_version, timeout)
        if key not in self._requests:  # one capture per shape: the product's path is pure but not free
            self._requests[key] = _capture(self, role, image_version, timeout)
        return self._requests[key]


def _capture(launch: ProductLaunch, role: str, image_version: Optional[str], timeout: Optional[int]) -> LaunchRequest:
    project = launch.project
    if timeout is not None and timeout != int(project.serve.timeout_seconds):
        project = dataclasses.replace(project, serve=dataclasses.replace(project.serve, timeout_seconds=timeout))
    # The product types the seam as its ControlPlane class; it calls only these two methods of it.
    plane = cast(Any, _CapturePlane(launch.region, launch.image_arn))
    create = functools.partial(Sandbox.create, control_plane=plane)
    try:
        if role == "warm":
            labels = labels_for(project.name, project.serve.port, raw=False)  # as AgentFleet's pool labels them
            config = pool_config_for(project, launch.scaling, launch.access_token, labels, template_version=image_version)
            create(**launch_kwargs(config), access_token=launch.access_token, keep_on_failure=False)
        else:
            sandbox_class = type("Capturing", (), {"create": staticmethod(create)})
            ProjectService(project, sandbox_class=sandbox_class, image_version=image_version).deploy(
                access_token=launch.access_token, lifetime=fleet_lifetime(project, launch.scaling))
    except _Captured as captured:
        return captured.request
    # uncovered: the product's create path always calls run_microvm, which _CapturePlane turns into _Captured
    raise RuntimeError("the product's launch path made no RunMicrovm request")
