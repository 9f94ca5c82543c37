"""AgentFleet and FleetStack: what they create, what they promise, and that the result is clean."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Annotations, Match, Template

from rayito_constructs import AgentFleet, AgentProject, FleetStack, decode_recipe, plan_recipe

from .cdk_helpers import lint_template, nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE

RECIPE_ARN = "arn:aws:ssm:us-east-1:123456789012:parameter/rayito/agents/mi-agente/recipe"


@pytest.fixture(scope="module")
def example() -> tuple[cdk.App, FleetStack, Template]:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    return app, stack, Template.from_stack(stack)


@pytest.fixture(scope="module")
def with_index() -> tuple[cdk.App, FleetStack, Template]:
    app = new_app()
    project = AgentProject.load(EXAMPLE, sessions="dedicated", max_concurrency=1)
    stack = FleetStack(app, "Dedicated", project=project, metadata_index=True, keep_recipe=True, **stack_props())
    return app, stack, Template.from_stack(stack)


def test_example_resources(example) -> None:
    _, _, template = example
    template.resource_count_is("AWS::IAM::ManagedPolicy", 3)
    template.resource_count_is("Custom::RayitoRecipe", 1)
    template.resource_count_is("AWS::Lambda::Function", 2)  # the recipe writer and the reconciler
    template.resource_count_is("AWS::DynamoDB::Table", 3)  # the reconciler's ledger and budget, egress
    template.resource_count_is("AWS::Scheduler::Schedule", 1)
    outputs = template.to_json()["Outputs"]
    assert set(outputs) == {
        "FleetName", "ImageArn", "RecipeParameterName", "ExecutionRoleArn", "CallerPolicyArn",
        "ImagePublisherPolicyArn", "SandboxLauncherPolicyArn", "ReconcilerFunctionName",
        "ReconcilerDeadLetterQueueUrl", "EgressBudgetTableName",
    }
    assert outputs["RecipeParameterName"]["Value"] == "/rayito/agents/mi-agente/recipe"
    # The example folder has a Dockerfile: the stack builds its image.
    assert outputs["ImageArn"]["Value"] == {"Fn::GetAtt": ["FleetImage4D94793D", "ImageArn"]}
    template.resource_count_is("AWS::Lambda::MicrovmImage", 1)


def test_recipe_custom_resource_holds_the_encoded_recipe(example) -> None:
    _, _, template = example
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    props = recipe["Properties"]
    assert props["ParameterName"] == "/rayito/agents/mi-agente/recipe"
    # The recipe records the image version the deploy builds: CloudFormation fills it in.
    parts = props["Value"]["Fn::Join"][1]
    assert {"Fn::GetAtt": ["FleetImage4D94793D", "LatestActiveImageVersion"]} in parts
    value = "".join(p if isinstance(p, str) else "1.0" for p in parts)
    expected = plan_recipe(AgentProject.load(EXAMPLE), image_version="1.0").encoded
    assert value == expected.value and props["Encoding"] == "json"
    assert decode_recipe(value)["image"]["version"] == "1.0"
    assert decode_recipe(value)["scaling"]["max_vms"] == 3
    assert props["KeepOnDelete"] == "false" and "KeyId" not in props
    assert recipe["DeletionPolicy"] == "Delete"
    # The writer may put and delete exactly this parameter, and is created before it is used.
    writer_policy = template.find_resources(
        "AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("RayitoRecipeWriterRole")}]}}
    )
    (policy,) = writer_policy.values()
    ssm = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "ssm:PutParameter" in s["Action"]]
    assert ssm == [{"Action": ["ssm:DeleteParameter", "ssm:PutParameter"], "Effect": "Allow", "Resource": RECIPE_ARN}]
    assert any(d.startswith("RayitoRecipeWriterRoleDefaultPolicy") for d in recipe.get("DependsOn", []))


def test_recipe_writer_function(example) -> None:
    _, _, template = example
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Runtime": "python3.14",
            "Handler": "index.handler",
            "Architectures": ["arm64"],
            "LoggingConfig": Match.object_like({"LogFormat": "JSON"}),
        },
    )
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 90})
    roles = template.find_resources("AWS::IAM::Role")
    writer = [r for k, r in roles.items() if k.startswith("RayitoRecipeWriterRole")][0]
    assert "ManagedPolicyArns" not in writer["Properties"]  # no AWSLambdaBasicExecutionRole


def test_execution_role_trust(example) -> None:
    _, _, template = example
    roles = template.find_resources("AWS::IAM::Role")
    role = [r for k, r in roles.items() if k.startswith("FleetExecutionRole")][0]
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Principal"] == {"Service": "lambda.amazonaws.com"}
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "123456789012"},
        "ArnLike": {"aws:SourceArn": "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente*"},
    }


def test_metadata_index(with_index) -> None:
    _, stack, template = with_index
    template.resource_count_is("AWS::DynamoDB::Table", 4)  # the index, the ledger, the budget, egress
    template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": {
                "BillingMode": "PAY_PER_REQUEST",
                "KeySchema": [{"AttributeName": "session_id", "KeyType": "HASH"}],
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "SSESpecification": {"SSEEnabled": True},
                "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            },
        },
    )
    # The table's data actions go to the launcher and the caller, not to the publisher.
    policies = template.find_resources("AWS::IAM::ManagedPolicy")
    with_table = sorted(
        k.split("Policy")[0] for k, p in policies.items()
        if any(s["Sid"] == "MetadataIndex" for s in p["Properties"]["PolicyDocument"]["Statement"])
    )
    assert with_table == ["FleetCaller", "FleetSandboxLauncher"]
    assert "MetadataIndexTableName" in template.to_json()["Outputs"]
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    assert recipe["DeletionPolicy"] == "Retain" and recipe["Properties"]["KeepOnDelete"] == "true"


def test_no_recipe_warns_with_the_page_code() -> None:
    for overrides, code in [({"save_recipe": False}, "recipe_not_saved")]:  # a fleet named "." is refused (#15)
        app = new_app()
        stack = new_stack(app)
        fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE, **overrides))
        assert fleet.recipe is None
        Template.from_stack(stack).resource_count_is("Custom::RayitoRecipe", 0)
        warnings = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp(f"^{code}: "))
        assert len(warnings) == 1


def test_recipe_too_large_warns() -> None:
    import random

    rng = random.Random(3)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12000))
    project = AgentProject.from_dict({"instructions": noise}, name="big")
    app = new_app()
    stack = new_stack(app)
    assert AgentFleet(stack, "Fleet", project=project).recipe is None
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^recipe_too_large: "))


def test_compressed_recipe_and_customer_key() -> None:
    project = AgentProject.from_dict({"instructions": "hola " * 1200}, name="long")
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    AgentFleet(stack, "Fleet", project=project, recipe_key=key)
    template = Template.from_stack(stack)
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    assert recipe["Properties"]["Encoding"] == "compressed"
    key_id = recipe["Properties"]["KeyId"]
    assert key_id["Fn::GetAtt"][0].startswith("Key") and key_id["Fn::GetAtt"][1] == "Arn"
    assert decode_recipe(recipe["Properties"]["Value"])["instructions"] == "hola " * 1200
    # The writer may encrypt with exactly that key, and nothing else of KMS.
    writer = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("RayitoRecipeWriterRole")}]}})
    (policy,) = writer.values()
    kms_statements = [st for st in policy["Properties"]["PolicyDocument"]["Statement"]
                      if any(a.startswith("kms:") for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))]
    assert len(kms_statements) == 1 and kms_statements[0]["Action"] == "kms:Encrypt"
    assert kms_statements[0]["Resource"] == key_id
    assert nag(app) == [] and lint_template(template) == []


def test_warnings_of_the_project_become_annotations(agent_folder) -> None:
    folder = agent_folder('[env]\nAPI_KEY = "x"\n', name="ann")
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(folder))
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^env_looks_secret: "))


def test_agentcore_has_no_fleet() -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError, match="option_not_supported"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE, target="agentcore"))


def test_bad_image_arn_is_a_clear_error() -> None:
    app = new_app()
    stack = new_stack(app)
    with pytest.raises(ValueError, match=r"^image_arn: 'arn:aws:s3:::x' is not a MicroVM image ARN"):
        AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), image_arn="arn:aws:s3:::x")


def test_given_image_arn_and_role() -> None:
    app = new_app()
    stack = new_stack(app)
    role = iam.Role.from_role_arn(stack, "Role", "arn:aws:iam::123456789012:role/agent", mutable=False)
    image = "arn:aws:lambda:us-east-1:123456789012:microvm-image:shared-agent"
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), image_arn=image, execution_role=role)
    template = Template.from_stack(stack)
    roles = template.find_resources("AWS::IAM::Role")
    assert not [k for k in roles if k.startswith("FleetExecutionRole")]  # the given role is used
    policies = json.dumps(template.find_resources("AWS::IAM::ManagedPolicy"))
    assert "arn:aws:iam::123456789012:role/agent" in policies and image + ":*" in policies
    assert fleet.image_arn == image


def test_grants_match_the_policies(example) -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE))
    client = iam.Role(stack, "Client", assumed_by=iam.AccountRootPrincipal())
    grant = fleet.grant_invoke(client)
    assert isinstance(grant, iam.Grant) and grant.success
    fleet.grant_launch(iam.Role(stack, "Launcher", assumed_by=iam.AccountRootPrincipal()))
    fleet.grant_publish(iam.Role(stack, "Publisher", assumed_by=iam.AccountRootPrincipal()))
    template = Template.from_stack(stack)
    inline = template.find_resources("AWS::IAM::Policy")
    managed = template.find_resources("AWS::IAM::ManagedPolicy")

    def actions(resources, prefix):
        (doc,) = [r["Properties"]["PolicyDocument"] for k, r in resources.items() if k.startswith(prefix)]
        return sorted({a for s in doc["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])})

    assert actions(inline, "ClientDefaultPolicy") == actions(managed, "FleetCallerPolicy")
    assert actions(inline, "LauncherDefaultPolicy") == actions(managed, "FleetSandboxLauncherPolicy")
    assert actions(inline, "PublisherDefaultPolicy") == actions(managed, "FleetImagePublisherPolicy")
    assert "ssm:PutParameter" not in actions(inline, "LauncherDefaultPolicy")
    # The grantee's own policy now holds the wildcards the service requires (ListMicrovms on "*"):
    # cdk-nag reports them on the grantee, whose owner decides; the managed policies stay clean.
    findings = nag(app)
    assert findings and all(f.startswith("AwsSolutions-IAM5[Resource::") for f in findings)
    assert {f.split(" ")[1].split("/")[1] for f in findings} == {"Client", "Launcher", "Publisher"}


def test_from_fleet_name_in_another_app() -> None:
    app = new_app()
    stack = new_stack(app, "Consumers")
    table = dynamodb.Table.from_table_name(stack, "Index", "sessions")
    fleet = AgentFleet.from_fleet_name(stack, "Remote", "mi-agente", metadata_table=table)
    worker = iam.Role(stack, "Worker", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    fleet.grant_launch(worker)
    assert fleet.recipe_parameter_name == "/rayito/agents/mi-agente/recipe"
    template = Template.from_stack(stack)
    doc = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert RECIPE_ARN in doc and "ssm:GetParameter" in doc and "ssm:PutParameter" not in doc
    assert "arn:aws:dynamodb:us-east-1:123456789012:table/sessions" in doc
    template.resource_count_is("Custom::RayitoRecipe", 0)


def test_existing_app_with_its_own_resources() -> None:
    """A user's app: its own stack and resources, the fleet added to it, the policies in another stack."""
    app = new_app()
    core = new_stack(app, "Core")
    queue = sqs.Queue(core, "Jobs", enforce_ssl=True)
    worker = lambda_.Function(
        core, "Worker", runtime=lambda_.Runtime.PYTHON_3_14, handler="index.handler",
        code=lambda_.Code.from_inline("def handler(e, c): return e"),
    )
    queue.grant_consume_messages(worker)
    fleet = AgentFleet(core, "AgentFleet", project=AgentProject.load(EXAMPLE))
    fleet.grant_invoke(worker)

    security = new_stack(app, "Security")
    from rayito_constructs import CallerPolicy, SandboxLauncherPolicy

    SandboxLauncherPolicy(security, "Launchers", fleet_name="mi-agente")
    CallerPolicy(security, "Callers")
    assembly = app.synth()
    names = {s.stack_name for s in assembly.stacks}
    assert names == {"Core", "Security"}
    core_template = Template.from_stack(core)
    core_template.resource_count_is("AWS::SQS::Queue", 2)  # the app's, and the reconciler's dead letters
    core_template.resource_count_is("Custom::RayitoRecipe", 1)
    Template.from_stack(security).resource_count_is("AWS::IAM::ManagedPolicy", 2)


