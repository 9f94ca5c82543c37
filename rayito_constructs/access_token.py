"""``FleetAccessToken``: the fleet's access token, one per fleet, made at deploy in Secrets Manager.

The product's ``rayd`` admits a gRPC call only with the fleet's token (``x-access-token``),
checked against the ``token_sha256`` each VM received in its run payload. The product's CLI takes
the token from ``RAYITO_ACCESS_TOKEN`` or ``--token-file``; this stack keeps it in one secret,
``rayito/agents/<fleet>/access-token``, which CloudFormation generates at deploy: it is never in
the template, the recipe, a log or a metric (the run payload carries only its sha256, as the
product's does). Read it with ``grant_read`` (``AgentFleet.grant_read_access_token``)::

    RAYITO_ACCESS_TOKEN=$(aws secretsmanager get-secret-value --secret-id rayito/agents/mi-agente/access-token \\
        --query SecretString --output text) rayito agent invoke mi-agente "Hola"

The value is the product's token format: base64url without padding, 44 characters from
``[A-Za-z0-9]`` (a multiple of 4 characters is canonical base64url whatever the characters: 33
random bytes, above the product's 32-byte minimum).

Rotation (docs/reconciler.md, "The access token"): a new value reaches new VMs only. The
reconciler reads the token when a function instance starts, so VMs it starts after that carry the
new token's sha256; VMs already running keep the old one until they end (their lifetime follows
the serve timeout: about an hour by default), and clients with the new token cannot reach them
until then. Nothing rotates it automatically.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

#: Characters of the generated token: a multiple of 4 is always canonical base64url.
TOKEN_LENGTH = 44


def token_secret_name(fleet_name: str) -> str:
    """``rayito/agents/<fleet>/access-token``."""
    return f"rayito/agents/{fleet_name}/access-token"


class FleetAccessToken(Construct):
    """The fleet's access token (a ``secretsmanager.Secret`` generated at deploy).

    :param fleet_name: the fleet; the secret is ``rayito/agents/<fleet_name>/access-token``.
    :param encryption_key: customer KMS key. Default: the AWS managed key ``aws/secretsmanager``.
    :param removal_policy: Default: ``DESTROY``: the token is worth nothing once the fleet is gone.
    """

    def __init__(self, scope: Construct, id: str, *, fleet_name: str, encryption_key: Optional[kms.IKey] = None,
                 removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY) -> None:
        super().__init__(scope, id)
        self.secret = secretsmanager.Secret(
            self, "Secret",
            secret_name=token_secret_name(fleet_name),
            description=f"Rayito fleet {fleet_name}: the access token its VMs' rayd admits (made at deploy)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=TOKEN_LENGTH, exclude_punctuation=True, include_space=False,
            ),
            encryption_key=encryption_key,
            removal_policy=removal_policy,
        )
        """The secret."""
        cdk.Validations.of(self.secret).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-SMG4",
            reason="A new token reaches only the VMs started after it (rayd keeps the sha256 it got at /run), so a "
                   "scheduled rotation would lock clients out of running VMs until they end; rotation is a decision "
                   "of the fleet's owner (docs/reconciler.md, 'The access token').",
        ))

    @property
    def secret_arn(self) -> str:
        return self.secret.secret_arn

    @property
    def secret_name(self) -> str:
        return self.secret.secret_name

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read the token (``secretsmanager:GetSecretValue``, and decrypt with a
        customer key)."""
        return self.secret.grant_read(grantee)
