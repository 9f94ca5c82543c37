"""``RecipeParameter``: the fleet recipe as an SSM SecureString at ``/rayito/agents/<name>/recipe``.

CloudFormation cannot create a SecureString, so a custom resource writes it, backed by one small
Python function per stack (``lambdas/recipe_writer``) that never logs the recipe.

The recipe is **not** a template property: anyone with ``cloudformation:GetTemplate`` (or the
CloudFormation console, ``cdk diff``) would read it, and the SecureString and a customer key would
protect nothing. The recipe document goes to the stack's deployment bucket as a file asset (like
the function code), and the resource carries only the object's name and its SHA-256. The writer's
role may read exactly those objects and put and delete exactly the stack's recipe parameters.

A failed save never fails the deploy (the product page): the writer answers SUCCESS with the
outcome as attributes (``Saved``, ``Outcome``, ``Reason``, ``Encoding``...), logs it and, when the
fleet's metrics are on (the resource's ``Metrics`` property), emits the ``RecipeSaved`` and
``RecipeNotSaved`` metrics; ``recipe_failure="fail"`` rolls the deploy back instead.

Invoking the writer function is writing the recipe (docs/recipe.md): it acts only on requests for
its own stack's recipe resources and answers only CloudFormation, but whoever may call
``lambda:InvokeFunction`` on it can replay a write or a delete of those parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from ._function import lazy_string, library_function
from .monitoring import Operations, create_alarm, longest, metrics_value, retention_days
from .model.names import claim, fleet_name_problem
from .permissions import recipe_parameter_arn, via
from .model.product import canonical_json, decode, recipe_document
from .product_layer import ProductLayer
from .model.recipe import EncodedRecipe

RESOURCE_TYPE = "Custom::RayitoRecipe"
NAMESPACE = "Rayito/Fleet"
FAILURE_MODES = ("warn", "fail")
_PROVIDER_ID = "RayitoRecipeWriter"
#: Lambda environment variables hold at most 4 KB in all; the resource map takes most of it.
_MAX_RESOURCE_MAP = 3000


class RecipeWriter(Construct):
    """The function behind every ``RecipeParameter`` of a stack (one per stack: ``RecipeWriter.of``).

    Its role starts with its own log streams and grows one entry per recipe: ``WriteRecipes``
    (``ssm:PutParameter``/``ssm:DeleteParameter`` on the parameters), ``ReadRecipeDocuments``
    (``s3:GetObject`` on the documents) and, with a customer key, ``RecipeKeys`` (``kms:Encrypt``
    through SSM only).

    Its log group keeps logs for the longest ``log_retention`` any of its recipes asks for (the
    fleets of a stack share the writer; none of them loses logs it asked to keep).
    """

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self._resources: dict[str, tuple[cdk.CfnResource, str]] = {}
        made = library_function(
            self,
            name="recipe_writer",
            description="Writes Rayito fleet recipes as SecureString parameters (never logs them)",
            role_description="Rayito recipe writer: puts and deletes fleet recipe parameters",
            timeout=cdk.Duration.seconds(150),
            memory_size=512,  # importing rayito (grpcio, protobuf, boto3) takes ~150 MB and its CPU share
            layers=[ProductLayer.of(self).layer],  # the product encodes the recipe (lambdas/recipe_writer)
            environment={
                "STACK_ID": cdk.Aws.STACK_ID,
                "RECIPE_RESOURCES": lazy_string(self._resource_map),
            },
        )
        self.log_group = made.log_group
        self._retentions: list[logs.RetentionDays] = []
        self.role = made.role
        self.function = made.function
        self._write = iam.PolicyStatement(sid="WriteRecipes", actions=["ssm:PutParameter", "ssm:DeleteParameter"])
        self._read = iam.PolicyStatement(sid="ReadRecipeDocuments", actions=["s3:GetObject"])
        self._keys: Optional[iam.PolicyStatement] = None
        self.role.add_to_policy(self._write)
        self.role.add_to_policy(self._read)
        self.boundary: Optional[iam.IManagedPolicy] = None
        """The permissions boundary applied to the writer's role by the fleets that use it."""

    @classmethod
    def of(cls, scope: Construct) -> "RecipeWriter":
        """The writer of ``scope``'s stack, created on first use."""
        stack = cdk.Stack.of(scope)
        existing = stack.node.try_find_child(_PROVIDER_ID)
        return existing if isinstance(existing, RecipeWriter) else cls(stack, _PROVIDER_ID)

    def register(self, resource: cdk.CfnResource, *, fleet_name: str, parameter_arn: str,
                 document_arn: str, key: Optional[kms.IKey]) -> None:
        """Let the writer act for one recipe resource: its parameter, its document, its key."""
        self._resources[resource.node.path] = (resource, fleet_name)
        self._write.add_resources(parameter_arn)
        self._read.add_resources(document_arn)
        if key is not None:
            if self._keys is None:
                region = cdk.Stack.of(self).region
                self._keys = iam.PolicyStatement(sid="RecipeKeys", actions=["kms:Encrypt"], conditions=via("ssm", region))
                self.role.add_to_policy(self._keys)
            self._keys.add_resources(key.key_arn)

    def use_retention(self, retention: logs.RetentionDays) -> None:
        """A recipe's fleet asks its logs be kept ``retention``: the writer keeps the longest asked."""
        self._retentions.append(retention)
        days = retention_days(longest(*self._retentions))
        cfn = self.log_group.node.default_child
        cfn.retention_in_days = days  # type: ignore[union-attr]  # None: never expire

    def apply_boundary(self, boundary: iam.IManagedPolicy) -> None:
        """Put ``boundary`` on the writer's role; a different one already there is an error (the
        writer is shared by every fleet of the stack)."""
        stack = cdk.Stack.of(self)
        if self.boundary is not None:
            if stack.resolve(self.boundary.managed_policy_arn) != stack.resolve(boundary.managed_policy_arn):
                raise ValueError(
                    "permissions_boundary: the fleets of one stack share its recipe writer, which already has "
                    f"the boundary {stack.resolve(self.boundary.managed_policy_arn)!r}; give every fleet of the "
                    "stack the same boundary (FleetStack(permissions_boundary=...)) or put them in different stacks"
                )
            return
        self.boundary = boundary
        iam.PermissionsBoundary.of(self).apply(boundary)

    def _resource_map(self) -> str:
        stack = cdk.Stack.of(self)
        mapping = {stack.resolve(stack.get_logical_id(cfn)): fleet for cfn, fleet in self._resources.values()}
        text = json.dumps(dict(sorted(mapping.items())), separators=(",", ":"))
        if len(text) > _MAX_RESOURCE_MAP:
            raise ValueError(
                f"{len(mapping)} fleets in one stack: their recipe resources do not fit in the writer's "
                "environment (4 KB); split the fleets over several stacks"
            )
        return text



