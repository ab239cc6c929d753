"""The outbox relay: from table stream changes to the event bus, with an exact checkpoint.

Input is a list of stream changes in shard order (from a Lambda stream batch, or read back from the
stream by redrive). Non-outbox changes are skipped. Two kinds of failure, handled differently:
- a poison record (it can never be published: undecodable image, invalid envelope, oversize) is
  parked whole in the poison queue and the relay moves on, so it never holds its shard and never
  takes healthy neighbours to a dead-letter queue with it, whatever Lambda's bisection does;
- a transient failure (throttling, EventBridge errors, the poison queue itself failing) stops the
  relay at that record: the caller reports its sequence number, Lambda retries from it, and nothing
  before it is sent again. The shard waits, in order, until the failure clears.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from shop.adapters.outbox_items import decode_outbox_image, event_id_of_image, is_outbox_image
from shop.domain.envelope import parse_time
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry
from shop.domain.poison import PoisonRecord, PoisonSink
from shop.domain.publishing import OutboxPublisher, PublishResult
from shop.runtime.observability import logger, metrics


@dataclass(frozen=True, slots=True)
class StreamChange:
    """One record of a table stream, independent of how it was delivered."""

    sequence_number: str
    event_name: str  # INSERT, MODIFY, REMOVE (TTL deletions may arrive under other names)
    new_image: dict[str, Any] | None
    stream_arn: str | None = None


@dataclass
class RelayOutcome:
    published: list[OutboxEntry] = field(default_factory=list)
    parked: list[PoisonRecord] = field(default_factory=list)
    skipped: int = 0
    checkpoint: str | None = None  # sequence number to retry from; None = whole batch done
    publish: PublishResult | None = None


def relay_outbox_changes(
    changes: Sequence[StreamChange],
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    max_event_bytes: int,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> RelayOutcome:
    outcome = RelayOutcome()
    publishable: list[tuple[int, OutboxEntry]] = []  # (position in changes, entry)
    poison: list[tuple[int, PoisonRecord]] = []
    for position, change in enumerate(changes):
        if change.event_name != "INSERT" or not is_outbox_image(change.new_image):
            outcome.skipped += 1  # foreign items, updates, TTL deletions: not ours to publish
            continue
        assert change.new_image is not None
        try:
            publishable.append((position, decode_outbox_image(change.new_image, max_event_bytes)))
        except InvalidEnvelope as exc:
            poison.append((position, _poison_record(change, exc)))

    entries = [entry for _, entry in publishable]
    result = publisher.publish_in_order(entries, remaining_seconds)
    outcome.publish = result
    outcome.published = [entries[p] for p in sorted(result.accepted_positions)]
    stop = len(changes)  # position of the first change this invocation did not finish
    if result.first_unpublished is not None:
        stop, failed_entry = publishable[result.first_unpublished]
        logger.warning(
            "publish failed; checkpointing",
            extra={
                "event_id": failed_entry.event_id,
                "correlation_id": failed_entry.correlation_id,
                "sequence_number": changes[stop].sequence_number,
                "failures_by_code": result.failures_by_code,
            },
        )
    for entry_position, (code, message) in result.rejected.items():
        position, _ = publishable[entry_position]
        change = changes[position]
        assert change.new_image is not None
        rejected = InvalidEnvelope(f"EventBridge rejected the entry: {code}", {"errorMessage": message})
        poison.append((position, _poison_record(change, rejected)))
    poison.sort(key=lambda item: item[0])
    # Only poison before the checkpoint is parked: what follows it is redelivered and parked then,
    # so a retried batch never parks the same record twice.
    for position, record in poison:
        if position >= stop:
            break
        if not _park(record, poison_sink):
            stop = position
            break
        outcome.parked.append(record)
    if stop < len(changes):
        outcome.checkpoint = changes[stop].sequence_number
    _record_metrics(outcome, result)
    return outcome


def _poison_record(change: StreamChange, exc: InvalidEnvelope) -> PoisonRecord:
    assert change.new_image is not None
    return PoisonRecord(
        sequence_number=change.sequence_number,
        event_id=event_id_of_image(change.new_image),
        reason=exc.message,
        details=exc.details,
        image=change.new_image,
        stream_arn=change.stream_arn,
    )


def _park(record: PoisonRecord, sink: PoisonSink) -> bool:
    extra = {
        "event_id": record.event_id,
        "sequence_number": record.sequence_number,
        "reason": record.reason,
        "details": record.details,
    }
    try:
        sink.park(record)
    except (ClientError, BotoCoreError) as exc:
        # Transient like any publish failure: the shard waits here rather than lose the record.
        logger.warning("poison queue unavailable; checkpointing", extra={**extra, "error": str(exc)[:500]})
        metrics.add_metric(name="PoisonParkFailed", unit=MetricUnit.Count, value=1)
        return False
    logger.error("poison outbox record", extra={**extra, "action": "parked in the poison queue"})
    metrics.add_metric(name="PoisonRecords", unit=MetricUnit.Count, value=1)
    return True


def _record_metrics(outcome: RelayOutcome, result: PublishResult) -> None:
    metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=len(outcome.published))
    metrics.add_metric(name="PutEventsCalls", unit=MetricUnit.Count, value=result.calls)
    for code, count in result.failures_by_code.items():
        metrics.add_metric(name=f"PublishFailed.{code}", unit=MetricUnit.Count, value=count)
    published_at = datetime.now(UTC)
    for entry in outcome.published[:100]:  # EMF holds at most 100 values per metric
        # occurred_at was validated (RFC 3339 with an offset) when the entry was decoded.
        lag = (published_at - parse_time(entry.occurred_at)).total_seconds() * 1000
        metrics.add_metric(name="RelayLag", unit=MetricUnit.Milliseconds, value=max(lag, 0.0))
