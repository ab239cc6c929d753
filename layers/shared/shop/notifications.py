"""Customer notifications: one SNS message per saga outcome event.

Publishing to SNS is not transactional with anything: the idempotency record is the only guard, so
a crash after Publish and before the record completes re-sends the notification on redelivery.
Each message carries the event id (`eventId` attribute) so a subscriber can drop that rare repeat.
"""

from __future__ import annotations

import json

from shop import aws
from shop.envelope import CloudEvent
from shop.errors import InvalidEnvelope
from shop.orders import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_REJECTED

NOTIFIABLE = frozenset({ORDER_CONFIRMED, ORDER_REJECTED, ORDER_CANCELLED})


class CustomerNotifier:
    def __init__(self, topic_arn: str) -> None:
        self._topic_arn = topic_arn

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
        response = aws.sns().publish(
            TopicArn=self._topic_arn,
            Message=json.dumps(message, separators=(",", ":")),
            MessageAttributes={
                "eventId": {"DataType": "String", "StringValue": event.id},
                "eventType": {"DataType": "String", "StringValue": event.type},
            },
        )
        return f"notified:{response['MessageId']}"
