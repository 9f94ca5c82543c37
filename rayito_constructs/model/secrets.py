"""The secrets a fleet's sessions read, as the product reads them (plain: no CDK), for the
policies that grant them (:mod:`rayito_constructs.permissions`), ``plan`` and ``verify``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import Problem, ProjectError


@dataclass(frozen=True)
class SessionSecrets:
    """The Secrets Manager ids a fleet's sessions read, as the product reads them.

    ``gateways``: each ``[gateways.*]`` header's secret (``SecretCache`` with the prefix
    ``rayito/``: ``rayito/<secret>``), read after a VM is ready (``GatewaySection.fill``) and
    described by ``rayito agent deploy``'s preflight (``ensure_model_secrets``); ``renewed``: the
    ``bedrock`` gateways' secrets ``--renew-gateway-keys`` describes and writes
    (``renewable_gateways``); ``secret_env``: the ids of ``[secret_env]`` and of
    ``[[secret_env_from]]`` as written (a full name or ARN: ``secret_reader_for`` reads them with
    no prefix), the product's ``secret_ids``."""

    gateways: tuple[str, ...] = ()
    renewed: tuple[str, ...] = ()
    secret_env: tuple[str, ...] = ()


def session_secrets(project: Any) -> SessionSecrets:
    """The secrets of ``project`` (an :class:`~rayito_constructs.model.project.AgentProject`), by the
    product's own functions."""
    from rayito._agent._gateway_keys import renewable_gateways
    from rayito._agent._secret_env_domain import secret_ids
    from rayito._secrets import DEFAULT_SECRET_PREFIX, WEBHOOK_SECRET_PREFIX, resolve_secret_id
    from rayito.exceptions import InvalidArgumentException

    product = project.product
    gateways: list[str] = []
    for name, gateway in sorted(product.gateways.items()):
        for reference in gateway.headers.values():
            secret_id = resolve_secret_id(getattr(reference, "name", reference), DEFAULT_SECRET_PREFIX)
            if secret_id.startswith(WEBHOOK_SECRET_PREFIX) or f":secret:{WEBHOOK_SECRET_PREFIX}" in secret_id:
                # The product refuses them too (SecretStore.read_value): a session that held a
                # webhook signing secret could forge deliveries.
                raise ProjectError([Problem(f"gateways.{name}", f"gateways.{name}: {secret_id!r} is under "
                                            f"{WEBHOOK_SECRET_PREFIX}, the product's webhook signing secrets, which a "
                                            "session never reads; name another secret")])
            gateways.append(secret_id)
    try:
        renewed = tuple(g.secret_id for g in renewable_gateways(product))
    except InvalidArgumentException:
        renewed = ()  # no bedrock gateway: --renew-gateway-keys has nothing to renew
    # [secret_env] by variable, then [[secret_env_from]]'s secrets, as the product reads them.
    return SessionSecrets(gateways=tuple(dict.fromkeys(gateways)), renewed=tuple(dict.fromkeys(renewed)),
                          secret_env=secret_ids(product.secret_env, product.secret_env_from))
