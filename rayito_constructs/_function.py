"""One way to make the small Lambda functions this library deploys (reconciler, recipe writer and
any later one): the same runtime, role, log group and cdk-nag treatment for each.

Every function gets

* its own role, trusted by ``lambda.amazonaws.com`` only, whose every statement has a Sid and is
  given by the caller as :class:`~rayito_constructs.permissions.Statement`\\ s; each statement with
  a wildcard is vouched for on its own for cdk-nag (Sid, actions, resources), with the reason the
  caller gives: a statement added to the role later keeps its finding (``_nag``);
* its own log group (deleted with the stack), JSON log format, kept for the retention given or
  else the one of the fleet above it (``Operations.of``: ``AgentFleet(log_retention=...)``), so a
  function added later follows the fleet's setting without being told;
* Python 3.14 on arm64, code taken from ``lambdas/<name>`` as it is (no Docker, no bundling);
* recursive-loop protection and, when asked, reserved concurrency.

Permissions boundaries are not handled here: ``AgentFleet``/``FleetStack`` apply
``iam.PermissionsBoundary.of(scope)``, which reaches every role below that scope, today's and
tomorrow's, including the roles made through this module.

The child construct ids are ``Logs``, ``Role`` and ``Function``, under the scope given, so moving an
existing function onto this helper keeps its logical ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

import aws_cdk as cdk
import jsii
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from ._assets import lambda_code_dir
from ._nag import acknowledge_statements, acknowledge_wildcard_resources
from .monitoring import DEFAULT_LOG_RETENTION as DEFAULT_LOG_RETENTION  # re-exported
from .monitoring import Operations
from .permissions import Statement

#: The runtime and architecture of every function of the library.
RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64
_EXCLUDE = ["__pycache__", "**/__pycache__", "*.pyc"]


@dataclass(frozen=True)
class LibraryFunction:
    """What :func:`library_function` made."""

    function: lambda_.Function
    role: iam.Role
    log_group: logs.LogGroup


def function_code(name: str, *, as_package: bool = False) -> lambda_.Code:
    """The code of ``lambdas/<name>``: the folder itself (handler ``index.handler``), or, with
    ``as_package``, its parent with only that folder in it (handler ``<name>.index.handler``, for
    code that uses relative imports)."""
    folder = lambda_code_dir(name)
    if as_package:
        return lambda_.Code.from_asset(str(folder.parent), exclude=["*", f"!{name}", f"!{name}/**", *_EXCLUDE])
    return lambda_.Code.from_asset(str(folder), exclude=_EXCLUDE)


def add_statements(role: iam.Role, statements: Iterable[Statement], reasons: Mapping[str, str]) -> None:
    """Add each statement to ``role`` and vouch for each one that holds a wildcard, with its
    Sid's reason.

    A wildcard in a statement whose Sid has no reason is a synth error: a new wildcard must come
    with its justification, never pass silently.
    """
    statements = list(statements)
    acknowledge_statements(role, statements, reasons)
    for statement in statements:
        role.add_to_policy(statement.to_policy_statement())


def library_function(
    scope: Construct,
    *,
    name: str,
    description: str,
    role_description: str,
    statements: Sequence[Statement] = (),
    wildcard_reasons: Optional[Mapping[str, str]] = None,
    handler: Optional[str] = None,
    as_package: bool = False,
    timeout: cdk.Duration = cdk.Duration.seconds(60),
    memory_size: int = 256,
    environment: Optional[Mapping[str, str]] = None,
    layers: Sequence[lambda_.ILayerVersion] = (),
    log_retention: Optional[logs.RetentionDays] = None,
    reserved_concurrency: Optional[int] = None,
    **function_props: object,
) -> LibraryFunction:
    """Make the log group, the role and the function of ``lambdas/<name>`` under ``scope``.

    :param name: the folder under ``lambdas/``.
    :param statements: the role's permissions, each with a Sid (``Logs`` is added here).
    :param wildcard_reasons: ``{sid: reason}`` for every statement with a ``*`` in a resource.
    :param handler: Default: ``index.handler`` (``<name>.index.handler`` with ``as_package``).
    :param log_retention: Default: the fleet's (``Operations.of(scope)``), three months outside a
        fleet (``DEFAULT_LOG_RETENTION``).
    :param function_props: other ``lambda_.Function`` keyword arguments (retries, destinations...).
    """
    retention = log_retention if log_retention is not None else Operations.of(scope).log_retention
    log_group = logs.LogGroup(scope, "Logs", retention=retention, removal_policy=cdk.RemovalPolicy.DESTROY)
    role = iam.Role(scope, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=role_description)
    role.add_to_policy(
        iam.PolicyStatement(sid="Logs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                            resources=[log_group.log_group_arn])
    )
    add_statements(role, statements, wildcard_reasons or {})
    function = lambda_.Function(
        scope,
        "Function",
        description=description,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler=handler or (f"{name}.index.handler" if as_package else "index.handler"),
        code=function_code(name, as_package=as_package),
        role=role,
        timeout=timeout,
        memory_size=memory_size,
        environment=dict(environment) if environment else None,
        layers=list(layers) or None,
        log_group=log_group,
        logging_format=lambda_.LoggingFormat.JSON,
        recursive_loop=lambda_.RecursiveLoop.TERMINATE,
        reserved_concurrent_executions=reserved_concurrency,
        **function_props,
    )
    return LibraryFunction(function=function, role=role, log_group=log_group)


def lazy_string(produce: Callable[[], str]) -> str:
    """A string token whose value ``produce()`` gives when the template is written (a resource
    map that names logical ids, known only once the tree is complete)."""
    return cdk.Lazy.string(_StringProducer(produce))


@jsii.implements(cdk.IStableStringProducer)
class _StringProducer:
    def __init__(self, produce: Callable[[], str]) -> None:
        self._produce = produce

    def produce(self) -> str:
        return self._produce()


def scheduled_invoke(
    scope: Construct,
    function: lambda_.IFunction,
    *,
    what: str,
    kind: str,
    description: str,
    rate: cdk.Duration,
    event: Mapping[str, str],
    max_event_age: cdk.Duration,
    dead_letter_queue: Optional[sqs.IQueue] = None,
) -> tuple[scheduler.Schedule, iam.Role]:
    """An EventBridge Scheduler schedule that invokes ``function`` every ``rate`` with ``event``,
    once (no retry: the next one comes), and its role: trusted by the scheduler of this account
    only, allowed to invoke this function (CDK grants its versions too, ``<ARN>:*``, vouched for
    cdk-nag as ``the versions of this <kind> function only``). Construct ids ``ScheduleRole`` and
    ``Schedule`` under ``scope``."""
    role = iam.Role(
        scope,
        "ScheduleRole",
        assumed_by=iam.PrincipalWithConditions(
            iam.ServicePrincipal("scheduler.amazonaws.com"),
            {"StringEquals": {"aws:SourceAccount": cdk.Stack.of(scope).account}},
        ),
        description=f"Rayito: EventBridge Scheduler invokes the {what}",
    )
    acknowledge_wildcard_resources(role, [f"{function.function_arn}:*"], f"the versions of this {kind} function only")
    schedule = scheduler.Schedule(
        scope,
        "Schedule",
        description=description,
        schedule=scheduler.ScheduleExpression.rate(rate),
        target=scheduler_targets.LambdaInvoke(
            function,
            retry_attempts=0,
            max_event_age=max_event_age,
            dead_letter_queue=dead_letter_queue,
            input=scheduler.ScheduleTargetInput.from_object(dict(event)),
            role=role,
        ),
    )
    return schedule, role
