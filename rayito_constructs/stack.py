"""``FleetStack``: a deployable stack holding one :class:`AgentFleet`, with its outputs."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from .agent_image import DEFAULT_BASE_IMAGE_VERSION
from .agent_image import DEFAULT_LOG_RETENTION as DEFAULT_MICROVM_LOG_RETENTION
from .fleet import AgentFleet
from .monitoring import DEFAULT_LOG_RETENTION, AlarmActionLike
from .model.names import is_stack_name, safe_stack_name
from .model.project import AgentProject


class FleetStack(cdk.Stack):
    """A stack with one fleet and outputs for what a deployer needs next.

    :param project: the agent project.
    :param image_arn: see :class:`AgentFleet`. Default: the image named after the fleet.
    :param rayd: see :class:`AgentFleet`. Default: none (no image built).
    :param base_image_version: see :class:`AgentFleet`. Default: ``"1"``.
    :param build_image: see :class:`AgentFleet`. Default: True.
    :param metadata_index: see :class:`AgentFleet`. Default: False.
    :param reconciler: see :class:`AgentFleet`. Default: on when the fleet saves a recipe.
    :param keep_recipe: see :class:`AgentFleet`. Default: False.
    :param scope_microvm_actions_to_image: see :class:`AgentFleet`. Default: True (False is the
        opt-out to every image, docs/iam.md).
    :param recipe_key: see :class:`AgentFleet`. Default: AWS managed keys.
    :param recipe_failure: see :class:`AgentFleet`. Default: ``warn``.
    :param permissions_boundary: a managed policy set as the permissions boundary of every role in
        the stack, now and later, the recipe writer included. Default: none.
    :param retain_vms_on_delete: see :class:`AgentFleet`. Default: False (deleting the stack ends
        the fleet's VMs first).
    :param teardown_failure: see :class:`AgentFleet`. Default: ``warn``.
    :param keep_image_versions: see :class:`AgentFleet`. Default: 5.
    :param metrics: custom metrics (see :class:`AgentFleet`; docs/operations.md for their count
        and cost). Default: False.
    :param alarm_actions: an SNS topic (or its ARN), any ``cloudwatch.IAlarmAction``, or a list,
        applied to every alarm of the fleet. Default: none.
    :param dashboard: see :class:`AgentFleet`. Default: when metrics are on.
    :param saved_queries: the fleet's Logs Insights queries (see :class:`AgentFleet`). Default: True.
    :param log_retention: the library's function logs. Default: three months.
    :param microvm_log_retention: the MicroVMs' log group, when the stack owns it. Default: one month.
    :param stack_props: ``cdk.Stack`` keyword arguments (``env``, ``description``, ``synthesizer``...).
        Default ``stack_name``: CDK's (the id), or one derived from it when the id is not a valid
        stack name (``Fleet-my_agent`` → ``Fleet-my-agent-<hash>``).

    Outputs include ``RecipeOutcome`` and ``RecipeSaved``: what the deploy did with the recipe
    (``saved``, or the warning code and ``RecipeReason`` when it could not save it), and
    ``DashboardName`` when the fleet has a dashboard.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        project: AgentProject,
        image_arn: Optional[str] = None,
        rayd: Any = None,
        base_image_version: str = DEFAULT_BASE_IMAGE_VERSION,
        build_image: bool = True,
        metadata_index: bool = False,
        keep_recipe: bool = False,
        reconciler: Optional[bool] = None,
        scope_microvm_actions_to_image: bool = True,
        recipe_key: Optional[kms.IKey] = None,
        recipe_failure: str = "warn",
        permissions_boundary: Optional[iam.IManagedPolicy] = None,
        retain_vms_on_delete: bool = False,
        teardown_failure: str = "warn",
        keep_image_versions: Optional[int] = 5,
        metrics: bool = False,
        alarm_actions: Union[None, AlarmActionLike, Sequence[AlarmActionLike]] = None,
        dashboard: Optional[bool] = None,
        saved_queries: bool = True,
        log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
        microvm_log_retention: logs.RetentionDays = DEFAULT_MICROVM_LOG_RETENTION,
        **stack_props: Any,
    ) -> None:
        stack_props.setdefault("description", f"Rayito agent fleet {project.name} (rayito_constructs)")
        if "stack_name" not in stack_props and not is_stack_name(id):
            stage = scope if cdk.Stage.is_stage(scope) else cdk.Stage.of(scope)
            prefix = f"{stage.stage_name}-" if stage is not None and stage.stage_name else ""
            stack_props["stack_name"] = safe_stack_name(prefix + id)
        super().__init__(scope, id, **stack_props)
        if permissions_boundary is not None:
            # The stack's scope: every role of the stack, the recipe writer included, now and later.
            iam.PermissionsBoundary.of(self).apply(permissions_boundary)
        self.fleet = AgentFleet(
            self,
            "Fleet",
            project=project,
            image_arn=image_arn,
            rayd=rayd,
            base_image_version=base_image_version,
            build_image=build_image,
            metadata_index=metadata_index,
            keep_recipe=keep_recipe,
            reconciler=reconciler,
            scope_microvm_actions_to_image=scope_microvm_actions_to_image,
            recipe_key=recipe_key,
            recipe_failure=recipe_failure,
            permissions_boundary=permissions_boundary,
            retain_vms_on_delete=retain_vms_on_delete,
            teardown_failure=teardown_failure,
            keep_image_versions=keep_image_versions,
            metrics=metrics,
            alarm_actions=alarm_actions,
            dashboard=dashboard,
            saved_queries=saved_queries,
            log_retention=log_retention,
            microvm_log_retention=microvm_log_retention,
        )
        """The fleet."""
        fleet = self.fleet
        cdk.CfnOutput(self, "FleetName", value=fleet.fleet_name)
        cdk.CfnOutput(self, "ImageArn", value=fleet.image_arn)
        cdk.CfnOutput(
            self,
            "RecipeParameterName",
            value=fleet.recipe_parameter_name if fleet.recipe else "none (see the synth warnings)",
        )
        if fleet.recipe:
            cdk.CfnOutput(self, "RecipeOutcome", value=fleet.recipe.outcome,
                          description="what the deploy did with the recipe: saved, or a recipe_* warning code")
            cdk.CfnOutput(self, "RecipeSaved", value=fleet.recipe.saved)
            cdk.CfnOutput(self, "RecipeReason", value=fleet.recipe.reason)
        cdk.CfnOutput(self, "AccessTokenSecretName", value=fleet.access_token_secret_name,
                      description="the fleet's access token (RAYITO_ACCESS_TOKEN for the product's client)")
        cdk.CfnOutput(self, "ExecutionRoleArn", value=fleet.execution_role.role_arn)
        cdk.CfnOutput(self, "CallerPolicyArn", value=fleet.caller_policy.managed_policy_arn)
        cdk.CfnOutput(self, "ImagePublisherPolicyArn", value=fleet.image_publisher_policy.managed_policy_arn)
        cdk.CfnOutput(self, "SandboxLauncherPolicyArn", value=fleet.sandbox_launcher_policy.managed_policy_arn)
        if fleet.reconciler:
            cdk.CfnOutput(self, "ReconcilerFunctionName", value=fleet.reconciler.function.function_name)
            cdk.CfnOutput(self, "ReconcilerDeadLetterQueueUrl", value=fleet.reconciler.dead_letter_queue.queue_url)
        if fleet.egress_budget:
            cdk.CfnOutput(self, "EgressBudgetTableName", value=fleet.egress_budget.table_name)
        if fleet.metadata_index:
            cdk.CfnOutput(self, "MetadataIndexTableName", value=fleet.metadata_index.table_name)
        if fleet.dashboard:
            cdk.CfnOutput(self, "DashboardName", value=fleet.dashboard.dashboard_name)
