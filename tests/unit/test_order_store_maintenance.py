"""Maintenance of the PostgreSQL order store, on a real PostgreSQL: what leaves, what never does, and
the health figures the alarms read."""

from __future__ import annotations

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderService, OrderStatus, PlaceOrder
from shop.runtime.config import Settings
from shop.runtime.order_store_maintenance import maintain_order_store
from tests.support.postgres import connect
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
        connection.execute(  # a parked row as old: it leaves too (its message is in the poison queue)
            "UPDATE outbox SET published_at = NULL, parked_at = now() - interval '17 days'"
            " WHERE aggregate_id = %s AND sequence = 1",
            (old[1],),
        )
        connection.execute(  # published 15 days ago: inside the window, kept
            "UPDATE outbox SET published_at = now() - interval '15 days' WHERE aggregate_id = %s", (old[2],)
        )
        # Inbox rows past the consumers' redelivery window (16 + 18 = 34 days), and one inside it.
        connection.execute("UPDATE inbox SET processed_at = now() - interval '35 days'")
        connection.execute(
            "UPDATE inbox SET processed_at = now() - interval '33 days'"
            " WHERE event_id = (SELECT min(event_id) FROM inbox)"
        )
        connection.execute(
            "UPDATE request_keys SET expires_at = now() - interval '1 second'"
            " WHERE idempotency_key LIKE 'old-%'"
        )
    before = counts(order_database)

    report = maintain_order_store(database, SETTINGS, lambda: 60.0, batch_rows=2)

    after = counts(order_database)
    # 5 old orders x 2 events = 10 rows: 1 pending and 2 inside the window stay, 7 leave.
    assert report.outbox_rows_deleted == 7
    assert after["outbox"] == before["outbox"] - 7
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
    with connect(order_database) as connection:
        replication.drop_publication_and_slot(connection, slot)
        replication.ensure_publication_and_slot(connection, slot)
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
        ).claimed:
            pass

        caught_up = maintain_order_store(database, settings, lambda: 60.0)

        assert caught_up.health is not None
        assert caught_up.health.oldest_pending_seconds == 0.0
        assert len(recording_bus.accepted) == 4  # the deleted rows went out all the same
    finally:
        with connect(order_database) as connection:
            replication.drop_publication_and_slot(connection, slot)
