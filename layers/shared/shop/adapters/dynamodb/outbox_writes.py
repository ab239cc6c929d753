"""Writing an outbox item: the item for an event and the transaction action that puts it.

The item's contract (its attributes, what reads them) is shop.adapters.dynamodb.outbox_items, which
re-exports these names. The repositories import this module alone: the readers' side of the contract
(decoding an image for the relay, naming a poison record) is not on a writer's import path, and
shop.domain.poison's dataclasses cost a writer's cold start about 4 ms.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

from shop.adapters.dynamodb import keys
from shop.domain.envelope import CloudEvent, ensure_publishable, parse_time

ENVELOPE = "envelope"
EXPIRES_AT = "expiresAt"


class OutboxSettings(Protocol):
    """The settings values an outbox writer needs (runtime.config.Settings is one)."""

    @property
    def outbox_ttl_days(self) -> int: ...
    @property
    def outbox_time_shards(self) -> int: ...
    @property
    def max_event_bytes(self) -> int: ...
    def require(self, name: str) -> str: ...


def outbox_item(
    event: CloudEvent,
    partition: str,
    *,
    ttl_days: int,
    time_shards: int,
    max_event_bytes: int,
    trace_header: str | None = None,
) -> dict[str, Any]:
    """The DynamoDB item (attribute-value form) for one outbox event.

    Kept small (write units are per started KB): the envelope holds the event's id, type, subject,
    sequence, source and time, so none is repeated as an attribute (the id is in the key). The envelope
    carries the writer's trace context (traceparent).
    """
    event = event.traced(trace_header)  # the trace rides in the envelope, not in an attribute of its own
    ensure_publishable(event, max_event_bytes)
    occurred = parse_time(event.time)
    item: dict[str, Any] = {
        **keys.outbox_key(partition, event.sequence, event.id),
        **keys.outbox_time_attributes(occurred, event.id, time_shards),
        ENVELOPE: {"S": event.to_json()},
        EXPIRES_AT: {"N": str(int((occurred + timedelta(days=ttl_days)).timestamp()))},
    }
    return item


def outbox_put(
    table: str, event: CloudEvent, partition: str, settings: OutboxSettings, trace_header: str | None
) -> dict[str, Any]:
    """The TransactWriteItems action putting an event's outbox item into `partition` (the aggregate's item
    collection, shop.adapters.dynamodb.keys) of `table`: written once, so only where its key is not taken."""
    item = outbox_item(
        event,
        partition,
        ttl_days=settings.outbox_ttl_days,
        time_shards=settings.outbox_time_shards,
        max_event_bytes=settings.max_event_bytes,
        trace_header=trace_header,
    )
    return {"Put": {"TableName": table, "Item": item, "ConditionExpression": keys.KEY_NOT_TAKEN}}
