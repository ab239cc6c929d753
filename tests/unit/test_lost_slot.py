"""A lost replication slot (PostgresRelay=logical) on a real PostgreSQL: the states that mean "lost" (each
server version's way of saying it), the relay stopping with one error that says what happened, the
maintenance function's ReplicationSlotLost and the bound it records each minute, and the recovery
(`python -m operations recover-slot`): the slot recreated and every event the lost slot may have held
republished, each order's in sequence, with the usual honesty rules.

A loss is real here: the slot dropped (pg_drop_replication_slot: as a writer replaced by one without it
leaves the database), or invalidated by the server itself (PostgreSQL 18's idle_replication_slot_timeout,
at a checkpoint: wal_status = lost, invalidation_reason = idle_timeout, the state a removed WAL leaves too).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from operations.admin import main as outbox_admin
from shop.adapters.postgres import replication, slot_recovery
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.slot_recovery import (
    RUNBOOK,
    ReplicationSlotLost,
    SlotState,
    read_slot_state,
    record_delivered_before,
    slot_problem,
)
from shop.runtime import order_store_slot_recovery
from shop.runtime.config import Settings
from shop.runtime.order_store_maintenance import maintain_order_store
from shop.runtime.order_store_replay import replay_order_store
from shop.runtime.order_store_slot_recovery import COMMIT_MARGIN, gap_start, recover_slot
from tests.conftest import reset_process_state
from tests.support import LambdaContext, clear_module_caches, load_handler_module
from tests.support.lambda_client import LambdaStub
from tests.support.output import logged_with, metric_values
from tests.support.postgres import connect, place_orders, use_logical_relay, use_polling_relay
from tests.support.publishing import (
    ListSink,
    RecordingBus,
    advance,
    assert_each_order_in_sequence,
    drain_slot,
    logical_round,
)
from tests.unit.conftest import order_store_environment
from tools.template import ROOT, FunctionSpec, Template

SETTINGS = Settings.from_env(
    {"POSTGRES_RELAY": "logical", "DATABASE_NAME": "lost_slot_tests", "OUTBOX_TTL_DAYS": "16"}
)
SLOT = replication.slot_name(SETTINGS.database_name)
NO_TIME_LEFT = lambda: 0.0  # noqa: E731 (nothing is waited for)


class TimeUntilTheFirstWait:
    """An invocation's time left: plenty for the recovery's statements (a slot's creation on a loaded
    machine may take a second, the statement limit NO_TIME_LEFT leaves), none once it would wait for the
    relay to drain the gap (its first sleep): the run hands the gap over and returns at once."""

    def __init__(self) -> None:
        self.waited = False

    def seconds_left(self) -> float:
        return 0.0 if self.waited else 60.0

    def sleep(self, seconds: float) -> None:
        self.waited = True


def recover_without_waiting(database: Database, request: dict[str, Any]) -> Any:
    clock = TimeUntilTheFirstWait()
    return recover_slot(database, SETTINGS, request, clock.seconds_left, sleep=clock.sleep)


def countdown(seconds: float) -> Callable[[], float]:
    """An invocation's time left: `seconds` plus the functions' 5 s reserve, running out in real time (a
    broken wait ends the test instead of hanging it)."""
    deadline = time.monotonic() + seconds + 5.0
    return lambda: deadline - time.monotonic()


@pytest.fixture
def slot(order_database: ConnectionSettings) -> Iterator[str]:
    use_logical_relay(order_database, SLOT)
    yield SLOT
    use_polling_relay(order_database, SLOT)


def relay_round(database: Database, sink: ListSink | None = None) -> Any:
    return logical_round(database, SLOT, sink)


def drain(database: Database) -> None:
    drain_slot(database, SLOT)


def drop_slot(settings: ConnectionSettings) -> None:
    """The slot gone, as a writer replaced by one without it leaves the database."""
    with connect(settings) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))


def invalidate_slot(settings: ConnectionSettings) -> None:
    """The server invalidates the slot itself: idle longer than idle_replication_slot_timeout at a
    checkpoint (PostgreSQL 18). It is then what a removed WAL leaves too: wal_status = lost."""
    with connect(settings) as connection:
        if (
            connection.execute(
                "SELECT 1 FROM pg_settings WHERE name = 'idle_replication_slot_timeout'"
            ).fetchone()
            is None
        ):
            pytest.skip("idle_replication_slot_timeout needs PostgreSQL 18")
        connection.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1s'")
        connection.execute("SELECT pg_reload_conf()")
        try:
            time.sleep(1.2)
            connection.execute("CHECKPOINT")
        finally:
            connection.execute("ALTER SYSTEM RESET idle_replication_slot_timeout")
            connection.execute("SELECT pg_reload_conf()")
        found = connection.execute(
            "SELECT wal_status, invalidation_reason FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    assert found == ("lost", "idle_timeout")


def state(database: Database) -> SlotState:
    with database.transaction() as cursor:
        return read_slot_state(cursor, SLOT)


def outbox_ids(settings: ConnectionSettings) -> dict[tuple[str, int], str]:
    with connect(settings) as connection:
        found = connection.execute("SELECT aggregate_id, sequence, event_id FROM outbox").fetchall()
    return {(order_id, sequence): event_id for order_id, sequence, event_id in found}


def deliveries(bus: RecordingBus) -> dict[str, int]:
    counted: dict[str, int] = {}
    for _, _, event_id in bus.accepted:
        counted[event_id] = counted.get(event_id, 0) + 1
    return counted


# --- what "lost" is --------------------------------------------------------------------------------------
HEALTHY = {"slot_type": "logical", "plugin": "pgoutput", "wal_status": "reserved"}


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (None, "missing"),
        (HEALTHY, None),
        ({**HEALTHY, "wal_status": "extended"}, None),
        ({**HEALTHY, "wal_status": "unreserved"}, None),  # still readable: lost at a checkpoint unless read
        (
            {**HEALTHY, "wal_status": "lost"},
            "lost (wal_status = lost: the WAL it needs was removed)",
        ),  # 13-15
        ({**HEALTHY, "conflicting": True}, "invalidated (conflicting with recovery)"),  # 16
        ({**HEALTHY, "conflicting": False, "invalidation_reason": None}, None),  # 17+, healthy
        (
            {**HEALTHY, "wal_status": "lost", "invalidation_reason": "wal_removed"},
            "invalidated (wal_removed)",
        ),
        (
            {**HEALTHY, "invalidation_reason": "rows_removed", "conflicting": True},
            "invalidated (rows_removed)",
        ),
        ({**HEALTHY, "plugin": "test_decoding"}, "not a pgoutput logical slot (logical, test_decoding)"),
        (
            {**HEALTHY, "slot_type": "physical", "plugin": None},
            "not a pgoutput logical slot (physical, None)",
        ),
    ],
)
def test_each_servers_way_of_saying_a_slot_cannot_be_read_is_a_problem_and_nothing_else_is(
    row: dict[str, Any] | None, problem: str | None
):
    assert slot_problem(row) == problem


def test_a_missing_slot_is_lost_only_while_the_relay_mode_is_logical():
    missing = SlotState(SLOT, "logical", False, "missing", None, None, None, False)

    assert missing.lost
    assert missing.needs_recovery
    polling = SlotState(SLOT, "polling", False, "missing", None, None, None, False)
    assert not polling.lost
    assert not polling.needs_recovery
    unfinished = SlotState(SLOT, "logical", True, None, "0/1", None, datetime.now(UTC), False)
    assert not unfinished.lost
    assert unfinished.needs_recovery
    draining = SlotState(SLOT, "logical", True, None, "0/1", None, datetime.now(UTC), True)
    assert not draining.needs_recovery


def test_the_state_read_from_the_server_for_a_healthy_a_dropped_and_an_invalidated_slot(
    order_database: ConnectionSettings, database: Database, slot: str
):
    assert (state(database).problem, state(database).exists) == (None, True)

    invalidate_slot(order_database)
    invalidated = state(database)
    assert (invalidated.problem, invalidated.lost) == ("invalidated (idle_timeout)", True)
    assert invalidated.confirmed_flush_lsn is not None

    drop_slot(order_database)
    assert (state(database).problem, state(database).lost) == ("missing", True)


# --- the relay stops, saying so -----------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["dropped", "invalidated"])
def test_a_lost_slot_stops_the_relay_with_one_error_naming_the_slot_its_state_and_the_way_back(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str, loss: str
):
    place_orders(database, 2)
    (drop_slot if loss == "dropped" else invalidate_slot)(order_database)

    for _ in range(2):  # every round, the same: not "the database is unavailable", not the server's error
        with pytest.raises(ReplicationSlotLost) as caught:
            relay_round(database)
        message = str(caught.value)
        assert SLOT in message
        assert ("is missing" if loss == "dropped" else "is invalidated (idle_timeout)") in message
        assert "python -m operations recover-slot" in message
        assert RUNBOOK in message
        assert caught.value.__cause__ is None
        assert caught.value.__suppress_context__
    assert recording_bus.accepted == []


def test_a_slot_missing_while_the_outbox_is_the_polling_publishers_is_not_called_lost(
    order_database: ConnectionSettings, database: Database, slot: str
):
    drop_slot(order_database)
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")

    report = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert report.slot_lost is False


# --- maintenance: the metric, and the bound recorded each minute --------------------------------------
def test_maintenance_reports_a_lost_slot_and_keeps_working_whatever_the_loss(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    healthy = maintain_order_store(database, SETTINGS, lambda: 60.0)
    assert (healthy.slot_lost, healthy.slot_state) == (False, "healthy")

    invalidate_slot(order_database)
    invalidated = maintain_order_store(database, SETTINGS, lambda: 60.0)  # no peek of an invalidated slot
    assert (invalidated.slot_lost, invalidated.slot_state) == (True, "invalidated (idle_timeout)")
    assert invalidated.health is not None
    assert invalidated.health.oldest_pending_seconds is None

    drop_slot(order_database)
    missing = maintain_order_store(database, SETTINGS, lambda: 60.0)
    assert (missing.slot_lost, missing.slot_state) == (True, "missing")


def test_maintenance_records_how_far_the_slot_has_delivered_and_never_moves_it_back(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    place_orders(database, 2)
    drain(database)
    maintain_order_store(database, SETTINGS, lambda: 60.0)
    caught_up = state(database).delivered_before
    assert caught_up is not None
    assert datetime.now(UTC) - caught_up < timedelta(seconds=5)

    place_orders(database, 1)  # not delivered: the bound stops before its commit
    with connect(order_database) as connection:
        (committed,) = connection.execute("SELECT max(created_at) FROM outbox").fetchone()  # type: ignore[misc]
    time.sleep(0.3)
    maintain_order_store(database, SETTINGS, lambda: 60.0)

    waiting = state(database).delivered_before
    assert waiting is not None
    assert caught_up <= waiting <= committed + timedelta(milliseconds=100)
    with database.transaction() as cursor:
        record_delivered_before(cursor, SLOT, 3600.0)  # an older bound never replaces a newer one
    assert state(database).delivered_before == waiting


def created_days_ago(settings: ConnectionSettings, order_id: str, days: int) -> None:
    with connect(settings) as connection:
        connection.execute(
            "UPDATE outbox SET created_at = now() - make_interval(days => %s) WHERE aggregate_id = %s",
            (days, order_id),
        )


def orders_in_outbox(settings: ConnectionSettings) -> set[str]:
    with connect(settings) as connection:
        return {order for (order,) in connection.execute("SELECT aggregate_id FROM outbox").fetchall()}


def test_while_the_slot_is_lost_retention_keeps_the_rows_its_recovery_may_republish(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """The relay was down for days, its slot then lost: the table is the only copy of what it had not
    delivered. Retention (rows written longer ago than OutboxTtlDays = 16) keeps every row created since
    the recorded bound less the commit margin until the gap is handed over; older rows were delivered."""
    delivered, undelivered, recent = place_orders(database, 3)
    created_days_ago(order_database, delivered, 20)
    created_days_ago(order_database, undelivered, 17)
    with database.transaction() as cursor:  # every row committed before 18 days ago was delivered
        record_delivered_before(cursor, SLOT, 18 * 86400.0)
    drop_slot(order_database)

    lost = maintain_order_store(database, SETTINGS, lambda: 60.0)

    assert (lost.slot_lost, lost.outbox_rows_deleted) == (True, 1)
    assert orders_in_outbox(order_database) == {undelivered, recent}

    def database_gone(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patch:  # the slot recreated, the gap not handed over yet
        patch.setattr(order_store_slot_recovery, "hand_over_gap", database_gone)
        assert recover_slot(database, SETTINGS, {"execute": True}, NO_TIME_LEFT).failed is not None
    assert state(database).problem is None
    assert maintain_order_store(database, SETTINGS, lambda: 60.0).outbox_rows_deleted == 0

    plan = recover_without_waiting(database, {})
    run = recover_without_waiting(database, {"execute": True, "includeExpired": True})
    drain(database)

    assert (plan.gap_rows, plan.expired) == (1, 1)  # left out unless includeExpired: not complete
    assert run.gap_rows == 2
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted([undelivered, recent])
    handed_over = maintain_order_store(database, SETTINGS, lambda: 60.0)  # in the set, then on the bus
    assert (handed_over.slot_lost, handed_over.outbox_rows_deleted) == (False, 1)
    assert orders_in_outbox(order_database) == {recent}


def test_while_a_slot_lost_before_any_bound_was_recorded_retention_deletes_no_outbox_row(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """No delivered bound: any row may be undelivered, and the operator may start the gap anywhere
    (--since). Once the gap is handed over, retention goes on."""
    old, recent = place_orders(database, 2)
    created_days_ago(order_database, old, 30)
    drop_slot(order_database)

    assert maintain_order_store(database, SETTINGS, lambda: 60.0).outbox_rows_deleted == 0
    assert orders_in_outbox(order_database) == {old, recent}

    since = (datetime.now(UTC) - timedelta(days=31)).isoformat()
    recover_without_waiting(database, {"execute": True, "since": since, "includeExpired": True})
    drain(database)
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted([old, recent])
    assert maintain_order_store(database, SETTINGS, lambda: 60.0).outbox_rows_deleted == 1


def test_the_gap_starts_at_the_recovery_under_way_else_the_recorded_bound_less_an_hour_else_the_window():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    bound = now - timedelta(minutes=3)
    recorded = SlotState(SLOT, "logical", False, "missing", None, bound, None, False)
    under_way = SlotState(SLOT, "logical", True, None, None, bound, now - timedelta(hours=5), False)
    nothing = SlotState(SLOT, "logical", False, "missing", None, None, None, False)

    assert gap_start(recorded, 16, now)[0] == bound - COMMIT_MARGIN
    assert timedelta(hours=1) == COMMIT_MARGIN
    assert gap_start(under_way, 16, now)[0] == now - timedelta(hours=5)
    assert gap_start(nothing, 16, now)[0] == now - timedelta(days=16)


# --- recovery -------------------------------------------------------------------------------------------
def test_recover_slot_republishes_every_event_the_lost_slot_held_once_each_order_in_sequence(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    early = place_orders(database, 4)
    drain(database)  # on the bus: 4 events
    with connect(order_database) as connection:  # written and delivered hours ago
        connection.execute("UPDATE outbox SET created_at = created_at - interval '4 hours'")
    with database.transaction() as cursor:
        record_delivered_before(cursor, SLOT, 2 * 3600.0)  # the bound maintenance recorded: 2 h ago
    advance(database, early[:2])  # sequence 2 of two orders: in the slot, not delivered
    with connect(order_database) as connection:  # written before the bound, committed after it: the margin
        connection.execute("UPDATE outbox SET created_at = now() - interval '150 minutes' WHERE sequence = 2")
    drop_slot(order_database)  # lost
    advance(database, early[:2])  # sequence 3: committed while there was no slot at all
    late = place_orders(database, 1)
    with pytest.raises(ReplicationSlotLost):
        relay_round(database)
    assert maintain_order_store(database, SETTINGS, lambda: 60.0).slot_lost is True

    plan = recover_without_waiting(database, {})

    assert plan.dry_run
    assert not plan.complete
    assert plan.failed is None
    assert (plan.gap_rows, plan.expired, plan.parked_in_gap) == (5, 0, 0)
    assert plan.since_source is not None
    assert "less 1:00:00" in plan.since_source
    assert "create slot" in plan.messages[-1]
    assert state(database).exists is False  # a dry run changes nothing
    assert state(database).recovery_since is None

    run = recover_without_waiting(database, {"execute": True})

    assert run.failed is None
    assert run.gap_rows == 5
    assert [step.split(" ")[0] for step in run.done] == [
        "recorded",
        "holding",
        "created",
        "handed",
        "advanced",
    ]
    assert (run.republished, run.complete) == (False, False)  # the relay had not drained it yet
    assert maintain_order_store(database, SETTINGS, lambda: 60.0).slot_lost is False  # handed over
    drain(database)
    placed_after = place_orders(database, 1)  # the new slot carries what follows
    drain(database)

    done = recover_slot(database, SETTINGS, {"execute": True}, countdown(10.0))

    assert (done.republished, done.complete) == (True, True)
    assert state(database).describe() == "healthy"
    ids = outbox_ids(order_database)
    assert deliveries(recording_bus) == {event_id: 1 for event_id in ids.values()}  # each once
    assert_each_order_in_sequence(recording_bus, len(ids))
    assert {(o, s) for o, s, _ in recording_bus.accepted[4:]} == {
        *((o, s) for o in early[:2] for s in (2, 3)),
        (late[0], 1),
        (placed_after[0], 1),
    }


@pytest.mark.parametrize("moment", ["after-the-slot-is-created", "while-the-gap-is-handed-over"])
def test_a_row_committed_while_the_slot_is_recreated_goes_out_once_after_its_orders_earlier_events(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
):
    """The new slot decodes what commits after its creation, the first half of the hand-over misses what
    commits after its snapshot: the second half, under the outbox's lock, puts such a row in the gap's set
    too, the slot is moved past it, and it goes out once, after its order's earlier gap rows."""
    [order] = place_orders(database, 1)  # sequence 1: in the slot, not delivered
    drop_slot(order_database)
    step = "create_slot" if moment == "after-the-slot-is-created" else "start_gap_set"
    real_step = getattr(order_store_slot_recovery, step)
    writer = Database(order_database)

    def step_then_write(*args: Any, **kwargs: Any) -> Any:
        done = real_step(*args, **kwargs)
        advance(writer, [order])  # sequence 2, from another session, committed: in the new slot
        return done

    monkeypatch.setattr(order_store_slot_recovery, step, step_then_write)
    try:
        run = recover_without_waiting(database, {"execute": True})
    finally:
        writer.close()
    drain(database)

    assert run.failed is None
    assert "1 of them decoded by the new slot already" in run.done[3]
    assert recording_bus.sequences_by_order() == {order: [1, 2]}


