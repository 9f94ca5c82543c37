"""Every name a fleet accepts synthesizes; one holder of a physical name per account and region."""

from __future__ import annotations

import re

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from hypothesis import given, settings
from hypothesis import strategies as st

from rayito_constructs import AgentFleet, AgentImage, AgentProject, FleetStack, RecipeParameter
from rayito_constructs.model.names import is_fleet_name, safe_stack_name, stack_name_for
from rayito_constructs.model.recipe import plan_recipe

from rayito_constructs.agent_image import release_artifact

from .cdk_helpers import new_app, new_stack, stack_props, stand_in_rayd
from .conftest import EXAMPLE

CFN_STACK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcXYZ019_-", min_size=1, max_size=64))
def test_every_fleet_name_has_a_stack_name(name) -> None:
    assert is_fleet_name(name)
    stack = stack_name_for(name)
    assert CFN_STACK_NAME.match(stack) and len(stack) <= 128
    if "_" not in name:
        assert stack == f"RayitoFleet-{name}"  # names that were valid keep their stack


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_any_id_gets_a_valid_stack_name(wanted) -> None:
    name = safe_stack_name(wanted)
    assert CFN_STACK_NAME.match(name) and len(name) <= 128


def test_names_that_differ_keep_different_stacks() -> None:
    assert stack_name_for("my_agent") != stack_name_for("my-agent")
    assert stack_name_for("a_b") != stack_name_for("a__b")
    assert stack_name_for("my-agent") == "RayitoFleet-my-agent"


@pytest.mark.parametrize("name", ["my_agent", "a" * 64, "a" + "_" * 63, "9_lives"])
def test_names_synthesize_through_fleet_stack(agent_folder, name) -> None:
    """The stack app.py makes (id = project.stack_name), synthesized into a cloud assembly: every
    name the product takes ([a-z0-9][a-z0-9_-]{0,63})."""
    project = AgentProject.load(agent_folder(name=name))
    app = new_app()
    stack = FleetStack(app, project.stack_name, project=project, **stack_props())
    assembly = app.synth()
    assert assembly.get_stack_by_name(project.stack_name).stack_name == project.stack_name
    images = Template.from_stack(stack).find_resources("AWS::Lambda::MicrovmImage")
    assert [r["Properties"]["Name"] for r in images.values()] == [name]


def test_fleet_stack_with_an_id_that_is_no_stack_name(agent_folder) -> None:
    project = AgentProject.load(agent_folder(name="my_agent"))
    app = new_app()
    top = FleetStack(app, "Fleet-my_agent", project=project, **stack_props())
    stage = cdk.Stage(app, "Prod")
    staged = FleetStack(stage, "Fleet-my_agent", project=project, **stack_props(env=cdk.Environment(account="123456789012", region="eu-west-1")))
    named = FleetStack(app, "Whatever", project=project, stack_name="Chosen", **stack_props(env=cdk.Environment(account="123456789012", region="us-west-2")))
    app.synth()
    assert top.stack_name.startswith("Fleet-my-agent-") and CFN_STACK_NAME.match(top.stack_name)
    assert staged.stack_name.startswith("Prod-Fleet-my-agent-")
    assert named.stack_name == "Chosen"


# ---------------------------------------------------------------------------- duplicates


def test_the_same_fleet_twice_in_one_stack() -> None:
    app = new_app()
    stack = new_stack(app)
    AgentFleet(stack, "One", project=AgentProject.load(EXAMPLE))
    with pytest.raises(ValueError) as info:
        AgentFleet(stack, "Two", project=AgentProject.load(EXAMPLE))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("name: the fleet 'mi-agente' is defined twice in one app for the same place "
                              "(account 123456789012, region us-east-1): at Test/One and at Test/Two")
    assert "two MicrovmImage named 'mi-agente'" in message and "/rayito/agents/mi-agente/recipe" in message


def test_the_same_fleet_in_two_stacks_of_one_place() -> None:
    app = new_app()
    FleetStack(app, "A", project=AgentProject.load(EXAMPLE), **stack_props())
    with pytest.raises(ValueError, match=r"at A/Fleet and at B/Fleet"):
        FleetStack(app, "B", project=AgentProject.load(EXAMPLE), **stack_props())


def test_an_environment_agnostic_stack_may_land_anywhere() -> None:
    app = new_app()
    FleetStack(app, "Pinned", project=AgentProject.load(EXAMPLE), **stack_props())
    with pytest.raises(ValueError, match=r"account 123456789012, region us-east-1\): at Pinned/Fleet and at Anywhere/Fleet"):
        FleetStack(app, "Anywhere", project=AgentProject.load(EXAMPLE), env=None,
                   synthesizer=cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))


def test_the_same_name_in_other_places_or_apps_is_fine(agent_folder) -> None:
    app = new_app()
    for region in ("us-east-1", "eu-west-1"):
        FleetStack(app, f"Fleet-{region}", project=AgentProject.load(EXAMPLE),
                   **stack_props(env=cdk.Environment(account="123456789012", region=region)))
    FleetStack(app, "OtherAccount", project=AgentProject.load(EXAMPLE),
               **stack_props(env=cdk.Environment(account="210987654321", region="us-east-1")))
    other_app = new_app()
    FleetStack(other_app, "Again", project=AgentProject.load(EXAMPLE), **stack_props())
    two_names = new_app()
    stack = new_stack(two_names)
    AgentFleet(stack, "A", project=AgentProject.load(agent_folder(name="a")))
    AgentFleet(stack, "B", project=AgentProject.load(agent_folder(name="b")))


def test_an_image_or_a_recipe_of_a_fleets_name(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    folder = agent_folder(name="mi-agente")  # the app's context names a rayd zip: the fleet builds its image
    project = AgentProject.load(folder)
    AgentFleet(stack, "Fleet", project=project)
    with pytest.raises(ValueError, match=r"the image 'mi-agente' is defined twice .* at Test/Fleet/Image and at Test/Loose"):
        AgentImage(stack, "Loose", project=project, rayd=release_artifact(stand_in_rayd(), None))
    recipe = plan_recipe(project, "1").encoded
    with pytest.raises(ValueError, match=r"the recipe parameter '/rayito/agents/mi-agente/recipe' is defined twice"):
        RecipeParameter(stack, "Writer", fleet_name="mi-agente", recipe=recipe)


def test_a_fleet_may_run_an_image_made_beside_it(agent_folder) -> None:
    app = new_app()
    stack = new_stack(app)
    folder = agent_folder(name="mi-agente")
    image = AgentImage(stack, "Image", project=AgentProject.load(folder), rayd=release_artifact(stand_in_rayd(), None))
    AgentFleet(stack, "Fleet", project=AgentProject.load(folder), image=image)
    Template.from_stack(stack).resource_count_is("AWS::Lambda::MicrovmImage", 1)
