"""Parked outbox rows of the PostgreSQL store as evidence, on a real PostgreSQL: retention keeps them until
an operator redrives or discards them (who and why recorded); a parked row too large for a poison queue
message (the message holds only its key) is redriven from the database under both relays; and the
operator's commands that reach the database through the maintenance function.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from operations.admin import main as outbox_admin
from operations.recovery import OutboxRecovery
from shop.adapters.poison_queue import checked_poison_message, poison_message_body
from shop.adapters.postgres import replication
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.domain.envelope import CloudEvent
from shop.runtime.config import Settings
from shop.runtime.order_store_maintenance import maintain_order_store
from shop.runtime.order_store_poison import (
    ParkedRequestError,
    discard_parked_rows,
    redrive_parked_rows,
)
from tests.support.lambda_client import LambdaStub
from tests.support.postgres import connect, place_orders, use_logical_relay, use_polling_relay
from tests.support.publishing import ListSink, RecordingBus, logical_round, polling_round, publisher

POLLING = Settings.from_env({"OUTBOX_TTL_DAYS": "16", "DATABASE_NAME": "parked_tests"})
LOGICAL = Settings.from_env(
    {"OUTBOX_TTL_DAYS": "16", "DATABASE_NAME": "parked_tests", "POSTGRES_RELAY": "logical"}
)
SLOT = replication.slot_name("parked_tests")


def countdown(seconds: float) -> Callable[[], float]:
    """An invocation's time left: `seconds` plus the functions' 5 s reserve, running out in real time (a
    broken wait ends the test instead of hanging it)."""
    deadline = time.monotonic() + seconds + 5.0
    return lambda: deadline - time.monotonic()


@pytest.fixture(params=["polling", "logical"])
def relay(request: pytest.FixtureRequest, order_database: ConnectionSettings) -> Iterator[str]:
    """The outbox the polling publisher's, or the logical relay's through a fresh slot."""
    if request.param == "logical":
        use_logical_relay(order_database, SLOT)
    yield str(request.param)
    if request.param == "logical":
        use_polling_relay(order_database, SLOT)


def settings_of(relay: str) -> Settings:
    return LOGICAL if relay == "logical" else POLLING


def publish_round(relay: str, database: Database, sink: ListSink) -> Any:
    if relay == "logical":
        return logical_round(database, SLOT, sink)
    return polling_round(database, sink)


def drain(relay: str, database: Database, sink: ListSink) -> None:
    while (outcome := publish_round(relay, database, sink)).taken or outcome.backlog:
        pass


class RunningPublisher:
    """The stack's publisher (polling or logical) running beside an operator's command, with its own
    connection, until the block ends."""

    def __init__(self, relay: str, settings: ConnectionSettings, sink: ListSink) -> None:
        self.relay, self.database, self.sink = relay, Database(settings), sink
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            drain(self.relay, self.database, self.sink)
            self.stop.wait(0.05)

    def __enter__(self) -> RunningPublisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.database.close()


def large_event(order_id: str) -> CloudEvent:
    """An event the bus takes (under 256 KiB) whose poison message would not fit a queue message: the
    envelope, escaped inside the message's JSON, grows past 256 KiB."""
    return CloudEvent.new(
        source="shop.orders",
        type="OrderNoted",
        subject=order_id,
        sequence=1,
        data={"orderId": order_id, "lines": ['"'] * 52_000},
        correlation_id="corr",
    )


def write(settings: ConnectionSettings, event: CloudEvent) -> None:
    from shop.adapters.postgres.outbox import insert_outbox_row

    with connect(settings) as connection, connection.transaction(), connection.cursor() as cursor:
        insert_outbox_row(cursor, event, max_event_bytes=POLLING.max_event_bytes, trace_header=None)


def row(settings: ConnectionSettings, event_id: str) -> dict[str, Any]:
    with connect(settings) as connection, connection.cursor() as cursor:
        cursor.execute(
            "SELECT parked_at, published_at, redriven_at, discarded_at, discarded_by, discard_reason"
            " FROM outbox WHERE event_id = %s",
            (event_id,),
        )
        found = cursor.fetchone()
        assert found is not None
        names = [column.name for column in cursor.description or []]
    return dict(zip(names, found, strict=True))


