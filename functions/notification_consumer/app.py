"""Notification consumer: one customer notification per OrderConfirmed/OrderRejected/OrderCancelled."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from shop.runtime.config import get_settings
from shop.runtime.consumer import ConsumerBatchProcessor, IdempotentConsumer, consume_sqs_batch
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.wiring.notifications import customer_notifier

if TYPE_CHECKING:  # annotations only: importing it costs the cold start about 0.5 ms
    from aws_lambda_powertools.utilities.typing import LambdaContext

processor = ConsumerBatchProcessor()


@cache
def notification_consumer() -> IdempotentConsumer:
    settings = get_settings()
    return IdempotentConsumer(settings, customer_notifier(settings).notify)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return consume_sqs_batch(event, context, notification_consumer(), processor)
