"""``MicrovmExecutionRole``: the IAM role a fleet's MicroVMs run as.

The MicroVMs service assumes it with ``sts:AssumeRole`` and ``sts:TagSession`` as
``lambda.amazonaws.com``; the trust carries confused-deputy conditions: ``aws:SourceAccount`` equals
the account and ``aws:SourceArn`` is the fleet's image ARN or one of its versions (``<arn>:*``),
never a name prefix (``<name>*`` would also let ``<name>-dev`` and ``<name>2`` assume it). Its only
permission ships the VMs' stdout and stderr to the image's log group
``/aws/lambda-microvms/<image name>`` (the measured default group, ground truth section 8); add
what the agent itself needs with ``add_to_policy``.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from ._nag import acknowledge_statements
from .model.names import fleet_name_problem
from .permissions import LAMBDA_SERVICE, Statement, _check_image_arn, image_arn_for, source_arn_condition

LOG_GROUP_PREFIX = "/aws/lambda-microvms/"


def image_name_of(image_arn: str) -> str:
    """The image's name in its ARN (a CloudFormation expression when the ARN is a token)."""
    if cdk.Token.is_unresolved(image_arn):
        return cdk.Fn.select(6, cdk.Fn.split(":", image_arn))
    return image_arn.split(":microvm-image:", 1)[1].split(":", 1)[0]


def microvm_log_streams_arn(stack: cdk.Stack, image_name: Optional[str]) -> str:
    """The log streams of ``/aws/lambda-microvms/<image name>`` (of every image's group with None)."""
    return stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=f"{LOG_GROUP_PREFIX}{image_name or '*'}:*",
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )


class MicrovmExecutionRole(iam.Role):
    """The role of a fleet's MicroVMs.

    :param image_name: the MicroVM image's name; scopes the trust (``aws:SourceArn``) and the log
        group. Default: the name in ``image_arn``, else every MicroVM image of this account and
        region.
    :param image_arn: the image's ARN, when it is not in this account and region or is a token.
        Default: the ARN of ``image_name`` in this account and region.
    :param create_log_group: let the VMs create their log group (``logs:CreateLogGroup``). Pass
        False when the stack owns the group (``AgentImage`` makes it): a VM that outlives a
        deleted stack then cannot recreate a group with no retention. Default: True.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image_name: Optional[str] = None,
        image_arn: Optional[str] = None,
        create_log_group: bool = True,
        description: Optional[str] = None,
    ) -> None:
        stack = cdk.Stack.of(scope)
        # A name pattern ("agente*") or "" would make the trust a prefix or every image: refused.
        if image_name is not None and not cdk.Token.is_unresolved(image_name) and fleet_name_problem(image_name):
            raise ValueError(f"image_name: {image_name!r} is not a MicroVM image name (1 to 64 letters, digits, "
                             "'-' or '_'): the trust names microvm-image:<name> exactly; None trusts every image")
        _check_image_arn(image_arn)
        if image_arn is not None and image_name is None:
            image_name = image_name_of(image_arn)
        source_arn = image_arn or image_arn_for(stack, image_name)
        principal = iam.SessionTagsPrincipal(
            iam.PrincipalWithConditions(iam.ServicePrincipal(LAMBDA_SERVICE), source_arn_condition(stack, source_arn))
        )
        super().__init__(
            scope,
            id,
            assumed_by=principal,
            description=description or "Rayito: the role a fleet's MicroVMs run as",
        )
        actions = ("logs:CreateLogStream", "logs:PutLogEvents")
        if create_log_group:
            actions = ("logs:CreateLogGroup", *actions)
        logs = Statement("MicrovmLogs", actions, (microvm_log_streams_arn(stack, image_name),))
        self.add_to_policy(logs.to_policy_statement())
        acknowledge_statements(
            self, [logs], {"MicrovmLogs": "the log streams of the image's own log group (/aws/lambda-microvms/<image>:*)"}
        )
