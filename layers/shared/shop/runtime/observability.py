"""One logger, tracer and metrics instance per process, configured by the POWERTOOLS_* variables.

SDK-call tracing is opt-in (TRACE_SDK_CALLS=true): the X-Ray SDK behind Powertools' Tracer builds a
botocore session and loads the endpoint models when it is imported, which measured at about as much
as `import boto3` itself on every cold start (see docs/performance.md). Without it, Lambda's Active
tracing still records every invocation and the trace header still travels with each event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from shop.runtime import snapstart
from shop.runtime.config import sdk_call_tracing_enabled

logger = Logger()
metrics = Metrics()
# Every function imports this module during init: the one place to register SnapStart's restore hooks.
snapstart.register_restore_hooks()


class LambdaLevelTracing:
    """Tracer stand-in when SDK-call tracing is off: the same decorators, doing nothing."""

    def capture_lambda_handler(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        return handler

    def put_annotation(self, key: str, value: str | int | float | bool) -> None:
        """Annotations need the SDK; without it the value is in the structured logs instead."""


def _make_tracer() -> Any:
    if sdk_call_tracing_enabled():
        from aws_lambda_powertools import Tracer  # imported only when asked for

        return Tracer()
    return LambdaLevelTracing()


tracer: LambdaLevelTracing = _make_tracer()
