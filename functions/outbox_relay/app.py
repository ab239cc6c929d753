"""Outbox relay: DynamoDB stream batch → EventBridge, reporting the exact retry checkpoint.

Powertools' BatchProcessor handles records one by one; the relay needs whole-batch publishing
(10 entries per PutEvents call) with a single in-order checkpoint, so it answers in the same
`batchItemFailures` shape itself.
"""

from __future__ import annotations

import gc
from functools import cache
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.poison_queue import PoisonQueue
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.outbox_publishing import log_published
from shop.runtime.relay import StreamChange, relay_outbox_changes
from shop.runtime.wiring import relay as wiring


@cache
def event_publisher() -> EventPublisher:
    return wiring.event_publisher(get_settings())


@cache
def poison_queue() -> PoisonQueue:
    return wiring.poison_queue(get_settings())


def stream_changes(event: dict[str, Any]) -> list[StreamChange]:
    return [
        StreamChange(
            sequence_number=record["dynamodb"]["SequenceNumber"],
            event_name=record.get("eventName", ""),
            new_image=record["dynamodb"].get("NewImage"),
            stream_arn=record.get("eventSourceARN"),
        )
        for record in event.get("Records", [])
    ]


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    changes = stream_changes(event)
    metrics.add_metric(name="RelayBatchSize", unit=MetricUnit.Count, value=len(changes))
    outcome = relay_outbox_changes(
        changes,
        event_publisher(),
        poison_queue(),
        get_settings().max_event_bytes,
        remaining_seconds=lambda: context.get_remaining_time_in_millis() / 1000,
    )
    log_published(outcome)
    if outcome.checkpoint is None:
        return {"batchItemFailures": []}
    # Only a transient failure gets here (poison was parked). Lambda retries from the lowest reported
    # sequence number; reporting that one is enough.
    return {"batchItemFailures": [{"itemIdentifier": outcome.checkpoint}]}


# The init's objects out of the cyclic garbage collector's full passes, as in the outbox publisher (see
# there and docs/performance.md, "Relays at AWS latency").
gc.freeze()