def park_large_event(relay: str, settings: ConnectionSettings, database: Database, bus: RecordingBus) -> str:
    """The bus refuses a large event: the publisher parks it, and its poison message holds only its key."""
    event = large_event("order-large")
    bus.reject = {event.id}
    write(settings, event)
    sink = ListSink()
    drain(relay, database, sink)
    [record] = sink.parked
    body = json.loads(poison_message_body(record))
    assert "item" not in body
    assert body["key"]["store"] == "postgres"
    assert body["key"]["eventId"] == event.id
    assert row(settings, event.id)["parked_at"] is not None
    bus.reject = set()  # the cause fixed
    return event.id


# --- retention ------------------------------------------------------------------------------------------
def age(settings: ConnectionSettings, sql: str, order_id: str) -> None:
    with connect(settings) as connection:
        connection.execute(f"UPDATE outbox SET {sql} WHERE aggregate_id = %s", (order_id,))  # noqa: S608


def test_retention_keeps_parked_rows_until_an_operator_redrives_or_discards_them(
    order_database: ConnectionSettings, database: Database, relay: str, recording_bus: RecordingBus
):
    parked, discarded_long_ago, discarded_now, redriven, done = place_orders(database, 5)
    drain(relay, database, ListSink())
    old = "created_at = created_at - interval '30 days'"
    for order_id in (parked, discarded_long_ago, discarded_now, redriven, done):
        age(order_database, old, order_id)
    park = "published_at = NULL, parked_at = now() - interval '29 days', last_error = 'poison'"
    for order_id in (parked, discarded_long_ago, discarded_now):
        age(order_database, park, order_id)
    age(order_database, "published_at = now() - interval '29 days'", done)
    discard = "discarded_by = 'arn:aws:iam::1:user/op', discard_reason = 'a test order'"
    age(order_database, f"discarded_at = now() - interval '17 days', {discard}", discarded_long_ago)
    age(order_database, f"discarded_at = now() - interval '1 day', {discard}", discarded_now)
    # Redriven yesterday: published again (polling), or replayed (logical), a day ago.
    age(
        order_database,
        "redriven_at = now() - interval '1 day', published_at = now() - interval '1 day'",
        redriven,
    )

    report = maintain_order_store(database, settings_of(relay), lambda: 60.0)

    with connect(order_database) as connection:
        kept = {order_id for (order_id,) in connection.execute("SELECT aggregate_id FROM outbox").fetchall()}
    assert kept == {parked, discarded_now, redriven}
    assert report.outbox_rows_deleted == 2
    assert report.health is not None
    assert report.health.parked == 1


# --- redrive of a parked row too large for a poison message ------------------------------------------
def test_a_parked_row_too_large_for_its_poison_message_is_redriven_from_the_database_under_either_relay(
    order_database: ConnectionSettings, database: Database, relay: str, recording_bus: RecordingBus
):
    event_id = park_large_event(relay, order_database, database, recording_bus)
    if relay == "logical":
        # What the runbook said before: clear parked_at and the publisher sends it. The logical relay
        # reads its slot, not the table: nothing is sent, ever.
        with connect(order_database) as connection:
            connection.execute("UPDATE outbox SET parked_at = NULL WHERE event_id = %s", (event_id,))
        drain(relay, database, ListSink())
        assert event_id not in {e for _, _, e in recording_bus.accepted}

    with RunningPublisher(relay, order_database, ListSink()):
        report = redrive_parked_rows(database, settings_of(relay), {"eventIds": [event_id]}, countdown(10.0))

    assert report.to_dict() | {"messages": []} == {
        "relay": relay,
        "republished": [event_id],
        "parkedAgain": [],
        "pending": [],
        "discarded": [],
        "missing": [],
        "messages": [],
        "complete": True,
    }
    assert [e for _, _, e in recording_bus.accepted] == [event_id]
    state = row(order_database, event_id)
    assert state["parked_at"] is None
    assert state["redriven_at"] is not None


def test_a_redriven_row_that_is_still_poison_is_parked_again_and_said_so(
    order_database: ConnectionSettings, database: Database, relay: str, recording_bus: RecordingBus
):
    event_id = park_large_event(relay, order_database, database, recording_bus)
    recording_bus.reject = {event_id}  # not fixed after all
    sink = ListSink()

    with RunningPublisher(relay, order_database, sink):
        report = redrive_parked_rows(database, settings_of(relay), {"eventIds": [event_id]}, countdown(10.0))

    assert (report.parked_again, report.republished, report.complete) == ([event_id], [], False)
    assert [record.event_id for record in sink.parked] == [event_id]  # a new poison message
    assert row(order_database, event_id)["parked_at"] is not None
    assert recording_bus.accepted == []


