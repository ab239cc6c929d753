"""The logical relay (PostgresRelay=logical) against a real PostgreSQL with wal_level=logical: what reaches
the bus, in which order, and where the slot stands after each kind of crash (tests/support/publishing.py
records PutEvents)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shop.adapters.postgres import replication
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.outbox import insert_outbox_row
from shop.adapters.postgres.pgoutput import parse_lsn
from shop.domain.envelope import CloudEvent
from shop.runtime import logical_relay
from shop.runtime.logical_relay import relay_slot_round
from shop.runtime.polling_publisher import RoundOutcome
from tests.support.postgres import connect, place_orders
from tests.support.publishing import (
    SETTINGS,
    ListSink,
    RecordingBus,
    advance,
    assert_each_order_in_sequence,
    publisher,
)

SLOT = replication.slot_name("relay_tests")


@pytest.fixture
def slot(order_database: ConnectionSettings) -> Iterator[str]:
    """The outbox publication and a fresh slot on the emptied database; dropped after the test."""
    with connect(order_database) as connection:
        replication.drop_publication_and_slot(connection, SLOT)
        replication.ensure_publication_and_slot(connection, SLOT)
    yield SLOT
    with connect(order_database) as connection:
        replication.drop_publication_and_slot(connection, SLOT)


def relay_round(database: Database, sink: ListSink | None = None, max_changes: int = 500) -> RoundOutcome:
    return relay_slot_round(
        database,
        publisher(),
        sink if sink is not None else ListSink(),
        slot=SLOT,
        max_event_bytes=SETTINGS.max_event_bytes,
        max_changes=max_changes,
    )


def drain(database: Database, sink: ListSink | None = None, max_changes: int = 500) -> int:
    """Rounds until one reads nothing; how many rounds read something."""
    rounds = 0
    while relay_round(database, sink, max_changes).claimed:
        rounds += 1
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
        patch.setattr(logical_relay, "publish_rows", crash)
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
    real_advance = replication.advance_slot

    def advance_then_crash(*args: Any) -> bool:
        real_advance(*args)
        raise RuntimeError("the relay crashed after the slot advance, before COMMIT")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "advance_slot", advance_then_crash)
        with pytest.raises(RuntimeError):
            relay_round(database)

    assert pending_in_slot(order_database) == 0
    assert drain(database) == 0
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)  # each once


def test_a_poison_row_is_parked_whole_and_the_slot_moves_past_it(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    with connect(order_database) as connection:
        write_raw_row(connection, "poison-1", "order-p", '{"not": "a cloudevent"}')
        with connection.transaction():
            write_events(connection, [event("order-q", 1)])
    sink = ListSink()

    drain(database, sink)

    assert [record.image["eventId"] for record in sink.parked] == ["poison-1"]
    assert sink.parked[0].image["envelope"] == '{"not": "a cloudevent"}'
    assert recording_bus.sequences_by_order() == {"order-q": [1]}
    assert pending_in_slot(order_database) == 0
    with connect(order_database) as connection:
        parked = connection.execute("SELECT event_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()
    assert parked == [("poison-1",)]


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


def test_one_relay_reads_the_slot_at_a_time(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    place_orders(database, 3)
    with connect(order_database) as other, other.transaction(), other.cursor() as cursor:
        assert replication.try_lock_slot(cursor, SLOT)  # another relay's round in progress

        assert relay_round(database).claimed == 0

    assert relay_round(database).claimed == 3


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
    real_advance = replication.advance_slot
    sink = ListSink()

    def advance_then_crash(*args: Any) -> bool:
        real_advance(*args)
        raise RuntimeError("the relay crashed after the slot advance, before COMMIT")

    with monkeypatch.context() as patch:
        patch.setattr(logical_relay, "advance_slot", advance_then_crash)
        with pytest.raises(RuntimeError):
            relay_round(database, sink)
    drain(database, sink)

    with connect(order_database) as connection:
        parked = connection.execute("SELECT event_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()
    assert parked == [("poison-3",)]
    assert pending_in_slot(order_database) == 0
    # Poison first: the round's only advance came after the mark's COMMIT. After an event: the round
    # advanced past the event only, crashed, and the next round parked the poison again.
    assert [record.image["eventId"] for record in sink.parked] == ["poison-3"] * (1 if poison_first else 2)
    assert recording_bus.sequences_by_order() == {"order-q": [1]}


def test_a_round_that_parks_a_row_moves_the_slot_past_it_once_the_mark_is_committed(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    with connect(order_database) as connection:
        write_raw_row(connection, "poison-4", "order-p", "[]")
        with connection.transaction():
            write_events(connection, [event("order-r", 1)])
    sink = ListSink()

    relay_round(database, sink)

    assert pending_in_slot(order_database) == 0  # one round: no row read again, nothing parked twice
    assert [record.image["eventId"] for record in sink.parked] == ["poison-4"]
    assert recording_bus.sequences_by_order() == {"order-r": [1]}
