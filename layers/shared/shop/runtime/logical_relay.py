"""The logical relay (PostgresRelay=logical): from the outbox's inserts in the write-ahead log to the bus.

A round, in one transaction holding the slot's advisory lock (one reader at a time), bounded in time
whatever the log holds (its share of the invocation: `round_seconds`, never into the invocation's last
seconds):
1. check the outbox is handed over to this relay (outbox_relay.mode): a relay started with the previous
   configuration publishes nothing after a switch (RelayModeMismatch);
2. peek the slot's next committed transactions (shop.adapters.postgres.replication: pgoutput, the
   publication of the outbox's inserts; a rolled-back transaction never reaches the log's decoding),
   in a window of the log (so one read never decodes more WAL than its time allows, after an outage
   too; a read that still runs out of its time halves the window and ends the round);
3. publish their rows with the relays' publishing core (shop.runtime.outbox_publishing: chunks of 10,
   never two events of one order in a call, each order in sequence; poison parked whole, and marked
   parked), a slice at a time, until the round's time is up; with a chunk of the replay sets being
   drained (shop.adapters.postgres.replays: replays, the handover from the polling publisher,
   transactions too large for a round), each row leaving its set in the round's transaction;
4. advance the slot to the end of the last transaction whose every row is on the bus or parked (or,
   when everything is, to where the read went, which releases WAL that held no outbox rows).
A crash before step 4 decodes the same transactions again: published again, in commit order, and
deduplicated by consumers by event id. The slot never moves past a row that is not on the bus, so a
crash after step 4 loses nothing. Rows are not marked published: the slot is the bookmark, and the
table is what replay and the retention window read.

The advance is not transactional, and a poison row's parked mark is: the slot moves past a row parked
in the round only once its mark is committed (a second, short transaction after the round's COMMIT,
under the lock again), so a crash between an advance and its COMMIT never leaves the slot past a
poison row that is in the poison queue and not marked parked. A row read again with its mark
committed (a crash before that second advance) is done: it is not parked twice. The same holds for a
replay set's message (the set is activated in the round's transaction) and for a transaction recorded
as a set of its own (a spill): the slot passes them once that is committed.

Each order's events reach the bus in sequence across both sources: a row of the slot whose order has
an earlier row still pending in a set goes out after that row, which the round publishes first; a
set's rows are drained only once its message is behind the slot (everything committed before it out).

A lost slot (missing or invalidated while the outbox's relay mode is logical) stops the round with
ReplicationSlotLost (shop.adapters.postgres.slot_recovery): the slot, its state and the way back
(`python -m operations recover-slot`), not the server's error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import psycopg
from aws_lambda_powertools.metrics import MetricUnit

from shop.adapters.postgres import replays
from shop.adapters.postgres.connection import Database, limit_statement_time
from shop.adapters.postgres.outbox import OutboxRow, RelayModeMismatch, mark_parked, parked_among
from shop.adapters.postgres.replication import (
    DecodedTransaction,
    advance_slot,
    peek_changes,
    read_relay_state,
    try_lock_slot,
)
from shop.adapters.postgres.slot_recovery import ReplicationSlotLost, lost_slot_detected, read_slot_state
from shop.domain.errors import ServiceBusy
from shop.domain.poison import PoisonSink
from shop.domain.publishing import MAX_ENTRIES_PER_CALL, OutboxPublisher, interleave_orders
from shop.runtime.observability import logger, metrics
from shop.runtime.outbox_publishing import Parking, PublishOutcome, publish_and_park

# pgoutput messages (a transaction's Begin, rows, Commit) a round reads, whole transactions: at 500 a
# round's rows kept too few calls in flight at AWS's latency (docs/performance.md, "Relays at AWS latency").
MAX_CHANGES_PER_ROUND = 5000
ROUND_SECONDS = 15.0  # a round's share of the invocation, at most (the publisher runs 70 s)
ROUND_RESERVE_SECONDS = 2.0  # and never into the invocation's last seconds
READ_SHARE = 0.5  # of the round's time, for its read of the slot (statement_timeout)
MIN_READ_SECONDS = 1.0
# Rows published between two looks at the clock: 100 PutEvents calls at most, enough to keep the
# publisher's calls in flight (32 by default) busy; a slice of 100 (10 calls) let at most 10 fly and
# emptied them at each slice's end. At AWS's 50 ms a slice of 1,000 takes about 0.35 s.
SLICE_ROWS = 1000
SET_ROWS_PER_ROUND = 200  # rows of replay sets a round drains, at most
SPILL_ROWS = 100  # a transaction with more rows is recorded as a set and drained, never published whole
WINDOW_BYTES = 16 * 1024 * 1024  # of WAL a round decodes at most, to start with
MIN_WINDOW_BYTES = 64 * 1024
MAX_WINDOW_BYTES = 256 * 1024 * 1024

_windows: dict[str, int] = {}  # per slot: the window this process found its reads fit in


class _ReadTimedOut(Exception):
    """The slot's read ran past its share of the round."""


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


