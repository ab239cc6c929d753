"""The polling publisher: from the PostgreSQL outbox to the event bus, one transaction per round.

A round claims pending events (shop.adapters.postgres.outbox: per-order sequence, FOR UPDATE SKIP
LOCKED, so several publishers share the work without reordering an order's events), publishes them
with the relay's publishing code (chunks of 10, never two events of one order in a call, transient
failures retried in order) and marks them published in the transaction that holds their locks.

Failures, as in the stream relay:
- a poison row (undecodable envelope, larger than the bus takes, refused by EventBridge for what it
  is) is parked whole in the relay poison queue and marked parked, so it never holds its order back;
  when the poison queue fails, the row stays pending and its order's later events wait with it;
- a transient failure stops the round at that event: it and everything after it stay pending (its
  attempts and last error recorded) and the next round takes them again, in order.
A crash between PutEvents and COMMIT leaves the round's rows pending: they are published again, and
consumers deduplicate them by event id.

One invocation keeps polling (an idle pause between empty rounds) until its last seconds, so the lag
from commit to bus stays under a second while it runs; EventBridge Scheduler starts the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import (
    OutboxRow,
    claim_pending,
    mark_failed,
    mark_parked,
    mark_published,
)
from shop.domain.errors import InvalidEnvelope, ServiceBusy
from shop.domain.outbox import OutboxEntry, outbox_entry
from shop.domain.poison import PoisonRecord, PoisonSink
from shop.domain.publishing import OutboxPublisher
from shop.runtime.observability import logger, metrics
from shop.runtime.outbox_publishing import park_poison

MAX_ORDERS_PER_ROUND = 50
IDLE_PAUSE_SECONDS = 0.2  # between empty rounds: the lag while idle, and the queries it costs
FAILURE_PAUSE_SECONDS = 1.0  # after a round that stopped at a failure: let the bus or database recover
RESERVE_SECONDS = 5.0  # a round never starts in the invocation's last seconds


@dataclass
class RoundOutcome:
    claimed: int = 0
    published: list[tuple[OutboxRow, OutboxEntry]] = field(default_factory=list)
    parked: list[PoisonRecord] = field(default_factory=list)
    put_events_calls: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    # More is ready than the round took (its share of the invocation, a window of the log, a spilled
    # transaction): the next round starts at once, without the idle pause.
    backlog: bool = False

    def add(self, other: RoundOutcome) -> None:
        """Count another slice of the same round into this one."""
        self.claimed += other.claimed
        self.published.extend(other.published)
        self.parked.extend(other.parked)
        self.put_events_calls += other.put_events_calls
        for code, count in other.failures_by_code.items():
            self.failures_by_code[code] = self.failures_by_code.get(code, 0) + count

    @property
    def left_pending(self) -> int:
        """Claimed rows neither published nor parked: the next round takes them again."""
        return self.claimed - len(self.published) - len(self.parked)


def _poison(row: OutboxRow, exc: InvalidEnvelope) -> PoisonRecord:
    return PoisonRecord(
        sequence_number=str(row.position),
        event_id=row.event_id,
        reason=exc.message,
        details={**exc.details, "outboxPosition": row.position},
        image=row.as_item(),
    )


def publish_rows(
    rows: list[OutboxRow],
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    max_event_bytes: int,
    remaining_seconds: Callable[[], float],
    on_parked: Callable[[OutboxRow, str], None],
) -> tuple[RoundOutcome, tuple[OutboxRow, str] | None]:
    """Publish rows given in publishing order (each order's events in sequence), parking poison whole;
    shared by the polling publisher and the logical relay. Returns the outcome and, when publishing
    stopped at a failure, the row it stopped at with the error (it and its order's later rows are not
    on the bus; other orders' rows after it may be)."""
    outcome = RoundOutcome(claimed=len(rows))
    held_back: set[str] = set()  # orders whose earlier event could not be parked
    batch: list[tuple[OutboxRow, OutboxEntry]] = []
    for row in rows:
        if row.aggregate_id in held_back:
            continue
        try:
            batch.append((row, outbox_entry(row.envelope, max_event_bytes, row.trace_header)))
            continue
        except InvalidEnvelope as exc:
            record = _poison(row, exc)
        if park_poison(record, poison_sink):
            on_parked(row, record.reason)
            outcome.parked.append(record)
        else:
            held_back.add(row.aggregate_id)

    def park_rejected(position: int, code: str, message: str) -> bool:
        row = batch[position][0]
        refused = InvalidEnvelope(f"EventBridge rejected the entry: {code}", {"errorMessage": message})
        record = _poison(row, refused)
        if not park_poison(record, poison_sink):
            return False
        on_parked(row, record.reason)
        outcome.parked.append(record)
        return True

    result = publisher.publish_in_order([entry for _, entry in batch], remaining_seconds, park_rejected)
    outcome.put_events_calls = result.calls
    outcome.failures_by_code = dict(result.failures_by_code)
    outcome.published = [batch[position] for position in sorted(result.accepted_positions)]
    if result.first_unpublished is None:
        return outcome, None
    failed_row, failed_entry = batch[result.first_unpublished]
    error = ", ".join(f"{code} x{count}" for code, count in result.failures_by_code.items())
    logger.warning(
        "publish failed; the event and its order's later events wait, in order",
        extra={
            "event_id": failed_entry.event_id,
            "correlation_id": failed_entry.correlation_id,
            "failures_by_code": result.failures_by_code,
        },
    )
    return outcome, (failed_row, error or "not published")


def publish_pending_round(
    database: Database,
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    max_event_bytes: int,
    max_orders: int = MAX_ORDERS_PER_ROUND,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> RoundOutcome:
    """Claim, publish and mark one round of pending events, in one transaction."""
    with database.transaction() as cursor:
        rows = claim_pending(cursor, max_orders)
        outcome, failed = publish_rows(
            rows,
            publisher,
            poison_sink,
            max_event_bytes=max_event_bytes,
            remaining_seconds=remaining_seconds,
            on_parked=lambda row, reason: mark_parked(cursor, row.position, reason),
        )
        mark_published(cursor, [row.position for row, _ in outcome.published])
        if failed is not None:
            mark_failed(cursor, [failed[0].position], failed[1])
    return outcome


@dataclass
class PollTotals:
    rounds: int = 0
    published: int = 0
    parked: int = 0
    put_events_calls: int = 0
    database_unavailable: int = 0


def poll_outbox(
    run_round: Callable[[], RoundOutcome],
    seconds_left: Callable[[], float],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> PollTotals:
    """Run rounds until the invocation's last seconds; pause between empty or failed rounds."""
    totals = PollTotals()
    while seconds_left() > RESERVE_SECONDS:
        try:
            outcome = run_round()
        except ServiceBusy as exc:
            # The database is down or failing over: nothing was marked, nothing is lost; try again.
            logger.warning("order database unavailable", extra={"error": str(exc.__cause__ or exc)[:500]})
            metrics.add_metric(name="DatabaseUnavailable", unit=MetricUnit.Count, value=1)
            totals.database_unavailable += 1
            sleep(FAILURE_PAUSE_SECONDS)
            continue
        totals.rounds += 1
        totals.published += len(outcome.published)
        totals.parked += len(outcome.parked)
        totals.put_events_calls += outcome.put_events_calls
        _record_metrics(outcome)
        if outcome.left_pending:
            sleep(FAILURE_PAUSE_SECONDS)
        elif not outcome.claimed and not outcome.backlog:
            sleep(IDLE_PAUSE_SECONDS)
    return totals


def _record_metrics(outcome: RoundOutcome) -> None:
    if not outcome.claimed:
        return  # an empty round is not a batch: no data points that would dilute the averages
    metrics.add_metric(name="BatchSize", unit=MetricUnit.Count, value=outcome.claimed)
    metrics.add_metric(name="EventsPublished", unit=MetricUnit.Count, value=len(outcome.published))
    metrics.add_metric(name="PutEventsCalls", unit=MetricUnit.Count, value=outcome.put_events_calls)
    for code, count in outcome.failures_by_code.items():
        metrics.add_metric(name=f"PublishFailed.{code}", unit=MetricUnit.Count, value=count)
    published_at = datetime.now(UTC)
    for row, _ in outcome.published[:100]:  # EMF holds at most 100 values per metric
        lag = (published_at - row.created_at).total_seconds() * 1000
        metrics.add_metric(name="PublishLag", unit=MetricUnit.Milliseconds, value=max(lag, 0.0))