def test_fifty_fleets_share_one_writer() -> None:
    app = new_app()
    stack = new_stack(app)
    for i in range(3):
        AgentFleet(stack, f"Fleet{i}", project=AgentProject.load(EXAMPLE, name=f"agente-{i}"))
    template = Template.from_stack(stack)
    writers = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": "index.handler"}})
    assert len(writers) == 1
    template.resource_count_is("Custom::RayitoRecipe", 3)


@pytest.mark.parametrize("fixture", ["example", "with_index"])
def test_lint_and_nag_clean(fixture, request) -> None:
    app, _, template = request.getfixturevalue(fixture)
    assert lint_template(template) == []
    assert nag(app) == []


def test_example_snapshot(example, snapshot_json) -> None:
    assert example[2].to_json() == snapshot_json


def test_metadata_index_snapshot(with_index, snapshot_json) -> None:
    assert with_index[2].to_json() == snapshot_json


def test_synth_is_stable_across_runs(example) -> None:
    app = new_app()
    again = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    assert Template.from_stack(again).to_json() == example[2].to_json()


def test_egress_budget_of_the_example(example) -> None:
    _, stack, template = example
    budget = stack.fleet.egress_budget
    assert [e.target for e in budget.envelopes] == ["https://api.example.com", "https://api.example.com/v1/search?region"]
    template.has_resource_properties("AWS::DynamoDB::Table", {
        "KeySchema": [{"AttributeName": "target", "KeyType": "HASH"}, {"AttributeName": "item", "KeyType": "RANGE"}],
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
    })
    # The MicroVMs' execution role may take tokens; nothing else is granted on the table.
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": Match.string_like_regexp("^FleetExecutionRole")}]}})
    (policy,) = policies.values()
    egress = [st for st in policy["Properties"]["PolicyDocument"]["Statement"] if "dynamodb:UpdateItem" in st["Action"]]
    assert len(egress) == 1 and sorted(egress[0]["Action"]) == [
        "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"]
    alarms = template.find_resources("AWS::CloudWatch::Alarm", {"Properties": {"Namespace": "Rayito/Egress"}})
    assert sorted(a["Properties"]["MetricName"] for a in alarms.values()) == [
        "DeferralRate", "DeferralRate", "RemainingAtDecision", "RemainingAtDecision"]


def test_no_egress_budget_without_declared_budgets(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(None, name="simple")))
    assert fleet.egress_budget is None
