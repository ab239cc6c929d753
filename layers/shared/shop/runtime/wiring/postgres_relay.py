"""The PostgreSQL outbox's relay (PostgresRelay), chosen here as the order store is (OrderStore): the
logical relay reads the outbox's inserts from the replication slot, the polling publisher claims rows."""

from __future__ import annotations

from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.replication import slot_name
from shop.domain.poison import PoisonSink
from shop.domain.publishing import OutboxPublisher
from shop.runtime import invocation
from shop.runtime.config import Settings
from shop.runtime.logical_relay import relay_slot_round
from shop.runtime.outbox_publishing import PublishOutcome
from shop.runtime.polling_publisher import publish_pending_round
from shop.runtime.wiring.order_database import order_database


def publish_round(
    settings: Settings, publisher: OutboxPublisher, poison_sink: PoisonSink
) -> PublishOutcome[OutboxRow]:
    """One round of the configured relay, within the invocation's time."""
    if settings.postgres_relay == "logical":
        return relay_slot_round(
            order_database(settings),
            publisher,
            poison_sink,
            slot=slot_name(settings.database_name),
            max_event_bytes=settings.max_event_bytes,
            remaining_seconds=invocation.seconds_left,
        )
    return publish_pending_round(
        order_database(settings),
        publisher,
        poison_sink,
        max_event_bytes=settings.max_event_bytes,
        remaining_seconds=invocation.seconds_left,
    )
