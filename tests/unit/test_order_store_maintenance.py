"""Maintenance of the PostgreSQL order store, on a real PostgreSQL: what leaves, what never does, and
the health figures the alarms read."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderService, OrderStatus, PlaceOrder
from shop.runtime.config import Settings
from shop.runtime.order_store_maintenance import MaintenanceReport, maintain_order_store
from shop.runtime.order_store_replay import replay_order_store
from tests.support.postgres import connect, use_logical_relay, use_polling_relay, wait_until_a_lock_is_awaited
from tests.support.publishing import RecordingBus

SETTINGS = Settings.from_env({"OUTBOX_TTL_DAYS": "16"})
COMMAND = PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 1, 500),))


def place(database: Database, count: int, key_prefix: str | None = None) -> list[str]:
    service = OrderService(
        PostgresOrderRepository(database, SETTINGS, inbox_consumer="order-status"), SETTINGS
    )
    placed = []
    for n in range(count):
        key = f"{key_prefix}-{n}" if key_prefix else None
        placed.append(service.place_order(COMMAND, idempotency_key=key, correlation_id="c").order["orderId"])
    for order_id in placed:  # a transition caused by an event: an inbox row too
        cause = service.get_order(order_id).event("InventoryReserved", "c")
        service.apply_inventory_outcome(order_id, OrderStatus.CONFIRMED, cause)
    return placed


def counts(settings: ConnectionSettings) -> dict[str, int]:
    with connect(settings) as connection:
        (row,) = connection.execute(
            "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM inbox),"
            " (SELECT count(*) FROM request_keys), (SELECT count(*) FROM orders)"
        ).fetchall()
    return dict(zip(("outbox", "inbox", "request_keys", "orders"), row, strict=True))


def test_rows_past_their_window_leave_in_batches_and_pending_rows_never_do(
    order_database: ConnectionSettings, database: Database
):
    old = place(database, 5, key_prefix="old")
    place(database, 2, key_prefix="new")
    # The old orders' events: published 17 days ago (past OutboxTtlDays=16), but one never was.
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET published_at = now() - interval '17 days'"
            " WHERE aggregate_id = ANY(%s) AND NOT (aggregate_id = %s AND sequence = 1)",
            (old, old[0]),
        )
        connection.execute(  # a parked row as old: kept, evidence until redriven or discarded
            "UPDATE outbox SET published_at = NULL, parked_at = now() - interval '17 days'"
            " WHERE aggregate_id = %s AND sequence = 1",
            (old[1],),
        )
        connection.execute(  # published 15 days ago: inside the window, kept
            "UPDATE outbox SET published_at = now() - interval '15 days' WHERE aggregate_id = %s", (old[2],)
        )
        # Inbox rows past the consumers' redelivery window (16 + 19 = 35 days), and one inside it.
        connection.execute("UPDATE inbox SET processed_at = now() - interval '36 days'")
        connection.execute(
            "UPDATE inbox SET processed_at = now() - interval '34 days'"
            " WHERE event_id = (SELECT min(event_id) FROM inbox)"
        )
        connection.execute(
            "UPDATE request_keys SET expires_at = now() - interval '1 second'"
            " WHERE idempotency_key LIKE 'old-%'"
        )
    before = counts(order_database)

    report = maintain_order_store(database, SETTINGS, lambda: 60.0, batch_rows=2)

    after = counts(order_database)
    # 5 old orders x 2 events = 10 rows: 1 pending, 1 parked and 2 inside the window stay, 6 leave.
    assert report.outbox_rows_deleted == 6
    assert after["outbox"] == before["outbox"] - 6
    assert report.inbox_rows_deleted == 6
    assert after["inbox"] == 1
    assert report.request_keys_deleted == 5
    assert after["request_keys"] == 2
    assert after["orders"] == before["orders"]  # orders are the business's records: never deleted here
    with connect(order_database) as connection:
        (pending,) = connection.execute(  # type: ignore[misc]
            "SELECT count(*) FROM outbox WHERE aggregate_id = %s AND sequence = 1", (old[0],)
        ).fetchone()
    assert pending == 1


def test_the_health_figures_count_pending_and_parked_rows_and_age_the_oldest_pending_one(
    order_database: ConnectionSettings, database: Database
):
    orders = place(database, 3)
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox SET published_at = now() WHERE sequence = 2")
        connection.execute(
            "UPDATE outbox SET created_at = now() - interval '90 seconds' WHERE aggregate_id = %s"
            " AND sequence = 1",
            (orders[0],),
        )
        connection.execute(
            "UPDATE outbox SET parked_at = now() WHERE aggregate_id = %s AND sequence = 1", (orders[2],)
        )

    health = maintain_order_store(database, SETTINGS, lambda: 60.0).health

    assert health is not None
    assert health.pending == 2
    assert health.parked == 1
    assert health.oldest_pending_seconds is not None
    assert 90 <= health.oldest_pending_seconds < 120


def test_with_the_logical_relay_retention_reads_created_at_and_health_reads_the_slot(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """PostgresRelay=logical marks no row: rows leave once written longer ago than the window (the WAL,
    not the row, is what the slot delivers), the oldest undelivered age is the slot's first commit's,
    and the WAL the slot keeps is reported."""
    from shop.adapters.postgres import replication
    from shop.runtime.logical_relay import relay_slot_round
    from tests.support.publishing import ListSink, publisher

    settings = Settings.from_env(
        {"OUTBOX_TTL_DAYS": "16", "POSTGRES_RELAY": "logical", "DATABASE_NAME": "mnt"}
    )
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)
    try:
        old, _recent = place(database, 2)
        with connect(order_database) as connection:
            connection.execute(
                "UPDATE outbox SET created_at = created_at - interval '17 days' WHERE aggregate_id = %s",
                (old,),
            )

        waiting = maintain_order_store(database, settings, lambda: 60.0)

        assert waiting.outbox_rows_deleted == 2  # the old order's two rows, though never marked
        assert waiting.health is not None
        assert waiting.health.pending is None
        assert waiting.health.oldest_pending_seconds is not None
        assert waiting.health.oldest_pending_seconds > 0  # the slot holds all four commits still
        assert waiting.slot is not None
        assert waiting.slot.retained_bytes > 0
        while relay_slot_round(
            database, publisher(), ListSink(), slot=slot, max_event_bytes=SETTINGS.max_event_bytes
        ).taken:
            pass

        caught_up = maintain_order_store(database, settings, lambda: 60.0)

        assert caught_up.health is not None
        assert caught_up.health.oldest_pending_seconds == 0.0
        assert len(recording_bus.accepted) == 4  # the deleted rows went out all the same
    finally:
        use_polling_relay(order_database, slot)


# --- the oldest pending row's age, and what retention never takes -------------------------------------------
def test_the_oldest_pending_age_is_the_oldest_pending_rows_own_to_the_second_and_zero_without_one(
    order_database: ConnectionSettings, database: Database
):
    """OutboxOldestPendingAge (the alarm on an outbox that stopped moving) reads pending rows only: older
    rows already published or parked do not age it, and an outbox with nothing pending is 0, not the age
    of anything else. The age is the row's own, measured when maintenance reads it."""
    import time

    waiting, published, parked = place(database, 3)
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox SET published_at = clock_timestamp()")
        connection.execute(  # long published, and long parked: not waiting for anything
            "UPDATE outbox SET created_at = clock_timestamp() - interval '2 hours' WHERE aggregate_id = %s",
            (published,),
        )
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '1 hour', published_at = NULL,"
            " parked_at = clock_timestamp() WHERE aggregate_id = %s",
            (parked,),
        )
        began = time.monotonic()
        connection.execute(  # the one pending row: written 90 s ago
            "UPDATE outbox SET created_at = clock_timestamp() - interval '90 seconds', published_at = NULL"
            " WHERE aggregate_id = %s AND sequence = 2",
            (waiting,),
        )

    health = maintain_order_store(database, SETTINGS, lambda: 60.0).health
    elapsed = time.monotonic() - began

    assert health is not None
    assert (health.pending, health.parked) == (1, 2)
    assert health.oldest_pending_seconds is not None
    assert 90.0 <= health.oldest_pending_seconds <= 90.0 + elapsed

    with connect(order_database) as connection:
        connection.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE parked_at IS NULL")

    caught_up = maintain_order_store(database, SETTINGS, lambda: 60.0).health

    assert caught_up is not None
    assert (caught_up.pending, caught_up.oldest_pending_seconds) == (0, 0.0)


