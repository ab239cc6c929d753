"""Switching the PostgreSQL outbox between its two relays (PostgresRelay) without losing or stranding an
event, run by the migration function at deploy time.

The two relays keep different bookmarks: the polling publisher marks rows published; the logical relay
marks nothing and confirms its slot. A switch hands the bookmark over in one transaction that holds
the outbox in SHARE mode (writers wait, so every outbox row is committed and, in logical mode, decoded
in the slot by then) and the logical relay's lock (so no relay reads the slot meanwhile):
- to logical: rows still pending (committed before the slot existed: the slot never sees them) are
  named in a replay message, which the logical relay publishes first, and marked published;
- to polling: every row the slot has delivered is marked published; what the slot still holds stays
  pending for the polling publisher; the slot is then dropped so it stops holding WAL.
`outbox_relay.mode` records the switch in the same transaction, so a run repeated after a crash either
finds the switch done or does all of it again.
"""

from __future__ import annotations

from typing import Any

import psycopg

from shop.adapters.postgres.replication import (
    drop_publication_and_slot,
    emit_replay,
    ensure_publication_and_slot,
    lock_slot,
    peek_changes,
    slot_exists,
)

MAX_CHANGES = 10_000_000  # a switch reads everything the slot holds


def current_mode(cursor: psycopg.Cursor[Any]) -> str:
    cursor.execute("SELECT mode FROM outbox_relay")
    found = cursor.fetchone()
    return str(found[0]) if found else "polling"


def _undelivered_positions(cursor: psycopg.Cursor[Any], slot: str) -> set[int]:
    changes = peek_changes(cursor, slot, MAX_CHANGES)
    return {row.position for transaction in changes.transactions for row in transaction.rows} | {
        position for transaction in changes.transactions for position in transaction.replayed
    }


class LogicalDecodingOff(RuntimeError):
    """The server cannot decode its log (wal_level is not logical): nothing was changed."""


def switch_relay(connection: psycopg.Connection, mode: str, slot: str) -> str:
    """Make `mode` the outbox's relay (autocommit connection). Returns what was done, for the log."""
    if mode == "logical":
        found = connection.execute("SHOW wal_level").fetchone()
        level = found[0] if found else "unknown"
        if level != "logical":
            raise LogicalDecodingOff(
                f"wal_level is {level}, not logical: rds.logical_replication=1 takes "
                "effect at the writer's next reboot. Deploy with DatabaseLogicalReplication=on and "
                "PostgresRelay=polling, reboot the writer, then deploy PostgresRelay=logical "
                "(docs/configuration.md, switching a live stack)"
            )
        ensure_publication_and_slot(connection, slot)  # outside the transaction: a slot must be
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 0")  # a switch after a long outage reads much WAL
        if current_mode(cursor) == mode:
            outcome = f"already {mode}"
        else:
            lock_slot(cursor, slot)
            cursor.execute("LOCK TABLE outbox IN SHARE MODE")
            outcome = _to_logical(cursor, slot) if mode == "logical" else _to_polling(cursor, slot)
            cursor.execute("UPDATE outbox_relay SET mode = %s, changed_at = clock_timestamp()", (mode,))
    if mode == "polling" and slot_exists(connection, slot):
        drop_publication_and_slot(connection, slot)
        outcome += "; slot dropped"
    return outcome


def _to_logical(cursor: psycopg.Cursor[Any], slot: str) -> str:
    in_slot = _undelivered_positions(cursor, slot)
    cursor.execute("SELECT position FROM outbox WHERE published_at IS NULL AND parked_at IS NULL")
    stranded = [position for (position,) in cursor.fetchall() if position not in in_slot]
    emit_replay(cursor, stranded)
    if stranded:
        cursor.execute(
            "UPDATE outbox SET published_at = clock_timestamp() WHERE position = ANY(%s)", (stranded,)
        )
    return f"switched to logical; {len(stranded)} pending rows handed to the slot"


def _to_polling(cursor: psycopg.Cursor[Any], slot: str) -> str:
    undelivered = _undelivered_positions(cursor, slot) if slot_exists(cursor, slot) else set()
    held = sorted(undelivered)
    cursor.execute(
        "UPDATE outbox SET published_at = created_at"
        " WHERE published_at IS NULL AND parked_at IS NULL AND NOT (position = ANY(%s))",
        (held,),
    )
    # Rows a replay message still holds were marked published when handed over: pending again.
    cursor.execute(
        "UPDATE outbox SET published_at = NULL WHERE position = ANY(%s) AND parked_at IS NULL", (held,)
    )
    return f"switched to polling; {len(undelivered)} rows the slot still held left pending"


def drop_relay_slot(connection: psycopg.Connection, slot: str) -> bool:
    """Stack deletion: drop the slot (a slot nobody reads keeps WAL forever) and the publication."""
    return drop_publication_and_slot(connection, slot)
