"""Scheduled maintenance of the PostgreSQL order store: bounded deletes past the retention windows
(shop.adapters.postgres.maintenance says which), then the outbox's health as metrics for the alarms
(pending rows, the oldest pending row's age, parked rows, table size)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.maintenance import (
    OutboxHealth,
    delete_expired_request_keys,
    delete_inbox_rows,
    delete_published_outbox_rows,
    outbox_health,
)
from shop.runtime.config import DAY_SECONDS, Settings
from shop.runtime.observability import metrics

BATCH_ROWS = 1_000
RESERVE_SECONDS = 5.0


@dataclass
class MaintenanceReport:
    outbox_rows_deleted: int = 0
    inbox_rows_deleted: int = 0
    request_keys_deleted: int = 0
    health: OutboxHealth | None = None


def maintain_order_store(
    database: Database,
    settings: Settings,
    seconds_left: Callable[[], float],
    batch_rows: int = BATCH_ROWS,
) -> MaintenanceReport:
    report = MaintenanceReport()
    steps: list[tuple[str, Callable[..., int], tuple[int, ...]]] = [
        ("outbox_rows_deleted", delete_published_outbox_rows, (settings.outbox_ttl_days * DAY_SECONDS,)),
        ("inbox_rows_deleted", delete_inbox_rows, (settings.idempotency_expires_after_seconds,)),
        ("request_keys_deleted", delete_expired_request_keys, ()),
    ]
    for name, delete, window in steps:
        while seconds_left() > RESERVE_SECONDS:
            with database.transaction() as cursor:  # one short transaction per batch
                deleted = delete(cursor, *window, batch_rows)
            setattr(report, name, getattr(report, name) + deleted)
            if deleted < batch_rows:
                break
    with database.transaction() as cursor:
        report.health = outbox_health(cursor)
    metrics.add_metric(name="OutboxPending", unit=MetricUnit.Count, value=report.health.pending)
    metrics.add_metric(
        name="OutboxOldestPendingAge", unit=MetricUnit.Seconds, value=report.health.oldest_pending_seconds
    )
    metrics.add_metric(name="OutboxParked", unit=MetricUnit.Count, value=report.health.parked)
    metrics.add_metric(name="OutboxRows", unit=MetricUnit.Count, value=report.health.rows)
    metrics.add_metric(name="OutboxRowsDeleted", unit=MetricUnit.Count, value=report.outbox_rows_deleted)
    return report
