"""The order service (the API, the order-status consumer) on its order store (OrderStore)."""

from __future__ import annotations

# Imported with the module, so a cold start pays for the default store's adapter at init, as before
# there was a choice (the cold-start bench measures it); the PostgreSQL adapter is imported on first
# use, so DynamoDB deployments never load psycopg.
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderRepository, OrderService
from shop.runtime import invocation
from shop.runtime.config import Settings
from shop.runtime.trace_context import outbox_trace_header


def order_repository(settings: Settings, *, inbox_consumer: str | None = None) -> OrderRepository:
    """The store's repository. `inbox_consumer`: the consumer whose effects it writes, recorded in the
    PostgreSQL inbox (DynamoDB consumers rely on Powertools idempotency and the version condition)."""
    if settings.order_store == "postgres":
        from shop.adapters.postgres.order_repository import PostgresOrderRepository
        from shop.runtime.wiring.order_database import order_database

        return PostgresOrderRepository(
            order_database(settings),
            settings,
            trace_header=outbox_trace_header,
            inbox_consumer=inbox_consumer,
        )
    return DynamoOrderRepository(
        settings, trace_header=outbox_trace_header, seconds_left=invocation.seconds_left
    )


def order_service(settings: Settings, *, inbox_consumer: str | None = None) -> OrderService:
    return OrderService(order_repository(settings, inbox_consumer=inbox_consumer), settings)
