"""AgentFleet and FleetStack: what they create, what they promise, and that the result is clean."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Annotations, Match, Template

from rayito_constructs import AgentFleet, AgentProject, FleetStack, ProjectError
from rayito_constructs.model.product import canonical_json
from rayito_constructs.model.recipe import plan_recipe

from .cdk_helpers import lint_template, nag, new_app, new_stack, stack_props
from .conftest import EXAMPLE
from .iam_invariants import iam_violations, policy_documents
from .projects import project_with

RECIPE_ARN = "arn:aws:ssm:us-east-1:123456789012:parameter/rayito/agents/mi-agente/recipe"


@pytest.fixture(scope="module")
def example() -> tuple[cdk.App, FleetStack, Template]:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), **stack_props())
    return app, stack, Template.from_stack(stack)


@pytest.fixture(scope="module")
def with_metrics() -> tuple[cdk.App, FleetStack, Template]:
    app = new_app()
    stack = FleetStack(app, "MiAgente", project=AgentProject.load(EXAMPLE), metrics=True, **stack_props())
    return app, stack, Template.from_stack(stack)


@pytest.fixture(scope="module")
def with_index() -> tuple[cdk.App, FleetStack, Template]:
    app = new_app()
    project = AgentProject.load(EXAMPLE, sessions="dedicated", max_sessions=1)
    stack = FleetStack(app, "Dedicated", project=project, metadata_index=True, keep_recipe=True, **stack_props())
    return app, stack, Template.from_stack(stack)


def test_example_resources(example) -> None:
    _, _, template = example
    template.resource_count_is("AWS::IAM::ManagedPolicy", 3)
    template.resource_count_is("Custom::RayitoRecipe", 1)
    # The recipe writer, the reconciler and its server, the fleet's teardown and the image's pruner.
    template.resource_count_is("AWS::Lambda::Function", 5)
    template.resource_count_is("AWS::DynamoDB::Table", 3)  # the reconciler's ledger and budget, egress
    template.resource_count_is("AWS::Scheduler::Schedule", 2)  # the reconciler's and the pruner's
    template.resource_count_is("Custom::RayitoFleetTeardown", 1)
    template.resource_count_is("Custom::RayitoImagePruner", 1)
    outputs = template.to_json()["Outputs"]
    assert set(outputs) == {
        "FleetName", "ImageArn", "RecipeParameterName", "AccessTokenSecretName", "ExecutionRoleArn", "CallerPolicyArn",
        "ImagePublisherPolicyArn", "SandboxLauncherPolicyArn", "ReconcilerFunctionName",
        "ReconcilerDeadLetterQueueUrl", "EgressBudgetTableName", "RecipeOutcome", "RecipeSaved", "RecipeReason",
    }
    # What the deploy did with the recipe, as the writer answered it.
    (recipe_id,) = template.find_resources("Custom::RayitoRecipe")
    assert outputs["RecipeOutcome"]["Value"] == {"Fn::GetAtt": [recipe_id, "Outcome"]}
    assert outputs["RecipeSaved"]["Value"] == {"Fn::GetAtt": [recipe_id, "Saved"]}
    assert outputs["RecipeParameterName"]["Value"] == "/rayito/agents/mi-agente/recipe"
    # The example folder has a Dockerfile: the stack builds its image.
    assert outputs["ImageArn"]["Value"] == {"Fn::GetAtt": ["FleetImage4D94793D", "ImageArn"]}
    template.resource_count_is("AWS::Lambda::MicrovmImage", 1)


def test_recipe_resource_names_the_document_not_the_recipe(example) -> None:
    _, stack, template = example
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    props = recipe["Properties"]
    document = plan_recipe(AgentProject.load(EXAMPLE), builds_image=True).document
    assert props["ParameterName"] == "/rayito/agents/mi-agente/recipe"
    # The recipe records the image version the deploy builds: CloudFormation resolves it and the
    # writer puts it in the document it ships (in every encoding).
    assert props["ImageVersion"] == {"Fn::GetAtt": ["FleetImage4D94793D", "LatestActiveImageVersion"]}
    assert props["DocumentBucket"] == "cdk-hnb659fds-assets-123456789012-us-east-1"
    assert props["DocumentSha256"] == hashlib.sha256(canonical_json(document).encode()).hexdigest()
    assert props["FailureMode"] == "warn" and props["ServiceTimeout"] == "300"
    assert props["KeepOnDelete"] == "false" and "KeyId" not in props and "Value" not in props
    assert recipe["DeletionPolicy"] == "Delete"
    # The document is an asset of the stack: `cdk deploy` uploads it, the template only names it.
    staged = Path(example[0].synth().directory) / stack.fleet.recipe.document.asset_path
    assert json.loads(staged.read_bytes()) == document and "version" not in document["image"]
    assert document["project"]["agent"]["instructions"] not in json.dumps(template.to_json())
    # The writer may put and delete exactly this parameter and read exactly this document, and is
    # ready before the resource is written.
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
    image = "arn:aws:lambda:us-east-1:123456789012:microvm-image:mi-agente"
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "123456789012"},
        "ArnLike": {"aws:SourceArn": [image, image + ":*"]},  # the image and its versions, no prefix
    }


def test_the_stack_owns_the_microvm_log_group(example) -> None:
    _, _, template = example
    groups = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"LogGroupName": "/aws/lambda-microvms/mi-agente"}})
    ((logical, group),) = groups.items()
    assert group["Properties"]["RetentionInDays"] == 30 and group["DeletionPolicy"] == "Delete"
    # The build writes the product's /rayito/<image> group, made before the image.
    builds = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"LogGroupName": "/rayito/mi-agente"}})
    ((build_logical, _),) = builds.items()
    (image,) = template.find_resources("AWS::Lambda::MicrovmImage").values()
    assert build_logical in image["DependsOn"]


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
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],  # the product's index
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "SSESpecification": {"SSEEnabled": True},
                "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            },
        },
    )
    # The product's writer and reader grants go to the launcher and the caller, not to the publisher.
    policies = template.find_resources("AWS::IAM::ManagedPolicy")
    for sid in ("PutIndexRows", "ReadIndexRows"):
        with_table = sorted(
            k.split("Policy")[0] for k, p in policies.items()
            if any(s["Sid"] == sid for s in p["Properties"]["PolicyDocument"]["Statement"])
        )
        assert with_table == ["FleetCaller", "FleetSandboxLauncher"], sid
    assert "MetadataIndexTableName" in template.to_json()["Outputs"]
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    assert recipe["DeletionPolicy"] == "Retain" and recipe["Properties"]["KeepOnDelete"] == "true"


def test_no_save_recipe_saves_none_and_says_nothing_as_the_product() -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE, save_recipe=False), reconciler=False)
    assert fleet.recipe is None
    Template.from_stack(stack).resource_count_is("Custom::RayitoRecipe", 0)
    assert not Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^recipe_"))
    # the reconciler starts every VM from the recipe's project: a fleet it keeps must save one
    with pytest.raises(ValueError, match="reconciler: True needs the fleet's recipe"):
        AgentFleet(stack, "Kept", project=project_with(name="kept", save_recipe=False), reconciler=True)
    # by default, no recipe is no reconciler, told (as `rayito agent deploy --no-save-recipe` keeps no fleet)
    unkept = AgentFleet(stack, "Unkept", project=project_with(name="unkept", save_recipe=False))
    assert unkept.reconciler is None and unkept.recipe is None
    told = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^no_reconciler: save_recipe is off"))
    assert len(told) == 1
    with pytest.raises(ValueError, match="reconciler_alarms=True: save_recipe is off"):
        AgentFleet(stack, "Watched", project=project_with(name="watched", save_recipe=False), reconciler_alarms=True,
                   metrics=True)


def test_a_recipe_too_large_warns_with_the_page_code(agent_folder) -> None:
    import random

    rng = random.Random(3)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9000))
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(name="big", agent={"instructions": noise})),
                       reconciler=False)
    assert fleet.recipe is None
    warnings = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^recipe_too_large: "))
    assert len(warnings) == 1


def test_a_fleet_without_headroom_is_told_what_its_successors_cost() -> None:
    """max_vms = min_vms (the default 1 and 1, or 4 and 4): an info, not a warning (it is the
    default, and `cdk synth --strict` fails on warnings); one VM of headroom, or no reconciler
    (nothing replaces VMs then), says nothing."""
    told = {}
    for name, scaling, reconciler in [("one", (1, 1), True), ("four", (4, 4), True), ("room", (2, 3), True),
                                      ("none", (0, 2), True), ("off", (1, 1), False)]:
        app = new_app()
        stack = new_stack(app)
        project = project_with(name=name, min_vms=scaling[0], max_vms=scaling[1])
        AgentFleet(stack, "Fleet", project=project, reconciler=reconciler)
        annotations = Annotations.from_stack(stack)
        assert not annotations.find_warning("*", Match.string_like_regexp("no_headroom"))
        told[name] = [m.entry.data for m in annotations.find_info("*", Match.string_like_regexp("^no_headroom: "))]
    assert [name for name, infos in told.items() if infos] == ["one", "four"]
    assert "max_vms = min_vms = 4" in told["four"][0] and "max_vms = min_vms + 1" in told["four"][0]


def test_recipe_too_large_warns() -> None:
    import random

    rng = random.Random(3)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12000))
    project = project_with(name="big", tables={"agent": {"instructions": noise}})
    app = new_app()
    stack = new_stack(app)
    assert AgentFleet(stack, "Fleet", project=project, reconciler=False).recipe is None
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^recipe_too_large: "))
    with pytest.raises(ValueError, match="reconciler: True needs the fleet's recipe, and .*4096 bytes"):
        AgentFleet(new_stack(new_app()), "Kept", project=project, reconciler=True)
    assert AgentFleet(new_stack(new_app()), "Default", project=project).reconciler is None  # no recipe, no reconciler


def test_customer_key_reaches_everything_the_fleet_creates(agent_folder) -> None:
    folder = agent_folder('[[egress.budgets]]\ntarget = "https://api.example.com"\nrate = "1/s"\nburst = 2\n', name="keyed")
    project = AgentProject.load(folder, sessions="dedicated", max_sessions=1)
    app = new_app()
    stack = new_stack(app)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    AgentFleet(stack, "Fleet", project=project, recipe_key=key, metadata_index=True)
    template = Template.from_stack(stack)
    key_arn = {"Fn::GetAtt": [next(iter(template.find_resources("AWS::KMS::Key"))), "Arn"]}
    tables = template.find_resources("AWS::DynamoDB::Table")
    assert len(tables) == 4  # the index, the egress budget, the ledger, the control-plane budget
    for table in tables.values():
        assert table["Properties"]["SSESpecification"] == {"KMSMasterKeyId": key_arn, "SSEEnabled": True, "SSEType": "KMS"}
    (group,) = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"LogGroupName": "/aws/lambda-microvms/keyed"}}).values()
    assert group["Properties"]["KmsKeyId"] == key_arn
    (recipe,) = template.find_resources("Custom::RayitoRecipe").values()
    assert recipe["Properties"]["KeyId"] == key_arn
    # Every KMS grant of every identity policy names the service it goes through.
    grants = 0
    for _, _, document in policy_documents(template.to_json()):
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("kms:") for a in actions):
                grants += 1
                assert list(statement["Condition"]["StringEquals"]) == ["kms:ViaService"], statement
    assert grants >= 7  # caller, launcher (recipe and index), publisher, writer, reconciler, agents
    assert nag(app) == [] and lint_template(template) == []


def test_an_imported_key_is_not_forced_on_the_log_group() -> None:
    app = new_app()
    stack = new_stack(app)
    key = kms.Key.from_key_arn(stack, "Key", "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab")
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), recipe_key=key)
    template = Template.from_stack(stack)
    (group,) = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"LogGroupName": "/aws/lambda-microvms/mi-agente"}}).values()
    assert "KmsKeyId" not in group["Properties"]
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("is not encrypted with the customer key"))


def test_two_fleets_of_one_stack_share_one_key() -> None:
    app = new_app()
    stack = new_stack(app)
    first, second = (kms.Key(stack, n, enable_key_rotation=True) for n in ("First", "Second"))
    AgentFleet(stack, "A", project=project_with(name="a"), recipe_key=first)
    AgentFleet(stack, "B", project=project_with(name="b"), recipe_key=first)  # the same key: fine
    with pytest.raises(ValueError, match="shared by every fleet of the stack and is encrypted with the key Test/First"):
        AgentFleet(stack, "C", project=project_with(name="c"), recipe_key=second)
    with pytest.raises(ValueError, match="but this fleet asks for an AWS managed key"):
        AgentFleet(stack, "D", project=project_with(name="d"))


def test_warnings_of_the_plan_become_annotations(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(name="ann")),
               image_arn="arn:aws:lambda:us-east-1:123456789012:microvm-image:ann")
    assert Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^recipe_without_image_version: "))


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
    # The three policies are scoped to the given image; only the reconciler passes the role (the
    # product's client starts a fleet's VMs with no executionRoleArn).
    policies = json.dumps(template.find_resources("AWS::IAM::ManagedPolicy"))
    assert image + ":*" in policies and "role/agent" not in policies
    reconciler = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert '"Resource": "arn:aws:iam::123456789012:role/agent"' in reconciler
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


def test_the_fleets_of_a_stack_share_one_writer() -> None:
    app = new_app()
    stack = new_stack(app)
    names = ["agente-0", "agente_1", "a", "x" * 64]  # a hyphen, an underscore, the shortest, the longest
    for i, name in enumerate(names):
        AgentFleet(stack, f"Fleet{i}", project=project_with(name=name))
    template = Template.from_stack(stack)
    writers = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": "index.handler"}})
    ((_, writer),) = writers.items()
    template.resource_count_is("Custom::RayitoRecipe", len(names))
    # It acts for exactly these resources, each mapped to its fleet, and may write exactly their
    # parameters and read exactly their documents.
    mapping = json.loads(writer["Properties"]["Environment"]["Variables"]["RECIPE_RESOURCES"])
    recipes = template.find_resources("Custom::RayitoRecipe")
    assert mapping == {k: r["Properties"]["ParameterName"].split("/")[3] for k, r in recipes.items()}
    assert sorted(mapping.values()) == sorted(names)
    (policy,) = [p for k, p in template.find_resources("AWS::IAM::Policy").items() if k.startswith("RayitoRecipeWriter")]
    by_sid = {st["Sid"]: st for st in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert sorted(by_sid["WriteRecipes"]["Resource"]) == sorted(
        f"arn:aws:ssm:us-east-1:123456789012:parameter/rayito/agents/{n}/recipe" for n in names)
    assert len(by_sid["ReadRecipeDocuments"]["Resource"]) == len(names)
    assert iam_violations(template.to_json()) == []


def test_too_many_fleets_for_one_writer_is_a_clear_error() -> None:
    """At the real limit (the writer's 4 KB environment), not a lowered one: as many fleets as it
    takes to pass it are built, and the error names that count."""
    from rayito_constructs import RecipeParameter, recipe_parameter

    app = new_app()
    stack = new_stack(app)
    # each fleet adds about 40 characters to the map ("Fleet12Recipe1A2B3C4D":"agente-n-012",);
    # the fleets' recipes alone (what AgentFleet adds to the writer) keep the synth short
    count = recipe_parameter._MAX_RESOURCE_MAP // 40 + 5
    for i in range(count):
        name = f"agente-n-{i:03d}"
        RecipeParameter(stack, f"Fleet{i}Recipe", fleet_name=name, recipe=plan_recipe(project_with(name=name)).document)
    with pytest.raises(Exception, match=f"{count} fleets in one stack: their recipe resources do not fit") as info:
        app.synth()
    assert "split the fleets over several stacks" in str(info.value)


def test_permissions_boundary_on_the_stack_reaches_every_role() -> None:
    app = new_app()
    arn = "arn:aws:iam::123456789012:policy/rayito-boundary"
    boundary = iam.ManagedPolicy.from_managed_policy_arn(app, "Boundary", arn)
    stack = FleetStack(app, "Bounded", project=AgentProject.load(EXAMPLE), permissions_boundary=boundary, **stack_props())
    iam.Role(stack, "AddedLater", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))  # now and later
    roles = Template.from_stack(stack).find_resources("AWS::IAM::Role")
    assert len(roles) == 10  # with the server's, the teardown's, the pruner's and its schedule's
    assert {k: r["Properties"].get("PermissionsBoundary") for k, r in roles.items()} == {k: arn for k in roles}


def test_permissions_boundary_on_a_fleet_reaches_its_roles_and_the_stack_writer() -> None:
    app = new_app()
    stack = new_stack(app)
    boundary = iam.ManagedPolicy.from_managed_policy_name(stack, "Boundary", "rayito-boundary")
    expected = "arn:aws:iam::123456789012:policy/rayito-boundary"
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), permissions_boundary=boundary)
    iam.Role(fleet, "AddedLater", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    iam.Role(stack, "Unrelated", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    roles = Template.from_stack(stack).find_resources("AWS::IAM::Role")
    bounded = {k for k, r in roles.items() if r["Properties"].get("PermissionsBoundary") == expected}
    assert {k for k in roles if not k.startswith("Unrelated")} == bounded
    assert any(k.startswith("RayitoRecipeWriterRole") for k in bounded)  # the stack's writer, outside the fleet
    assert len(bounded) == 10  # with the server's, the teardown's, the pruner's and its schedule's


def test_two_fleets_with_different_boundaries_in_one_stack_are_an_error() -> None:
    app = new_app()
    stack = new_stack(app)
    first = iam.ManagedPolicy.from_managed_policy_name(stack, "First", "first")
    second = iam.ManagedPolicy.from_managed_policy_name(stack, "Second", "second")
    AgentFleet(stack, "A", project=project_with(name="a"), permissions_boundary=first)
    AgentFleet(stack, "B", project=project_with(name="b"), permissions_boundary=first)
    AgentFleet(stack, "C", project=project_with(name="c"))  # none: the writer keeps "first"
    with pytest.raises(ValueError, match="share its recipe writer, which already has the boundary"):
        AgentFleet(stack, "D", project=project_with(name="d"), permissions_boundary=second)


def test_recipe_failure_fail_is_strict() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "Fleet", project=AgentProject.load(EXAMPLE), recipe_failure="fail")
    (recipe,) = Template.from_stack(stack).find_resources("Custom::RayitoRecipe").values()
    assert recipe["Properties"]["FailureMode"] == "fail"
    import random

    rng = random.Random(3)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12000))
    with pytest.raises(ValueError, match="recipe_failure='fail': the recipe cannot be saved .recipe_too_large"):
        AgentFleet(stack, "Big", project=project_with(name="big", tables={"agent": {"instructions": noise}}),
                   recipe_failure="fail", reconciler=False)
    with pytest.raises(ValueError, match="recipe_failure: 'ignore' is not one of 'warn', 'fail'"):
        AgentFleet(stack, "Odd", project=project_with(name="odd"), recipe_failure="ignore")


def test_an_alarm_tells_a_recipe_not_saved(example, with_metrics) -> None:
    # RecipeNotSaved is a custom metric: its alarm comes with metrics=True, never without.
    assert not example[2].find_resources("AWS::CloudWatch::Alarm", {"Properties": {"MetricName": "RecipeNotSaved"}})
    _, _, template = with_metrics
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm", {"Properties": {"MetricName": "RecipeNotSaved"}}).values()
    assert alarm["Properties"]["Namespace"] == "Rayito/Fleet"
    assert alarm["Properties"]["Dimensions"] == [{"Name": "fleet", "Value": "mi-agente"}]
    assert alarm["Properties"]["Threshold"] == 1 and alarm["Properties"]["TreatMissingData"] == "notBreaching"


def test_credential_shaped_env_fails_the_synth(agent_folder) -> None:
    """The product's rule: a value that starts like a credential (sk-, AKIA, ghp_...)."""
    folder = agent_folder(env={"API_ENDPOINT_TOKENISH": "sk-" + "hunter2abcdef"}, name="leaky")
    with pytest.raises(ProjectError) as info:
        AgentProject.load(folder)
    message = str(info.value)
    assert message.startswith("env") and "hunter2" not in message.split(": ", 1)[1]


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


def test_egress_budget_of_the_example(example, with_metrics) -> None:
    assert not example[2].find_resources("AWS::CloudWatch::Alarm", {"Properties": {"Namespace": "Rayito/Egress"}})
    _, stack, template = with_metrics
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
    # Per envelope, exhaustion (budget_empty deferrals); once, the store (limiter_unavailable).
    assert sorted(next(d["Value"] for d in a["Properties"]["Dimensions"] if d["Name"] == "reason")
                  for a in alarms.values() if a["Properties"]["MetricName"] == "Deferrals") == [
        "budget_empty", "budget_empty", "limiter_unavailable"]
    assert len(alarms) == 3
    # Per envelope, the deferral rate over the fleet's requests (metric math of two sums).
    rates = [a["Properties"] for a in template.find_resources("AWS::CloudWatch::Alarm").values()
             if "Metrics" in a["Properties"] and "Egress" in json.dumps(a["Properties"]["Metrics"])]
    assert len(rates) == 2 and all(
        [q.get("Expression") for q in r["Metrics"] if q.get("ReturnData")] == ["100 * deferred / requests"] for r in rates)


def test_no_egress_budget_without_declared_budgets(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    fleet = AgentFleet(stack, "Fleet", project=AgentProject.load(agent_folder(None, name="simple")))
    assert fleet.egress_budget is None


def test_token_valued_inputs() -> None:
    """Everything a user may pass as a CloudFormation parameter: the image, the key, the boundary."""
    app = new_app()
    stack = new_stack(app)
    image = cdk.CfnParameter(stack, "ImageArn", type="String")
    key_arn = cdk.CfnParameter(stack, "KeyArn", type="String")
    boundary_arn = cdk.CfnParameter(stack, "BoundaryArn", type="String")
    key = kms.Key.from_key_arn(stack, "Key", key_arn.value_as_string)
    boundary = iam.ManagedPolicy.from_managed_policy_arn(stack, "Boundary", boundary_arn.value_as_string)
    project = AgentProject.load(EXAMPLE, sessions="dedicated", max_sessions=1)
    fleet = AgentFleet(stack, "Fleet", project=project, image_arn=image.value_as_string, recipe_key=key,
                       permissions_boundary=boundary, metadata_index=True, own_microvm_log_group=False)
    AgentFleet(stack, "Second", project=project_with(name="second"), recipe_key=key,
               permissions_boundary=boundary)  # the same tokens: the same key and boundary
    assert fleet.image_arn == image.value_as_string
    template = Template.from_stack(stack)
    for role in template.find_resources("AWS::IAM::Role").values():
        assert role["Properties"]["PermissionsBoundary"] == {"Ref": "BoundaryArn"}
    for table in template.find_resources("AWS::DynamoDB::Table").values():
        assert table["Properties"]["SSESpecification"]["KMSMasterKeyId"] == {"Ref": "KeyArn"}
    # The image named by a token has no name at synth: no log group of its own, and the VMs'
    # log streams are found from the ARN by CloudFormation.
    named = [g["Properties"].get("LogGroupName") for g in template.find_resources("AWS::Logs::LogGroup").values()]
    # the second fleet builds its image: the product's build group and the VMs' group
    assert sorted(n for n in named if n) == ["/aws/lambda-microvms/second", "/rayito/second"]
    assert iam_violations(template.to_json()) == [] and nag(app) == [] and lint_template(template) == []


def test_recipe_parameter_on_its_own(agent_folder) -> None:
    from rayito_constructs import RecipeParameter

    app = new_app()
    stack = new_stack(app)
    document = plan_recipe(AgentProject.load(agent_folder(None, name="solo"))).document
    RecipeParameter(stack, "FromDocument", fleet_name="solo", recipe=document, image_version="4")
    stored = plan_recipe(AgentProject.load(agent_folder(None, name="solo2")), "4").encoded
    RecipeParameter(stack, "FromEncoded", fleet_name="solo2", recipe=stored)
    with pytest.raises(ValueError, match="the document is the recipe of 'solo', not of 'other'"):
        RecipeParameter(stack, "Mismatch", fleet_name="other", recipe=document)
    with pytest.raises(ValueError, match="recipe_failure: 'never' is not one of"):
        RecipeParameter(stack, "Odd", fleet_name="solo", recipe=document, recipe_failure="never")
    recipes = Template.from_stack(stack).find_resources("Custom::RayitoRecipe")
    assert sorted(r["Properties"]["ParameterName"] for r in recipes.values()) == [
        "/rayito/agents/solo/recipe", "/rayito/agents/solo2/recipe"]
    assert nag(app) == []
