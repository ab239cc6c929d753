"""Keeping the order database small, and saying how its outbox is doing.

Rows leave in bounded batches (one short transaction each, so maintenance never holds locks the
writers or the publisher wait on for long):
- outbox rows published longer ago than the republish window (OutboxTtlDays: as long as the DynamoDB
  outbox items live, so replay works the same on both stores); with the logical relay, rows written (or
  redriven) longer ago than that (it marks nothing: its slot holds what it has not sent, in the WAL,
  whether the row is still in the table or not), except, while the slot is lost or its recovery has not
  handed the gap over, the rows the recovery may republish (slot_recovery.rows_a_recovery_needs_since);
- parked rows only once an operator discarded them, the window after (shop.adapters.postgres.parked): a
  parked row not redriven or discarded is evidence, and may be the only copy of its event (a record too
  large for a poison queue message);
- inbox rows older than the consumers' redelivery window (the same window as Powertools' idempotency
  records: runtime.config.Settings.idempotency_expires_after_seconds);
- request keys past their expiry;
- finished replay sets (shop.adapters.postgres.replays) finished longer ago than the outbox's republish
  window, except the one a slot recovery still names and a spill the slot may read again.
Pending rows are never deleted, however old, nor rows a replay or a handover to the logical relay still
names (its replay set: shop.adapters.postgres.replays).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from shop.adapters.postgres.outbox import relay_mode
from shop.adapters.postgres.slot_recovery import read_slot_state, rows_a_recovery_needs_since

# Each DELETE picks its batch in a subquery (LIMIT), then deletes. A row a writer changes after the pick
# (its lock makes the DELETE wait) is deleted or not by the outer WHERE alone, read on the row as the
# writer committed it (READ COMMITTED): so a DELETE of rows that can change repeats its condition there.
# Without it, a row a replay (includeExpired) made pending again, or a request key a new request took
# over, was deleted all the same. Inbox rows and finished replay sets are never changed.
#
# A row a replay set still names (a replay, or a handover to the logical relay, not drained yet:
# shop.adapters.postgres.replays) stays, however old: it is still to be published. (Its foreign key would
# refuse the delete anyway, failing the whole batch.) So does a row created since `kept_since`, when
# given: a lost slot's recovery may need it.
_DELETE_OUTBOX = """
DELETE FROM outbox WHERE position IN (
    SELECT position FROM outbox
    WHERE {done} < clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM outbox_replay_rows AS named WHERE named.position = outbox.position)
      AND (%(kept_since)s::timestamptz IS NULL OR created_at < %(kept_since)s)
    LIMIT %(limit)s)
  AND {done} < clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
"""
_DELETE_INBOX = """
DELETE FROM inbox WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM inbox
    WHERE processed_at < clock_timestamp() - make_interval(secs => %s)
    LIMIT %s)
"""
_DELETE_REQUEST_KEYS = """
DELETE FROM request_keys WHERE (caller, idempotency_key) IN (
    SELECT caller, idempotency_key FROM request_keys WHERE expires_at < clock_timestamp() LIMIT %s)
  AND expires_at < clock_timestamp()
"""
# A replay set (shop.adapters.postgres.replays) leaves once finished (activated, and every row it named on
# the bus or parked: none left in outbox_replay_rows, whose ON DELETE CASCADE would otherwise take pending
# rows with it) longer ago than the outbox rows' republish window, and only when nothing can still need it:
# - outbox_slot.recovery_replay_id names it: a recovery is over once its set is finished, but the record
#   stays until it is cleared (slot_recovery.finish_recovery_if_drained: by maintenance, after these
#   deletes, or by the recover-slot run that reports what the recovery left out);
# - its source_lsn (a spill: the end of the transaction the logical relay recorded as a set, UNIQUE) is
#   what keeps that transaction, read again, from being recorded twice (replays.record_set, ON CONFLICT
#   (source_lsn) DO NOTHING): the relay commits the set, then moves its slot past source_lsn in another
#   transaction, which may never come (a crash, another relay on the slot). Until a slot has confirmed
#   past it, the transaction can be decoded again, and without its set it would become a new set, every
#   row of it published again. A slot confirmed exactly at source_lsn has passed it (a transaction is
#   never decoded again once its end is confirmed); kept all the same, until the slot moves on. Only
#   this database's logical slots can decode its transactions; a slot whose confirmed position is not
#   known keeps every spill.
_DELETE_REPLAY_SETS = """
DELETE FROM outbox_replay WHERE replay_id IN (
    SELECT replay_id FROM outbox_replay AS s
    WHERE s.finished_at < clock_timestamp() - make_interval(secs => %s)
      AND NOT EXISTS (SELECT 1 FROM outbox_replay_rows AS named WHERE named.replay_id = s.replay_id)
      AND NOT EXISTS (SELECT 1 FROM outbox_slot AS b WHERE b.recovery_replay_id = s.replay_id)
      AND (s.source_lsn IS NULL OR NOT EXISTS (
          SELECT 1 FROM pg_replication_slots AS slot
          WHERE slot.slot_type = 'logical' AND slot.database = current_database()
            AND coalesce(slot.confirmed_flush_lsn <= s.source_lsn, true)))
    LIMIT %s)
