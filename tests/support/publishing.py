"""What the publishers' tests (polling and logical) share: a bus that records what PutEvents accepted, in
order, and can throttle, reject or crash; a poison sink in a list; one round of each publisher; an order's
next events; and the check that each order's events reached the bus in sequence."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.adapters.postgres.outbox import OutboxRow
from shop.domain.orders import OrderService, OrderStatus
from shop.domain.poison import PoisonRecord
from shop.runtime.config import Settings
from shop.runtime.logical_relay import MAX_CHANGES_PER_ROUND, relay_slot_round
from shop.runtime.outbox_publishing import PublishOutcome
from shop.runtime.polling_publisher import MAX_ORDERS_PER_ROUND, publish_pending_round

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


class SlowFailingSink:
    """The poison queue unreachable: each park takes the SQS client's worst case (its attempts and
    timeouts) on `clock` (seconds used of the invocation), then fails."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.calls = 0

    def park(self, record: PoisonRecord) -> None:
        from botocore.exceptions import EndpointConnectionError

        from shop.adapters import aws

        self.calls += 1
        self.clock[0] += aws.longest_call_seconds()
        raise EndpointConnectionError(endpoint_url="https://sqs.invalid")


def publisher() -> EventPublisher:
    """The publisher as deployed: its calls in flight at once (the default of PUBLISH_CONCURRENCY)."""
    return EventPublisher(
        "orders-bus",
        SETTINGS.max_event_bytes,
        max_in_flight=SETTINGS.publish_concurrency,
        sleep=lambda _: None,
    )


def logical_round(
    database: Database, slot: str, sink: ListSink | None = None, max_changes: int = MAX_CHANGES_PER_ROUND
) -> PublishOutcome[OutboxRow]:
    """One round of the logical relay on `slot` with publisher(), parking in `sink` (a fresh one unless
    given): what the publisher function runs, without the function."""
    return relay_slot_round(
        database,
        publisher(),
        sink if sink is not None else ListSink(),
        slot=slot,
        max_event_bytes=SETTINGS.max_event_bytes,
        max_changes=max_changes,
    )


def drain_slot(database: Database, slot: str, sink: ListSink | None = None) -> None:
    """Logical relay rounds until one reads nothing and says nothing more is ready."""
    while (outcome := logical_round(database, slot, sink)).taken or outcome.backlog:
        pass


def polling_round(
    database: Database, sink: ListSink | None = None, max_orders: int = MAX_ORDERS_PER_ROUND
) -> PublishOutcome[OutboxRow]:
    """One round of the polling publisher with publisher(), parking in `sink` (a fresh one unless given):
    what the publisher function runs, without the function."""
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


def assert_each_order_in_sequence(bus: RecordingBus, expected_events: int) -> None:
    """No event reaches the bus before its order's earlier events first did; each event arrived."""
    for order_id, sequences in bus.sequences_by_order().items():
        first_seen: list[int] = []
        for sequence in sequences:
            if sequence not in first_seen:
                first_seen.append(sequence)
        assert first_seen == list(range(1, len(first_seen) + 1)), (order_id, sequences)
    assert len({event_id for _, _, event_id in bus.accepted}) == expected_events
