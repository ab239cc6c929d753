"""The logical relay (PostgresRelay=logical) against a real PostgreSQL with wal_level=logical: what reaches
the bus, in which order, and where the slot stands after each kind of crash (tests/support/publishing.py
records PutEvents)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from shop.adapters.postgres import replication
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.outbox import OutboxRow, insert_outbox_row
from shop.adapters.postgres.pgoutput import parse_lsn
from shop.domain.envelope import CloudEvent
from shop.domain.errors import ServiceBusy
from shop.domain.poison import PoisonSink
from shop.runtime import logical_relay
from shop.runtime.logical_relay import relay_slot_round
from shop.runtime.outbox_publishing import PublishOutcome
from tests.support.postgres import connect, place_orders, use_logical_relay, use_polling_relay
from tests.support.publishing import (
    SETTINGS,
    ListSink,
    RecordingBus,
    SlowFailingSink,
    advance,
    assert_each_order_in_sequence,
    logical_round,
    publisher,
)

SLOT = replication.slot_name("relay_tests")


@pytest.fixture
def slot(order_database: ConnectionSettings) -> Iterator[str]:
    """The outbox publication and a fresh slot on the emptied database, the outbox the logical relay's;
    the slot dropped and the outbox the polling publisher's again after the test."""
    use_logical_relay(order_database, SLOT)
    yield SLOT
    use_polling_relay(order_database, SLOT)


def relay_round(
    database: Database, sink: ListSink | None = None, max_changes: int = 500
) -> PublishOutcome[OutboxRow]:
    return logical_round(database, SLOT, sink, max_changes)


def drain(database: Database, sink: ListSink | None = None, max_changes: int = 500) -> int:
    """Rounds until one reads nothing and says nothing more is ready; how many rounds read something."""
    rounds = 0
    while (outcome := relay_round(database, sink, max_changes)).taken or outcome.backlog:
        rounds += 1 if outcome.taken else 0
    return rounds


def confirmed_lsn(settings: ConnectionSettings) -> int:
    with connect(settings) as connection:
        found = connection.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    assert found is not None
    return parse_lsn(found[0])


def pending_in_slot(settings: ConnectionSettings) -> int:
    """Outbox rows the slot would still deliver."""
    with connect(settings) as connection, connection.cursor() as cursor:
        return sum(len(t.rows) for t in replication.peek_changes(cursor, SLOT, 100_000).transactions)


def event(order_id: str, sequence: int) -> CloudEvent:
    return CloudEvent.new(
        source="shop.orders",
        type="OrderNoted",
        subject=order_id,
        sequence=sequence,
        data={"orderId": order_id},
        correlation_id="corr",
    )


def write_events(connection: psycopg.Connection, events: list[CloudEvent]) -> None:
    with connection.cursor() as cursor:
        for each in events:
            insert_outbox_row(cursor, each, max_event_bytes=SETTINGS.max_event_bytes, trace_header=None)


def write_raw_row(connection: psycopg.Connection, event_id: str, order_id: str, envelope: str) -> None:
    """An outbox row written as is, bypassing the writer's checks (poison), in its own transaction."""
    connection.execute(
        "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
        " VALUES (%s, %s, 1, 'OrderNoted', %s)",
        (event_id, order_id, envelope),
    )


@contextmanager
def crash_after_the_advance(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside the block, the relay dies (RuntimeError) after advancing the slot, before its COMMIT: the
    advance is not transactional, so the slot has moved and the round's transaction rolls back."""
    real_advance = replication.advance_slot

    def advance_then_crash(*args: Any) -> bool:
        real_advance(*args)
        raise RuntimeError("the relay crashed after the slot advance, before COMMIT")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "advance_slot", advance_then_crash)
        yield


def write_poison_then_event(
    settings: ConnectionSettings, poison_id: str, envelope: str, order_id: str
) -> None:
    """A poison row of order-p, then `order_id`'s first event in a transaction of its own after it."""
    with connect(settings) as connection:
        write_raw_row(connection, poison_id, "order-p", envelope)
        with connection.transaction():
            write_events(connection, [event(order_id, 1)])