def test_a_row_made_pending_again_ages_from_then_not_from_when_it_was_written(
    order_database: ConnectionSettings, database: Database
):
    """A polling replay of an hour-old window, and a redrive of a row parked an hour ago, are not a
    publisher an hour behind: their rows age from their reset, or outbox-pending-age pages for nothing."""
    from shop.adapters.postgres.parked import unpark

    replayed, redriven = place(database, 2)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '1 hour',"
            " published_at = clock_timestamp() - interval '59 minutes'"
        )
        connection.execute(
            "UPDATE outbox SET published_at = NULL, parked_at = clock_timestamp() - interval '59 minutes'"
            " WHERE aggregate_id = %s",
            (redriven,),
        )
        event_ids = [
            e
            for (e,) in connection.execute(
                "SELECT event_id::text FROM outbox WHERE aggregate_id = %s", (replayed,)
            ).fetchall()
        ]
        positions = [
            p
            for (p,) in connection.execute(
                "SELECT position FROM outbox WHERE aggregate_id = %s", (redriven,)
            ).fetchall()
        ]

    replay = replay_order_store(database, SETTINGS, {"eventIds": event_ids}, lambda: 0.0)
    with database.transaction() as cursor:
        unpark(cursor, positions)
    health = maintain_order_store(database, SETTINGS, lambda: 60.0).health

    assert sorted(replay.selection.reset) == sorted(event_ids)
    assert health is not None
    assert health.pending == 4
    assert health.oldest_pending_seconds is not None
    assert health.oldest_pending_seconds < 60


