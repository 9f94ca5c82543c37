"""How the product's unmodified client reaches the emulated VMs, without touching its code.

Two ways, both the product's own:

1. **In-process, plaintext** (its documented test path: ``TransportSettings``' docstring says the
   product's tests point the client at a fake rayd on loopback with
   ``grpc.local_channel_credentials()``). :class:`ProductSeams` makes the objects the product takes
   as keywords: ``transport=`` for ``Sandbox.create``/``connect``/``list``/``get_info``,
   ``sandbox_class=`` for ``ProjectService`` and ``SandboxDirectory``, ``transport_factory=`` (the
   HTTP side: ``HttpsTransport(host, port=..., secure=False)``) for ``ProjectService``,
   ``AgentDeployment`` and ``AgentFleet``, and ``pool_factory=`` (a ``SandboxPool`` with the same
   transport) for ``AgentFleet``::

       seams = emulator.vm_host.seams
       sandbox = Sandbox.create("eco", access_token=token, transport=seams.transport, session=session)
       fleet = AgentFleet.connect("eco", access_token=token, recipe_store=store, session=session,
                                  **seams.fleet(session=session))

2. **The CLI, over TLS** (``MicrovmsEmulator(host_vms=True, tls_front=True)``): nothing to pass; the
   process's environment points the client at the emulator and the test CA
   (:meth:`ProductSeams.environment`).

The control plane still comes from boto3: ``AWS_ENDPOINT_URL_LAMBDA_MICROVMS`` (plus STS, SSM and
Secrets Manager on moto). The product caches one control plane per ``(session, region)`` and
process, so an in-process test passes a ``session=`` of its own (a fresh ``boto3.Session``) or the
first test's endpoint would stay.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .vm_host import VmHost

#: The class-level calls of ``rayito.sandbox_sync.Sandbox`` the product's fleet code makes through
#: a ``sandbox_class`` (``SandboxDirectory``, ``ProjectService``), and a few more.
SANDBOX_CALLS = ("create", "connect", "list", "paginate", "get_info", "kill", "pause", "resume", "set_timeout",
                 "update_network")


class ProductSeams:
    """The product's seams, set for one :class:`~.vm_host.VmHost`."""

    def __init__(self, host: "VmHost") -> None:
        self.host = host

    @property
    def port(self) -> int:
        """The plaintext port every VM's endpoint answers on."""
        return self.host.plain_port

    @functools.cached_property
    def transport(self) -> Any:
        """``rayito._transport.TransportSettings`` with local (plaintext, loopback-only)
        credentials on :attr:`port`."""
        import grpc
        from rayito._transport import TransportSettings

        return TransportSettings(channel_credentials=grpc.local_channel_credentials(), port=self.port)

    def http_transport(self, host_access: Any) -> Any:
        """A ``transport_factory``: plain HTTP/1.1 to ``<endpoint>:<port>`` (the product's
        ``HttpsTransport(..., secure=False)``)."""
        from rayito._agent._deployment import HttpsTransport

        return HttpsTransport(host_access.host, port=self.port, secure=False)

    def sandbox_class(self, **defaults: Any) -> type:
        """A stand-in for the ``Sandbox`` class the product's code calls at class level: the
        real ``rayito.sandbox_sync.Sandbox`` calls with ``transport=`` (where they take one) and
        ``defaults`` (``session=``, ``region=``) filled in."""
        from rayito.sandbox_sync import Sandbox

        members: dict[str, Any] = {"__doc__": "rayito.sandbox_sync.Sandbox with the emulator's transport"}
        for name in SANDBOX_CALLS:
            target = getattr(Sandbox, name)
            signature = inspect.signature(getattr(Sandbox, f"_class_{name}", None) or target)
            bound = {key: value for key, value in defaults.items() if key in signature.parameters}
            if "transport" in signature.parameters:
                bound["transport"] = self.transport
            members[name] = staticmethod(functools.partial(_call, target, bound))
        return type("EmulatedSandbox", (), members)

    def pool_factory(self, config: Any, **options: Any) -> Any:
        """An ``AgentFleet(pool_factory=)``: the product's ``SandboxPool`` with this transport."""
        from rayito.sandbox_sync.pool import SandboxPool

        return SandboxPool(config, transport=self.transport, **options)

    def directory(self, **options: Any) -> Any:
        """``SandboxDirectory(sandbox_class=...)`` (``options``: ``region=``, ``session=``)."""
        from rayito._agent._fleet import SandboxDirectory

        return SandboxDirectory(sandbox_class=self.sandbox_class(**options), **options)

    def project_service(self, project: Any, **options: Any) -> Any:
        """``ProjectService(project, sandbox_class=..., transport_factory=...)``; ``options``
        are ``ProjectService``'s (``image_version=``...) plus ``session=``/``region=`` for its
        sandboxes."""
        from rayito._agent._project_service import ProjectService

        defaults = {key: options.pop(key) for key in ("session", "region") if key in options}
        return ProjectService(project, sandbox_class=self.sandbox_class(**defaults),
                              transport_factory=self.http_transport, **options)

    def fleet(self, **options: Any) -> dict[str, Any]:
        """Keywords for ``AgentFleet(...)`` / ``AgentFleet.connect(...)``: ``directory``,
        ``transport_factory`` and ``pool_factory`` (``options``: ``region=``, ``session=``). With a
        ``project``, pass ``service=seams.project_service(project, ...)`` too: a fleet builds its
        own ``ProjectService`` (for new VMs) with the default ``Sandbox``, i.e. TLS on 443."""
        return {"directory": self.directory(**options), "transport_factory": self.http_transport,
                "pool_factory": self.pool_factory}

    def environment(self, endpoint_url: str) -> dict[str, str]:
        """The environment the unmodified CLI needs to reach this emulator (its TLS front):
        ``AWS_ENDPOINT_URL_LAMBDA_MICROVMS`` and, with the TLS front, the test CA for gRPC
        (``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``) and for Python's ``ssl`` (``SSL_CERT_FILE``).
        STS, SSM and Secrets Manager endpoints are the caller's (moto)."""
        env = {"AWS_ENDPOINT_URL_LAMBDA_MICROVMS": endpoint_url}
        if self.host.ca_file is not None:
            env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(self.host.ca_file)
            env["SSL_CERT_FILE"] = str(self.host.ca_file)
        return env


def _call(target: Any, bound: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    return target(*args, **{**bound, **kwargs})
