"""Inventory consumer: OrderCreated reserves every line or none; OrderCancelled releases."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from shop.runtime.config import get_settings
from shop.runtime.consumer import ConsumerBatchProcessor, IdempotentConsumer, consume_sqs_batch
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.wiring.inventory import inventory_service

if TYPE_CHECKING:  # annotations only: importing it costs the cold start about 0.5 ms
    from aws_lambda_powertools.utilities.typing import LambdaContext

processor = ConsumerBatchProcessor()


@cache
def inventory_consumer() -> IdempotentConsumer:
    settings = get_settings()
    return IdempotentConsumer(settings, inventory_service(settings).apply)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return consume_sqs_batch(event, context, inventory_consumer(), processor)
