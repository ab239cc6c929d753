"""Which X-Ray trace an outbox write carries, so that one saga stays one trace on AWS.

The order API's write carries the trace Lambda started for its request (`_X_AMZN_TRACE_ID`). A
consumer's write carries the trace of the message that caused it: EventBridge hands the PutEvents
TraceHeader to its SQS target as the message's `AWSTraceHeader` (EventBridge user guide, "X-Ray
integration"), and a Lambda function fed by SQS runs in a trace of its own that X-Ray links to the
message's (X-Ray developer guide, "Tracing event-driven applications"). Writing the message's header
on, rather than the consumer's own, makes the next PutEvents continue the saga's trace: every event of
an order carries one trace id (the traceparent in each envelope says so), and X-Ray shows each
consumer's invocation as a linked trace beside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from shop.runtime.config import trace_header_from_env

_causing_message: ContextVar[str | None] = ContextVar("causing_message_trace_header", default=None)


def outbox_trace_header() -> str | None:
    """The trace header of the message being handled, if any; else the invocation's own."""
    return _causing_message.get() or trace_header_from_env()


@contextmanager
def continuing(trace_header: str | None) -> Iterator[None]:
    """Outbox writes inside the block carry `trace_header` (a consumed message's AWSTraceHeader)."""
    token = _causing_message.set(trace_header)
    try:
        yield
    finally:
        _causing_message.reset(token)
