"""The saga's wiring between bounded contexts: which inventory answer moves an order where, and why."""

from __future__ import annotations

from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.domain.event_names import INVENTORY_REJECTED, INVENTORY_RESERVED
from shop.domain.inventory import stock_line
from shop.domain.orders import OrderRejection, OrderService, OrderStatus, RejectedLine, RejectionReason

_STATUS_FOR_INVENTORY_ANSWER = {
    INVENTORY_RESERVED: OrderStatus.CONFIRMED,
    INVENTORY_REJECTED: OrderStatus.REJECTED,
}


def rejection_of(event: CloudEvent) -> OrderRejection:
    """The order's rejection as an InventoryRejected states it: each SKU in `shortSkus`, with the quantity
    the reservation's `lines` asked of it, UNKNOWN_SKU when `unknownSkus` names it (events emitted before
    the inventory told the two apart name none: INSUFFICIENT_STOCK)."""
    try:
        asked = dict(stock_line(line, event) for line in event.data["lines"])
        unknown = {str(sku) for sku in event.data.get("unknownSkus", [])}
        lines = tuple(
            RejectedLine(
                sku,
                asked[sku],
                RejectionReason.UNKNOWN_SKU if sku in unknown else RejectionReason.INSUFFICIENT_STOCK,
            )
            for sku in map(str, event.data["shortSkus"])
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidEnvelope(
            "InventoryRejected without valid lines and shortSkus", {"eventId": event.id}
        ) from exc
    if not lines:
        raise InvalidEnvelope("InventoryRejected naming no short SKU", {"eventId": event.id})
    return OrderRejection.of(lines)


class OrderStatusPolicy:
    def __init__(self, orders: OrderService) -> None:
        self._orders = orders

    def apply(self, event: CloudEvent) -> str:
        status = _STATUS_FOR_INVENTORY_ANSWER.get(event.type)
        if status is None:
            raise InvalidEnvelope("order status does not handle this event type", {"type": event.type})
        rejection = rejection_of(event) if status is OrderStatus.REJECTED else None
        return self._orders.apply_inventory_outcome(event.subject, status, event, rejection)
