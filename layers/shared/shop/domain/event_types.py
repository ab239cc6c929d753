"""The event types the domain emits and the shape of each one's `data`: one declaration per type.

The builders type their `data` with these declarations (`Order.to_dict`, `Reservation.event`), so mypy
holds them to it; tools/docs turns them into the JSON Schemas of docs/asyncapi.yaml, and
tools/docs/tests/test_generated_docs.py validates envelopes the domain really builds against that document.
`Constraint` adds what a Python type cannot say (a pattern, a minimum, the allowed values); it is
documentation, not checked at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NotRequired, TypedDict


@dataclass(frozen=True, slots=True)
class Constraint:
    """JSON Schema keywords of a field beyond its type."""

    description: str | None = None
    pattern: str | None = None
    minimum: int | None = None
    min_items: int | None = None
    format: str | None = None
    enum: tuple[str, ...] = ()


# The values of shop.domain.orders.OrderStatus and of the reservation statuses an event can carry
# (shop.domain.inventory.ReservationStatus less CANCELLED, which no event carries); a test compares them.
ORDER_STATUSES = ("PENDING", "CONFIRMED", "REJECTED", "CANCELLED")
RESERVATION_STATUSES = ("RESERVED", "REJECTED", "RELEASED")
# The values of shop.domain.orders.RejectionReason; a test compares them.
REJECTION_REASONS = ("INSUFFICIENT_STOCK", "UNKNOWN_SKU")
Timestamp = Annotated[str, Constraint(format="date-time")]


class OrderItemData(TypedDict):
    sku: str
    quantity: Annotated[int, Constraint(minimum=1)]
    unitPrice: Annotated[int, Constraint(minimum=0)]
    lineTotal: Annotated[int, Constraint(minimum=0)]


class RejectedLineData(TypedDict):
    sku: str
    quantity: Annotated[int, Constraint(description="what the order asked of this SKU", minimum=1)]
    reason: Annotated[
        str,
        Constraint(
            description="UNKNOWN_SKU: the inventory has no stock of it at all; INSUFFICIENT_STOCK: less "
            "than the order asks",
            enum=REJECTION_REASONS,
        ),
    ]


class OrderRejectionData(TypedDict):
    """Why the inventory refused the order: the lines it could not reserve."""

    reason: Annotated[
        str,
        Constraint(
            description="UNKNOWN_SKU when any line's SKU is unknown, else INSUFFICIENT_STOCK",
            enum=REJECTION_REASONS,
        ),
    ]
    lines: Annotated[list[RejectedLineData], Constraint(min_items=1)]


class OrderData(TypedDict):
    """The order representation: `data` of every order event, and the API's response body."""

    orderId: str
    customerId: str
    currency: Annotated[str, Constraint(pattern="^[A-Z]{3}$")]
    items: Annotated[list[OrderItemData], Constraint(min_items=1)]
    totalAmount: Annotated[int, Constraint(description="minor units of the currency", minimum=0)]
    status: Annotated[str, Constraint(enum=ORDER_STATUSES)]
    version: Annotated[int, Constraint(minimum=1)]
    createdAt: Timestamp
    updatedAt: Timestamp
    # A REJECTED order's reason (its OrderRejected carries it); none on orders rejected before it was kept.
    rejection: NotRequired[OrderRejectionData]


class ReservationLineData(TypedDict):
    sku: str
    quantity: Annotated[int, Constraint(minimum=1)]


class ReservationData(TypedDict):
    """An order's stock reservation: `data` of every inventory event."""

    orderId: str
    orderSequence: Annotated[
        int, Constraint(description="sequence of the last order event the reservation applied", minimum=1)
    ]
    status: Annotated[str, Constraint(enum=RESERVATION_STATUSES)]
    lines: Annotated[list[ReservationLineData], Constraint(description="quantity per SKU")]


class Rejection(TypedDict):
    reason: Annotated[str, Constraint(enum=("INSUFFICIENT_STOCK",))]
    shortSkus: Annotated[list[str], Constraint(description="the SKUs short of stock", min_items=1)]
    # Absent from events emitted before the inventory told an unknown SKU from a short one.
    unknownSkus: NotRequired[
        Annotated[
            list[str], Constraint(description="those of shortSkus the inventory has no stock of at all")
        ]
    ]


class InventoryRejectedData(ReservationData, Rejection):
    """A reservation refused, with the reason."""


@dataclass(frozen=True, slots=True)
class EventType:
    name: str  # the CloudEvents `type`, EventBridge's detail-type
    source: str  # the CloudEvents `source`, EventBridge's source
    data: type  # the TypedDict of its `data`
    summary: str  # when it is emitted, and by whom


ORDERS = "shop.orders"
INVENTORY = "shop.inventory"

EVENT_TYPES: tuple[EventType, ...] = (
    EventType("OrderCreated", ORDERS, OrderData, "An order was placed (status PENDING), by the order API."),
    EventType(
        "OrderCancelled", ORDERS, OrderData, "A PENDING or CONFIRMED order was cancelled, by the order API."
    ),
    EventType(
        "OrderConfirmed",
        ORDERS,
        OrderData,
        "The inventory reserved the order's stock (order-status consumer).",
    ),
    EventType(
        "OrderRejected",
        ORDERS,
        OrderData,
        "The inventory refused the order's stock, `rejection` says why (order-status consumer).",
    ),
    EventType(
        "InventoryReserved",
        INVENTORY,
        ReservationData,
        "Every line of a new order was reserved, by the inventory consumer.",
    ),
    EventType(
        "InventoryRejected",
        INVENTORY,
        InventoryRejectedData,
        "A new order asked for more than the stock or for a SKU without stock, so nothing was reserved "
        "(inventory consumer).",
    ),
    EventType(
        "InventoryReleased",
        INVENTORY,
        ReservationData,
        "The stock of a cancelled order was released, by the inventory consumer.",
    ),
)
