"""The RunMicrovm parameters of a slot, by role: an input of the shell, not a decision of the core.

The core decides *when* a slot runs a VM and how long it lives (its ``lifetime``); what else the
request carries is the product's format (issue #33 makes these the product client's own: its run
hook payload, labels, logging). :class:`RunRequests` is the one built from the fleet's environment
today; the shell asks it once per slot generation and pins the answer (a retry of the token sends
exactly the same parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .core import BASE, FleetSpec, Role, Slot

#: Parameters for a slot about to run: its role and the lifetime the core chose (``lifetime``).
RequestFor = Callable[[Slot], dict[str, Any]]


@dataclass(frozen=True)
class RunRequests:
    """RunMicrovm parameters per role, from the fleet's image, version, role and idle policy."""

    image_arn: str
    image_version: Optional[str] = None
    execution_role_arn: Optional[str] = None
    idle_seconds: Optional[int] = None

    @classmethod
    def of(cls, spec: FleetSpec) -> RunRequests:
        return cls(spec.image_arn, spec.image_version, spec.execution_role_arn, spec.idle_seconds)

    def for_role(self, role: Role, lifetime: int) -> dict[str, Any]:
        """The parameters of a VM of ``role`` living ``lifetime`` seconds (the client token aside)."""
        params: dict[str, Any] = {"imageIdentifier": self.image_arn, "maximumDurationInSeconds": int(lifetime)}
        if self.image_version:
            params["imageVersion"] = self.image_version
        if self.execution_role_arn:
            params["executionRoleArn"] = self.execution_role_arn
        if role == BASE and self.idle_seconds:
            # A base VM the service suspends when idle is still a live base VM: it resumes when called.
            params["idlePolicy"] = {
                "maxIdleDurationSeconds": self.idle_seconds,
                "suspendedDurationSeconds": int(lifetime),
                "autoResumeEnabled": True,
            }
        return params

    def __call__(self, slot: Slot) -> dict[str, Any]:
        return self.for_role(slot.role, int(slot.lifetime or 0))
