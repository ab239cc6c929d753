"""The outbox relay's publisher (EventBridge) and its poison queue (SQS)."""

from __future__ import annotations

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.poison_queue import PoisonQueue
from shop.runtime.config import Settings


def event_publisher(settings: Settings) -> EventPublisher:
    bus = settings.require("event_bus_name")
    return EventPublisher(
        bus,
        settings.max_event_bytes,
        max_in_flight=settings.publish_concurrency,
        transport=settings.publish_transport,
    )


def poison_queue(settings: Settings) -> PoisonQueue:
    return PoisonQueue(settings.require("relay_poison_queue_url"))
