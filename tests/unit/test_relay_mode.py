"""Switching the PostgreSQL outbox between the polling publisher and the logical relay (PostgresRelay) on
a live database, as the migration function does at deploy time: no event stranded, none lost, and a
repeated run changes nothing (a real PostgreSQL with wal_level=logical; tests/support/publishing.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shop.adapters.postgres import replication
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.relay_mode import switch_relay
from shop.runtime.logical_relay import relay_slot_round
from shop.runtime.polling_publisher import publish_pending_round
from tests.support.postgres import connect, place_orders
from tests.support.publishing import (
    SETTINGS,
    ListSink,
    RecordingBus,
    advance,
    assert_each_order_in_sequence,
    publisher,
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
    while relay_slot_round(
        database, publisher(), ListSink(), slot=SLOT, max_event_bytes=SETTINGS.max_event_bytes
    ).claimed:
        pass


def drain_polling(database: Database) -> None:
    while publish_pending_round(
        database, publisher(), ListSink(), max_event_bytes=SETTINGS.max_event_bytes
    ).claimed:
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

    assert "8 pending rows handed to the slot" in outcome
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

    assert "2 rows the slot still held left pending" in outcome
    assert mode_and_slot(settings) == ("polling", False)  # the slot is gone: it keeps no WAL
    on_bus = [order_id for order_id, _, _ in recording_bus.accepted]
    assert sorted(on_bus) == sorted(delivered + undelivered)  # each once: nothing lost, nothing repeated


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
