"""``FleetServer``: the function that serves the VMs the reconciler starts (``lambdas/reconciler/server.py``).

A VM the reconciler starts runs the product's ``rayd`` with the fleet's run payload; what the
product's client does next (open it with the fleet's token, apply the project's network policy
and gateways, start the agent host and wait for its ready marker; or, for a parked slot, the pool's
warming) takes seconds of gRPC through the VM's endpoint. The reconciler hands each VM to this
function with an asynchronous invocation and reads its answer from the ledger (docs/reconciler.md,
"Serving"). It has what serving needs and the reconciler does not: ``CreateMicrovmAuthToken`` (a
token opens the VM's endpoint), the sessions' secrets (the gateways', ``secret_env``'s, the fleet's
access token), and a write of its answers into the fleet's ledger partition, nothing else of it.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from ._function import library_function
from .access_token import token_secret_name
from .permissions import (
    FleetAccess,
    Statement,
    recipe_key_statements,
    session_secret_statements,
    table_key_statement,
    wildcard_reasons,
)
from .product_layer import ProductLayer

#: How long one ask may take: the product's wait for a VM to be ready (90 s) and for the agent
#: host's ready marker (120 s), and its calls. The reconciler asks again only after longer
#: (``SERVE_RETRY_SECONDS``: an ask is never answered twice at once).
SERVER_TIMEOUT_SECONDS = 240
#: Serving is gRPC and waiting: the product's client and grpcio fit in this.
SERVER_MEMORY_MB = 512


class FleetServer(Construct):
    """Serves (base) and warms (parked) the fleet's VMs, when its reconciler asks.

    :param fleet_name: the fleet.
    :param access: the fleet's ARNs (image, recipe, secrets), from ``AgentFleet``.
    :param ledger: the table the reconciler keeps the fleet's slots in; the answers go there.
    :param image_version: the version the stack built, when the recipe names none. Default: none.
    :param encryption_key: the ledger's customer key, if any (used through DynamoDB only).
    :param log_retention: Default: the fleet's.
    """

    def __init__(self, scope: Construct, id: str, *, fleet_name: str, access: FleetAccess, ledger: dynamodb.ITable,
                 image_version: Optional[str] = None, encryption_key: Optional[kms.IKey] = None,
                 log_retention: Optional[logs.RetentionDays] = None) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        environment = {
            "FLEET_NAME": fleet_name,
            "IMAGE_ARN": access.image_arns[0],
            "ACCESS_TOKEN_SECRET": token_secret_name(fleet_name),
            "LEDGER_TABLE": ledger.table_name,
        }
        if image_version:
            environment["IMAGE_VERSION"] = image_version
        image = ("*",) if not access.scope_microvm_actions_to_image else access.image_arns
        statements = [
            # Open the VM (its rayd) as the product's client does: read it, mint its endpoint's token.
            Statement("ServeMicrovms", ("lambda:GetMicrovm", "lambda:CreateMicrovmAuthToken"), image),
            Statement("AgentRecipe", ("ssm:GetParameter",), access.recipe_parameter_arns),
            *recipe_key_statements("AgentRecipeKey", ("kms:Decrypt",), access),
            *[s for s in session_secret_statements(access) if not s.deny],
            # Its answers only: the items of the fleet's partition (ready#<VM id>), put, never read.
            Statement("Answers", ("dynamodb:PutItem",), (ledger.table_arn,),
                      {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [fleet_name]}}),
        ]
        if ledger.encryption_key is not None:
            statements.append(table_key_statement("LedgerKey", ledger.encryption_key.key_arn, stack.region))
        made = library_function(
            self,
            name="reconciler",
            as_package=True,
            handler="reconciler.server.handler",
            description=f"Rayito server: serves and warms the VMs of fleet {fleet_name}",
            role_description=f"Rayito server of fleet {fleet_name}",
            statements=statements,
            wildcard_reasons=wildcard_reasons(statements),
            layers=[ProductLayer.of(self).layer],  # the product's client: it serves the VM
            timeout=cdk.Duration.seconds(SERVER_TIMEOUT_SECONDS),
            memory_size=SERVER_MEMORY_MB,
            environment=environment,
            # An ask that fails is answered as failed in the ledger; one lost, the reconciler asks again.
            retry_attempts=0,
            max_event_age=cdk.Duration.minutes(5),
            log_retention=log_retention,
        )
        self.function = made.function
        """The server function (asynchronous invocations, one a VM)."""
        self.role: iam.IRole = made.role
        """Its role."""
        self.log_group = made.log_group
        """Its log group: one line a VM served or not (``vm_served``, ``vm_not_served``)."""

    def grant_ask(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (the reconciler) invoke the server."""
        return self.function.grant_invoke(grantee)
