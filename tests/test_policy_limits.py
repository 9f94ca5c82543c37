"""What a policy cannot hold or reach is a one-line synth error, naming it: a principal the
statements cannot land on, a secret, bucket or table of another account or region, and a policy
over IAM's size limits."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from rayito_constructs import AgentFleet, AgentProject
from rayito_constructs.policy_size import MANAGED_POLICY_LIMIT, check_size, estimated_size

from .cdk_helpers import new_app, new_stack
from .conftest import EXAMPLE
from .projects import project_with

ROLE = "arn:aws:iam::123456789012:role/elsewhere"


@pytest.fixture
def fleet():
    app = new_app()
    stack = new_stack(app)
    return stack, AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))


def one_line(info: pytest.ExceptionInfo) -> str:
    (line,) = str(info.value).splitlines()
    return line


@pytest.mark.parametrize("method", ["grant_launch", "grant_invoke", "grant_publish", "grant_read_access_token"])
def test_an_immutable_imported_role_cannot_be_granted_to(fleet, method) -> None:
    """Every grant_* method, the access token's included (it used the secret's own grant_read,
    which CDK reports as a success on a principal that took nothing)."""
    stack, agent_fleet = fleet
    frozen = iam.Role.from_role_arn(stack, "Frozen", ROLE, mutable=False)
    with pytest.raises(ValueError) as info:
        getattr(agent_fleet, method)(frozen)
    line = one_line(info)
    assert line.startswith(f"{method}: {ROLE} cannot be granted to") and "SandboxLauncherPolicyArn" in line


def test_the_access_token_is_granted_to_a_role_of_the_stack(fleet) -> None:
    stack, agent_fleet = fleet
    role = iam.Role(stack, "Reader", assumed_by=iam.AccountRootPrincipal())
    assert agent_fleet.grant_read_access_token(role).success
    with pytest.raises(ValueError, match="^grant_read_access_token: .* is of another account"):
        agent_fleet.grant_read_access_token(iam.User.from_user_arn(stack, "Them", "arn:aws:iam::210987654321:user/them"))


def test_a_role_of_another_account_cannot_be_granted_to(fleet) -> None:
    stack, agent_fleet = fleet
    other = iam.Role.from_role_arn(stack, "Other", "arn:aws:iam::210987654321:role/theirs")
    with pytest.raises(ValueError, match="cannot be granted to"):
        agent_fleet.grant_invoke(other)
    with pytest.raises(ValueError, match="cannot be granted to"):
        agent_fleet.grant_publish(iam.AccountPrincipal("210987654321"))


def test_a_mutable_imported_role_of_the_account_is_granted_to(fleet) -> None:
    stack, agent_fleet = fleet
    role = iam.Role.from_role_arn(stack, "Mine", ROLE)
    assert agent_fleet.grant_launch(role).success


def test_a_table_or_bucket_of_another_region_is_refused() -> None:
    app = new_app()
    stack = new_stack(app)
    table = dynamodb.Table.from_table_arn(stack, "Far", "arn:aws:dynamodb:eu-west-1:123456789012:table/sessions")
    with pytest.raises(ValueError) as info:
        AgentFleet.from_fleet_name(stack, "Imported", "mi-agente", metadata_table=table)
    line = one_line(info)
    assert line.startswith("metadata_table: ") and "region eu-west-1, not the stack's us-east-1" in line
    elsewhere = cdk.Stack(app, "Elsewhere", env=cdk.Environment(account="210987654321", region="us-east-1"))
    bucket = s3.Bucket(elsewhere, "Artifacts")
    with pytest.raises(ValueError) as info:
        AgentFleet(new_stack(app, "Second"), "Fleet", project=AgentProject.load(EXAMPLE), artifact_bucket=bucket)
    assert one_line(info).startswith("artifact_bucket: ") and "account 210987654321" in str(info.value)


def test_a_secret_env_id_of_another_region_is_refused() -> None:
    far = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:app/db"
    project = project_with("lejos", secret_env=[f"DB_URL={far}"])
    app = new_app()
    with pytest.raises(ValueError) as info:
        AgentFleet(new_stack(app), "Fleet", project=project)
    line = one_line(info)
    assert line.startswith("secret_env: ") and "region eu-west-1" in line


def test_a_gateway_secret_of_another_account_is_refused() -> None:
    far = "arn:aws:secretsmanager:us-east-1:999999999999:secret:rayito/provider-key-AbCdEf"
    project = project_with("ajena", tables={"gateways": {"model": {"secret": far}}})
    with pytest.raises(ValueError) as info:
        AgentFleet(new_stack(new_app()), "Fleet", project=project)
    line = one_line(info)
    assert line.startswith("gateways: ") and "account 999999999999" in line


def test_a_budget_table_of_another_account_or_region_is_refused() -> None:
    """The reconciler reaches the shared budget by name, in its own account and region."""
    for arn, where in (("arn:aws:dynamodb:eu-west-1:123456789012:table/budget", "region eu-west-1"),
                       ("arn:aws:dynamodb:us-east-1:999999999999:table/budget", "account 999999999999")):
        stack = new_stack(new_app())
        table = dynamodb.Table.from_table_arn(stack, "Budget", arn)
        with pytest.raises(ValueError) as info:
            AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), control_plane_budget=table)
        line = one_line(info)
        assert line.startswith("control_plane_budget: ") and where in line


@pytest.mark.parametrize("imported", [
    lambda s: iam.User.from_user_arn(s, "U", "arn:aws:iam::999999999999:user/bob"),
    lambda s: iam.Group.from_group_arn(s, "G", "arn:aws:iam::999999999999:group/ops"),
], ids=["user", "group"])
def test_a_user_or_group_of_another_account_is_refused(fleet, imported) -> None:
    """CDK would attach the grant to the same-named user or group of the stack's own account."""
    stack, agent_fleet = fleet
    with pytest.raises(ValueError) as info:
        agent_fleet.grant_launch(imported(stack))
    line = one_line(info)
    assert "arn:aws:iam::999999999999:" in line and "another account" in line