def confirmation(
    transactions: list[DecodedTransaction],
    read_to_lsn: int,
    done: set[int],
    parked_now: set[int],
    activated: set[int],
) -> tuple[int | None, int | None, list[int]]:
    """How far the slot may move before the round's COMMIT (past transactions whose rows are on the bus or
    were parked earlier, and whose replay sets were activated earlier), how far once it is committed
    (rows parked and sets activated in the round too), and the sets to activate in the round."""
    now: int | None = None
    after: int | None = None
    activate: list[int] = []
    clean = True
    settled = done | parked_now  # once: a union per transaction made rounds quadratic
    for transaction in transactions:
        positions = {row.position for row in transaction.rows}
        if not positions <= settled:
            return now, after, activate
        new = [replay_id for replay_id in transaction.replay_ids if replay_id not in activated]
        activate.extend(new)
        clean = clean and positions <= done and not new
        if clean:
            now = transaction.end_lsn
        after = transaction.end_lsn
    return (read_to_lsn if clean else now), read_to_lsn, activate


def _spills(transaction: DecodedTransaction, spill_rows: int) -> bool:
    """A transaction recorded as a set rather than published whole: more rows than a round publishes, or
    a replay message of the old format (naming its rows inline: any number)."""
    return len(transaction.rows) > spill_rows or bool(transaction.replayed)


def _whole_calls(transactions: list[DecodedTransaction]) -> list[DecodedTransaction]:
    """The leading transactions whose rows fill whole PutEvents calls, the fewest last ones left out (at
    least one transaction kept); all of them when no such cut exists within a call's worth of rows."""
    short = sum(len(transaction.rows) for transaction in transactions) % MAX_ENTRIES_PER_CALL
    if not short:
        return transactions
    left = 0
    for index in range(len(transactions) - 1, 0, -1):
        left += len(transactions[index].rows)
        if left >= short + MAX_ENTRIES_PER_CALL:
            break
        if left and left % MAX_ENTRIES_PER_CALL == short:
            return transactions[:index]
    return transactions


def _order_of(row: OutboxRow) -> str:
    return row.aggregate_id


def _window(slot: str, fixed: int | None) -> int:
    return fixed if fixed is not None else _windows.get(slot, WINDOW_BYTES)


def _publish_within(
    rows: list[OutboxRow],
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    max_event_bytes: int,
    seconds_left: Callable[[], float],
    invocation_seconds_left: Callable[[], float],
    slice_rows: int,
    on_parked: Callable[[OutboxRow, str], None],
) -> tuple[PublishOutcome[OutboxRow], bool]:
    """Publish `rows` a slice at a time while the round has time: always the first slice (a round makes
    progress: the round's time bounds only its retries, the invocation's every call), and none after a
    slice that left a row unpublished (nothing may overtake it). Returns the outcome and whether rows were
    left for lack of time."""
    total = PublishOutcome[OutboxRow]()
    parking = Parking(poison_sink, invocation_seconds_left)  # one for the round: its slices share it
    for start in range(0, len(rows), slice_rows):
        if start and seconds_left() <= 0:
            return total, True
        part, _ = publish_and_park(
            rows[start : start + slice_rows],
            publisher,
            parking,
            max_event_bytes=max_event_bytes,
            remaining_seconds=seconds_left,
            on_parked=on_parked,
            invocation_seconds_left=invocation_seconds_left,
        )
        total.add(part)
        if part.left_pending:
            return total, part.out_of_time
    return total, False


