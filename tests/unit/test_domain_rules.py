"""The domain's rules on the in-memory repositories, no moto: inventory ordering, cancel/confirm races,
idempotent creation, order transitions. (The same rules through the deployed wiring and moto are in
test_consumers.py, test_guarantees.py and test_orders_api.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any

import pytest

from shop.domain.envelope import CloudEvent
from shop.domain.errors import (
    ConcurrentModification,
    EventTooLarge,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidEnvelope,
    RequestInProgress,
)
from shop.domain.inventory import (
    INVENTORY_REJECTED,
    INVENTORY_RELEASED,
    INVENTORY_RESERVED,
    InventoryService,
    Reservation,
    ReservationStatus,
)
from shop.domain.orders import (
    ORDER_CANCELLED,
    ORDER_CONFIRMED,
    ORDER_CREATED,
    ORDER_REJECTED,
    Order,
    OrderLine,
    OrderRejection,
    OrderService,
    OrderStatus,
    PlaceOrder,
    RejectedLine,
    RejectionReason,
    RequestRecord,
    VersionConflict,
)
from shop.domain.saga import OrderStatusPolicy
from tests.support.memory import InMemoryInventoryRepository, InMemoryOrderRepository

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
CALLER = "arn:aws:iam::123456789012:user/alice"
COMMAND = PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 2, 1250), OrderLine("SKU-B", 1, 399)))


@dataclass(frozen=True)
class Limits:
    """The settings values OrderService reads (shop.domain.orders.OrderSettings)."""

    max_event_bytes: int = 262_144


def ticking_clock() -> Callable[[], datetime]:
    seconds = count()
    return lambda: T0 + timedelta(seconds=next(seconds))


def order_service(repository: InMemoryOrderRepository, max_event_bytes: int = 262_144) -> OrderService:
    ids = count(1)
    return OrderService(
        repository, Limits(max_event_bytes), clock=ticking_clock(), new_id=lambda: f"o-{next(ids)}"
    )


def event_types(
    repository: InMemoryOrderRepository | InMemoryInventoryRepository, order_id: str
) -> list[str]:
    return [event.type for event in repository.outbox.events(order_id)]


# --- inventory: ordering per order ----------------------------------------------------------------------
def order_event(event_type: str, sequence: int, items: list[tuple[str, int]] | None = None) -> CloudEvent:
    lines = [{"sku": sku, "quantity": quantity} for sku, quantity in (items or [("SKU-A", 2), ("SKU-B", 1)])]
    return CloudEvent.new(
        source="shop.orders",
        type=event_type,
        subject="o-1",
        sequence=sequence,
        data={"orderId": "o-1", "items": lines},
        correlation_id="corr-1",
        time=T0,
    )


CREATED = order_event(ORDER_CREATED, 1)
CANCELLED = order_event(ORDER_CANCELLED, 2)


@pytest.fixture
def stock() -> InMemoryInventoryRepository:
    repository = InMemoryInventoryRepository()
    repository.set_stock("SKU-A", 5)
    repository.set_stock("SKU-B", 1)
    return repository


@pytest.fixture
def inventory(stock: InMemoryInventoryRepository) -> InventoryService:
    return InventoryService(stock, clock=ticking_clock())


def levels(repository: InMemoryInventoryRepository) -> tuple[int | None, int | None]:
    return repository.available("SKU-A"), repository.available("SKU-B")


def test_an_order_created_reserves_every_line_and_a_redelivery_reserves_nothing_more(inventory, stock):
    assert inventory.apply(CREATED) == "reserved"
    assert inventory.apply(CREATED) == "stale"

    assert levels(stock) == (3, 0)
    assert event_types(stock, "o-1") == [INVENTORY_RESERVED]
    assert stock.get_reservation("o-1") == Reservation(
        "o-1", ReservationStatus.RESERVED, (("SKU-A", 2), ("SKU-B", 1)), 1, 1, "2026-11-21T12:00:00.000Z"
    )


def test_quantities_of_one_sku_on_several_lines_are_reserved_together(inventory, stock):
    assert inventory.apply(order_event(ORDER_CREATED, 1, [("SKU-A", 2), ("SKU-A", 3)])) == "reserved"

    assert stock.available("SKU-A") == 0
    reservation = stock.get_reservation("o-1")
    assert reservation is not None
    assert reservation.lines == (("SKU-A", 5),)


def test_an_order_is_reserved_whole_or_not_at_all(inventory, stock):
    assert inventory.apply(order_event(ORDER_CREATED, 1, [("SKU-A", 2), ("SKU-B", 2)])) == "rejected"

    assert levels(stock) == (5, 1)
    [rejected] = stock.outbox.events("o-1")
    assert rejected.type == INVENTORY_REJECTED
    assert (rejected.data["reason"], rejected.data["shortSkus"]) == ("INSUFFICIENT_STOCK", ["SKU-B"])
    assert rejected.data["unknownSkus"] == []


def test_a_rejection_names_the_skus_the_inventory_has_no_stock_of(inventory, stock):
    created = order_event(ORDER_CREATED, 1, [("SKU-A", 2), ("SKU-B", 2), ("SKU-TYPO", 1)])

    assert inventory.apply(created) == "rejected"

    assert levels(stock) == (5, 1)
    [rejected] = stock.outbox.events("o-1")
    assert (rejected.data["shortSkus"], rejected.data["unknownSkus"]) == (["SKU-B", "SKU-TYPO"], ["SKU-TYPO"])


def test_a_cancel_releases_what_was_reserved_once(inventory, stock):
    inventory.apply(CREATED)
    reserved = stock.get_reservation("o-1")
    assert reserved is not None

    assert inventory.apply(CANCELLED) == "released"
    assert inventory.apply(CANCELLED) == "stale"

    assert levels(stock) == (5, 1)
    assert event_types(stock, "o-1") == [INVENTORY_RESERVED, INVENTORY_RELEASED]
    # The release is stored as a new version, at the cancel's sequence and the service's clock (tick 1).
    assert stock.get_reservation("o-1") == Reservation(
        "o-1", ReservationStatus.RELEASED, reserved.lines, 2, reserved.version + 1, "2026-11-21T12:00:01.000Z"
    )


def test_a_cancel_arriving_before_its_create_means_the_late_create_reserves_nothing(inventory, stock):
    assert inventory.apply(CANCELLED) == "cancelled-before-reservation"
    assert inventory.apply(CREATED) == "stale"

    assert levels(stock) == (5, 1)
    assert stock.get_reservation("o-1") == Reservation(
        "o-1", ReservationStatus.CANCELLED, (), 2, 1, "2026-11-21T12:00:00.000Z"
    )
    assert event_types(stock, "o-1") == []


def test_a_cancel_after_a_rejection_moves_no_stock(inventory, stock):
    inventory.apply(order_event(ORDER_CREATED, 1, [("SKU-B", 9)]))

    assert inventory.apply(CANCELLED) == "cancelled-after-rejection"

    assert levels(stock) == (5, 1)
    cancelled = stock.get_reservation("o-1")
    assert cancelled is not None
    assert cancelled.status is ReservationStatus.CANCELLED
    assert (cancelled.order_sequence, cancelled.updated_at) == (2, "2026-11-21T12:00:01.000Z")
    assert event_types(stock, "o-1") == [INVENTORY_REJECTED]


class CreateLandsDuringTheTombstone(InMemoryInventoryRepository):
    """The cancel read no reservation; the create's transaction commits before the cancel's tombstone."""

    def __init__(self, service: Callable[[], InventoryService]) -> None:
        super().__init__()
        self._service = service
        self.raced = False

    def record_new(self, reservation: Reservation, event: CloudEvent | None) -> None:
        if reservation.status is ReservationStatus.CANCELLED and not self.raced:
            self.raced = True
            assert self._service().apply(CREATED) == "reserved"
        super().record_new(reservation, event)


def test_a_create_landing_while_the_cancel_records_its_tombstone_is_released():
    services: list[InventoryService] = []
    repository = CreateLandsDuringTheTombstone(lambda: services[0])
    services.append(InventoryService(repository, clock=ticking_clock()))
    repository.set_stock("SKU-A", 5)
    repository.set_stock("SKU-B", 1)

    assert services[0].apply(CANCELLED) == "released"

    assert repository.raced
    assert levels(repository) == (5, 1)
    assert event_types(repository, "o-1") == [INVENTORY_RESERVED, INVENTORY_RELEASED]


def test_inventory_refuses_events_it_does_not_handle(inventory):
    with pytest.raises(InvalidEnvelope):
        inventory.apply(order_event(ORDER_CONFIRMED, 2))


# --- orders: cancel and confirm racing on one version ----------------------------------------------------
class AnotherWriterFirst(InMemoryOrderRepository):
    """`before_next_write(order_id)` runs once, just before the next transition is written: another
    writer's transition commits first, so the version the next writer read is stale by then."""

    def __init__(self) -> None:
        super().__init__()
        self.before_next_write: Callable[[str], object] | None = None

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        other_writer, self.before_next_write = self.before_next_write, None
        if other_writer is not None:
            other_writer(order.order_id)
        super().save_transition(order, expected_version, event)