def test_a_redrive_that_runs_out_of_time_says_the_row_is_pending_and_a_second_run_confirms_it(
    order_database: ConnectionSettings, database: Database, relay: str, recording_bus: RecordingBus
):
    event_id = park_large_event(relay, order_database, database, recording_bus)

    first = redrive_parked_rows(database, settings_of(relay), {"eventIds": [event_id]}, lambda: 0.0)

    assert (first.pending, first.complete) == ([event_id], False)
    with RunningPublisher(relay, order_database, ListSink()):
        second = redrive_parked_rows(database, settings_of(relay), {"eventIds": [event_id]}, countdown(10.0))
    assert (second.republished, second.complete) == ([event_id], True)
    assert event_id in {e for _, _, e in recording_bus.accepted}


# --- discard ----------------------------------------------------------------------------------------------
def test_discard_records_who_and_why_on_parked_rows_only_and_a_dry_run_changes_nothing(
    order_database: ConnectionSettings, database: Database, recording_bus: RecordingBus
):
    parked, pending = place_orders(database, 2)
    age(order_database, "parked_at = now(), last_error = 'poison'", parked)
    with connect(order_database) as connection:
        ids: dict[str, str] = dict(connection.execute("SELECT aggregate_id, event_id FROM outbox").fetchall())
    request = {
        "eventIds": [ids[parked], ids[pending], "no-such-event"],
        "by": "arn:aws:iam::1:user/op",
        "reason": "test order",
    }

    dry = discard_parked_rows(database, request)

    assert (dry.dry_run, dry.discarded, dry.not_parked, dry.missing) == (
        True,
        [ids[parked]],
        [ids[pending]],
        ["no-such-event"],
    )
    assert row(order_database, ids[parked])["discarded_at"] is None
    done = discard_parked_rows(database, {**request, "execute": True})
    assert done.discarded == [ids[parked]]
    assert not done.complete
    state = row(order_database, ids[parked])
    assert (state["discarded_by"], state["discard_reason"]) == ("arn:aws:iam::1:user/op", "test order")
    assert state["discarded_at"] is not None
    assert state["parked_at"] is not None
    assert row(order_database, ids[pending])["discarded_at"] is None
    again = discard_parked_rows(database, {**request, "eventIds": [ids[parked]], "execute": True})
    assert (again.already_discarded, again.discarded, again.complete) == ([ids[parked]], [], True)

    redrive = redrive_parked_rows(database, POLLING, {"eventIds": [ids[parked]]}, lambda: 0.0)
    assert (redrive.discarded, redrive.complete) == ([ids[parked]], False)  # never redriven
    assert row(order_database, ids[parked])["parked_at"] is not None


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({}, "eventIds must be"),
        ({"eventIds": []}, "eventIds must be"),
        ({"eventIds": ["e"], "by": "op"}, "reason"),
        ({"eventIds": ["e"], "reason": "why"}, "by"),
        ({"eventIds": ["e"] * 101, "by": "op", "reason": "why"}, "at most 100"),
    ],
)
def test_a_malformed_discard_changes_nothing_and_says_why(
    order_database: ConnectionSettings, database: Database, request_body: dict[str, Any], message: str
):
    with pytest.raises(ParkedRequestError, match=message):
        discard_parked_rows(database, request_body)