"""
# Each part reads an index or the catalogue, never the whole table: the outbox holds weeks of rows.
# A row made pending again (a replay's reset, a redrive) waits since then (pending_since), not since it
# was written: a replay of an old window is not a publisher behind by the window's age.
_PENDING = """
SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(coalesce(pending_since, created_at))), 0)
FROM outbox WHERE published_at IS NULL AND parked_at IS NULL
"""
# Rows a replay set names wait since the relay read its message (activated_at), whatever their own age.
_OLDEST_SET_WAIT = """
SELECT extract(epoch FROM clock_timestamp() - min(s.activated_at))::float8
FROM outbox_replay AS s
WHERE s.activated_at IS NOT NULL AND s.finished_at IS NULL
  AND EXISTS (SELECT 1 FROM outbox_replay_rows AS r WHERE r.replay_id = s.replay_id)
"""
_SIZE = """
SELECT (SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL AND discarded_at IS NULL),
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'outbox'::regclass)
"""


@dataclass(frozen=True, slots=True)
class OutboxHealth:
    pending: int | None  # rows not on the bus yet; None with the logical relay (it marks no row)
    oldest_pending_seconds: float | None  # None: not known this time (the slot was busy too long)
    parked: int  # parked rows not yet redriven or discarded
    rows: int  # the planner's estimate (pg_class.reltuples), refreshed by autovacuum


def delete_published_outbox_rows(
    cursor: psycopg.Cursor[Any],
    older_than_seconds: int,
    limit: int,
    *,
    slot: str,
    commit_margin: timedelta,
) -> int:
    # What "done" means depends on the relay that owns the outbox (the logical relay marks no row
    # published), read from the database, not from this function's configuration, which a deploy that
    # switched the relay may not have reached yet: under a logical rule a polling outbox's pending rows
    # would go. The DELETE's own lock is taken first, so no switch (EXCLUSIVE) changes the mode before
    # this transaction ends.
    cursor.execute("LOCK TABLE outbox IN ROW EXCLUSIVE MODE")
    logical_relay = relay_mode(cursor) == "logical"
    kept_since = None
    # A parked row is evidence, and may be the only copy of its event: kept until an operator redrives it
    # (then it is published again, and leaves like any other) or discards it (it leaves the window after).
    if logical_relay:
        done = (
            "CASE WHEN parked_at IS NOT NULL AND discarded_at IS NULL THEN NULL"
            " ELSE greatest(created_at, redriven_at, discarded_at) END"
        )
        # The slot, not the table, holds what it has not delivered; once it is lost, the table is the only
        # copy of the gap, which its recovery republishes from the table.
        kept_since = rows_a_recovery_needs_since(read_slot_state(cursor, slot), commit_margin)
    else:
        done = "coalesce(published_at, discarded_at)"
    cursor.execute(
        _DELETE_OUTBOX.format(done=done),
        {"older_than_seconds": older_than_seconds, "limit": limit, "kept_since": kept_since},
    )
    return cursor.rowcount


def delete_inbox_rows(cursor: psycopg.Cursor[Any], older_than_seconds: int, limit: int) -> int:
    cursor.execute(_DELETE_INBOX, (older_than_seconds, limit))
    return cursor.rowcount


def delete_expired_request_keys(cursor: psycopg.Cursor[Any], limit: int) -> int:
    cursor.execute(_DELETE_REQUEST_KEYS, (limit,))
    return cursor.rowcount


def delete_finished_replay_sets(cursor: psycopg.Cursor[Any], older_than_seconds: int, limit: int) -> int:
    cursor.execute(_DELETE_REPLAY_SETS, (older_than_seconds, limit))
    return cursor.rowcount


def _one_row(cursor: psycopg.Cursor[Any], query: str) -> tuple[Any, ...]:
    cursor.execute(query)
    found = cursor.fetchone()
    assert found is not None  # an aggregate query always answers one row
    return tuple(found)


def outbox_health(cursor: psycopg.Cursor[Any]) -> OutboxHealth:
    """The polling publisher's outbox: pending rows are the ones it has not published."""
    pending, oldest = _one_row(cursor, _PENDING)
    parked, rows = _one_row(cursor, _SIZE)
    return OutboxHealth(int(pending), float(oldest), int(parked), int(rows))


def logical_outbox_health(
    cursor: psycopg.Cursor[Any], oldest_undelivered_seconds: float | None
) -> OutboxHealth:
    """The logical relay's outbox: what it has not sent is in its slot, whose age the caller read, and in
    its replay sets (a replay, a handover, a recovered gap: drained across rounds)."""
    parked, rows = _one_row(cursor, _SIZE)
    (set_wait,) = _one_row(cursor, _OLDEST_SET_WAIT)
    oldest = oldest_undelivered_seconds
    if oldest is not None and set_wait is not None:
        oldest = max(oldest, float(set_wait))
    return OutboxHealth(None, oldest, int(parked), int(rows))