class AlwaysStale(InMemoryOrderRepository):
    """Every transition finds the version changed: other writers always get there first."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        self.attempts += 1
        raise VersionConflict(order.order_id)


def inventory_answer(event_type: str, order_id: str) -> CloudEvent:
    return CloudEvent.new(
        source="shop.inventory", type=event_type, subject=order_id, sequence=1, data={}, correlation_id="c"
    )


@pytest.fixture
def racing() -> AnotherWriterFirst:
    return AnotherWriterFirst()


def placed(service: OrderService) -> str:
    order_id: str = service.place_order(COMMAND, idempotency_key=None, correlation_id="corr-1").order[
        "orderId"
    ]
    return order_id


def test_a_cancel_that_loses_to_a_confirm_rereads_and_cancels_the_confirmed_order(racing):
    service, other = order_service(racing), order_service(racing)
    order_id = placed(service)
    racing.before_next_write = lambda oid: other.apply_inventory_outcome(
        oid, OrderStatus.CONFIRMED, inventory_answer("InventoryReserved", oid)
    )

    cancelled = service.cancel_order(order_id, correlation_id="corr-2")

    assert (cancelled.status, cancelled.version) == (OrderStatus.CANCELLED, 3)
    assert racing.get(order_id) == cancelled
    assert event_types(racing, order_id) == [ORDER_CREATED, ORDER_CONFIRMED, ORDER_CANCELLED]


def test_a_confirm_that_loses_to_a_cancel_leaves_the_order_cancelled(racing):
    service, other = order_service(racing), order_service(racing)
    order_id = placed(service)
    racing.before_next_write = lambda oid: other.cancel_order(oid, correlation_id="corr-2")

    outcome = service.apply_inventory_outcome(
        order_id, OrderStatus.CONFIRMED, inventory_answer("InventoryReserved", order_id)
    )

    assert outcome == "ignored:CANCELLED"
    order = racing.get(order_id)
    assert order is not None
    assert (order.status, order.version) == (OrderStatus.CANCELLED, 2)
    assert event_types(racing, order_id) == [ORDER_CREATED, ORDER_CANCELLED]


def test_a_writer_that_only_ever_holds_a_stale_version_gives_up_after_three_tries_writing_nothing():
    repository = AlwaysStale()
    service = order_service(repository)
    order_id = placed(service)

    with pytest.raises(ConcurrentModification):
        service.cancel_order(order_id, correlation_id="corr-2")
    with pytest.raises(ConcurrentModification):
        service.apply_inventory_outcome(
            order_id, OrderStatus.CONFIRMED, inventory_answer("InventoryReserved", order_id)
        )

    assert repository.attempts == 6
    order = repository.get(order_id)
    assert order is not None
    assert (order.status, order.version) == (OrderStatus.PENDING, 1)
    assert event_types(repository, order_id) == [ORDER_CREATED]


# --- orders: idempotent creation -------------------------------------------------------------------------
@pytest.fixture
def repository() -> InMemoryOrderRepository:
    return InMemoryOrderRepository()


def place(service: OrderService, key: str | None, command: PlaceOrder = COMMAND, caller: str = CALLER) -> Any:
    return service.place_order(command, idempotency_key=key, correlation_id="corr-1", caller=caller)


def test_a_retry_with_the_same_key_and_body_replays_the_first_response_and_writes_nothing(repository):
    service = order_service(repository)
    first = place(service, "key-1")

    retry = place(service, "key-1")

    assert (retry.replayed, retry.order) == (True, first.order)
    assert list(repository.orders) == [first.order["orderId"]]
    assert event_types(repository, first.order["orderId"]) == [ORDER_CREATED]


def test_the_same_key_with_another_body_is_refused_and_names_the_first_order(repository):
    service = order_service(repository)
    first = place(service, "key-1")

    with pytest.raises(IdempotencyKeyReused) as refused:
        place(service, "key-1", PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 3, 1250),)))

    assert refused.value.details == {"orderId": first.order["orderId"]}
    assert list(repository.orders) == [first.order["orderId"]]


def test_the_same_key_from_another_caller_is_another_request(repository):
    service = order_service(repository)
    first = place(service, "key-1")

    other = place(service, "key-1", caller="arn:aws:iam::123456789012:user/bob")

    assert not other.replayed
    assert other.order["orderId"] != first.order["orderId"]
    assert len(repository.orders) == 2


def test_requests_without_a_key_each_create_an_order(repository):
    service = order_service(repository)

    assert place(service, None).order["orderId"] != place(service, None).order["orderId"]
    assert len(repository.orders) == 2


def test_an_expired_key_is_a_new_request(repository):
    service = order_service(repository)
    first = place(service, "key-1")
    repository.expire_request(CALLER, "key-1")

    second = place(service, "key-1")

    assert not second.replayed
    assert second.order["orderId"] != first.order["orderId"]


class RecordNotYetReadable(InMemoryOrderRepository):
    """The key's record is held by a transaction that has not committed yet: taken, but unreadable."""

    def get_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        return None


