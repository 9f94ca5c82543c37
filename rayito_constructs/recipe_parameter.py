"""``RecipeParameter``: the fleet recipe as an SSM SecureString at ``/rayito/agents/<name>/recipe``.

CloudFormation cannot create a SecureString, so a custom resource writes it, backed by one small
Python function per stack (``lambdas/recipe_writer``) that never logs the value. Its role may put
and delete exactly the recipe parameters of that stack's fleets, and use the customer key if one
is given. The value is the encoded recipe: it holds secret *names* only, and it is visible in the
template like any other property (see docs/recipe.md).
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from ._function import library_function
from .names import claim
from .permissions import recipe_parameter_arn
from .recipe import EncodedRecipe

RESOURCE_TYPE = "Custom::RayitoRecipe"
_PROVIDER_ID = "RayitoRecipeWriter"


class RecipeWriter(Construct):
    """The function behind every ``RecipeParameter`` of a stack (one per stack)."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        made = library_function(
            self,
            name="recipe_writer",
            description="Writes Rayito fleet recipes as SecureString parameters (never logs them)",
            role_description="Rayito recipe writer: puts and deletes fleet recipe parameters",
        )
        self.log_group = made.log_group
        self.role = made.role
        self.function = made.function

    @classmethod
    def of(cls, scope: Construct) -> "RecipeWriter":
        """The writer of ``scope``'s stack, created on first use."""
        stack = cdk.Stack.of(scope)
        existing = stack.node.try_find_child(_PROVIDER_ID)
        return existing if isinstance(existing, RecipeWriter) else cls(stack, _PROVIDER_ID)


class RecipeParameter(Construct):
    """The SecureString recipe of one fleet, written at deploy, deleted with the stack.

    :param fleet_name: the fleet; the parameter is ``/rayito/agents/<fleet_name>/recipe``.
    :param recipe: the encoded recipe (``rayito_constructs.recipe.encode_recipe``).
    :param encryption_key: customer KMS key. Default: the AWS managed key ``aws/ssm``.
    :param keep_recipe: keep the parameter when the stack or the fleet is deleted. Default: False.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet_name: str,
        recipe: EncodedRecipe,
        encryption_key: Optional[kms.IKey] = None,
        keep_recipe: bool = False,
    ) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        self.parameter_name = f"/rayito/agents/{fleet_name}/recipe"
        claim(self, "recipe parameter", self.parameter_name)  # one writer of it per account and region
        """``/rayito/agents/<name>/recipe``."""
        self.parameter_arn = recipe_parameter_arn(stack, fleet_name)
        """The parameter's ARN."""
        self.encoding = recipe.encoding
        writer = RecipeWriter.of(self)
        grant = iam.Grant.add_to_principal(
            grantee=writer.role,
            actions=["ssm:PutParameter", "ssm:DeleteParameter"],
            resource_arns=[self.parameter_arn],
        )
        if encryption_key is not None:
            encryption_key.grant(writer.role, "kms:Encrypt")
        properties = {
            "ParameterName": self.parameter_name,
            "Value": recipe.value,
            "Encoding": recipe.encoding,
            "KeepOnDelete": "true" if keep_recipe else "false",
        }
        if encryption_key is not None:
            properties["KeyId"] = encryption_key.key_arn
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=writer.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties=properties,
            removal_policy=cdk.RemovalPolicy.RETAIN if keep_recipe else cdk.RemovalPolicy.DESTROY,
        )
        # The parameter must be written after the role may write it, and deleted before it may not.
        grant.apply_before(self.resource)
