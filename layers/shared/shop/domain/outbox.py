"""The outbox in domain terms: which events may be written, and the entry an outbox event becomes.

How an outbox event is stored (the table item, its keys and TTL) is adapters.dynamodb.outbox_items; how an
entry reaches the bus is adapters.eventbridge.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from shop.domain.envelope import CloudEvent, echoed, entry_size
from shop.domain.envelope import ensure_publishable as ensure_publishable  # where it is defined: see there
from shop.domain.errors import InvalidEnvelope
from shop.domain.tracing import from_traceparent

# What PutEvents refuses whatever the retry: a TraceHeader longer than this (its request model's limit: a
# validation error of the whole call, every entry in it), and a Source starting with this prefix ("All
# events that come from AWS services begin with aws. Customer-generated events can have any value here, as
# long as it doesn't begin with aws.": EventBridge's event structure reference).
LONGEST_TRACE_HEADER = 500
RESERVED_SOURCE_PREFIX = "aws."


class OutboxEntry(NamedTuple):
    """One outbox event, ready to become one PutEvents entry."""

    event_id: str
    source: str
    detail_type: str
    detail: str
    aggregate: str
    sequence: int
    occurred_at: str
    correlation_id: str
    trace_header: str | None
    size: int


def outbox_entry(envelope: str, max_event_bytes: int, trace_header: str | None = None) -> OutboxEntry:
    """The publishable entry for a stored envelope, or InvalidEnvelope (a poison record). Its X-Ray trace
    header (PutEvents' TraceHeader) is the one stored beside the envelope, or else the envelope's own
    traceparent written back in X-Ray's form.

    Every failure to decode is InvalidEnvelope: decoding is pure (no I/O), so an exception here is the
    record's own fault and repeats on every retry. Anything else escaping would fail the relay's whole
    invocation and hold its shard or its rows (and crash redrive and replay on the same record).
    """
    try:
        event = CloudEvent.from_json(envelope)
        detail = _without_malformed_traceparent(envelope, event)
        size = entry_size(event.source, event.type, detail)
    except InvalidEnvelope:
        raise
    except Exception as exc:  # e.g. a lone surrogate escape: UnicodeEncodeError when sized
        raise InvalidEnvelope(
            "envelope cannot be decoded", {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        ) from exc
    if size > max_event_bytes:
        raise InvalidEnvelope("event exceeds the event bus size limit", {"eventBytes": size})
    if event.source.startswith(RESERVED_SOURCE_PREFIX):
        raise InvalidEnvelope(
            "attribute source starts with aws., which EventBridge reserves for AWS services",
            {"source": echoed(event.source)},
        )
    if trace_header is not None and len(trace_header) > LONGEST_TRACE_HEADER:
        trace_header = None  # tracing is best effort: the event goes without it (or with its traceparent's)
    return OutboxEntry(
        event_id=event.id,
        source=event.source,
        detail_type=event.type,
        detail=detail,
        aggregate=f"{event.source}|{event.subject}",
        sequence=event.sequence,
        occurred_at=event.time,
        correlation_id=event.correlationid,
        trace_header=trace_header or _xray_header(event.traceparent),
        size=size,
    )


def _without_malformed_traceparent(envelope: str, event: CloudEvent) -> str:
    """The envelope to publish: the stored one, less a traceparent that CloudEvent dropped as malformed
    (tracing is best effort, as for a trace header PutEvents would refuse: the event goes without it rather
    than parked, and consumers never see an invalid traceparent)."""
    if event.traceparent is not None or '"traceparent"' not in envelope:
        return envelope  # the common case, decoded once
    raw = json.loads(envelope)
    if "traceparent" not in raw:
        return envelope  # the text was in the data, not an attribute
    del raw["traceparent"]
    return json.dumps(raw, separators=(",", ":"), ensure_ascii=False)


def _xray_header(traceparent: str | None) -> str | None:
    context = from_traceparent(traceparent)
    return context.xray_header if context else None
