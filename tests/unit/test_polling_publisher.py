"""The polling publisher against a real PostgreSQL (tests/support/postgres.py) and a recording bus.

The bus is the EventPublisher's own PutEvents client replaced by a thread-safe recorder (moto's is not
made for concurrent callers): what these tests check is the order in which events reach the bus, the
rows' publishing state, and what is parked, with several publishers running at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
import pytest

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.outbox import (
    _CLAIM_HEADS,
    OutboxRow,
    claim_pending,
    mark_published,
    reset_for_replay,
)
from shop.adapters.postgres.parked import unpark
from shop.domain.errors import ServiceBusy
from shop.runtime.outbox_publishing import PublishOutcome
from shop.runtime.polling_publisher import RESERVE_SECONDS, poll_outbox, publish_pending_round
from tests.support.postgres import connect, place_orders
from tests.support.publishing import (
    SETTINGS,
    ListSink,
    RecordingBus,
    SlowFailingSink,
    advance,
    assert_each_order_in_sequence,
    polling_round,
    publisher,
)


def run_round(
    database: Database, sink: ListSink | None = None, max_orders: int = 50
) -> PublishOutcome[OutboxRow]:
    return polling_round(database, sink, max_orders)


def pending_rows(settings: ConnectionSettings) -> list[tuple[str, int, int, str | None]]:
    with connect(settings) as connection:
        return connection.execute(
            "SELECT aggregate_id, sequence, attempts, last_error FROM outbox"
            " WHERE published_at IS NULL AND parked_at IS NULL ORDER BY aggregate_id, sequence"
        ).fetchall()


# --- several publishers at once ---------------------------------------------------------------------------
@pytest.mark.parametrize("publishers", [2, 4])
def test_publishers_running_at_once_keep_each_orders_sequence_on_the_bus(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, publishers: int
):
    """Orders keep changing while several publishers claim and publish; a third of the entries are
    throttled (some beyond the publisher's retries), so rounds stop part-way and others take over."""
    recording_bus.throttle_probability = 0.35
    orders = place_orders(database, 40)
    writers_done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(2):
                advance(database, orders)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            writers_done.set()

    def publish() -> None:
        own = Database(order_database)
        try:
            idle_rounds = 0
            while idle_rounds < 3:
                outcome = run_round(own, max_orders=7)
                idle_rounds = idle_rounds + 1 if writers_done.is_set() and not outcome.taken else 0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=write)] + [threading.Thread(target=publish) for _ in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    while pending_rows(order_database):  # what the last throttled rounds left
        run_round(database)

    assert_each_order_in_sequence(recording_bus, expected_events=40 * 3)
    assert sorted(recording_bus.sequences_by_order()[orders[0]]) == [1, 2, 3]
    assert len(recording_bus.accepted) == 40 * 3  # no crash: nothing was published twice


def test_an_event_written_while_another_publisher_holds_its_order_waits_for_that_publisher(
    order_database: ConnectionSettings, database: Database
):
    """The interleaving the concurrent run above may or may not hit, forced: publisher A holds an
    order's events, the order changes, and publisher B must neither take the new event nor wait."""
    (order_id,) = place_orders(database, 1)
    first, second = Database(order_database), Database(order_database)
    try:
        with first.transaction() as held:
            rows = claim_pending(held, max_orders=10)
            assert [row.sequence for row in rows] == [1]
            advance(database, [order_id])  # sequence 2 commits while A holds sequence 1
            with second.transaction() as other:
                other.execute("SET LOCAL lock_timeout = '1s'")  # waiting would be a failure too
                assert claim_pending(other, max_orders=10) == []
            mark_published(held, [rows[0].position])
        with second.transaction() as other:
            assert [row.sequence for row in claim_pending(other, max_orders=10)] == [2]
    finally:
        first.close()
        second.close()


class EarlierEventPendingAgain:
    """An order whose first event went out (published, or parked then fixed) and whose second is
    pending; `now()` makes the first pending again, as an operator's replay or redrive does."""

    def __init__(self, how: str, settings: ConnectionSettings, database: Database) -> None:
        self.how, self.settings, self.database = how, settings, database
        (self.order_id,) = place_orders(database, 1)
        if how == "replay":
            run_round(database)
        else:
            with connect(settings) as connection:
                found = connection.execute("SELECT envelope::text FROM outbox").fetchone()
            assert found is not None
            self.envelope = str(found[0])
            make_unreadable(settings, self.order_id, 1, "[]")
            assert len(run_round(database).parked) == 1
        advance(database, [self.order_id])  # sequence 2, pending

    def now(self) -> None:
        first = event_id_of(self.settings, self.order_id, 1)
        with self.database.transaction() as cursor:
            if self.how == "replay":
                assert reset_for_replay(cursor, event_ids=[first])[0].reset == [first]
            else:
                make_unreadable(self.settings, self.order_id, 1, self.envelope)  # fixed, then redriven
                cursor.execute("SELECT position FROM outbox WHERE event_id = %s", (first,))
                unpark(cursor, [position for (position,) in cursor.fetchall()])


class RunsBetweenStatements:
    """A cursor that runs `between` after its first statement: what commits between a claim's two."""

    def __init__(self, cursor: psycopg.Cursor[Any], between: Callable[[], None]) -> None:
        self.cursor, self.between = cursor, between
        self.statements = 0

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        self.cursor.execute(query, params)
        self.statements += 1
        if self.statements == 1:
            self.between()
        return self.cursor

    def fetchall(self) -> list[Any]:
        return self.cursor.fetchall()


@pytest.mark.parametrize("how", ["replay", "redrive"])
def test_an_earlier_event_made_pending_while_another_publisher_holds_the_order_is_left_without_waiting(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, how: str
):
    """Publisher A holds an order's sequence 2 (its round in PutEvents) when a replay or a redrive makes
    sequence 1 pending again: a new head, free. Publisher B claims it, and must leave the order out of
    its round, not wait for A's lock of sequence 2: that wait held B's whole round (up to 500 orders)
    until a statement timeout rolled it back, reported as the database unavailable. B's other orders go
    out; the order's sequence 1 goes in a round after A's."""
    order = EarlierEventPendingAgain(how, order_database, database)
    first, second = Database(order_database), Database(order_database)
    try:
        with first.transaction() as held:
            rows = claim_pending(held, max_orders=10)
            assert [(row.aggregate_id, row.sequence) for row in rows] == [(order.order_id, 2)]
            order.now()
            (other_order,) = place_orders(database, 1)
            with second.transaction() as other:
                other.execute("SET LOCAL lock_timeout = '1s'")  # waiting is the failure
                taken = claim_pending(other, max_orders=10)
                assert [(row.aggregate_id, row.sequence) for row in taken] == [(other_order, 1)]
            mark_published(held, [rows[0].position])
        with second.transaction() as other:  # A committed: the order is B's, as is the other one still
            taken = claim_pending(other, max_orders=10)
            assert {(row.aggregate_id, row.sequence) for row in taken} == {
                (order.order_id, 1),
                (other_order, 1),
            }
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("how", ["replay", "redrive"])
def test_two_publishers_each_holding_part_of_an_order_both_leave_it_and_neither_waits(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, how: str
):
    """The replay or redrive commits between publisher A's two statements: A has sequence 2 as the head,
    B then claims sequence 1 and A goes on to lock the order's pending events. Each holds what the
    other would lock next (waiting was a deadlock): both leave the order out, and later rounds publish
    it in sequence."""
    order = EarlierEventPendingAgain(how, order_database, database)
    published_before = recording_bus.sequences_by_order().get(order.order_id, [])
    first, second = Database(order_database), Database(order_database)
    taken_by_b: list[OutboxRow] = []
    try:
        with second.transaction() as other, first.transaction() as held:
            for cursor in (other, held):
                cursor.execute("SET LOCAL lock_timeout = '1s'")  # waiting is the failure

            def replay_then_publisher_b() -> None:
                order.now()
                taken_by_b.extend(claim_pending(other, max_orders=10))

            between = RunsBetweenStatements(held, replay_then_publisher_b)
            taken_by_a = claim_pending(cast(psycopg.Cursor[Any], between), max_orders=10)
            assert (taken_by_a, taken_by_b) == ([], [])
    finally:
        first.close()
        second.close()

    while run_round(database).taken:
        pass
    assert recording_bus.sequences_by_order()[order.order_id] == [*published_before, 1, 2]
    assert pending_rows(order_database) == []


def test_the_claim_looks_up_each_candidates_order_by_index_whatever_the_tables_statistics(
    order_database: ConnectionSettings, database: Database
):
    """An outbox filled faster than autovacuum analyzes it (the planner estimating one row) must not turn
    the head test into a scan of every pending entry per candidate: 1.0-1.3 s for a claim of 500 orders
    among 4,400 events, most of a round (docs/performance.md, "Relays at AWS latency")."""
    orders = place_orders(database, 60)
    advance(database, orders)
    with connect(order_database) as connection:
        # What a table never analyzed looks like to the planner (a fresh table, or one filled since).
        connection.execute("UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE relname = 'outbox'")
        connection.execute("SELECT pg_stat_reset_single_table_counters('outbox'::regclass)")
    with database.transaction() as cursor:
        cursor.execute("EXPLAIN " + _CLAIM_HEADS, (50,))
        plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "Index Cond: (aggregate_id = head.aggregate_id)" in plan, plan
        assert "Join Filter" not in plan, plan
        assert len(claim_pending(cursor, max_orders=50)) == 100  # 50 orders, both their events


def test_a_crash_between_put_events_and_commit_republishes_the_round_in_order(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    orders = place_orders(database, 12)
    advance(database, orders)
    recording_bus.crash_after_calls = 1

    with pytest.raises(RuntimeError, match="before COMMIT"):
        run_round(database)
    assert len(pending_rows(order_database)) == 24  # rolled back: every row still pending
    while pending_rows(order_database):
        run_round(database)

    assert_each_order_in_sequence(recording_bus, expected_events=24)
    assert len(recording_bus.accepted) > 24  # the crashed call's events reached the recording_bus twice


def test_a_full_claim_publishes_whole_calls_and_its_last_events_lead_the_next_round(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """A round that claimed as many orders as it may (more are pending) publishes whole PutEvents calls
    of ten; the short call's events, each its order's last in the round, stay pending and go out first
    in the next round. A claim that is not full publishes all it took."""
    orders = place_orders(database, 13)
    advance(database, orders)  # 26 events: every order's first, then every order's second

    first = run_round(database, max_orders=13)

    assert (first.taken, len(first.published), recording_bus.calls) == (20, 20, 2)
    held = [(order_id, sequence) for order_id, sequence, _, _ in pending_rows(order_database)]
    assert len(held) == 6
    assert {sequence for _, sequence in held} == {2}  # its orders' last events, left pending
    second = run_round(database, max_orders=13)  # six orders: not a full claim
    assert (second.taken, len(second.published), recording_bus.calls) == (6, 6, 3)
    assert_each_order_in_sequence(recording_bus, expected_events=26)


# --- failures ---------------------------------------------------------------------------------------------
def test_a_throttled_event_stops_the_round_there_with_its_attempt_recorded(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    first, second = place_orders(database, 2)
    advance(database, [first, second])
    recording_bus.throttle_always = {event_id_of(order_database, first, 1)}

    outcome = run_round(database)

    # The first call held both orders' first events: the other order's went out, then nothing more
    # (publishing stops at the first failure that remains, as the stream relay checkpoints there).
    assert recording_bus.sequences_by_order() == {second: [1]}
    assert outcome.parked == []
    assert outcome.left_pending == 3
    pending = pending_rows(order_database)
    assert [(order_id, sequence) for order_id, sequence, _, _ in pending] == sorted(
        [(first, 1), (first, 2), (second, 2)]
    )
    attempts = {(order_id, sequence): (tries, error) for order_id, sequence, tries, error in pending}
    assert attempts[(first, 1)] == (1, "ThrottlingException x6")
    assert attempts[(first, 2)] == (0, None)  # never sent
    assert attempts[(second, 2)] == (0, None)

    recording_bus.throttle_always = set()
    run_round(database)
    assert recording_bus.sequences_by_order() == {second: [1, 2], first: [1, 2]}


def test_a_round_with_too_little_time_left_for_a_call_leaves_its_events_pending_and_unattempted(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """8.5 s left; a PutEvents call over the AWS Common Runtime (as the template configures the publisher)
    may take 8 s, and the answer a second: no call is begun, and nothing failed (no attempt or error
    recorded): the next invocation publishes them."""
    place_orders(database, 2)
    over_crt = EventPublisher("orders-bus", SETTINGS.max_event_bytes, max_in_flight=32, transport="crt")

    outcome = publish_pending_round(
        database,
        over_crt,
        ListSink(),
        max_event_bytes=SETTINGS.max_event_bytes,
        remaining_seconds=lambda: 8.5,
    )

    assert (outcome.taken, outcome.left_pending, outcome.out_of_time) == (2, 2, True)
    assert recording_bus.calls == 0
    assert [(tries, error) for _, _, tries, error in pending_rows(order_database)] == [(0, None), (0, None)]


def event_id_of(settings: ConnectionSettings, order_id: str, sequence: int) -> str:
    with connect(settings) as connection:
        found = connection.execute(
            "SELECT event_id FROM outbox WHERE aggregate_id = %s AND sequence = %s", (order_id, sequence)
        ).fetchone()
    assert found is not None
    return str(found[0])


def make_unreadable(settings: ConnectionSettings, order_id: str, sequence: int, envelope: str) -> None:
    with connect(settings) as connection:
        connection.execute(
            "UPDATE outbox SET envelope = %s WHERE aggregate_id = %s AND sequence = %s",
            (envelope, order_id, sequence),
        )


def test_a_poison_row_is_parked_whole_and_its_orders_later_events_go_out(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    (order_id,) = place_orders(database, 1)
    advance(database, [order_id])
    make_unreadable(order_database, order_id, 1, '{"not": "a cloudevent"}')
    sink = ListSink()

    outcome = run_round(database, sink)

    assert [(record.image["aggregateId"], record.image["sequence"]) for record in sink.parked] == [
        (order_id, 1)
    ]
    assert sink.parked[0].image["envelope"] == '{"not": "a cloudevent"}'
    assert sink.parked[0].image["store"] == "postgres"
    assert len(outcome.parked) == 1
    assert recording_bus.sequences_by_order() == {order_id: [2]}
    assert pending_rows(order_database) == []


def parked_rows(settings: ConnectionSettings) -> list[tuple[str, int]]:
    with connect(settings) as connection:
        return connection.execute(
            "SELECT aggregate_id, sequence FROM outbox WHERE parked_at IS NOT NULL ORDER BY position"
        ).fetchall()


def test_a_parked_rows_order_keeps_publishing_its_later_events_in_later_rounds(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """The order's later events are written after the round that parked its first: each of them becomes
    the order's head in its own later round (a parked row, like a published one, no longer holds its
    order back), and none waits behind the parked row."""
    (order_id,) = place_orders(database, 1)
    make_unreadable(order_database, order_id, 1, '{"not": "a cloudevent"}')
    sink = ListSink()
    assert len(run_round(database, sink).parked) == 1

    advance(database, [order_id])  # sequence 2, written after the round that parked sequence 1
    second = run_round(database, sink)
    advance(database, [order_id])  # sequence 3, a round later still
    third = run_round(database, sink)

    assert [len(round_.published) for round_ in (second, third)] == [1, 1]
    assert recording_bus.sequences_by_order() == {order_id: [2, 3]}
    assert pending_rows(order_database) == []
    assert parked_rows(order_database) == [(order_id, 1)]


def test_a_parked_row_is_never_claimed_again_nor_takes_another_orders_place(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """Rounds after the one that parked a row: the row is not read, published or parked again, neither
    alone (as its order's head) nor with its order's later events; and with one order a round it takes
    no round's place from an order with events pending."""
    (poisoned,) = place_orders(database, 1)
    make_unreadable(order_database, poisoned, 1, "[]")
    sink = ListSink()
    assert len(run_round(database, sink, max_orders=1).parked) == 1
    (healthy,) = place_orders(database, 1)
    advance(database, [poisoned])  # the parked row's order moves on: sequence 2, pending

    rounds = []
    while (outcome := run_round(database, sink, max_orders=1)).taken:
        rounds.append(outcome)
        assert len(rounds) <= 2, "more rounds than pending orders"

    # One order a round, oldest head first: the healthy order's event, then the parked row's successor.
    assert [[(row.aggregate_id, row.sequence) for row, _ in outcome.published] for outcome in rounds] == [
        [(healthy, 1)],
        [(poisoned, 2)],
    ]
    assert recording_bus.sequences_by_order() == {healthy: [1], poisoned: [2]}
    assert [record.image["sequence"] for record in sink.parked] == [1]  # parked once, in the first round
    assert pending_rows(order_database) == []
    assert run_round(database, sink).taken == 0  # nothing is left to claim, the parked row included


def test_when_the_poison_queue_fails_the_poison_row_and_its_orders_later_events_stay_pending(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    poisoned, healthy = place_orders(database, 2)
    advance(database, [poisoned, healthy])
    make_unreadable(order_database, poisoned, 1, "[]")

    outcome = run_round(database, ListSink(fail=True))

    assert outcome.parked == []
    assert recording_bus.sequences_by_order() == {healthy: [1, 2]}
    assert [(order_id, sequence) for order_id, sequence, _, _ in pending_rows(order_database)] == [
        (poisoned, 1),
        (poisoned, 2),
    ]


def test_a_row_parked_in_a_round_that_then_rolled_back_is_not_parked_again(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """The round's connection is dropped after PutEvents, before its COMMIT (the round rolls back): the
    poison row it parked keeps its parked mark, so the next round publishes the healthy orders again
    (consumers drop them by event id) and parks nothing."""
    (poisoned,) = place_orders(database, 1)
    healthy = place_orders(database, 2)
    make_unreadable(order_database, poisoned, 1, "[]")
    sink = ListSink()
    put_events = recording_bus.put_events

    def put_events_then_lose_the_connection(Entries: list[dict[str, Any]]) -> dict[str, Any]:
        answer = put_events(Entries)
        with connect(order_database) as admin:
            admin.execute(  # the round's, idle in its transaction while PutEvents runs
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE state = 'idle in transaction' AND pid <> pg_backend_pid()"
            )
        return answer

    recording_bus.put_events = put_events_then_lose_the_connection  # type: ignore[method-assign]
    with pytest.raises(ServiceBusy):
        run_round(database, sink)
    recording_bus.put_events = put_events  # type: ignore[method-assign]

    second = run_round(database, sink)

    assert [record.image["aggregateId"] for record in sink.parked] == [poisoned]  # once
    assert (second.parked, len(second.published)) == ([], 2)
    assert recording_bus.sequences_by_order() == {order_id: [1, 1] for order_id in healthy}
    assert parked_rows(order_database) == [(poisoned, 1)]
    assert pending_rows(order_database) == []


def test_a_poison_queue_failing_slowly_costs_a_round_one_call_and_every_healthy_order_goes_out(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """Each park takes the SQS client's worst case (24 s), then fails: the round makes one call, holds
    back its other poison orders without calling again, and publishes every healthy order; the poison
    rows wait, not counted as failed attempts."""
    poisoned = place_orders(database, 3)
    healthy = place_orders(database, 20)
    for order_id in poisoned:
        make_unreadable(order_database, order_id, 1, "[]")
    clock = [0.0]
    sink = SlowFailingSink(clock)

    outcome = publish_pending_round(
        database,
        publisher(),
        sink,
        max_event_bytes=SETTINGS.max_event_bytes,
        remaining_seconds=lambda: 70.0 - clock[0],
    )

    assert sink.calls == 1
    assert recording_bus.sequences_by_order() == {order_id: [1] for order_id in healthy}
    assert (outcome.parked, outcome.left_pending) == ([], 3)
    assert sorted(pending_rows(order_database)) == sorted((order_id, 1, 0, None) for order_id in poisoned)


def test_a_park_that_could_outlast_the_invocation_is_not_begun_and_its_order_waits(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """20 s left: more than a PutEvents call's worst case (the loop's reserve), less than a SendMessage
    call's (24 s) and the answer's second. The park is not begun; the healthy order goes out."""
    poisoned, healthy = place_orders(database, 2)
    make_unreadable(order_database, poisoned, 1, "[]")
    sink = ListSink()

    outcome = publish_pending_round(
        database, publisher(), sink, max_event_bytes=SETTINGS.max_event_bytes, remaining_seconds=lambda: 20.0
    )

    assert sink.parked == []
    assert recording_bus.sequences_by_order() == {healthy: [1]}
    assert (outcome.out_of_time, outcome.left_pending) == (False, 1)
    assert pending_rows(order_database) == [(poisoned, 1, 0, None)]


@pytest.mark.parametrize("poison_rows", [1, 3])
def test_an_invocation_with_the_poison_queue_failing_slowly_ends_in_its_time_and_publishes_every_order(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, poison_rows: int
):
    """A 70 s invocation, each park 24 s then failing: no park is begun that the invocation could not
    wait for, and the orders written before and during it are all published."""
    poisoned = place_orders(database, poison_rows)
    healthy = place_orders(database, 20)
    for order_id in poisoned:
        make_unreadable(order_database, order_id, 1, "[]")
    clock = [0.0]
    sink = SlowFailingSink(clock)

    def seconds_left() -> float:
        return 70.0 - clock[0]

    def run_round() -> PublishOutcome[OutboxRow]:
        return publish_pending_round(
            database,
            publisher(),
            sink,
            max_event_bytes=SETTINGS.max_event_bytes,
            remaining_seconds=seconds_left,
        )

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if clock[0] > 30 and len(healthy) == 20:
            healthy.extend(place_orders(database, 5))  # written while the invocation runs

    totals = poll_outbox(run_round, seconds_left, sleep=sleep)

    assert clock[0] <= 70.0 - 1.0  # the answer's second kept
    assert sink.calls == 2  # at 0 s and 25 s; at 50 s too little was left
    assert recording_bus.sequences_by_order() == {order_id: [1] for order_id in healthy}
    assert (totals.published, totals.parked) == (25, 0)
    assert sorted(pending_rows(order_database)) == sorted((order_id, 1, 0, None) for order_id in poisoned)


def test_an_entry_the_bus_rejects_is_parked_and_its_order_moves_on(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    (order_id,) = place_orders(database, 1)
    advance(database, [order_id])
    rejected = event_id_of(order_database, order_id, 1)
    recording_bus.reject = {rejected}
    sink = ListSink()

    run_round(database, sink)

    assert [record.event_id for record in sink.parked] == [rejected]
    assert "InvalidArgument" in sink.parked[0].reason
    assert recording_bus.sequences_by_order() == {order_id: [2]}
    with connect(order_database) as connection:
        parked = connection.execute("SELECT event_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()
    assert parked == [(rejected,)]


# --- the polling loop -------------------------------------------------------------------------------------
def test_the_loop_polls_until_the_invocations_last_seconds_and_rides_out_a_database_outage():
    clock = iter([30.0, 20.0, 10.0, RESERVE_SECONDS + 0.5, RESERVE_SECONDS])
    pauses: list[float] = []
    rounds: Iterator[PublishOutcome[OutboxRow] | ServiceBusy] = iter(
        [ServiceBusy("down"), PublishOutcome[OutboxRow](taken=3), PublishOutcome[OutboxRow]()]
    )

    def next_round() -> PublishOutcome[OutboxRow]:
        outcome = next(rounds, PublishOutcome[OutboxRow]())
        if isinstance(outcome, ServiceBusy):
            raise outcome
        return outcome

    totals = poll_outbox(next_round, lambda: next(clock), sleep=pauses.append)

    assert totals.database_unavailable == 1
    assert totals.rounds == 3
    assert pauses[0] == 1.0  # after the outage
    assert pauses[1] == 1.0  # claimed 3, published none: the bus is failing, pause
    assert pauses[2:] == [0.2, 0.2]  # idle


def test_the_loop_ends_after_a_round_that_had_too_little_time_left_for_a_call():
    """RESERVE_SECONDS covers a call begun as a round starts; a round that took long may still leave its
    events for lack of time: the invocation ends there, rather than claim them again and again."""
    rounds = iter([PublishOutcome[OutboxRow](taken=3, out_of_time=True)])
    pauses: list[float] = []

    totals = poll_outbox(lambda: next(rounds), lambda: 30.0, sleep=pauses.append)

    assert (totals.rounds, pauses) == (1, [])


def test_an_unreachable_database_is_service_busy(tmp_path, recording_bus: RecordingBus):
    unreachable = Database(ConnectionSettings(str(tmp_path), 5432, "postgres", "postgres", lambda _: None))

    with pytest.raises(ServiceBusy):
        run_round(unreachable)