def test_a_replay_whose_message_the_lost_slot_held_is_published_after_the_recovery(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A replay names its rows in a set (in the table) and activates it by a message in the log: a slot
    lost before it read the message would leave the set never activated. The recovery activates it."""
    place_orders(database, 1)
    drain(database)
    with connect(order_database) as connection:  # written long before the gap
        connection.execute("UPDATE outbox SET created_at = created_at - interval '5 hours'")
    with database.transaction() as cursor:
        record_delivered_before(cursor, SLOT, 2 * 3600.0)
    [event_id] = outbox_ids(order_database).values()
    replay = replay_order_store(database, SETTINGS, {"eventIds": [event_id]}, NO_TIME_LEFT)
    assert replay.selection.reset == [event_id]
    drop_slot(order_database)  # before the relay read the replay's message

    run = recover_without_waiting(database, {"execute": True})
    drain(database)

    assert run.gap_rows == 0
    assert len(run.sets_activated) == 1
    assert deliveries(recording_bus) == {event_id: 2}  # once before the loss, once replayed


def test_a_recovery_the_maintenance_function_finished_meanwhile_is_reported_republished(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    place_orders(database, 1)
    drop_slot(order_database)
    recover_without_waiting(database, {"execute": True})
    drain(database)
    real_finish = slot_recovery.finish_recovery_if_drained  # what the runtime module calls
    other = Database(order_database)

    def maintenance_first(cursor: psycopg.Cursor[Any], slot_name: str) -> bool:
        with other.transaction() as its_cursor:  # the scheduled maintenance, in its own invocation
            real_finish(its_cursor, slot_name)
        return real_finish(cursor, slot_name)  # nothing left to clear here

    monkeypatch.setattr(order_store_slot_recovery, "finish_recovery_if_drained", maintenance_first)
    try:
        again = recover_slot(database, SETTINGS, {"execute": True}, countdown(3.0))
    finally:
        other.close()

    assert (again.republished, again.complete) == (True, True)


def test_a_run_whose_recovery_another_run_recorded_again_does_not_report_the_gap_drained(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """Two recover-slot runs read the slot lost at the same moment: the second records the recovery again
    (begin_recovery: not handed over) after the first handed the gap over. The first has no say on what
    the second does: nothing is on the bus (the relay stops on an unfinished recovery)."""
    orders = place_orders(database, 3)
    drop_slot(order_database)
    since = datetime.now(UTC) - timedelta(days=1)
    other = Database(order_database)

    def second_run_begins(_: float) -> None:
        with other.transaction() as cursor:
            slot_recovery.begin_recovery(cursor, SLOT, since)

    try:
        first = recover_slot(database, SETTINGS, {"execute": True}, countdown(3.0), sleep=second_run_begins)
    finally:
        other.close()

    assert (first.failed, first.republished, first.complete) == (None, False, False)
    assert any("another recover-slot run" in message for message in first.messages)
    assert state(database).needs_recovery
    assert recording_bus.accepted == []
    second = recover_without_waiting(database, {"execute": True})  # the second run goes on
    drain(database)
    assert second.failed is None
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)


def test_a_gap_row_the_relay_parks_while_the_run_waits_is_named_and_the_recovery_is_not_complete(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    orders = place_orders(database, 2)
    drop_slot(order_database)
    poison = outbox_ids(order_database)[(orders[0], 1)]
    recording_bus.reject.add(poison)  # EventBridge refuses it for what it is: the relay parks it
    other = Database(order_database)

    def relay_rounds_meanwhile(_: float) -> None:
        drain_slot(other, SLOT, ListSink())

    try:
        run = recover_slot(
            database, SETTINGS, {"execute": True}, countdown(5.0), sleep=relay_rounds_meanwhile
        )
    finally:
        other.close()

    assert (run.republished, run.complete) == (True, False)
    assert run.parked_on_the_way == [poison]
    assert run.to_dict()["parkedOnTheWay"] == [poison]
    assert any("parked by the relay on the way" in message for message in run.messages)
    assert [o for o, _, _ in recording_bus.accepted] == [orders[1]]


def test_a_gap_row_parked_after_the_run_ended_is_named_by_the_next_run_whatever_maintenance_did_meanwhile(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """The relay drains a large gap after the run that handed it over ended; the maintenance function,
    each minute, clears a drained recovery with nothing to report, but leaves this one for the next run,
    which names the parked row once (the run after finds the slot healthy)."""
    orders = place_orders(database, 3)
    drop_slot(order_database)
    poison = outbox_ids(order_database)[(orders[1], 1)]
    recording_bus.reject.add(poison)
    handed = recover_without_waiting(database, {"execute": True})
    drain(database)

    maintain_order_store(database, SETTINGS, lambda: 60.0)
    assert state(database).recovery_since is not None  # still recorded
    assert state(database).describe().startswith("recovered, the gap drained")
    again = recover_slot(database, SETTINGS, {"execute": True}, countdown(5.0))
    after = recover_slot(database, SETTINGS, {"execute": True}, countdown(5.0))

    assert (handed.republished, handed.parked_on_the_way) == (False, [])
    assert (again.republished, again.parked_on_the_way, again.complete) == (True, [poison], False)
    assert again.replay_id == handed.replay_id
    assert (after.messages, after.complete) == (["the slot is healthy: nothing to recover"], True)
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted([orders[0], orders[2]])


def test_a_drained_recovery_left_for_its_report_does_not_hold_back_the_next_loss(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    """A recovery the maintenance function left recorded (a gap row parked on the way, not reported yet)
    is over: a later loss's gap starts at the bound the database recorded since, not at its start."""
    place_orders(database, 1)
    drop_slot(order_database)
    recording_bus.reject.update(outbox_ids(order_database).values())
    first = recover_without_waiting(database, {"execute": True})
    drain(database)
    maintain_order_store(database, SETTINGS, lambda: 60.0)  # records the bound; leaves the recovery
    assert state(database).recovery_since is not None
    drop_slot(order_database)  # lost again

    plan = recover_without_waiting(database, {})
    run = recover_without_waiting(database, {"execute": True})

    assert first.since is not None
    assert plan.since_source is not None
    assert "less 1:00:00" in plan.since_source
    assert run.since == plan.since != first.since
    assert state(database).recovery_drained is False


def test_recover_slot_replaces_an_invalidated_slot(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    orders = place_orders(database, 2)
    invalidate_slot(order_database)

    run = recover_without_waiting(database, {"execute": True})
    drain(database)

    assert run.failed is None
    assert "dropped slot" in run.done[2]
    assert "invalidated (idle_timeout)" in run.done[2]
    assert state(database).problem is None
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)


def test_a_recovery_stopped_half_way_is_reported_as_such_keeps_the_alarm_on_and_a_second_run_finishes_it(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    orders = place_orders(database, 3)
    drop_slot(order_database)

    def database_gone(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patch:
        patch.setattr(order_store_slot_recovery, "hand_over_gap", database_gone)
        stopped = recover_without_waiting(database, {"execute": True})

    assert stopped.failed is not None
    assert stopped.failed.startswith("hand the gap to the relay")
    assert "created slot" in " ".join(stopped.done)
    assert not stopped.complete
    assert maintain_order_store(database, SETTINGS, lambda: 60.0).slot_lost is True  # not handed over
    with pytest.raises(ReplicationSlotLost, match="recovery unfinished"):
        drain(database)  # the new slot holds what commits after it, not the gap: not read yet
    assert recording_bus.accepted == []

    again = recover_without_waiting(database, {"execute": True})
    drain(database)

    assert again.failed is None
    assert "exists already" in " ".join(again.done)
    assert sorted(o for o, _, _ in recording_bus.accepted) == sorted(orders)


def test_an_event_committed_after_a_recovery_stopped_half_way_waits_for_its_orders_earlier_event_in_the_gap(
    order_database: ConnectionSettings,
    database: Database,
    recording_bus: RecordingBus,
    slot: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """The recreated slot decodes sequence 2, committed after it; sequence 1 is in the gap, which only the
    recovery's hand-over names. Read before it, the slot would put 2 on the bus before 1."""
    [order] = place_orders(database, 1)  # sequence 1: in the lost slot, not delivered
    drop_slot(order_database)

    def database_gone(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patch:
        patch.setattr(order_store_slot_recovery, "hand_over_gap", database_gone)
        assert recover_slot(database, SETTINGS, {"execute": True}, NO_TIME_LEFT).failed is not None
    advance(database, [order])  # sequence 2: in the new slot
    with pytest.raises(ReplicationSlotLost):
        relay_round(database)  # a relay invocation meanwhile

    assert recover_without_waiting(database, {"execute": True}).failed is None
    drain(database)

    assert recording_bus.sequences_by_order() == {order: [1, 2]}


def a_lost_gap_with_an_expired_order(
    order_database: ConnectionSettings, database: Database
) -> tuple[str, str, str]:
    """Two orders, the first's rows written 20 days ago (before the republish window), then the slot lost:
    (old order, recent order, a --since 30 days ago that takes both into the gap)."""
    old, recent = place_orders(database, 2)
    with connect(order_database) as connection:
        connection.execute(
            "UPDATE outbox SET created_at = created_at - interval '20 days' WHERE aggregate_id = %s", (old,)
        )
    drop_slot(order_database)
    return old, recent, (datetime.now(UTC) - timedelta(days=30)).isoformat()


def test_gap_rows_older_than_the_republish_window_are_left_out_and_named_with_the_replay_that_sends_them(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    old, recent, since = a_lost_gap_with_an_expired_order(order_database, database)

    run = recover_without_waiting(database, {"execute": True, "since": since})
    drain(database)

    ids = outbox_ids(order_database)
    assert (run.gap_rows, run.expired, run.expired_ids) == (1, 1, [ids[(old, 1)]])
    assert run.since_source == "given by the operator"
    assert run.computed_since is not None
    assert any("replay --from" in m and "--include-expired" in m for m in run.messages)
    assert [o for o, _, _ in recording_bus.accepted] == [recent]
    # The maintenance function leaves the recovery for a run to report; the next run reports what its
    # hand-over left out, as the first did: drained, not complete.
    maintain_order_store(database, SETTINGS, lambda: 60.0)
    finished = recover_slot(database, SETTINGS, {"execute": True}, countdown(10.0))
    assert (finished.republished, finished.expired, finished.complete) == (True, 1, False)
    assert any("replay --from" in m and "--include-expired" in m for m in finished.messages)

    included = recover_without_waiting(database, {"since": since, "includeExpired": True})
    assert included.messages == ["the slot is healthy: nothing to recover"]


def test_the_release_before_migration_0006_can_still_clear_and_begin_a_recovery_it_knows_nothing_of(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus, slot: str
):
    # A rollback (or an earlier release deployed again) runs on the migrated database: migrations are never
    # reversed. Its statements set the recovery's columns and leave recovery_expired as it was.
    *_, since = a_lost_gap_with_an_expired_order(order_database, database)
    recover_without_waiting(database, {"execute": True, "since": since})  # expired: 1, recorded
    with connect(order_database) as connection:
        # the previous release's finish, then its begin (shop.adapters.postgres.slot_recovery at a59d80c)
        finished = connection.execute(
            "UPDATE outbox_slot SET recovery_since = NULL, recovery_started_at = NULL,"
            " recovery_handed_over_at = NULL, recovery_replay_id = NULL WHERE slot_name = %s",
            (slot,),
        )
        begun = connection.execute(
            "UPDATE outbox_slot SET recovery_since = clock_timestamp(),"
            " recovery_started_at = clock_timestamp(), recovery_handed_over_at = NULL,"
            " recovery_replay_id = NULL WHERE slot_name = %s",
            (slot,),
        )
        assert (finished.rowcount, begun.rowcount) == (1, 1)


# --- the functions and the operator's command ----------------------------------------------------------
def handler(name: str, directory: str) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    spec = FunctionSpec(name, ROOT / "functions" / directory, "app.lambda_handler", 60, {}, {})
    module = load_handler_module(spec)
    clear_module_caches(module)
    return module.lambda_handler  # type: ignore[no-any-return]


@pytest.fixture
def stack_slot(
    order_database: ConnectionSettings, template: Template, monkeypatch: pytest.MonkeyPatch, aws: None
) -> Iterator[str]:
    """The functions' environment as the template gives it with PostgresRelay=logical, and the outbox the
    logical relay's through the slot of the database they name."""
    environment = {**order_store_environment(order_database, template), "POSTGRES_RELAY": "logical"}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    reset_process_state()
    name = replication.slot_name(order_database.dbname)
    use_logical_relay(order_database, name)
    yield name
    use_polling_relay(order_database, name)


def test_the_publisher_function_logs_one_line_saying_the_slot_is_lost_and_fails(
    stack_slot: str, order_database: ConnectionSettings, caplog: pytest.LogCaptureFixture
):
    with connect(order_database) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (stack_slot,))

    with pytest.raises(ReplicationSlotLost):
        handler("OutboxPublisherFunction", "outbox_publisher")({}, LambdaContext(timeout_seconds=20))

    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert [record.getMessage() for record in errors] == ["replication slot lost"]  # once, nothing else
    [logged] = logged_with(caplog, "replication slot lost")
    assert (logged["slot"], logged["slot_state"], logged["runbook"]) == (stack_slot, "missing", RUNBOOK)
    assert "recover-slot" in logged["error"]


def test_the_maintenance_function_reports_replication_slot_lost_0_then_1(
    stack_slot: str, order_database: ConnectionSettings, capsys: pytest.CaptureFixture[str]
):
    maintenance = handler("OrderStoreMaintenanceFunction", "order_store_maintenance")
    maintenance({}, LambdaContext())
    assert metric_values(capsys.readouterr().out, "ReplicationSlotLost") == [0]
    with connect(order_database) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (stack_slot,))

    report = maintenance({}, LambdaContext())

    assert metric_values(capsys.readouterr().out, "ReplicationSlotLost") == [1]
    assert (report["slot_lost"], report["slot_state"]) == (True, "missing")


def test_the_maintenance_function_recovers_the_slot_when_asked_and_refuses_a_malformed_request(
    stack_slot: str, order_database: ConnectionSettings, database: Database
):
    place_orders(database, 1)
    with connect(order_database) as connection:
        connection.execute("SELECT pg_drop_replication_slot(%s)", (stack_slot,))
    maintenance = handler("OrderStoreMaintenanceFunction", "order_store_maintenance")

    plan = maintenance({"recoverSlot": {}}, LambdaContext())
    run = maintenance({"recoverSlot": {"execute": True}}, LambdaContext(timeout_seconds=6))
    refused = maintenance({"recoverSlot": {"since": "tomorrow"}}, LambdaContext())

    assert (plan["dryRun"], plan["gapRows"], plan["state"]) == (True, 1, "missing")
    assert (run["dryRun"], run["failed"], run["gapRows"]) == (False, None, 1)
    assert "health" not in run  # a recovery runs no maintenance
    assert refused["error"]["code"] == "INVALID_RECOVER_SLOT_REQUEST"
    with connect(order_database) as connection:
        assert replication.slot_exists(connection, stack_slot)


def test_the_maintenance_function_answers_the_parked_row_commands_and_refuses_a_malformed_one(
    stack_slot: str, order_database: ConnectionSettings, database: Database
):
    """The operator's redrive-poison and discard-poison reach the database through the same function
    (tests/unit/test_parked_rows.py covers what they do)."""
    maintenance = handler("OrderStoreMaintenanceFunction", "order_store_maintenance")
    place_orders(database, 1)
    [event_id] = outbox_ids(order_database).values()
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox SET parked_at = now(), last_error = 'poison'")

    discard = maintenance(
        {"discardParked": {"eventIds": [event_id], "by": "op", "reason": "a test", "execute": True}},
        LambdaContext(),
    )
    redrive = maintenance({"redriveParked": {"eventIds": [event_id, "no-such-event"]}}, LambdaContext())
    refused = maintenance({"discardParked": {"eventIds": [event_id]}}, LambdaContext())

    assert (discard["discarded"], discard["complete"]) == ([event_id], True)
    assert (redrive["relay"], redrive["discarded"], redrive["missing"]) == (
        "logical",
        [event_id],
        ["no-such-event"],
    )
    assert refused["error"]["code"] == "INVALID_PARKED_REQUEST"
    assert "health" not in redrive


def test_the_recover_slot_command_is_a_dry_run_unless_executed_and_exits_0_only_when_complete(
    lambda_stub: Callable[..., LambdaStub], capsys: pytest.CaptureFixture[str]
):
    base = ["recover-slot", "--order-store-function", "maintenance"]
    stub = lambda_stub({"dryRun": True, "failed": None, "complete": False})

    assert outbox_admin(base) == 0
    assert stub.requests == [("maintenance", {"recoverSlot": {"execute": False, "includeExpired": False}})]
    assert json.loads(capsys.readouterr().out)["store"] == "postgres"

    stub = lambda_stub({"dryRun": False, "failed": None, "republished": False, "complete": False})
    assert outbox_admin([*base, "--execute", "--since", "2026-11-26T10:00:00Z", "--include-expired"]) == 1
    assert stub.requests[0][1] == {
        "recoverSlot": {"execute": True, "includeExpired": True, "since": "2026-11-26T10:00:00Z"}
    }
    lambda_stub({"dryRun": False, "failed": None, "republished": True, "complete": True})
    assert outbox_admin([*base, "--execute"]) == 0
    lambda_stub({"dryRun": True, "failed": "relay switch under way", "complete": False})
    assert outbox_admin(base) == 1
    lambda_stub({"errorMessage": "boom"}, function_error=True)
    assert outbox_admin([*base, "--execute"]) == 1
    lambda_stub({"error": {"code": "INVALID_RECOVER_SLOT_REQUEST", "message": "since is in the future"}})
    assert outbox_admin([*base, "--since", "2099-01-01T00:00:00Z"]) == 1
    assert "since is in the future" in capsys.readouterr().err


@pytest.mark.parametrize("since", ["2026-11-26T10:00:00", "0001-01-01T00:00:00+01:00"])
def test_the_recover_slot_command_refuses_a_since_it_cannot_use_naming_the_option(
    lambda_stub: Callable[..., LambdaStub], since: str
):
    stub = lambda_stub({"dryRun": True, "failed": None, "complete": False})

    with pytest.raises(SystemExit, match=re.escape(f"--since '{since}' is not an RFC 3339 time")):
        outbox_admin(["recover-slot", "--order-store-function", "maintenance", "--since", since])

    assert stub.requests == []


def test_a_recovery_request_whose_since_utc_cannot_hold_is_refused_and_changes_nothing(
    order_database: ConnectionSettings, database: Database, slot: str
):
    drop_slot(order_database)

    with pytest.raises(order_store_slot_recovery.SlotRecoveryRequestError, match="out of range in UTC"):
        recover_slot(
            database, SETTINGS, {"since": "0001-01-01T00:00:00+01:00", "execute": True}, NO_TIME_LEFT
        )

    assert state(database).recovery_since is None


@pytest.mark.parametrize("database_mode", ["polling", "logical"])
def test_a_publisher_left_with_the_other_relays_configuration_ends_its_invocation_saying_so(
    stack_slot: str,
    order_database: ConnectionSettings,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    recording_bus: RecordingBus,
    database: Database,
    database_mode: str,
):
    """A deploy switching the relay updates the database before the function: an environment still running
    the old PostgresRelay meanwhile publishes nothing, and says so in one line and a metric, without
    failing (a failure would be retried into the same configuration and raise the errors alarm on every
    switch)."""
    running = "logical" if database_mode == "polling" else "polling"
    monkeypatch.setenv("POSTGRES_RELAY", running)
    reset_process_state()
    place_orders(database, 1)
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = %s", (database_mode,))

    answer = handler("OutboxPublisherFunction", "outbox_publisher")({}, LambdaContext(timeout_seconds=20))

    assert answer == {"relayModeMismatch": {"runningAs": running, "outboxRelayMode": database_mode}}
    assert recording_bus.accepted == []
    [logged] = logged_with(caplog, "relay switched: this configuration publishes nothing")
    assert (logged["running_as"], logged["outbox_relay_mode"]) == (running, database_mode)
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
