"""Idempotent consumption of bus events delivered through SQS (Powertools batch + idempotency).

Every consumer: parses the EventBridge envelope in the SQS body into a CloudEvent, applies the event
at most once per CloudEvent id (Powertools idempotency, DynamoDB persistence with TTL), and reports
per-message failures so one bad message never blocks or re-sends the rest of its batch.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from shop.adapters import aws
from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.runtime import invocation
from shop.runtime.config import Settings
from shop.runtime.observability import logger, metrics
from shop.runtime.trace_context import continuing

if TYPE_CHECKING:  # annotations only: importing it costs the cold start about 0.5 ms
    from aws_lambda_powertools.utilities.typing import LambdaContext


def cloud_event_from_sqs_body(body: str) -> CloudEvent:
    """The CloudEvent carried as `detail` of the EventBridge event that SQS received."""
    try:
        envelope = json.loads(body)
    except (ValueError, TypeError, RecursionError) as exc:  # as CloudEvent.from_json: any decoding failure
        raise InvalidEnvelope("message body is not JSON") from exc
    if not isinstance(envelope, dict) or "detail" not in envelope:
        raise InvalidEnvelope("message body is not an EventBridge event")
    return CloudEvent.from_dict(envelope["detail"])


class ConsumerBatchProcessor(BatchProcessor):
    """Powertools' SQS batch processor that logs each failure with its message and event ids."""

    def __init__(self) -> None:
        # A batch whose every message failed is reported message by message, like any other: the
        # effect on SQS is the same as a function error, without counting as one (no Errors alarm).
        super().__init__(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

    def failure_handler(self, record: Any, exception: Any) -> Any:
        _, error, _ = exception
        event_id = None
        # Only to log the event id: a body that cannot give one (not JSON, nested past the recursion limit,
        # an integer past the digit limit, not an object) is logged without it, and fails alone.
        with contextlib.suppress(ValueError, TypeError, RecursionError, AttributeError):
            event_id = json.loads(record.body).get("detail", {}).get("id")
        logger.error(
            "message failed; it will be retried and then dead-lettered",
            extra={
                "message_id": record.message_id,
                "event_id": event_id,
                "error_type": type(error).__name__,
                "error": str(error)[:500],
            },
        )
        metrics.add_metric(name="MessagesFailed", unit=MetricUnit.Count, value=1)
        return super().failure_handler(record, exception)


def _count_duplicate(response: Any, idempotent_data: DataRecord) -> Any:
    """Called by Powertools when an event id was already processed: the stored result is returned."""
    logger.info("duplicate event skipped", extra={"idempotency_key": idempotent_data.idempotency_key})
    metrics.add_metric(name="DuplicatesSkipped", unit=MetricUnit.Count, value=1)
    return response


_PER_MESSAGE_KEYS = ("correlation_id", "causation_id", "event_type")

# Powertools names an idempotency record "<function name>.<module>.<qualified name>#<hash of the key>"
# unless given a key_prefix, so moving or renaming the decorated function would silently discard every
# consumer's dedupe history (each redelivery inside the window applied again). The prefix is pinned to
# the value Powertools derived for this code before the pin, so records written before it still match.
# The function name stays in it: consumers that share the table and an event (OrderCancelled reaches
# inventory and notification) must keep separate records.
IDEMPOTENCY_KEY_SUFFIX = "shop.runtime.consumer.IdempotentConsumer.__init__.<locals>.apply_once"


def idempotency_key_prefix(settings: Settings) -> str:
    return f"{settings.function_name}.{IDEMPOTENCY_KEY_SUFFIX}"


class IdempotentConsumer:
    """Applies CloudEvents through `effect` at most once per event id."""

    def __init__(self, settings: Settings, effect: Callable[[CloudEvent], str]) -> None:
        self.config = IdempotencyConfig(
            event_key_jmespath="id",
            raise_on_no_idempotency_key=True,
            expires_after_seconds=settings.idempotency_expires_after_seconds,
            response_hook=_count_duplicate,
        )
        persistence = DynamoDBPersistenceLayer(
            table_name=settings.require("idempotency_table_name"), boto3_client=aws.dynamodb()
        )

        @idempotent_function(  # type: ignore[untyped-decorator]  # Powertools' decorator is untyped
            data_keyword_argument="event",
            persistence_store=persistence,
            config=self.config,
            key_prefix=idempotency_key_prefix(settings),
        )
        def apply_once(event: dict[str, Any]) -> dict[str, str]:
            cloud_event = CloudEvent.from_dict(event)
            outcome = effect(cloud_event)
            logger.info(
                "event applied",
                extra={"event_id": cloud_event.id, "event_type": cloud_event.type, "outcome": outcome},
            )
            return {"eventId": cloud_event.id, "outcome": outcome}

        self._apply_once = apply_once

    def handle_record(self, record: SQSRecord) -> dict[str, str]:
        # Each message belongs to its own saga: never log one under the previous message's ids.
        logger.remove_keys(list(_PER_MESSAGE_KEYS))
        event = cloud_event_from_sqs_body(record.body)
        logger.append_keys(correlation_id=event.correlationid, causation_id=event.id, event_type=event.type)
        with continuing(record.attributes.aws_trace_header):  # the saga's trace, not this invocation's
            result: dict[str, str] = self._apply_once(event=event.to_dict())
        return result


def consume_sqs_batch(
    event: dict[str, Any], context: LambdaContext, consumer: IdempotentConsumer, processor: BatchProcessor
) -> dict[str, Any]:
    """Process an SQS batch; the response names only the messages that failed."""
    # An IN_PROGRESS record left by a crashed invocation expires with that invocation's deadline.
    consumer.config.register_lambda_context(context)
    invocation.begin(context)  # the repositories' retries stop short of this invocation's timeout
    response = process_partial_response(
        event=event, record_handler=consumer.handle_record, processor=processor, context=context
    )
    return dict(response)
