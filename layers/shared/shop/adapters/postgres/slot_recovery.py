"""A lost outbox slot (PostgresRelay=logical): how it is recognised, and the SQL of its recovery.

A slot is lost when the logical relay can no longer read it while the outbox's relay mode (outbox_relay)
is logical: it is missing (a writer replaced by one that does not have it: whether Aurora keeps a
logical slot across a writer failover is not documented; dropped by hand), or invalidated
(`wal_status` = lost: the WAL it needed was removed; `invalidation_reason` on PostgreSQL 17+, e.g.
`wal_removed`, `idle_timeout`, `rows_removed`; `conflicting` on 16). Nothing is lost from the table:
every event is still an outbox row. What is lost is the bookmark: which committed rows the slot had not
delivered yet. The database keeps a bound of its own for that day (outbox_slot.delivered_before, which
the maintenance function records each minute: every row committed before it was delivered). Rows a
replay or a switch handed to the relay are in replay sets (shop.adapters.postgres.replays), in the table:
only the messages that activate the sets are in the WAL.

Recovery (shop.runtime.order_store_slot_recovery, `python -m operations recover-slot`) records that it
is under way before it touches the slot, recreates the slot, then, in one transaction that holds the
outbox in SHARE mode (no outbox row commits meanwhile), hands the gap (every row created since the gap's
start, and every row the new slot decoded so far) to the logical relay as an activated replay set (the
relay drains it from the table chunk by chunk, each order's rows in sequence; a later event of an order
waits for its earlier rows pending in a set), activates the sets whose messages were not read (in the
lost WAL), and records the hand-over; once that is committed, it moves the new slot past what it had
decoded (all of it is in the set). The set is in the table: a second loss while it drains loses none of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from shop.adapters.postgres import replays
from shop.adapters.postgres.replication import OUTBOX_TABLE, PUBLICATION, flush_lsn, peek_changes

RUNBOOK = "docs/operations.md#replication-slot-lost"
_PEEK_ALL = 10_000_000  # the new slot holds seconds of WAL when the gap is handed over


def slot_problem(row: Mapping[str, Any] | None) -> str | None:
    """Why a slot (its pg_replication_slots row as JSON, any server version) cannot be read by the relay;
    None when it can."""
    if row is None:
        return "missing"
    if row.get("slot_type") != "logical" or row.get("plugin") != "pgoutput":
        return f"not a pgoutput logical slot ({row.get('slot_type')}, {row.get('plugin')})"
    if row.get("invalidation_reason"):  # PostgreSQL 17+
        return f"invalidated ({row['invalidation_reason']})"
    if row.get("conflicting") is True:  # PostgreSQL 16+: invalidated by a conflict with recovery
        return "invalidated (conflicting with recovery)"
    if row.get("wal_status") == "lost":  # PostgreSQL 13+: the WAL it needs was removed
        return "lost (wal_status = lost: the WAL it needs was removed)"
    return None


@dataclass(frozen=True, slots=True)
class HandedOver:
    """A recovery whose gap was handed over to the relay (outbox_slot's recovery columns)."""

    replay_id: int  # the activated replay set holding the gap
    since: datetime  # the gap's start
    started_at: datetime  # the recovery was recorded: the relay parked none of the gap since
    at: datetime  # the hand-over: the set names the gap's rows created until then
    expired: int  # gap rows left out: created before the republish window's horizon


@dataclass(frozen=True, slots=True)
class SlotState:
    slot: str
    relay_mode: str  # outbox_relay.mode: the relay the rows' publishing state was handed over to
    exists: bool
    problem: str | None  # slot_problem: None when the relay can read the slot
    confirmed_flush_lsn: str | None  # the slot's last confirmed position, while the catalogue has it
    delivered_before: datetime | None  # every row committed before it was delivered (outbox_slot)
    recovery_since: datetime | None  # a recovery under way republishes rows from here
    recovery_handed_over: bool  # its gap is an activated replay set: the relay drains it
    recovery_replay_id: int | None = None  # that set: a run waits for it, not for another run's
    handed_over: HandedOver | None = None  # the recovery, once handed over: what a run reports on
    recovery_drained: bool = False  # handed over, and the relay has drained its set

    @property
    def lost(self) -> bool:
        """The relay mode is logical and the slot cannot be read: no event gets out."""
        return self.relay_mode == "logical" and self.problem is not None

    @property
    def needs_recovery(self) -> bool:
        """Lost, or a recovery that stopped before it handed the gap over."""
        return self.lost or (self.recovery_since is not None and not self.recovery_handed_over)

    def describe(self) -> str:
        if self.relay_mode != "logical":
            return f"not read (the outbox's relay mode is {self.relay_mode})"
        if self.problem is not None:
            return self.problem
        if self.recovery_since is not None and not self.recovery_handed_over:
            return "recreated, its recovery unfinished (the gap not handed over yet)"
        if self.recovery_drained:
            return "recovered, the gap drained (recover-slot reports what was left out or parked)"
        if self.recovery_handed_over:
            return "recovered, the relay still publishing the gap"
        return "healthy"


# The recovery recorded in outbox_slot row b was handed over and is drained: its set is finished, or gone
# (handed back to the polling publisher by a switch).
_DRAINED = """(b.recovery_handed_over_at IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM outbox_replay AS s WHERE s.replay_id = b.recovery_replay_id AND s.finished_at IS NULL))"""


def _with_drained(template: str) -> str:
    return template.format(drained=_DRAINED)


_STATE = _with_drained("""
SELECT (SELECT mode FROM outbox_relay),
       (SELECT to_jsonb(s) FROM pg_replication_slots AS s WHERE s.slot_name = %(slot)s),
       b.delivered_before, b.recovery_since, b.recovery_started_at, b.recovery_handed_over_at,
       b.recovery_replay_id, b.recovery_expired, coalesce({drained}, false)
FROM (SELECT 1) AS one LEFT JOIN outbox_slot AS b ON b.slot_name = %(slot)s
""")


def read_slot_state(cursor: psycopg.Cursor[Any], slot: str) -> SlotState:
    cursor.execute(_STATE, {"slot": slot})
    found = cursor.fetchone()
    assert found is not None  # one row, whatever the tables hold
    mode, row, delivered_before, since, started_at, handed_over_at, replay_id, expired, drained = found
    handed_over = None
    if handed_over_at is not None and replay_id is not None:
        handed_over = HandedOver(int(replay_id), since, started_at, handed_over_at, int(expired or 0))
    return SlotState(
        slot=slot,
        relay_mode=str(mode or "polling"),
        exists=row is not None,
        problem=slot_problem(row),
        confirmed_flush_lsn=(row or {}).get("confirmed_flush_lsn"),
        delivered_before=delivered_before,
        recovery_since=since,
        recovery_handed_over=handed_over_at is not None,
        recovery_replay_id=replay_id,
        handed_over=handed_over,
        recovery_drained=bool(drained),
    )


EVERY_ROW = datetime.min.replace(tzinfo=UTC)


def rows_a_recovery_needs_since(state: SlotState, commit_margin: timedelta) -> datetime | None:
    """While the slot needs recovery (lost, or its recovery recorded and the gap not handed over yet), the
    outbox table is the only copy of the events the lost slot had not delivered: the earliest created_at
    of the rows a recovery may republish (where its gap starts: the recovery's start, and the recorded
    delivered bound less the commit margin, whichever is earlier; EVERY_ROW when neither is known).
    None when the slot needs no recovery: a gap handed over is in its replay set, whose rows retention
    keeps anyway."""
    if not state.needs_recovery:
        return None
    starts = [state.delivered_before - commit_margin] if state.delivered_before is not None else []
    if state.recovery_since is not None and not state.recovery_drained:  # a drained one is over
        starts.append(state.recovery_since)
    return min(starts, default=EVERY_ROW)


class ReplicationSlotLost(RuntimeError):
    """The logical relay cannot read its slot: it stops, saying what happened and what to do."""

    def __init__(self, state: SlotState) -> None:
        self.state = state
        position = state.confirmed_flush_lsn or "unknown: the slot is gone"
        super().__init__(
            f"replication slot {state.slot} is {state.describe()}, and the outbox's relay mode is logical: "
            f"the relay cannot read it, so no event committed since its last confirmed position ({position}) "
            "reaches the bus. The events are not lost: they are rows of the outbox table. Recover with "
            f"`python -m operations recover-slot` (runbook: {RUNBOOK})"
        )


@contextmanager
def lost_slot_detected(cursor: psycopg.Cursor[Any], slot: str) -> Iterator[None]:
    """Run a read of the slot in a savepoint; when it fails because the slot is missing or invalidated
    while the relay mode is logical, raise ReplicationSlotLost (not the server's error, which says neither
    the state nor what to do). Any other failure is raised as it is."""
    try:
        with cursor.connection.transaction():  # a savepoint: the state can be read after a failed read
            yield
    except (psycopg.errors.UndefinedObject, psycopg.errors.ObjectNotInPrerequisiteState):
        state = read_slot_state(cursor, slot)
        if not state.lost:
            raise
        raise ReplicationSlotLost(state) from None


def record_delivered_before(
    cursor: psycopg.Cursor[Any], slot: str, oldest_undelivered_seconds: float
) -> None:
    """Every row committed more than `oldest_undelivered_seconds` ago was delivered by the slot (the age of
    the oldest commit it still holds; 0 when it holds none). The bound only moves forward."""
    cursor.execute(
        """
        INSERT INTO outbox_slot (slot_name, delivered_before, delivered_at)
        VALUES (%s, clock_timestamp() - make_interval(secs => %s), clock_timestamp())
        ON CONFLICT (slot_name) DO UPDATE
        SET delivered_before = greatest(outbox_slot.delivered_before, excluded.delivered_before),
            delivered_at = excluded.delivered_at
        """,
        (slot, oldest_undelivered_seconds),
    )


# The gap's rows the relay parked while the recovery drained them: created in the gap (since its start,
# until the hand-over: the set names no later row) and parked since the recovery was recorded (a row parked
# before is in parkedInGap, left out of the set). Read through the parked rows' index.
_PARKED_ON_THE_WAY = """
SELECT o.event_id FROM outbox AS o
WHERE o.parked_at IS NOT NULL AND o.parked_at >= %(started_at)s
  AND o.created_at >= %(since)s AND o.created_at <= %(handed_over_at)s
ORDER BY o.position
"""


def parked_on_the_way(cursor: psycopg.Cursor[Any], recovery: HandedOver) -> list[str]:
    """The gap's rows the relay parked instead of publishing while it drained the recovery's set."""
    cursor.execute(
        _PARKED_ON_THE_WAY,
        {"started_at": recovery.started_at, "since": recovery.since, "handed_over_at": recovery.at},
    )
    return [event_id for (event_id,) in cursor.fetchall()]


_FINISH = _with_drained("""
UPDATE outbox_slot AS b
SET recovery_since = NULL, recovery_started_at = NULL, recovery_handed_over_at = NULL,
    recovery_replay_id = NULL, recovery_expired = NULL
WHERE b.slot_name = %(slot)s AND {drained}
  AND (NOT %(only_if_complete)s OR (
      coalesce(b.recovery_expired, 0) = 0
      AND NOT EXISTS (
          SELECT 1 FROM outbox AS o
          WHERE o.parked_at IS NOT NULL AND o.parked_at >= b.recovery_started_at
            AND o.created_at >= b.recovery_since AND o.created_at <= b.recovery_handed_over_at)))
""")


def finish_recovery_if_drained(
    cursor: psycopg.Cursor[Any], slot: str, *, only_if_complete: bool = False
) -> bool:
    """Clear a recovery whose gap the relay has drained (every row of its replay set on the bus or parked;
    or the set handed back to the polling publisher by a switch); True when one was. `only_if_complete`
    (the maintenance function): only one that left no gap row out and had none parked on the way; another
    stays recorded until a recover-slot run has reported it (a run that starts after the record is
    cleared finds the slot healthy, with nothing to say about the recovery)."""
    cursor.execute(_FINISH, {"slot": slot, "only_if_complete": only_if_complete})
    return cursor.rowcount > 0


# --- recovery ------------------------------------------------------------------------------------------
_BEGIN = _with_drained("""
INSERT INTO outbox_slot AS b (slot_name, recovery_since, recovery_started_at)
VALUES (%s, %s, clock_timestamp())
ON CONFLICT (slot_name) DO UPDATE
SET recovery_since = CASE WHEN {drained} THEN excluded.recovery_since
                          ELSE least(b.recovery_since, excluded.recovery_since) END,
    recovery_started_at = CASE WHEN {drained} THEN excluded.recovery_started_at
                               ELSE coalesce(b.recovery_started_at, excluded.recovery_started_at) END,
    recovery_handed_over_at = NULL, recovery_replay_id = NULL, recovery_expired = NULL
RETURNING recovery_since
""")


def begin_recovery(cursor: psycopg.Cursor[Any], slot: str, since: datetime) -> datetime:
    """Record that a recovery republishing rows from `since` is under way, before the slot is touched: a
    run that stops anywhere after this leaves the record, and the next run goes on from it. A recovery
    already recorded keeps the earlier of the two starts, unless it is over (drained: one the maintenance
    function left for a recover-slot run to report), which this one replaces. Returns the start in force."""
    cursor.execute(_BEGIN, (slot, since))
    found = cursor.fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def drop_slot(cursor: psycopg.Cursor[Any], slot: str) -> None:
    cursor.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def create_publication_if_missing(cursor: psycopg.Cursor[Any]) -> bool:
    cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,))
    if cursor.fetchone() is not None:
        return False
    cursor.execute(
        f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {'.'.join(OUTBOX_TABLE)} WITH (publish = 'insert')"
    )
    return True