def test_a_key_whose_first_request_is_still_committing_is_answered_in_progress():
    repository = RecordNotYetReadable()
    service = order_service(repository)
    first = place(service, "key-1")

    with pytest.raises(RequestInProgress):
        place(service, "key-1")

    assert list(repository.orders) == [first.order["orderId"]]


def test_an_order_whose_event_the_bus_could_not_take_is_refused_and_nothing_is_written(repository):
    service = order_service(repository, max_event_bytes=1024)
    lines = tuple(OrderLine(f"SKU-{n:03d}", 1, 100) for n in range(20))

    with pytest.raises(EventTooLarge):
        place(service, "key-1", PlaceOrder("c-1", "USD", lines))

    assert repository.orders == {}
    assert repository.get_request(CALLER, "key-1") is None


def test_an_order_whose_rejection_the_bus_could_not_take_is_refused_at_creation(repository):
    lines = tuple(OrderLine(f"SKU-{n:03d}", 1, 100) for n in range(8))
    at = "2026-11-21T12:00:00.000Z"  # the service's clock, its first order id: the same sizes
    created = Order("o-1", "c-1", "USD", lines, OrderStatus.PENDING, 1, at, at).event(ORDER_CREATED, "corr-1")
    # A limit its OrderCreated fits, its OrderRejected (every line refused: 8 x ~60 bytes more) does not
    limit = created.entry_size() + 100
    service = order_service(repository, max_event_bytes=limit)

    with pytest.raises(EventTooLarge):
        place(service, "key-1", PlaceOrder("c-1", "USD", lines))

    assert repository.orders == {}
    placed = order_service(repository, max_event_bytes=limit + 1000).place_order(
        PlaceOrder("c-1", "USD", lines), idempotency_key=None, correlation_id="corr-1"
    )
    assert placed.order["status"] == "PENDING"


