"""The snapshot matcher users import: asset hashes go, every other value stays."""

from __future__ import annotations

from rayito_constructs.testing.snapshots import neutralize_asset_hashes

HASH = "0123456789abcdef" * 4


def test_asset_hashes_are_neutralized_and_nothing_else() -> None:
    assert neutralize_asset_hashes(f"{HASH}.zip") == "<asset-hash>.zip"
    assert neutralize_asset_hashes(HASH) == "<asset-hash>"
    assert neutralize_asset_hashes(f"s3://cdk-assets/{HASH}.zip") == "s3://cdk-assets/<asset-hash>.zip"
    for kept in ("mi-agente", HASH[:63], HASH.upper(), 5, None, {"S3Key": "x"}, ["a"]):
        assert neutralize_asset_hashes(kept) == kept
    assert neutralize_asset_hashes(HASH, path=("Resources", "Fn", "Properties", "Code", "S3Key")) == "<asset-hash>"


def test_two_synths_that_differ_only_in_asset_hashes_snapshot_alike() -> None:
    """Through syrupy's JSON extension, as docs/getting-started.md's test uses it."""
    from syrupy.extensions.json import JSONSnapshotExtension

    def template(code: str) -> dict:
        return {"Resources": {"Fn": {"Type": "AWS::Lambda::Function",
                                     "Properties": {"Code": {"S3Bucket": "cdk-assets", "S3Key": f"{code}.zip"}}}}}

    extension = JSONSnapshotExtension()
    serialized = [extension.serialize(template(code), matcher=neutralize_asset_hashes) for code in (HASH, "f" * 64)]
    assert serialized[0] == serialized[1] and "<asset-hash>.zip" in serialized[0]
