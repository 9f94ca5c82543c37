"""The three managed policies of the product page: ``CallerPolicy``, ``ImagePublisherPolicy`` and
``SandboxLauncherPolicy``.

Each is usable for one fleet (``fleet_name="mi-agente"``: its recipe parameter and its image only)
or account-wide (``fleet_name=None``: ``parameter/rayito/agents/*`` and every MicroVM image).
The statements come from :mod:`rayito_constructs.permissions`; ``docs/iam.md`` explains each.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from ._nag import acknowledge_statements
from .permissions import (
    FleetAccess,
    Statement,
    caller_statements,
    check_same_environment,
    fleet_access,
    launcher_statements,
    publisher_statements,
    wildcard_reasons,
)
from .policy_size import MANAGED_POLICY_LIMIT, check_size


class _FleetPolicy(iam.ManagedPolicy):
    _statements: Callable[[FleetAccess], list[Statement]]
    _description: str

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        fleet_name: Optional[str] = None,
        image_arn: Optional[str] = None,
        execution_role: Optional[iam.IRole] = None,
        build_role: Optional[iam.IRole] = None,
        network_connectors: Sequence[str] = (),
        recipe_key: Optional[kms.IKey] = None,
        metadata_table: Optional[dynamodb.ITable] = None,
        scope_microvm_actions_to_image: bool = True,
        build_network_connectors: Sequence[str] = (),
        project: Any = None,
        artifact_bucket: Optional[s3.IBucket] = None,
        base_build_role: Optional[iam.IRole] = None,
        managed_policy_name: Optional[str] = None,
        access: Optional[FleetAccess] = None,
    ) -> None:
        """
        :param fleet_name: the fleet these permissions are for. Default: every fleet of the
            account (``parameter/rayito/agents/*``, every MicroVM image).
        :param image_arn: the fleet's MicroVM image. Default: the image named after the fleet in
            this account and region (every image when ``fleet_name`` is None).
        :param execution_role: the role the fleet's MicroVMs run as; adds ``iam:PassRole`` on it.
            Default: no PassRole (MicroVMs run without AWS credentials).
        :param build_role: the image build role (ImagePublisherPolicy). Default: no PassRole.
        :param network_connectors: customer network connector ARNs passed to RunMicrovm, besides
            the AWS-managed ones. Default: none.
        :param recipe_key: customer KMS key of the recipe. Default: ``aws/ssm``, no KMS permission.
        :param metadata_table: the fleet's metadata index. Default: none.
        :param scope_microvm_actions_to_image: the MicroVM lifecycle actions on the image's ARN
            (RunMicrovm on the unversioned ARN, the others on the ARN and its versions). ``False``
            is the opt-out: every image of the account (``Resource: "*"``), for accounts that
            need it; one fleet's holder can then run, reach and end any fleet's VMs
            (docs/iam.md). Default: True.
        :param build_network_connectors: customer connectors the image build uses
            (ImagePublisherPolicy's ``PassBuildNetworkConnectors``, besides ``INTERNET_EGRESS``).
            Default: none.
        :param project: the fleet's :class:`~rayito_constructs.model.project.AgentProject`: names the
            fleet (unless ``fleet_name`` does), the secrets its sessions read (each gateway's
            ``rayito/<secret>``, each ``secret_env`` id) and the base image of ``rayito agent
            build``. Default: none (no gateway or ``secret_env`` secret is granted).
        :param artifact_bucket: where ``rayito image publish`` and ``rayito agent build`` upload
            (``ImagePublisherPolicy``, ``CallerPolicy``). Default: ``rayito setup``'s bucket,
            ``rayito-artifacts-<account>-<region>``.
        :param base_build_role: the role the base image was built with, which ``rayito agent
            build`` passes. Default: ``rayito setup``'s, ``rayito-m0-build-<region>``.
        :param managed_policy_name: Default: a name CloudFormation generates.
        :param access: the gathered ARNs, instead of the parameters above (used by AgentFleet).
        """
        if project is not None and fleet_name is None:
            fleet_name = project.name
        check_same_environment(scope, "metadata_table", metadata_table)
        check_same_environment(scope, "artifact_bucket", artifact_bucket)
        if access is None:
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
                table_key_arn=_table_key_arn(metadata_table),
                scope_microvm_actions_to_image=scope_microvm_actions_to_image,
                build_network_connectors=build_network_connectors,
            )
        statements = type(self)._statements(access)
        kind = type(self).__name__
        document = iam.PolicyDocument(statements=[s.to_policy_statement() for s in statements])
        check_size(scope, f"{kind} {id}", document, MANAGED_POLICY_LIMIT,
                   hint="fewer secret_env secrets, connectors or secrets per fleet, or split the fleet")
        super().__init__(
            scope,
            id,
            managed_policy_name=managed_policy_name,
            description=self._description + (f" ({fleet_name})" if fleet_name else " (every fleet)"),
            statements=[s.to_policy_statement() for s in statements],
        )
        self.access = access
        """The ARNs this policy is about."""
        # cdk-nag: each wildcard statement is vouched for on its own (Sid, actions, resources);
        # a statement added later with a wildcard keeps its finding.
        acknowledge_statements(self, statements, wildcard_reasons(statements))


def _table_key_arn(table: Optional[dynamodb.ITable]) -> Optional[str]:
    key = table.encryption_key if table is not None else None
    return key.key_arn if key is not None else None


class CallerPolicy(_FleetPolicy):
    """For the deployer and the fleet client: route, connect, grow the fleet, write its recipe."""

    _statements = staticmethod(caller_statements)
    _description = "Rayito CallerPolicy: route to, connect to and grow an agent fleet, save its recipe"


class ImagePublisherPolicy(_FleetPolicy):
    """For whoever publishes the agent's MicroVM image: images, versions, builds, the recipe."""

    _statements = staticmethod(publisher_statements)
    _description = "Rayito ImagePublisherPolicy: create and manage an agent's MicroVM image, save its recipe"


class SandboxLauncherPolicy(_FleetPolicy):
    """For what starts and stops sandboxes: the MicroVM lifecycle, and reading (never writing) the
    recipe (the AgentRecipe statement)."""

    _statements = staticmethod(launcher_statements)
    _description = "Rayito SandboxLauncherPolicy: create, list, connect to, suspend, resume and kill sandboxes"
