"""The polling publisher: from the PostgreSQL outbox to the event bus, one transaction per round.

A round claims pending events (shop.adapters.postgres.outbox: per-order sequence, FOR UPDATE SKIP
LOCKED, so several publishers share the work without reordering an order's events), publishes them
with the relays' publishing core (shop.runtime.outbox_publishing: chunks of 10, never two events of
one order in a call, transient failures retried in order) and marks them published in the transaction
that holds their locks.

Failures, as in the stream relay:
- a poison row (undecodable envelope, larger than the bus takes, refused by EventBridge for what it
  is) is parked whole in the relay poison queue and marked parked, so it never holds its order back;
  when the poison queue fails, the row stays pending and its order's later events wait with it (the
  round calls the queue no more: its other poison waits too, and the other orders go out);
- a transient failure stops the round at that event: it and everything after it stay pending (its
  attempts and last error recorded) and the next round takes them again, in order.
A crash between PutEvents and COMMIT leaves the round's rows pending: they are published again, and
consumers deduplicate them by event id. A poison row in the claim is parked before anything is
published, its mark committed at once: such a rollback does not park it again.

One invocation keeps polling (an idle pause between empty rounds) until its last seconds, so the lag
from commit to bus stays under a second while it runs; EventBridge Scheduler starts the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters import aws
from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import (
    OutboxRow,
    claim_pending,
    mark_failed,
    mark_parked,
    mark_published,
)
from shop.domain.errors import InvalidEnvelope, ServiceBusy
from shop.domain.outbox import OutboxEntry
from shop.domain.poison import PoisonRecord, PoisonSink
from shop.domain.publishing import OutboxPublisher, whole_calls
from shop.runtime.config import PUBLISH_TRANSPORTS
from shop.runtime.observability import logger, metrics
from shop.runtime.outbox_publishing import (
    Parking,
    PublishOutcome,
    decoded,
    publish_decoded,
    publish_lags,
    record_metrics,
)

# Orders a round claims. Large enough that a round's chunks keep the publisher's calls in flight busy
# (at 50 orders a round used 5 of 16 at AWS's latency: docs/performance.md, "Relays at AWS latency");
# at a low write rate a round takes what is pending, so the lag is unchanged.
MAX_ORDERS_PER_ROUND = 500
IDLE_PAUSE_SECONDS = 0.2  # between empty rounds: the lag while idle, and the queries it costs
FAILURE_PAUSE_SECONDS = 1.0  # after a round that stopped at a failure: let the bus or database recover
# A round never starts in the invocation's last seconds: those in which a PutEvents call, through either
# transport, could still be unanswered when the invocation ends (the publisher would begin none).
RESERVE_SECONDS = max(aws.longest_put_events_seconds(t) for t in PUBLISH_TRANSPORTS) + aws.ANSWER_SECONDS


def publish_pending_round(
    database: Database,
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    max_event_bytes: int,
    max_orders: int = MAX_ORDERS_PER_ROUND,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> PublishOutcome[OutboxRow]:
    """Claim, publish and mark one round of pending events, in one transaction; a poison row found in
    the claim is parked first, in a transaction of its own."""
    parking = Parking(poison_sink, remaining_seconds)  # the invocation's time: a park outlasts the reserve
    parked: list[PoisonRecord] = []
    while True:
        with database.transaction() as cursor:
            rows = claim_pending(cursor, max_orders)
            if len({row.aggregate_id for row in rows}) >= max_orders:
                # A full claim: more is pending. The short last call's events stay pending (locked until
                # the COMMIT) and lead the next round, which fills their call.
                rows = list(whole_calls(rows))
            events = [(row, decoded(row, max_event_bytes)) for row in rows]
            if not parking.closed and (poison := _first_poison(events)) is not None:
                # Parked and marked, then COMMIT at once, before anything is published: the mark can no
                # longer be rolled back with the round (a dropped connection, a failed COMMIT, a crash
                # or timeout in PutEvents), which would park the row again in the next round. The
                # claim's row locks make this safe with several publishers; a second connection
                # could not write the mark while they are held. Then the orders are claimed again.
                row, record = poison[0], poison[0].poison_record(poison[1])
                if parking.park(record):
                    mark_parked(cursor, row.position, record.reason)
                    parked.append(record)
                    continue
            # Poison left here waits (parking closed: failed or out of time). An entry EventBridge rejects
            # is parked and marked in this transaction: the one kind still parked again if it rolls back.
            outcome, failed = publish_decoded(
                events,
                publisher,
                parking,
                remaining_seconds=remaining_seconds,
                on_parked=lambda row, reason: mark_parked(cursor, row.position, reason),
            )
            mark_published(cursor, [row.position for row, _ in outcome.published])
            if failed is not None:
                mark_failed(cursor, [failed[0].position], failed[1])
        outcome.taken += len(parked)
        outcome.parked[:0] = parked
        return outcome


def _first_poison(
    events: list[tuple[OutboxRow, OutboxEntry | InvalidEnvelope]],
) -> tuple[OutboxRow, InvalidEnvelope] | None:
    for row, entry in events:
        if isinstance(entry, InvalidEnvelope):
            return row, entry
    return None


@dataclass
class PollTotals:
    rounds: int = 0
    published: int = 0
    parked: int = 0
    put_events_calls: int = 0
    database_unavailable: int = 0


def poll_outbox(
    run_round: Callable[[], PublishOutcome[OutboxRow]],
    seconds_left: Callable[[], float],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> PollTotals:
    """Run rounds until the invocation's last seconds (or a round that had too little of it left for a
    PutEvents call); pause between empty or failed rounds."""
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
        if outcome.taken:  # an empty round is not a batch: no data points that would dilute the averages
            record_metrics(outcome, batch_size=outcome.taken)
            for lag in publish_lags(outcome, lambda row, _: row.created_at):
                metrics.add_metric(name="PublishLag", unit=MetricUnit.Milliseconds, value=lag)
        if outcome.out_of_time:
            break  # no PutEvents call could be answered before the invocation ends: the next one goes on
        if outcome.left_pending:
            sleep(FAILURE_PAUSE_SECONDS)
        elif not outcome.taken and not outcome.backlog:
            sleep(IDLE_PAUSE_SECONDS)
    return totals