def test_retention_takes_published_rows_just_past_the_window_and_never_a_pending_row_however_old(
    order_database: ConnectionSettings, database: Database
):
    """The republish window (OutboxTtlDays=16 here) to the minute: a row published a minute more than 16
    days ago leaves, one published a minute less stays; a pending row written 400 days ago stays (its
    event is not on the bus: deleting it would lose it)."""
    old, recent, stuck = place(database, 3)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET published_at = clock_timestamp() - interval '16 days 1 minute'"
            " WHERE aggregate_id = %s",
            (old,),
        )
        connection.execute(
            "UPDATE outbox SET published_at = clock_timestamp() - interval '15 days 23 hours 59 minutes'"
            " WHERE aggregate_id = %s",
            (recent,),
        )
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '400 days', published_at = NULL"
            " WHERE aggregate_id = %s",
            (stuck,),
        )

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert report.outbox_rows_deleted == 2
    with connect(order_database) as connection:
        left = connection.execute(
            "SELECT aggregate_id, count(*) FROM outbox GROUP BY aggregate_id ORDER BY aggregate_id"
        ).fetchall()
    assert left == sorted([(recent, 2), (stuck, 2)])
    assert report.health is not None
    assert report.health.pending == 2
    assert report.health.oldest_pending_seconds is not None
    assert report.health.oldest_pending_seconds >= 400 * 86_400


def test_rows_a_replay_set_still_names_age_the_logical_relays_oldest_pending_from_the_sets_activation(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """A replay or a handover drains across rounds, out of the slot: its rows are pending all the same, and
    a set that stops draining must raise OutboxOldestPendingAge, not show a relay caught up."""
    from shop.adapters.postgres import replication
    from shop.runtime.logical_relay import relay_slot_round
    from tests.support.publishing import ListSink, publisher

    settings = Settings.from_env({"POSTGRES_RELAY": "logical", "DATABASE_NAME": "mnt"})
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)
    try:
        place(database, 2)
        while relay_slot_round(
            database, publisher(), ListSink(), slot=slot, max_event_bytes=SETTINGS.max_event_bytes
        ).taken:
            pass
        with connect(order_database) as connection:
            for activated, finished in (("10 minutes", None), ("1 hour", "1 minute")):
                found = connection.execute(
                    "INSERT INTO outbox_replay (kind, activated_at, finished_at)"
                    " VALUES ('replay', clock_timestamp() - %s::interval,"
                    "         clock_timestamp() - %s::interval) RETURNING replay_id",
                    (activated, finished),
                ).fetchone()
                assert found is not None
                if finished is None:  # the finished set names no row any more
                    connection.execute(
                        "INSERT INTO outbox_replay_rows (replay_id, position)"
                        " SELECT %s, position FROM outbox",
                        (found[0],),
                    )

        draining = maintain_order_store(database, settings, lambda: 60.0)

        assert draining.health is not None
        assert draining.health.oldest_pending_seconds is not None
        assert 600 <= draining.health.oldest_pending_seconds < 900  # the unfinished set, not the finished one
    finally:
        use_polling_relay(order_database, slot)


