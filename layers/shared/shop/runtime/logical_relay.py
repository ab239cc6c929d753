"""The logical relay (PostgresRelay=logical): from the outbox's inserts in the write-ahead log to the bus.

A round, in one transaction holding the slot's advisory lock (one reader at a time):
1. peek the slot's next committed transactions (shop.adapters.postgres.replication: pgoutput, the
   publication of the outbox's inserts; a rolled-back transaction never reaches the log's decoding);
2. publish their rows with the polling publisher's code (chunks of 10, never two events of one order
   in a call, each order in sequence; poison parked whole, and marked parked);
3. advance the slot to the end of the last transaction whose every row is on the bus or parked (or,
   when everything is, to where the read went, which releases WAL that held no outbox rows).
A crash before step 3 decodes the same transactions again: published again, in commit order, and
deduplicated by consumers by event id. The slot never moves past a row that is not on the bus, so a
crash after step 3 loses nothing. Rows are not marked published: the slot is the bookmark, and the
table is what replay and the retention window read.

The advance is not transactional, and a poison row's parked mark is: the slot moves past a row parked
in the round only once its mark is committed (a second, short transaction after the round's COMMIT,
under the lock again), so a crash between an advance and its COMMIT never leaves the slot past a
poison row that is in the poison queue and not marked parked. A row read again with its mark
committed (a crash before that second advance) is done: it is not parked twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import OutboxRow, mark_parked, parked_among
from shop.adapters.postgres.replication import (
    DecodedTransaction,
    advance_slot,
    peek_changes,
    try_lock_slot,
)
from shop.domain.errors import ServiceBusy
from shop.domain.poison import PoisonSink
from shop.domain.publishing import OutboxPublisher
from shop.runtime.observability import metrics
from shop.runtime.polling_publisher import RoundOutcome, publish_rows

MAX_CHANGES_PER_ROUND = 500  # pgoutput messages (a transaction's Begin, rows, Commit): whole transactions
READ_TIMEOUT_MARGIN_SECONDS = 10.0


def interleave_orders(rows: list[OutboxRow]) -> list[OutboxRow]:
    """Commit order, regrouped so one PutEvents call carries up to ten orders: every order's first row in
    the round, then every order's second... Each order's rows keep their commit order."""
    nth: dict[str, int] = {}
    ranked = []
    for index, row in enumerate(rows):
        nth[row.aggregate_id] = nth.get(row.aggregate_id, -1) + 1
        ranked.append(((nth[row.aggregate_id], index), row))
    return [row for _, row in sorted(ranked, key=lambda pair: pair[0])]


def confirmed_position(
    transactions: list[DecodedTransaction], done: set[int], read_to_lsn: int
) -> int | None:
    """Where the slot may move: past every leading transaction whose rows are all done (on the bus or
    parked); `read_to_lsn` when all are; None when the first is not."""
    confirmed = None
    for transaction in transactions:
        if any(row.position not in done for row in transaction.rows):
            return confirmed
        confirmed = transaction.end_lsn
    return read_to_lsn


def relay_slot_round(
    database: Database,
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    slot: str,
    max_event_bytes: int,
    max_changes: int = MAX_CHANGES_PER_ROUND,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
) -> RoundOutcome:
    """Read, publish and confirm one round of the slot's transactions."""
    with database.transaction() as cursor:
        if not try_lock_slot(cursor, slot):
            return RoundOutcome()  # another relay reads the slot: wait for its turn (an idle pause)
        # Decoding after a long outage reads much WAL before its first row: more than the usual bound.
        read_seconds = max(remaining_seconds() - READ_TIMEOUT_MARGIN_SECONDS, 1.0)
        cursor.execute(f"SET LOCAL statement_timeout = {int(read_seconds * 1000)}")
        changes = peek_changes(cursor, slot, max_changes)
        rows = [row for transaction in changes.transactions for row in transaction.rows]
        # Parked by an earlier round whose second advance never came: done, not parked again.
        already_parked = parked_among(cursor, [row.position for row in rows])
        parked: set[int] = set()

        def park(row: OutboxRow, reason: str) -> None:
            mark_parked(cursor, row.position, reason)
            parked.add(row.position)

        outcome, _ = publish_rows(
            interleave_orders([row for row in rows if row.position not in already_parked]),
            publisher,
            poison_sink,
            max_event_bytes=max_event_bytes,
            remaining_seconds=remaining_seconds,
            on_parked=park,
        )
        published = {row.position for row, _ in outcome.published}
        # Not transactional: the slot stays moved even if this transaction then rolls back. So not past a
        # row parked in this round: its mark rolls back with the transaction.
        confirm_to = confirmed_position(changes.transactions, published | already_parked, changes.read_to_lsn)
        if confirm_to is not None:
            advance_slot(cursor, slot, confirm_to)
        if changes.transactions:
            metrics.add_metric(
                name="SlotTransactionsRead", unit=MetricUnit.Count, value=len(changes.transactions)
            )
    if parked:
        # The marks are committed: past the rows parked in this round too, unless another relay took the
        # slot meanwhile (it reads them as parked; advance_slot never moves the slot back).
        done = published | already_parked | parked
        confirm_to = confirmed_position(changes.transactions, done, changes.read_to_lsn)
        # The database gone now: the next round reads those rows again, as parked.
        if confirm_to is not None:
            with contextlib.suppress(ServiceBusy), database.transaction() as cursor:
                if try_lock_slot(cursor, slot):
                    advance_slot(cursor, slot, confirm_to)
    return outcome
