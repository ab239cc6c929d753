"""Outbox entries built directly, without an envelope to decode: for the tests of what orders entries and
puts them on the bus (the publisher's chunks, a replay's publishing order)."""

from __future__ import annotations

import json

from shop.domain.outbox import OutboxEntry


def order_entry(order: str, sequence: int, occurred_at: str = "2026-11-26T00:00:00.000Z") -> OutboxEntry:
    """Event `sequence` of `order`, its id "{order}-{sequence}" and its detail the fields a bus reader
    checks (id, subject, sequence)."""
    detail = json.dumps({"id": f"{order}-{sequence}", "subject": order, "sequence": sequence})
    return OutboxEntry(
        event_id=f"{order}-{sequence}",
        source="shop.orders",
        detail_type="OrderCreated",
        detail=detail,
        aggregate=order,
        sequence=sequence,
        occurred_at=occurred_at,
        correlation_id="corr",
        trace_header=None,
        size=len(detail) + 40,
    )
