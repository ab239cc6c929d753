"""The outbox table: rows written in the writer's transaction, claimed in per-order sequence by the
polling publisher.

Per-order order with several publishers at once (the "ordering requires careful locking" pitfall):
a publisher claims an order's events only through the order's *head*, its pending event with the
lowest sequence, locked with FOR UPDATE SKIP LOCKED; with the head it locks the order's later pending
events, skipping (never waiting for) those another publisher holds, and leaves out of its round any
order of which it could not lock every pending event. An event that is not its order's head is never
claimed on its own, and an order's head changes when the transaction holding it commits, so while one
publisher holds an order no other publisher can publish any of its events, and the next one to take the
order sees what the first committed. A replay or a redrive can also make an earlier event pending again
while a publisher holds the order's later ones: a new head, free, which a second publisher claims; it
finds the first's rows locked and leaves the order out of its round (as does the first, had it not yet
locked them all), and a later round publishes the event again, in sequence. Publishing happens inside
the claim's transaction: a crash between PutEvents and COMMIT leaves the rows pending and they are
published again, in order (consumers deduplicate by event id). Pending = neither published nor
parked; a parked (poison) event no longer holds its order back, as the stream relay moves past a
parked record.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry, ensure_publishable, outbox_entry
from shop.domain.poison import PoisonRecord, RowPosition
from shop.domain.publishing import interleave_orders

_INSERT = """
INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope, trace_header)
VALUES (%s, %s, %s, %s, %s, %s)
"""

# Heads of orders, oldest first; a head another publisher holds is skipped, not waited for. Nothing
# once the outbox is handed over to the logical relay (outbox_relay.mode): a publisher still running
# with its old configuration must not publish rows the relay now owns (it claims through the outbox's
# row locks, which a switch waits for, so its next claim sees the switch).
# A head is its order's lowest pending sequence, found by a correlated min(): PostgreSQL runs it as one
# lookup in outbox_pending per candidate whatever its statistics say. The same test written NOT EXISTS
# was planned, on an outbox filled faster than autovacuum analyzes it (estimated 1 row), as a join that
# scanned every pending entry for each candidate: 1.0-1.3 s for a claim of 500 orders among 4,400 events.
_CLAIM_HEADS = """
SELECT head.aggregate_id
FROM outbox AS head
WHERE head.published_at IS NULL AND head.parked_at IS NULL
  AND (SELECT mode FROM outbox_relay) = 'polling'
  AND head.sequence = (
      SELECT min(earlier.sequence) FROM outbox AS earlier
      WHERE earlier.aggregate_id = head.aggregate_id
        AND earlier.published_at IS NULL AND earlier.parked_at IS NULL)
ORDER BY head.position
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

# The claimed orders' pending events (heads included, already ours), with how many each order has
# pending. Rows another publisher holds are skipped, not waited for: a replay or a redrive may have made
# an order's earlier event pending (a new head) while that publisher holds its later ones, and waiting
# would hold this round's other orders for as long as that round lasts, or deadlock with it when each
# holds what the other locks next. An order with fewer rows locked than pending is left out of the round.
# The count is of the statement's snapshot: a row published or parked since is not locked, and leaves
# its order out too (the next round takes what is left).
_LOCK_ORDERS = """
WITH locked AS MATERIALIZED (
    SELECT position, event_id, aggregate_id, sequence, envelope::text AS envelope, trace_header,
           created_at, attempts
    FROM outbox
    WHERE aggregate_id = ANY(%(orders)s) AND published_at IS NULL AND parked_at IS NULL
    FOR UPDATE SKIP LOCKED
), pending AS (
    SELECT aggregate_id, count(*) AS events
    FROM outbox
    WHERE aggregate_id = ANY(%(orders)s) AND published_at IS NULL AND parked_at IS NULL
    GROUP BY aggregate_id
)
SELECT locked.position, locked.event_id, locked.aggregate_id, locked.sequence, locked.envelope,
       locked.trace_header, locked.created_at, locked.attempts, pending.events
FROM locked JOIN pending ON pending.aggregate_id = locked.aggregate_id
ORDER BY locked.aggregate_id, locked.sequence
"""


class RelayModeMismatch(RuntimeError):
    """The outbox was handed over to the other relay (outbox_relay.mode): this one publishes nothing."""

    def __init__(self, running: str, mode: str) -> None:
        self.running, self.mode = running, mode
        super().__init__(
            f"this publisher runs as the {running} relay, but the outbox was switched to the {mode} relay "
            "(outbox_relay.mode): it publishes nothing; the invocations started with the new "
            "configuration (PostgresRelay) do"
        )


