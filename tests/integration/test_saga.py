"""The order saga end to end through the local stack: HTTP API, real DynamoDB Local streams, the relay,
the bus, the queues and the three consumers, exactly as `make local` runs them; each test on both order
stores (saga_stack: OrderStore=dynamodb, and postgres with the polling or the logical outbox relay)."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

import shop.adapters.aws
import shop.runtime.config
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from tests.local_stacks import created_order
from tools.local.stack import LocalStack

SAGA_SECONDS = 20.0  # a bound on waiting, not a speed target (make bench measures latency)


@pytest.fixture
def inventory(saga_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[DynamoInventoryRepository]:
    """The stack's inventory table through the domain repository (stock is seeded per test)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", saga_stack.endpoints.dynamodb)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("INVENTORY_TABLE_NAME", saga_stack.template.physical_name("InventoryTable"))
    shop.runtime.config.get_settings.cache_clear()
    shop.adapters.aws.reset_clients()
    yield DynamoInventoryRepository(shop.runtime.config.Settings.from_env())
    shop.adapters.aws.reset_clients()


@pytest.fixture
def sku(inventory: DynamoInventoryRepository) -> Callable[[int], str]:
    """A fresh SKU with the given stock, so tests sharing the stack never share stock."""

    def make(available: int) -> str:
        name = f"SKU-IT-{uuid.uuid4().hex[:10]}"
        inventory.set_stock(name, available)
        return name

    return make


def place(stack: LocalStack, lines: list[tuple[str, int]]) -> dict[str, Any]:
    return created_order(stack, "c-it", [{"sku": s, "quantity": q, "unitPrice": 500} for s, q in lines])


def status_becomes(stack: LocalStack, order_id: str, status: str) -> dict[str, Any]:
    def current() -> dict[str, Any] | None:
        order = requests.get(f"{stack.api_url}/orders/{order_id}", timeout=10).json()
        return order if order["status"] == status else None

    return stack.wait_for(current, SAGA_SECONDS, f"order {order_id} {status}")


def notifications(stack: LocalStack, order_id: str) -> list[dict[str, Any]]:
    messages = [json.loads(p.message) for p in stack.activity.publications()]
    return [m for m in messages if m.get("orderId") == order_id]


def notified(stack: LocalStack, order_id: str, event_type: str) -> list[dict[str, Any]]:
    return stack.wait_for(
        lambda: [m for m in notifications(stack, order_id) if m["type"] == event_type],
        SAGA_SECONDS,
        f"{event_type} notification for {order_id}",
    )


def test_an_order_with_stock_is_confirmed_and_notified_once(saga_stack: LocalStack, inventory, sku):
    mug, pen = sku(10), sku(3)

    order = place(saga_stack, [(mug, 2), (pen, 3)])

    assert status_becomes(saga_stack, order["orderId"], "CONFIRMED")["version"] == 2
    assert (inventory.available(mug), inventory.available(pen)) == (8, 0)
    notified(saga_stack, order["orderId"], "OrderConfirmed")
    # every event of the saga has gone through: nothing more for this order can arrive
    assert [m["type"] for m in notifications(saga_stack, order["orderId"])] == ["OrderConfirmed"]


def test_an_order_for_missing_stock_is_rejected_saying_why_and_nothing_is_reserved(
    saga_stack: LocalStack, inventory, sku
):
    plenty, scarce = sku(10), sku(1)
    unknown = f"SKU-IT-NEVER-STOCKED-{uuid.uuid4().hex[:10]}"

    order = place(saga_stack, [(plenty, 1), (scarce, 2), (unknown, 1)])

    rejected = status_becomes(saga_stack, order["orderId"], "REJECTED")
    assert (inventory.available(plenty), inventory.available(scarce)) == (10, 1)
    assert len(notified(saga_stack, order["orderId"], "OrderRejected")) == 1
    # GET names the reason and each line refused (kept by the order store: DynamoDB, or PostgreSQL)
    refused = {scarce: (2, "INSUFFICIENT_STOCK"), unknown: (1, "UNKNOWN_SKU")}
    assert rejected["rejection"] == {
        "reason": "UNKNOWN_SKU",
        "lines": [
            {"sku": name, "quantity": quantity, "reason": reason}
            for name, (quantity, reason) in sorted(refused.items())
        ],
    }


