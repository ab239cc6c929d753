"""The inventory service (the inventory consumer) on DynamoDB."""

from __future__ import annotations

from shop.adapters.inventory_repository import DynamoInventoryRepository
from shop.domain.inventory import InventoryService
from shop.runtime import invocation
from shop.runtime.config import Settings, trace_header_from_env


def inventory_service(settings: Settings) -> InventoryService:
    return InventoryService(
        DynamoInventoryRepository(
            settings, trace_header=trace_header_from_env, seconds_left=invocation.seconds_left
        )
    )
