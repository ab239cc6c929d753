"""Switching the PostgreSQL outbox between its two relays (PostgresRelay) without losing, stranding or
reordering an event, run by the migration function at deploy time.

The two relays keep different bookmarks: the polling publisher marks rows published; the logical relay
marks nothing and confirms its slot. `outbox_relay.mode` says which relay owns the outbox, and each relay
checks it where it reads: the polling publisher in its claim, the logical relay under its slot's lock.
So a publisher still running with its old configuration after a switch publishes nothing (it raises
RelayModeMismatch), and whatever commits between the switch's steps belongs to one relay only.

A switch hands the bookmark over in one transaction holding the logical relay's lock (no relay reads
the slot meanwhile) and the outbox in EXCLUSIVE mode: writers wait (every outbox row is committed by
then, and in logical mode decoded in the slot), and so does a polling publisher's round: it holds its
claimed rows' locks (ROW SHARE) until it commits, the switch waits for that, and the round's own
UPDATE of the rows goes ahead of the waiting switch (it holds a lock the switch waits for), so the two
cannot deadlock (with SHARE mode they did: the switch got its lock, then waited for the round's rows
while the round waited for the table). The slot's lock comes first, as in a relay round.
- to logical: the slot is created (before the lock: a slot cannot be created in a transaction that
  wrote), then, under the lock, every row still pending is handed to the logical relay in a replay set
  (shop.adapters.postgres.replays, activated by its message in the log) and marked published, and the
  slot is moved to the log's current end: every row committed before is in the table, so nothing
  decoded before is needed, and a row committed between the slot's creation and the lock goes out
  once, through the set, in its order's sequence; what commits after the switch follows the set's rows
  of its order (the relay holds a slot row back until its order's rows pending in a set are out);
- to polling: refused while the slot is lost (its recovery alone knows the gap it had not delivered);
  else every row the slot has delivered is marked published (most of them before the lock, a batch a
  transaction with writers running: _mark_ahead_of_the_handover); what it still holds (streamed
  through a server-side cursor, a batch at a time, however much it holds) and what the replay sets
  still name stays or becomes pending; the sets are dropped; then the slot is dropped, under its lock,
  so it stops holding WAL.
Every statement runs under a bounded lock_timeout and a statement_timeout no longer than the caller's
time (`seconds_left`), and the switch as a whole within that time (a statement running at its end is
cancelled: several slow statements each within its statement_timeout would overrun it): a switch that
cannot get its locks or finish in time fails, changing nothing of the step it was in, and says why. A
run repeated after a failure either finds the switch done or does all of it again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import psycopg

from shop.adapters.postgres import replays
from shop.adapters.postgres.connection import cancelled_after, limit_lock_wait, limit_statement_time
from shop.adapters.postgres.outbox import relay_mode
from shop.adapters.postgres.replication import (
    OUTBOX_TABLE,
    PUBLICATION,
    advance_slot,
    emit_replay,
    flush_lsn,
    lock_slot,
    slot_exists,
    stream_undelivered_positions,
)
from shop.adapters.postgres.slot_recovery import RUNBOOK, read_slot_state

LOCK_WAIT_SECONDS = 10.0  # for the slot's lock and the outbox's: writers queue behind a waiting switch
BATCH_ROWS = 1_000  # slot messages read at a time when the slot is handed back
MARK_AHEAD_ROWS = 10_000  # rows marked published a transaction ahead of a handover to polling
MIN_STEP_SECONDS = 1.0  # a step does not start with less time than this left


class LogicalDecodingOff(RuntimeError):
    """The server cannot decode its log (wal_level is not logical): nothing was changed."""


class SlotLostBeforeSwitch(RuntimeError):
    """A switch to polling found the logical relay's slot lost: nothing was changed."""


class SwitchOutOfTime(RuntimeError):
    """Too little of the caller's time is left to start the next step: stopped before it."""


def current_mode(cursor: psycopg.Cursor[Any]) -> str:
    return relay_mode(cursor)


class _Bounds:
    """The time each step may take: the caller's time left, and a lock wait no longer than that."""

    def __init__(self, seconds_left: Callable[[], float], lock_wait_seconds: float) -> None:
        self._seconds_left = seconds_left
        self._lock_wait = lock_wait_seconds

    def apply(self, cursor: psycopg.Cursor[Any], step: str) -> None:
        """Check there is time for `step`, and bound the statements that follow in this transaction."""
        left = self._seconds_left()
        if left < MIN_STEP_SECONDS:
            raise SwitchOutOfTime(f"{left:.1f} s left, not enough to start {step}: nothing of it was done")
        statement_ms = 0 if math.isinf(left) else max(int(left * 1000), 1)
        lock_ms = max(int(min(self._lock_wait, left) * 1000), 1)
        limit_statement_time(cursor, statement_ms)
        limit_lock_wait(cursor, lock_ms)


