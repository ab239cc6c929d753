"""Replay sets: outbox rows the logical relay (PostgresRelay=logical) publishes from the table, chunk by
chunk, beside what it reads from its slot (tables outbox_replay and outbox_replay_rows, migration 0004).

Three things make one:
- a replay (`python -m operations replay`): published rows named to go out again;
- a handover from the polling publisher (shop.adapters.postgres.relay_mode): the rows it had not
  published when the outbox switched to the logical relay;
- a spill: a transaction the relay read from its slot with more rows than a round publishes (or a replay
  message of the old format, naming its rows inline), recorded by the relay itself.

Why sets and not one message naming every row: a message in the log is one indivisible transaction for
the relay; one that takes longer to publish than an invocation never gets the slot past it (every
invocation dies before the advance, the next reads it again). A set is written in the requester's
transaction, with a small message naming it (shop.adapters.postgres.replication.emit_replay); the relay
*activates* the set when it reads the message, once its slot is past everything committed before it
(so a replayed row never overtakes its order's undelivered earlier events), moves the slot on at once,
and drains the set: each round publishes a bounded chunk and removes the rows it put on the bus or
parked in the same transaction as their parked marks. Later events keep flowing meanwhile, each
order's still in sequence: a slot row whose order has an earlier row pending in any set waits for that
row, which the relay publishes first in the same round (earlier_pending_rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.pgoutput import lsn_text

KINDS = ("replay", "handover", "spill")

# Rows pending in any set (activated or not) of these orders, earlier than the order's first row in the
# round: they go out before it.
_EARLIER = """
SELECT DISTINCT ON (o.position)
       o.position, o.event_id, o.aggregate_id, o.sequence, o.envelope::text, o.trace_header, o.created_at,
       o.attempts, o.parked_at IS NOT NULL
FROM outbox AS o
JOIN unnest(%s::text[], %s::integer[]) AS first (aggregate_id, sequence)
  ON first.aggregate_id = o.aggregate_id AND o.sequence < first.sequence
WHERE EXISTS (SELECT 1 FROM outbox_replay_rows AS r WHERE r.position = o.position)
ORDER BY o.position
"""
# The next chunk of activated sets: each order's rows together, in sequence, so a chunk cut between two
# of an order's rows leaves the later one to the next round.
_CHUNK = """
SELECT o.position, o.event_id, o.aggregate_id, o.sequence, o.envelope::text, o.trace_header, o.created_at,
       o.attempts, o.parked_at IS NOT NULL
FROM outbox AS o
WHERE o.position IN (
    SELECT r.position FROM outbox_replay_rows AS r
    JOIN outbox_replay AS s ON s.replay_id = r.replay_id
    WHERE s.activated_at IS NOT NULL)
  AND NOT (o.position = ANY(%s))
ORDER BY o.aggregate_id, o.sequence
LIMIT %s
"""
_FINISH = """
UPDATE outbox_replay AS s SET finished_at = clock_timestamp()
WHERE s.finished_at IS NULL AND s.activated_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM outbox_replay_rows AS r WHERE r.replay_id = s.replay_id)
"""


@dataclass(frozen=True, slots=True)
class SetRow:
    """A row a set names, as the outbox holds it now (parked: done without publishing)."""

    row: OutboxRow
    parked: bool


def _set_rows(records: list[tuple[Any, ...]]) -> list[SetRow]:
    return [SetRow(OutboxRow(*record[:8]), bool(record[8])) for record in records]


def record_set(
    cursor: psycopg.Cursor[Any],
    positions: list[int],
    kind: str,
    *,
    source_lsn: int | None = None,
    activated: bool = False,
) -> int | None:
    """A set naming the outbox rows at `positions` (those still in the table), in the caller's
    transaction; its id, or None when there is nothing to name or a set from `source_lsn` exists."""
    if kind not in KINDS:
        raise ValueError(f"unknown replay set kind {kind!r}")
    if not positions:
        return None
    cursor.execute(
        "INSERT INTO outbox_replay (kind, source_lsn, activated_at)"
        " VALUES (%s, %s::pg_lsn, CASE WHEN %s THEN clock_timestamp() END)"
        " ON CONFLICT (source_lsn) DO NOTHING RETURNING replay_id",
        (kind, lsn_text(source_lsn) if source_lsn is not None else None, activated),
    )
    found = cursor.fetchone()
    if found is None:
        return None
    replay_id = int(found[0])
    cursor.execute(
        "INSERT INTO outbox_replay_rows (replay_id, position)"
        " SELECT %s, position FROM outbox WHERE position = ANY(%s) ON CONFLICT DO NOTHING",
        (replay_id, sorted(set(positions))),
    )
    if activated:
        cursor.execute(_FINISH)  # a spill whose rows are all gone already
    return replay_id


def earlier_pending_rows(cursor: psycopg.Cursor[Any], firsts: dict[str, int]) -> list[SetRow]:
    """Rows pending in a set, of these orders, with a sequence below the order's given one (its first row
    in the round); in each order's sequence."""
    if not firsts:
        return []
    orders = sorted(firsts)
    cursor.execute(_EARLIER, (orders, [firsts[order] for order in orders]))
    rows = _set_rows(cursor.fetchall())
    return sorted(rows, key=lambda each: (each.row.aggregate_id, each.row.sequence))


