"""The outbox item contract, shared by every table that feeds the relay.

An outbox item is immutable once written. Its attributes:
    PK, SK           see shop.adapters.dynamodb.keys (SK is OUTBOX#<sequence>#<eventId>: the event id is
                     read from it, keys.outbox_event_id; it names a poison record)
    envelope         the CloudEvents JSON, byte for byte what becomes the PutEvents Detail; what the event
                     is (id, type, subject, sequence) is read from it, by the product and the tools alike
    outboxBucket, outboxTime   sparse time index (OutboxByTime) for replay by time window, and by event
                     id: the id gives the bucket's shard (shop.adapters.dynamodb.keys)
    expiresAt        TTL (epoch seconds); outlives the 24 h stream retention

Read, never written (items written by earlier code carry them, and every reader still takes them):
    traceHeader      X-Ray trace header of the writer, from before the envelope carried it as traceparent
    eventId          key of the former OutboxByEventId index (the SK holds the same id)
    eventType, aggregateId, sequence   the envelope's type, subject and sequence repeated; the tools
                     read the envelope first and these only when it cannot be read

Nothing else: every byte counts towards the item's write units (1 per started KB, 2 in a transaction)
and every index entry costs its own (doubled in a transaction too). The event's source and time are in
the envelope, which is all the relay, replay and redrive read. Dropping the event-id index and the
four repeated attributes took an OrderConfirmed item of a two-line order under 1 KB, and a confirmed
order from 38 write units to 30 (docs/performance.md, "Write cost").
"""

from __future__ import annotations

from typing import Any

from shop.adapters.dynamodb import keys

# Writing an item (re-exported: the repositories import outbox_writes alone).
from shop.adapters.dynamodb.outbox_writes import ENVELOPE as ENVELOPE
from shop.adapters.dynamodb.outbox_writes import EXPIRES_AT as EXPIRES_AT
from shop.adapters.dynamodb.outbox_writes import OutboxSettings as OutboxSettings
from shop.adapters.dynamodb.outbox_writes import outbox_item as outbox_item
from shop.adapters.dynamodb.outbox_writes import outbox_put as outbox_put
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry, outbox_entry
from shop.domain.poison import PoisonRecord, StreamPosition

TRACE_HEADER = "traceHeader"
# Written by earlier code only (read by event_id_of_image; see the module's docstring).
LEGACY_EVENT_ID = "eventId"


def _string_attribute(image: dict[str, Any], name: str) -> str | None:
    value = image.get(name)
    text = value.get("S") if isinstance(value, dict) else None
    return text if isinstance(text, str) else None


def event_id_of_image(image: dict[str, Any]) -> str:
    """An outbox item image's event id: the end of its sort key, else (an item written by earlier code
    with a sort key of another shape) its eventId attribute, else its key (poison)."""
    sort_key = _string_attribute(image, keys.SK)
    event_id = (keys.outbox_event_id(sort_key) if sort_key else None) or _string_attribute(
        image, LEGACY_EVENT_ID
    )
    if event_id:
        return event_id
    return f"{_string_attribute(image, keys.PK)}|{sort_key}"


def poison_record(image: dict[str, Any], problem: InvalidEnvelope, position: StreamPosition) -> PoisonRecord:
    """An outbox item image that can never be published, parked whole, named by its place in the stream
    and found again in its table by its key."""
    return PoisonRecord(
        position=position,
        event_id=event_id_of_image(image),
        reason=problem.message,
        details=problem.details,
        image=image,
        key=keys.item_key(image),
    )


def outbox_expiry(image: dict[str, Any]) -> float | None:
    """An outbox item image's expiresAt (epoch seconds), None when absent or unreadable."""
    value = image.get(EXPIRES_AT)
    number = value.get("N") if isinstance(value, dict) else None
    try:
        return float(number) if isinstance(number, str) else None
    except ValueError:
        return None


def is_outbox_image(image: dict[str, Any] | None) -> bool:
    """Whether a stream image (attribute-value form) is an outbox item."""
    if not image:
        return False
    sort_key = image.get(keys.SK, {}).get("S")
    return isinstance(sort_key, str) and keys.is_outbox_sort_key(sort_key)


def decode_outbox_image(image: dict[str, Any], max_event_bytes: int) -> OutboxEntry:
    """Turn an outbox item image into a publishable entry, or raise InvalidEnvelope (a poison record)."""
    raw = _string_attribute(image, ENVELOPE)
    if raw is None:
        raise InvalidEnvelope("outbox item has no envelope string")
    return outbox_entry(raw, max_event_bytes, _string_attribute(image, TRACE_HEADER))
