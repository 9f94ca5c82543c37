"""Snapshot tests of the stacks this library makes (pytest with syrupy, or any snapshot tool).

A template names its assets by content hash: the functions' code zips, the product layer, the
composed image's artifact, the recipe's document. Each file's name changes with any byte of the
library, the product or the CDK, so a snapshot that keeps them fails on every upgrade for nothing.
:func:`neutralize_asset_hashes` replaces those names (``<sha256>.zip``, ``<sha256>.json``, wherever
they appear: keys, ``s3://`` URIs, ARNs) and nothing else: the digests the library writes of what
it deploys (the recipe's ``DocumentSha256``, the image's ``ImageDigest``, a build context's
``BuildContextSha256``) are kept, so a change of the recipe (an ``allow_out``, a model) or of the
image shows in the snapshot (a new product version changes the image the stack builds, and so its
``ImageDigest``: that snapshot changes on a product upgrade, as the deploy would)::

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

#: An asset's name: its content hash as a file (``<sha256>.zip``, ``<sha256>.json``) or as the
#: staged directory ``asset.<sha256>`` (the ``aws:asset:path`` metadata the CDK CLI turns on).
ASSET_FILE = re.compile(r"(?<![0-9A-Za-z-])(asset\.)?([0-9a-f]{64})(\.(?:zip|json))?(?![0-9A-Za-z-])")


def neutralize_asset_hashes(data: Any, path: Any = None) -> Any:
    """A syrupy matcher (``matcher=``; also a plain function of a value): an asset's name becomes
    ``<asset-hash>.zip`` (``.json``, ``asset.<asset-hash>``), in a whole value or inside one; a
    bare digest (64 hex digits, neither a file nor a staged directory) is kept."""
    if not isinstance(data, str):
        return data

    def replace(found: "re.Match[str]") -> str:
        prefix, digest, extension = found.group(1) or "", found.group(2), found.group(3) or ""
        return f"{prefix}<asset-hash>{extension}" if prefix or extension else digest

    return ASSET_FILE.sub(replace, data)
