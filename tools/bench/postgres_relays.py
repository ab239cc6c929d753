"""The PostgreSQL order store's two relays, the polling publisher and the logical (WAL) relay, measured
side by side and beside the stream relay (`make bench`).

On a real PostgreSQL (the embedded server, in .bench/postgres, wal_level=logical) and moto's bus, in this
process, for each relay in turn on a database of its own (the logical relay's slot is created, by the
migration step's own code, after the polling run, so it decodes only its own run's WAL):
- throughput: orders placed and confirmed (their events waiting), then published by rounds of the
  product's relay until a round finds nothing: events/s, PutEvents calls per event, SQL statements per
  event (every statement the relay's cursors execute, counted), and the database server's CPU per
  event (its processes' utime + stime from /proc);
- publish lag: orders placed at a steady rate while one relay runs as the deployed one does
  (shop.runtime.polling_publisher.poll_outbox: 0.2 s idle pause between empty rounds): from the row's
  created_at (the database's clock, at the insert, just before its commit) to the end of the round that
  put it on the bus (the same machine's clock), p50 and p99.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import psycopg

from shop.adapters import aws
from shop.adapters.eventbridge import EventPublisher
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.relay_mode import switch_relay
from shop.adapters.postgres.replication import slot_name
from shop.adapters.postgres.schema import apply_migrations
from shop.domain.orders import OrderLine, OrderService, OrderStatus, PlaceOrder
from shop.domain.poison import PoisonRecord
from shop.runtime.config import Settings
from shop.runtime.logical_relay import relay_slot_round
from shop.runtime.outbox_publishing import PublishOutcome
from shop.runtime.polling_publisher import poll_outbox, publish_pending_round
from tools.local.services.order_database import EmbeddedPostgres

SETTINGS = Settings.from_env({})
BUS = "bench-bus"
RELAYS = ("polling", "logical")  # the template's PostgresRelay values
RoundFunction = Callable[[Database], PublishOutcome[OutboxRow]]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class _NoPoison:
    def park(self, record: PoisonRecord) -> None:
        raise AssertionError(f"the bench's events are all valid: {record.event_id} was parked")


@contextlib.contextmanager
def _counted_statements() -> Iterator[list[int]]:
    """Every statement a psycopg cursor executes while the block runs (executemany counts once)."""
    count = [0]
    original = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(self, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield count
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def _server_cpu_seconds() -> float:
    """CPU time of every PostgreSQL process on the machine (the bench runs the only server)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text = stat.read_text()
            name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            if name.startswith("postgres"):
                total += int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)
    return total / _CLOCK_TICKS


def _place(service: OrderService, count: int, prefix: str) -> list[str]:
    command = PlaceOrder("c-bench", "USD", (OrderLine("SKU-BENCH", 1, 500),))
    return [
        service.place_order(command, idempotency_key=None, correlation_id=f"{prefix}-{n}").order["orderId"]
        for n in range(count)
    ]


def _confirm(service: OrderService, order_ids: list[str]) -> None:
    for order_id in order_ids:
        cause = service.get_order(order_id).event("InventoryReserved", "bench")
        service.apply_inventory_outcome(order_id, OrderStatus.CONFIRMED, cause)


def _round_function(relay: str, slot: str) -> RoundFunction:
    """One round of the product's relay, as the deployed function runs it (functions/outbox_publisher)."""
    publisher = EventPublisher(BUS, SETTINGS.max_event_bytes)
    if relay == "logical":
        return lambda database: relay_slot_round(
            database, publisher, _NoPoison(), slot=slot, max_event_bytes=SETTINGS.max_event_bytes
        )
    return lambda database: publish_pending_round(
        database, publisher, _NoPoison(), max_event_bytes=SETTINGS.max_event_bytes
    )


