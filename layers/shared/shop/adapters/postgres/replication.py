"""The outbox read from the write-ahead log (PostgresRelay=logical): a publication of the outbox's inserts,
a logical replication slot decoding it with the built-in `pgoutput` plugin, and the SQL functions that
read the slot (peek) and move it (advance).

Why the SQL interface and not the streaming replication protocol: psycopg 3 does not speak the
replication protocol, and a Lambda function that runs for a minute gains little from a push stream;
peeking costs one query per round. The slot is the relay's only bookmark: it moves (advance) only to
the end of a transaction whose every event is on the bus or parked, so a crash anywhere before that
decodes the same transactions again (at least once, in commit order), and one after it never loses one.

A slot belongs to the whole server (cluster), not one database: its name carries the database's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from shop.adapters.postgres import replays
from shop.adapters.postgres.connection import STATEMENT_TIMEOUT_MS, limit_statement_time, wait_for_locks
from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.pgoutput import (
    Begin,
    Commit,
    DecodingError,
    Insert,
    LogicalMessage,
    Relation,
    decode_message,
    lsn_text,
    parse_lsn,
)

PUBLICATION = "outbox_inserts"
# A transactional logical decoding message with this prefix names a replay set (shop.adapters.postgres.
# replays: JSON {"replay": id}): the relay activates the set where the message sits in the log, once
# everything committed before it is out, and drains it chunk by chunk. Messages of the earlier format
# name the rows themselves (a JSON list of positions): the relay records them as a set of its own.
REPLAY_PREFIX = "outbox.replay"
OUTBOX_TABLE = ("public", "outbox")
# The relay's advisory lock: one reader per slot (a slot serves one session at a time anyway; the lock
# makes a second relay wait its turn instead of failing with "slot is active").
_LOCK_CLASS = 0x0B0C


def slot_name(database_name: str) -> str:
    """The outbox slot of one database (slot names: lower-case letters, digits and _, 63 at most)."""
    return ("outbox_" + re.sub(r"[^a-z0-9_]", "_", database_name.lower()))[:63]


@dataclass(frozen=True, slots=True)
class DecodedTransaction:
    """One committed transaction's outbox rows, in the order they were written."""

    end_lsn: int  # confirm this and the transaction is never decoded again
    commit_time: datetime
    rows: list[OutboxRow] = field(default_factory=list)
    replayed: list[int] = field(default_factory=list)  # positions a replay message of the old format named
    replay_ids: list[int] = field(default_factory=list)  # replay sets whose messages it carries


@dataclass(frozen=True, slots=True)
class SlotChanges:
    transactions: list[DecodedTransaction]
    # Where the slot may move once every transaction above is handled: the end of the last one when the
    # read stopped at its change limit, else the position the read went up to (the flush position, or the
    # end of the window it was given; transactions without outbox rows send nothing, yet their WAL must
    # be released too).
    read_to_lsn: int


@dataclass(frozen=True, slots=True)
class SlotHealth:
    exists: bool
    retained_bytes: int  # WAL kept for the slot (from its restart position)
    lag_bytes: int  # WAL written since the slot's confirmed position
    wal_status: str  # reserved / extended / unreserved / lost (lost: the slot can no longer be read)


def ensure_publication_and_slot(connection: psycopg.Connection, slot: str) -> bool:
    """Create the publication and the slot when missing (autocommit connection: a slot cannot be created
    in a transaction that wrote). True when the slot was created now."""
    if (
        connection.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone()
        is None
    ):
        connection.execute(
            f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {'.'.join(OUTBOX_TABLE)} WITH (publish = 'insert')"
        )
    if slot_exists(connection, slot):
        return False
    connection.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return True


def drop_publication_and_slot(connection: psycopg.Connection, slot: str) -> bool:
    """Drop the slot (so it stops holding WAL) and the publication; True when a slot was dropped."""
    dropped = slot_exists(connection, slot)
    if dropped:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    connection.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
    return dropped


def slot_exists(connection: psycopg.Connection | psycopg.Cursor[Any], slot: str) -> bool:
    found = connection.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return found.fetchone() is not None


def try_lock_slot(cursor: psycopg.Cursor[Any], slot: str) -> bool:
    """Take the slot's advisory lock for this transaction; False when another relay holds it."""
    cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, slot))
    found = cursor.fetchone()
    return bool(found and found[0])


def lock_slot(cursor: psycopg.Cursor[Any], slot: str) -> None:
    """Wait for the slot's advisory lock (handover: the relay finishes its round first)."""
    cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, slot))


def lock_slot_for_session(cursor: psycopg.Cursor[Any], slot: str) -> None:
    """Wait for the slot's advisory lock and keep it past this transaction, until unlock_slot_for_session
    or the connection closes (a slot's recovery: several transactions, no relay round in between)."""
    cursor.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_CLASS, slot))


