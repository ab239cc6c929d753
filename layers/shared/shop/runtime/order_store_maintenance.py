"""Scheduled maintenance of the PostgreSQL order store: bounded deletes past the retention windows
(shop.adapters.postgres.maintenance says which), then the outbox's health as metrics for the alarms:
the oldest event not yet on the bus (a pending row's age; with the logical relay, the oldest commit
its slot still holds), pending and parked rows, table size, and with the logical relay the WAL its slot
keeps (ReplicationSlotRetainedBytes: what a stopped relay costs in storage)."""

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
    logical_outbox_health,
    outbox_health,
)
from shop.adapters.postgres.replication import SlotHealth, oldest_undelivered_seconds, slot_health, slot_name
from shop.runtime.config import DAY_SECONDS, Settings
from shop.runtime.observability import metrics

BATCH_ROWS = 1_000
RESERVE_SECONDS = 5.0
SLOT_WAIT_SECONDS = 10.0  # for the logical relay's lock, to read the slot's oldest commit


@dataclass
class MaintenanceReport:
    outbox_rows_deleted: int = 0
    inbox_rows_deleted: int = 0
    request_keys_deleted: int = 0
    health: OutboxHealth | None = None
    slot: SlotHealth | None = None


def maintain_order_store(
    database: Database,
    settings: Settings,
    seconds_left: Callable[[], float],
    batch_rows: int = BATCH_ROWS,
) -> MaintenanceReport:
    report = MaintenanceReport()
    logical = settings.postgres_relay == "logical"
    steps: list[tuple[str, Callable[..., int], tuple[int, ...], dict[str, bool]]] = [
        (
            "outbox_rows_deleted",
            delete_published_outbox_rows,
            (settings.outbox_ttl_days * DAY_SECONDS,),
            {"logical_relay": logical},
        ),
        ("inbox_rows_deleted", delete_inbox_rows, (settings.idempotency_expires_after_seconds,), {}),
        ("request_keys_deleted", delete_expired_request_keys, (), {}),
    ]
    for name, delete, window, options in steps:
        while seconds_left() > RESERVE_SECONDS:
            with database.transaction() as cursor:  # one short transaction per batch
                deleted = delete(cursor, *window, batch_rows, **options)
            setattr(report, name, getattr(report, name) + deleted)
            if deleted < batch_rows:
                break
    with database.transaction() as cursor:
        if logical:
            slot = slot_name(settings.database_name)
            report.slot = slot_health(cursor, slot)
            age = oldest_undelivered_seconds(cursor, slot, SLOT_WAIT_SECONDS) if report.slot.exists else None
            report.health = logical_outbox_health(cursor, age)
        else:
            report.health = outbox_health(cursor)
    _record_metrics(report)
    return report


def _record_metrics(report: MaintenanceReport) -> None:
    health = report.health
    assert health is not None
    if health.pending is not None:
        metrics.add_metric(name="OutboxPending", unit=MetricUnit.Count, value=health.pending)
    if health.oldest_pending_seconds is not None:
        metrics.add_metric(
            name="OutboxOldestPendingAge", unit=MetricUnit.Seconds, value=health.oldest_pending_seconds
        )
    metrics.add_metric(name="OutboxParked", unit=MetricUnit.Count, value=health.parked)
    metrics.add_metric(name="OutboxRows", unit=MetricUnit.Count, value=health.rows)
    metrics.add_metric(name="OutboxRowsDeleted", unit=MetricUnit.Count, value=report.outbox_rows_deleted)
    if report.slot is not None:
        # A missing slot reads as 0 retained bytes but no event gets out: the publisher's errors alarm
        # (every round fails on it) and the oldest-pending alarm (no data: breaching) say so.
        metrics.add_metric(
            name="ReplicationSlotRetainedBytes", unit=MetricUnit.Bytes, value=report.slot.retained_bytes
        )
        metrics.add_metric(name="ReplicationSlotLagBytes", unit=MetricUnit.Bytes, value=report.slot.lag_bytes)