def relay_mode(cursor: psycopg.Cursor[Any]) -> str:
    cursor.execute("SELECT mode FROM outbox_relay")
    found = cursor.fetchone()
    return str(found[0]) if found else "polling"


def relay_mode_for_replay(cursor: psycopg.Cursor[Any]) -> str:
    """The relay that owns the outbox, read with the outbox's ROW SHARE lock held (what a replay's
    FOR UPDATE takes anyway) until the caller commits: a switch (EXCLUSIVE) is then either done, or waits
    and hands over what the replay did."""
    cursor.execute("LOCK TABLE outbox IN ROW SHARE MODE")
    return relay_mode(cursor)


def unpublished_among(cursor: psycopg.Cursor[Any], event_ids: list[str]) -> tuple[list[str], list[str]]:
    """The events among `event_ids` not marked published: (pending, parked). A parked one will not be
    published by any relay until it is redriven."""
    cursor.execute(
        "SELECT event_id, parked_at IS NOT NULL FROM outbox"
        " WHERE event_id = ANY(%s) AND published_at IS NULL",
        (event_ids,),
    )
    rows = cursor.fetchall()
    return [event_id for event_id, parked in rows if not parked], [
        event_id for event_id, parked in rows if parked
    ]


def parked_events_among(cursor: psycopg.Cursor[Any], event_ids: list[str]) -> list[str]:
    """The events among `event_ids` that are parked."""
    cursor.execute(
        "SELECT event_id FROM outbox WHERE event_id = ANY(%s) AND parked_at IS NOT NULL", (event_ids,)
    )
    return [event_id for (event_id,) in cursor.fetchall()]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    position: int
    event_id: str
    aggregate_id: str
    sequence: int
    envelope: str
    trace_header: str | None
    created_at: datetime
    attempts: int

    def entry(self, max_event_bytes: int) -> OutboxEntry:
        """The row's PutEvents entry, or InvalidEnvelope (poison)."""
        return outbox_entry(self.envelope, max_event_bytes, self.trace_header)

    def poison_record(self, problem: InvalidEnvelope) -> PoisonRecord:
        """The row parked whole, named by its position in the outbox."""
        item = self.as_item()
        return PoisonRecord(
            position=RowPosition(self.position),
            event_id=self.event_id,
            reason=problem.message,
            details={**problem.details, "outboxPosition": self.position},
            image=item,
            key={name: item[name] for name in ("store", "position", "eventId")},
        )

    def as_item(self) -> dict[str, Any]:
        """The row as a poison queue message holds it (JSON)."""
        return {
            "store": "postgres",
            "position": self.position,
            "eventId": self.event_id,
            "aggregateId": self.aggregate_id,
            "sequence": self.sequence,
            "envelope": self.envelope,
            "traceHeader": self.trace_header,
            "createdAt": self.created_at.isoformat(),
            "attempts": self.attempts,
        }


def insert_outbox_row(
    cursor: psycopg.Cursor[Any], event: CloudEvent, *, max_event_bytes: int, trace_header: str | None
) -> None:
    """Write one event to the outbox, in the caller's transaction, with the writer's trace context."""
    event = event.traced(trace_header)
    ensure_publishable(event, max_event_bytes)
    cursor.execute(
        _INSERT, (event.id, event.subject, event.sequence, event.type, event.to_json(), trace_header)
    )


def claim_pending(cursor: psycopg.Cursor[Any], max_orders: int) -> list[OutboxRow]:
    """Lock up to `max_orders` orders' pending events for this transaction, in publishing order: each
    order's events in sequence, and orders interleaved (every order's first event, oldest order first,
    then every order's second...), so one PutEvents call carries up to ten orders. An order part of
    which another publisher holds is left out (its head stays locked until this transaction ends):
    that publisher or a later round publishes it."""
    cursor.execute(_CLAIM_HEADS, (max_orders,))
    heads = [aggregate_id for (aggregate_id,) in cursor.fetchall()]
    if not heads:
        if (mode := relay_mode(cursor)) != "polling":
            raise RelayModeMismatch("polling", mode)
        return []
    cursor.execute(_LOCK_ORDERS, {"orders": heads})
    records = cursor.fetchall()  # by order, then sequence
    locked = Counter(record[2] for record in records)
    rows = [OutboxRow(*record[:8]) for record in records if locked[record[2]] == record[8]]
    age = {aggregate_id: rank for rank, aggregate_id in enumerate(heads)}
    oldest_order_first = sorted(rows, key=lambda row: age[row.aggregate_id])  # stable: sequence kept
    return interleave_orders(oldest_order_first, lambda row: row.aggregate_id)