def unlock_slot_for_session(cursor: psycopg.Cursor[Any], slot: str) -> None:
    cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_CLASS, slot))


_PEEK = """
SELECT data
FROM pg_logical_slot_peek_binary_changes(
    %s, %s::pg_lsn, %s, 'proto_version', '1', 'publication_names', %s, 'messages', 'true')
"""


@dataclass(frozen=True, slots=True)
class RelayState:
    """What a relay round reads first, under the slot's lock, in one statement."""

    mode: str  # outbox_relay.mode: the relay the outbox was last handed over to
    flush_lsn: int
    confirmed_lsn: int | None  # None: no such slot
    sets_pending: bool  # some replay set still names a row
    recovery_unfinished: bool  # a slot recovery recorded, its gap not handed over yet (slot_recovery)


_RELAY_STATE = """
SELECT (SELECT mode FROM outbox_relay), pg_current_wal_flush_lsn()::text,
       (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s),
       EXISTS (SELECT 1 FROM outbox_replay_rows),
       EXISTS (SELECT 1 FROM outbox_slot WHERE slot_name = %s
               AND recovery_since IS NOT NULL AND recovery_handed_over_at IS NULL)
"""


def read_relay_state(cursor: psycopg.Cursor[Any], slot: str) -> RelayState:
    """Read after the slot's lock is taken (a statement of its own: its snapshot then sees a switch that
    committed while the lock was waited for)."""
    cursor.execute(_RELAY_STATE, (slot, slot))
    found = cursor.fetchone()
    assert found is not None
    mode, flush, confirmed, pending, recovering = found
    return RelayState(
        str(mode or "polling"),
        parse_lsn(flush),
        parse_lsn(confirmed) if confirmed else None,
        bool(pending),
        bool(recovering),
    )


def peek_changes(
    cursor: psycopg.Cursor[Any], slot: str, max_changes: int, *, upto_lsn: int | None = None
) -> SlotChanges:
    """Decode the slot's next transactions, up to about `max_changes` rows (whole transactions) and those
    committed before `upto_lsn` (default: the flush position; a window bounds how much WAL one read
    decodes), without moving it. Raises DecodingError on bytes that are not pgoutput v1 (a server or
    protocol change)."""
    upto = flush_lsn(cursor) if upto_lsn is None else upto_lsn
    cursor.execute(_PEEK, (slot, lsn_text(upto), max_changes, PUBLICATION))
    messages = cursor.fetchall()
    transactions = list(_transactions(bytes(data) for (data,) in messages))  # each message names its LSNs
    if len(messages) >= max_changes and transactions:
        return SlotChanges(transactions, transactions[-1].end_lsn)  # stopped at the limit: more to come
    return SlotChanges(transactions, upto)


def _transactions(messages: Iterator[bytes]) -> Iterator[DecodedTransaction]:
    columns: dict[int, tuple[str, ...]] = {}
    begin: Begin | None = None
    rows: list[OutboxRow] = []
    replayed: list[int] = []
    replay_ids: list[int] = []
    for data in messages:
        message = decode_message(data)
        if isinstance(message, LogicalMessage):
            if message.prefix == REPLAY_PREFIX and message.transactional:
                named = _replay_content(message.content)
                if isinstance(named, list):
                    replayed.extend(named)
                else:
                    replay_ids.append(named)
        elif isinstance(message, Relation):
            if (message.namespace, message.name) == OUTBOX_TABLE:
                columns[message.relation_id] = message.columns
        elif isinstance(message, Begin):
            begin, rows, replayed, replay_ids = message, [], [], []
        elif isinstance(message, Insert):
            if message.relation_id not in columns:
                raise DecodingError(f"insert into relation {message.relation_id} before its Relation message")
            rows.append(_outbox_row(dict(zip(columns[message.relation_id], message.values, strict=True))))
        elif isinstance(message, Commit):
            if begin is None:
                raise DecodingError("commit without begin")
            yield DecodedTransaction(message.end_lsn, message.commit_time, rows, replayed, replay_ids)
            begin = None


def _replay_content(content: bytes) -> int | list[int]:
    """A replay message's content: a set's id ({"replay": id}), or the old format's list of positions."""
    try:
        named = json.loads(content)
    except ValueError as exc:
        raise DecodingError(f"replay message is not JSON: {content[:100]!r}") from exc
    if isinstance(named, dict) and isinstance(named.get("replay"), int):
        return int(named["replay"])
    if isinstance(named, list) and all(isinstance(p, int) for p in named):
        return named
    raise DecodingError(f"replay message names neither a set nor positions: {content[:100]!r}")


