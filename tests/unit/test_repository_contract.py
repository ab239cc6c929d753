"""One contract, every implementation: the in-memory repositories (tests/support/memory.py), the
DynamoDB ones (on moto) and, for orders, the PostgreSQL one (on a real PostgreSQL, tests/support/postgres.py)
must answer every case alike, so domain tests on the fakes say something true.
At the end, what only the DynamoDB items carry: the outbox expiry (expiresAt) as written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import boto3
import pytest

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.dynamodb.outbox_items import ENVELOPE, EXPIRES_AT
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.envelope import CloudEvent, parse_time
from shop.domain.errors import EventTooLarge
from shop.domain.inventory import (
    INVENTORY_REJECTED,
    INVENTORY_RELEASED,
    INVENTORY_RESERVED,
    InsufficientStock,
    InventoryRepository,
    InventoryService,
    Reservation,
    ReservationChanged,
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
    OrderRepository,
    OrderStatus,
    RejectedLine,
    RejectionReason,
    RequestKeyTaken,
    RequestRecord,
    VersionConflict,
)
from shop.runtime.config import Settings
from tests.support.memory import InMemoryInventoryRepository, InMemoryOrderRepository
from tests.support.postgres import connect
from tools.template import Template

MAX_EVENT_BYTES = 4096  # small enough for a test to exceed, large enough for every event below
CALLER = "arn:aws:iam::123456789012:user/alice"
AT = "2026-11-21T12:00:00.000Z"
LATER = "2026-11-21T12:05:00.000Z"


class StockedInventory(InventoryRepository, Protocol):
    def set_stock(self, sku: str, available: int) -> None: ...
    def available(self, sku: str) -> int | None: ...


class SeededOrders(OrderRepository, Protocol):
    def seed(self, order: Order) -> bool: ...


@dataclass
class OrderStore:
    repository: SeededOrders
    outbox: Callable[[str], list[CloudEvent]]  # order id -> its outbox events, by sequence
    expire_request: Callable[[str, str], None]


@dataclass
class InventoryStore:
    repository: StockedInventory
    outbox: Callable[[str], list[CloudEvent]]  # order id -> its reservation's outbox events


def dynamodb_outbox(table: str, partition: str) -> list[CloudEvent]:
    items = boto3.client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="#pk = :pk AND begins_with(#sk, :outbox)",
        ExpressionAttributeNames={"#pk": keys.PK, "#sk": keys.SK},
        ExpressionAttributeValues={":pk": {"S": partition}, ":outbox": {"S": keys.OUTBOX_SK_PREFIX}},
    )["Items"]
    return [CloudEvent.from_json(item[ENVELOPE]["S"]) for item in items]


@pytest.fixture
def dynamodb_settings(
    request: pytest.FixtureRequest, template: Template, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    request.getfixturevalue("aws")  # moto, with the template's tables
    monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
    monkeypatch.setenv("INVENTORY_TABLE_NAME", template.physical_name("InventoryTable"))
    monkeypatch.setenv("MAX_EVENT_BYTES", str(MAX_EVENT_BYTES))
    return Settings.from_env()


def postgres_orders(database: ConnectionSettings) -> OrderStore:
    def outbox(order_id: str) -> list[CloudEvent]:
        with connect(database) as connection:
            rows = connection.execute(
                "SELECT envelope::text FROM outbox WHERE aggregate_id = %s ORDER BY sequence", (order_id,)
            ).fetchall()
        return [CloudEvent.from_json(envelope) for (envelope,) in rows]

    def expire(caller: str, key: str) -> None:
        with connect(database) as connection:
            connection.execute(
                "UPDATE request_keys SET expires_at = now() - interval '1 second'"
                " WHERE caller = %s AND idempotency_key = %s",
                (caller, key),
            )

    settings = Settings.from_env({"MAX_EVENT_BYTES": str(MAX_EVENT_BYTES)})
    return OrderStore(PostgresOrderRepository(Database(database), settings), outbox, expire)


@pytest.fixture(params=["memory", "dynamodb", "postgres"])
def orders(request: pytest.FixtureRequest) -> OrderStore:
    if request.param == "memory":
        memory = InMemoryOrderRepository(max_event_bytes=MAX_EVENT_BYTES)
        return OrderStore(memory, memory.outbox.events, memory.expire_request)
    if request.param == "postgres":
        return postgres_orders(request.getfixturevalue("order_database"))
    settings: Settings = request.getfixturevalue("dynamodb_settings")
    table = settings.orders_table_name

    def expire(caller: str, key: str) -> None:
        boto3.client("dynamodb").update_item(
            TableName=table,
            Key=keys.request_key(caller, key),
            UpdateExpression="SET expiresAt = :past",
            ExpressionAttributeValues={":past": {"N": "0"}},
        )

    return OrderStore(
        DynamoOrderRepository(settings),
        lambda order_id: dynamodb_outbox(table, keys.order_partition(order_id)),
        expire,
    )


@pytest.fixture(params=["memory", "dynamodb"])
def inventory(request: pytest.FixtureRequest) -> InventoryStore:
    if request.param == "memory":
        memory = InMemoryInventoryRepository(max_event_bytes=MAX_EVENT_BYTES)
        return InventoryStore(memory, memory.outbox.events)
    settings: Settings = request.getfixturevalue("dynamodb_settings")
    table = settings.inventory_table_name
    return InventoryStore(
        DynamoInventoryRepository(settings),
        lambda order_id: dynamodb_outbox(table, keys.reservation_partition(order_id)),
    )


# --- orders ----------------------------------------------------------------------------------------------
def pending(order_id: str = "o-1") -> Order:
    lines = (OrderLine("SKU-A", 2, 1250), OrderLine("SKU-B", 1, 399))
    return Order(order_id, "c-1", "USD", lines, OrderStatus.PENDING, 1, AT, AT)


def created(order: Order) -> CloudEvent:
    return order.event(ORDER_CREATED, "corr-1")


def request_for(order: Order, key: str = "key-1", caller: str = CALLER) -> RequestRecord:
    return RequestRecord(caller, key, f"fingerprint-of-{order.order_id}", order.order_id, order.to_dict())


def test_a_created_order_is_read_back_with_its_event(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)

    assert orders.repository.get(order.order_id) == order
    assert orders.outbox(order.order_id) == [created(order)]


def test_what_was_never_written_reads_as_none(orders: OrderStore):
    assert orders.repository.get("o-missing") is None
    assert orders.repository.get_request(CALLER, "key-missing") is None


def test_a_request_record_binds_its_key_and_a_second_create_with_it_writes_nothing(orders: OrderStore):
    first, second = pending("o-1"), pending("o-2")
    orders.repository.create(first, created(first), request_for(first))

    with pytest.raises(RequestKeyTaken):
        orders.repository.create(second, created(second), request_for(second))

    assert orders.repository.get_request(CALLER, "key-1") == request_for(first)
    assert orders.repository.get(second.order_id) is None
    assert orders.outbox(second.order_id) == []


def test_the_same_key_sent_by_another_caller_is_another_key(orders: OrderStore):
    first, second = pending("o-1"), pending("o-2")
    orders.repository.create(first, created(first), request_for(first, caller=CALLER))
    orders.repository.create(second, created(second), request_for(second, caller="arn:aws:iam::1:user/bob"))

    assert orders.repository.get_request("arn:aws:iam::1:user/bob", "key-1") == request_for(
        second, caller="arn:aws:iam::1:user/bob"
    )
    assert orders.repository.get_request(CALLER, "key-1") == request_for(first)


def test_an_expired_request_record_is_not_returned_and_its_key_can_be_taken_again(orders: OrderStore):
    first, second = pending("o-1"), pending("o-2")
    orders.repository.create(first, created(first), request_for(first))
    orders.expire_request(CALLER, "key-1")

    assert orders.repository.get_request(CALLER, "key-1") is None
    orders.repository.create(second, created(second), request_for(second))
    assert orders.repository.get_request(CALLER, "key-1") == request_for(second)


def test_a_transition_at_the_expected_version_is_stored_with_its_event(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)
    confirmed = order._replace(status=OrderStatus.CONFIRMED, version=2, updated_at=LATER)
    event = confirmed.event(ORDER_CONFIRMED, "corr-1")

    orders.repository.save_transition(confirmed, 1, event)

    assert orders.repository.get(order.order_id) == confirmed
    assert orders.outbox(order.order_id) == [created(order), event]


REJECTION = OrderRejection.of(
    (
        RejectedLine("SKU-A", 2, RejectionReason.UNKNOWN_SKU),
        RejectedLine("SKU-B", 1, RejectionReason.INSUFFICIENT_STOCK),
    )
)


def test_a_rejection_is_stored_with_its_transition_and_read_back(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)
    rejected = order.transition_to(OrderStatus.REJECTED, parse_time(LATER), REJECTION)
    event = rejected.event(ORDER_REJECTED, "corr-1")

    orders.repository.save_transition(rejected, 1, event)

    stored = orders.repository.get(order.order_id)
    assert stored == rejected
    assert stored is not None
    assert stored.rejection == REJECTION
    assert orders.outbox(order.order_id) == [created(order), event]


def test_an_order_rejected_without_a_rejection_reads_with_none(orders: OrderStore):
    # As every order rejected before the reason was kept is stored.
    order = pending()
    orders.repository.create(order, created(order), None)
    rejected = order._replace(status=OrderStatus.REJECTED, version=2, updated_at=LATER)

    orders.repository.save_transition(rejected, 1, rejected.event(ORDER_REJECTED, "corr-1"))

    stored = orders.repository.get(order.order_id)
    assert stored == rejected
    assert stored is not None
    assert stored.rejection is None


def test_a_transition_without_a_rejection_keeps_the_stored_one(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)
    rejected = order.transition_to(OrderStatus.REJECTED, parse_time(LATER), REJECTION)
    orders.repository.save_transition(rejected, 1, rejected.event(ORDER_REJECTED, "corr-1"))
    # Not a transition the domain makes (REJECTED is final): what each store does with a write that
    # names no rejection, alike.
    touched = rejected._replace(version=3, rejection=None)

    orders.repository.save_transition(touched, 2, touched.event(ORDER_CANCELLED, "corr-2"))

    stored = orders.repository.get(order.order_id)
    assert stored is not None
    assert (stored.version, stored.rejection) == (3, REJECTION)


def test_a_seeded_order_is_written_as_it_stands_without_an_event_and_never_over_another(orders: OrderStore):
    # What `make invoke` writes for the orders a sample event refers to.
    rejected = pending().transition_to(OrderStatus.REJECTED, parse_time(LATER), REJECTION)

    assert orders.repository.seed(rejected) is True
    assert orders.repository.seed(rejected._replace(customer_id="c-other")) is False

    assert orders.repository.get(rejected.order_id) == rejected
    assert orders.outbox(rejected.order_id) == []


def test_a_transition_from_a_stale_version_is_refused_and_writes_nothing(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)
    confirmed = order._replace(status=OrderStatus.CONFIRMED, version=2, updated_at=LATER)
    orders.repository.save_transition(confirmed, 1, confirmed.event(ORDER_CONFIRMED, "corr-1"))
    # a writer that read version 1 before the confirmation
    cancelled = order._replace(status=OrderStatus.CANCELLED, version=2, updated_at=LATER)

    with pytest.raises(VersionConflict):
        orders.repository.save_transition(cancelled, 1, cancelled.event(ORDER_CANCELLED, "corr-2"))

    assert orders.repository.get(order.order_id) == confirmed
    assert [e.type for e in orders.outbox(order.order_id)] == [ORDER_CREATED, ORDER_CONFIRMED]


def test_a_transition_of_an_order_never_created_is_a_version_conflict(orders: OrderStore):
    cancelled = pending("o-ghost")._replace(status=OrderStatus.CANCELLED, version=2)

    with pytest.raises(VersionConflict):
        orders.repository.save_transition(cancelled, 1, cancelled.event(ORDER_CANCELLED, "corr-1"))

    assert orders.repository.get("o-ghost") is None
    assert orders.outbox("o-ghost") == []


def test_an_event_the_bus_could_not_take_is_refused_before_anything_is_written(orders: OrderStore):
    order = pending()
    orders.repository.create(order, created(order), None)
    cancelled = order._replace(status=OrderStatus.CANCELLED, version=2, updated_at=LATER)
    oversize = cancelled.event(ORDER_CANCELLED, "corr-1")._replace(data={"padding": "x" * MAX_EVENT_BYTES})

    with pytest.raises(EventTooLarge):
        orders.repository.save_transition(cancelled, 1, oversize)

    assert orders.repository.get(order.order_id) == order
    assert orders.outbox(order.order_id) == [created(order)]


# --- inventory -------------------------------------------------------------------------------------------
ORDER_EVENT = CloudEvent.new(
    source="shop.orders", type=ORDER_CREATED, subject="o-1", sequence=1, data={}, correlation_id="corr-1"
)


def reservation(
    status: ReservationStatus = ReservationStatus.RESERVED,
    lines: tuple[tuple[str, int], ...] = (("SKU-A", 2), ("SKU-B", 1)),
    order_sequence: int = 1,
    version: int = 1,
) -> Reservation:
    return Reservation("o-1", status, lines, order_sequence, version, AT)


def stocked(inventory: InventoryStore, stock: dict[str, int]) -> None:
    for sku, available in stock.items():
        inventory.repository.set_stock(sku, available)


def levels(inventory: InventoryStore, *skus: str) -> list[int | None]:
    return [inventory.repository.available(sku) for sku in skus]


def test_a_reservation_takes_every_line_from_stock_with_its_event(inventory: InventoryStore):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 1})
    reserved = reservation()
    event = reserved.event(INVENTORY_RESERVED, ORDER_EVENT)

    inventory.repository.reserve(reserved, event)

    assert levels(inventory, "SKU-A", "SKU-B") == [3, 0]
    assert inventory.repository.get_reservation("o-1") == reserved
    assert inventory.outbox("o-1") == [event]


def test_a_short_reservation_names_every_short_sku_and_takes_nothing(inventory: InventoryStore):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 1, "SKU-D": 0})
    # B short, C never stocked, D stocked at 0
    wanted = reservation(lines=(("SKU-A", 2), ("SKU-B", 2), ("SKU-C", 1), ("SKU-D", 1)))

    with pytest.raises(InsufficientStock) as short:
        inventory.repository.reserve(wanted, wanted.event(INVENTORY_RESERVED, ORDER_EVENT))

    assert short.value.skus == ["SKU-B", "SKU-C", "SKU-D"]
    assert short.value.unknown_skus == ["SKU-C"]  # a stock item at 0 is short, not unknown
    assert levels(inventory, "SKU-A", "SKU-B", "SKU-C", "SKU-D") == [5, 1, None, 0]
    assert inventory.repository.get_reservation("o-1") is None
    assert inventory.outbox("o-1") == []


def test_an_order_is_reserved_at_most_once(inventory: InventoryStore):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 5})
    inventory.repository.reserve(reservation(), reservation().event(INVENTORY_RESERVED, ORDER_EVENT))
    again = reservation(order_sequence=2)

    with pytest.raises(ReservationChanged):
        inventory.repository.reserve(again, again._replace(version=2).event(INVENTORY_RESERVED, ORDER_EVENT))

    assert levels(inventory, "SKU-A", "SKU-B") == [3, 4]
    assert inventory.repository.get_reservation("o-1") == reservation()


def test_a_reservation_holding_no_stock_is_recorded_once_and_only_with_the_event_given(
    inventory: InventoryStore,
):
    tombstone = reservation(ReservationStatus.CANCELLED, lines=(), order_sequence=2)
    inventory.repository.record_new(tombstone, None)

    assert inventory.repository.get_reservation("o-1") == tombstone
    assert inventory.outbox("o-1") == []
    rejected = reservation(ReservationStatus.REJECTED)
    with pytest.raises(ReservationChanged):
        inventory.repository.record_new(rejected, rejected.event(INVENTORY_REJECTED, ORDER_EVENT))
    assert inventory.repository.get_reservation("o-1") == tombstone
    assert inventory.outbox("o-1") == []


def test_a_release_returns_the_stock_and_stores_the_released_reservation_with_its_event(
    inventory: InventoryStore,
):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 1})
    reserved = reservation()
    inventory.repository.reserve(reserved, reserved.event(INVENTORY_RESERVED, ORDER_EVENT))
    released = reserved._replace(status=ReservationStatus.RELEASED, order_sequence=2, version=2)
    event = released.event(INVENTORY_RELEASED, ORDER_EVENT)

    inventory.repository.release(reserved, released, event)

    assert levels(inventory, "SKU-A", "SKU-B") == [5, 1]
    assert inventory.repository.get_reservation("o-1") == released
    assert [e.type for e in inventory.outbox("o-1")] == [INVENTORY_RESERVED, INVENTORY_RELEASED]


@pytest.mark.parametrize("change", ["release", "update_status"])
def test_a_change_based_on_a_reservation_that_changed_since_it_was_read_is_refused(
    inventory: InventoryStore, change: str
):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 1})
    reserved = reservation()
    inventory.repository.reserve(reserved, reserved.event(INVENTORY_RESERVED, ORDER_EVENT))
    released = reserved._replace(status=ReservationStatus.RELEASED, order_sequence=2, version=2)
    inventory.repository.release(reserved, released, released.event(INVENTORY_RELEASED, ORDER_EVENT))
    outbox_before = inventory.outbox("o-1")

    # A second writer still holding the RESERVED reservation it read before the release
    again = reserved._replace(status=ReservationStatus.RELEASED, order_sequence=3, version=3)
    attempts: dict[str, Callable[[], Any]] = {
        "release": lambda: inventory.repository.release(
            reserved, again, again.event(INVENTORY_RELEASED, ORDER_EVENT)
        ),
        "update_status": lambda: inventory.repository.update_status(reserved, again),
    }
    with pytest.raises(ReservationChanged):
        attempts[change]()

    assert levels(inventory, "SKU-A", "SKU-B") == [5, 1]
    assert inventory.repository.get_reservation("o-1") == released
    assert inventory.outbox("o-1") == outbox_before


def test_a_status_update_moves_no_stock_and_writes_no_event(inventory: InventoryStore):
    stocked(inventory, {"SKU-A": 5, "SKU-B": 5})
    rejected = reservation(ReservationStatus.REJECTED)
    inventory.repository.record_new(rejected, rejected.event(INVENTORY_REJECTED, ORDER_EVENT))
    cancelled = rejected._replace(status=ReservationStatus.CANCELLED, order_sequence=2)

    inventory.repository.update_status(rejected, cancelled)

    assert inventory.repository.get_reservation("o-1") == cancelled
    assert levels(inventory, "SKU-A", "SKU-B") == [5, 5]
    assert [e.type for e in inventory.outbox("o-1")] == [INVENTORY_REJECTED]


@pytest.mark.parametrize(
    "held",
    [
        {"status": ReservationStatus.RESERVED},  # the sequence read matches, the status does not
        {"order_sequence": 2},  # the status read matches, the sequence does not
    ],
    ids=["other-status", "other-sequence"],
)
def test_a_change_needs_both_the_sequence_and_the_status_read(
    inventory: InventoryStore, held: dict[str, Any]
):
    rejected = reservation(ReservationStatus.REJECTED)
    inventory.repository.record_new(rejected, None)
    cancelled = rejected._replace(status=ReservationStatus.CANCELLED, order_sequence=3)

    with pytest.raises(ReservationChanged):
        inventory.repository.update_status(rejected._replace(**held), cancelled)

    assert inventory.repository.get_reservation("o-1") == rejected


def test_a_redelivered_order_created_is_stale_and_writes_nothing_even_when_its_stock_is_gone(
    inventory: InventoryStore,
):
    # The service reserves without reading the reservation first, so the conditional writes alone decide:
    # the reserve fails on the existing reservation (AWS lists a cancellation reason per action, in
    # order, and the reservation's is checked first), and so would the rejection's conditional put.
    stocked(inventory, {"SKU-A": 2, "SKU-B": 1})
    created = CloudEvent.new(
        source="shop.orders",
        type=ORDER_CREATED,
        subject="o-1",
        sequence=1,
        data={"items": [{"sku": "SKU-A", "quantity": 2}, {"sku": "SKU-B", "quantity": 1}]},
        correlation_id="corr-1",
    )
    service = InventoryService(inventory.repository)

    assert service.apply(created) == "reserved"
    assert service.apply(created) == "stale"

    assert levels(inventory, "SKU-A", "SKU-B") == [0, 0]
    assert [e.type for e in inventory.outbox("o-1")] == [INVENTORY_RESERVED]
    stored = inventory.repository.get_reservation("o-1")
    assert stored is not None
    assert stored.status is ReservationStatus.RESERVED


# --- the outbox expiry as the DynamoDB repositories write it ----------------------------------------------
def test_every_outbox_item_expires_outbox_ttl_days_after_its_event(dynamodb_settings: Settings):
    # A window other than the default, so that only the setting can have given it
    settings = dynamodb_settings._replace(outbox_ttl_days=30)
    orders, inventory = DynamoOrderRepository(settings), DynamoInventoryRepository(settings)
    order = pending()
    orders.create(order, created(order), None)
    confirmed = order._replace(status=OrderStatus.CONFIRMED, version=2, updated_at=LATER)
    orders.save_transition(confirmed, 1, confirmed.event(ORDER_CONFIRMED, "corr-1"))
    inventory.set_stock("SKU-A", 5)
    inventory.set_stock("SKU-B", 1)
    reserved = reservation()
    inventory.reserve(reserved, reserved.event(INVENTORY_RESERVED, ORDER_EVENT))
    released = reserved._replace(status=ReservationStatus.RELEASED, order_sequence=2, version=2)
    inventory.release(reserved, released, released.event(INVENTORY_RELEASED, ORDER_EVENT))

    client = boto3.client("dynamodb")
    items = [
        item
        for table in (settings.orders_table_name, settings.inventory_table_name)
        for item in client.scan(TableName=table)["Items"]
        if item[keys.SK]["S"].startswith(keys.OUTBOX_SK_PREFIX)
    ]
    envelopes = [json.loads(item[ENVELOPE]["S"]) for item in items]
    lived = {
        envelope["type"]: int(item[EXPIRES_AT]["N"]) - parse_time(envelope["time"]).timestamp()
        for item, envelope in zip(items, envelopes, strict=True)
    }
    window = settings.outbox_ttl_days * 86_400
    assert lived == {
        ORDER_CREATED: pytest.approx(window, abs=1),
        ORDER_CONFIRMED: pytest.approx(window, abs=1),
        INVENTORY_RESERVED: pytest.approx(window, abs=1),
        INVENTORY_RELEASED: pytest.approx(window, abs=1),
    }


# --- the request key's expiry as the DynamoDB repository reads it ------------------------------------------
def test_a_request_key_in_its_last_second_is_taken_and_read_back_and_free_the_second_after(
    dynamodb_settings: Settings,
):
    """expiresAt holds whole epoch seconds; the record binds its key through that second, for the create's
    condition and for the read alike: a key the create finds taken is read back (the read used to compare
    with the fractional clock, found the record expired in the rest of that second, and the domain
    answered a false 409 REQUEST_IN_PROGRESS)."""
    written = float(int(time.time()))
    now = [written]
    repository = DynamoOrderRepository(dynamodb_settings, clock=lambda: now[0])
    first, second, third = pending("o-1"), pending("o-2"), pending("o-3")
    repository.create(first, created(first), request_for(first))
    expires = int(written) + dynamodb_settings.request_key_ttl_hours * 3600

    now[0] = expires + 0.5
    with pytest.raises(RequestKeyTaken):
        repository.create(second, created(second), request_for(second))
    assert repository.get_request(CALLER, "key-1") == request_for(first)

    now[0] = expires + 1.0
    assert repository.get_request(CALLER, "key-1") is None
    repository.create(third, created(third), request_for(third))
    assert repository.get_request(CALLER, "key-1") == request_for(third)
