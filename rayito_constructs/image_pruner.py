"""``ImagePruner``: an image keeps ``keep_image_versions`` versions; older ones are deleted, oldest
first, one at a time, never the one the fleet runs or rolls to, never one with a live VM
(docs/image.md "Old versions").

A function per image (``lambdas/reconciler/pruner.py``, from the reconciler's package for the
bundled ``lambda-microvms`` model), run

* by ``Custom::RayitoImagePruner`` **before each build**: the image depends on it, and its
  ``ImageDigest`` (a digest of the image's properties) changes whenever the image will build a new
  version, so the pruner makes room first (``keep - 1`` versions, ``keep`` after the build; an
  image at the quota of 50 can still take the new one). It never fails a deploy;
* by an EventBridge schedule (``prune_every``, hourly by default) for what a deploy left:
  versions whose VMs have ended since.

It needs no fleet and no reconciler: it reads the image's versions and VMs itself.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import aws_cdk as cdk
from constructs import Construct

from ._function import lazy_string, library_function, scheduled_invoke
from .monitoring import METRICS_ENV, Operations, metrics_value
from .model.names import fleet_name_problem
from .permissions import LIST_ACTIONS, Statement, image_and_versions, wildcard_reasons

RESOURCE_TYPE = "Custom::RayitoImagePruner"
#: An image holds at most 50 versions (quota), and a deploy needs room for one more.
MAX_KEEP = 49
PRUNE_ACTIONS = (
    "lambda:GetMicrovmImage",
    "lambda:ListMicrovmImageVersions",
    "lambda:UpdateMicrovmImageVersion",
    "lambda:DeleteMicrovmImageVersion",
)



def check_keep(keep: object) -> int:
    """``keep_image_versions`` as a whole number within 1 to 49, or the error that says why not."""
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
        raise ValueError(
            f"keep_image_versions: {keep!r} is not a whole number within 1 to {MAX_KEEP} (an image holds at most "
            "50 versions and a deploy needs room for one more); None turns pruning off"
        )
    return keep


class ImagePruner(Construct):
    """Deletes an image's old versions.

    :param image_name: the image's name (its ARN is built from it: the image depends on the
        pruner, so the pruner cannot read the image's attributes).
    :param keep_image_versions: how many versions to keep, 1 to 49. Default: 5.
    :param digest: changes whenever the image builds a new version (``AgentImage`` gives a
        digest of its properties).
    :param prune_every: how often the schedule runs. Default: one hour.
    :param timeout: how long one run may work. Default: 10 minutes.
    :param deploy_budget: how long a deploy waits for pruning (46 deletes, from an image at the
        quota of 50, take about 4.5 minutes: one at a time, 5.4 s each). Default: 8 minutes.
    :param reserved_concurrency: 1 runs one pass at a time: a deploy's pass (CloudFormation
        invokes asynchronously) waits in Lambda's queue for a scheduled pass still deleting, which
        would otherwise leave the image UPDATING after the deploy's pass answered, and the build
        that follows would fail on a ConflictException. ``None`` where the account's concurrency
        quota leaves no room to reserve (then a scheduled pass may overlap a deploy). Default: 1.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image_name: str,
        keep_image_versions: int = 5,
        digest: str,
        prune_every: cdk.Duration = cdk.Duration.hours(1),
        timeout: cdk.Duration = cdk.Duration.minutes(10),
        deploy_budget: cdk.Duration = cdk.Duration.minutes(8),
        reserved_concurrency: Optional[int] = 1,
    ) -> None:
        keep = check_keep(keep_image_versions)
        if reserved_concurrency is not None and (isinstance(reserved_concurrency, bool)
                                                 or not isinstance(reserved_concurrency, int) or reserved_concurrency < 1):
            raise ValueError(f"reserved_concurrency: {reserved_concurrency!r} is not a whole number of at least 1 "
                             "(None: no reservation)")
        if not 60 <= timeout.to_seconds() <= 900:
            raise ValueError(f"timeout: {timeout.to_seconds():g} s is not within 60 to 900 (Lambda's limit)")
        if deploy_budget.to_seconds() > timeout.to_seconds() - 30:
            raise ValueError("deploy_budget: must leave 30 s of the timeout to answer CloudFormation")
        if prune_every.to_seconds() < 300:
            raise ValueError(f"prune_every: {prune_every.to_seconds():g} s is more often than every 5 minutes")
        if fleet_name_problem(image_name):  # a pattern (agente*) would let it delete other images' versions
            raise ValueError(f"image_name: {image_name!r} is not a MicroVM image name (1 to 64 letters, digits, '-' or '_')")
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        self.image_name = image_name
        self.keep_image_versions = keep
        image_arn = stack.format_arn(service="lambda", resource="microvm-image", resource_name=image_name,
                                     arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
        statements = [
            Statement("ListMicrovms", LIST_ACTIONS, ("*",)),
            Statement("MicrovmImages", PRUNE_ACTIONS, image_and_versions(image_arn)),
        ]
        made = library_function(
            self,
            name="reconciler",
            as_package=True,
            handler="reconciler.pruner.handler",
            description=f"Rayito image pruner: keeps the newest {keep} versions of image {image_name}",
            role_description=f"Rayito image pruner of {image_name}: deletes its old versions",
            statements=statements,
            wildcard_reasons=wildcard_reasons(statements),
            timeout=timeout,
            environment={
                "IMAGE_ARN": image_arn,
                "IMAGE_NAME": image_name,
                "KEEP_VERSIONS": str(keep),
                "STACK_ID": cdk.Aws.STACK_ID,
                "RESOURCES": lazy_string(self._resource_map),
                "DEPLOY_BUDGET_SECONDS": f"{deploy_budget.to_seconds():g}",
                METRICS_ENV: metrics_value(Operations.of(scope).metrics),
            },
            retry_attempts=0,  # the next scheduled run tries again; a CloudFormation request is answered once
            reserved_concurrency=reserved_concurrency,
        )
        self.function = made.function
        """The pruner function."""
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type=RESOURCE_TYPE,
            properties={"ImageName": image_name, "KeepVersions": str(keep), "ImageDigest": digest},
            # A deploy's pass may wait in the queue for a scheduled pass (a whole timeout at most)
            # and for Lambda's retry of the throttled event (backoff up to 5 minutes).
            service_timeout=cdk.Duration.seconds(min(3600, (2 * timeout.to_seconds() + 360) if reserved_concurrency
                                                     else timeout.to_seconds() + 60)),
        )
        self.resource.node.add_dependency(made.role)
        self.schedule, _ = scheduled_invoke(
            self, self.function, what=f"image pruner of {image_name}", kind="pruner", description=f"Rayito image pruner of {image_name}",
            rate=prune_every, event={"source": "schedule", "image": image_name}, max_event_age=cdk.Duration.minutes(5))

    def _resource_map(self) -> str:
        stack = cdk.Stack.of(self)
        cfn = self.resource.node.default_child
        return json.dumps({stack.resolve(stack.get_logical_id(cfn)): self.image_name}, separators=(",", ":"))


def properties_digest(scope: Construct, resource: cdk.CfnResource, *inputs: Any) -> str:
    """A digest of ``resource``'s properties as synthesized (lazily: after every change to it),
    and of the ``inputs`` resources' properties when what it builds depends on them too (an image
    whose code a custom resource composes at deploy: its properties name only the answer)."""
    stack = cdk.Stack.of(scope)

    def produce() -> str:
        properties = stack.resolve(resource._cfn_properties)  # noqa: SLF001 - the L1's own view
        if inputs:
            properties = [properties, *(stack.resolve(other._cfn_properties) for other in inputs)]  # noqa: SLF001
        return hashlib.sha256(json.dumps(properties, sort_keys=True, default=str).encode()).hexdigest()

    return lazy_string(produce)
