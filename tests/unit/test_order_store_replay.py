"""Replay for the PostgreSQL order store (shop.runtime.order_store_replay), on a real PostgreSQL: published
rows made pending again for the polling publisher, with the replay's honesty rules; and the operator's
command, which reaches the database through the maintenance function (the database is in a private VPC).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from operations.admin import main as outbox_admin
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.runtime.config import Settings
from shop.runtime.order_store_replay import ReplayRequestError, replay_order_store
from tests.support.postgres import connect, place_orders, use_logical_relay, use_polling_relay

SETTINGS = Settings.from_env({})
NO_TIME_LEFT = lambda: 0.0  # noqa: E731 (the invocation ends at once: nothing is waited for)


def rows(settings: ConnectionSettings) -> dict[str, tuple[str, bool]]:
    """Each order's event: (event id, published)."""
    with connect(settings) as connection:
        found = connection.execute(
            "SELECT aggregate_id, event_id, published_at IS NOT NULL FROM outbox"
        ).fetchall()
    return {order_id: (event_id, published) for order_id, event_id, published in found}


def set_rows(settings: ConnectionSettings, sql: str, order_ids: list[str]) -> None:
    with connect(settings) as connection:
        # `sql` is one of this module's literals, never input.
        connection.execute(f"UPDATE outbox SET {sql} WHERE aggregate_id = ANY(%s)", (order_ids,))  # noqa: S608


@pytest.fixture
def outbox(order_database: ConnectionSettings, database: Database) -> dict[str, list[str]]:
    """Five orders' events: two published in the window, one published long ago (past the republish
    window), one parked, one still pending."""
    recent_a, recent_b, old, parked, pending = place_orders(database, 5)
    set_rows(order_database, "published_at = clock_timestamp()", [recent_a, recent_b, old])
    set_rows(order_database, "created_at = created_at - interval '40 days'", [old])
    set_rows(order_database, "parked_at = clock_timestamp()", [parked])
    return {"recent": [recent_a, recent_b], "old": [old], "parked": [parked], "pending": [pending]}


@contextmanager
def rounds_meanwhile(relay_until_idle: Callable[[], None]) -> Iterator[None]:
    """The relay running its rounds in a thread of its own while the block runs (a replay waits for it)."""
    stop = threading.Event()

    def relay_until_stopped() -> None:
        while not stop.is_set():
            relay_until_idle()

    relay = threading.Thread(target=relay_until_stopped)
    relay.start()
    try:
        yield
    finally:
        stop.set()
        relay.join()


def window(days: int = 60) -> dict[str, str]:
    now = datetime.now(UTC)
    return {"from": (now - timedelta(days=days)).isoformat(), "to": (now + timedelta(minutes=1)).isoformat()}


def test_a_window_replay_makes_only_its_published_events_inside_the_republish_window_pending_again(
    order_database: ConnectionSettings, database: Database, outbox: dict[str, list[str]]
):
    report = replay_order_store(database, SETTINGS, window(), NO_TIME_LEFT)

    state = rows(order_database)
    ids = {name: [state[o][0] for o in orders] for name, orders in outbox.items()}
    assert sorted(report.selection.reset) == sorted(ids["recent"])
    assert [state[o][1] for o in outbox["recent"]] == [False, False]  # pending again: the publisher's
    assert report.selection.expired == ids["old"]
    assert state[outbox["old"][0]][1] is True  # left published: consumers may have forgotten it
    assert (report.selection.parked, report.selection.pending) == (ids["parked"], ids["pending"])
    # Nothing was republished before the invocation ended: not complete, and it says so (the pending
    # event was selected too: it is not on the bus either).
    assert sorted(report.still_pending) == sorted(ids["recent"] + ids["pending"])
    assert report.complete is False
    assert any("redrive-poison" in message for message in report.messages)
    assert any("includeExpired" in message for message in report.messages)


def test_include_expired_replays_old_events_too(
    order_database: ConnectionSettings, database: Database, outbox: dict[str, list[str]]
):
    report = replay_order_store(database, SETTINGS, {**window(), "includeExpired": True}, NO_TIME_LEFT)

    assert report.selection.expired == []
    assert rows(order_database)[outbox["old"][0]][0] in report.selection.reset