def parked_event_ids(settings: ConnectionSettings) -> list[tuple[Any, ...]]:
    """The outbox rows marked parked, as (event_id,) rows."""
    with connect(settings) as connection:
        return connection.execute("SELECT event_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()


def test_every_committed_event_reaches_the_bus_once_in_sequence_and_the_slot_moves_past_it(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    orders = place_orders(database, 12)
    advance(database, orders)
    advance(database, orders)  # 36 events, 3 per order

    assert drain(database, max_changes=20) > 1  # a change limit below the backlog: several rounds

    assert_each_order_in_sequence(recording_bus, 36)
    assert len(recording_bus.accepted) == 36  # nothing twice without a failure
    assert pending_in_slot(order_database) == 0
    assert drain(database) == 0  # a later round reads nothing more


def test_a_rolled_back_transaction_publishes_nothing(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    def write_then_fail(connection: psycopg.Connection) -> None:
        with connection.transaction():
            write_events(connection, [event("order-rolled-back", 1)])
            raise RuntimeError("the writer's transaction fails after its outbox insert")

    with connect(order_database) as connection:
        with pytest.raises(RuntimeError):
            write_then_fail(connection)
        with connection.transaction():
            write_events(connection, [event("order-kept", 1)])

    drain(database)

    assert recording_bus.sequences_by_order() == {"order-kept": [1]}


def test_transactions_reach_the_bus_in_commit_order_each_whole(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """The first transaction to start commits last: its events follow the other's on the bus, and all
    of one transaction's events go out together."""
    with connect(order_database) as first, connect(order_database) as second, first.transaction():
        write_events(first, [event("order-a", 1), event("order-b", 1)])
        with second.transaction():
            write_events(second, [event("order-c", 1)])
        write_events(first, [event("order-a", 2)])

    drain(database)

    order_of_arrival = [order_id for order_id, _, _ in recording_bus.accepted]
    assert order_of_arrival[0] == "order-c"
    assert sorted((o, s) for o, s, _ in recording_bus.accepted) == [
        ("order-a", 1),
        ("order-a", 2),
        ("order-b", 1),
        ("order-c", 1),
    ]
    assert_each_order_in_sequence(recording_bus, 4)


def test_a_transaction_with_an_event_not_on_the_bus_holds_the_slot_before_it(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """All or nothing per transaction: one of its events throttled past the retries keeps the slot before
    the whole transaction; the next round publishes all of it again, the throttled event included."""
    with connect(order_database) as connection:
        with connection.transaction():
            write_events(connection, [event("order-early", 1)])
        before = confirmed_lsn(order_database)
        with connection.transaction():
            write_events(connection, [event("order-x", 1), event("order-y", 1)])
    recording_bus.throttle_always = {event("order-y", 1).id}

    outcome = relay_round(database)

    assert outcome.left_pending == 1
    assert ("order-x", 1) in [(o, s) for o, s, _ in recording_bus.accepted]
    moved_to = confirmed_lsn(order_database)
    assert moved_to > before  # past the first transaction, whose event is on the bus
    assert pending_in_slot(order_database) == 2  # the second, whole
    recording_bus.throttle_always = set()

    drain(database)

    assert sorted((o, s) for o, s, _ in recording_bus.accepted) == [
        ("order-early", 1),
        ("order-x", 1),
        ("order-x", 1),
        ("order-y", 1),
    ]
    assert pending_in_slot(order_database) == 0


def test_a_crash_before_put_events_leaves_the_slot_where_it_was(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    orders = place_orders(database, 5)
    before = confirmed_lsn(order_database)

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the relay crashed after reading the slot, before PutEvents")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "publish_and_park", crash)
        with pytest.raises(RuntimeError):
            relay_round(database)

    assert confirmed_lsn(order_database) == before
    assert recording_bus.accepted == []
    drain(database)
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)


def test_a_crash_after_put_events_before_the_advance_publishes_the_round_again_in_order(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    orders = place_orders(database, 15)
    advance(database, orders)  # 30 events: several PutEvents calls
    before = confirmed_lsn(order_database)
    recording_bus.crash_after_calls = 1  # the second call reaches the bus, then the relay dies

    with pytest.raises(RuntimeError):
        relay_round(database)

    assert confirmed_lsn(order_database) == before
    published_before_crash = len(recording_bus.accepted)
    assert 0 < published_before_crash < 30
    drain(database)
    assert len(recording_bus.accepted) == 30 + published_before_crash  # the round's events again
    assert_each_order_in_sequence(recording_bus, 30)


def test_a_crash_after_the_advance_loses_nothing_and_repeats_nothing(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    orders = place_orders(database, 8)

    with crash_after_the_advance(monkeypatch), pytest.raises(RuntimeError):
        relay_round(database)

    assert pending_in_slot(order_database) == 0
    assert drain(database) == 0
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)  # each once


def test_a_poison_row_is_parked_whole_and_the_slot_moves_past_it(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    write_poison_then_event(order_database, "poison-1", '{"not": "a cloudevent"}', "order-q")
    sink = ListSink()

    drain(database, sink)

    assert [record.image["eventId"] for record in sink.parked] == ["poison-1"]
    assert sink.parked[0].image["envelope"] == '{"not": "a cloudevent"}'
    assert recording_bus.sequences_by_order() == {"order-q": [1]}
    assert pending_in_slot(order_database) == 0
    assert parked_event_ids(order_database) == [("poison-1",)]


def test_when_the_poison_queue_fails_the_slot_stays_before_the_poison_row(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    with connect(order_database) as connection:
        write_raw_row(connection, "poison-2", "order-p", "[]")

    outcome = relay_round(database, ListSink(fail=True))

    assert outcome.left_pending == 1
    assert pending_in_slot(order_database) == 1
    sink = ListSink()
    drain(database, sink)
    assert [record.image["eventId"] for record in sink.parked] == ["poison-2"]


def test_a_poison_queue_failing_slowly_costs_a_round_one_call_and_no_park_outlasts_the_invocation(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """Each park takes the SQS client's worst case (24 s), then fails: a round makes one call, holds back
    its other poison orders without calling again, and publishes the healthy orders (the slot stays
    before the first poison row); a round with too little of the invocation left for the call begins
    none."""
    with connect(order_database) as connection:
        for number in range(3):
            write_raw_row(connection, f"poison-slow-{number}", f"order-p{number}", "[]")
        for number in range(5):
            with connection.transaction():
                write_events(connection, [event(f"order-h{number}", 1)])
    clock = [0.0]
    sink = SlowFailingSink(clock)

    first = relay_slot_round(**round_options(database, sink), remaining_seconds=lambda: 70.0 - clock[0])
    late = relay_slot_round(**round_options(database, sink), remaining_seconds=lambda: 20.0)

    assert sink.calls == 1
    assert clock[0] == 24.0
    assert (first.parked, first.left_pending, late.parked, late.left_pending) == ([], 3, [], 3)
    # Both rounds published them: the slot stays before the poison rows, so the second read them again.
    assert recording_bus.sequences_by_order() == {f"order-h{number}": [1, 1] for number in range(5)}
    assert pending_in_slot(order_database) == 8
    drain(database, ListSink())
    assert len(parked_event_ids(order_database)) == 3


def test_one_relay_reads_the_slot_at_a_time(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    place_orders(database, 3)
    with connect(order_database) as other, other.transaction(), other.cursor() as cursor:
        assert replication.try_lock_slot(cursor, SLOT)  # another relay's round in progress

        assert relay_round(database).taken == 0

    assert relay_round(database).taken == 3


@pytest.mark.parametrize(
    ("held_seconds", "wait_seconds", "answer"),
    [(0.7, 1.0, "an age"), (2.0, 0.5, "None")],
    ids=["round-ends-within-the-wait", "round-outlasts-the-wait"],
)
def test_maintenance_waits_for_a_relay_round_as_long_as_it_says_not_as_long_as_the_statement_timeout(
    order_database: ConnectionSettings, database: Database, slot: str, held_seconds, wait_seconds, answer
):
    """The lock wait (10 s in maintenance) is longer than the session's statement timeout (5 s): the
    timeout cancelled the wait first (QueryCanceled, so ServiceBusy), and the maintenance run failed
    without its health metrics while the relay was busiest. Here the statement timeout is 0.3 s."""
    place_orders(database, 1)
    taken, release = threading.Event(), threading.Event()

    def round_in_progress() -> None:
        with connect(order_database) as other, other.transaction(), other.cursor() as cursor:
            assert replication.try_lock_slot(cursor, SLOT)
            taken.set()
            release.wait(held_seconds)

    holder = threading.Thread(target=round_in_progress)
    holder.start()
    try:
        assert taken.wait(5)
        with database.transaction() as cursor:
            cursor.execute("SET LOCAL statement_timeout = 300")
            age = replication.oldest_undelivered_seconds(cursor, SLOT, wait_seconds)
    finally:
        release.set()
        holder.join()

    assert ("None" if age is None else "an age") == answer
    if age is not None:
        assert age >= 0


def test_writes_without_outbox_rows_do_not_hold_wal_in_the_slot(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """An idle outbox beside a busy database: the slot follows the log, so it keeps no WAL for writes
    that hold no event (pgoutput sends nothing for them)."""
    with connect(order_database) as connection:
        connection.execute(
            "INSERT INTO inbox (consumer, event_id) SELECT 'c', g::text FROM generate_series(1, 2000) g"
        )
        behind = replication.slot_health(connection.cursor(), SLOT).lag_bytes
    assert behind > 100_000

    relay_round(database)

    with connect(order_database) as connection:
        assert replication.slot_health(connection.cursor(), SLOT).lag_bytes < behind // 10


@pytest.mark.parametrize("poison_first", [True, False], ids=["poison-first", "poison-after-an-event"])
def test_a_crash_after_an_advance_never_leaves_the_slot_past_a_poison_row_not_marked_parked(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
    poison_first: bool,
):
    """The parked mark is written in the round's transaction and the advance is not transactional: a
    crash between an advance and its COMMIT must not leave the slot past a poison row whose mark rolled
    back (in the poison queue, never marked parked). The slot passes a row parked in a round only once
    the mark is committed; a crash before that parks the row again (a second poison message, as after a
    crash after PutEvents), a crash after it parks nothing twice."""

    def write_poison(connection: psycopg.Connection) -> None:
        write_raw_row(connection, "poison-3", "order-p", '{"not": "a cloudevent"}')

    with connect(order_database) as connection:
        if poison_first:
            write_poison(connection)
        with connection.transaction():
            write_events(connection, [event("order-q", 1)])
        if not poison_first:
            write_poison(connection)
    sink = ListSink()

    with crash_after_the_advance(monkeypatch), pytest.raises(RuntimeError):
        relay_round(database, sink)
    drain(database, sink)

    assert parked_event_ids(order_database) == [("poison-3",)]
    assert pending_in_slot(order_database) == 0
    # Poison first: the round's only advance came after the mark's COMMIT. After an event: the round
    # advanced past the event only, crashed, and the next round parked the poison again.
    assert [record.image["eventId"] for record in sink.parked] == ["poison-3"] * (1 if poison_first else 2)
    assert recording_bus.sequences_by_order() == {"order-q": [1]}


def test_a_round_that_parks_a_row_moves_the_slot_past_it_once_the_mark_is_committed(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    write_poison_then_event(order_database, "poison-4", "[]", "order-r")
    sink = ListSink()

    relay_round(database, sink)

    assert pending_in_slot(order_database) == 0  # one round: no row read again, nothing parked twice
    assert [record.image["eventId"] for record in sink.parked] == ["poison-4"]
    assert recording_bus.sequences_by_order() == {"order-r": [1]}


def write_in_own_transaction(settings: ConnectionSettings, *events: CloudEvent) -> None:
    with connect(settings) as connection, connection.transaction():
        write_events(connection, list(events))


def published_in(outcome: PublishOutcome[OutboxRow]) -> list[tuple[str, int]]:
    return [(row.aggregate_id, row.sequence) for row, _ in outcome.published]


def test_a_parked_rows_order_keeps_publishing_its_later_events_in_this_round_and_later_ones(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A parked row never holds its order back: the order's next event in the same round goes out with
    it, and the events the order gets after that round go out in the rounds that read them."""
    with connect(order_database) as connection:
        write_raw_row(connection, "poison-6", "order-p", '{"not": "a cloudevent"}')  # order-p's sequence 1
    write_in_own_transaction(order_database, event("order-p", 2))
    sink = ListSink()

    rounds = [relay_round(database, sink)]
    for sequence in (3, 4):
        write_in_own_transaction(order_database, event("order-p", sequence))
        rounds.append(relay_round(database, sink))

    assert [published_in(outcome) for outcome in rounds] == [
        [("order-p", 2)],
        [("order-p", 3)],
        [("order-p", 4)],
    ]
    assert [record.image["eventId"] for record in sink.parked] == ["poison-6"]
    assert recording_bus.sequences_by_order() == {"order-p": [2, 3, 4]}
    assert pending_in_slot(order_database) == 0


def test_a_row_read_again_after_its_parked_mark_committed_is_not_parked_or_published_again(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """The database goes away between the round's COMMIT (the parked mark) and the advance past the row:
    the next round reads the row again, as parked: it is neither parked nor published again, the round
    publishes its order's later event, and the slot moves past both."""
    with connect(order_database) as connection:
        write_raw_row(connection, "poison-7", "order-p", "[]")
    sink = ListSink()

    def database_gone(*args: Any) -> bool:
        raise ServiceBusy("the order database is unavailable; retry shortly")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "advance_slot", database_gone)
        assert len(relay_round(database, sink).parked) == 1
    assert pending_in_slot(order_database) == 1  # read again next round: the slot is before the row
    write_in_own_transaction(order_database, event("order-p", 2))

    again = relay_round(database, sink)

    assert (again.parked, published_in(again)) == ([], [("order-p", 2)])
    assert [record.image["eventId"] for record in sink.parked] == ["poison-7"]  # parked once
    assert pending_in_slot(order_database) == 0  # past the parked row and the event
    assert relay_round(database, sink).taken == 0
    assert recording_bus.sequences_by_order() == {"order-p": [2]}
    assert parked_event_ids(order_database) == [("poison-7",)]


# --- rounds bounded whatever a transaction or a replay holds --------------------------------------------
def write_orders(
    settings: ConnectionSettings, count: int, sequence: int = 1, per_transaction: int = 50
) -> None:
    """Event `sequence` of orders o-0000.. (count of them), a transaction per `per_transaction` events."""
    with connect(settings) as connection:
        for start in range(0, count, per_transaction):
            with connection.transaction():
                write_events(
                    connection,
                    [
                        event(f"o-{n:04d}", sequence)
                        for n in range(start, min(start + per_transaction, count))
                    ],
                )


def replay_everything(database: Database) -> int:
    """`python -m operations replay` of every event (the maintenance function's code), not waiting: the id
    of the replay set it wrote."""
    from datetime import UTC, datetime, timedelta

    from shop.runtime.config import Settings
    from shop.runtime.order_store_replay import replay_order_store

    window = {
        "from": (datetime.now(UTC) - timedelta(days=1)).isoformat(),
        "to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
    }
    report = replay_order_store(
        database, Settings.from_env({"POSTGRES_RELAY": "logical"}), window, lambda: 0.0
    )
    assert report.selection.reset
    assert not report.complete
    with database.transaction() as cursor:
        cursor.execute("SELECT coalesce(max(replay_id), 0) FROM outbox_replay")
        found = cursor.fetchone()
    assert found is not None
    return int(found[0])


def set_progress(database: Database, replay_id: int) -> Any:
    from shop.adapters.postgres import replays

    with database.transaction() as cursor:
        return replays.progress(cursor, replay_id)


def test_a_replay_larger_than_a_round_goes_out_across_rounds_while_later_events_keep_flowing(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A replay is a set the relay drains a bounded chunk a round (progress committed each round); its
    message only activates it, so the slot moves past it at once and events written after the replay go
    out in the next round, not after the whole replay. Each order's events stay in sequence."""
    write_orders(order_database, 30)
    drain(database)
    assert len(recording_bus.accepted) == 30
    replay_id = replay_everything(database)
    write_orders(order_database, 5, sequence=2)  # after the replay: in the slot behind its message
    recording_bus.accepted.clear()

    rounds: list[PublishOutcome[OutboxRow]] = []
    while (outcome := relay_slot_round(**round_options(database), set_rows=8)).taken or outcome.backlog:
        rounds.append(outcome)
        assert len(rounds) < 20

    published = [[(row.aggregate_id, row.sequence) for row, _ in outcome.published] for outcome in rounds]
    later = [(f"o-{n:04d}", 2) for n in range(5)]
    first_with_later = next(index for index, each in enumerate(published) if set(later) & set(each))
    assert set(later) <= set(published[first_with_later])  # all of them in one round...
    assert first_with_later <= 1  # ...the first that published anything: not after the replay's 30
    assert all(len(each) <= 8 + 2 * 5 for each in published)  # a chunk of the set, plus the slot's round
    assert sum(len(each) for each in published) == 35  # the 30 replayed once each, the 5 later ones
    assert len(rounds) >= 30 // 8
    assert pending_in_slot(order_database) == 0
    assert set_progress(database, replay_id).pending_event_ids == []
    assert set_progress(database, replay_id).finished
    assert_each_order_in_sequence(recording_bus, 35)


def round_options(database: Database, sink: PoisonSink | None = None) -> dict[str, Any]:
    return {
        "database": database,
        "publisher": publisher(),
        "poison_sink": sink if sink is not None else ListSink(),
        "slot": SLOT,
        "max_event_bytes": SETTINGS.max_event_bytes,
    }


def test_a_replay_longer_than_an_invocation_completes_and_the_slot_moves_on(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """The livelock of one indivisible replay message: every invocation dies (here: after 25 PutEvents
    calls, its time) before it has published the whole replay (300 events: 30 calls), so the next reads
    the same message again, and events written after it are never published. Drained a bounded chunk a
    round, each round's progress committed, the replay completes in a few invocations and the events
    written after it go out."""
    write_orders(order_database, 300)
    drain(database)
    replay_id = replay_everything(database)
    write_orders(order_database, 3, sequence=2)
    recording_bus.accepted.clear()

    invocations = 0
    while invocations < 8:
        invocations += 1
        recording_bus.crash_after_calls = recording_bus.calls + 25  # the invocation's time runs out there
        try:
            while (outcome := relay_slot_round(**round_options(database))).taken or outcome.backlog:
                pass
        except RuntimeError:
            continue  # died mid-round: the next invocation starts from what the earlier rounds committed
        break

    assert invocations <= 3
    replayed = {event_id for _, sequence, event_id in recording_bus.accepted if sequence == 1}
    assert len(replayed) == 300
    assert sorted((o, s) for o, s, _ in recording_bus.accepted if s == 2) == [
        (f"o-{n:04d}", 2) for n in range(3)
    ]
    assert set_progress(database, replay_id).pending_event_ids == []
    assert pending_in_slot(order_database) == 0
    assert_each_order_in_sequence(recording_bus, 303)


def test_a_transaction_larger_than_a_round_is_recorded_as_a_set_and_drained_across_rounds(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A transaction with more rows than a round publishes (spill_rows) is never published whole: the relay
    records its rows as a set, moves the slot past it once that is committed, and drains the set a chunk a
    round; an order's later event in a later transaction waits for its earlier one in the set."""
    write_orders(order_database, 250, per_transaction=250)
    write_orders(order_database, 4, sequence=2)

    rounds = []
    while (outcome := relay_slot_round(**round_options(database), set_rows=60)).taken or outcome.backlog:
        rounds.append(len(outcome.published))
        assert len(rounds) < 20

    assert rounds[0] == 0  # the spill: recorded, nothing published
    assert max(rounds) <= 60 + 4 + 4  # a chunk, and the later events with their earlier ones pulled in
    assert len(rounds) >= 250 // 60
    assert len(recording_bus.accepted) == 254  # each once
    assert_each_order_in_sequence(recording_bus, 254)
    assert pending_in_slot(order_database) == 0


def test_a_replay_message_of_the_old_format_is_recorded_as_a_set_and_drained(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A replay written before the upgrade named its rows in the message itself: the relay records them as
    a set of its own (once, however often it reads the message) and drains it like any other."""
    import json

    write_orders(order_database, 12)
    drain(database)
    recording_bus.accepted.clear()
    with connect(order_database) as connection:
        positions = [p for (p,) in connection.execute("SELECT position FROM outbox ORDER BY position")]
        connection.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)", (replication.REPLAY_PREFIX, json.dumps(positions))
        )

    drain(database)

    assert len(recording_bus.accepted) == 12
    with connect(order_database) as connection:
        kinds = connection.execute("SELECT kind, finished_at IS NOT NULL FROM outbox_replay").fetchall()
    assert kinds == [("spill", True)]


def test_a_replayed_row_parked_leaves_its_set_in_the_transaction_of_its_parked_mark(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """Progress and parked marks commit together: a round that parks a replayed row and then fails before
    COMMIT leaves the row both unparked and still in its set (it is parked again next round), never out of
    the set and unmarked (it would be neither on the bus nor parked)."""
    write_orders(order_database, 3)
    drain(database)
    replay_id = replay_everything(database)
    with connect(order_database) as connection:  # broken since it was first published
        connection.execute("UPDATE outbox SET envelope = '[]' WHERE aggregate_id = 'o-0001'")
    drain_one = relay_slot_round(**round_options(database))  # reads the message: activates the set
    assert drain_one.taken == 0
    sink = ListSink()

    def crash(*args: Any) -> bool:
        raise RuntimeError("the relay dies after the round's work, before COMMIT")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "advance_slot", crash)
        with pytest.raises(RuntimeError):
            relay_slot_round(**round_options(database, sink))

    assert len(sink.parked) == 1  # in the poison queue...
    with connect(order_database) as connection:
        marked = connection.execute("SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL").fetchone()
    assert marked == (0,)  # ...its mark rolled back, and with it the set's progress:
    assert len(set_progress(database, replay_id).pending_event_ids) == 3
    drain(database, sink)
    assert len(sink.parked) == 2  # parked again, and then marked
    assert set_progress(database, replay_id).pending_event_ids == []
    with connect(order_database) as connection:
        parked = connection.execute("SELECT aggregate_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()
    assert parked == [("o-0001",)]


def test_a_set_row_parked_before_its_set_is_drained_leaves_the_set_which_finishes(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A row a set names may be marked parked before the set's chunk reaches it (parked by an earlier round
    whose set progress was not recorded, or by an operator): it is neither published nor parked again, and
    it leaves the set with the chunk, so the replay finishes instead of naming the row forever."""
    write_orders(order_database, 3)
    drain(database)
    replay_id = replay_everything(database)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET parked_at = clock_timestamp(), published_at = NULL"
            " WHERE aggregate_id = 'o-0001'"
        )
    recording_bus.accepted.clear()
    sink = ListSink()

    drain(database, sink)

    assert sink.parked == []
    assert sorted(order for order, _, _ in recording_bus.accepted) == ["o-0000", "o-0002"]  # replayed once
    assert set_progress(database, replay_id).pending_event_ids == []
    assert set_progress(database, replay_id).finished


def generate_wal_without_outbox_rows(settings: ConnectionSettings, rows: int) -> None:
    with connect(settings) as connection:
        connection.execute(
            "INSERT INTO inbox (consumer, event_id) SELECT 'filler', g::text || repeat('x', 100)"
            " FROM generate_series(1, %s) AS g",
            (rows,),
        )


def test_a_round_decodes_at_most_its_window_of_the_log_and_the_next_goes_on_at_once(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """After a long outage the slot's next outbox row may sit behind gigabytes of other writes: a round
    reads one window of the log (upto_lsn), moves the slot to its end and says more is ready (no idle
    pause), so no read outgrows a round however far behind the slot is."""
    generate_wal_without_outbox_rows(order_database, 4000)  # ~1 MB of WAL before the event
    write_orders(order_database, 2)
    window = 128 * 1024

    moves = []
    while True:
        before = confirmed_lsn(order_database)
        outcome = relay_slot_round(**round_options(database), window_bytes=window)
        moves.append(confirmed_lsn(order_database) - before)
        if not outcome.backlog:
            break
        assert len(moves) < 100

    assert len(moves) >= 6
    assert max(moves) <= window + 8192  # a window, or up to the end of a transaction read within it
    assert len(recording_bus.accepted) == 2
    assert pending_in_slot(order_database) == 0


def test_a_read_of_the_slot_past_its_time_ends_the_round_and_the_next_reads_a_smaller_window(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """The read's statement_timeout is its share of the round: a read that runs past it (here: 1 ms for
    megabytes of WAL) is cancelled, the round ends at once having moved nothing, and the relay reads half
    the window next time, so rounds keep ending in their time until a window fits."""
    generate_wal_without_outbox_rows(order_database, 20_000)
    write_orders(order_database, 1)
    before = confirmed_lsn(order_database)
    logical_relay._windows.pop(SLOT, None)

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "MIN_READ_SECONDS", 0.001)
        outcome = relay_slot_round(**round_options(database), round_seconds=0.0)

    assert (outcome.taken, outcome.backlog) == (0, True)
    assert confirmed_lsn(order_database) == before
    assert logical_relay._windows[SLOT] == logical_relay.WINDOW_BYTES // 2
    drain(database)
    assert len(recording_bus.accepted) == 1
    logical_relay._windows.pop(SLOT, None)


def test_a_replay_never_overtakes_an_earlier_event_of_its_order_still_in_the_slot(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A replay may name an event the relay has not read yet (a window reaching the last minutes, a relay
    behind): its set is drained only once the slot is past the replay's message, so the replayed event
    never reaches the bus before its order's earlier events still in the slot."""
    from shop.runtime.config import Settings
    from shop.runtime.order_store_replay import replay_order_store

    write_in_own_transaction(order_database, event("order-r", 1))
    write_in_own_transaction(order_database, event("order-r", 2))
    replay_order_store(database, Settings.from_env({}), {"eventIds": [event("order-r", 2).id]}, lambda: 0.0)

    # Rounds of 64 bytes until the three publications are out, then whole windows to the slot's end: the
    # slot also holds WAL the server writes meanwhile (autovacuum analyzing what earlier tests wrote),
    # which 64-byte rounds would walk for thousands of rounds.
    for _ in range(5_000):  # a guard against a relay that never publishes them, not a figure
        relay_slot_round(**round_options(database), window_bytes=64)
        if len(recording_bus.accepted) >= 3:
            break
    drain(database)

    assert recording_bus.sequences_by_order() == {"order-r": [1, 2, 2]}


def test_a_crash_after_an_advance_never_leaves_the_slot_past_a_replay_it_did_not_activate(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """A set's activation is written in the round's transaction and the advance is not transactional: the
    slot passes the set's message only once the activation is committed, so a crash in between reads the
    message again rather than leaving a set that nothing will ever drain."""
    write_orders(order_database, 4)
    drain(database)
    replay_id = replay_everything(database)
    write_orders(order_database, 2, sequence=2)  # after the message: the round advances past them too

    with crash_after_the_advance(monkeypatch), pytest.raises(RuntimeError):
        relay_slot_round(**round_options(database))
    drain(database)

    assert set_progress(database, replay_id).pending_event_ids == []
    assert set_progress(database, replay_id).finished
    assert pending_in_slot(order_database) == 0


def test_a_round_stops_publishing_when_its_share_of_the_invocation_is_used(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A round publishes a slice at a time and looks at its clock in between: out of time, it stops there
    (always after its first slice, so every round makes progress), the slot moves past what went out, and
    the next round starts at once with the rest."""
    write_orders(order_database, 30, per_transaction=1)

    rounds = []
    while (
        outcome := relay_slot_round(**round_options(database), round_seconds=0.0, slice_rows=10)
    ).taken or outcome.backlog:
        rounds.append((len(outcome.published), outcome.backlog))
        assert len(rounds) < 10

    assert rounds == [(10, True), (10, True), (10, False)]
    assert len(recording_bus.accepted) == 30  # each once: the slot moved past each slice


def test_a_round_begins_no_call_that_could_outlast_the_invocation_and_the_slot_stays_before_its_rows(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """The round's own time bounds only its retries (its first slice goes out whatever it says); the
    invocation's bounds every call: with 7.5 s left, a PutEvents call (7 s at worst) and the answer's
    second do not fit, so nothing is sent and the slot stays before the rows, which the next round
    publishes once."""
    write_orders(order_database, 10, per_transaction=1)
    before = confirmed_lsn(order_database)

    outcome = relay_slot_round(**round_options(database), remaining_seconds=lambda: 7.5)

    assert (outcome.taken, len(outcome.published)) == (10, 0)
    assert (outcome.out_of_time, outcome.backlog) == (True, True)
    assert recording_bus.calls == 0
    assert confirmed_lsn(order_database) == before
    drain(database)
    assert len(recording_bus.accepted) == 10  # each once


def test_a_round_that_read_part_of_the_log_ends_on_whole_calls_and_the_rest_leads_the_next_read(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """The log holds more than a round reads: the round publishes whole PutEvents calls of ten and leaves
    its last few transactions in the slot, read again first by the next round; the round that reads to
    the end publishes all it read. 25 events in 3 calls, as many as 25 events need."""
    write_orders(order_database, 25, per_transaction=1)

    first = relay_round(database, max_changes=40)  # about 13 one-row transactions

    assert len(first.published) == 10
    assert first.backlog
    assert pending_in_slot(order_database) == 15  # the slot stands after the tenth transaction
    drain(database, max_changes=40)
    assert_each_order_in_sequence(recording_bus, 25)
    assert len(recording_bus.accepted) == 25  # nothing twice
    assert recording_bus.calls == 3


def test_a_replay_message_in_a_transaction_too_large_to_publish_whole_is_activated_with_its_spill(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    from shop.adapters.postgres import replays

    # Given one event on the bus
    with connect(order_database) as connection, connection.transaction():
        write_events(connection, [event("o-replayed", 1)])
    drain(database)
    assert [order for order, _, _ in recording_bus.accepted] == ["o-replayed"]
    # When a transaction of more rows than a round publishes (it spills) also asks to replay that event
    with connect(order_database) as connection:
        found = connection.execute("SELECT position FROM outbox WHERE aggregate_id = 'o-replayed'").fetchone()
        assert found is not None
        with connection.transaction(), connection.cursor() as cursor:
            write_events(connection, [event(f"o-{n:03d}", 1) for n in range(logical_relay.SPILL_ROWS + 1)])
            replay_id = replication.emit_replay(cursor, [found[0]])
    assert replay_id is not None
    drain(database)

    # Then the replay set is activated and drained with the spill: the event is on the bus again
    with database.transaction() as cursor:
        progress = replays.progress(cursor, replay_id)
    assert progress.finished, progress
    assert [order for order, _, _ in recording_bus.accepted].count("o-replayed") == 2
    assert len(recording_bus.accepted) == 1 + logical_relay.SPILL_ROWS + 1 + 1
