"""Switching the PostgreSQL outbox between the polling publisher and the logical relay (PostgresRelay) on
a live database, as the migration function does at deploy time: no event stranded, none lost, and a
repeated run changes nothing (a real PostgreSQL with wal_level=logical; tests/support/publishing.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shop.adapters.postgres import relay_mode, replication
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.outbox import RelayModeMismatch
from shop.adapters.postgres.relay_mode import switch_relay
from tests.support.postgres import connect, place_orders, wait_until_a_lock_is_awaited
from tests.support.publishing import (
    ListSink,
    RecordingBus,
    advance,
    assert_each_order_in_sequence,
    drain_slot,
    polling_round,
)

SLOT = replication.slot_name("relay_mode_tests")


@pytest.fixture
def settings(order_database: ConnectionSettings) -> Iterator[ConnectionSettings]:
    """The emptied database in polling mode; back to polling, its slot dropped, after the test."""
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")
        replication.drop_publication_and_slot(connection, SLOT)
    yield order_database
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")
        replication.drop_publication_and_slot(connection, SLOT)


def switch(settings: ConnectionSettings, mode: str) -> str:
    with connect(settings) as connection:
        return switch_relay(connection, mode, SLOT)


def drain_logical(database: Database) -> None:
    drain_slot(database, SLOT)


def drain_polling(database: Database) -> None:
    while polling_round(database).taken:
        pass


def mode_and_slot(settings: ConnectionSettings) -> tuple[str, bool]:
    with connect(settings) as connection:
        found = connection.execute("SELECT mode FROM outbox_relay").fetchone()
        assert found is not None
        return found[0], replication.slot_exists(connection, SLOT)


def test_rows_the_polling_publisher_left_pending_are_published_first_after_a_switch_to_logical(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    stranded = place_orders(database, 4)  # pending when the switch happens: before the slot exists
    advance(database, stranded)

    outcome = switch(settings, "logical")
    advance(database, stranded)  # their third events, written after the switch: in the slot
    later = place_orders(database, 2)
    drain_logical(database)

    assert "8 pending rows handed to the logical relay" in outcome
    assert mode_and_slot(settings) == ("logical", True)
    # Each order in sequence across the handover (its handed-over events before those written after).
    assert_each_order_in_sequence(recording_bus, 14)
    assert len(recording_bus.accepted) == 14
    assert {order_id for order_id, _, _ in recording_bus.accepted} == set(stranded + later)


def test_a_switch_repeated_after_it_succeeded_hands_nothing_over_twice(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    place_orders(database, 3)
    switch(settings, "logical")

    assert switch(settings, "logical") == "already logical"
    drain_logical(database)
    assert len(recording_bus.accepted) == 3


def test_rows_the_slot_still_holds_are_left_pending_for_the_polling_publisher_after_a_switch_back(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    switch(settings, "logical")
    delivered = place_orders(database, 3)
    drain_logical(database)
    undelivered = place_orders(database, 2)  # in the slot, not read yet when the switch happens

    outcome = switch(settings, "polling")
    drain_polling(database)

    assert "2 rows the slot or a replay still held left pending" in outcome
    assert mode_and_slot(settings) == ("polling", False)  # the slot is gone: it keeps no WAL
    on_bus = [order_id for order_id, _, _ in recording_bus.accepted]
    assert sorted(on_bus) == sorted(delivered + undelivered)  # each once: nothing lost, nothing repeated


def test_a_switch_back_to_polling_marks_the_logical_relays_rows_before_it_locks_the_outbox(
    settings: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    monkeypatch: pytest.MonkeyPatch,
):
    """Under the outbox's EXCLUSIVE lock every writer waits (the API answers 503): marking the whole logical
    period there took 13 s a million rows. Marked ahead in batches, the lock finds no row left to mark; the
    rows the slot still holds are made pending again under it, and each event reaches the bus once."""
    switch(settings, "logical")
    delivered = place_orders(database, 25)
    drain_logical(database)
    undelivered = place_orders(database, 2)
    left_for_the_lock: list[int] = []
    real_to_polling = relay_mode._to_polling

    def counting(cursor: Any, *args: Any) -> str:
        found = cursor.execute(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL"
        ).fetchone()
        left_for_the_lock.append(found[0])
        return real_to_polling(cursor, *args)

    monkeypatch.setattr(relay_mode, "_to_polling", counting)
    monkeypatch.setattr(relay_mode, "MARK_AHEAD_ROWS", 10)  # three batches
    outcome = switch(settings, "polling")
    drain_polling(database)

    assert left_for_the_lock == [0]
    assert "27 rows marked published ahead of the lock" in outcome
    assert "2 rows the slot or a replay still held left pending" in outcome
    on_bus = [order_id for order_id, _, _ in recording_bus.accepted]
    assert sorted(on_bus) == sorted(delivered + undelivered)


def test_marking_ahead_of_the_handover_never_publishes_a_row_a_relay_round_parks_meanwhile(
    settings: ConnectionSettings, database: Database
):
    """A logical round parks a row (parked_at set, published_at NULL) while the switch marks rows ahead:
    the marking skips the row the round holds instead of waiting for it, so it neither marks a parked row
    published (the table's CHECK refused that, failing the switch) nor deadlocks with the round."""
    switch(settings, "logical")
    place_orders(database, 3)
    with connect(settings) as connection:
        (poison,) = connection.execute("SELECT min(position) FROM outbox").fetchone()  # type: ignore[misc]
    parking_started, release = threading.Event(), threading.Event()

    def round_parking() -> None:
        with connect(settings) as other, other.transaction():
            other.execute(
                "UPDATE outbox SET parked_at = clock_timestamp(), published_at = NULL WHERE position = %s",
                (poison,),
            )
            parking_started.set()
            release.wait(1.0)

    parker = threading.Thread(target=round_parking)
    parker.start()
    try:
        assert parking_started.wait(5)
        with connect(settings) as connection:
            bounds = relay_mode._Bounds(lambda: 60.0, 10.0)
            marked = relay_mode._mark_ahead_of_the_handover(connection, SLOT, bounds, 100)
    finally:
        release.set()
        parker.join()

    assert marked == 2  # the other two rows; the parked one is left to the handover
    with connect(settings) as connection:
        row = connection.execute(
            "SELECT parked_at IS NOT NULL, published_at IS NULL FROM outbox WHERE position = %s", (poison,)
        ).fetchone()
    assert row == (True, True)


def test_a_switch_to_polling_run_again_marks_no_pending_row_of_the_polling_publisher(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    pending = place_orders(database, 3)  # polling mode: NULL is an event not sent yet

    assert switch(settings, "polling") == "already polling"
    drain_polling(database)

    assert sorted(order_id for order_id, _, _ in recording_bus.accepted) == sorted(pending)


def test_a_handover_still_in_the_slot_goes_back_to_the_polling_publisher(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    stranded = place_orders(database, 2)
    switch(settings, "logical")  # the two rows ride a replay message in the slot, marked published

    switch(settings, "polling")  # before the logical relay read it
    drain_polling(database)

    assert sorted(order_id for order_id, _, _ in recording_bus.accepted) == sorted(stranded)


def test_a_switch_to_logical_on_a_server_that_cannot_decode_its_log_changes_nothing_and_says_why() -> None:
    from shop.adapters.postgres.relay_mode import LogicalDecodingOff

    class ReplicaLevelServer:
        """A connection to a cluster whose rds.logical_replication is not applied yet (before a reboot)."""

        def __init__(self) -> None:
            self.statements: list[str] = []

        def execute(self, statement: str, *args: object) -> ReplicaLevelServer:
            self.statements.append(statement)
            return self

        def fetchone(self) -> tuple[str]:
            return ("replica",)

    server = ReplicaLevelServer()
    with pytest.raises(LogicalDecodingOff, match="reboot the writer, then deploy PostgresRelay=logical"):
        switch_relay(server, "logical", SLOT)  # type: ignore[arg-type]
    assert server.statements == ["SHOW wal_level"]  # no slot, no publication, no handover


# --- handover without a window, both directions ----------------------------------------------------------
def first_seen(bus: RecordingBus, order_id: str) -> list[int]:
    """The order's sequences in the order they first reached the bus."""
    seen: list[int] = []
    for sequence in bus.sequences_by_order().get(order_id, []):
        if sequence not in seen:
            seen.append(sequence)
    return seen


@pytest.mark.parametrize("step", [1, 2], ids=["after-the-slot-is-created", "after-it-is-moved-to-the-end"])
def test_an_event_committed_between_the_switchs_steps_reaches_the_bus_after_its_orders_pending_one(
    settings: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    monkeypatch: pytest.MonkeyPatch,
    step: int,
):
    """polling -> logical, forced interleaving: the order's sequence 1 is pending (the polling publisher
    has not sent it); the slot is created; the order's sequence 2 commits before the outbox is locked
    (so the slot holds it); then the handover. Sequence 2 must not reach the bus before sequence 1,
    however the relay reads the slot and the handed-over rows; and each goes out once."""
    (order_id,) = place_orders(database, 1)
    calls = 0
    real_lock_slot = replication.lock_slot

    def commit_then_lock(cursor: object, slot: str) -> None:
        nonlocal calls
        calls += 1
        if calls == step:  # the slot exists, the outbox is not locked yet
            writer = Database(settings)
            try:
                advance(writer, [order_id])  # sequence 2, committed on another connection
            finally:
                writer.close()
        real_lock_slot(cursor, slot)  # type: ignore[arg-type]

    monkeypatch.setattr(relay_mode, "lock_slot", commit_then_lock)
    switch(settings, "logical")
    monkeypatch.setattr(relay_mode, "lock_slot", real_lock_slot)
    advance(database, [order_id])  # sequence 3, after the switch
    drain_logical(database)

    assert calls >= step
    assert first_seen(recording_bus, order_id) == [1, 2, 3]
    assert recording_bus.sequences_by_order()[order_id] == [1, 2, 3]  # each once


def test_a_polling_publisher_still_running_after_a_switch_to_logical_publishes_nothing(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """The invocation that started before the deploy keeps its polling configuration for up to a minute:
    after the switch, an event committed meanwhile is pending in the table (the logical relay marks
    nothing) while its order's earlier event waits in the handover. The stale publisher must not send it
    (it would overtake its predecessor): it sees the outbox is the logical relay's and stops."""
    (order_id,) = place_orders(database, 1)
    switch(settings, "logical")
    advance(database, [order_id])  # sequence 2: in the slot, and a pending row to a polling publisher

    with pytest.raises(RelayModeMismatch, match="switched to the logical relay"):
        drain_polling(database)
    drain_logical(database)

    assert recording_bus.sequences_by_order() == {order_id: [1, 2]}


def test_a_logical_relay_still_running_after_a_switch_to_polling_publishes_nothing(
    settings: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    monkeypatch: pytest.MonkeyPatch,
):
    """logical -> polling, forced interleaving: between the handover's COMMIT and the slot's drop, the
    order's next event commits and a logical relay round of the old configuration runs. It publishes
    nothing (the rows are the polling publisher's now), so each event reaches the bus once, in sequence."""
    switch(settings, "logical")
    (order_id,) = place_orders(database, 1)
    drain_logical(database)  # sequence 1 on the bus
    advance(database, [order_id])  # sequence 2, in the slot, not read yet
    real_drop = relay_mode._drop_slot
    stale: list[BaseException] = []

    def between_handover_and_drop(*args: object) -> bool:
        advance(database, [order_id])  # sequence 3
        try:
            drain_logical(database)
        except RelayModeMismatch as exc:
            stale.append(exc)
        return real_drop(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(relay_mode, "_drop_slot", between_handover_and_drop)
    switch(settings, "polling")
    drain_polling(database)

    assert len(stale) == 1
    assert recording_bus.sequences_by_order() == {order_id: [1, 2, 3]}


@pytest.mark.parametrize("slot_exists", [True, False], ids=["slot-left-by-an-earlier-attempt", "new-slot"])
def test_a_switch_while_a_polling_publisher_is_mid_round_neither_deadlocks_nor_duplicates(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot_exists: bool
):
    """The publisher has claimed its rows (row locks) and is in PutEvents when the switch starts. The
    switch must wait for the round to commit, and the round must be able to mark its rows published:
    in SHARE mode the switch got its lock at once, then waited for the round's rows while the round
    waited for the table (deadlock: a failed deploy, or the round's events published twice). With no
    slot yet, creating it waits for the round's transaction first."""
    orders = place_orders(database, 3)
    if slot_exists:
        with connect(settings) as connection:
            replication.ensure_publication_and_slot(connection, SLOT)
    in_put_events = threading.Event()
    switch_waiting = threading.Event()
    real_put_events = recording_bus.put_events

    def put_events_slowly(Entries: list[dict[str, Any]]) -> dict[str, Any]:
        in_put_events.set()
        assert switch_waiting.wait(10)
        return real_put_events(Entries)

    recording_bus.put_events = put_events_slowly  # type: ignore[method-assign]
    results: dict[str, Any] = {}

    def publish() -> None:
        own = Database(settings)
        try:
            results["round"] = polling_round(own)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            results["round"] = exc
        finally:
            own.close()

    round_thread = threading.Thread(target=publish)
    round_thread.start()
    assert in_put_events.wait(10)

    def run_switch() -> None:
        try:
            results["switch"] = switch(settings, "logical")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            results["switch"] = exc

    switch_thread = threading.Thread(target=run_switch)
    switch_thread.start()
    wait_until_a_lock_is_awaited(settings)
    switch_waiting.set()
    round_thread.join(30)
    switch_thread.join(30)
    recording_bus.put_events = real_put_events  # type: ignore[method-assign]
    drain_logical(database)

    assert isinstance(results["switch"], str), results["switch"]
    assert not isinstance(results["round"], BaseException), results["round"]
    assert "0 pending rows handed to the logical relay" in results["switch"]
    assert sorted(order_id for order_id, _, _ in recording_bus.accepted) == sorted(orders)  # each once


def test_a_switch_that_cannot_lock_the_outbox_in_time_fails_changing_nothing(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """lock_timeout bounds the wait (writers queue behind a waiting switch): a transaction holding the
    outbox longer makes the switch fail with LockNotAvailable in about that time, the outbox still the
    polling publisher's."""
    place_orders(database, 2)
    with connect(settings) as holder, holder.transaction():
        holder.execute("SELECT position FROM outbox FOR UPDATE")  # a publisher round that does not end
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable), connect(settings) as connection:
            switch_relay(connection, "logical", SLOT, lock_wait_seconds=0.3)
        waited = time.monotonic() - started

    assert waited < 3
    assert mode_and_slot(settings)[0] == "polling"
    drain_polling(database)
    assert len(recording_bus.accepted) == 2


def test_a_switch_of_several_slow_statements_is_cancelled_at_its_deadline_changing_nothing(
    settings: ConnectionSettings, database: Database
):
    """The deadline is the switch's, not each statement's: two statements of the handover taking 1.2 s each
    (made slow by triggers), each within the statement_timeout of the time left when its step started,
    ran 2.4 s past a 2 s budget, and the function missed its own deadline. Now the statement running at
    the deadline is cancelled, the handover rolled back: the outbox still the polling publisher's."""
    place_orders(database, 1)
    with connect(settings) as connection:
        connection.execute(
            "CREATE FUNCTION slow_update() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(1.2); RETURN NEW; END $$"
        )
        for table in ("outbox", "outbox_relay"):
            connection.execute(
                f"CREATE TRIGGER slow_update BEFORE UPDATE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION slow_update()"
            )
    try:
        budget = 2.0
        started = time.monotonic()
        with (
            pytest.raises(psycopg.errors.QueryCanceled, match=r"ran past its"),
            connect(settings) as connection,
        ):
            switch_relay(
                connection, "logical", SLOT, seconds_left=lambda: budget - (time.monotonic() - started)
            )
        took = time.monotonic() - started
    finally:
        with connect(settings) as connection:
            for table in ("outbox", "outbox_relay"):
                connection.execute(f"DROP TRIGGER slow_update ON {table}")
            connection.execute("DROP FUNCTION slow_update()")

    assert took < budget + 0.5
    assert mode_and_slot(settings)[0] == "polling"


def test_handing_back_to_polling_streams_the_slot_a_batch_at_a_time(
    settings: ConnectionSettings, database: Database
):
    """logical -> polling reads what the slot still holds through a server-side cursor: this process holds
    a batch of messages at a time and the positions, never the slot's whole content (here 3,000 rows of
    2 kB: 6 MB), and every row the slot held is left pending."""
    import tracemalloc

    switch(settings, "logical")
    with connect(settings) as connection:
        connection.execute(
            "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
            " SELECT 'e-' || g, 'o-' || g, 1, 'OrderNoted', json_build_object('pad', repeat('x', 2000))"
            " FROM generate_series(1, 3000) AS g"
        )

    tracemalloc.start()
    try:
        with connect(settings) as connection:
            outcome = switch_relay(connection, "polling", SLOT, batch_rows=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert "3000 rows the slot or a replay still held left pending" in outcome
    assert peak < 2_000_000, peak
    with connect(settings) as connection:
        pending = connection.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
    assert pending == (3000,)


def test_rows_handed_over_to_the_logical_relay_outlive_retention_until_they_are_out(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """Retention with the logical relay deletes by age (it marks nothing): rows the polling publisher left
    pending for weeks, handed over at the switch, are old, yet must stay until the relay has sent them."""
    from shop.runtime.config import Settings
    from shop.runtime.order_store_maintenance import maintain_order_store

    stranded = place_orders(database, 2)
    with connect(settings) as connection:
        connection.execute("UPDATE outbox SET created_at = created_at - interval '17 days'")
    switch(settings, "logical")
    logical = Settings.from_env({"POSTGRES_RELAY": "logical", "DATABASE_NAME": "relay_mode_tests"})

    kept = maintain_order_store(database, logical, lambda: 60.0)
    drain_logical(database)
    gone = maintain_order_store(database, logical, lambda: 60.0)

    assert kept.outbox_rows_deleted == 0
    assert sorted(order_id for order_id, _, _ in recording_bus.accepted) == sorted(stranded)
    assert gone.outbox_rows_deleted == 2


# --- the mode a migrated database starts in -----------------------------------------------------------------
def test_a_database_migrated_from_zero_records_the_polling_publisher_as_its_relay(
    postgres_server: ConnectionSettings,
):
    """A new stack's database starts with the polling publisher (PostgresRelay's default), and says so in
    the one row of outbox_relay: the row a switch updates in its transaction, and reads to know whether
    a run repeated after a crash has anything left to do. Without it a switch would record nothing; with
    another mode in it, the first deploy would skip the handover (the rows pending with nobody to take
    them). The session's server was migrated at start, and its tests set the mode themselves: a database
    of its own, migrated here, shows what the migrations alone leave."""
    import uuid
    from dataclasses import replace

    from psycopg import sql

    from shop.adapters.postgres.relay_mode import current_mode
    from shop.adapters.postgres.schema import apply_migrations

    fresh = replace(postgres_server, dbname=f"fresh_{uuid.uuid4().hex[:12]}")
    name = sql.Identifier(fresh.dbname)
    with connect(postgres_server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    try:
        assert apply_migrations(fresh)  # every migration, from zero

        with connect(fresh) as connection, connection.cursor() as cursor:
            assert cursor.execute("SELECT mode FROM outbox_relay").fetchall() == [("polling",)]
            assert current_mode(cursor) == "polling"
    finally:
        with connect(postgres_server) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))


def test_a_deploy_that_finds_the_logical_relay_with_its_slot_lost_does_not_create_a_new_one(
    settings: ConnectionSettings, database: Database
):
    """A new slot under a logical relay would start at the log's end and silently skip what the lost one
    had not delivered: the migration leaves it to the slot's recovery, and says so."""
    switch(settings, "logical")
    with connect(settings) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))  # lost (a writer replaced)

    outcome = switch(settings, "logical")

    assert "slot" in outcome
    assert "missing" in outcome
    assert "recover-slot" in outcome
    assert mode_and_slot(settings) == ("logical", False)


@pytest.mark.parametrize("loss", ["dropped", "dropped-then-recreated-without-recovery"])
def test_a_switch_to_polling_while_the_slot_is_lost_changes_nothing_and_sends_the_operator_to_recover_it(
    settings: ConnectionSettings, database: Database, loss: str
):
    """Under the logical relay no row is marked published: only the slot knew which ones it had delivered.
    Handed back to polling with the slot lost, the rows it had not delivered would be marked published,
    and never sent."""
    switch(settings, "logical")
    place_orders(database, 2)  # committed into the slot, not delivered
    with connect(settings) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))  # lost (a writer replaced)
        if loss == "dropped-then-recreated-without-recovery":
            connection.execute(
                "INSERT INTO outbox_slot (slot_name, recovery_since, recovery_started_at)"
                " VALUES (%s, clock_timestamp() - interval '1 hour', clock_timestamp())"
                " ON CONFLICT (slot_name) DO UPDATE SET recovery_since = excluded.recovery_since,"
                " recovery_handed_over_at = NULL",
                (SLOT,),
            )
            connection.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        pending_before = connection.execute(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        ).fetchone()

    with pytest.raises(relay_mode.SlotLostBeforeSwitch, match="recover-slot"):
        switch(settings, "polling")

    with connect(settings) as connection:
        pending_after = connection.execute(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        ).fetchone()
    assert pending_after == pending_before
    assert pending_before is not None
    assert pending_before[0] >= 2
    assert mode_and_slot(settings)[0] == "logical"


def test_a_poison_row_pending_at_a_switch_to_logical_is_parked_and_later_events_keep_flowing(
    settings: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    """A row the polling publisher had not published is marked published by the handover (the logical
    relay's set names it): parking it must not break the outbox's rule that a row is published or
    parked, not both, or every round fails on it and the relay stops for good."""
    with connect(settings) as connection:
        connection.execute(
            "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
            " VALUES ('poison-h', 'order-p', 1, 'OrderNoted', '{\"not\": \"a cloudevent\"}')"
        )
    switch(settings, "logical")  # the poison row is handed over in a set
    later = place_orders(database, 2)  # in the slot, after the set's message
    sink = ListSink()

    drain_slot(database, SLOT, sink)

    assert [record.image["eventId"] for record in sink.parked] == ["poison-h"]
    assert sorted(order_id for order_id, _, _ in recording_bus.accepted) == sorted(later)
    with connect(settings) as connection:
        rows = connection.execute(
            "SELECT published_at IS NULL, parked_at IS NOT NULL FROM outbox WHERE event_id = 'poison-h'"
        ).fetchall()
    assert rows == [(True, True)]  # parked, and no longer counted published
