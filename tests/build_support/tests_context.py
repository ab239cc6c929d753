"""A minimal Lambda context for running built artefacts in a clean interpreter (no test deps)."""

from __future__ import annotations

import time
from types import SimpleNamespace


def context(timeout_seconds: float = 10.0) -> SimpleNamespace:
    deadline = time.monotonic() + timeout_seconds
    return SimpleNamespace(
        function_name="build-test",
        memory_limit_in_mb=512,
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:build-test",
        aws_request_id="build-test-request",
        get_remaining_time_in_millis=lambda: int((deadline - time.monotonic()) * 1000),
    )
