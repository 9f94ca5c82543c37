"""``AgentFleet``: one fleet of agent MicroVMs, composed from an :class:`AgentProject`.

It makes the fleet's recipe (a SecureString written by a custom resource), its three managed
policies, the execution role of its MicroVMs (unless one is given) and, on request, the metadata
index. ``AgentFleet.from_fleet_name`` gives another stack or app the same ``grant_*`` methods on a
fleet it does not own.

Its operations surface (docs/operations.md): custom metrics on request (``metrics=True``; off they
cost nothing, not one EMF line is printed), alarms from one factory that refuse at synth to watch a
custom metric nobody sends, ``alarm_actions`` on every alarm below the fleet (an aspect, so alarms
added later get them too), a dashboard, saved Logs Insights queries, and the retention of every
log group the library makes.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional, Sequence, Union

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from .access_token import FleetAccessToken, token_secret_name
from .image_pruner import check_keep
from .agent_image import (
    DEFAULT_BASE_IMAGE_VERSION,
    DEFAULT_LOG_RETENTION,
    AgentImage,
    _usable_log_key,
    rayd_from_context,
)
from .dashboard import FleetDashboard
from .egress.client import ENVELOPES_ENV, TABLE_ENV
from .egress_budget import EgressBudget
from .execution_role import LOG_GROUP_PREFIX, MicrovmExecutionRole
from .fleet_teardown import FleetTeardown
from .metadata_index import MetadataIndex
from .monitoring import (
    DEFAULT_LOG_RETENTION as DEFAULT_FUNCTION_LOG_RETENTION,
    METRICS_ENV,
    AlarmActionLike,
    Operations,
    check_alarm_actions,
    metrics_value,
    retention_days,
)
from .model.names import claim
from .model.options import egress_declaration
from .permissions import (
    FleetAccess,
    Statement,
    caller_statements,
    checked_grant,
    check_same_environment,
    fleet_access,
    grant_all,
    launcher_statements,
    publisher_statements,
    recipe_parameter_arn,
)
from .policies import CallerPolicy, ImagePublisherPolicy, SandboxLauncherPolicy
from .model.project import AgentProject
from .queries import FleetQueries
from .model.recipe import (RecipePlan, no_reconciler, parameter_name, plan_recipe, reconciler_needs_recipe,
                           reconciler_on)
from .recipe_parameter import RecipeParameter
from .reconciler import FleetReconciler, _check_whole

_IMAGE_NAME = re.compile(r":microvm-image:([A-Za-z0-9_-]{1,64})$")
_IMAGE_NAME_ONLY = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def egress_table_name(fleet_name: str) -> str:
    """The egress budget table's fixed name when the fleet bakes it into its image at synth
    (one fleet of a name per account and region, so one table)."""
    return f"rayito-egress-{fleet_name}"


def _image_name(image_arn: Optional[str], fleet_name: str) -> Optional[str]:
    """The image's name when it can be read at synth; the fleet's name for the default image."""
    if image_arn is None:
        return fleet_name
    if cdk.Token.is_unresolved(image_arn):
        return None
    match = _IMAGE_NAME.search(image_arn)
    if not match:
        raise ValueError(
            f"image_arn: {image_arn!r} is not a MicroVM image ARN "
            "(arn:<partition>:lambda:<region>:<account>:microvm-image:<name>)"
        )
    return match.group(1)


#: Options that make alarms on custom metrics, and what their alarms watch (for the synth error).
_NEEDS_METRICS = {
    "reconciler_alarms": ("the amplification, deficit, dead-lettered-slot and stray alarms watch custom metrics "
                          "of Rayito/Fleet", "leave reconciler_alarms unset (the dead-letter queue alarm needs none)"),
    "recipe_alarm": ("the alarm watches RecipeNotSaved, a custom metric of Rayito/Fleet",
                     "leave recipe_alarm unset (the RecipeOutcome output and the writer's log still tell)"),
    "egress_alarms": ("the exhaustion, deferral-rate and store alarms watch custom metrics of Rayito/Egress",
                      "leave egress_alarms unset"),
    "dashboard": ("its graphs are the custom metrics of Rayito/Fleet and Rayito/Egress",
                  "leave dashboard unset (the saved Logs Insights queries need no metric)"),
}


def _check_operations(metrics: object, asked: Mapping[str, object]) -> None:
    """One line per mistake, before anything is built: a switch that is not a bool, or an alarm
    (or the dashboard) on custom metrics while metrics are off."""
    if not isinstance(metrics, bool):
        raise ValueError(f"metrics: {metrics!r} is not True or False")
    for option, value in asked.items():
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{option}: {value!r} is not True, False or None (None: when metrics are on)")
        if value is True and not metrics:
            what, instead = _NEEDS_METRICS[option]
            raise ValueError(f"{option}=True: {what}, and metrics is False (the default); pass metrics=True "
                             f"(their count and monthly cost: docs/operations.md) or {instead}")


def _bound_image(image: AgentImage, boundary: iam.IManagedPolicy) -> None:
    """Put ``boundary`` on the roles of an image given to a fleet; a different one that another
    fleet put there is an error (the image's roles can have one boundary)."""
    stack = cdk.Stack.of(image)
    current: Optional[iam.IManagedPolicy] = getattr(image, "_rayito_boundary", None)
    if current is not None:
        if stack.resolve(current.managed_policy_arn) != stack.resolve(boundary.managed_policy_arn):
            raise ValueError(
                f"permissions_boundary: the image {image.node.path} already has the boundary "
                f"{stack.resolve(current.managed_policy_arn)!r} from another fleet; the fleets that run one "
                "image must give the same boundary")
        return
    image._rayito_boundary = boundary
    iam.PermissionsBoundary.of(image).apply(boundary)


def _check_choices(
    *,
    switches: Mapping[str, object],
    image_arn: Optional[str],
    image: Optional[AgentImage],
    max_lifetime_seconds: int,
    choices: Mapping[str, tuple[object, tuple[str, ...]]],
) -> None:
    """The switches are bools, at most one image is given, the lifetime is in range and each
    choice is one of its values; the first mistake is the error."""
    for option, value in switches.items():
        if not isinstance(value, bool):  # "false" is truthy: terminate_strays="false" would end VMs
            raise ValueError(f"{option}: {value!r} is not True or False")
    if image_arn is not None and image is not None:
        raise ValueError("image_arn, image: give at most one of them")
    # Checked with or without a reconciler (FleetReconciler checks it too): a documented range
    # is refused the same way whoever reads it.
    _check_whole("max_lifetime_seconds", max_lifetime_seconds)
    if not 1 <= max_lifetime_seconds <= 28_800:
        raise ValueError(f"max_lifetime_seconds: {max_lifetime_seconds} is not within 1 to 28800 (8 hours)")
    for option, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"{option}: {value!r} is not one of {', '.join(repr(a) for a in allowed)}")