def create_slot(cursor: psycopg.Cursor[Any], slot: str) -> None:
    """A new pgoutput slot (in a transaction that has written nothing: PostgreSQL refuses otherwise)."""
    cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


_GAP_COUNTS = """
SELECT count(*) FILTER (WHERE parked_at IS NULL),
       count(*) FILTER (WHERE parked_at IS NULL AND created_at < %(horizon)s),
       count(*) FILTER (WHERE parked_at IS NOT NULL)
FROM outbox WHERE created_at >= %(since)s
"""


@dataclass(frozen=True, slots=True)
class GapCounts:
    rows: int  # not parked: to republish
    expired: int  # of those, created before the republish window's horizon
    parked: int  # parked poison in the gap: not republished (redrive-poison is their way)


def count_gap(cursor: psycopg.Cursor[Any], since: datetime, horizon: datetime) -> GapCounts:
    """The rows a hand-over from `since` would name: created since then (a row's commit follows its
    created_at)."""
    cursor.execute(_GAP_COUNTS, {"since": since, "horizon": horizon})
    found = cursor.fetchone()
    assert found is not None
    return GapCounts(*(int(value) for value in found))


@dataclass(frozen=True, slots=True)
class GapHandover:
    advance_to: int  # the new slot may move here: every outbox row it decoded before is in the set
    replay_id: int  # the activated replay set holding the gap (finished at once when it names no row)
    replayed: int  # rows the set names
    expired: int  # created before the horizon: left out (consumers may no longer know them)
    expired_ids: list[str]  # the first `listed` of them
    decoded_before: int  # rows the new slot had decoded before the outbox was locked (in the set too)
    sets_activated: list[int]  # sets whose messages were not read (the lost WAL, or the skipped part)
    recovery: HandedOver  # as recorded