def _document_file(data: bytes, digest: str) -> Path:
    """The recipe document as a file for the asset (content-addressed, private to this user)."""
    folder = Path(tempfile.gettempdir()) / f"rayito-recipes-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{digest}.json"
    if not path.is_file() or path.read_bytes() != data:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    return path


class RecipeParameter(Construct):
    """The SecureString recipe of one fleet, written at deploy, deleted with the stack.

    :param fleet_name: the fleet; the parameter is ``/rayito/agents/<fleet_name>/recipe``.
    :param recipe: the product's recipe document (``RecipePlan.document``), or a stored recipe
        value (:class:`~rayito_constructs.model.recipe.EncodedRecipe`), which is decoded back to its document.
    :param image_version: the image version to record when it is only known at deploy (a token,
        such as ``AgentImage.latest_active_image_version``); the writer puts it into the
        document before encoding it, so it is there in every encoding. Default: the document's.
    :param encryption_key: customer KMS key. Default: the AWS managed key ``aws/ssm``.
    :param keep_recipe: keep the parameter when the stack or the fleet is deleted. Default: False.
    :param recipe_failure: ``warn`` (a failed save is reported: the ``Outcome`` attribute, the log,
        the ``RecipeNotSaved`` metric, and the deploy goes on, as the product page says) or
        ``fail`` (the deploy rolls back). Default: ``warn``.
    :param metrics: the writer emits ``RecipeSaved``/``RecipeNotSaved`` (EMF) for this recipe; off,
        it only logs the outcome. Default: the fleet's ``metrics`` (off outside a fleet).
    :param log_retention: how long the stack's recipe writer keeps its logs (the longest any
        recipe of the stack asks). Default: the fleet's ``log_retention``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet_name: str,
        recipe: Union[EncodedRecipe, Mapping[str, Any]],
        image_version: Optional[str] = None,
        encryption_key: Optional[kms.IKey] = None,
        keep_recipe: bool = False,
        recipe_failure: str = "warn",
        metrics: Optional[bool] = None,
        log_retention: Optional[logs.RetentionDays] = None,
    ) -> None:
        if recipe_failure not in FAILURE_MODES:
            raise ValueError(f"recipe_failure: {recipe_failure!r} is not one of 'warn', 'fail'")
        problem = fleet_name_problem(fleet_name)  # a pattern (agente*) would let the writer write other recipes
        if problem:
            raise ValueError(f"fleet_name: {problem}")
        document = recipe_document(decode(recipe.value)[0]) if isinstance(recipe, EncodedRecipe) else dict(recipe)
        if document.get("name") != fleet_name:
            raise ValueError(f"recipe: the document is the recipe of {document.get('name')!r}, not of {fleet_name!r}")
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        operations = Operations.of(self)
        self.metrics = operations.metrics if metrics is None else metrics
        """Whether the writer emits this recipe's metrics."""
        self.alarm: Optional[cloudwatch.Alarm] = None
        """The ``NotSavedAlarm``, once ``add_alarm`` made it."""
        self.fleet_name = fleet_name
        self.parameter_name = f"/rayito/agents/{fleet_name}/recipe"
        claim(self, "recipe parameter", self.parameter_name)  # one writer of it per account and region
        """``/rayito/agents/<name>/recipe``."""
        self.parameter_arn = recipe_parameter_arn(stack, fleet_name)
        """The parameter's ARN."""
        self.encoding = recipe.encoding if isinstance(recipe, EncodedRecipe) else None
        data = canonical_json(document).encode()
        digest = hashlib.sha256(data).hexdigest()
        self.document = s3_assets.Asset(
            self, "Document", path=str(_document_file(data, digest)),
            asset_hash=digest, asset_hash_type=cdk.AssetHashType.CUSTOM,
        )
        """The recipe document in the deployment bucket (only the writer reads it)."""
        writer = RecipeWriter.of(self)
        writer.use_retention(log_retention if log_retention is not None else operations.log_retention)
        self.writer = writer
        properties: dict[str, Any] = {
            "ParameterName": self.parameter_name,
            "DocumentBucket": self.document.s3_bucket_name,
            "DocumentKey": self.document.s3_object_key,
            "DocumentSha256": digest,
            "KeepOnDelete": "true" if keep_recipe else "false",
            "FailureMode": recipe_failure,
            "Metrics": metrics_value(self.metrics),
        }
        if image_version is not None:
            properties["ImageVersion"] = image_version
        if encryption_key is not None:
            properties["KeyId"] = encryption_key.key_arn
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=writer.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties=properties,
            removal_policy=cdk.RemovalPolicy.RETAIN if keep_recipe else cdk.RemovalPolicy.DESTROY,
            # The writer always answers within its own timeout; this bounds a lost answer too.
            service_timeout=cdk.Duration.minutes(5),
        )
        writer.register(
            self.resource.node.default_child,  # type: ignore[arg-type]
            fleet_name=fleet_name,
            parameter_arn=self.parameter_arn,
            document_arn=self.document.bucket.arn_for_objects(self.document.s3_object_key),
            key=encryption_key,
        )
        # The parameter is written after the role may write it, and deleted before it may not.
        self.resource.node.add_dependency(writer.role)

    @property
    def outcome(self) -> str:
        """``saved``, ``recipe_too_large``, ``recipe_access_denied`` or ``recipe_not_saved`` (at deploy)."""
        return self.resource.get_att_string("Outcome")

    @property
    def saved(self) -> str:
        """``true`` when the deploy saved the recipe."""
        return self.resource.get_att_string("Saved")

    @property
    def reason(self) -> str:
        """Why the recipe was not saved (the AWS error code, or the size), ``saved`` otherwise."""
        return self.resource.get_att_string("Reason")

    def metric_not_saved(self, **props: Any) -> cloudwatch.Metric:
        """1 for a deploy that did not save the recipe (the writer's ``RecipeNotSaved``)."""
        props.setdefault("period", cdk.Duration.minutes(5))
        props.setdefault("statistic", "Maximum")
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name="RecipeNotSaved",
                                 dimensions_map={"fleet": self.fleet_name}, **props)

    def metric_saved(self, **props: Any) -> cloudwatch.Metric:
        """1 for a deploy that saved the recipe (the writer's ``RecipeSaved``)."""
        props.setdefault("period", cdk.Duration.minutes(5))
        props.setdefault("statistic", "Maximum")
        return cloudwatch.Metric(namespace=NAMESPACE, metric_name="RecipeSaved",
                                 dimensions_map={"fleet": self.fleet_name}, **props)

    def add_alarm(self, *, option: str = "add_alarm()") -> cloudwatch.Alarm:
        """An alarm when a deploy could not save the recipe (on a custom metric: refused when the
        recipe's metrics are off, naming ``option``)."""
        self.alarm = create_alarm(
            self, "NotSavedAlarm", self.metric_not_saved(), option=option, metrics=self.metrics,
            off_hint="leave the recipe alarm out (the RecipeOutcome output and the writer's log still tell)",
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.fleet_name}: a deploy could not save the fleet recipe (see the RecipeOutcome output)",
        )
        return self.alarm
