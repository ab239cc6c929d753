"""The names of the events each context emits (a CloudEvent's `type`, its PutEvents DetailType).

Apart from the aggregates that emit them, so that a context reading another's events imports their
names and not the other's aggregate: the inventory reads order events, the notifications read order
outcomes, the saga reads the inventory's answers. Each aggregate's module re-exports its own names
(shop.domain.orders.ORDER_CREATED is this ORDER_CREATED).
"""

ORDER_CREATED = "OrderCreated"
ORDER_CANCELLED = "OrderCancelled"
ORDER_CONFIRMED = "OrderConfirmed"
ORDER_REJECTED = "OrderRejected"

INVENTORY_RESERVED = "InventoryReserved"
INVENTORY_REJECTED = "InventoryRejected"
INVENTORY_RELEASED = "InventoryReleased"
