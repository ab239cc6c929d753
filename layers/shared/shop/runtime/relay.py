"""The outbox relay: from table stream changes to the event bus, with an exact checkpoint.

Input is a list of stream changes in shard order (from a Lambda stream batch, or read back from the
stream by redrive). Non-outbox changes are skipped. Two kinds of failure, handled differently:
- a poison record (it can never be published: undecodable image, invalid envelope, oversize) is
  parked whole in the poison queue and the relay moves on, so it never holds its shard and never
  takes healthy neighbours to a dead-letter queue with it, whatever Lambda's bisection does;
- a transient failure (throttling, EventBridge errors, the poison queue itself failing) stops the
  relay at that record: the caller reports its sequence number, Lambda retries from it, and nothing
  before it is sent again. The shard waits, in order, until the failure clears.

Poison is parked in stream order: a poison record is parked after everything before it is on the bus
and before anything after it is sent, so when the poison queue fails, the checkpoint at the poison
record holds back records that were never sent, and no retry puts anything on the bus twice. An entry
EventBridge itself rejects is only known once its PutEvents call answered: if it cannot be parked,
what was sent past it (in its call and in the calls answered or in flight before: events of other
aggregates) is sent again by the retry; consumers deduplicate them by event id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.dynamodb.outbox_items import decode_outbox_image, is_outbox_image, poison_record
from shop.domain.envelope import parse_time
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry
from shop.domain.poison import PoisonRecord, PoisonSink, StreamPosition
from shop.domain.publishing import OutboxPublisher
from shop.runtime.observability import logger, metrics
from shop.runtime.outbox_publishing import (
    Parking,
    PublishOutcome,
    publish_entries,
    publish_lags,
    record_metrics,
)


class StreamChange(NamedTuple):
    """One record of a table stream, independent of how it was delivered."""

    sequence_number: str
    event_name: str  # INSERT, MODIFY, REMOVE (TTL deletions may arrive under other names)
    new_image: dict[str, Any] | None
    stream_arn: str | None = None

    def poison_record(self, problem: InvalidEnvelope) -> PoisonRecord:
        """The record parked whole, named by its place in the stream."""
        assert self.new_image is not None
        return poison_record(self.new_image, problem, StreamPosition(self.sequence_number, self.stream_arn))


@dataclass
class RelayOutcome(PublishOutcome[StreamChange]):
    skipped: int = 0
    checkpoint: str | None = None  # sequence number to retry from; None = whole batch done


def relay_outbox_changes(
    changes: Sequence[StreamChange],
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    max_event_bytes: int,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> RelayOutcome:
    outcome = RelayOutcome()
    parking = Parking(poison_sink, remaining_seconds)  # the invocation's: Lambda's remaining time
    segment: list[tuple[int, OutboxEntry]] = []  # (position in changes, entry) since the last poison
    stop: int | None = None  # position of the first change this invocation did not finish
    for position, change in enumerate(changes):
        if change.event_name != "INSERT" or not is_outbox_image(change.new_image):
            outcome.skipped += 1  # foreign items, updates, TTL deletions: not ours to publish
            continue
        assert change.new_image is not None
        outcome.taken += 1
        try:
            segment.append((position, decode_outbox_image(change.new_image, max_event_bytes)))
            continue
        except InvalidEnvelope as exc:
            poison = change.poison_record(exc)
        # Everything before the poison goes out first; nothing after it until it is parked.
        stop = _publish_segment(segment, changes, publisher, parking, outcome, remaining_seconds)
        segment = []
        if stop is not None:
            break
        if not parking.park(poison):
            stop = position
            break
        outcome.parked.append(poison)
    else:
        stop = _publish_segment(segment, changes, publisher, parking, outcome, remaining_seconds)
    if stop is not None:
        outcome.checkpoint = changes[stop].sequence_number
    record_metrics(outcome)
    for lag in publish_lags(outcome, _occurred_at):
        metrics.add_metric(name="RelayLag", unit=MetricUnit.Milliseconds, value=lag)
    return outcome


def _occurred_at(change: StreamChange, entry: OutboxEntry) -> datetime:
    # occurred_at was validated (RFC 3339 with an offset) when the entry was decoded.
    return parse_time(entry.occurred_at)


def _publish_segment(
    segment: list[tuple[int, OutboxEntry]],
    changes: Sequence[StreamChange],
    publisher: OutboxPublisher,
    parking: Parking,
    outcome: RelayOutcome,
    remaining_seconds: Callable[[], float],
) -> int | None:
    """Publish a run of decodable entries; returns the position in `changes` to checkpoint at, if any."""
    if not segment:
        return None
    batch = [(changes[position], entry) for position, entry in segment]
    result = publish_entries(
        batch,
        publisher,
        parking,
        outcome,
        remaining_seconds=remaining_seconds,
    )
    if result.first_unpublished is None or result.failed_position is None:
        return None
    stop = segment[result.first_unpublished][0]
    # The event that failed; the checkpoint may lie before it (an event whose call waited for its call's).
    failed_entry = segment[result.failed_position][1]
    logger.warning(
        "too little time left; checkpointing"
        if result.first_failed is None and result.out_of_time
        else "publish failed; checkpointing",
        extra={
            "event_id": failed_entry.event_id,
            "correlation_id": failed_entry.correlation_id,
            "sequence_number": changes[stop].sequence_number,
            "failures_by_code": result.failures_by_code,
        },
    )
    return stop