def test_a_replay_by_event_id_names_the_ids_it_does_not_know(
    order_database: ConnectionSettings, database: Database, outbox: dict[str, list[str]]
):
    known = rows(order_database)[outbox["recent"][0]][0]

    report = replay_order_store(database, SETTINGS, {"eventIds": [known, "no-such-event"]}, NO_TIME_LEFT)

    assert (report.selection.reset, report.selection.missing) == ([known], ["no-such-event"])


def test_the_replay_is_complete_once_the_publisher_has_sent_every_event_again(
    order_database: ConnectionSettings, database: Database, outbox: dict[str, list[str]]
):
    # A publisher stand-in marks pending rows published a moment after the replay made them pending.
    stop = threading.Event()

    def publisher() -> None:
        while not stop.wait(0.2):
            set_rows(order_database, "published_at = clock_timestamp()", outbox["recent"])

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    try:
        known = [rows(order_database)[o][0] for o in outbox["recent"]]
        report = replay_order_store(database, SETTINGS, {"eventIds": known}, lambda: 60.0)
    finally:
        stop.set()
        thread.join()

    assert (report.republished, report.still_pending, report.complete) == (2, [], True)


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({}, "give eventIds, or both from and to"),
        ({"from": "2026-11-01T00:00:00Z"}, "give eventIds, or both from and to"),
        ({"eventIds": []}, "non-empty list"),
        ({"eventIds": ["a"], "from": "2026-11-01T00:00:00Z"}, "not both"),
        ({"from": "2026-11-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"}, "is after"),
        ({"from": "2026-11-01T00:00:00", "to": "2026-11-02T00:00:00Z"}, "no UTC offset"),
    ],
)
def test_a_malformed_request_changes_nothing_and_says_why(
    order_database: ConnectionSettings,
    database: Database,
    outbox: dict[str, list[str]],
    request_body: dict[str, Any],
    message: str,
):
    before = rows(order_database)
    with pytest.raises(ReplayRequestError, match=message):
        replay_order_store(database, SETTINGS, request_body, NO_TIME_LEFT)
    assert rows(order_database) == before


# --- the operator's command ----------------------------------------------------------------------------
def test_the_command_asks_the_maintenance_function_and_exits_0_only_when_complete(
    lambda_stub: Any, capsys: pytest.CaptureFixture[str]
):
    stub = lambda_stub({"reset": ["e1"], "republished": 1, "complete": True})
    base = ["replay", "--order-store-function", "shop-maintenance", "--event-id", "e1", "--include-expired"]

    assert outbox_admin(base) == 0
    assert stub.requests == [("shop-maintenance", {"replay": {"eventIds": ["e1"], "includeExpired": True}})]
    assert json.loads(capsys.readouterr().out)["store"] == "postgres"

    lambda_stub({"reset": ["e1"], "republished": 0, "stillPending": ["e1"], "complete": False})
    assert outbox_admin(base) == 1


def test_the_command_reports_a_refused_request_or_a_failed_function(lambda_stub: Any):
    lambda_stub({"error": {"code": "INVALID_REPLAY_REQUEST", "message": "the function said no"}})
    window = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-02T00:00:00Z"]
    with pytest.raises(SystemExit, match="the function said no"):
        outbox_admin(["replay", "--order-store-function", "f", *window])

    lambda_stub({"errorMessage": "boom"}, function_error=True)
    assert outbox_admin(["replay", "--order-store-function", "f", "--event-id", "e1"]) == 1


def test_with_the_logical_relay_a_replay_goes_through_the_slot_and_completes_once_it_is_past(
    order_database: ConnectionSettings, database: Database, recording_bus: Any
):
    """PostgresRelay=logical: rows carry no publishing state; the replay names them in a message in the log,
    the relay republishes them from there, and the replay is complete when the slot is past it."""
    from shop.adapters.postgres import replication
    from shop.runtime.logical_relay import relay_slot_round
    from tests.support.publishing import ListSink, publisher

    settings = Settings.from_env({"POSTGRES_RELAY": "logical", "DATABASE_NAME": "replay_tests"})
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)
    relay_database = Database(order_database)
    try:
        orders = place_orders(database, 3)

        def relay_until_idle() -> None:
            while relay_slot_round(
                relay_database, publisher(), ListSink(), slot=slot, max_event_bytes=SETTINGS.max_event_bytes
            ).taken:
                pass

        relay_until_idle()
        assert len(recording_bus.accepted) == 3
        replayed = rows(order_database)[orders[1]][0]
        with rounds_meanwhile(relay_until_idle):
            report = replay_order_store(database, settings, {"eventIds": [replayed]}, lambda: 30.0)

        assert report.selection.reset == [replayed]
        assert report.complete is True
        assert [event_id for _, _, event_id in recording_bus.accepted].count(replayed) == 2
        assert rows(order_database)[orders[1]][1] is False  # no row was updated
    finally:
        relay_database.close()
        use_polling_relay(order_database, slot)