def test_a_user_and_group_of_the_account_are_granted_to(fleet) -> None:
    stack, agent_fleet = fleet
    assert agent_fleet.grant_launch(iam.User.from_user_arn(stack, "U", "arn:aws:iam::123456789012:user/ana")).success
    assert agent_fleet.grant_invoke(iam.Group.from_group_arn(stack, "G", "arn:aws:iam::123456789012:group/ops")).success


def test_a_policy_over_the_managed_limit_is_named() -> None:
    app = new_app()
    stack = new_stack(app)
    document = iam.PolicyDocument(statements=[
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"arn:aws:s3:::bucket-{i:04d}/prefix/*" for i in range(300)])])
    size = estimated_size(stack, document)
    assert size > MANAGED_POLICY_LIMIT
    with pytest.raises(ValueError) as info:
        check_size(stack, "ImagePublisherPolicy Policy", document, MANAGED_POLICY_LIMIT, hint="split it")
    line = one_line(info)
    assert line.startswith("ImagePublisherPolicy Policy: its policy would take about ") and "6,144" in line
    small = iam.PolicyDocument(statements=[iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"])])
    assert check_size(stack, "Small", small, MANAGED_POLICY_LIMIT, hint="") == estimated_size(stack, small) < 200


def test_unresolved_values_are_counted_long() -> None:
    app = new_app()
    stack = cdk.Stack(app, "Agnostic")  # no account or region: pseudo parameters at their longest
    document = iam.PolicyDocument(statements=[iam.PolicyStatement(
        actions=["sqs:SendMessage"], resources=[cdk.Fn.join("", ["arn:", cdk.Aws.PARTITION, ":sqs:", cdk.Aws.REGION,
                                                                 ":", cdk.Aws.ACCOUNT_ID, ":queue"])])])
    literal = iam.PolicyDocument(statements=[iam.PolicyStatement(
        actions=["sqs:SendMessage"], resources=["arn:aws-us-gov:sqs:ap-southeast-2:123456789012:queue"])])
    assert estimated_size(stack, document) >= estimated_size(stack, literal)



def _table(stack: cdk.Stack) -> dynamodb.Table:
    return dynamodb.Table(stack, "T", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING))


def _generated(stack: cdk.Stack, made: object) -> str:
    """The longest name CloudFormation generates for it: ``<stack>-<logical id>-<13 characters>``."""
    logical_id = stack.resolve(made.node.default_child.logical_id)  # type: ignore[attr-defined]
    return "t" * (len(stack.stack_name) + 1 + len(logical_id) + 14)


@pytest.mark.parametrize("make, attribute, longest", [
    (lambda s: kms.Key(s, "K"), "key_arn", lambda s, m: "arn:aws-us-gov:kms:ap-southeast-2:123456789012:key/" + "0" * 36),
    (lambda s: iam.Role(s, "R", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com")), "role_arn",
     lambda s, m: "arn:aws-us-gov:iam:ap-southeast-2:123456789012:role/" + "r" * 64),
    (_table, "table_arn", lambda s, m: "arn:aws-us-gov:dynamodb:ap-southeast-2:123456789012:table/" + _generated(s, m)),
], ids=["kms-key", "role", "table"])
def test_an_arn_of_the_stack_counts_as_long_as_its_type_allows(make, attribute, longest) -> None:
    """A known resource's ARN is counted at the longest its type allows (never shorter), not 200."""
    app = new_app()
    stack = cdk.Stack(app, "Agnostic")
    made = make(stack)
    document = iam.PolicyDocument(statements=[iam.PolicyStatement(actions=["s3:GetObject"], resources=[getattr(made, attribute)])])
    literal = iam.PolicyDocument(statements=[iam.PolicyStatement(actions=["s3:GetObject"], resources=[longest(stack, made)])])
    unknown = iam.PolicyDocument(statements=[iam.PolicyStatement(
        actions=["s3:GetObject"], resources=[cdk.Fn.get_att("Elsewhere", "Arn").to_string()])])
    assert estimated_size(stack, literal) <= estimated_size(stack, document) <= estimated_size(stack, literal) + 2
    assert estimated_size(stack, document) < estimated_size(stack, unknown)


def test_a_remote_fleet_with_another_fleets_project_is_refused() -> None:
    """from_fleet_name grants the secrets of the project it is given: another fleet's project
    would grant the wrong ones."""
    stack = new_stack(new_app())
    with pytest.raises(ValueError, match=r"^project: 'mi-agente' is not the fleet 'otra'; give the project"):
        AgentFleet.from_fleet_name(stack, "Remote", "otra", project=AgentProject.load(EXAMPLE))
    assert AgentFleet.from_fleet_name(stack, "Same", "mi-agente", project=AgentProject.load(EXAMPLE)) is not None


def test_a_grantee_in_a_stack_of_another_environment_is_refused() -> None:
    """An environment-agnostic fleet's statements name its resources with the pseudo parameters
    of the stack they land in: a grantee in a stack of a known region would be granted that
    region's image. A fleet of a known environment writes its ARNs out in full: any stack may
    hold them."""
    import aws_cdk as cdk

    app = new_app()
    fleet = AgentFleet(cdk.Stack(app, "Agnostic"), "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    eu = cdk.Stack(app, "Eu", env=cdk.Environment(account="123456789012", region="eu-west-1"))
    role = iam.Role(eu, "Worker", assumed_by=iam.AccountRootPrincipal())
    with pytest.raises(ValueError, match=r"^grant_launch: Eu/Worker is in stack Eu \(123456789012/eu-west-1\), the "
                                         r"fleet in the environment-agnostic Agnostic \(any/any\); its statements"):
        fleet.grant_launch(role)
    nested = cdk.NestedStack(eu, "Nested")  # named by its path, not its token name
    with pytest.raises(ValueError, match=r"^grant_invoke: Eu/Nested/R is in stack Eu/Nested \("):
        fleet.grant_invoke(iam.Role(nested, "R", assumed_by=iam.AccountRootPrincipal()))
    # Two environment-agnostic stacks: granted across stacks.
    other = cdk.Stack(app, "AlsoAgnostic")
    assert fleet.grant_invoke(iam.Role(other, "Reader", assumed_by=iam.AccountRootPrincipal())).success
    # A fleet of a known environment: granted to a stack of another region, or an agnostic one,
    # with its ARNs written out (no pseudo parameter of the grantee's stack).
    app = new_app()
    env = cdk.Environment(account="123456789012", region="us-east-1")
    fleet = AgentFleet(cdk.Stack(app, "A", env=env), "Fleet", project=AgentProject.load(EXAMPLE), build_image=False)
    for other in (cdk.Stack(app, "B", env=env), cdk.Stack(app, "C", env=cdk.Environment(account="123456789012",
                                                                                         region="eu-west-1")),
                  cdk.Stack(app, "D")):
        role = iam.Role(other, "W", assumed_by=iam.AccountRootPrincipal())
        assert fleet.grant_launch(role).success
        text = json.dumps(other.resolve(role.node.find_child("DefaultPolicy").document.to_json()))
        assert "microvm-image" in text and "AWS::Region" not in text and "AWS::AccountId" not in text


def test_a_principal_with_no_policy_is_named_by_its_kind(fleet) -> None:
    """The account's root takes no statement from a same-account grant: refused, named readably."""
    _, agent_fleet = fleet
    with pytest.raises(ValueError, match=r"^grant_read_access_token: AccountRootPrincipal cannot be granted to"):
        agent_fleet.grant_read_access_token(iam.AccountRootPrincipal())