def test_a_cancelled_order_gets_its_stock_back_and_the_customer_is_told(
    saga_stack: LocalStack, inventory, sku
):
    mug = sku(5)
    order = place(saga_stack, [(mug, 4)])
    status_becomes(saga_stack, order["orderId"], "CONFIRMED")

    response = requests.post(f"{saga_stack.api_url}/orders/{order['orderId']}/cancel", timeout=10)

    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    saga_stack.wait_for(lambda: inventory.available(mug) == 5, SAGA_SECONDS, "stock released")
    assert len(notified(saga_stack, order["orderId"], "OrderCancelled")) == 1
    assert len(notified(saga_stack, order["orderId"], "OrderConfirmed")) == 1


def consumer_deliveries(
    stack: LocalStack, order_id: str
) -> list[tuple[str, dict[str, Any], dict[str, Any]]] | None:
    """(consumer, CloudEvent, message attributes) of each delivery of the order's events, once all three
    consumers have had one; None before."""
    seen = [
        (invocation.function, json.loads(record["body"])["detail"], record.get("attributes", {}))
        for invocation in stack.activity.invocations()
        if invocation.trigger == "sqs"
        for record in invocation.records
        if json.loads(record["body"]).get("detail", {}).get("subject") == order_id
    ]
    consumers = {"InventoryFunction", "OrderStatusFunction", "NotificationFunction"}
    return seen if {function for function, _, _ in seen} == consumers else None


def test_the_correlation_id_of_the_request_reaches_every_event_of_the_saga(saga_stack: LocalStack, sku):
    correlation = f"corr-it-{uuid.uuid4().hex[:8]}"
    items = [{"sku": sku(2), "quantity": 1, "unitPrice": 1}]
    order_id = created_order(saga_stack, "c-it", items, {"X-Correlation-Id": correlation})["orderId"]

    events = saga_stack.wait_for(
        functools.partial(consumer_deliveries, saga_stack, order_id),
        SAGA_SECONDS,
        "every consumer handled the saga",
    )
    assert {event["correlationid"] for _, event, _ in events} == {correlation}


def test_one_saga_is_one_trace_from_the_api_to_the_notification(saga_stack: LocalStack, sku):
    """The order API's trace reaches every event of its saga: each envelope's traceparent (the CloudEvents
    tracing extension) names one trace id, and each consumer received its message with that trace as its
    AWSTraceHeader, as EventBridge hands a PutEvents TraceHeader to an SQS target. Another order is
    another trace."""
    from shop.domain.tracing import from_traceparent, from_xray_header

    def place_one() -> str:
        order = created_order(saga_stack, "c-tr", [{"sku": sku(2), "quantity": 1, "unitPrice": 1}])
        return str(order["orderId"])

    trace_ids = []
    for order_id in (place_one(), place_one()):
        seen = saga_stack.wait_for(
            functools.partial(consumer_deliveries, saga_stack, order_id),
            SAGA_SECONDS,
            "every consumer handled it",
        )
        contexts = [from_traceparent(event.get("traceparent")) for _, event, _ in seen]
        assert None not in contexts, [event.get("traceparent") for _, event, _ in seen]
        assert len({context.trace_id for context in contexts if context}) == 1
        trace_id = contexts[0].trace_id if contexts[0] else ""
        for function, event, attributes in seen:
            carried = from_xray_header(attributes.get("AWSTraceHeader"))
            assert carried is not None, (function, event["type"], attributes)
            assert carried.trace_id == trace_id, (function, event["type"])
        trace_ids.append(trace_id)
    assert trace_ids[0] != trace_ids[1]
