"""Scheduled maintenance of the PostgreSQL order store: bounded deletes past the retention windows
(shop.adapters.postgres.maintenance says which), then the outbox's health as metrics for the alarms:
the oldest event not yet on the bus (a pending row's age; with the logical relay, the oldest commit
its slot still holds), pending and parked rows, table size, and with the logical relay the WAL its slot
keeps (ReplicationSlotRetainedBytes: what a stopped relay costs in storage) and whether it is lost
(ReplicationSlotLost, 0 or 1: missing or invalidated while the relay mode is logical; each minute the
database also records how far the slot had delivered, where a lost slot's gap starts:
shop.adapters.postgres.slot_recovery)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.maintenance import (
    OutboxHealth,
    delete_expired_request_keys,
    delete_finished_replay_sets,
    delete_inbox_rows,
    delete_published_outbox_rows,
    logical_outbox_health,
    outbox_health,
)
from shop.adapters.postgres.replication import SlotHealth, oldest_undelivered_seconds, slot_health, slot_name
from shop.adapters.postgres.slot_recovery import (
    finish_recovery_if_drained,
    read_slot_state,
    record_delivered_before,
)
from shop.runtime.config import DAY_SECONDS, Settings
from shop.runtime.observability import metrics
from shop.runtime.order_store_slot_recovery import COMMIT_MARGIN

BATCH_ROWS = 1_000
RESERVE_SECONDS = 5.0
SLOT_WAIT_SECONDS = 10.0  # for the logical relay's lock, to read the slot's oldest commit


@dataclass
class MaintenanceReport:
    outbox_rows_deleted: int = 0
    inbox_rows_deleted: int = 0
    request_keys_deleted: int = 0
    replay_sets_deleted: int = 0
    health: OutboxHealth | None = None
    slot: SlotHealth | None = None
    slot_lost: bool | None = None  # None: the relay mode is polling (no slot is read)
    slot_state: str | None = None


def maintain_order_store(
    database: Database,
    settings: Settings,
    seconds_left: Callable[[], float],
    batch_rows: int = BATCH_ROWS,
) -> MaintenanceReport:
    report = MaintenanceReport()
    logical = settings.postgres_relay == "logical"
    slot = slot_name(settings.database_name)
    # By the rule of the relay that owns the outbox now (outbox_relay.mode, not PostgresRelay); a lost
    # slot's gap stays for its recovery, which starts it the recovery's commit margin before the bound.
    delete_outbox_rows = partial(delete_published_outbox_rows, slot=slot, commit_margin=COMMIT_MARGIN)
    steps: list[tuple[str, Callable[..., int], tuple[int, ...]]] = [
        ("outbox_rows_deleted", delete_outbox_rows, (settings.outbox_ttl_days * DAY_SECONDS,)),
        ("inbox_rows_deleted", delete_inbox_rows, (settings.idempotency_expires_after_seconds,)),
        ("request_keys_deleted", delete_expired_request_keys, ()),
        # Finished replay sets, the outbox rows' window after they finished; a recovery's set stays while its
        # record names it (finish_recovery_if_drained, below, clears it: the set leaves on a later run).
        ("replay_sets_deleted", delete_finished_replay_sets, (settings.outbox_ttl_days * DAY_SECONDS,)),
    ]
    for name, delete, window in steps:
        while seconds_left() > RESERVE_SECONDS:
            with database.transaction() as cursor:  # one short transaction per batch
                deleted = delete(cursor, *window, batch_rows)
            setattr(report, name, getattr(report, name) + deleted)
            if deleted < batch_rows:
                break
    with database.transaction() as cursor:
        state = read_slot_state(cursor, slot)
        # The health of the relay that owns the outbox (outbox_relay.mode), as retention reads it: with this
        # function configured for one relay and the database handed to the other (a deploy on its way, or
        # one whose relay switch failed to roll back), the other relay's figures would hide its stall (a
        # polling outbox's pending rows never aged, the alarm silent) or raise a false one.
        owned_by_logical = state.relay_mode == "logical"
        if logical or owned_by_logical:
            # Lost (missing or invalidated while the relay mode is logical), or its recovery unfinished.
            report.slot_lost = state.needs_recovery
            report.slot_state = state.describe()
            report.slot = slot_health(cursor, slot)
        if owned_by_logical and report.slot is not None:
            readable = report.slot.exists and state.problem is None  # an invalidated slot refuses a peek
            age = oldest_undelivered_seconds(cursor, slot, SLOT_WAIT_SECONDS) if readable else None
            if age is not None:
                # Where a lost slot's gap would start; and a recovery the relay has caught up with is over,
                # unless it left gap rows out or had some parked on the way: recover-slot reports those.
                record_delivered_before(cursor, slot, age)
                finish_recovery_if_drained(cursor, slot, only_if_complete=True)
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
        # A missing slot reads as 0 retained bytes but no event gets out: ReplicationSlotLost says so (and
        # the publisher's errors alarm: every round stops on it).
        metrics.add_metric(
            name="ReplicationSlotRetainedBytes", unit=MetricUnit.Bytes, value=report.slot.retained_bytes
        )
        metrics.add_metric(name="ReplicationSlotLagBytes", unit=MetricUnit.Bytes, value=report.slot.lag_bytes)
    if report.slot_lost is not None:
        # 1: the logical relay cannot read its slot (missing or invalidated), or a recovery stopped before
        # it handed the gap over: ReplicationSlotLostAlarm, runbook "Replication slot lost".
        metrics.add_metric(name="ReplicationSlotLost", unit=MetricUnit.Count, value=int(report.slot_lost))
