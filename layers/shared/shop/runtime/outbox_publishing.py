"""The publishing core of the three relays: outbox events in (rows of the PostgreSQL outbox, records of a
table stream), on the bus, parked or left pending out. The relays differ only in where the events come
from and how they record progress (the stream relay's checkpoint, the polling publisher's row marks, the
logical relay's slot advance).

- publish_and_park: events in per-order publishing order; poison parked whole at once (an order whose
  poison could not be parked holds back its later events), the rest published in order;
- publish_entries: one run of decoded entries onto the bus, an entry the bus refuses for what it is
  parked (or, when the poison queue fails, the run stops there);
- park_poison: a poison record into the poison queue, or False when the queue is unavailable or too
  little of the invocation is left for its call (the caller keeps the record and waits, in order);
- Parking: park_poison for one round, within the invocation's time, and no further call after one failed;
- record_metrics, publish_lags, log_published: what each relay reports of its rounds (a log line per ten
  events published).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from shop.adapters import aws
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry
from shop.domain.poison import PoisonRecord, PoisonSink
from shop.domain.publishing import OutboxPublisher, PublishResult
from shop.runtime.observability import logger, metrics


class Parkable(Protocol):
    """An outbox event where it comes from, as the poison queue takes it whole."""

    def poison_record(self, problem: InvalidEnvelope) -> PoisonRecord: ...


class OrderedOutboxEvent(Parkable, Protocol):
    """An outbox event that knows its order and its entry (a row of the PostgreSQL outbox)."""

    @property
    def aggregate_id(self) -> str: ...

    def entry(self, max_event_bytes: int) -> OutboxEntry: ...


@dataclass
class PublishOutcome[Source]:
    """What publishing did with the events it took: each published one with where it came from, the parked
    ones, and (the rest) those left pending."""

    taken: int = 0
    published: list[tuple[Source, OutboxEntry]] = field(default_factory=list)
    parked: list[PoisonRecord] = field(default_factory=list)
    put_events_calls: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    # More is ready than the round took (its share of the invocation, a window of the log, a spilled
    # transaction): the next round starts at once, without the idle pause.
    backlog: bool = False
    # Events were left unsent: too little of the invocation was left for a PutEvents call to be answered.
    out_of_time: bool = False

    def add(self, other: PublishOutcome[Source]) -> None:
        """Count another slice of the same round into this one."""
        self.taken += other.taken
        self.published.extend(other.published)
        self.parked.extend(other.parked)
        self.put_events_calls += other.put_events_calls
        self.out_of_time = self.out_of_time or other.out_of_time
        for code, count in other.failures_by_code.items():
            self.failures_by_code[code] = self.failures_by_code.get(code, 0) + count

    @property
    def left_pending(self) -> int:
        """Events taken, neither published nor parked: the next round takes them again."""
        return self.taken - len(self.published) - len(self.parked)


def park_poison(record: PoisonRecord, sink: PoisonSink, invocation_seconds_left: Callable[[], float]) -> bool:
    """Park the record; False when the poison queue failed (transient, like any publish failure), or when
    too little of the invocation is left for the queue's call to answer, at worst by its timeouts (24 s:
    more than the PostgreSQL relays' reserve of a PutEvents call, so every relay gives its invocation's
    time here; a call still unanswered when Lambda times the invocation out would take the round with it:
    the stream relay's checkpoint, a polling round's marks). The record waits, in order."""
    extra = {
        "event_id": record.event_id,
        "sequence_number": record.position.marker,
        "reason": record.reason,
        "details": record.details,
    }
    if invocation_seconds_left() < aws.longest_call_seconds() + aws.ANSWER_SECONDS:
        logger.warning("too little time left to park; the record waits, in order", extra=extra)
        return False
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


class Parking:
    """A round's parking (park_poison within the invocation's time): once a park failed or was not begun,
    the round tries none again (each could take the queue call's worst case, 24 s, one after another
    before anything is published): its other poison waits too, in order, and the rest of the round goes
    on. The next round tries again."""

    def __init__(self, sink: PoisonSink, invocation_seconds_left: Callable[[], float]) -> None:
        self.sink = sink
        self._seconds_left = invocation_seconds_left
        self.closed = False

    def park(self, record: PoisonRecord) -> bool:
        if self.closed:
            logger.warning(
                "poison queue failed earlier in the round; the record waits, in order",
                extra={"event_id": record.event_id, "reason": record.reason},
            )
            return False
        if park_poison(record, self.sink, self._seconds_left):
            return True
        self.closed = True
        return False


def _ignore_parked[Source](source: Source, reason: str) -> None:
    return None


def publish_entries[Source: Parkable](
    batch: Sequence[tuple[Source, OutboxEntry]],
    publisher: OutboxPublisher,
    parking: Parking,
    outcome: PublishOutcome[Source],
    *,
    remaining_seconds: Callable[[], float],
    on_parked: Callable[[Source, str], None] = _ignore_parked,
    invocation_seconds_left: Callable[[], float] | None = None,
) -> PublishResult:
    """Publish the batch's entries in order, counting into `outcome`; an entry the bus rejects for what it
    is is parked whole. Returns the publisher's result: its first_unpublished is the position in `batch`
    publishing stopped at. `invocation_seconds_left`: the publisher begins no call that could be answered
    after it (default: remaining_seconds)."""

    def park_rejected(position: int, code: str, message: str) -> bool:
        source = batch[position][0]
        record = source.poison_record(
            InvalidEnvelope(f"EventBridge rejected the entry: {code}", {"errorMessage": message})
        )
        if not parking.park(record):
            return False
        on_parked(source, record.reason)
        outcome.parked.append(record)
        return True

    result = publisher.publish_in_order(
        [entry for _, entry in batch], remaining_seconds, park_rejected, invocation_seconds_left
    )
    outcome.put_events_calls += result.calls
    outcome.out_of_time = outcome.out_of_time or result.out_of_time
    for code, count in result.failures_by_code.items():
        outcome.failures_by_code[code] = outcome.failures_by_code.get(code, 0) + count
    outcome.published.extend(batch[position] for position in sorted(result.accepted_positions))
    return result


def publish_and_park[Source: OrderedOutboxEvent](
    events: Sequence[Source],
    publisher: OutboxPublisher,
    parking: Parking,
    *,
    max_event_bytes: int,
    remaining_seconds: Callable[[], float],
    on_parked: Callable[[Source, str], None],
    invocation_seconds_left: Callable[[], float] | None = None,
) -> tuple[PublishOutcome[Source], tuple[Source, str] | None]:
    """Publish events given in publishing order (each order's events in sequence), parking poison whole.
    Returns the outcome and, when publishing stopped at a failure, the event that failed with the error
    (it and its order's later events are not on the bus; other orders' events before or after it may
    not be, or be: the outcome says which are). Events left unsent for lack of time (the outcome's
    out_of_time) did not fail: they wait, in order."""
    return publish_decoded(
        [(event, decoded(event, max_event_bytes)) for event in events],
        publisher,
        parking,
        remaining_seconds=remaining_seconds,
        on_parked=on_parked,
        invocation_seconds_left=invocation_seconds_left,
    )


def decoded(event: OrderedOutboxEvent, max_event_bytes: int) -> OutboxEntry | InvalidEnvelope:
    """The event's PutEvents entry, or why it is poison."""
    try:
        return event.entry(max_event_bytes)
    except InvalidEnvelope as exc:
        return exc


def publish_decoded[Source: OrderedOutboxEvent](
    events: Sequence[tuple[Source, OutboxEntry | InvalidEnvelope]],
    publisher: OutboxPublisher,
    parking: Parking,
    *,
    remaining_seconds: Callable[[], float],
    on_parked: Callable[[Source, str], None],
    invocation_seconds_left: Callable[[], float] | None = None,
) -> tuple[PublishOutcome[Source], tuple[Source, str] | None]:
    """publish_and_park of events already decoded (each with its entry, or why it is poison)."""
    outcome = PublishOutcome[Source](taken=len(events))
    held_back: set[str] = set()  # orders whose earlier event could not be parked
    batch: list[tuple[Source, OutboxEntry]] = []
    for event, entry in events:
        if event.aggregate_id in held_back:
            continue
        if not isinstance(entry, InvalidEnvelope):
            batch.append((event, entry))
            continue
        record = event.poison_record(entry)
        if parking.park(record):
            on_parked(event, record.reason)
            outcome.parked.append(record)
        else:
            held_back.add(event.aggregate_id)
    result = publish_entries(
        batch,
        publisher,
        parking,
        outcome,
        remaining_seconds=remaining_seconds,
        on_parked=on_parked,
        invocation_seconds_left=invocation_seconds_left,
    )
    if result.failed_position is None:
        return outcome, None
    if result.first_failed is None and result.out_of_time:
        logger.info(
            "too little time left to publish; the rest waits, in order",
            extra={"event_id": batch[result.failed_position][1].event_id},
        )
        return outcome, None
    # Recorded on the entry that failed (an entry before it may be unsent only because its call waited
    # for the failed one's).
    failed, failed_entry = batch[result.failed_position]
    error = ", ".join(f"{code} x{count}" for code, count in result.failures_by_code.items())
    logger.warning(
        "publish failed; the event and its order's later events wait, in order",
        extra={
            "event_id": failed_entry.event_id,
            "correlation_id": failed_entry.correlation_id,
            "failures_by_code": result.failures_by_code,
        },
    )
    return outcome, (failed, error or "not published")


def record_metrics[Source](outcome: PublishOutcome[Source], *, batch_size: int | None = None) -> None:
    """The round's figures: its size (when given), what it published and how. Each relay then records
    its lag metric from publish_lags, under its own name."""
    if batch_size is not None:
        metrics.add_metric(name="BatchSize", unit=MetricUnit.Count, value=batch_size)
    metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=len(outcome.published))
    metrics.add_metric(name="PutEventsCalls", unit=MetricUnit.Count, value=outcome.put_events_calls)
    for code, count in outcome.failures_by_code.items():
        metrics.add_metric(name=f"PublishFailed.{code}", unit=MetricUnit.Count, value=count)


