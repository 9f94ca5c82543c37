"""Run a Lambda function's handler the way the Lambda Python runtime does, in this process.

    python -m tests.lambda_runner '{"code": "<asset dir>", "handler": "reconciler.index.handler",
                                    "timeout_seconds": 65, "events": [{...}, ...]}'

One process is one execution environment: the code folder goes first on ``sys.path`` (Lambda's
``/var/task``), then the function's layers (``/opt/python``), the handler string from the template is imported as the runtime imports it, and the
events are invoked one after the other in that warm environment, each with a context whose
``get_remaining_time_in_millis`` counts down on the real clock from the function's timeout. The
environment is the process's (the test passes the template's ``Environment``). Everything the
handler prints goes to stdout as it would to CloudWatch Logs; each invocation's outcome follows as
one line ``RESULT <json>`` or ``ERROR <json>`` (an uncaught exception: Lambda's error response).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
import uuid


class LambdaContext:
    """The attributes the Lambda Python runtime's context has; the deadline is real time."""

    def __init__(self, function_name: str, timeout_seconds: float, memory_mb: int) -> None:
        self._deadline = time.monotonic() + timeout_seconds
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2026/11/30/[$LATEST]contract"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    for layer in reversed(spec.get("layers", [])):
        sys.path.insert(0, layer)
    sys.path.insert(0, spec["code"])
    module_name, _, function = spec["handler"].rpartition(".")
    handler = getattr(importlib.import_module(module_name), function)
    for number, event in enumerate(spec["events"]):
        if number:
            time.sleep(float(spec.get("pause_seconds", 0)))  # the schedule's gap between invocations
        context = LambdaContext(spec.get("function_name", "contract"), float(spec["timeout_seconds"]),
                                int(spec.get("memory_mb", 128)))
        try:
            result = handler(event, context)
        except Exception as exc:  # what Lambda reports as the invocation's error
            sys.stdout.flush()
            print("ERROR " + json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc),
                                         "stackTrace": traceback.format_exc().splitlines()}), flush=True)
            continue
        sys.stdout.flush()
        print("RESULT " + json.dumps(result, default=str, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
