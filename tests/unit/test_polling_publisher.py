"""The polling publisher against a real PostgreSQL (tests/support/postgres.py) and a recording bus.

The bus is the EventPublisher's own PutEvents client replaced by a thread-safe recorder (moto's is not
made for concurrent callers): what these tests check is the order in which events reach the bus, the
rows' publishing state, and what is parked, with several publishers running at once.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from shop.adapters import aws
from shop.adapters.eventbridge import EventPublisher
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.adapters.postgres.outbox import claim_pending, mark_published
from shop.domain.errors import ServiceBusy
from shop.domain.orders import OrderService, OrderStatus
from shop.domain.poison import PoisonRecord
from shop.runtime.config import Settings
from shop.runtime.polling_publisher import (
    RESERVE_SECONDS,
    RoundOutcome,
    poll_outbox,
    publish_pending_round,
)
from tests.support.postgres import connect, place_orders

SETTINGS = Settings.from_env({})


@dataclass
class RecordingBus:
    """PutEvents as EventBridge answers it: entries accepted in call order, some answered as throttled.

    throttle_probability: each entry is answered ThrottlingException with this probability.
    throttle_always:      event ids answered ThrottlingException every time.
    reject:               event ids refused for what they are (InvalidArgument).
    crash_after_calls:    after this many calls were accepted, the next call's entries reach the bus and
                          then the caller crashes (RuntimeError), before it could commit.
    """

    throttle_probability: float = 0.0
    throttle_always: set[str] = field(default_factory=set)
    reject: set[str] = field(default_factory=set)
    crash_after_calls: int | None = None
    seed: int = 7
    accepted: list[tuple[str, int, str]] = field(default_factory=list)  # (order id, sequence, event id)
    calls: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(self.seed)

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        with self._lock:
            self.calls += 1
            for entry in Entries:
                event = json.loads(entry["Detail"])
                if event["id"] in self.reject:
                    results.append({"ErrorCode": "InvalidArgument", "ErrorMessage": "injected"})
                elif event["id"] in self.throttle_always or self._random.random() < self.throttle_probability:
                    results.append({"ErrorCode": "ThrottlingException", "ErrorMessage": "injected"})
                else:
                    self.accepted.append((event["subject"], event["sequence"], event["id"]))
                    results.append({"EventId": event["id"]})
            crash = self.crash_after_calls is not None and self.calls > self.crash_after_calls
            if crash:
                self.crash_after_calls = None
        if crash:
            raise RuntimeError("publisher crashed after PutEvents, before COMMIT")
        failed = sum(1 for result in results if "ErrorCode" in result)
        return {"FailedEntryCount": failed, "Entries": results}

    def sequences_by_order(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for order_id, sequence, _ in self.accepted:
            out.setdefault(order_id, []).append(sequence)
        return out


class ListSink:
    def __init__(self, fail: bool = False) -> None:
        self.parked: list[PoisonRecord] = []
        self.fail = fail

    def park(self, record: PoisonRecord) -> None:
        if self.fail:
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="https://sqs.invalid")
        self.parked.append(record)


@pytest.fixture
def bus(monkeypatch: pytest.MonkeyPatch) -> RecordingBus:
    recording = RecordingBus()
    monkeypatch.setattr(aws, "events", lambda: recording)
    return recording


def publisher() -> EventPublisher:
    return EventPublisher("orders-bus", SETTINGS.max_event_bytes, sleep=lambda _: None)


def run_round(database: Database, sink: ListSink | None = None, max_orders: int = 50) -> RoundOutcome:
    return publish_pending_round(
        database,
        publisher(),
        sink if sink is not None else ListSink(),
        max_event_bytes=SETTINGS.max_event_bytes,
        max_orders=max_orders,
    )


def advance(database: Database, order_ids: Iterable[str]) -> None:
    """Each order's next events: confirmed, then cancelled (sequences 2 and 3)."""
    service = OrderService(PostgresOrderRepository(database, SETTINGS), SETTINGS)
    for order_id in order_ids:
        order = service.get_order(order_id)
        if order.status is OrderStatus.PENDING:
            cause = order.event("InventoryReserved", "corr")
            service.apply_inventory_outcome(order_id, OrderStatus.CONFIRMED, cause)
        elif order.status is OrderStatus.CONFIRMED:
            service.cancel_order(order_id, correlation_id="corr")


def pending_rows(settings: ConnectionSettings) -> list[tuple[str, int, int, str | None]]:
    with connect(settings) as connection:
        return connection.execute(
            "SELECT aggregate_id, sequence, attempts, last_error FROM outbox"
            " WHERE published_at IS NULL AND parked_at IS NULL ORDER BY aggregate_id, sequence"
        ).fetchall()


def assert_each_order_in_sequence(bus: RecordingBus, expected_events: int) -> None:
    """No event reaches the bus before its order's earlier events first did; each event arrived."""
    for order_id, sequences in bus.sequences_by_order().items():
        first_seen: list[int] = []
        for sequence in sequences:
            if sequence not in first_seen:
                first_seen.append(sequence)
        assert first_seen == list(range(1, len(first_seen) + 1)), (order_id, sequences)
    assert len({event_id for _, _, event_id in bus.accepted}) == expected_events


