"""The order service (the API, the order-status consumer) on DynamoDB."""

from __future__ import annotations

from shop.adapters.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderService
from shop.runtime import invocation
from shop.runtime.config import Settings, trace_header_from_env


def order_service(settings: Settings) -> OrderService:
    return OrderService(
        DynamoOrderRepository(
            settings, trace_header=trace_header_from_env, seconds_left=invocation.seconds_left
        ),
        settings,
    )