# --- the operator's side: redrive-poison and discard-poison ------------------------------------------
def answering(**answer: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    base = {
        "relay": "logical",
        "republished": [],
        "parkedAgain": [],
        "pending": [],
        "discarded": [],
        "missing": [],
    }
    requests: list[dict[str, Any]] = []

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        return {**base, **answer}

    ask.requests = requests  # type: ignore[attr-defined]
    return ask


def key_only_message(event_id: str) -> dict[str, Any]:
    return checked_poison_message(
        {
            "kind": "outbox-poison",
            "eventId": event_id,
            "key": {"store": "postgres", "position": 7, "eventId": event_id},
            "itemOmitted": "larger than one queue message",
        }
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"republished": ["e-7"]}, {"published": 1, "complete": True, "all_on_bus": True}),
        ({"parkedAgain": ["e-7"]}, {"poison": ["e-7"], "complete": True, "all_on_bus": False}),
        ({"discarded": ["e-7"]}, {"discarded": ["e-7"], "complete": True, "all_on_bus": True}),
        ({"pending": ["e-7"]}, {"unpublished": ["e-7"], "complete": False, "all_on_bus": False}),
        ({"missing": ["e-7"]}, {"found": 0, "complete": False, "all_on_bus": False}),
    ],
)
def test_redrive_poison_redrives_a_postgres_row_through_the_order_store_and_reports_what_it_answered(
    recording_bus: RecordingBus, answer: dict[str, Any], expected: dict[str, Any]
):
    ask = answering(**answer)
    recovery = OutboxRecovery(
        publisher(),
        ListSink(),
        max_event_bytes=POLLING.max_event_bytes,
        time_shards=4,
        ttl_days=16,
        order_store=ask,
    )

    report = recovery.redrive_parked(key_only_message("e-7"))

    assert ask.requests == [{"redriveParked": {"eventIds": ["e-7"]}}]  # type: ignore[attr-defined]
    for name, value in expected.items():
        assert getattr(report, name) == value, name
    assert recording_bus.accepted == []  # the database's publisher sends it, not the command


def test_without_the_order_store_a_key_only_message_is_kept_and_says_how_to_redrive_it(recording_bus):
    recovery = OutboxRecovery(
        publisher(), ListSink(), max_event_bytes=POLLING.max_event_bytes, time_shards=4, ttl_days=16
    )

    report = recovery.redrive_parked(key_only_message("e-7"))

    assert not report.complete
    assert "--order-store-function" in report.missing[0]


def test_redrive_poison_by_event_id_asks_the_maintenance_function_and_exits_0_only_when_on_the_bus(
    lambda_stub: Callable[[dict[str, Any]], LambdaStub], capsys: pytest.CaptureFixture[str]
):
    stub = lambda_stub({"republished": ["e1"], "complete": True})
    argv = ["redrive-poison", "--order-store-function", "maintenance", "--event-id", "e1"]

    assert outbox_admin(argv) == 0
    assert stub.requests == [("maintenance", {"redriveParked": {"eventIds": ["e1"]}})]
    assert json.loads(capsys.readouterr().out)["republished"] == ["e1"]
    lambda_stub({"pending": ["e1"], "complete": False})
    assert outbox_admin(argv) == 1
    with pytest.raises(SystemExit, match="--order-store-function"):
        outbox_admin(["redrive-poison", "--event-id", "e1"])


def test_redrive_poison_deletes_a_key_only_message_once_its_row_is_back_on_the_bus(
    aws: None,
    poison_queue: Callable[[], list[dict[str, Any]]],
    lambda_stub: Callable[..., LambdaStub],
    template: Any,
):
    queue_url = template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(key_only_message("e-7")))
    stub = lambda_stub({"republished": ["e-7"], "complete": True})
    argv = ["--bus", template.physical_name("EventBus"), "--poison-queue-url", queue_url, "redrive-poison"]

    code = outbox_admin([*argv, "--order-store-function", "maintenance"])

    assert code == 0
    assert stub.requests == [("maintenance", {"redriveParked": {"eventIds": ["e-7"]}})]
    assert poison_queue() == []  # deleted


def test_discard_poison_is_a_dry_run_unless_executed_and_records_the_callers_identity(
    aws: None, lambda_stub: Callable[[dict[str, Any]], LambdaStub], capsys: pytest.CaptureFixture[str]
):
    stub = lambda_stub({"dryRun": True, "discarded": ["e1"], "complete": True})
    argv = ["discard-poison", "e1", "--reason", "a test order", "--order-store-function", "maintenance"]

    assert outbox_admin(argv) == 0
    [(_, request)] = stub.requests
    identity = boto3.client("sts").get_caller_identity()["Arn"]
    assert request == {
        "discardParked": {"eventIds": ["e1"], "reason": "a test order", "by": identity, "execute": False}
    }
    assert "dry run" in capsys.readouterr().err
    stub = lambda_stub({"dryRun": False, "discarded": [], "notParked": ["e1"], "complete": False})
    assert outbox_admin([*argv, "--execute"]) == 1
    assert stub.requests[0][1]["discardParked"]["execute"] is True