# --- orders: transitions ---------------------------------------------------------------------------------
ALLOWED = {
    (OrderStatus.PENDING, OrderStatus.CONFIRMED),
    (OrderStatus.PENDING, OrderStatus.REJECTED),
    (OrderStatus.PENDING, OrderStatus.CANCELLED),
    (OrderStatus.CONFIRMED, OrderStatus.CANCELLED),
}
PAIRS = [(a, b) for a in OrderStatus for b in OrderStatus]


def order_in(status: OrderStatus, version: int = 1) -> Order:
    at = "2026-11-21T12:00:00.000Z"
    return Order("o-1", "c-1", "USD", COMMAND.lines, status, version, at, at)


@pytest.mark.parametrize(("current", "requested"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_only_the_allowed_transitions_happen(current, requested):
    order = order_in(current, version=4)
    if (current, requested) in ALLOWED:
        moved = order.transition_to(requested, T0)
        assert (moved.status, moved.version) == (requested, 5)
    else:
        with pytest.raises(IllegalTransition):
            order.transition_to(requested, T0)


def stored(repository: InMemoryOrderRepository, status: OrderStatus) -> OrderService:
    order = order_in(status)
    repository.create(order, order.event(ORDER_CREATED, "corr-0"), None)
    return order_service(repository)


def test_a_rejected_order_cannot_be_cancelled_and_nothing_is_written(repository):
    service = stored(repository, OrderStatus.REJECTED)

    with pytest.raises(IllegalTransition):
        service.cancel_order("o-1", correlation_id="corr-1")

    assert repository.get("o-1") == order_in(OrderStatus.REJECTED)
    assert event_types(repository, "o-1") == [ORDER_CREATED]


def test_cancelling_a_cancelled_order_returns_it_without_a_new_event(repository):
    service = stored(repository, OrderStatus.CANCELLED)

    assert service.cancel_order("o-1", correlation_id="corr-1") == order_in(OrderStatus.CANCELLED)
    assert event_types(repository, "o-1") == [ORDER_CREATED]


@pytest.mark.parametrize("status", [OrderStatus.CONFIRMED, OrderStatus.REJECTED, OrderStatus.CANCELLED])
def test_an_inventory_answer_moves_only_a_pending_order(repository, status):
    service = stored(repository, status)

    outcome = service.apply_inventory_outcome(
        "o-1", OrderStatus.CONFIRMED, inventory_answer("InventoryReserved", "o-1")
    )

    assert outcome == f"ignored:{status}"
    assert repository.get("o-1") == order_in(status)
    assert event_types(repository, "o-1") == [ORDER_CREATED]


def inventory_rejection(order_id: str, short: list[str], unknown: list[str] | None = None) -> CloudEvent:
    """An InventoryRejected as the inventory emits it for COMMAND's lines (`unknown`: None, as emitted
    before unknownSkus existed)."""
    data: dict[str, Any] = {
        "orderId": order_id,
        "orderSequence": 1,
        "status": "REJECTED",
        "lines": [{"sku": "SKU-A", "quantity": 2}, {"sku": "SKU-B", "quantity": 1}],
        "reason": "INSUFFICIENT_STOCK",
        "shortSkus": short,
    }
    if unknown is not None:
        data["unknownSkus"] = unknown
    return CloudEvent.new(
        source="shop.inventory",
        type=INVENTORY_REJECTED,
        subject=order_id,
        sequence=1,
        data=data,
        correlation_id="c",
    )


@pytest.mark.parametrize(
    ("answer", "status", "emitted"),
    [
        (inventory_answer("InventoryReserved", "o-1"), "CONFIRMED", ORDER_CONFIRMED),
        (inventory_rejection("o-1", ["SKU-B"], []), "REJECTED", ORDER_REJECTED),
    ],
    ids=["reserved", "rejected"],
)
def test_the_saga_moves_a_pending_order_by_the_inventory_answer(repository, answer, status, emitted):
    policy = OrderStatusPolicy(stored(repository, OrderStatus.PENDING))
    cause = answer

    assert policy.apply(cause) == status.lower()

    order = repository.get("o-1")
    assert order is not None
    assert (order.status, order.version) == (OrderStatus(status), 2)
    [_, event] = repository.outbox.events("o-1")
    assert (event.type, event.causationid, event.correlationid) == (emitted, cause.id, cause.correlationid)


@pytest.mark.parametrize(
    ("short", "unknown", "reason", "line_reasons"),
    [
        (["SKU-B"], [], RejectionReason.INSUFFICIENT_STOCK, [RejectionReason.INSUFFICIENT_STOCK]),
        (
            ["SKU-A", "SKU-B"],
            ["SKU-A"],
            RejectionReason.UNKNOWN_SKU,
            [RejectionReason.UNKNOWN_SKU, RejectionReason.INSUFFICIENT_STOCK],
        ),
        (["SKU-B"], None, RejectionReason.INSUFFICIENT_STOCK, [RejectionReason.INSUFFICIENT_STOCK]),
    ],
    ids=["short", "one-unknown", "emitted-before-unknown-skus"],
)
def test_a_rejected_order_keeps_why_with_each_line_refused_and_its_event_carries_it(
    repository, short, unknown, reason, line_reasons
):
    policy = OrderStatusPolicy(stored(repository, OrderStatus.PENDING))
    asked = {"SKU-A": 2, "SKU-B": 1}

    assert policy.apply(inventory_rejection("o-1", short, unknown)) == "rejected"

    order = repository.get("o-1")
    assert order is not None
    expected = OrderRejection(
        reason,
        tuple(RejectedLine(sku, asked[sku], why) for sku, why in zip(short, line_reasons, strict=True)),
    )
    assert order.rejection == expected
    [_, rejected] = repository.outbox.events("o-1")
    assert (
        rejected.data["rejection"]
        == order.to_dict()["rejection"]
        == {
            "reason": str(reason),
            "lines": [
                {"sku": sku, "quantity": asked[sku], "reason": str(why)}
                for sku, why in zip(short, line_reasons, strict=True)
            ],
        }
    )


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"lines": [], "shortSkus": ["SKU-B"]},
        {"lines": [{"sku": "SKU-B", "quantity": 1}], "shortSkus": []},
    ],
    ids=["no-data", "short-sku-not-in-lines", "no-short-sku"],
)
def test_a_rejection_that_does_not_say_what_was_refused_is_an_invalid_envelope_and_moves_nothing(
    repository, data
):
    policy = OrderStatusPolicy(stored(repository, OrderStatus.PENDING))
    cause = CloudEvent.new(
        source="shop.inventory",
        type=INVENTORY_REJECTED,
        subject="o-1",
        sequence=1,
        data=data,
        correlation_id="c",
    )

    with pytest.raises(InvalidEnvelope):
        policy.apply(cause)

    assert repository.get("o-1") == order_in(OrderStatus.PENDING)
    assert event_types(repository, "o-1") == [ORDER_CREATED]


def test_orders_without_a_rejection_have_no_rejection_field():
    assert "rejection" not in order_in(OrderStatus.REJECTED).to_dict()  # rejected before it was kept
    assert "rejection" not in order_in(OrderStatus.CONFIRMED).to_dict()


def test_only_a_rejected_order_takes_a_rejection():
    rejection = OrderRejection.of((RejectedLine("SKU-A", 2, RejectionReason.INSUFFICIENT_STOCK),))

    with pytest.raises(ValueError, match="only a rejected order"):
        order_in(OrderStatus.PENDING).transition_to(OrderStatus.CONFIRMED, T0, rejection)
    assert (
        order_in(OrderStatus.PENDING).transition_to(OrderStatus.REJECTED, T0, rejection).rejection
        == rejection
    )
