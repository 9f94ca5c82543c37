"""The peer ``lambda-microvm-cdk`` 0.1.0: its one construct, ``LambdaMicroVM``, over the example's
files (its image from a Dockerfile, build and execution roles, a log group), as its README's app.

    CDK_OUTDIR=out <peers-python> benchmarks/peer_apps/lambda_microvm_cdk_app.py <source folder>

The base image version is pinned, so the synth makes no AWS call (its lookup otherwise asks the
Lambda API on every synth).
"""

import sys

import aws_cdk as cdk
from lambda_microvm_cdk import LambdaMicroVM

app = cdk.App()
stack = cdk.Stack(app, "PeerLambdaMicrovmCdk", env=cdk.Environment(account="123456789012", region="us-east-1"))
LambdaMicroVM(stack, "Agent", source=sys.argv[1], name="mi-agente", base_image_version="1", memory_mib=4096)
app.synth()
