"""docs/guarantees.md, "Atomic write": an event is never written if it could not later be published, and a
new order is checked for its largest later event, its OrderRejected with every line refused. The
repositories add the trace of the write to every envelope they store (a traceparent): the check counts it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.envelope import CloudEvent, format_time
from shop.domain.errors import EventTooLarge
from shop.domain.orders import (
    ORDER_REJECTED,
    Order,
    OrderLine,
    OrderRejection,
    OrderService,
    OrderStatus,
    PlaceOrder,
    RejectedLine,
    RejectionReason,
)
from shop.runtime.config import Settings
from tools.template import Template

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
ORDER_ID = "o-0000000000000000000000000000b001"
# What Lambda's active tracing puts in _X_AMZN_TRACE_ID (the API), and a consumed message's AWSTraceHeader
# (the order-status consumer): the repositories write it into the envelope as its traceparent.
XRAY_HEADER = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
COMMAND = PlaceOrder("c-1", "USD", tuple(OrderLine(f"SKU-{n}", 1, 399) for n in range(4)))
EVERY_LINE_REFUSED = OrderRejection.of(
    tuple(RejectedLine(line.sku, 1, RejectionReason.INSUFFICIENT_STOCK) for line in COMMAND.lines)
)


def untraced_rejection_bytes() -> int:
    """The PutEvents size of this order's OrderRejected without a trace: a MaxEventBytes exactly there
    accepted the order, though its rejection, written with the trace, would not fit."""
    at = format_time(T0)  # as the service stamps it
    pending = Order(ORDER_ID, "c-1", "USD", COMMAND.lines, OrderStatus.PENDING, 1, at, at)
    rejected = pending.transition_to(OrderStatus.REJECTED, T0, EVERY_LINE_REFUSED)
    size = rejected.event(ORDER_REJECTED, "corr-1", str(uuid.UUID(int=0))).entry_size()
    assert size >= 1024  # a MaxEventBytes the template accepts
    return size


@pytest.fixture(params=["dynamodb", "postgres"])
def service(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> OrderService:
    limit = str(untraced_rejection_bytes())
    repository: Any
    if request.param == "dynamodb":
        request.getfixturevalue("aws")
        template: Template = request.getfixturevalue("template")
        monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
        monkeypatch.setenv("MAX_EVENT_BYTES", limit)
        settings = Settings.from_env()
        repository = DynamoOrderRepository(settings, trace_header=lambda: XRAY_HEADER)
    else:
        database: ConnectionSettings = request.getfixturevalue("order_database")
        settings = Settings.from_env({"MAX_EVENT_BYTES": limit})
        repository = PostgresOrderRepository(Database(database), settings, trace_header=lambda: XRAY_HEADER)
    return OrderService(repository, settings, clock=lambda: T0, new_id=lambda: ORDER_ID)


def test_an_order_accepted_at_creation_can_always_be_rejected(service: OrderService) -> None:
    try:
        service.place_order(COMMAND, idempotency_key=None, correlation_id="corr-1")
    except EventTooLarge:
        return  # refused at creation (413 EVENT_TOO_LARGE): nothing written that could be stuck later
    # Accepted (201): the inventory refuses every line, and the order-status consumer applies that.
    cause = CloudEvent.new(
        source="shop.inventory",
        type="InventoryRejected",
        subject=ORDER_ID,
        sequence=1,
        data={},
        correlation_id="corr-1",
    )

    applied = service.apply_inventory_outcome(ORDER_ID, OrderStatus.REJECTED, cause, EVERY_LINE_REFUSED)

    assert (
        applied == "rejected"
    )  # before the fix: EventTooLarge at every delivery, the order PENDING for ever
    assert service.get_order(ORDER_ID).status is OrderStatus.REJECTED


def test_at_the_limit_the_order_is_refused_at_creation(service: OrderService) -> None:
    with pytest.raises(EventTooLarge):
        service.place_order(COMMAND, idempotency_key=None, correlation_id="corr-1")
