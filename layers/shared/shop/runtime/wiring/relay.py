"""The outbox relay's publisher (EventBridge) and its poison queue (SQS)."""

from __future__ import annotations

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.poison_queue import PoisonQueue
from shop.runtime.config import Settings


def event_publisher(settings: Settings) -> EventPublisher:
    return EventPublisher(settings.require("event_bus_name"), settings.max_event_bytes)


def poison_queue(settings: Settings) -> PoisonQueue:
    return PoisonQueue(settings.require("relay_poison_queue_url"))