# --- several publishers at once ---------------------------------------------------------------------------
@pytest.mark.parametrize("publishers", [2, 4])
def test_publishers_running_at_once_keep_each_orders_sequence_on_the_bus(
    order_database: ConnectionSettings, database: Database, bus: RecordingBus, publishers: int
):
    """Orders keep changing while several publishers claim and publish; a third of the entries are
    throttled (some beyond the publisher's retries), so rounds stop part-way and others take over."""
    bus.throttle_probability = 0.35
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
                idle_rounds = idle_rounds + 1 if writers_done.is_set() and not outcome.claimed else 0
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

    assert_each_order_in_sequence(bus, expected_events=40 * 3)
    assert sorted(bus.sequences_by_order()[orders[0]]) == [1, 2, 3]
    assert len(bus.accepted) == 40 * 3  # no crash: nothing was published twice


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


def test_a_crash_between_put_events_and_commit_republishes_the_round_in_order(
    order_database: ConnectionSettings, database: Database, bus: RecordingBus
):
    orders = place_orders(database, 12)
    advance(database, orders)
    bus.crash_after_calls = 1

    with pytest.raises(RuntimeError, match="before COMMIT"):
        run_round(database)
    assert len(pending_rows(order_database)) == 24  # rolled back: every row still pending
    while pending_rows(order_database):
        run_round(database)

    assert_each_order_in_sequence(bus, expected_events=24)
    assert len(bus.accepted) > 24  # the crashed call's events reached the bus twice


# --- failures ---------------------------------------------------------------------------------------------
def test_a_throttled_event_stops_the_round_there_with_its_attempt_recorded(
    order_database: ConnectionSettings, database: Database, bus: RecordingBus
):
    first, second = place_orders(database, 2)
    advance(database, [first, second])
    bus.throttle_always = {event_id_of(order_database, first, 1)}

    outcome = run_round(database)

    # The first call held both orders' first events: the other order's went out, then nothing more
    # (publishing stops at the first failure that remains, as the stream relay checkpoints there).
    assert bus.sequences_by_order() == {second: [1]}
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

    bus.throttle_always = set()
    run_round(database)
    assert bus.sequences_by_order() == {second: [1, 2], first: [1, 2]}


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
    order_database: ConnectionSettings, database: Database, bus: RecordingBus
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
    assert bus.sequences_by_order() == {order_id: [2]}
    assert pending_rows(order_database) == []


def test_when_the_poison_queue_fails_the_poison_row_and_its_orders_later_events_stay_pending(
    order_database: ConnectionSettings, database: Database, bus: RecordingBus
):
    poisoned, healthy = place_orders(database, 2)
    advance(database, [poisoned, healthy])
    make_unreadable(order_database, poisoned, 1, "[]")

    outcome = run_round(database, ListSink(fail=True))

    assert outcome.parked == []
    assert bus.sequences_by_order() == {healthy: [1, 2]}
    assert [(order_id, sequence) for order_id, sequence, _, _ in pending_rows(order_database)] == [
        (poisoned, 1),
        (poisoned, 2),
    ]


def test_an_entry_the_bus_rejects_is_parked_and_its_order_moves_on(
    order_database: ConnectionSettings, database: Database, bus: RecordingBus
):
    (order_id,) = place_orders(database, 1)
    advance(database, [order_id])
    rejected = event_id_of(order_database, order_id, 1)
    bus.reject = {rejected}
    sink = ListSink()

    run_round(database, sink)

    assert [record.event_id for record in sink.parked] == [rejected]
    assert "InvalidArgument" in sink.parked[0].reason
    assert bus.sequences_by_order() == {order_id: [2]}
    with connect(order_database) as connection:
        parked = connection.execute("SELECT event_id FROM outbox WHERE parked_at IS NOT NULL").fetchall()
    assert parked == [(rejected,)]


# --- the polling loop -------------------------------------------------------------------------------------
def test_the_loop_polls_until_the_invocations_last_seconds_and_rides_out_a_database_outage():
    clock = iter([30.0, 20.0, 10.0, RESERVE_SECONDS + 0.5, RESERVE_SECONDS])
    pauses: list[float] = []
    rounds: Iterator[RoundOutcome | ServiceBusy] = iter(
        [ServiceBusy("down"), RoundOutcome(claimed=3), RoundOutcome()]
    )

    def next_round() -> RoundOutcome:
        outcome = next(rounds, RoundOutcome())
        if isinstance(outcome, ServiceBusy):
            raise outcome
        return outcome

    totals = poll_outbox(next_round, lambda: next(clock), sleep=pauses.append)

    assert totals.database_unavailable == 1
    assert totals.rounds == 3
    assert pauses[0] == 1.0  # after the outage
    assert pauses[1] == 1.0  # claimed 3, published none: the bus is failing, pause
    assert pauses[2:] == [0.2, 0.2]  # idle


def test_an_unreachable_database_is_service_busy(tmp_path, bus: RecordingBus):
    unreachable = Database(ConnectionSettings(str(tmp_path), 5432, "postgres", "postgres", lambda _: None))

    with pytest.raises(ServiceBusy):
        run_round(unreachable)