def next_chunk(cursor: psycopg.Cursor[Any], limit: int, exclude: list[int]) -> list[SetRow]:
    """The next rows of activated sets, at most `limit`, each order's in sequence."""
    if limit <= 0:
        return []
    cursor.execute(_CHUNK, (exclude, limit))
    return _set_rows(cursor.fetchall())


def mark_done(cursor: psycopg.Cursor[Any], positions: list[int]) -> list[int]:
    """These rows are on the bus or parked: no set names them any longer (in the transaction of their
    parked marks). Returns the sets it finished."""
    if positions:
        cursor.execute("DELETE FROM outbox_replay_rows WHERE position = ANY(%s)", (sorted(set(positions)),))
    return finish_drained(cursor)


def finish_drained(cursor: psycopg.Cursor[Any]) -> list[int]:
    cursor.execute(_FINISH + " RETURNING s.replay_id")
    return [int(replay_id) for (replay_id,) in cursor.fetchall()]


def activated_among(cursor: psycopg.Cursor[Any], replay_ids: list[int]) -> set[int]:
    """The sets among `replay_ids` already activated, and the ids no set has (nothing to activate)."""
    if not replay_ids:
        return set()
    cursor.execute(
        "SELECT replay_id, activated_at IS NOT NULL FROM outbox_replay WHERE replay_id = ANY(%s)",
        (replay_ids,),
    )
    known = dict(cursor.fetchall())
    return {replay_id for replay_id in replay_ids if known.get(replay_id, True)}


def activate(cursor: psycopg.Cursor[Any], replay_ids: list[int]) -> None:
    """The slot is past everything committed before these sets' messages: their rows may go out."""
    if replay_ids:
        cursor.execute(
            "UPDATE outbox_replay SET activated_at = clock_timestamp()"
            " WHERE replay_id = ANY(%s) AND activated_at IS NULL",
            (replay_ids,),
        )
        cursor.execute(_FINISH)


@dataclass(frozen=True, slots=True)
class SetProgress:
    exists: bool  # False: handed back to the polling publisher by a switch (or never recorded)
    finished: bool  # activated, and every row it named is on the bus or parked
    pending_event_ids: list[str]


def progress(cursor: psycopg.Cursor[Any], replay_id: int) -> SetProgress:
    cursor.execute("SELECT finished_at IS NOT NULL FROM outbox_replay WHERE replay_id = %s", (replay_id,))
    found = cursor.fetchone()
    if found is None:
        return SetProgress(False, False, [])
    cursor.execute(
        "SELECT o.event_id FROM outbox_replay_rows AS r JOIN outbox AS o ON o.position = r.position"
        " WHERE r.replay_id = %s ORDER BY o.position",
        (replay_id,),
    )
    return SetProgress(True, bool(found[0]), [event_id for (event_id,) in cursor.fetchall()])


def pending_positions(cursor: psycopg.Cursor[Any]) -> list[int]:
    """Every row a set still names (each once): not on the bus yet as the set asks."""
    cursor.execute("SELECT DISTINCT position FROM outbox_replay_rows ORDER BY position")
    return [position for (position,) in cursor.fetchall()]


def hand_back(cursor: psycopg.Cursor[Any]) -> list[int]:
    """A switch to the polling publisher: every set is dropped; returns the rows they still named (the
    caller makes them pending for the publisher)."""
    positions = pending_positions(cursor)
    cursor.execute("DELETE FROM outbox_replay")
    return positions
