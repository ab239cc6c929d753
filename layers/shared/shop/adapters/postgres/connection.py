"""Connections to the order database: one per process, opened on first use, reopened after a failure.

A Lambda execution environment runs one invocation at a time, so one connection per process is the
pool (RDS Proxy is the pool across environments; docs/configuration.md). Every use is a transaction:
`with database.transaction() as cursor:` commits when the block ends and rolls back when it raises.

Failures that say nothing about the request (the server is down, restarting, failing over, or the
connection broke; or its password could not be fetched) become ServiceBusy: the API answers 503 with
Retry-After and a consumer's message is retried. When the connection breaks during COMMIT, the outcome
is unknown; the writes stay safe to repeat (request keys, version conditions, event ids), so the retry
finds what committed.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from shop.domain.errors import ServiceBusy

# Seconds to wait for a connection, and for any one statement: a stuck database must not eat the
# invocation (the API still has to answer).
CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 5_000
# The statement timeout is the server's: a network path that goes silent (a failover, a lost route) never
# delivers its cancellation, and the client would wait until the invocation's timeout (the API's 10 s:
# API Gateway's 502 instead of a 503). The client's kernel closes such a connection instead, and the
# statement fails (ServiceBusy): when data it sent stays unacknowledged for TCP_USER_TIMEOUT_MS, or when
# the connection, silent for KEEPALIVES_IDLE_SECONDS, answers none of KEEPALIVES_COUNT probes sent every
# KEEPALIVES_INTERVAL_SECONDS: about 4 s either way. A live server's kernel acknowledges both at once,
# however long its statement runs. (Not used on a local Unix socket.)
KEEPALIVES_IDLE_SECONDS = 2
KEEPALIVES_INTERVAL_SECONDS = 1
KEEPALIVES_COUNT = 2
TCP_USER_TIMEOUT_MS = 4_000
# Every connection's network parameters (libpq's), the functions' and the migrations' alike.
NETWORK_OPTIONS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "keepalives": 1,
    "keepalives_idle": KEEPALIVES_IDLE_SECONDS,
    "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
    "keepalives_count": KEEPALIVES_COUNT,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
}


# A deadline's cancellation: each cancel request waits this long at most (a silent network path), and is
# sent again this often until the work ends (a statement started after the deadline is cancelled too).
CANCEL_TIMEOUT_SECONDS = 1.0
CANCEL_REPEAT_SECONDS = 0.1


def sslmode(host: str) -> str:
    """TLS over the network (Aurora); none on a local Unix socket, which never leaves the machine.
    `require` encrypts without checking the server's certificate against the RDS CA bundle: the VPC,
    its security groups and the private endpoint name stand for the server's identity."""
    return "disable" if host.startswith("/") else "require"


class PasswordUnavailable(Exception):
    """The password could not be fetched (its store throttled, timed out or could not be reached): the
    database is as unavailable as when it refuses connections."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    host: str  # a host name, or a directory holding the server's Unix socket (locally)
    port: int
    dbname: str
    user: str
    # Read at each connect; True asks for a fresh value (the cached one was refused: rotated). Raises
    # PasswordUnavailable when it cannot be fetched.
    password: Callable[[bool], str | None]


def open_connection(settings: ConnectionSettings, *, refresh_password: bool = False) -> psycopg.Connection:
    """One autocommit connection (transactions are explicit: Database.transaction())."""
    return psycopg.connect(
        host=settings.host,
        port=settings.port,
        dbname=settings.dbname,
        user=settings.user,
        password=settings.password(refresh_password),
        **NETWORK_OPTIONS,
        options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        application_name="serverless-outbox",
        sslmode=sslmode(settings.host),
        autocommit=True,
    )


def limit_statement_time(cursor: psycopg.Cursor, milliseconds: int) -> None:
    """For the rest of the cursor's transaction, a statement running longer is cancelled (QueryCanceled)."""
    cursor.execute(f"SET LOCAL statement_timeout = {milliseconds}")