def publish_lags[Source](
    outcome: PublishOutcome[Source], since: Callable[[Source, OutboxEntry], datetime]
) -> list[float]:
    """Milliseconds from `since` (an event's commit, or its occurrence) to now, per published event."""
    published_at = datetime.now(UTC)
    return [
        max((published_at - since(source, entry)).total_seconds() * 1000, 0.0)
        for source, entry in outcome.published[:100]  # EMF holds at most 100 values per metric
    ]


# Events named by one "events published" line: a PutEvents call's worth. A line per event cost the
# relays a third of their CPU under the interpreter lock (62 us each through Powertools' formatter, against
# 0.16 ms of botocore per event) and a log record per event (docs/performance.md, "Relays at AWS latency").
PUBLISHED_PER_LINE = 10


def log_published(outcome: PublishOutcome[Any]) -> None:
    """An "events published" line per ten events published, in publishing order, with their ids, types,
    orders and correlation ids side by side (the Nth of each list is the Nth event)."""
    entries = [entry for _, entry in outcome.published]
    for start in range(0, len(entries), PUBLISHED_PER_LINE):
        line = entries[start : start + PUBLISHED_PER_LINE]
        logger.info(
            "events published",
            extra={
                "event_ids": [entry.event_id for entry in line],
                "event_types": [entry.detail_type for entry in line],
                "aggregates": [entry.aggregate for entry in line],
                "correlation_ids": [entry.correlation_id for entry in line],
            },
        )
