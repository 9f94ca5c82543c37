"""``ProductLayer``: the product (``rayito``) for the library's Lambda functions, one per stack.

The layer's content and how it is built without Docker: :mod:`rayito_constructs.wheels`. Its asset
hash is the layer's key (the pins and the platform), so a synth hashes nothing and a deploy
uploads it once per set of versions.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from ._function import ARCHITECTURE, RUNTIME
from .wheels import LAMBDA, LayerBuildError, layer_key, layer_zip

_ID = "RayitoProductLayer"


class ProductLayer(Construct):
    """The ``rayito`` package, grpcio, protobuf and the AWS SDK they need, for Python 3.14 on arm64.

    Use :meth:`of` to get the stack's one layer.
    """

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        try:
            archive = layer_zip(LAMBDA)
        except LayerBuildError as exc:
            raise ValueError(str(exc)) from None
        self.layer = lambda_.LayerVersion(
            self, "Layer",
            code=lambda_.Code.from_asset(str(archive), asset_hash=layer_key(LAMBDA),
                                         asset_hash_type=cdk.AssetHashType.CUSTOM),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="rayito (the product) and what it imports, for the rayito_constructs functions",
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        """The layer version."""

    @classmethod
    def of(cls, scope: Construct) -> "ProductLayer":
        """The stack's product layer, made on first use."""
        stack = cdk.Stack.of(scope)
        found = stack.node.try_find_child(_ID)
        return found if isinstance(found, ProductLayer) else cls(stack, _ID)
