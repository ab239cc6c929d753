"""The saga's wiring between bounded contexts: which inventory answer moves an order where."""

from __future__ import annotations

from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.domain.inventory import INVENTORY_REJECTED, INVENTORY_RESERVED
from shop.domain.orders import OrderService, OrderStatus

_STATUS_FOR_INVENTORY_ANSWER = {
    INVENTORY_RESERVED: OrderStatus.CONFIRMED,
    INVENTORY_REJECTED: OrderStatus.REJECTED,
}


class OrderStatusPolicy:
    def __init__(self, orders: OrderService) -> None:
        self._orders = orders

    def apply(self, event: CloudEvent) -> str:
        status = _STATUS_FOR_INVENTORY_ANSWER.get(event.type)
        if status is None:
            raise InvalidEnvelope("order status does not handle this event type", {"type": event.type})
        return self._orders.apply_inventory_outcome(event.subject, status, event)
