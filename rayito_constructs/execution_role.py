"""``MicrovmExecutionRole``: the IAM role a fleet's MicroVMs run as.

The MicroVMs service assumes it with ``sts:AssumeRole`` and ``sts:TagSession`` as
``lambda.amazonaws.com``; the trust carries confused-deputy conditions (``aws:SourceAccount`` and
``aws:SourceArn`` on this account's MicroVM images). Its only permission is to ship the VMs'
stdout and stderr to the image's log group ``/aws/lambda-microvms/<image name>``; add what the
agent itself needs with ``add_to_policy``.
"""

from __future__ import annotations

from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from ._nag import acknowledge_wildcard_resources
from .permissions import LAMBDA_SERVICE, image_arn_for


class MicrovmExecutionRole(iam.Role):
    """The role of a fleet's MicroVMs.

    :param image_name: the MicroVM image's name; scopes the trust (``aws:SourceArn``) and the log
        group. Default: every MicroVM image of this account and region.
    """

    def __init__(self, scope: Construct, id: str, *, image_name: Optional[str] = None, description: Optional[str] = None) -> None:
        stack = cdk.Stack.of(scope)
        source_arn = image_arn_for(stack, image_name) + ("*" if image_name else "")
        principal = iam.SessionTagsPrincipal(
            iam.PrincipalWithConditions(
                iam.ServicePrincipal(LAMBDA_SERVICE),
                {
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {"aws:SourceArn": source_arn},
                },
            )
        )
        super().__init__(
            scope,
            id,
            assumed_by=principal,
            description=description or "Rayito: the role a fleet's MicroVMs run as",
        )
        log_streams = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/lambda-microvms/{image_name or '*'}:*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.add_to_policy(
            iam.PolicyStatement(
                sid="MicrovmLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_streams],
            )
        )
        acknowledge_wildcard_resources(
            self, [log_streams], "the log streams of the image's own log group (/aws/lambda-microvms/<image>:*)"
        )
