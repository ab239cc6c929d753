"""The customer notifier (the notification consumer) on SNS."""

from __future__ import annotations

from shop.adapters.sns import SnsTopic
from shop.domain.notifications import CustomerNotifier
from shop.runtime.config import Settings


def customer_notifier(settings: Settings) -> CustomerNotifier:
    return CustomerNotifier(SnsTopic(settings.require("notification_topic_arn")))