def _throughput(
    database: Database, service: OrderService, run_round: RoundFunction, orders: int
) -> dict[str, Any]:
    cpu_before = _server_cpu_seconds()
    placed = _place(service, orders, "throughput")
    _confirm(service, placed)
    # The writers' share of the database's work per order on the confirm path: the API's transaction
    # (order, lines, outbox row) and the order-status consumer's (status, outbox row).
    write_cpu_ms_per_order = 1000 * (_server_cpu_seconds() - cpu_before) / orders
    events = calls = rounds = 0
    cpu_before, wall = _server_cpu_seconds(), time.perf_counter()
    with _counted_statements() as statements, contextlib.redirect_stdout(io.StringIO()):
        while True:
            outcome = run_round(database)
            if not outcome.taken:
                break
            assert outcome.left_pending == 0, "moto's bus took every entry"
            rounds += 1
            events += len(outcome.published)
            calls += outcome.put_events_calls
    seconds = time.perf_counter() - wall
    return {
        "orders": orders,
        "events": events,
        "rounds": rounds,
        "events_per_second": events / seconds,
        "put_events_calls_per_event": calls / events,
        "sql_statements_per_event": statements[0] / events,
        "database_cpu_ms_per_event": 1000 * (_server_cpu_seconds() - cpu_before) / events,
        "database_write_cpu_ms_per_order": write_cpu_ms_per_order,
    }


def _lag(
    service: OrderService, settings: ConnectionSettings, run_round: RoundFunction, rate: float, seconds: float
) -> dict[str, Any]:
    """Write → on the bus while orders arrive at `rate` and one relay runs."""
    stop = threading.Event()
    lags_ms: list[float] = []
    relay_database = Database(settings)  # the relay's own connection, as in Lambda

    def timed_round() -> PublishOutcome[OutboxRow]:
        outcome = run_round(relay_database)
        on_bus = datetime.now(UTC)
        lags_ms.extend(
            (on_bus - row.created_at).total_seconds() * 1000
            for row, entry in outcome.published
            if entry.correlation_id.startswith("lag-")
        )
        return outcome

    polling = threading.Thread(
        target=lambda: poll_outbox(timed_round, lambda: 0.0 if stop.is_set() else 3600.0), daemon=True
    )
    with contextlib.redirect_stdout(io.StringIO()):
        polling.start()
        started = time.monotonic()
        placed = 0
        while time.monotonic() - started < seconds:
            _place(service, 1, f"lag-{placed}")
            placed += 1
            time.sleep(max(0.0, started + placed / rate - time.monotonic()))
        deadline = time.monotonic() + 30
        while len(lags_ms) < placed and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        polling.join(10)
    relay_database.close()
    lags = sorted(lags_ms)
    return {
        "offered_rate_per_s": rate,
        "seconds": seconds,
        "events": len(lags),
        "p50_ms": statistics.median(lags),
        "p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
    }


def _measure(
    server: EmbeddedPostgres, relay: str, orders: int, lag_rate: float, lag_seconds: float
) -> dict[str, Any]:
    location = server.database(f"bench_{relay}")
    settings = ConnectionSettings(
        host=location.socket_dir,
        port=location.port,
        dbname=location.name,
        user="postgres",
        password=lambda _: None,
    )
    apply_migrations(settings)
    slot = slot_name(location.name)
    with psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user, autocommit=True
    ) as connection:
        switch_relay(connection, relay, slot)  # the migration step's own code: the slot when logical
    database = Database(settings)
    service = OrderService(PostgresOrderRepository(database, SETTINGS), SETTINGS)
    run_round = _round_function(relay, slot)
    try:
        return {
            "throughput": _throughput(database, service, run_round, orders),
            "lag": _lag(service, settings, run_round, lag_rate, lag_seconds),
        }
    finally:
        database.close()
        server.drop(f"bench_{relay}")


def run(moto_url: str, data_dir: Path, orders: int, lag_rate: float, lag_seconds: float) -> dict[str, Any]:
    """Both relays, one after the other on the same server: {"polling": {...}, "logical": {...}}."""
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_EVENTBRIDGE": moto_url,
            "POWERTOOLS_METRICS_NAMESPACE": "Bench",
            "POWERTOOLS_SERVICE_NAME": "outbox-publisher",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
    )
    aws.reset_clients()
    boto3.client("events", endpoint_url=moto_url).create_event_bus(Name=BUS)
    server = EmbeddedPostgres(data_dir)
    try:
        return {relay: _measure(server, relay, orders, lag_rate, lag_seconds) for relay in RELAYS}
    finally:
        server.stop()
