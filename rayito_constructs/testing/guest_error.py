"""The refusal a guest's rayd answers an RPC with, below both the VM host that raises it and the
stand-in rayd that turns it into a gRPC status."""

from __future__ import annotations


class GuestError(Exception):
    """A refusal a rayd RPC answers with: a gRPC status name and its details."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
