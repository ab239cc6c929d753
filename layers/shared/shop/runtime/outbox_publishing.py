"""What the stream relay and the PostgreSQL polling publisher do alike around PutEvents: park a poison
record in the poison queue (or say the queue is unavailable, so the caller keeps the record and waits,
in order), and log each event put on the bus."""

from __future__ import annotations

from collections.abc import Iterable

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from shop.domain.outbox import OutboxEntry
from shop.domain.poison import PoisonRecord, PoisonSink
from shop.runtime.observability import logger, metrics


def park_poison(record: PoisonRecord, sink: PoisonSink) -> bool:
    """Park the record; False when the poison queue failed (transient, like any publish failure)."""
    extra = {
        "event_id": record.event_id,
        "sequence_number": record.sequence_number,
        "reason": record.reason,
        "details": record.details,
    }
    try:
        sink.park(record)
    except (ClientError, BotoCoreError) as exc:
        logger.warning(
            "poison queue unavailable; the record waits, in order", extra={**extra, "error": str(exc)[:500]}
        )
        metrics.add_metric(name="PoisonParkFailed", unit=MetricUnit.Count, value=1)
        return False
    logger.error("poison outbox record", extra={**extra, "action": "parked in the poison queue"})
    metrics.add_metric(name="PoisonRecords", unit=MetricUnit.Count, value=1)
    return True


def log_published(entries: Iterable[OutboxEntry]) -> None:
    for entry in entries:
        logger.info(
            "event published",
            extra={
                "event_id": entry.event_id,
                "event_type": entry.detail_type,
                "aggregate": entry.aggregate,
                "correlation_id": entry.correlation_id,
            },
        )