def test_with_the_logical_relay_a_row_a_pending_replay_names_outlives_retention_until_it_is_out(
    order_database: ConnectionSettings, database: Database, recording_bus: Any
):
    """Retention with the logical relay deletes rows by age (it marks none published): a replay of old
    events names rows past that age, and they must stay until the relay has republished them."""
    from shop.adapters.postgres import replication
    from shop.runtime.logical_relay import relay_slot_round
    from shop.runtime.order_store_maintenance import maintain_order_store
    from tests.support.publishing import ListSink, publisher

    settings = Settings.from_env(
        {"POSTGRES_RELAY": "logical", "DATABASE_NAME": "replay_tests", "OUTBOX_TTL_DAYS": "16"}
    )
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)

    def relay_until_idle() -> None:
        while (
            outcome := relay_slot_round(
                database, publisher(), ListSink(), slot=slot, max_event_bytes=SETTINGS.max_event_bytes
            )
        ).taken or outcome.backlog:
            pass

    try:
        orders = place_orders(database, 3)
        relay_until_idle()
        set_rows(order_database, "created_at = created_at - interval '17 days'", orders)
        replayed = rows(order_database)[orders[0]][0]
        report = replay_order_store(
            database, settings, {"eventIds": [replayed], "includeExpired": True}, NO_TIME_LEFT
        )
        assert report.still_pending == [replayed]

        before_republish = maintain_order_store(database, settings, lambda: 60.0)
        relay_until_idle()
        after_republish = maintain_order_store(database, settings, lambda: 60.0)

        assert before_republish.outbox_rows_deleted == 2  # the other two: not named by the replay
        assert [event_id for _, _, event_id in recording_bus.accepted].count(replayed) == 2
        assert after_republish.outbox_rows_deleted == 1
    finally:
        use_polling_relay(order_database, slot)


def test_a_replay_longer_than_the_sessions_statement_timeout_resets_within_the_invocations_time(
    order_database: ConnectionSettings, outbox: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
):
    """The window is selected and reset in one transaction. Under the session's statement timeout (5 s;
    0.2 s here) a large window failed every time (QueryCanceled: ServiceBusy, "retry shortly"), each retry
    doing the same work: here the selection is made to take 0.5 s."""
    from shop.adapters.postgres import connection
    from shop.adapters.postgres import outbox as outbox_sql
    from shop.runtime import order_store_replay

    monkeypatch.setattr(connection, "STATEMENT_TIMEOUT_MS", 200)
    real_reset = outbox_sql.reset_for_replay

    def slow_reset(cursor: Any, **kwargs: Any) -> Any:
        cursor.execute("SELECT pg_sleep(0.5)")
        return real_reset(cursor, **kwargs)

    monkeypatch.setattr(order_store_replay, "reset_for_replay", slow_reset)
    short_statements = Database(order_database)
    try:
        time_left = iter([30.0])  # then none: nothing is waited for after the reset
        report = replay_order_store(short_statements, SETTINGS, window(), lambda: next(time_left, 0.0))
    finally:
        short_statements.close()

    assert sorted(report.selection.reset) == sorted(rows(order_database)[o][0] for o in outbox["recent"])


@pytest.mark.parametrize(
    ("start", "end", "refusal"),
    [
        ("2026-11-02T00:00:00Z", "2026-11-01T00:00:00Z", "is after --to"),
        ("2026-11-01T00:00:00", "2026-11-02T00:00:00Z", "--from .* is not an RFC 3339 time"),
        ("yesterday", "2026-11-02T00:00:00Z", "--from 'yesterday' is not an RFC 3339 time"),
    ],
)
def test_the_command_refuses_a_window_it_cannot_replay_before_asking_the_function(
    lambda_stub: Any, start: str, end: str, refusal: str
):
    stub = lambda_stub({"reset": [], "republished": 0, "complete": True})
    with pytest.raises(SystemExit, match=refusal):
        outbox_admin(["replay", "--order-store-function", "f", "--from", start, "--to", end])
    assert stub.requests == []


