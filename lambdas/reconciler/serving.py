"""Asking the fleet's server about a VM: what the reconciler sends and how it gets there.

Serving a VM (the product's agent host started on it, :mod:`.server`) takes seconds of gRPC through
its endpoint; a tick spends its time on the control plane instead, so the reconciler hands each VM
to the server function (an asynchronous ``Invoke``: Lambda queues it, retries it, and runs as many
as there are VMs to serve) and reads the answer from the ledger (``ready#<VM id>``) in a later
step. The request names the slot's generation and the ask's number, so an answer is matched to
the VM it was about and to the last ask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .core import WARM, Slot


def serve_request(fleet: str, slot: Slot, at: float) -> dict[str, Any]:
    """The server's event for ``slot``'s VM (a base slot's is served as the product's member, a
    parked slot's warmed as the product's pool warms its slots)."""
    return {"action": "serve", "fleet": fleet, "slot": slot.slot_id, "generation": slot.generation,
            "microvm_id": slot.microvm_id, "role": "warm" if slot.role == WARM else "member",
            "attempt": slot.serve_asks, "asked_at": round(at, 3)}


@dataclass(frozen=True)
class LambdaServer:
    """The server function, invoked asynchronously (``InvocationType=Event``) with the reconciler's
    ``lambda`` client."""

    client: Any
    function_name: str

    def ask(self, request: dict[str, Any]) -> None:
        self.client.invoke(FunctionName=self.function_name, InvocationType="Event",
                           Payload=json.dumps(request, sort_keys=True).encode("utf-8"))