def relay_slot_round(
    database: Database,
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    slot: str,
    max_event_bytes: int,
    max_changes: int = MAX_CHANGES_PER_ROUND,
    remaining_seconds: Callable[[], float] = lambda: 60.0,
    round_seconds: float = ROUND_SECONDS,
    set_rows: int = SET_ROWS_PER_ROUND,
    spill_rows: int = SPILL_ROWS,
    slice_rows: int = SLICE_ROWS,
    window_bytes: int | None = None,
) -> PublishOutcome[OutboxRow]:
    """Read, publish and confirm one round of the slot's transactions and of the replay sets' rows.
    `window_bytes` fixes the window of the log a read decodes (default: adapted per slot)."""
    budget = max(min(round_seconds, remaining_seconds() - ROUND_RESERVE_SECONDS), 0.0)
    deadline = time.monotonic() + budget

    def seconds_left() -> float:
        return min(deadline - time.monotonic(), remaining_seconds())

    read_seconds = max(budget * READ_SHARE, MIN_READ_SECONDS)
    window = _window(slot, window_bytes)
    try:
        with database.transaction() as cursor:
            if not try_lock_slot(cursor, slot):
                return PublishOutcome()  # another relay reads the slot: wait for its turn (an idle pause)
            state = read_relay_state(cursor, slot)
            if state.mode != "logical":
                raise RelayModeMismatch("logical", state.mode)
            if state.recovery_unfinished:
                # The recreated slot holds what committed after it, not the gap before: read now, an
                # order's later event would reach the bus before its earlier one in the gap.
                raise ReplicationSlotLost(read_slot_state(cursor, slot))
            upto = state.flush_lsn
            if state.confirmed_lsn is not None:  # else the read below says what became of the slot
                upto = min(upto, state.confirmed_lsn + window)
            limit_statement_time(cursor, max(int(read_seconds * 1000), 1))
            read_started = time.monotonic()
            try:
                with lost_slot_detected(cursor, slot):  # a lost slot: ReplicationSlotLost, saying what to do
                    changes = peek_changes(cursor, slot, max_changes, upto_lsn=upto)
            except psycopg.errors.QueryCanceled as exc:
                raise _ReadTimedOut from exc
            quick = time.monotonic() - read_started < read_seconds / 4  # room to read more at once
            if window_bytes is None and upto < state.flush_lsn and quick:
                _windows[slot] = min(window * 2, MAX_WINDOW_BYTES)
            outcome, after, now = _round(
                cursor,
                changes.transactions,
                changes.read_to_lsn,
                state.sets_pending,
                changes.read_to_lsn < state.flush_lsn,
                publisher,
                poison_sink,
                max_event_bytes=max_event_bytes,
                seconds_left=seconds_left,
                invocation_seconds_left=remaining_seconds,
                set_rows=set_rows,
                spill_rows=spill_rows,
                slice_rows=slice_rows,
            )
            if now is not None:
                advance_slot(cursor, slot, now)
            outcome.backlog = outcome.backlog or upto < state.flush_lsn
            if changes.transactions:
                metrics.add_metric(
                    name="SlotTransactionsRead", unit=MetricUnit.Count, value=len(changes.transactions)
                )
    except _ReadTimedOut:
        # The WAL to decode before the first row is more than the round's time allows (after an outage):
        # a smaller window next time, and the round ends in its budget.
        _windows[slot] = max(window // 2, MIN_WINDOW_BYTES)
        logger.warning(
            "slot read ran out of its time; reading a smaller window of the log",
            extra={"slot": slot, "window_bytes": _windows[slot], "read_seconds": read_seconds},
        )
        metrics.add_metric(name="SlotReadTimedOut", unit=MetricUnit.Count, value=1)
        return PublishOutcome(backlog=True)
    if after is not None and (now is None or after > now):
        # The marks and activations are committed: past those transactions too, unless another relay took
        # the slot meanwhile (it reads them as done; advance_slot never moves the slot back). The database
        # gone now: the next round reads them again, as done.
        with contextlib.suppress(ServiceBusy), database.transaction() as cursor:
            if try_lock_slot(cursor, slot):
                advance_slot(cursor, slot, after)
    return outcome


def _round(
    cursor: psycopg.Cursor,
    transactions: list[DecodedTransaction],
    read_to_lsn: int,
    sets_pending: bool,
    more_ready: bool,
    publisher: OutboxPublisher,
    poison_sink: PoisonSink,
    *,
    max_event_bytes: int,
    seconds_left: Callable[[], float],
    invocation_seconds_left: Callable[[], float],
    set_rows: int,
    spill_rows: int,
    slice_rows: int,
) -> tuple[PublishOutcome[OutboxRow], int | None, int | None]:
    """The round's work in its transaction; returns the outcome and where the slot may move after the
    COMMIT and before it."""
    if transactions and _spills(transactions[0], spill_rows):
        # Everything before it is behind the slot: record its rows as a set of its own, drained from the
        # next round on, and move past it once that is committed.
        head = transactions[0]
        positions = [row.position for row in head.rows] + head.replayed
        replays.record_set(cursor, positions, "spill", source_lsn=head.end_lsn, activated=True)
        # A replay message in the same transaction: everything committed before it is behind the slot too.
        replays.activate(cursor, head.replay_ids)
        metrics.add_metric(name="SlotTransactionsSpilled", unit=MetricUnit.Count, value=1)
        return PublishOutcome(backlog=True), head.end_lsn, None
    kept = transactions
    for index, transaction in enumerate(transactions):
        if _spills(transaction, spill_rows):  # the next round starts with it
            kept, read_to_lsn = transactions[:index], transactions[index - 1].end_lsn
            break
    if more_ready and not sets_pending and len(kept) == len(transactions):
        # The log holds more than the read took: end the round on whole PutEvents calls, the last
        # transactions left for the next read, which fills their call.
        whole = _whole_calls(kept)
        if len(whole) < len(kept):
            kept, read_to_lsn = whole, whole[-1].end_lsn
    rows = [row for transaction in kept for row in transaction.rows]
    # Parked by an earlier round whose second advance never came: done, not parked again.
    already_parked = parked_among(cursor, [row.position for row in rows])
    earlier: list[replays.SetRow] = []
    chunk: list[replays.SetRow] = []
    if sets_pending:
        firsts: dict[str, int] = {}
        for row in rows:
            firsts[row.aggregate_id] = min(firsts.get(row.aggregate_id, row.sequence), row.sequence)
        earlier = replays.earlier_pending_rows(cursor, firsts)
        chunk = replays.next_chunk(cursor, set_rows, [each.row.position for each in earlier])
    set_parked = {each.row.position for each in earlier + chunk if each.parked}
    parked: set[int] = set()

    def park(row: OutboxRow, reason: str) -> None:
        mark_parked(cursor, row.position, reason)
        parked.add(row.position)

    # An order's rows pending in a set go before its rows in the slot; the sets' next chunk after both.
    ordered = interleave_orders(
        [each.row for each in earlier if not each.parked]
        + [row for row in rows if row.position not in already_parked],
        _order_of,
    ) + interleave_orders([each.row for each in chunk if not each.parked], _order_of)
    outcome, out_of_time = _publish_within(
        ordered,
        publisher,
        poison_sink,
        max_event_bytes=max_event_bytes,
        seconds_left=seconds_left,
        invocation_seconds_left=invocation_seconds_left,
        slice_rows=slice_rows,
        on_parked=park,
    )
    published = {row.position for row, _ in outcome.published}
    if earlier or chunk:
        finished = published | parked | set_parked  # once, not per row
        drained = [each.row.position for each in earlier + chunk if each.row.position in finished]
        replays.mark_done(cursor, drained)  # in the transaction of their parked marks
        metrics.add_metric(name="ReplaySetRowsDrained", unit=MetricUnit.Count, value=len(drained))
    activated = replays.activated_among(cursor, [i for t in kept for i in t.replay_ids])
    now, after, activate = confirmation(kept, read_to_lsn, published | already_parked, parked, activated)
    replays.activate(cursor, activate)
    # More is ready when: the round ran out of time, the chunk was full, a transaction waits to be spilled,
    # or a set was activated (its rows go out from the next round on).
    outcome.backlog = out_of_time or len(chunk) >= set_rows or len(kept) < len(transactions) or bool(activate)
    return outcome, after, now
