"""Snapshot tests of the stacks this library makes (pytest with syrupy, or any snapshot tool).

A template names its assets by content hash: the functions' code zips, the product layer, the
composed image's artifact. Each changes with any byte of the library, the product or the CDK, so a
snapshot that keeps them fails on every upgrade for nothing. :func:`neutralize_asset_hashes`
replaces them, and nothing else::

    from aws_cdk.assertions import Template
    from syrupy.extensions.json import JSONSnapshotExtension
    from rayito_constructs.testing.snapshots import neutralize_asset_hashes

    def test_fleet_template(snapshot):
        template = Template.from_stack(stack).to_json()
        assert template == snapshot(extension_class=JSONSnapshotExtension, matcher=neutralize_asset_hashes)

Pin the CDK's feature flags in the test's ``App`` (the ``context`` of your ``cdk.json``), so the
test synthesizes what ``cdk synth`` does.
"""

from __future__ import annotations

import re
from typing import Any

#: A whole value that is an asset's hash (an S3 key such as ``<sha256>.zip``).
ASSET_HASH = re.compile(r"^[0-9a-f]{64}(\.zip)?$")
#: A hash inside a longer value (``s3://bucket/<sha256>.zip`` in an image's code URI).
HASH_INSIDE = re.compile(r"[0-9a-f]{64}")


def neutralize_asset_hashes(data: Any, path: Any = None) -> Any:
    """A syrupy matcher (``matcher=``; also a plain function of a value): a 64-hex asset hash
    becomes ``<asset-hash>`` (``<asset-hash>.zip`` for a whole key), any other value is kept."""
    if isinstance(data, str) and ASSET_HASH.match(data):
        return "<asset-hash>.zip" if data.endswith(".zip") else "<asset-hash>"
    if isinstance(data, str) and HASH_INSIDE.search(data):
        return HASH_INSIDE.sub("<asset-hash>", data)
    return data