# The gap's rows into the set, server-side (a gap after a long outage may be millions of rows): those
# created since `since` (and the positions given), not parked, not before the horizon.
_ADD_GAP_ROWS = """
INSERT INTO outbox_replay_rows (replay_id, position)
SELECT %(replay_id)s, position FROM outbox
WHERE parked_at IS NULL
  AND (created_at >= %(since)s OR position = ANY(%(positions)s))
  AND (%(horizon)s::timestamptz IS NULL OR created_at >= %(horizon)s)
ON CONFLICT DO NOTHING
"""
_EXPIRED = """
SELECT event_id FROM outbox
WHERE parked_at IS NULL AND created_at >= %(since)s AND created_at < %(horizon)s
ORDER BY position
"""


@dataclass(frozen=True, slots=True)
class GapSet:
    replay_id: int
    started: datetime  # the bulk's snapshot was taken about then


def start_gap_set(cursor: psycopg.Cursor[Any], *, since: datetime, horizon: datetime | None) -> GapSet:
    """The first half of a hand-over, in the caller's transaction, while writers go on (a gap after a long
    outage may be millions of rows): an activated replay set naming the gap's rows committed so far
    (created since `since`, not parked, not before `horizon`)."""
    cursor.execute(
        "INSERT INTO outbox_replay (kind, activated_at) VALUES ('handover', clock_timestamp())"
        " RETURNING replay_id, clock_timestamp()"
    )
    found = cursor.fetchone()
    assert found is not None
    gap_set = GapSet(int(found[0]), found[1])
    cursor.execute(
        _ADD_GAP_ROWS,
        {"replay_id": gap_set.replay_id, "since": since, "horizon": horizon, "positions": []},
    )
    return gap_set