# --- replay sets: finished ones leave, the window after they finished ------------------------------------
def add_set(
    connection: psycopg.Connection,
    *,
    kind: str = "replay",
    created: str = "30 days",
    activated: str | None = "30 days",
    finished: str | None = "16 days 1 minute",
    source_lsn: str | None = None,
    rows: tuple[int, ...] = (),
) -> int:
    """A replay set (shop.adapters.postgres.replays) created, activated and finished so long ago (None: not
    yet), naming the outbox rows at `rows` (pending in it)."""
    found = connection.execute(
        "INSERT INTO outbox_replay (kind, source_lsn, created_at, activated_at, finished_at)"
        " VALUES (%s, %s::pg_lsn, clock_timestamp() - %s::interval, clock_timestamp() - %s::interval,"
        "         clock_timestamp() - %s::interval) RETURNING replay_id",
        (kind, source_lsn, created, activated, finished),
    ).fetchone()
    assert found is not None
    for position in rows:
        connection.execute(
            "INSERT INTO outbox_replay_rows (replay_id, position) VALUES (%s, %s)", (found[0], position)
        )
    return int(found[0])


def replay_sets(settings: ConnectionSettings) -> set[int]:
    with connect(settings) as connection:
        return {replay_id for (replay_id,) in connection.execute("SELECT replay_id FROM outbox_replay")}


def test_finished_replay_sets_leave_in_batches_once_finished_longer_ago_than_the_republish_window(
    order_database: ConnectionSettings, database: Database
):
    """A replay, handover or spill set that is finished (every row it named on the bus or parked) is
    history: it leaves OutboxTtlDays (16 here) after it finished, in batches, like the outbox rows."""
    with connect(order_database) as connection:
        for kind in ("replay", "handover", "spill", "replay", "replay"):
            add_set(connection, kind=kind, source_lsn="0/10" if kind == "spill" else None)

    report = maintain_order_store(database, SETTINGS, lambda: 60.0, batch_rows=2)

    assert replay_sets(order_database) == set()
    assert report.replay_sets_deleted == 5


def test_a_replay_set_finished_inside_the_window_stays(
    order_database: ConnectionSettings, database: Database
):
    """Finished a minute less than 16 days ago: kept (one finished a minute more leaves)."""
    with connect(order_database) as connection:
        add_set(connection, finished="16 days 1 minute")
        recent = add_set(connection, finished="15 days 23 hours 59 minutes")

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert replay_sets(order_database) == {recent}
    assert report.replay_sets_deleted == 1


def test_an_unfinished_replay_set_stays_however_old(order_database: ConnectionSettings, database: Database):
    """A set not finished is still the relay's work: activated and draining, or its message not read yet
    (whose rows may all have gone out already, as earlier rows of their orders: the set finishes once its
    message is read). Kept however old; deleting one would drop its rows too (ON DELETE CASCADE)."""
    place(database, 1)
    with connect(order_database) as connection:
        (position,) = connection.execute("SELECT min(position) FROM outbox").fetchone()  # type: ignore[misc]
        add_set(connection)
        draining = add_set(
            connection, created="400 days", activated="400 days", finished=None, rows=(position,)
        )
        unread = add_set(connection, created="400 days", activated=None, finished=None, rows=(position,))
        unread_drained = add_set(connection, created="400 days", activated=None, finished=None)

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert replay_sets(order_database) == {draining, unread, unread_drained}
    assert report.replay_sets_deleted == 1
    with connect(order_database) as connection:
        named = connection.execute("SELECT count(*) FROM outbox_replay_rows").fetchone()
    assert named == (2,)


def test_a_replay_set_still_naming_a_row_stays_even_marked_finished(
    order_database: ConnectionSettings, database: Database
):
    """The relay finishes a set only once it names no row; should one be marked finished with a row left
    all the same, retention keeps it: its delete would take the pending row out of the relay's work."""
    place(database, 1)
    with connect(order_database) as connection:
        (position,) = connection.execute("SELECT min(position) FROM outbox").fetchone()  # type: ignore[misc]
        add_set(connection)
        naming = add_set(connection, finished="40 days", rows=(position,))

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert replay_sets(order_database) == {naming}
    assert report.replay_sets_deleted == 1


