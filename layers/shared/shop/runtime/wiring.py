"""The functions' composition root: domain services on their AWS adapters, built from settings.

Repositories written to from Lambda carry the invocation's X-Ray trace header into each outbox item.
"""

from __future__ import annotations

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.inventory_repository import DynamoInventoryRepository
from shop.adapters.order_repository import DynamoOrderRepository
from shop.adapters.poison_queue import PoisonQueue
from shop.adapters.sns import SnsTopic
from shop.domain.inventory import InventoryService
from shop.domain.notifications import CustomerNotifier
from shop.domain.orders import OrderService
from shop.runtime.config import Settings, trace_header_from_env


def order_service(settings: Settings) -> OrderService:
    return OrderService(DynamoOrderRepository(settings, trace_header=trace_header_from_env), settings)


def inventory_service(settings: Settings) -> InventoryService:
    return InventoryService(DynamoInventoryRepository(settings, trace_header=trace_header_from_env))


def customer_notifier(settings: Settings) -> CustomerNotifier:
    return CustomerNotifier(SnsTopic(settings.require("notification_topic_arn")))


def event_publisher(settings: Settings) -> EventPublisher:
    return EventPublisher(settings.require("event_bus_name"), settings.max_event_bytes)


def poison_queue(settings: Settings) -> PoisonQueue:
    return PoisonQueue(settings.require("relay_poison_queue_url"))
