"""Customer notifications: one message per saga outcome event, on a channel (SNS: adapters.sns).

Publishing to SNS is not transactional with anything: the idempotency record is the only guard, so
a crash after Publish and before the record completes re-sends the notification on redelivery.
Each message carries the event id (`eventId` attribute) so a subscriber can drop that rare repeat.
"""

from __future__ import annotations

import json
from typing import Protocol

from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.domain.event_names import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_REJECTED

NOTIFIABLE = frozenset({ORDER_CONFIRMED, ORDER_REJECTED, ORDER_CANCELLED})


class NotificationChannel(Protocol):
    def send(self, message: str, attributes: dict[str, str]) -> str:
        """Deliver one message with its string attributes; returns the channel's message id."""


class CustomerNotifier:
    def __init__(self, channel: NotificationChannel) -> None:
        self._channel = channel

    def notify(self, event: CloudEvent) -> str:
        if event.type not in NOTIFIABLE:
            raise InvalidEnvelope("not a notifiable event", {"type": event.type})
        # Ids and status only: no customer data beyond ids leaves the system in a notification.
        message = {
            "eventId": event.id,
            "type": event.type,
            "orderId": event.subject,
            "customerId": event.data.get("customerId"),
            "status": event.data.get("status"),
            "sequence": event.sequence,
        }
        message_id = self._channel.send(
            json.dumps(message, separators=(",", ":")), {"eventId": event.id, "eventType": event.type}
        )
        return f"notified:{message_id}"
