"""Order-status consumer: InventoryReserved confirms, InventoryRejected rejects a pending order."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from shop.domain.saga import OrderStatusPolicy
from shop.runtime.config import get_settings
from shop.runtime.consumer import ConsumerBatchProcessor, IdempotentConsumer, consume_sqs_batch
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.wiring.orders import order_service

if TYPE_CHECKING:  # annotations only: importing it costs the cold start about 0.5 ms
    from aws_lambda_powertools.utilities.typing import LambdaContext

processor = ConsumerBatchProcessor()
# Its name in the PostgreSQL order store's inbox (OrderStore=postgres): stable across stages and renames.
INBOX_CONSUMER = "order-status"


@cache
def order_status_consumer() -> IdempotentConsumer:
    settings = get_settings()
    policy = OrderStatusPolicy(order_service(settings, inbox_consumer=INBOX_CONSUMER))
    return IdempotentConsumer(settings, policy.apply)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return consume_sqs_batch(event, context, order_status_consumer(), processor)
