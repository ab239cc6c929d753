"""A dead-lettered message's receive count and last error on the inspector's queue cards
(stack_view.Deliveries): from the stack's own record of its deliveries, never from the message (each of
the page's peeks raises its receive count)."""

from __future__ import annotations

from typing import Any

from tools.local.console.activity import Entry
from tools.local.console.reports import RecordReport
from tools.local.inspector.stack_view import Deliveries, message_summary
from tools.local.inspector.timeline import build_hops, report_notice
from tools.local.runtime.functions import FunctionError
from tools.local.tests.saga_entries import consumer, envelope, message, outbox_record, relay


def peeked(message_id: str, body: Any, delivery_error: str | None = None) -> dict[str, Any]:
    """A message as stack_view's peek returns it."""
    return {
        "messageId": message_id,
        "sentAtMs": None,
        "summary": message_summary(body),
        "body": body,
        "deliveryError": delivery_error,
    }


def test_a_consumer_dead_letter_shows_its_last_deliverys_receive_count_and_error() -> None:
    created = envelope("OrderCreated", "o-1", "corr-1")
    first, second = message(created, receive_count=1), message(created, receive_count=2)
    second["messageId"] = first["messageId"]  # the same message, delivered again
    failing = consumer(
        "InventoryFunction", "InventoryQueue", [first], 0.0, error=FunctionError("Sandbox.Timedout", "3 s")
    )
    again = consumer("InventoryFunction", "InventoryQueue", [second], 60.0, error=FunctionError("Error", "x"))
    said = RecordReport(
        "failed", "ConcurrentModification: the order kept changing", created["id"], first["messageId"]
    )
    entries: list[Entry] = [failing, again, report_notice("InventoryFunction", again.result.request_id, said)]

    told = Deliveries(build_hops(entries)).told(peeked(first["messageId"], {"detail": created}))

    assert (told["receiveCount"], told["lastError"], told["lastFunction"]) == (
        2,
        "ConcurrentModification: the order kept changing",
        "InventoryFunction",
    )


def test_a_message_the_stack_never_delivered_shows_what_eventbridge_said_or_nothing() -> None:
    deliveries = Deliveries([])

    undelivered = deliveries.told(peeked("m-1", {}, delivery_error="SQS_QUEUE_FULL: the queue is full"))
    unknown = deliveries.told(peeked("m-2", {}))

    assert (undelivered["receiveCount"], undelivered["lastError"]) == (
        None,
        "SQS_QUEUE_FULL: the queue is full",
    )
    assert (unknown["receiveCount"], unknown["lastError"]) == (None, None)


def test_a_stream_batchs_failure_document_shows_its_invocations_and_the_last_ones_error() -> None:
    created = envelope("OrderCreated", "o-1", "corr-1")
    failed = relay([outbox_record(created, "100")], 0.0, failed=("100",))
    said = RecordReport("failed", "PutEvents InternalException x1", created["id"], sequence_number="100")
    entries: list[Entry] = [failed, report_notice("OutboxRelayFunction", failed.result.request_id, said)]
    document = {
        "requestContext": {
            "requestId": failed.result.request_id,
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": 3,
        },
        "DDBStreamBatchInfo": {"batchSize": 1, "startSequenceNumber": "100", "endSequenceNumber": "100"},
    }

    told = Deliveries(build_hops(entries)).told(peeked("m-3", document))

    assert (told["invokeCount"], told["receiveCount"], told["lastError"]) == (
        3,
        None,
        "PutEvents InternalException x1",
    )
