"""The snapshot matcher users import: asset hashes go, every other value stays."""

from __future__ import annotations

from rayito_constructs.testing.snapshots import neutralize_asset_hashes

HASH = "0123456789abcdef" * 4


def test_asset_file_names_are_neutralized_and_digests_kept() -> None:
    assert neutralize_asset_hashes(f"{HASH}.zip") == "<asset-hash>.zip"
    assert neutralize_asset_hashes(f"{HASH}.json") == "<asset-hash>.json"
    assert neutralize_asset_hashes(f"s3://cdk-assets/{HASH}.zip") == "s3://cdk-assets/<asset-hash>.zip"
    assert neutralize_asset_hashes(f"arn:aws:s3:::cdk-assets/{HASH}.json") == "arn:aws:s3:::cdk-assets/<asset-hash>.json"
    assert neutralize_asset_hashes(f"asset.{HASH}") == "asset.<asset-hash>"  # aws:asset:path, the CLI's metadata
    for kept in (f"{HASH}.com", f"{HASH}.txt", f"x{HASH}.zip", f"{HASH}-{HASH}.zip"):  # not an asset's name
        assert neutralize_asset_hashes(kept) == kept
    # A digest the library writes of what it deploys (the recipe's DocumentSha256...) is kept:
    # a change of the recipe must show in a snapshot.
    for kept in (HASH, "mi-agente", f"{HASH[:63]}.zip", f"{HASH}0.zip", HASH.upper() + ".zip", 5, None,
                 {"S3Key": "x"}, ["a"]):
        assert neutralize_asset_hashes(kept) == kept
    assert neutralize_asset_hashes(f"{HASH}.zip", path=("Resources", "Fn", "Properties", "Code", "S3Key")) == "<asset-hash>.zip"


def test_a_recipe_change_shows_through_the_matcher() -> None:
    """Two fleets whose recipes differ only in allow_out: their templates differ after the
    matcher (the recipe's digest), where they used to be equal."""
    import json

    from aws_cdk.assertions import Template

    from rayito_constructs import AgentFleet, AgentProject

    from ..cdk_helpers import new_app, new_stack
    from ..conftest import EXAMPLE

    def template(**flags) -> str:
        stack = new_stack(new_app(base_artifact=None))
        AgentFleet(stack, "F", project=AgentProject.load(EXAMPLE, **flags))
        return json.dumps(Template.from_stack(stack).to_json(), sort_keys=True)

    def walk(value):  # as syrupy applies a matcher: to every value, in dicts and lists alike
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return neutralize_asset_hashes(value)

    def neutral(text: str) -> str:
        return json.dumps(walk(json.loads(text)))

    same = template()
    assert neutral(template()) == neutral(same)
    assert neutral(template(allow_out=["evil.example.com"])) != neutral(same)


def test_two_synths_that_differ_only_in_asset_hashes_snapshot_alike() -> None:
    """Through syrupy's JSON extension, as docs/getting-started.md's test uses it."""
    from syrupy.extensions.json import JSONSnapshotExtension

    def template(code: str) -> dict:
        return {"Resources": {"Fn": {"Type": "AWS::Lambda::Function",
                                     "Properties": {"Code": {"S3Bucket": "cdk-assets", "S3Key": f"{code}.zip"}}}}}

    extension = JSONSnapshotExtension()
    serialized = [extension.serialize(template(code), matcher=neutralize_asset_hashes) for code in (HASH, "f" * 64)]
    assert serialized[0] == serialized[1] and "<asset-hash>.zip" in serialized[0]
