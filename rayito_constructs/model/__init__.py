"""The plain model: an agent folder as the product loads it, the fleet's own settings and their
overrides, names, limits and rates, the recipe, the cost estimate and the IAM evaluator.

Nothing here imports aws-cdk-lib or anything of the library above it (the constructs, the CLI,
``verify``, the agents' ``egress`` package, the ``testing`` doubles): ``plan``, ``app.py``'s
context and the agents' egress client read it without the CDK (tests/test_layers.py holds it to
that, module by module).
"""