def emit_replay(cursor: psycopg.Cursor[Any], positions: list[int], kind: str = "replay") -> int | None:
    """Ask the logical relay, in the caller's transaction, to publish these rows (again) once it commits:
    a replay set naming them (shop.adapters.postgres.replays) and the message that activates it where it
    sits in the log. The relay drains the set across rounds: the slot is past the message long before
    every row is out; replays.progress() says when it is. Returns the set's id (None: no rows)."""
    replay_id = replays.record_set(cursor, positions, kind)
    if replay_id is not None:
        cursor.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)", (REPLAY_PREFIX, json.dumps({"replay": replay_id}))
        )
    return replay_id


def stream_undelivered_positions(
    cursor: psycopg.Cursor[Any],
    slot: str,
    *,
    upto_lsn: int,
    batch_rows: int,
    before_fetch: Callable[[], None] = lambda: None,
) -> Iterator[list[int]]:
    """The positions of the outbox rows the slot still holds (inserts, and old-format replay messages), in
    batches, read through a server-side cursor: the server decodes the slot once, and only `batch_rows`
    messages at a time reach this process, however much the slot holds. Only positions are kept."""
    columns: dict[int, tuple[str, ...]] = {}
    with cursor.connection.cursor(name=f"undelivered_{slot}") as stream:
        before_fetch()
        stream.execute(_PEEK, (slot, lsn_text(upto_lsn), None, PUBLICATION))
        while True:
            before_fetch()
            messages = stream.fetchmany(batch_rows)
            if not messages:
                return
            positions: list[int] = []
            for (data,) in messages:
                message = decode_message(bytes(data))
                if isinstance(message, Relation) and (message.namespace, message.name) == OUTBOX_TABLE:
                    columns[message.relation_id] = message.columns
                elif isinstance(message, Insert) and message.relation_id in columns:
                    values = dict(zip(columns[message.relation_id], message.values, strict=True))
                    if values.get("position") is not None:
                        positions.append(int(str(values["position"])))
                elif isinstance(message, LogicalMessage) and message.prefix == REPLAY_PREFIX:
                    named = _replay_content(message.content)
                    if isinstance(named, list):
                        positions.extend(named)
            yield positions


def confirmed_lsn(cursor: psycopg.Cursor[Any], slot: str) -> int:
    cursor.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    found = cursor.fetchone()
    if found is None or found[0] is None:
        raise LookupError(f"replication slot {slot} does not exist")
    return parse_lsn(found[0])


def flush_lsn(cursor: psycopg.Cursor[Any]) -> int:
    cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
    found = cursor.fetchone()
    assert found is not None
    return parse_lsn(found[0])


def _outbox_row(values: dict[str, str | None]) -> OutboxRow:
    def text(name: str) -> str:
        value = values.get(name)
        if value is None:
            raise DecodingError(f"outbox column {name} missing from the decoded row")
        return value

    return OutboxRow(
        position=int(text("position")),
        event_id=text("event_id"),
        aggregate_id=text("aggregate_id"),
        sequence=int(text("sequence")),
        envelope=text("envelope"),
        trace_header=values.get("trace_header"),
        # Text in the reading session's DateStyle (ISO, the default: 2026-11-25 13:11:00.518158+00).
        created_at=datetime.fromisoformat(text("created_at")),
        attempts=int(values.get("attempts") or 0),
    )


def advance_slot(cursor: psycopg.Cursor[Any], slot: str, lsn: int) -> bool:
    """Confirm the slot up to `lsn`; False (and no change) when it is already there or further."""
    if confirmed_lsn(cursor, slot) >= lsn:
        return False
    cursor.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn_text(lsn)))
    return True


_HEALTH = """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       coalesce(wal_status, 'unknown')
FROM pg_replication_slots WHERE slot_name = %s
"""


def oldest_undelivered_seconds(cursor: psycopg.Cursor[Any], slot: str, wait_seconds: float) -> float | None:
    """Age of the oldest commit the slot has not confirmed (0 when it holds nothing), read under the
    relay's lock (rounds are short); None when the relay held it longer than `wait_seconds`."""
    wait_for_locks(cursor, int(wait_seconds * 1000))
    try:
        with (
            cursor.connection.transaction()
        ):  # a savepoint: a lock timeout leaves the caller's transaction usable
            lock_slot(cursor, slot)
    except psycopg.errors.LockNotAvailable:
        return None
    limit_statement_time(cursor, STATEMENT_TIMEOUT_MS)  # the wait is over: the session's limit again
    changes = peek_changes(cursor, slot, 1)
    if not changes.transactions:
        return 0.0
    cursor.execute(
        "SELECT extract(epoch FROM clock_timestamp() - %s)", (changes.transactions[0].commit_time,)
    )
    found = cursor.fetchone()
    assert found is not None
    return max(float(found[0]), 0.0)


def slot_health(cursor: psycopg.Cursor[Any], slot: str) -> SlotHealth:
    cursor.execute(_HEALTH, (slot,))
    found = cursor.fetchone()
    if found is None:
        return SlotHealth(False, 0, 0, "missing")
    retained, lag, status = found
    return SlotHealth(True, int(retained or 0), int(lag or 0), str(status))