def test_the_replay_set_a_slot_recovery_still_names_stays(
    order_database: ConnectionSettings, database: Database
):
    """outbox_slot.recovery_replay_id names the set a lost slot's gap was handed to, until maintenance
    clears the recovery (slot_recovery.finish_recovery_if_drained): the set stays while it is named."""
    with connect(order_database) as connection:
        add_set(connection)
        gap = add_set(connection, kind="handover", finished="40 days")
        connection.execute(
            "INSERT INTO outbox_slot (slot_name, recovery_since, recovery_started_at,"
            " recovery_handed_over_at, recovery_replay_id)"
            " VALUES ('outbox_elsewhere', now() - interval '41 days', now() - interval '41 days',"
            "         now() - interval '41 days', %s)",
            (gap,),
        )

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert replay_sets(order_database) == {gap}
    assert report.replay_sets_deleted == 1


def test_a_spill_set_stays_until_every_slot_has_confirmed_past_its_source_lsn(
    order_database: ConnectionSettings, database: Database
):
    """A spill's source_lsn (UNIQUE) keeps the transaction it recorded, decoded again before the slot moved
    past it, from being recorded (and so published) twice: the set stays while the slot's confirmed
    position is not past it, at it included, however long ago it finished."""
    from shop.adapters.postgres import replication
    from shop.adapters.postgres.pgoutput import lsn_text, parse_lsn

    settings = Settings.from_env(
        {"OUTBOX_TTL_DAYS": "16", "POSTGRES_RELAY": "logical", "DATABASE_NAME": "mnt"}
    )
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)
    try:
        with connect(order_database) as connection:
            (confirmed,) = connection.execute(  # type: ignore[misc]
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            at = parse_lsn(confirmed)
            add_set(connection, kind="spill", source_lsn=lsn_text(at - 1))  # passed: leaves
            at_slot = add_set(connection, kind="spill", source_lsn=lsn_text(at))
            ahead = add_set(connection, kind="spill", source_lsn=lsn_text(at + 1_000_000), finished="40 days")

        report = maintain_order_store(database, settings, lambda: 60.0)

        assert replay_sets(order_database) == {at_slot, ahead}
        assert report.replay_sets_deleted == 1
    finally:
        use_polling_relay(order_database, slot)


def test_retention_follows_the_relay_that_owns_the_outbox_not_the_functions_configuration(
    order_database: ConnectionSettings, database: Database
):
    """A deploy that switches logical -> polling hands the outbox back before the maintenance function's
    configuration changes (it DependsOn the schema). Still configured for logical, it must not delete a
    pending row by its age: the polling publisher has yet to publish it."""
    still_logical = Settings.from_env({"OUTBOX_TTL_DAYS": "16", "POSTGRES_RELAY": "logical"})
    pending, published = place(database, 2)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '20 days', published_at = NULL"
            " WHERE aggregate_id = %s",
            (pending,),
        )
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '20 days',"
            " published_at = clock_timestamp() - interval '17 days' WHERE aggregate_id = %s",
            (published,),
        )

    report = maintain_order_store(database, still_logical, lambda: 60.0)

    assert report.outbox_rows_deleted == 2  # the published order's two rows
    with connect(order_database) as connection:
        left = connection.execute("SELECT DISTINCT aggregate_id FROM outbox").fetchall()
    assert left == [(pending,)]


# --- maintenance beside a writer: a row that changed while the delete waited for it stays ---------------
class CommitHeldBack(Database):
    """The product's connection whose first transaction that writes waits, its writes done, until `commit`
    is set (`holding` says it got there): a writer caught between its writes and its commit, its rows
    locked."""

    def __init__(self, settings: ConnectionSettings) -> None:
        super().__init__(settings)
        self.holding, self.commit = threading.Event(), threading.Event()

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        with super().transaction() as cursor:
            yield cursor
            if not self.holding.is_set():
                cursor.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
                wrote = cursor.fetchone()
                if wrote and wrote[0]:
                    self.holding.set()
                    assert self.commit.wait(10)


