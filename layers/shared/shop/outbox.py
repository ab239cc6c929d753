"""The outbox item contract, shared by every table that feeds the relay.

An outbox item is immutable once written. Its attributes:
    PK, SK           see shop.keys (SK starts with OUTBOX#)
    envelope         the CloudEvents JSON, byte for byte what becomes the PutEvents Detail
    eventId, eventType, eventSource, aggregateId, sequence, occurredAt
    outboxBucket, outboxTime   sparse time index for replay (shop.keys)
    traceHeader      X-Ray trace header of the writer, when tracing is active
    expiresAt        TTL (epoch seconds); outlives the 24 h stream retention
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shop import keys
from shop.envelope import CloudEvent, entry_size, parse_time
from shop.errors import EventTooLarge, InvalidEnvelope

ENVELOPE = "envelope"
TRACE_HEADER = "traceHeader"


def ensure_publishable(event: CloudEvent, max_event_bytes: int) -> None:
    """Refuse, at write time, an event that PutEvents could never accept."""
    size = event.entry_size()
    if size > max_event_bytes:
        raise EventTooLarge(
            "the event for this change exceeds the event bus size limit",
            {"eventBytes": size, "limitBytes": max_event_bytes},
        )


def outbox_item(
    event: CloudEvent, partition: str, *, ttl_days: int, time_shards: int, max_event_bytes: int
) -> dict[str, Any]:
    """The DynamoDB item (attribute-value form) for one outbox event."""
    ensure_publishable(event, max_event_bytes)
    occurred = parse_time(event.time)
    item: dict[str, Any] = {
        **keys.outbox_key(partition, event.sequence, event.id),
        **keys.outbox_time_attributes(occurred, event.id, time_shards),
        ENVELOPE: {"S": event.to_json()},
        "eventId": {"S": event.id},
        "eventType": {"S": event.type},
        "eventSource": {"S": event.source},
        "aggregateId": {"S": event.subject},
        "sequence": {"N": str(event.sequence)},
        "occurredAt": {"S": event.time},
        "expiresAt": {"N": str(int((occurred + timedelta(days=ttl_days)).timestamp()))},
    }
    trace_header = os.environ.get("_X_AMZN_TRACE_ID")
    if trace_header:
        item[TRACE_HEADER] = {"S": trace_header}
    return item


def event_id_of_image(image: dict[str, Any]) -> str:
    """An outbox item image's event id, or its key when the id itself is missing (poison)."""
    event_id = image.get("eventId", {}).get("S")
    if isinstance(event_id, str) and event_id:
        return event_id
    return f"{image.get(keys.PK, {}).get('S')}|{image.get(keys.SK, {}).get('S')}"


def is_outbox_image(image: dict[str, Any] | None) -> bool:
    """Whether a stream image (attribute-value form) is an outbox item."""
    if not image:
        return False
    sort_key = image.get(keys.SK, {}).get("S")
    return isinstance(sort_key, str) and keys.is_outbox_sort_key(sort_key)


@dataclass(frozen=True, slots=True)
class OutboxEntry:
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

    def to_put_events_entry(self, bus_name: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "EventBusName": bus_name,
            "Source": self.source,
            "DetailType": self.detail_type,
            "Detail": self.detail,
        }
        if self.trace_header:
            entry["TraceHeader"] = self.trace_header
        return entry


def decode_outbox_image(image: dict[str, Any], max_event_bytes: int) -> OutboxEntry:
    """Turn an outbox item image into a publishable entry, or raise InvalidEnvelope (a poison record)."""
    raw = image.get(ENVELOPE, {}).get("S")
    if not isinstance(raw, str):
        raise InvalidEnvelope("outbox item has no envelope string")
    event = CloudEvent.from_json(raw)
    size = entry_size(event.source, event.type, raw)
    if size > max_event_bytes:
        raise InvalidEnvelope("event exceeds the event bus size limit", {"eventBytes": size})
    trace = image.get(TRACE_HEADER, {}).get("S")
    return OutboxEntry(
        event_id=event.id,
        source=event.source,
        detail_type=event.type,
        detail=raw,
        aggregate=f"{event.source}|{event.subject}",
        sequence=event.sequence,
        occurred_at=event.time,
        correlation_id=event.correlationid,
        trace_header=trace if isinstance(trace, str) else None,
        size=size,
    )