def limit_statement_time_to(cursor: psycopg.Cursor, seconds: float) -> None:
    """For the rest of the cursor's transaction, a statement may run for `seconds` (no limit when infinite,
    never less than the session's STATEMENT_TIMEOUT_MS): work sized by the caller, not by the session."""
    limit_statement_time(cursor, 0 if math.isinf(seconds) else max(int(seconds * 1000), STATEMENT_TIMEOUT_MS))


def limit_lock_wait(cursor: psycopg.Cursor, milliseconds: int) -> None:
    """For the rest of the cursor's transaction, a statement waiting longer for a lock fails."""
    cursor.execute(f"SET LOCAL lock_timeout = {milliseconds}")


def wait_for_locks(cursor: psycopg.Cursor, milliseconds: int) -> None:
    """For the rest of the cursor's transaction, a statement may wait this long for a lock, and then fails
    with LockNotAvailable: its statement timeout is raised past the wait, or the session's
    (STATEMENT_TIMEOUT_MS) would cancel a longer wait first (QueryCanceled)."""
    limit_lock_wait(cursor, milliseconds)
    limit_statement_time(cursor, milliseconds + STATEMENT_TIMEOUT_MS)


class DeadlinePassed(psycopg.errors.QueryCanceled):
    """Work ran past its deadline: the statement running then was cancelled, its transaction rolled back."""


@contextmanager
def cancelled_after(
    seconds: float, connections: Callable[[], Iterable[psycopg.Connection]], work: str
) -> Iterator[None]:
    """The block's statements on `connections()` may run until `seconds` from now, all together; the one
    running then is cancelled, and so is any started after, and the block raises DeadlinePassed. A
    statement_timeout bounds each statement, not their sum: several slow ones each within it would run
    past the caller's deadline. No limit when `seconds` is infinite."""
    if math.isinf(seconds):
        yield
        return
    ended, expired = threading.Event(), threading.Event()

    def cancel_when_late() -> None:
        if ended.wait(max(seconds, 0.0)):
            return
        expired.set()
        while not ended.is_set():
            for connection in list(connections()):
                if not connection.closed:
                    with contextlib.suppress(psycopg.Error):
                        connection.cancel_safe(timeout=CANCEL_TIMEOUT_SECONDS)
            ended.wait(CANCEL_REPEAT_SECONDS)

    canceller = threading.Thread(target=cancel_when_late, name="deadline", daemon=True)
    canceller.start()
    try:
        yield
    except DeadlinePassed:
        raise
    except psycopg.Error as exc:
        if expired.is_set():
            raise DeadlinePassed(f"{work} ran past its {seconds:.1f} s and was cancelled ({exc})") from exc
        raise
    finally:
        ended.set()
        canceller.join()  # no cancel request may outlive the block (it would cancel the caller's next work)


class Database:
    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._connection: psycopg.Connection | None = None

    def _connect(self) -> psycopg.Connection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            try:
                self._connection = self._open(refresh_password=False)
            except psycopg.OperationalError as exc:
                # A rotated secret refuses the cached password: once more with a fresh one. Only then:
                # a server that is down would make every caller wait out two connect timeouts.
                if "authentication failed" not in str(exc):
                    raise
                self._connection = self._open(refresh_password=True)
        except (psycopg.OperationalError, PasswordUnavailable) as exc:
            raise ServiceBusy("the order database is unavailable; retry shortly") from exc
        return self._connection

    def _open(self, *, refresh_password: bool) -> psycopg.Connection:
        return open_connection(self._settings, refresh_password=refresh_password)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        """A cursor inside one transaction (READ COMMITTED: each write states its own condition)."""
        connection = self._connect()
        try:
            with connection.transaction(), connection.cursor() as cursor:
                yield cursor
        except psycopg.OperationalError as exc:
            # A broken connection, a server shutting down, a statement past its timeout (QueryCanceled
            # is one too): open a new connection next time.
            self.close()
            raise ServiceBusy("the order database is unavailable; retry shortly") from exc

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
