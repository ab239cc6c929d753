"""The Lambda context a test hands a handler it invokes in-process.

Only what the handlers and Powertools read of the Python runtime's context: the function's name, ARN and
memory and the request id (Logger's context keys), and a deadline counted down from `timeout_seconds`
(the idempotency records' in-progress expiry, the repositories' retries, the relay's time budget).
Nothing enforces the deadline; the local stack's runtime (tools/local/runtime/context.py) does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from tools.template import ACCOUNT, REGION


@dataclass
class LambdaContext:
    function_name: str = "test-function"
    timeout_seconds: float = 10.0
    memory_limit_in_mb: int = 512
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started: float = field(default_factory=time.monotonic)
    # How many seconds of the deadline pass in one real second: a test that needs a long invocation's
    # budget at its start (e.g. for a park, which needs the poison queue's worst case) without its waits.
    clock_speed: float = 1.0

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        remaining = self.timeout_seconds - (time.monotonic() - self.started) * self.clock_speed
        return max(0, int(remaining * 1000))