def _check_watched(
    project: AgentProject,
    *,
    reconciler: Optional[bool],
    reconciler_alarms: Optional[bool],
    egress_alarms: Optional[bool],
    saved_queries: object,
) -> None:
    """An alarm asked for by name that nothing could send data to is a mistake, as one on metrics
    that are off is: say so rather than make none."""
    if reconciler_alarms is True and reconciler is False:
        raise ValueError("reconciler_alarms=True: reconciler is False, so there is no reconciler to watch; "
                         "leave reconciler_alarms unset or turn the reconciler on")
    if egress_alarms is True and not project.egress.budgets:
        raise ValueError("egress_alarms=True: the project declares no [[egress.budgets]], so there is no "
                         "envelope to watch; leave egress_alarms unset or declare a budget")
    if not isinstance(saved_queries, bool):  # "false" would be truthy
        raise ValueError(f"saved_queries: {saved_queries!r} is not True or False")


class _FleetGrants(Construct):
    """The ``grant_*`` methods, shared by owned and imported fleets."""

    fleet_name: str
    access: FleetAccess

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """What ``CallerPolicy`` allows: the launcher's and the publisher's paths, and ``rayito
        agent deploy --renew-gateway-keys``."""
        return grant_all(caller_statements(self.access), grantee, self, what="grant_invoke")

    def grant_launch(self, grantee: iam.IGrantable) -> iam.Grant:
        """What ``SandboxLauncherPolicy`` allows: run and drive the fleet's sessions, read and
        delete the recipe, read the sessions' secrets and the session index."""
        return grant_all(launcher_statements(self.access), grantee, self, what="grant_launch")

    def grant_publish(self, grantee: iam.IGrantable) -> iam.Grant:
        """What ``ImagePublisherPolicy`` allows: publish, build and prune the fleet's image."""
        return grant_all(publisher_statements(self.access), grantee, self, what="grant_publish")

    def grant_read_access_token(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read the fleet's access token (``rayito/agents/<name>/access-token``),
        what the product's client needs to reach the fleet's VMs (``RAYITO_ACCESS_TOKEN``)."""
        statements = [Statement("AccessToken", ("secretsmanager:GetSecretValue",), (self.access.access_token_secret_arn,))]
        if self.access.secret_key_arns:
            statements += [s for s in launcher_statements(self.access) if s.sid == "SecretsKey"]
        return grant_all(statements, grantee, self, what="grant_read_access_token")

    @property
    def access_token_secret_name(self) -> str:
        """``rayito/agents/<name>/access-token``."""
        return token_secret_name(self.fleet_name)

    @property
    def recipe_parameter_name(self) -> str:
        """``/rayito/agents/<name>/recipe``."""
        return parameter_name(self.fleet_name)

    @property
    def recipe_parameter_arn(self) -> str:
        """The recipe parameter's ARN."""
        return recipe_parameter_arn(cdk.Stack.of(self), self.fleet_name)


class ImportedAgentFleet(_FleetGrants):
    """A fleet deployed elsewhere, known by name: grants only, nothing is created."""

    def __init__(self, scope: Construct, id: str, *, fleet_name: str, access: FleetAccess) -> None:
        super().__init__(scope, id)
        self.fleet_name = fleet_name
        self.access = access


class AgentFleet(_FleetGrants):
    """One fleet of agent MicroVMs: recipe, policies, execution role and optional metadata index.

    :param project: the agent project (``AgentProject.load(folder, **overrides)``).
    :param image_arn: a MicroVM image published elsewhere. Default: the fleet builds the
        product's agent image (:class:`AgentImage`) when it has a ``rayd``; otherwise the image
        named after the fleet in this account and region (what ``rayito agent deploy`` publishes).
    :param image: an :class:`AgentImage` to run. Default: see ``image_arn``.
    :param build_image: build the product's agent image of the project when neither is given and
        ``rayd`` is. Default: True.
    :param rayd: where the image's ``rayd`` comes from (see :class:`AgentImage`): the product's
        release zip (``rayito.cdk.MicrovmImageArtifact.from_file(path, sha256=...)``) or a
        ``rayito.cdk.RayitoMicrovmImage`` of the app, both composed at synth, or a base image
        already published in the account (:class:`~rayito_constructs.image_composer.PublishedBaseImage`,
        composed at deploy). Default: what the app's context names (``-c base_artifact=PATH
        -c base_artifact_sha256=HEX``, or ``-c base_image=rayito-base-caps``); without either the
        fleet builds no image and runs the one ``rayito agent deploy`` published under its name
        (docs/image.md).
    :param base_image_version: the managed base's major version for a release zip. Default: ``"1"``.
    :param base_rollout: how base VMs move to a new image version: ``on_expiry`` (default) or
        ``rolling`` (a successor starts at once). Parked slots are always replaced first.
    :param execution_role: the role the MicroVMs run as. Default: a new
        :class:`MicrovmExecutionRole` scoped to the image.
    :param metadata_index: create the session index (dedicated sessions). Default: False.
    :param metadata_index_removal_policy: Default: ``RemovalPolicy.RETAIN``.
    :param recipe_key: customer KMS key. It encrypts the recipe, every table the fleet creates (the
        metadata index, the egress budget, and the stack's ledger and control-plane budget) and the
        MicroVMs' log group when the stack owns it; every grant on it names the service it goes
        through (``kms:ViaService``). Default: AWS managed keys.
    :param keep_recipe: keep the recipe when the fleet is deleted. Default: False.
    :param recipe_failure: ``warn``: a recipe that cannot be saved is reported (the stack's
        ``RecipeOutcome``, the writer's log, the ``RecipeNotSaved`` metric and alarm) and the
        deploy goes on, as the product page says; ``fail``: the deploy rolls back, and a recipe
        too large to save is a synth error. Default: ``warn``.
    :param recipe_alarm: an alarm on ``RecipeNotSaved`` (a custom metric: True needs ``metrics``).
        Default: when metrics are on.
    :param build_role: the image build role, for ``ImagePublisherPolicy``'s PassRole (``rayito
        image publish --build-role-arn``). Default: the role of the image the fleet builds, if any.
    :param base_build_role: the role the base image (``rayito-base-caps``) was built with, which
        ``rayito agent build`` passes. Default: ``rayito setup``'s, ``rayito-m0-build-<region>``.
    :param artifact_bucket: where the publisher's ``rayito image publish`` and ``rayito agent
        build`` upload. Default: ``rayito setup``'s bucket, ``rayito-artifacts-<account>-<region>``.
    :param network_connectors: customer network connector ARNs the MicroVMs use. Default: none.
    :param scope_microvm_actions_to_image: MicroVM lifecycle actions on the fleet's image only
        (RunMicrovm on its ARN, the others on its ARN and versions). ``False`` is the opt-out, on
        every image (``"*"``): whoever holds the fleet's policies can then run, reach and end any
        fleet's VMs (docs/iam.md). Default: True.
    :param permissions_boundary: a managed policy set as the permissions boundary of every role
        the fleet creates, now and later (``iam.PermissionsBoundary``), the stack's recipe writer
        included. Fleets that share a stack must share the boundary. Default: none.
    :param own_microvm_log_group: create ``/aws/lambda-microvms/<image name>`` with
        ``microvm_log_retention`` (the VMs' output; docs/image.md for an existing group of that
        name). Default: when the fleet builds its image.
    :param microvm_log_retention: Default: one month.
    :param reconciler: run the reconciler that keeps ``min_vms`` and ``warm_vms``. It keeps the
        fleet its recipe describes, so it needs one: Default: on when the fleet saves a recipe, off
        (warning ``no_reconciler``) when it saves none (``--no-save-recipe``, a recipe too large).
        True without a recipe is an error.
    :param max_lifetime_seconds: ``maximumDurationInSeconds`` of the fleet's VMs, 1 to 28,800 (the
        construct warns ``short_lifetime`` when VMs this short would take the fleet below
        ``min_vms`` at their ends: ``reconciler.short_lifetime_problems``). Default: 28,800.
    :param control_plane_budget: the budget table shared by every reconciler of the account and
        region. Default: one per stack (``ControlPlaneBudget.of``).
    :param control_plane_budgets: ``{operation: (rate, burst)}`` over the documented quotas.
    :param reconciler_alarms: the reconciler's alarms: amplification, deficit, dead-lettered slots
        and strays (custom metrics: True needs ``metrics``), and the dead-letter queue's depth (an
        SQS metric). None: the ones the metrics allow; False: none. Default: None.
    :param share_image: let other fleets of the app run this fleet's image (every fleet on it
        must say so; see ``FleetReconciler``). Default: False.
    :param terminate_strays: let the reconciler end idle foreign VMs of the image. Default: False.
    :param reconciler_watch_seconds: how often a tick looks at the parked slots' VMs for a
        client's take (``FleetReconciler``'s ``watch_seconds``: a take refilled in seconds, at the
        price of ticks that last about 57 of every 60 seconds for a fleet with parked slots); 0 turns
        it off. Default: 5.
    :param reconciler_reserved_concurrency: Default: 1 (``None`` where the account's concurrency
        quota leaves no room to reserve; the image pruner of an image the fleet builds then
        reserves none either).
    :param retain_vms_on_delete: leave the fleet's VMs running when the fleet is deleted (they end
        at their lifetime, at most 8 hours). Default: False: deleting the fleet (its stack, or the
        fleet from a stack) stops its reconciler and terminates every VM it holds, parked ones
        included, before the delete completes (docs/teardown.md). Only with a
        reconciler: without one the stack starts no VMs.
    :param teardown_failure: ``warn``: VMs not confirmed ended within ``teardown_timeout`` are
        reported and the delete goes on; ``fail``: the delete fails. Default: ``warn``.
    :param teardown_timeout: Default: 10 minutes (at most 15).
    :param keep_image_versions: versions the image the fleet builds keeps (1 to 49; ``None``:
        every version); see :class:`AgentImage`. Default: 5.
    :param metrics: the library sends custom metrics (EMF): the reconciler, the recipe writer, and
        the agents' egress recorder (``RAYITO_METRICS`` in the image the fleet builds). Off, none of
        them prints an EMF line: no custom metric, no EMF log bytes; decisions are still logged.
        Their count and monthly cost: docs/operations.md. Default: False (opt-in, as every feature
        of the product page but the recipe).
    :param alarm_actions: what every alarm below the fleet does when it fires: an SNS topic
        (``sns.ITopic`` or its ARN), any ``cloudwatch.IAlarmAction``, or a list of them. Applied by
        an aspect to every alarm below the fleet at synth (the library's, later ones, yours).
        Default: none.
    :param egress_alarms: the egress budget's alarms (custom metrics: True needs ``metrics``).
        Default: when metrics are on.
    :param dashboard: a CloudWatch dashboard of the fleet (``FleetDashboard``; True needs
        ``metrics``). Default: when metrics are on.
    :param saved_queries: the fleet's Logs Insights queries as ``AWS::Logs::QueryDefinition``
        (admission timeline, problems, egress per target; free until run). Default: True.
    :param log_retention: retention of every function log group the library makes for the fleet
        (the reconciler, the stack's recipe writer, any later function below the fleet). The
        MicroVMs' own log group has ``microvm_log_retention``. Default: three months.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        project: AgentProject,
        image_arn: Optional[str] = None,
        image: Optional[AgentImage] = None,
        build_image: bool = True,
        rayd: Any = None,
        base_image_version: str = DEFAULT_BASE_IMAGE_VERSION,
        base_rollout: str = "on_expiry",
        execution_role: Optional[iam.IRole] = None,
        metadata_index: bool = False,
        metadata_index_removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
        recipe_key: Optional[kms.IKey] = None,
        keep_recipe: bool = False,
        build_role: Optional[iam.IRole] = None,
        base_build_role: Optional[iam.IRole] = None,
        artifact_bucket: Optional[s3.IBucket] = None,
        network_connectors: Sequence[str] = (),
        scope_microvm_actions_to_image: bool = True,
        recipe_failure: str = "warn",
        recipe_alarm: Optional[bool] = None,
        permissions_boundary: Optional[iam.IManagedPolicy] = None,
        own_microvm_log_group: Optional[bool] = None,
        microvm_log_retention: logs.RetentionDays = DEFAULT_LOG_RETENTION,
        reconciler: Optional[bool] = None,
        max_lifetime_seconds: int = 28_800,
        control_plane_budget: Optional[dynamodb.ITable] = None,
        control_plane_budgets: Optional[Mapping[str, tuple[float, float]]] = None,
        reconciler_alarms: Optional[bool] = None,
        share_image: bool = False,
        terminate_strays: bool = False,
        reconciler_reserved_concurrency: Optional[int] = 1,
        reconciler_watch_seconds: int = 5,
        retain_vms_on_delete: bool = False,
        teardown_failure: str = "warn",
        teardown_timeout: cdk.Duration = cdk.Duration.minutes(10),
        keep_image_versions: Optional[int] = 5,
        metrics: bool = False,
        alarm_actions: Union[None, AlarmActionLike, Sequence[AlarmActionLike]] = None,
        egress_alarms: Optional[bool] = None,
        dashboard: Optional[bool] = None,
        saved_queries: bool = True,
        log_retention: logs.RetentionDays = DEFAULT_FUNCTION_LOG_RETENTION,
    ) -> None:
        _check_choices(
            switches={"build_image": build_image, "metadata_index": metadata_index, "keep_recipe": keep_recipe,
                      "reconciler": True if reconciler is None else reconciler,
                      "scope_microvm_actions_to_image": scope_microvm_actions_to_image,
                      "share_image": share_image, "terminate_strays": terminate_strays},
            image_arn=image_arn, image=image, max_lifetime_seconds=max_lifetime_seconds,
            choices={"base_rollout": (base_rollout, ("on_expiry", "rolling")),
                     "recipe_failure": (recipe_failure, ("warn", "fail")),
                     "teardown_failure": (teardown_failure, ("warn", "fail"))},
        )
        if rayd is not None and (image is not None or image_arn is not None or not build_image):
            other = "image" if image is not None else "image_arn" if image_arn is not None else "build_image=False"
            raise ValueError(f"rayd, {other}: give one of them (rayd is for the image the fleet builds; {other} "
                             "means it builds none)")
        image_name = image.image_name if image is not None else _image_name(image_arn, project.name)
        _check_operations(metrics, {"reconciler_alarms": reconciler_alarms, "recipe_alarm": recipe_alarm,
                                    "egress_alarms": egress_alarms, "dashboard": dashboard})
        _check_watched(project, reconciler=reconciler, reconciler_alarms=reconciler_alarms,
                       egress_alarms=egress_alarms, saved_queries=saved_queries)
        retention_days(log_retention)  # a logs.RetentionDays, or a one-line error
        if keep_image_versions is not None:
            check_keep(keep_image_versions)  # whether or not this fleet builds an image: a typo is a typo
        retention_days(microvm_log_retention, "microvm_log_retention")
        check_alarm_actions(alarm_actions, region=cdk.Stack.of(scope).region)  # before anything is built
        check_same_environment(scope, "artifact_bucket", artifact_bucket)
        check_same_environment(scope, "control_plane_budget", control_plane_budget)  # the reconciler reaches it by name
        super().__init__(scope, id)
        claim(self, "fleet", project.name)  # one fleet of a name per account and region in an app
        self.operations = Operations.for_fleet(
            self, metrics=metrics, alarm_actions=alarm_actions, log_retention=log_retention, fleet_name=project.name,
        ).attach(self)
        """Metrics, alarm actions and log retention of everything below the fleet (``Operations.of``)."""
        self.metrics = metrics
        """Whether the fleet sends custom metrics."""
        self.permissions_boundary = permissions_boundary
        """The boundary of every role the fleet creates, when given."""
        if permissions_boundary is not None:
            iam.PermissionsBoundary.of(self).apply(permissions_boundary)
        if rayd is None and image is None and image_arn is None and build_image:
            rayd = rayd_from_context(self)
        builds = image is None and image_arn is None and build_image and rayd is not None
        self.egress_budget: Optional[EgressBudget] = (
            EgressBudget(self, "EgressBudget", fleet_name=project.name, envelopes=project.egress.budgets,
                         encryption_key=recipe_key, metrics=metrics, alarms=egress_alarms,
                         # rayd hands the name to every process from the composed zip: a synth value.
                         table_name=egress_table_name(project.name) if builds else None)
            if project.egress.budgets
            else None
        )
        """The per-target egress envelopes, when the project declares ``[[egress.budgets]]``."""
        if builds:
            image = self._build_image(
                project, rayd=rayd, base_image_version=base_image_version, metrics=metrics,
                microvm_log_retention=microvm_log_retention, recipe_key=recipe_key,
                keep_image_versions=keep_image_versions, reconciler_reserved_concurrency=reconciler_reserved_concurrency,
            )
        self._warn_egress_metrics(image, metrics)
        self.image: Optional[AgentImage] = image
        """The image the fleet builds or was given, when there is one."""
        if permissions_boundary is not None and image is not None and self not in image.node.scopes:
            # An image made outside the fleet (AgentImage(stack, ...), then image=): its build and
            # pruner roles are the library's too, and the aspect below the fleet does not reach them.
            _bound_image(image, permissions_boundary)
        if image is not None:
            image_arn = image.image_arn
            build_role = build_role or image.build_role
        self.project = project
        """The project this fleet was built from."""
        self.fleet_name = project.name
        """The fleet's name."""
        self.microvm_log_group: Optional[logs.LogGroup] = getattr(image, "log_group", None)
        """``/aws/lambda-microvms/<image name>``, when the stack owns it."""
        owns_vm_logs = builds if own_microvm_log_group is None else own_microvm_log_group
        if self.microvm_log_group is None and owns_vm_logs and image_name is not None:
            self.microvm_log_group = logs.LogGroup(
                self, "MicrovmLogs", log_group_name=f"{LOG_GROUP_PREFIX}{image_name}",
                retention=microvm_log_retention, removal_policy=cdk.RemovalPolicy.DESTROY,
                # The agents' output (conversations): the customer key, as AgentImage's group has.
                encryption_key=_usable_log_key(self, recipe_key, f"{LOG_GROUP_PREFIX}{image_name}"),
            )
        self.execution_role: iam.IRole = execution_role or MicrovmExecutionRole(
            self, "ExecutionRole", image_name=image_name,
            image_arn=image_arn if image_name is None else None,
            create_log_group=self.microvm_log_group is None,
        )
        """The role the fleet's MicroVMs run as."""
        self.metadata_index: Optional[MetadataIndex] = (
            MetadataIndex(self, "MetadataIndex", encryption_key=recipe_key, removal_policy=metadata_index_removal_policy)
            if metadata_index
            else None
        )
        """The session index, when ``metadata_index=True``."""
        self.access = fleet_access(
            self,
            fleet_name=project.name,
            project=project,
            artifact_bucket_arn=artifact_bucket.bucket_arn if artifact_bucket is not None else None,
            base_build_role=base_build_role,
            image_arn=image_arn,
            execution_role=self.execution_role,
            build_role=build_role,
            network_connectors=network_connectors,
            recipe_key_arn=recipe_key.key_arn if recipe_key else None,
            table_arn=self.metadata_index.table_arn if self.metadata_index else None,
            table_key_arn=recipe_key.key_arn if recipe_key else None,
            scope_microvm_actions_to_image=scope_microvm_actions_to_image,
            build_network_connectors=getattr(image, "egress_network_connectors", ()),
        )
        """The ARNs this fleet's permissions are about."""
        if self.egress_budget is not None:
            # Every agent of the fleet takes tokens from the shared envelopes.
            self.egress_budget.grant_acquire(self.execution_role)
        image_version = image.latest_active_image_version if image is not None else None
        self.image_arn = self.access.image_arns[0]
        """The fleet's MicroVM image ARN."""

        plan = plan_recipe(project, image_version=image_version, builds_image=image is not None)
        reconciler = self._settle_recipe_plan(project, plan, reconciler=reconciler,
                                              reconciler_alarms=reconciler_alarms, recipe_failure=recipe_failure)
        self.recipe: Optional[RecipeParameter] = self._recipe_parameter(
            project, plan, recipe_key=recipe_key, keep_recipe=keep_recipe, recipe_failure=recipe_failure,
            metrics=metrics, log_retention=log_retention, permissions_boundary=permissions_boundary,
            recipe_alarm=recipe_alarm,
        )
        """The recipe parameter, or None when the fleet has no recipe (see the warnings)."""

        self.access_token = FleetAccessToken(self, "AccessToken", fleet_name=project.name, encryption_key=recipe_key)
        """The fleet's access token (its VMs' rayd admits only it): ``rayito/agents/<name>/access-token``."""

        self.caller_policy = CallerPolicy(self, "CallerPolicy", fleet_name=project.name, access=self.access)
        """Managed policy for the deployer and the fleet client."""
        self.image_publisher_policy = ImagePublisherPolicy(
            self, "ImagePublisherPolicy", fleet_name=project.name, access=self.access
        )
        """Managed policy for whoever publishes the fleet's image."""
        self.sandbox_launcher_policy = SandboxLauncherPolicy(
            self, "SandboxLauncherPolicy", fleet_name=project.name, access=self.access
        )
        """Managed policy for what starts and stops the fleet's sandboxes."""
        self.reconciler: Optional[FleetReconciler] = None
        """The reconciler, unless ``reconciler=False``."""
        if reconciler:
            self.reconciler = self._make_reconciler(
                project, max_lifetime_seconds=max_lifetime_seconds, image_version=image_version,
                base_rollout=base_rollout, control_plane_budgets=control_plane_budgets,
                control_plane_budget=control_plane_budget, share_image=share_image,
                terminate_strays=terminate_strays, reconciler_reserved_concurrency=reconciler_reserved_concurrency,
                reconciler_watch_seconds=reconciler_watch_seconds,
                recipe_key=recipe_key, metrics=metrics, log_retention=log_retention,
                reconciler_alarms=reconciler_alarms,
            )
        self.teardown: Optional[FleetTeardown] = None
        """Ends the fleet's VMs when the fleet is deleted (with a reconciler: what it started)."""
        if self.reconciler is not None:
            # The fleet's name in the id: a fleet renamed in place gets a new teardown, and the old
            # one (deleted in the update's cleanup) ends the old fleet's VMs with its own rights.
            self.teardown = FleetTeardown(
                self,
                f"Teardown-{project.name}",
                reconciler=self.reconciler,
                access=self.access,
                depends_on=[d for d in (image, self.execution_role) if d is not None],
                retain_vms_on_delete=retain_vms_on_delete,
                teardown_failure=teardown_failure,
                timeout=teardown_timeout,
                encryption_key=recipe_key,
            )

        self.queries: Optional[FleetQueries] = None
        """The saved Logs Insights queries, unless ``saved_queries=False``."""
        microvm_logs = f"{LOG_GROUP_PREFIX}{image_name}" if image_name is not None and self.egress_budget else None
        if saved_queries and (self.reconciler is not None or microvm_logs is not None):
            self.queries = FleetQueries(
                self, "Queries", fleet_name=project.name,
                reconciler_log_group=self.reconciler.log_group if self.reconciler is not None else None,
                microvm_log_group_name=microvm_logs,
            )
        self.dashboard: Optional[FleetDashboard] = None
        """The fleet's dashboard, with metrics on (unless ``dashboard=False``)."""
        if dashboard is not False and metrics:
            self.dashboard = FleetDashboard(
                self, "Dashboard", fleet_name=project.name, reconciler=self.reconciler, recipe=self.recipe,
                egress_budget=self.egress_budget, queries=self.queries, alarms=self.alarms,
            )

    def _build_image(
        self,
        project: AgentProject,
        *,
        rayd: Any,
        base_image_version: str,
        metrics: bool,
        microvm_log_retention: logs.RetentionDays,
        recipe_key: Optional[kms.IKey],
        keep_image_versions: Optional[int],
        reconciler_reserved_concurrency: Optional[int],
    ) -> AgentImage:
        """The product's agent image of the project, built by the fleet."""
        return AgentImage(
            self,
            "Image",
            project=project,
            rayd=rayd,
            base_image_version=base_image_version,
            # The fleet's own variables, for every process rayd starts (the agents' EmfRecorder
            # and egress client); the project's [env] is the run payload's, never baked.
            template_env={TABLE_ENV: egress_table_name(project.name), METRICS_ENV: metrics_value(metrics),
                          ENVELOPES_ENV: json.dumps(egress_declaration(project.egress), sort_keys=True,
                                                    separators=(",", ":"))} if self.egress_budget else {},
            own_log_group=True,
            log_retention=microvm_log_retention,
            encryption_key=recipe_key,
            keep_image_versions=keep_image_versions,
            pruner_reserved_concurrency=None if reconciler_reserved_concurrency is None else 1,
        )

    def _warn_egress_metrics(self, image: Optional[AgentImage], metrics: bool) -> None:
        """Only an image the fleet builds gets ``RAYITO_METRICS=on`` from it."""
        if self.egress_budget is not None and metrics and not (image is not None and image.node.scope is self):
            cdk.Annotations.of(self).add_warning_v2(
                "rayito:egress_metrics_switch",
                "egress_metrics_switch: the fleet does not build its image, so it cannot set RAYITO_METRICS=on in "
                "it; set it where the image is published (or pass EmfRecorder(metrics=True)), or the egress "
                "alarms and graphs get no data (docs/operations.md)")

    def _settle_recipe_plan(
        self,
        project: AgentProject,
        plan: RecipePlan,
        *,
        reconciler: Optional[bool],
        reconciler_alarms: Optional[bool],
        recipe_failure: str,
    ) -> bool:
        """Warn what the plan warns, and whether the fleet runs a reconciler (None: when it saves a
        recipe); a reconciler without a recipe, or ``recipe_failure='fail'`` with a recipe too
        large, is an error."""
        for warning in (*project.warnings, *plan.warnings):
            cdk.Annotations.of(self).add_warning_v2(f"rayito:{warning.code}", f"{warning.code}: {warning.message}")
        if reconciler is None:
            told = no_reconciler(plan)
            if told is not None:
                cdk.Annotations.of(self).add_warning_v2(f"rayito:{told.code}", f"{told.code}: {told.message}")
                if reconciler_alarms is True:
                    raise ValueError(f"reconciler_alarms=True: {plan.reason}, so there is no reconciler to watch; "
                                     "leave reconciler_alarms unset or save the recipe")
        reconciler = reconciler_on(reconciler, plan)
        if reconciler and plan.encoded is None:
            # The reconciler starts and serves every VM from the project the recipe embeds, and reads
            # the fleet's scaling from it, as the product's client does: without one it starts nothing.
            raise ValueError(reconciler_needs_recipe(plan))
        if recipe_failure == "fail" and plan.document is not None and plan.encoded is None:
            problems = "; ".join(f"{w.code}: {w.message}" for w in plan.warnings if w.code == "recipe_too_large")
            raise ValueError(f"recipe_failure='fail': the recipe cannot be saved ({problems})")
        return reconciler

    def _recipe_parameter(
        self,
        project: AgentProject,
        plan: RecipePlan,
        *,
        recipe_key: Optional[kms.IKey],
        keep_recipe: bool,
        recipe_failure: str,
        metrics: bool,
        log_retention: logs.RetentionDays,
        permissions_boundary: Optional[iam.IManagedPolicy],
        recipe_alarm: Optional[bool],
    ) -> Optional[RecipeParameter]:
        """The recipe parameter (with its alarm when asked), or None when the plan saves no recipe."""
        if plan.encoded is None or plan.document is None:
            return None
        recipe = RecipeParameter(
            self,
            "Recipe",
            fleet_name=project.name,
            recipe=plan.document,
            image_version=plan.image_version,
            encryption_key=recipe_key,
            keep_recipe=keep_recipe,
            recipe_failure=recipe_failure,
            metrics=metrics,
            log_retention=log_retention,
        )
        if permissions_boundary is not None:
            # The writer is the stack's, outside this fleet's scope: the boundary must reach it too.
            recipe.writer.apply_boundary(permissions_boundary)
        if recipe_alarm is not False and metrics:
            recipe.add_alarm(option="recipe_alarm=True")
        return recipe

    def _make_reconciler(
        self,
        project: AgentProject,
        *,
        max_lifetime_seconds: int,
        image_version: Optional[str],
        base_rollout: str,
        control_plane_budgets: Optional[Mapping[str, tuple[float, float]]],
        control_plane_budget: Optional[dynamodb.ITable],
        share_image: bool,
        terminate_strays: bool,
        reconciler_reserved_concurrency: Optional[int],
        reconciler_watch_seconds: int,
        recipe_key: Optional[kms.IKey],
        metrics: bool,
        log_retention: logs.RetentionDays,
        reconciler_alarms: Optional[bool],
    ) -> FleetReconciler:
        """The fleet's reconciler with its alarms, and the ``no_headroom`` note when it applies."""
        reconciler = FleetReconciler(
            self,
            "Reconciler",
            project=project,
            access=self.access,
            execution_role_arn=self.execution_role.role_arn,
            max_lifetime_seconds=max_lifetime_seconds,
            image_version=image_version,
            base_rollout=base_rollout,
            budgets=control_plane_budgets,
            control_plane_budget=control_plane_budget,
            share_image=share_image,
            terminate_strays=terminate_strays,
            reserved_concurrency=reconciler_reserved_concurrency,
            watch_seconds=reconciler_watch_seconds,
            encryption_key=recipe_key,
            metrics=metrics,
            log_retention=log_retention,
        )
        if reconciler_alarms is not False:
            reconciler.add_alarms(custom_metrics=reconciler_alarms, option="reconciler_alarms=True")
        scaling = project.scaling
        if scaling.min_vms and scaling.max_vms <= scaling.min_vms:
            # Told, not warned: 1 and 1 is the default, and `cdk synth --strict` fails on warnings.
            cdk.Annotations.of(self).add_info(
                f"no_headroom: max_vms = min_vms = {scaling.min_vms}: a base VM's successor can start only "
                "once the VM ends (at its lifetime, 8 h at most), so the fleet is one VM short for each "
                "successor's start, about 2 s, and up to about a minute for the first launches of a newly "
                "published image version; max_vms = min_vms + 1 lets successors start before the end "
                "(docs/reconciler.md, 'No room at all')")
        return reconciler

    def grant_read_access_token(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read the fleet's access token (and decrypt it with ``recipe_key``);
        refused, as every ``grant_*`` is, for a principal the grant cannot reach."""
        return checked_grant(grantee, self, lambda: self.access_token.grant_read(grantee), what="grant_read_access_token")

    @property
    def alarms(self) -> list[cloudwatch.Alarm]:
        """Every alarm the fleet made (reconciler, recipe, egress budget)."""
        found: list[cloudwatch.Alarm] = []
        if self.reconciler is not None:
            found += self.reconciler.alarms
        if self.recipe is not None and self.recipe.alarm is not None:
            found.append(self.recipe.alarm)
        if self.egress_budget is not None:
            found += self.egress_budget.alarms
        return found

    @property
    def metadata_table(self) -> Optional[dynamodb.ITable]:
        """The metadata index's table, when there is one."""
        return self.metadata_index.table if self.metadata_index else None

    @classmethod
    def from_fleet_name(
        cls,
        scope: Construct,
        id: str,
        fleet_name: str,
        *,
        image_arn: Optional[str] = None,
        execution_role: Optional[iam.IRole] = None,
        build_role: Optional[iam.IRole] = None,
        recipe_key: Optional[kms.IKey] = None,
        metadata_table: Optional[dynamodb.ITable] = None,
        network_connectors: Sequence[str] = (),
        scope_microvm_actions_to_image: bool = True,
        project: Optional[AgentProject] = None,
        artifact_bucket: Optional[s3.IBucket] = None,
        base_build_role: Optional[iam.IRole] = None,
    ) -> ImportedAgentFleet:
        """A fleet deployed by another stack or app, to grant on by name.

        Pass the same optional resources the fleet was deployed with, so the grants match:
        ``execution_role`` (for ``iam:PassRole``; ``iam.Role.from_role_arn``), ``recipe_key``,
        ``metadata_table`` (``dynamodb.Table.from_table_name``), ``project`` (the secrets its
        sessions read), ``artifact_bucket``, ``build_role`` and ``base_build_role``.
        """
        _image_name(image_arn, fleet_name)
        if project is not None and project.name != fleet_name:
            raise ValueError(f"project: {project.name!r} is not the fleet {fleet_name!r}; give the project the fleet "
                             "was deployed from (its secrets are the ones granted)")
        check_same_environment(scope, "metadata_table", metadata_table)
        check_same_environment(scope, "artifact_bucket", artifact_bucket)
        access = fleet_access(
            scope,
            fleet_name=fleet_name,
            project=project,
            artifact_bucket_arn=artifact_bucket.bucket_arn if artifact_bucket is not None else None,
            base_build_role=base_build_role,
            image_arn=image_arn,
            execution_role=execution_role,
            build_role=build_role,
            network_connectors=network_connectors,
            recipe_key_arn=recipe_key.key_arn if recipe_key else None,
            table_arn=metadata_table.table_arn if metadata_table else None,
            table_key_arn=metadata_table.encryption_key.key_arn if metadata_table and metadata_table.encryption_key else None,
            scope_microvm_actions_to_image=scope_microvm_actions_to_image,
        )
        return ImportedAgentFleet(scope, id, fleet_name=fleet_name, access=access)
