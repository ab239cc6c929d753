"""The PostgreSQL order store's polling publisher, measured beside the stream relay (`make bench`).

On a real PostgreSQL (the embedded server, in .bench/postgres) and moto's bus, in this process:
- throughput: orders placed and confirmed (their outbox rows pending), then published by
  rounds of the product's publisher until none is pending: events/s, PutEvents calls per event, SQL
  statements per event (every statement the publisher's cursors execute, counted), and the database
  server's CPU per event (its processes' utime + stime from /proc);
- publish lag: orders placed at a steady rate while one publisher polls as the deployed one does
  (shop.runtime.polling_publisher.poll_outbox: 0.2 s idle pause): created_at → published_at of each row,
  both the database's clock, p50 and p99.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psycopg

from shop.adapters import aws
from shop.adapters.eventbridge import EventPublisher
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.adapters.postgres.schema import apply_migrations
from shop.domain.orders import OrderLine, OrderService, OrderStatus, PlaceOrder
from shop.domain.poison import PoisonRecord
from shop.runtime.config import Settings
from shop.runtime.polling_publisher import poll_outbox, publish_pending_round
from tools.local.services.order_database import EmbeddedPostgres

SETTINGS = Settings.from_env({})
BUS = "bench-bus"
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


def _pending(settings: ConnectionSettings) -> int:
    with psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user, autocommit=True
    ) as connection:
        row = connection.execute(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL"
        ).fetchone()
    return int(row[0]) if row else 0


def _throughput(database: Database, service: OrderService, orders: int) -> dict[str, Any]:
    cpu_before = _server_cpu_seconds()
    placed = _place(service, orders, "throughput")
    _confirm(service, placed)
    # The writers' share of the database's work per order on the confirm path: the API's transaction
    # (order, lines, outbox row) and the order-status consumer's (status, outbox row).
    write_cpu_ms_per_order = 1000 * (_server_cpu_seconds() - cpu_before) / orders
    publisher = EventPublisher(BUS, SETTINGS.max_event_bytes)
    events = calls = rounds = 0
    cpu_before, wall = _server_cpu_seconds(), time.perf_counter()
    with _counted_statements() as statements, contextlib.redirect_stdout(io.StringIO()):
        while True:
            outcome = publish_pending_round(
                database, publisher, _NoPoison(), max_event_bytes=SETTINGS.max_event_bytes
            )
            if not outcome.claimed:
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


def _lag(service: OrderService, settings: ConnectionSettings, rate: float, seconds: float) -> dict[str, Any]:
    """created_at → published_at while orders arrive at `rate` and one publisher polls."""
    stop = threading.Event()
    publisher = EventPublisher(BUS, SETTINGS.max_event_bytes)

    def run_round() -> Any:
        return publish_pending_round(
            database_for_publisher, publisher, _NoPoison(), max_event_bytes=SETTINGS.max_event_bytes
        )

    database_for_publisher = Database(settings)  # the publisher's own connection, as in Lambda
    polling = threading.Thread(
        target=lambda: poll_outbox(run_round, lambda: 0.0 if stop.is_set() else 3600.0), daemon=True
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
        while _pending(settings) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        polling.join(10)
    database_for_publisher.close()
    with psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user, autocommit=True
    ) as connection:
        lags = [
            float(row[0])
            for row in connection.execute(
                "SELECT extract(epoch FROM published_at - created_at) * 1000 FROM outbox"
                " WHERE envelope->>'correlationid' LIKE 'lag-%' AND published_at IS NOT NULL"
            )
        ]
    lags.sort()
    return {
        "offered_rate_per_s": rate,
        "seconds": seconds,
        "events": len(lags),
        "p50_ms": statistics.median(lags),
        "p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
    }


def run(moto_url: str, data_dir: Path, orders: int, lag_rate: float, lag_seconds: float) -> dict[str, Any]:
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
        location = server.database("bench")
        settings = ConnectionSettings(
            host=location.socket_dir,
            port=location.port,
            dbname=location.name,
            user="postgres",
            password=lambda _: None,
        )
        apply_migrations(settings)
        database = Database(settings)
        service = OrderService(PostgresOrderRepository(database, SETTINGS), SETTINGS)
        results = {
            "throughput": _throughput(database, service, orders),
            "lag": _lag(service, settings, lag_rate, lag_seconds),
        }
        database.close()
        return results
    finally:
        server.stop()
