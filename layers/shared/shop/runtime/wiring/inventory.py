"""The inventory service (the inventory consumer) on DynamoDB."""

from __future__ import annotations

from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.domain.inventory import InventoryService
from shop.runtime import invocation
from shop.runtime.config import Settings
from shop.runtime.trace_context import outbox_trace_header


def inventory_service(settings: Settings) -> InventoryService:
    return InventoryService(
        DynamoInventoryRepository(
            settings, trace_header=outbox_trace_header, seconds_left=invocation.seconds_left
        )
    )
