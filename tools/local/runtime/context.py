"""The Lambda context object handed to every handler, with a real deadline."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from tools.template import ACCOUNT, REGION


def function_arn(name: str, qualifier: str | None = None) -> str:
    """A function's ARN in the local stack's account and region (with a version or alias: qualified)."""
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}" + (f":{qualifier}" if qualifier else "")


@dataclass
class LambdaContext:
    """The attributes and methods of the Python runtime's context object that handlers and Powertools use.

    The deadline is real: get_remaining_time_in_millis() counts down from the function's Timeout,
    and the local runtime ends an invocation that outlives it, as Lambda does.
    """

    function_name: str = "local-function"
    timeout_seconds: float = 10.0
    memory_limit_in_mb: int = 512
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = "/local"
    log_stream_name: str = "local"
    identity: None = None
    client_context: None = None
    _deadline: float = 0.0

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_seconds

    @property
    def invoked_function_arn(self) -> str:
        return function_arn(self.function_name)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))