def event_of(database: Database, order_id: str) -> str:
    with database.transaction() as cursor:
        cursor.execute("SELECT event_id FROM outbox WHERE aggregate_id = %s", (order_id,))
        [(event_id,)] = cursor.fetchall()
    return str(event_id)


def test_an_event_replayed_while_still_pending_is_waited_for_like_the_others(
    order_database: ConnectionSettings, database: Database
):
    # Given an event never published yet (its publisher failing, say)
    [order] = place_orders(database, 1)
    event_id = event_of(database, order)

    # When it is replayed by id and the invocation ends before any publisher sent it
    report = replay_order_store(database, SETTINGS, {"eventIds": [event_id]}, NO_TIME_LEFT)

    # Then the replay does not say it is on the bus
    assert report.selection.pending == [event_id]
    assert (report.still_pending, report.republished, report.complete) == ([event_id], 0, False)

    # And once the publisher has sent it, the replay waits for it and says so
    report = replay_order_store(
        database,
        SETTINGS,
        {"eventIds": [event_id]},
        lambda: 30.0,
        sleep=lambda _: set_rows(order_database, "published_at = clock_timestamp()", [order]),
    )
    assert (report.still_pending, report.republished, report.complete) == ([], 1, True)


def test_an_event_the_polling_publisher_parks_on_the_way_is_named_and_the_replay_is_not_complete(
    order_database: ConnectionSettings, database: Database
):
    # Given a published event the publisher will park when it meets it again (MaxEventBytes lowered since)
    [order] = place_orders(database, 1)
    set_rows(order_database, "published_at = clock_timestamp()", [order])
    event_id = event_of(database, order)

    # When it is replayed and parked while the replay waits
    def publisher_parks(_: float) -> None:
        set_rows(order_database, "parked_at = clock_timestamp()", [order])

    report = replay_order_store(
        database, SETTINGS, {"eventIds": [event_id]}, lambda: 30.0, sleep=publisher_parks
    )

    # Then the replay answers at once, naming it: not on the bus, redrive-poison is its way back
    assert (report.parked_on_the_way, report.still_pending, report.republished) == ([event_id], [], 0)
    assert report.complete is False
    assert report.to_dict()["parkedOnTheWay"] == [event_id]
    assert any("redrive-poison" in message for message in report.messages)


def test_with_the_logical_relay_an_event_parked_on_the_way_is_named_and_the_replay_is_not_complete(
    order_database: ConnectionSettings, database: Database, recording_bus: Any
):
    """A row leaves the replay set once on the bus, or once parked: the second is not republished."""
    from shop.adapters.postgres import replication
    from shop.runtime.logical_relay import relay_slot_round
    from tests.support.publishing import ListSink, publisher

    settings = Settings.from_env({"POSTGRES_RELAY": "logical", "DATABASE_NAME": "replay_tests"})
    slot = replication.slot_name(settings.database_name)
    use_logical_relay(order_database, slot)
    relay_database = Database(order_database)
    try:
        [order] = place_orders(database, 1)

        def relay_until_idle(max_event_bytes: int) -> None:
            while relay_slot_round(
                relay_database, publisher(), ListSink(), slot=slot, max_event_bytes=max_event_bytes
            ).taken:
                pass

        relay_until_idle(settings.max_event_bytes)
        assert len(recording_bus.accepted) == 1
        event_id = event_of(database, order)
        # MaxEventBytes lowered since: the event no longer fits, the relay parks it
        with rounds_meanwhile(lambda: relay_until_idle(100)):
            report = replay_order_store(database, settings, {"eventIds": [event_id]}, lambda: 30.0)

        assert len(recording_bus.accepted) == 1  # not on the bus again
        assert (report.parked_on_the_way, report.republished, report.complete) == ([event_id], 0, False)
    finally:
        relay_database.close()
        use_polling_relay(order_database, slot)
