"""The outbox relay: from table stream changes to the event bus, with an exact checkpoint.

Input is a list of stream changes in shard order (from a Lambda stream batch, or read back from the
stream by redrive). Non-outbox changes are skipped. The relay publishes the outbox events in order
and stops at the first event that cannot be published (a poison record or a publish failure), so the
caller can report exactly that change's sequence number: Lambda then retries from it, and nothing
before it is sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from shop.envelope import parse_time
from shop.errors import InvalidEnvelope
from shop.observability import logger, metrics
from shop.outbox import OutboxEntry, decode_outbox_image, is_outbox_image
from shop.publisher import EventPublisher, PublishResult


@dataclass(frozen=True, slots=True)
class StreamChange:
    """One record of a table stream, independent of how it was delivered."""

    sequence_number: str
    event_name: str  # INSERT, MODIFY, REMOVE (TTL deletions may arrive under other names)
    new_image: dict[str, Any] | None


@dataclass
class RelayOutcome:
    published: list[OutboxEntry] = field(default_factory=list)
    skipped: int = 0
    checkpoint: str | None = None  # sequence number to retry from; None = whole batch done
    poison_event_id: str | None = None
    publish: PublishResult | None = None


def _event_id_of(image: dict[str, Any]) -> str:
    value = image.get("eventId", {}).get("S")
    return value if isinstance(value, str) else "unknown"


def relay_outbox_changes(
    changes: Sequence[StreamChange],
    publisher: EventPublisher,
    max_event_bytes: int,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> RelayOutcome:
    outcome = RelayOutcome()
    to_publish: list[tuple[StreamChange, OutboxEntry]] = []
    poison: StreamChange | None = None
    for change in changes:
        if change.event_name != "INSERT" or not is_outbox_image(change.new_image):
            outcome.skipped += 1  # foreign items, updates, TTL deletions: not ours to publish
            continue
        assert change.new_image is not None
        try:
            to_publish.append((change, decode_outbox_image(change.new_image, max_event_bytes)))
        except InvalidEnvelope as exc:
            poison = change
            outcome.poison_event_id = _event_id_of(change.new_image)
            logger.error(
                "poison outbox record",
                extra={
                    "event_id": outcome.poison_event_id,
                    "sequence_number": change.sequence_number,
                    "reason": exc.message,
                    "details": exc.details,
                },
            )
            metrics.add_metric(name="PoisonRecords", unit=MetricUnit.Count, value=1)
            break  # everything after it is redelivered with it; sending it now would duplicate

    entries = [entry for _, entry in to_publish]
    result = publisher.publish_in_order(entries, remaining_seconds)
    outcome.publish = result
    outcome.published = [entries[p] for p in sorted(result.accepted_positions)]
    if result.first_unpublished is not None:
        failed_change, failed_entry = to_publish[result.first_unpublished]
        outcome.checkpoint = failed_change.sequence_number
        logger.warning(
            "publish failed; checkpointing",
            extra={
                "event_id": failed_entry.event_id,
                "correlation_id": failed_entry.correlation_id,
                "sequence_number": failed_change.sequence_number,
                "failures_by_code": result.failures_by_code,
            },
        )
    elif poison is not None:
        outcome.checkpoint = poison.sequence_number
    _record_metrics(outcome, result)
    return outcome


def _record_metrics(outcome: RelayOutcome, result: PublishResult) -> None:
    metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=len(outcome.published))
    metrics.add_metric(name="PutEventsCalls", unit=MetricUnit.Count, value=result.calls)
    for code, count in result.failures_by_code.items():
        metrics.add_metric(name=f"PublishFailed.{code}", unit=MetricUnit.Count, value=count)
    published_at = datetime.now(UTC)
    for entry in outcome.published[:100]:  # EMF holds at most 100 values per metric
        lag = (published_at - parse_time(entry.occurred_at)).total_seconds() * 1000
        metrics.add_metric(name="RelayLag", unit=MetricUnit.Milliseconds, value=max(lag, 0.0))
