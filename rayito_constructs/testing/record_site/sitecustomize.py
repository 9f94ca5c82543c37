"""Record every AWS call of this process (``rayito_constructs.testing.aws_calls``).

Put this folder first on ``PYTHONPATH`` and name a file in ``RAYITO_RECORD_AWS_CALLS``: the
process, and every child that inherits both, appends one JSON line per call to that file. Without
the variable nothing happens.
"""

import os

if os.environ.get("RAYITO_RECORD_AWS_CALLS"):
    from rayito_constructs.testing.aws_calls import AwsCallRecorder

    AwsCallRecorder(os.environ["RAYITO_RECORD_AWS_CALLS"]).install()