def maintenance_while_committing[T](
    settings: ConnectionSettings, writer: Callable[[Database], T]
) -> tuple[T, MaintenanceReport]:
    """`writer` run until its writing transaction is about to commit; maintenance started beside it and
    waiting for its locks; then the commit. What each returned."""
    held, own = CommitHeldBack(settings), Database(settings)
    results: dict[str, Any] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            results[name] = call()
        except BaseException as exc:  # noqa: BLE001 - raised below
            results[name] = exc

    writing = threading.Thread(target=run, args=("writer", lambda: writer(held)))
    maintaining = threading.Thread(
        target=run, args=("maintenance", lambda: maintain_order_store(own, SETTINGS, lambda: 60.0))
    )
    writing.start()
    try:
        assert held.holding.wait(10), "the writer never reached its commit"
        maintaining.start()
        wait_until_a_lock_is_awaited(settings)
    finally:
        held.commit.set()
        writing.join(30)
        if maintaining.ident is not None:
            maintaining.join(30)
        held.close()
        own.close()
    for outcome in results.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return results["writer"], results["maintenance"]


def test_an_expired_request_key_a_new_request_takes_over_while_maintenance_deletes_it_stays(
    order_database: ConnectionSettings, database: Database
):
    """A request reusing an expired Idempotency-Key rewrites its record (a new request: a new order).
    Maintenance, deleting expired keys meanwhile, waits for the row's lock; once the request commits the
    record is no longer expired and stays, so a retry of that request replays it instead of creating a
    second order (and a second OrderCreated)."""

    def service(on: Database) -> OrderService:
        return OrderService(PostgresOrderRepository(on, SETTINGS), SETTINGS)

    first = service(database).place_order(COMMAND, idempotency_key="key-1", correlation_id="c")
    with connect(order_database) as connection:  # its 24 hours are over; maintenance has not run yet
        connection.execute("UPDATE request_keys SET expires_at = clock_timestamp() - interval '1 minute'")

    second, report = maintenance_while_committing(
        order_database,
        lambda held: service(held).place_order(COMMAND, idempotency_key="key-1", correlation_id="c"),
    )

    assert not second.replayed
    assert second.order["orderId"] != first.order["orderId"]
    assert report.request_keys_deleted == 0
    retry = service(database).place_order(COMMAND, idempotency_key="key-1", correlation_id="c")
    assert retry.replayed
    assert retry.order["orderId"] == second.order["orderId"]
    after = counts(order_database)
    assert (after["orders"], after["outbox"], after["request_keys"]) == (2, 2, 1)


def test_a_published_row_a_replay_makes_pending_while_maintenance_deletes_it_stays(
    order_database: ConnectionSettings, database: Database
):
    """A replay with includeExpired makes a row published past the republish window pending again (the
    polling publisher's). Maintenance, deleting that row meanwhile, waits for its lock; once the replay
    commits the row is pending, and a pending row is never deleted: the replayed event would be lost."""
    place(database, 1)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET created_at = clock_timestamp() - interval '17 days',"
            " published_at = clock_timestamp() - interval '17 days'"
        )
        event_ids = [event_id for (event_id,) in connection.execute("SELECT event_id FROM outbox")]

    replay, report = maintenance_while_committing(
        order_database,
        lambda held: replay_order_store(
            held, SETTINGS, {"eventIds": event_ids, "includeExpired": True}, lambda: 0.0
        ),
    )

    assert sorted(replay.selection.reset) == sorted(event_ids)
    assert report.outbox_rows_deleted == 0
    with connect(order_database) as connection:
        left = connection.execute("SELECT event_id FROM outbox WHERE published_at IS NULL").fetchall()
    assert sorted(event_id for (event_id,) in left) == sorted(event_ids)


def test_health_follows_the_relay_that_owns_the_outbox_not_the_functions_configuration(
    order_database: ConnectionSettings, database: Database
):
    """Configured for logical while the database is polling (a relay switch that failed to roll back): the
    polling publisher refuses to run (RelayModeMismatch), so its pending rows must age into
    OutboxOldestPendingAge, or the outbox stalls with no alarm (no slot is lost: the mode is polling)."""
    still_logical = Settings.from_env({"OUTBOX_TTL_DAYS": "16", "POSTGRES_RELAY": "logical"})
    place(database, 2)
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox SET created_at = clock_timestamp() - interval '2 hours'")

    report = maintain_order_store(database, still_logical, lambda: 60.0)

    assert report.slot_lost is False
    assert report.health is not None
    assert report.health.pending == 4
    assert report.health.oldest_pending_seconds is not None
    assert 7200 <= report.health.oldest_pending_seconds < 7260