def hand_over_gap(
    cursor: psycopg.Cursor[Any],
    slot: str,
    gap_set: GapSet,
    *,
    since: datetime,
    horizon: datetime | None,
    listed: int = 100,
    commit_margin_seconds: float = 3600.0,
) -> GapHandover:
    """The second half, in the same transaction, with the relay kept off the slot (lock_slot_for_session):
    lock the outbox and the replay sets against writers (every outbox row is then committed, and decoded by
    the new slot if it committed after the slot was created), add to the set the rows committed since its
    first half and every row the new slot decoded so far, activate every set whose message was not read,
    and record the hand-over. The caller commits, then advances the slot to `advance_to`."""
    cursor.execute("LOCK TABLE outbox IN SHARE MODE")
    # And the replay sets: a set committed before this is visible below (and activated if unread), and
    # none commits until the hand-over does (its message then comes after `advance_to`).
    cursor.execute("LOCK TABLE outbox_replay IN SHARE MODE")
    # Every outbox row is committed now, its commit flushed (a commit made with synchronous_commit off and
    # not flushed yet lies past this: the new slot delivers it again, a duplicate, never a loss).
    advance_to = flush_lsn(cursor)
    changes = peek_changes(cursor, slot, _PEEK_ALL, upto_lsn=advance_to)
    decoded = {row.position for transaction in changes.transactions for row in transaction.rows} | {
        position for transaction in changes.transactions for position in transaction.replayed
    }
    # What committed since the first half's snapshot (created at most a transaction's length before it),
    # and what the new slot decoded: all in the set, so the slot can move past it.
    recent = max(since, gap_set.started - timedelta(seconds=commit_margin_seconds))
    cursor.execute(
        _ADD_GAP_ROWS,
        {"replay_id": gap_set.replay_id, "since": recent, "horizon": None, "positions": sorted(decoded)},
    )
    cursor.execute("SELECT count(*) FROM outbox_replay_rows WHERE replay_id = %s", (gap_set.replay_id,))
    found = cursor.fetchone()
    assert found is not None
    replayed = int(found[0])
    expired_ids: list[str] = []
    expired = 0
    if horizon is not None:
        cursor.execute(_EXPIRED, {"since": since, "horizon": horizon})
        expired_all = [event_id for (event_id,) in cursor.fetchall()]
        expired, expired_ids = len(expired_all), expired_all[:listed]
    cursor.execute("SELECT replay_id FROM outbox_replay WHERE activated_at IS NULL ORDER BY replay_id")
    unread = [set_id for (set_id,) in cursor.fetchall()]
    replays.activate(cursor, unread)
    replays.finish_drained(cursor)  # the gap's set, when it names no row
    cursor.execute(
        "UPDATE outbox_slot"
        " SET recovery_handed_over_at = clock_timestamp(), recovery_replay_id = %s, recovery_expired = %s"
        " WHERE slot_name = %s RETURNING recovery_since, recovery_started_at, recovery_handed_over_at",
        (gap_set.replay_id, expired, slot),
    )
    found = cursor.fetchone()
    assert found is not None  # begin_recovery recorded it
    recovery = HandedOver(gap_set.replay_id, found[0], found[1], found[2], expired)
    return GapHandover(
        advance_to, gap_set.replay_id, replayed, expired, expired_ids, len(decoded), unread, recovery
    )