def switch_relay(
    connection: psycopg.Connection,
    mode: str,
    slot: str,
    *,
    seconds_left: Callable[[], float] = lambda: math.inf,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
    batch_rows: int = BATCH_ROWS,
) -> str:
    """Make `mode` the outbox's relay (autocommit connection), within `seconds_left()` from now (the
    statement running then is cancelled: DeadlinePassed). Returns what was done, for the log."""
    with cancelled_after(seconds_left(), lambda: (connection,), f"the switch to {mode}"):
        return _switch_relay(connection, mode, slot, _Bounds(seconds_left, lock_wait_seconds), batch_rows)


def _switch_relay(
    connection: psycopg.Connection, mode: str, slot: str, bounds: _Bounds, batch_rows: int
) -> str:
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
        with connection.transaction(), connection.cursor() as cursor:
            bounds.apply(cursor, "reading the relay mode")
            already, present = current_mode(cursor) == "logical", slot_exists(cursor, slot)
        if already:
            # Never a new slot under a logical relay: a missing one is lost, and a new slot would silently
            # skip what the lost one had not delivered (its recovery republishes that gap).
            if not present:
                return f"already logical; slot {slot} missing: lost, see `python -m operations recover-slot`"
            return "already logical"
        _prepare_slot(connection, slot, bounds)
    ahead = _mark_ahead_of_the_handover(connection, slot, bounds, MARK_AHEAD_ROWS) if mode == "polling" else 0
    with connection.transaction(), connection.cursor() as cursor:
        bounds.apply(cursor, "the handover")
        outcome = f"already {mode}"
        if current_mode(cursor) != mode:
            lock_slot(cursor, slot)
            cursor.execute("LOCK TABLE outbox IN EXCLUSIVE MODE")
            if current_mode(cursor) != mode:  # read again under the locks: a switch running at once
                if mode == "logical":
                    outcome = _to_logical(cursor, slot)
                elif (state := read_slot_state(cursor, slot)).needs_recovery:
                    # Which committed rows the lost slot had not delivered is known only to the slot's
                    # recovery: handed back now, that gap would be marked published, and lost.
                    raise SlotLostBeforeSwitch(
                        f"slot {slot} is {state.describe()}: switching to polling now would mark the "
                        "events it had not delivered published. Nothing was changed. Recover the slot "
                        f"first (`python -m operations recover-slot`, {RUNBOOK}), then deploy again"
                    )
                else:
                    outcome = _to_polling(cursor, slot, bounds, batch_rows)
                    outcome += f"; {ahead} rows marked published ahead of the lock"
                cursor.execute("UPDATE outbox_relay SET mode = %s, changed_at = clock_timestamp()", (mode,))
    if mode == "polling" and _drop_slot(connection, slot, bounds):
        outcome += "; slot dropped"
    return outcome


def _prepare_slot(connection: psycopg.Connection, slot: str, bounds: _Bounds) -> None:
    """The publication and the slot (creating a slot waits for the transactions running then), and, while
    the outbox is still the polling publisher's, the slot moved to the log's end: whatever it decoded
    so far is in the table, and the handover need not decode it under the outbox's lock. Each in a
    transaction of its own: a slot cannot be created in a transaction that wrote."""
    with connection.transaction(), connection.cursor() as cursor:
        bounds.apply(cursor, "creating the publication")
        cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,))
        if cursor.fetchone() is None:
            table = ".".join(OUTBOX_TABLE)
            cursor.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {table} WITH (publish = 'insert')")
    with connection.transaction(), connection.cursor() as cursor:
        bounds.apply(cursor, "creating the slot")
        if not slot_exists(cursor, slot):
            cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with connection.transaction(), connection.cursor() as cursor:
        bounds.apply(cursor, "moving the new slot to the log's end")
        lock_slot(cursor, slot)
        if current_mode(cursor) == "polling":
            advance_slot(cursor, slot, flush_lsn(cursor))


def _to_logical(cursor: psycopg.Cursor[Any], slot: str) -> str:
    cursor.execute(
        "UPDATE outbox SET published_at = clock_timestamp()"
        " WHERE published_at IS NULL AND parked_at IS NULL RETURNING position"
    )
    pending = sorted(position for (position,) in cursor.fetchall())
    # Everything committed before now is in the table (the outbox is locked): the slot need not deliver
    # it. Moved before the set's message, which commits with this transaction, after this position.
    advance_slot(cursor, slot, flush_lsn(cursor))
    emit_replay(cursor, pending, kind="handover")
    return f"switched to logical; {len(pending)} pending rows handed to the logical relay"