def mark_published(cursor: psycopg.Cursor[Any], positions: list[int]) -> None:
    if positions:
        cursor.execute(
            "UPDATE outbox SET published_at = clock_timestamp(), attempts = attempts + 1"
            " WHERE position = ANY(%s)",
            (positions,),
        )


def mark_parked(cursor: psycopg.Cursor[Any], position: int, reason: str) -> None:
    # A row the logical relay drains from a replay set may carry a published mark (a handover marks the
    # rows it hands over published; a replayed row was published before): parked, it is not published
    # (the table allows one of the two), or the mark would fail every round and stop the relay.
    cursor.execute(
        "UPDATE outbox SET parked_at = clock_timestamp(), published_at = NULL, attempts = attempts + 1,"
        " last_error = %s WHERE position = %s",
        (reason[:1000], position),
    )


def parked_among(cursor: psycopg.Cursor[Any], positions: list[int]) -> set[int]:
    """The rows among `positions` marked parked (committed marks: the logical relay's rows re-read)."""
    if not positions:
        return set()
    cursor.execute(
        "SELECT position FROM outbox WHERE position = ANY(%s) AND parked_at IS NOT NULL", (positions,)
    )
    return {position for (position,) in cursor.fetchall()}


def mark_failed(cursor: psycopg.Cursor[Any], positions: list[int], error: str) -> None:
    """Count a failed attempt on rows that stay pending (the next claim takes them again, in order)."""
    if positions:
        cursor.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = %s WHERE position = ANY(%s)",
            (error[:1000], positions),
        )


@dataclass
class ReplaySelection:
    """What a replay asked for, by event id: made pending again, or left as it was and why."""

    reset: list[str]  # published, inside the republish window: pending again, the publisher sends it
    expired: list[str]  # published before the window's horizon: consumers may have forgotten it
    parked: list[str]  # poison: redrive-poison is its way back
    pending: list[str]  # not published yet: the publisher sends it anyway
    missing: list[str]  # asked for by id, not in the outbox (unknown, or deleted by maintenance)


_SELECT_FOR_REPLAY = """
SELECT event_id, position, created_at, published_at IS NOT NULL OR %s, parked_at IS NOT NULL
FROM outbox
WHERE {condition}
ORDER BY position
FOR UPDATE
"""


def reset_for_replay(
    cursor: psycopg.Cursor[Any],
    *,
    window: tuple[datetime, datetime] | None = None,
    event_ids: list[str] | None = None,
    horizon: datetime | None = None,
    logical_relay: bool = False,
) -> tuple[ReplaySelection, list[int]]:
    """Make the selected published events pending again, in the caller's transaction: the publisher
    then republishes them in per-order sequence, like any pending event. Events created before
    `horizon` (None: no horizon) are left published and named as expired.

    With the logical relay rows carry no publishing state (its slot does): every selected row that is
    not parked is replayed, and nothing is updated; the caller hands the returned positions to the
    relay in a replay message (shop.adapters.postgres.replication.emit_replay)."""
    if (window is None) == (event_ids is None):
        raise ValueError("replay by a time window or by event ids, not both")
    if window is not None:
        cursor.execute(
            _SELECT_FOR_REPLAY.format(condition="created_at BETWEEN %s AND %s"), (logical_relay, *window)
        )
    else:
        cursor.execute(_SELECT_FOR_REPLAY.format(condition="event_id = ANY(%s)"), (logical_relay, event_ids))
    selection = ReplaySelection([], [], [], [], [])
    positions: dict[str, int] = {}
    for event_id, position, created_at, published, parked in cursor.fetchall():
        positions[event_id] = position
        if parked:
            selection.parked.append(event_id)
        elif not published:
            selection.pending.append(event_id)
        elif horizon is not None and created_at < horizon:
            selection.expired.append(event_id)
        else:
            selection.reset.append(event_id)
    found = set(selection.reset + selection.expired + selection.parked + selection.pending)
    selection.missing = [event_id for event_id in event_ids or [] if event_id not in found]
    if selection.reset and not logical_relay:
        cursor.execute(
            # pending again since now: its pending age counts from here (shop.adapters.postgres.maintenance)
            "UPDATE outbox SET published_at = NULL, pending_since = clock_timestamp(),"
            " last_error = 'replayed' WHERE event_id = ANY(%s)",
            (selection.reset,),
        )
    return selection, [positions[event_id] for event_id in selection.reset]
