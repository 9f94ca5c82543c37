"""``FleetTeardown``: off means off. Deleting a fleet (its stack, or the fleet from a stack) stops
its reconciler and terminates every VM the fleet's ledger holds before CloudFormation reports the
delete complete (docs/teardown.md).

A ``Custom::RayitoFleetTeardown`` resource per fleet, backed by a function of its own
(``lambdas/reconciler/teardown.py``, from the reconciler's package: the bundled ``lambda-microvms``
model, the ledger's format, the client tokens). The resource depends on the reconciler (function,
schedule, roles), the ledger table, the image, the execution role and its own function and role:
CloudFormation deletes a resource before what it depends on, so the teardown runs first on delete,
while every permission it needs still exists. Its construct id carries the fleet's name: a fleet
renamed in place is a new resource, and the old one's delete (in the update's cleanup) ends the
old fleet's VMs with the old function and its permissions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Optional

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from constructs import Construct, IDependable

from ._function import lazy_string, library_function
from .monitoring import METRICS_ENV, Operations, metrics_value
from .permissions import FleetAccess, Statement, microvm_statements, table_key_statement, wildcard_reasons
from .reconciler import FleetReconciler

RESOURCE_TYPE = "Custom::RayitoFleetTeardown"
FAILURE_MODES = ("warn", "fail")
#: Lambda's own limit; CloudFormation waits for the answer a little longer (``service_timeout``).
MAX_TIMEOUT_SECONDS = 900
SCHEDULER_SERVICE = "scheduler.amazonaws.com"



#: What ending VMs takes, besides ListMicrovms and RunMicrovm (with its PassRole and
#: PassNetworkConnector): never Suspend, Resume or an auth token.
ENDING_ACTIONS = ("lambda:GetMicrovm", "lambda:TerminateMicrovm")


def _ending_only(statements: list[Statement]) -> list[Statement]:
    out = []
    for statement in statements:
        if statement.sid == "Microvms":
            statement = dataclasses.replace(statement, actions=ENDING_ACTIONS)
        elif statement.sid == "MicrovmsOnAnyImage":
            statement = dataclasses.replace(statement, actions=("lambda:RunMicrovm", *ENDING_ACTIONS))
        out.append(statement)
    return out


class FleetTeardown(Construct):
    """Ends a fleet's VMs when the fleet is deleted.

    :param reconciler: the fleet's reconciler (its schedule is disabled, its ledger fenced).
    :param access: the fleet's ARNs (image, execution role, connectors), from ``AgentFleet``.
    :param depends_on: what else must outlive the teardown (the image, the execution role).
    :param retain_vms_on_delete: leave the VMs running when the fleet is deleted (they end at
        their lifetime, at most 8 hours): the behaviour before this construct. Default: False.
    :param teardown_failure: ``warn``: VMs not confirmed ended within ``timeout`` are reported
        (the answer's ``Data``, the log, the ``TeardownVMsNotEnded`` metric) and the delete goes
        on; ``fail``: the delete fails (the stack stays ``DELETE_FAILED``; deleting again runs the
        teardown again). Default: ``warn``.
    :param timeout: how long the teardown may work (the function's timeout, 1 to 15 minutes).
        Default: 10 minutes.
    :param terminate_rate: TerminateMicrovm calls a second (the quota is 10, shared by the
        account). Default: 5.
    :param encryption_key: the ledger's customer key, when it has one. Default: none.

    Nobody should hold ``lambda:InvokeFunction`` on the teardown function: a forged delete request
    ends the fleet's VMs (CloudFormation invokes it with the deployer's rights).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        reconciler: FleetReconciler,
        access: FleetAccess,
        depends_on: Iterable[IDependable] = (),
        retain_vms_on_delete: bool = False,
        teardown_failure: str = "warn",
        timeout: cdk.Duration = cdk.Duration.minutes(10),
        terminate_rate: float = 5.0,
        encryption_key: Optional[kms.IKey] = None,
    ) -> None:
        if not isinstance(retain_vms_on_delete, bool):
            raise ValueError(f"retain_vms_on_delete: {retain_vms_on_delete!r} is not True or False")
        if teardown_failure not in FAILURE_MODES:
            raise ValueError(f"teardown_failure: {teardown_failure!r} is not one of 'warn', 'fail'")
        if not isinstance(timeout, cdk.Duration):
            raise ValueError(f"teardown_timeout: {timeout!r} is not a Duration (cdk.Duration.minutes(10))")
        seconds = timeout.to_seconds()
        if not 60 <= seconds <= MAX_TIMEOUT_SECONDS:
            raise ValueError(f"teardown_timeout: {seconds:g} s is not within 60 to {MAX_TIMEOUT_SECONDS} (Lambda's limit)")
        if not (isinstance(terminate_rate, (int, float)) and 0.1 <= terminate_rate <= 10):
            raise ValueError(f"terminate_rate: {terminate_rate!r} is not within 0.1 to 10 calls a second (the quota is 10)")
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        fleet = reconciler.fleet_name
        ledger = reconciler.ledger_table
        self.fleet_name = fleet
        statements = [
            # RunMicrovm too: a slot whose answer was lost is asked again with its token.
            *_ending_only(microvm_statements(access)),
            Statement("Ledger",
                      ("dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
                      (ledger.table_arn,),
                      {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [fleet]}}),
            Statement("ReconcilerSchedule", ("scheduler:GetSchedule", "scheduler:UpdateSchedule"),
                      (reconciler.schedule.schedule_arn,)),
            # UpdateSchedule passes the schedule's own role again (the target is sent whole).
            Statement("PassScheduleRole", ("iam:PassRole",), (reconciler.schedule_role.role_arn,),
                      {"StringEquals": {"iam:PassedToService": SCHEDULER_SERVICE}}),
            # Whether a delete is an update's rollback (then a fleet that was there before stays).
            Statement("StackStatus", ("cloudformation:DescribeStacks",), (cdk.Aws.STACK_ID,)),
        ]
        key = encryption_key or ledger.encryption_key
        if key is not None:
            statements.append(table_key_statement("TablesKey", key.key_arn, stack.region))
        made = library_function(
            self,
            name="reconciler",
            as_package=True,
            handler="reconciler.teardown.handler",
            description=f"Rayito fleet teardown: ends fleet {fleet}'s VMs when the fleet is deleted",
            role_description=f"Rayito fleet teardown of {fleet}: stops its reconciler and ends its VMs",
            statements=statements,
            wildcard_reasons=wildcard_reasons(statements),
            timeout=timeout,
            environment={
                "FLEET_NAME": fleet,
                "IMAGE_ARN": access.image_arn,
                "LEDGER_TABLE": ledger.table_name,
                "SCHEDULE_NAME": reconciler.schedule.schedule_name,
                "SCHEDULE_GROUP": "default",
                "STACK_ID": cdk.Aws.STACK_ID,
                "RESOURCES": lazy_string(self._resource_map),
                "TERMINATE_RATE": f"{float(terminate_rate):g}",
                METRICS_ENV: metrics_value(Operations.of(scope).metrics),
            },
            retry_attempts=0,  # CloudFormation's request is answered once; a retry would answer twice
        )
        self.function = made.function
        """The teardown function."""
        self.role = made.role
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={
                "FleetName": fleet,
                "LedgerTable": ledger.table_name,
                "ImageArn": access.image_arn,
                "RetainVms": "true" if retain_vms_on_delete else "false",
                "FailureMode": teardown_failure,
            },
            # The function answers within its timeout; this bounds a lost answer too.
            service_timeout=cdk.Duration.seconds(seconds + 120),
        )
        # Deleted first, while what it stops, reads and ends (and its own permissions) exist.
        for dependable in (made.role, made.function, reconciler, ledger, *depends_on):
            if isinstance(dependable, Construct) and cdk.Stack.of(dependable) is not stack:
                continue  # another stack's (an imported table or role): it outlives this one anyway
            self.resource.node.add_dependency(dependable)

    def _resource_map(self) -> str:
        stack = cdk.Stack.of(self)
        cfn = self.resource.node.default_child
        return json.dumps({stack.resolve(stack.get_logical_id(cfn)): self.fleet_name}, separators=(",", ":"))

    @property
    def outcome(self) -> str:
        """``armed`` after a create or an update."""
        return self.resource.get_att_string("Outcome")