def _mark_ahead_of_the_handover(
    connection: psycopg.Connection, slot: str, bounds: _Bounds, batch_rows: int
) -> int:
    """A switch to polling marks published every row of the logical relay's time that the slot and the
    replay sets no longer hold, under the outbox's EXCLUSIVE lock: up to OutboxTtlDays of rows, about 13 s
    a million, with every writer waiting. Marked here first, a batch per short transaction with writers
    running, the handover under the lock has only the rows written since. Marking a row the slot or a set
    still holds is harmless: the handover finds it there and makes it pending again, as it does the rows
    it marks itself. The rows are the ones present now (up to the highest position), so writers cannot
    keep it going; each batch reads the mode under the row-exclusive lock a switch waits for, and marks
    nothing unless the logical relay owns the outbox (in polling mode a NULL mark is a pending event) and
    its slot is not lost (the switch refuses then, changing nothing). Work done stays done: a switch that
    fails later, or is run again, marks only what is left."""
    marked, highest = 0, None
    while True:
        with connection.transaction(), connection.cursor() as cursor:
            bounds.apply(cursor, "marking published rows ahead of the handover")
            cursor.execute("LOCK TABLE outbox IN ROW EXCLUSIVE MODE")
            if current_mode(cursor) != "logical" or read_slot_state(cursor, slot).needs_recovery:
                return marked
            if highest is None:
                found = cursor.execute("SELECT max(position) FROM outbox").fetchone()
                highest = found[0] if found and found[0] is not None else 0
            # The marks are checked again on the row as updated (a relay round may park one meanwhile:
            # a parked row is never published), and rows a round holds are skipped, not waited for (no
            # deadlock with a round parking two): the handover under the lock marks what is left.
            cursor.execute(
                "UPDATE outbox SET published_at = created_at"
                " WHERE published_at IS NULL AND parked_at IS NULL AND position IN ("
                " SELECT position FROM outbox WHERE published_at IS NULL AND parked_at IS NULL"
                " AND position <= %s ORDER BY position LIMIT %s FOR UPDATE SKIP LOCKED)",
                (highest, batch_rows),
            )
            marked += cursor.rowcount
            if cursor.rowcount < batch_rows:
                return marked


def _to_polling(cursor: psycopg.Cursor[Any], slot: str, bounds: _Bounds, batch_rows: int) -> str:
    cursor.execute("CREATE TEMPORARY TABLE handover_held (position bigint NOT NULL) ON COMMIT DROP")

    def hold(positions: list[int]) -> None:
        if positions:
            with cursor.copy("COPY handover_held (position) FROM STDIN") as copy:
                for position in positions:
                    copy.write_row((position,))

    if slot_exists(cursor, slot):
        upto = flush_lsn(cursor)
        for batch in stream_undelivered_positions(
            cursor,
            slot,
            upto_lsn=upto,
            batch_rows=batch_rows,
            before_fetch=lambda: bounds.apply(cursor, "reading the slot"),
        ):
            hold(batch)
    hold(replays.hand_back(cursor))
    cursor.execute(
        "UPDATE outbox SET published_at = created_at"
        " WHERE published_at IS NULL AND parked_at IS NULL"
        " AND NOT EXISTS (SELECT 1 FROM handover_held AS h WHERE h.position = outbox.position)"
    )
    # Rows handed to the logical relay or replayed were marked published then: pending again.
    cursor.execute(
        "UPDATE outbox SET published_at = NULL"
        " WHERE parked_at IS NULL AND position IN (SELECT position FROM handover_held)"
    )
    held = cursor.rowcount
    return f"switched to polling; {held} rows the slot or a replay still held left pending"


def _drop_slot(connection: psycopg.Connection, slot: str, bounds: _Bounds) -> bool:
    """Drop the slot (so it stops holding WAL) and the publication, under the slot's lock: a relay round
    reading it finishes first."""
    with connection.transaction(), connection.cursor() as cursor:
        bounds.apply(cursor, "dropping the slot")
        lock_slot(cursor, slot)
        dropped = slot_exists(cursor, slot)
        if dropped:
            cursor.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        cursor.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
    return dropped


def drop_relay_slot(
    connection: psycopg.Connection,
    slot: str,
    *,
    seconds_left: Callable[[], float] = lambda: math.inf,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
) -> bool:
    """Stack deletion: drop the slot (a slot nobody reads keeps WAL forever) and the publication, within
    `seconds_left()` from now."""
    with cancelled_after(seconds_left(), lambda: (connection,), "dropping the slot"):
        return _drop_slot(connection, slot, _Bounds(seconds_left, lock_wait_seconds))
