"""The order side's core guarantees, each pinned by a test that fails when the guarantee is broken.

- An order change and its outbox event are one transaction: neither is ever written without the other.
- A transition is written only over the version it was decided on: a stale writer changes nothing.
- An Idempotency-Key binds its whole request: the same key with any other body is refused.
- An expired request record no longer binds its key: the key is accepted again as a new request.

The consumers' guarantee (each CloudEvent applied once, whatever SQS message carries it) is tested
with the consumers, in test_consumers.py.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import shop.adapters.aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.envelope import CloudEvent, now
from shop.domain.orders import (
    ORDER_CANCELLED,
    Order,
    OrderLine,
    OrderService,
    OrderStatus,
    PlacedOrder,
    PlaceOrder,
    VersionConflict,
)
from shop.runtime.config import Settings
from tests.support import json_body, load_event
from tests.unit.fakes import WritesRefused
from tools.template import Template

API = "OrdersApiFunction"
CALLER = "arn:aws:iam::123456789012:user/alice"
COMMAND = PlaceOrder("c-1001", "USD", (OrderLine("SKU-RED-MUG", 2, 1250), OrderLine("SKU-BLUE-PEN", 1, 399)))
OTHER_COMMAND = PlaceOrder("c-1001", "USD", (OrderLine("SKU-RED-MUG", 3, 1250),))
ORDER_SORT_KEY = keys.order_key("any")[keys.SK]["S"]


@dataclass(frozen=True)
class Stored:
    """What the orders table holds, by kind."""

    orders: list[tuple[str, str, int]]  # (orderId, status, version)
    events: list[tuple[str, int, str]]  # outbox envelopes: (subject, sequence, type)
    requests: list[tuple[str, str]]  # request records: (orderId, fingerprint)


@pytest.fixture
def settings(aws: None, template: Template, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
    return Settings.from_env()


@pytest.fixture
def repository(settings: Settings) -> DynamoOrderRepository:
    return DynamoOrderRepository(settings)


@pytest.fixture
def service(repository: DynamoOrderRepository, settings: Settings) -> OrderService:
    return OrderService(repository, settings)


@pytest.fixture
def stored(template: Template) -> Callable[[], Stored]:
    def read() -> Stored:
        items = boto3.client("dynamodb").scan(TableName=template.physical_name("OrdersTable"))["Items"]
        kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for item in items:
            kind[item.get("entityType", {}).get("S", "")].append(item)
        return Stored(
            orders=sorted(
                (i["orderId"]["S"], i["status"]["S"], int(i["version"]["N"])) for i in kind["Order"]
            ),
            events=sorted(
                (e["subject"], int(e["sequence"]), e["type"])
                for e in (
                    json.loads(i["envelope"]["S"]) for i in items if keys.is_outbox_sort_key(i[keys.SK]["S"])
                )
            ),
            requests=sorted((i["orderId"]["S"], i["fingerprint"]["S"]) for i in kind["RequestKey"]),
        )

    return read


def place(service: OrderService, key: str | None = None, command: PlaceOrder = COMMAND) -> PlacedOrder:
    return service.place_order(command, idempotency_key=key, correlation_id="corr-guarantees", caller=CALLER)


# --- the order and its event: one transaction -----------------------------------------------------------
REFUSABLE_PARTS: dict[str, Callable[[str], bool]] = {
    "its outbox event": keys.is_outbox_sort_key,
    "the order": lambda sort_key: sort_key == ORDER_SORT_KEY,
}


@pytest.fixture
def refuse_writes(aws: None, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], WritesRefused]:
    """refuse_writes(part): from now on DynamoDB refuses every write of that part of an order change."""

    def refuse(part: str) -> WritesRefused:
        fake = WritesRefused(shop.adapters.aws.dynamodb(), REFUSABLE_PARTS[part])
        monkeypatch.setattr(shop.adapters.aws, "dynamodb", lambda: fake)
        return fake

    return refuse


@pytest.mark.parametrize("refused", list(REFUSABLE_PARTS))
def test_an_order_is_never_created_without_its_event_nor_its_event_without_the_order(
    service, refuse_writes, stored, refused
):
    # Given DynamoDB refuses one part of the next order change
    refusal = refuse_writes(refused)

    # When an order is placed (with an Idempotency-Key: order, event and request record are at stake)
    with pytest.raises(ClientError):
        place(service, key="atomic-1")

    # Then the write was attempted, and nothing of the change was written
    assert refusal.refused
    assert stored() == Stored(orders=[], events=[], requests=[])


@pytest.mark.parametrize("refused", list(REFUSABLE_PARTS))
def test_a_transition_is_never_written_without_its_event_nor_its_event_without_it(
    service, refuse_writes, stored, refused
):
    # Given a pending order, and DynamoDB refusing one part of its next change
    order_id = place(service).order["orderId"]
    before = stored()
    refusal = refuse_writes(refused)

    # When the order is cancelled
    with pytest.raises(ClientError):
        service.cancel_order(order_id, correlation_id="corr-guarantees")

    # Then the write was attempted, and the order is still pending with only its OrderCreated event
    assert refusal.refused
    assert stored() == before


# --- optimistic concurrency: a stale writer changes nothing ---------------------------------------------
@pytest.fixture
def stale_snapshot(service: OrderService, repository: DynamoOrderRepository) -> Order:
    """An order as a writer read it (PENDING, version 1) before the inventory confirmed it (version 2)."""
    order_id = place(service).order["orderId"]
    snapshot = repository.get(order_id)
    assert snapshot is not None
    reserved = CloudEvent.new(
        source="shop.inventory",
        type="InventoryReserved",
        subject=order_id,
        sequence=1,
        data={"orderId": order_id},
        correlation_id="corr-guarantees",
    )
    assert service.apply_inventory_outcome(order_id, OrderStatus.CONFIRMED, reserved) == "confirmed"
    return snapshot


def test_a_writer_holding_a_stale_version_is_refused_and_writes_nothing(repository, stale_snapshot, stored):
    # Given the order moved on to version 2 since the writer read version 1
    before = stored()
    cancelled = stale_snapshot.transition_to(OrderStatus.CANCELLED, now())

    # When the writer saves its transition over version 1
    with pytest.raises(VersionConflict):
        repository.save_transition(
            cancelled, stale_snapshot.version, cancelled.event(ORDER_CANCELLED, "corr-stale")
        )

    # Then neither the order nor its outbox changed
    assert stored() == before


def cancel_request(order_id: str) -> dict[str, Any]:
    event = load_event("api_cancel_order.json")
    sample_id = event["pathParameters"]["orderId"]
    event["pathParameters"] = {"orderId": order_id}
    event["path"] = event["path"].replace(sample_id, order_id)
    event["requestContext"]["path"] = event["requestContext"]["path"].replace(sample_id, order_id)
    return event


def test_a_cancel_that_only_ever_reads_a_stale_version_is_a_409_and_writes_nothing(
    invoke, stale_snapshot, stored, monkeypatch
):
    # Given every read of the order returns the stale version 1 (the confirm is never seen)
    monkeypatch.setattr(DynamoOrderRepository, "get", lambda self, order_id: stale_snapshot)
    before = stored()

    # When the customer cancels through the API
    response = invoke(API, cancel_request(stale_snapshot.order_id))

    # Then each attempt was refused, the API says so, and nothing was written
    assert response["statusCode"] == 409
    assert json_body(response)["error"]["code"] == "CONCURRENT_MODIFICATION"
    assert stored() == before


# --- an Idempotency-Key binds its whole request ---------------------------------------------------------
@pytest.fixture
def post_order(aws: None, invoke: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    """post_order(key, change): POST /orders of the sample body, edited by `change`, with that key."""

    def post(key: str, change: Callable[[dict[str, Any]], object] = lambda body: None) -> dict[str, Any]:
        event = load_event("api_create_order.json")
        body = json.loads(event["body"])
        change(body)
        event["body"] = json.dumps(body)
        event["headers"]["Idempotency-Key"] = key
        event["multiValueHeaders"]["Idempotency-Key"] = [key]
        response = invoke(API, event)
        assert isinstance(response, dict)
        return response

    return post


ONE_FIELD_CHANGED: dict[str, Callable[[dict[str, Any]], object]] = {
    "customerId": lambda body: body.update(customerId="c-2002"),
    "currency": lambda body: body.update(currency="EUR"),
    "sku": lambda body: body["items"][0].update(sku="SKU-GREEN-CUP"),
    "quantity": lambda body: body["items"][0].update(quantity=3),
    "unitPrice": lambda body: body["items"][0].update(unitPrice=1251),
}


@pytest.mark.parametrize("field", list(ONE_FIELD_CHANGED))
def test_the_same_key_with_a_body_differing_in_one_field_is_refused(post_order, stored, field):
    # Given an order created with an Idempotency-Key
    assert post_order(f"reuse-{field}")["statusCode"] == 201
    before = stored()

    # When the key is sent again with a body that differs from the first in that one field only
    response = post_order(f"reuse-{field}", ONE_FIELD_CHANGED[field])

    # Then the request is refused as a reuse of the key, and nothing is written
    assert response["statusCode"] == 422
    assert json_body(response)["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert stored() == before


# --- an expired request record no longer binds its key --------------------------------------------------
@pytest.fixture
def expire_request(template: Template) -> Callable[[str, str], None]:
    """What time does to a request record: its expiresAt passes (TTL deletion is lazy; the item stays)."""

    def expire(caller: str, key: str) -> None:
        boto3.client("dynamodb").update_item(
            TableName=template.physical_name("OrdersTable"),
            Key=keys.request_key(caller, key),
            UpdateExpression="SET expiresAt = :past",
            ConditionExpression="attribute_exists(#pk)",  # the record exists: expire it, never create one
            ExpressionAttributeNames={"#pk": keys.PK},
            ExpressionAttributeValues={":past": {"N": str(int(time.time()) - 60)}},
        )

    return expire


@pytest.mark.parametrize("command", [COMMAND, OTHER_COMMAND], ids=["same-body", "another-body"])
def test_an_expired_request_key_is_accepted_again_as_a_new_request(service, expire_request, stored, command):
    # Given an order placed with a key whose record has since expired
    first = place(service, key="expiring-1")
    expire_request(CALLER, "expiring-1")

    # When the key is sent again
    second = place(service, key="expiring-1", command=command)

    # Then it is a new request: a new order, not a replay of the first
    assert not second.replayed
    assert second.order["orderId"] != first.order["orderId"]
    assert sorted(order_id for order_id, _, _ in stored().orders) == sorted(
        [first.order["orderId"], second.order["orderId"]]
    )
    # And the key now binds the new order: a retry of the second request replays it
    retry = place(service, key="expiring-1", command=command)
    assert (retry.replayed, retry.order) == (True, second.order)


def test_an_expired_request_record_is_not_returned(service, repository, expire_request):
    place(service, key="expiring-2")
    assert repository.get_request(CALLER, "expiring-2") is not None

    expire_request(CALLER, "expiring-2")

    assert repository.get_request(CALLER, "expiring-2") is None
