"""The recipe: content, canonical bytes, the 4,096-byte boundary, compression and decoding."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayito_constructs import AgentProject, build_recipe, decode_recipe, encode_recipe, plan_recipe
from rayito_constructs.recipe import (
    COMPRESSED_PREFIX,
    STANDARD_PARAMETER_BYTES,
    RecipeDecodeError,
    RecipeTooLarge,
    canonical_json,
)

from .conftest import EXAMPLE


def test_example_recipe_content() -> None:
    project = AgentProject.load(EXAMPLE, secret_env={"EXTRA_TOKEN": "s3cr3t-value"})
    doc = build_recipe(project)
    assert doc["version"] == 1
    assert doc["name"] == "mi-agente"
    assert doc["scaling"] == {
        "min_vms": 1, "max_vms": 3, "warm_vms": 1, "sessions": "shared",
        "scale_in_after_seconds": 900, "idle_seconds": 600,
    }
    assert doc["serve"] == {"max_concurrency": 2, "queue_max": 4, "queue_timeout_seconds": 30}
    assert doc["image"] == {"memory_mib": 4096, "architecture": "ARM_64", "version": None}
    assert doc["secret_env"] == ["EXTRA_TOKEN", "MODEL_API_KEY"]
    assert doc["egress"] == {
        "allow": ["bedrock-runtime.us-east-1.amazonaws.com", "api.example.com"],
        "budgets": [
            {"target": "https://api.example.com", "rate_per_second": 1.0, "burst": 5},
            {"target": "https://api.example.com/v1/search?region", "rate_per_second": 0.5, "burst": 2},
        ],
        "default": {"rate_per_second": 2.0, "burst": 10},
    }
    assert doc["gateway_presets"] == ["bedrock"]
    assert doc["renew_gateway_keys"] is False
    # Secret names only, never a value.
    assert "s3cr3t-value" not in json.dumps(doc)


def test_same_project_same_bytes() -> None:
    first = plan_recipe(AgentProject.load(EXAMPLE)).encoded
    second = plan_recipe(AgentProject.load(EXAMPLE)).encoded
    assert first is not None and first == second
    # Key order in the file does not matter either.
    a = AgentProject.from_dict({"env": {"A": "1", "B": "2"}}, name="x")
    b = AgentProject.from_dict({"env": {"B": "2", "A": "1"}}, name="x")
    assert encode_recipe(build_recipe(a)).value == encode_recipe(build_recipe(b)).value


def _project_of_json_size(size: int) -> AgentProject:
    """A project whose canonical recipe JSON is exactly ``size`` bytes."""
    base = AgentProject.from_dict({"instructions": ""}, name="sized")
    pad = size - len(canonical_json(build_recipe(base)))
    assert pad >= 0
    return AgentProject.from_dict({"instructions": "x" * pad}, name="sized")


def test_exactly_4096_bytes_is_json() -> None:
    encoded = encode_recipe(build_recipe(_project_of_json_size(4096)))
    assert (encoded.encoding, encoded.bytes) == ("json", 4096)


def test_4097_bytes_is_compressed_and_reads_back() -> None:
    doc = build_recipe(_project_of_json_size(4097))
    encoded = encode_recipe(doc)
    assert encoded.encoding == "compressed"
    assert encoded.value.startswith(COMPRESSED_PREFIX)
    assert encoded.json_bytes == 4097 and encoded.bytes < 4096
    assert decode_recipe(encoded.value) == doc


def test_too_large_even_compressed() -> None:
    import random

    rng = random.Random(7)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9000))
    project = AgentProject.from_dict({"instructions": noise}, name="big")
    with pytest.raises(RecipeTooLarge) as info:
        encode_recipe(build_recipe(project))
    assert info.value.compressed_bytes > STANDARD_PARAMETER_BYTES
    plan = plan_recipe(project)
    assert plan.encoded is None
    assert [w.code for w in plan.warnings] == ["recipe_too_large"]


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_names_name_no_fleet(name: str) -> None:
    # The page deploys a fleet named . or .. without a recipe; here the name also names the
    # MicroVM image and the stack, which cannot be '.', so the project refuses it (issue #15).
    with pytest.raises(ValueError, match=rf"^name: the recipe's name '{re.escape(name)}' cannot name a fleet"):
        AgentProject.from_dict({}, name=name)


def test_save_recipe_off() -> None:
    plan = plan_recipe(AgentProject.load(EXAMPLE, save_recipe=False))
    assert plan.encoded is None and [w.code for w in plan.warnings] == ["recipe_not_saved"]
    assert plan.parameter_name == "/rayito/agents/mi-agente/recipe"


def test_agentcore_recipe_has_no_scaling() -> None:
    doc = build_recipe(AgentProject.load(EXAMPLE, target="agentcore"))
    assert doc["target"] == "agentcore" and "scaling" not in doc and "serve" not in doc


def test_recipe_round_trips_to_a_project() -> None:
    original = AgentProject.load(EXAMPLE)
    restored = AgentProject.from_recipe(decode_recipe(plan_recipe(original).encoded.value))
    assert restored.scaling == original.scaling and restored.serve == original.serve
    assert restored.image == original.image and restored.env == original.env
    assert restored.gateways == original.gateways and restored.secret_env == original.secret_env
    assert restored.scaling_source == "recipe"
    assert build_recipe(restored) == build_recipe(original)


@pytest.mark.parametrize(
    "value",
    ["not json", "[]", '{"name": "x"}', COMPRESSED_PREFIX + "!!!", COMPRESSED_PREFIX + "aGVsbG8=", '{"version": 99}'],
)
def test_unreadable_values(value: str) -> None:
    with pytest.raises(RecipeDecodeError) as info:
        decode_recipe(value)
    assert str(info.value).startswith("recipe_unreadable")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
versions = st.from_regex(r"\A[0-9]{1,5}\.0\Z")


def _noise(seed: int, size: int) -> str:
    import random

    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size))


#: Documents built to land in each of the three cases of the page's size rule.
REGIONS = {
    "json": st.builds(lambda pad: pad, st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=1000)),
    # long but repetitive: above 4,096 bytes as JSON, well below once compressed
    "compressed": st.builds(lambda word, n, seed, size: (word * (4300 // len(word.encode()) + n)) + _noise(seed, size),
                            st.text(min_size=1, max_size=12), st.integers(0, 3000), st.integers(), st.integers(0, 500)),
    # random characters do not compress below the limit
    "too_large": st.builds(_noise, st.integers(), st.integers(6500, 14000)),
}


@pytest.mark.parametrize("region", list(REGIONS))
@settings(max_examples=60, deadline=None)
@given(data=st.data(), body=st.dictionaries(st.text(max_size=8), json_values, max_size=4), version=versions)
def test_every_case_of_the_size_rule(region, data, body, version) -> None:
    """Each region is reached by construction (asserted), and in every one the library, the writer
    and the reader agree; the image version survives every encoding."""
    from lambdas.recipe_writer import index as writer

    doc = {**body, "version": 1, "name": "x", "image": {"version": version}, "padding": data.draw(REGIONS[region])}
    if region == "too_large":
        with pytest.raises(RecipeTooLarge):
            encode_recipe(doc)
        with pytest.raises(writer.NotSaved) as info:
            writer.encode(doc)
        assert info.value.code == "recipe_too_large"
        return
    encoded = encode_recipe(doc)
    assert encoded.encoding == region
    assert writer.encode(doc) == (encoded.value, encoded.encoding, encoded.json_bytes)
    assert decode_recipe(encoded.value) == doc and decode_recipe(encoded.value)["image"]["version"] == version
    assert len(encoded.value.encode()) == encoded.bytes <= STANDARD_PARAMETER_BYTES
    assert (encoded.json_bytes > STANDARD_PARAMETER_BYTES) == (region == "compressed")


def test_a_version_known_only_at_deploy_is_planned_not_guessed(agent_folder) -> None:
    folder = agent_folder("[image]\nmemory_mib = 2048\n", name="built")
    plan = plan_recipe(AgentProject.load(folder))  # a Dockerfile: the stack builds the image
    assert plan.warnings == () and plan.document["image"]["version"] is None
    assert plan.to_dict()["image_version"] == "at deploy"
    token = "${Token[TOKEN.42]}"
    plan = plan_recipe(AgentProject.load(folder), image_version=token)
    assert plan.image_version == token and plan.version_at_deploy
    assert token not in json.dumps(plan.document)  # the document shipped holds no token


def test_a_recipe_without_a_version_warns_with_the_reason(agent_folder) -> None:
    folder = agent_folder(None, name="elsewhere")
    (folder / "Dockerfile").unlink()  # the image is published elsewhere
    plan = plan_recipe(AgentProject.load(folder))
    assert [w.code for w in plan.warnings] == ["recipe_without_image_version"]
    assert "latest active version" in plan.warnings[0].message
    pinned = plan_recipe(AgentProject.load(folder, memory_mib=2048).model_copy(update={"image": AgentProject.load(folder).image.model_copy(update={"version": "4.0"})}))
    assert pinned.warnings == () and pinned.document["image"]["version"] == "4.0"
    assert plan_recipe(AgentProject.load(folder), builds_image=True).warnings == ()


def test_too_large_once_the_version_is_filled_in() -> None:
    """A recipe that fits without its version but not with the one the deploy fills in."""
    base = AgentProject.from_dict({"instructions": ""}, name="edge")
    pad = STANDARD_PARAMETER_BYTES - len(canonical_json(build_recipe(base)))
    # padding that leaves the JSON exactly at the limit without a version and that zlib + base64
    # cannot shrink (random printable ASCII: about 6.6 bits a character, times 4/3)
    import random
    import string

    rng = random.Random(3)
    alphabet = [c for c in string.printable[:94] if c not in '"\\']
    project = AgentProject.from_dict({"instructions": "".join(rng.choice(alphabet) for _ in range(pad))}, name="edge")
    assert encode_recipe(build_recipe(project)).encoding == "json"
    plan = plan_recipe(project, image_version="${Token[TOKEN.7]}")
    assert plan.encoded is None and [w.code for w in plan.warnings] == ["recipe_too_large"]


@settings(max_examples=40, deadline=None)
@given(body=st.dictionaries(st.text(max_size=8), json_values, max_size=4), delta=st.integers(-3, 3))
def test_the_4096_byte_edge_between_json_and_compressed(body, delta) -> None:
    """JSON of exactly 4,096 + delta bytes: at most 4,096 stays JSON, one byte more is compressed
    (the library and the writer alike). Each example sits on the edge by construction."""
    from hypothesis import assume

    from lambdas.recipe_writer import index as writer

    doc = {**body, "version": 1, "name": "x", "image": {"version": "1.0"}, "padding": ""}
    pad = STANDARD_PARAMETER_BYTES + delta - len(canonical_json(doc))
    assume(pad >= 0)
    doc["padding"] = "a" * pad
    assert len(canonical_json(doc)) == STANDARD_PARAMETER_BYTES + delta
    encoded = encode_recipe(doc)
    assert encoded.encoding == ("json" if delta <= 0 else "compressed")
    assert writer.encode(doc) == (encoded.value, encoded.encoding, encoded.json_bytes)
    assert decode_recipe(encoded.value) == doc


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_the_edge_between_compressed_and_too_large(seed) -> None:
    """Random text grown one character at a time until its compressed form passes 4,096 bytes: the
    last size that fits is saved compressed, the first that does not is too large (both sides)."""
    import base64
    import zlib

    from lambdas.recipe_writer import index as writer

    def doc_of(size: int) -> dict:
        return {"version": 1, "name": "x", "image": {"version": "1.0"}, "padding": _noise(seed, size)}

    def packed(size: int) -> int:
        return len(COMPRESSED_PREFIX) + len(base64.b64encode(zlib.compress(canonical_json(doc_of(size)), 9)))

    low, high = STANDARD_PARAMETER_BYTES, 4 * STANDARD_PARAMETER_BYTES  # packed(low) fits, packed(high) does not
    assert packed(low) <= STANDARD_PARAMETER_BYTES < packed(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if packed(middle) <= STANDARD_PARAMETER_BYTES else (low, middle)
    fits = encode_recipe(doc_of(low))
    assert fits.encoding == "compressed" and fits.bytes <= STANDARD_PARAMETER_BYTES < fits.json_bytes
    assert writer.encode(doc_of(low))[1] == "compressed"
    with pytest.raises(RecipeTooLarge):
        encode_recipe(doc_of(high))
    with pytest.raises(writer.NotSaved) as info:
        writer.encode(doc_of(high))
    assert info.value.code == "recipe_too_large"
