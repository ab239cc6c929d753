"""Activity entries of one order's saga, shaped as the local stack records them (the gateway, the stream
and queue pollers, the topic watcher), for the inspector's unit tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tools.local.console.activity import Invocation, Publication
from tools.local.runtime.functions import FunctionError, InvocationResult

T0 = 1_795_348_800.0  # epoch seconds: every time below is an offset from it


def envelope(
    event_type: str, order_id: str, correlation_id: str, *, causation_id: str | None = None, sequence: int = 1
) -> dict[str, Any]:
    """A CloudEvent as shop/domain/envelope.py writes it (its id need not be deterministic here)."""
    document: dict[str, Any] = {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "source": "shop.orders",
        "type": event_type,
        "subject": order_id,
        "time": "2026-11-21T12:03:20.000Z",
        "datacontenttype": "application/json",
        "sequence": sequence,
        "correlationid": correlation_id,
        "data": {"orderId": order_id},
    }
    if causation_id is not None:
        document["causationid"] = causation_id
    return document


def result(
    start: float, duration_ms: float, *, payload: Any = None, error: FunctionError | None = None
) -> Any:
    return InvocationResult(
        request_id=str(uuid.uuid4()),
        payload=payload,
        error=error,
        duration_ms=duration_ms,
        started_at=T0 + start,
    )


def api_request(
    order_id: str, correlation_id: str, start: float, *, method: str = "POST", status: int = 201
) -> Invocation:
    path = "/orders" if method == "POST" else f"/orders/{order_id}"
    event = {
        "httpMethod": method,
        "path": path,
        "pathParameters": None if method == "POST" else {"orderId": order_id},
        "requestContext": {"requestId": str(uuid.uuid4())},
    }
    payload = {
        "statusCode": status,
        "headers": {"Content-Type": "application/json", "X-Correlation-Id": correlation_id},
        "body": json.dumps({"orderId": order_id, "status": "PENDING"}),
    }
    route = "POST /orders" if method == "POST" else "GET /orders/{orderId}"
    return Invocation("OrdersApiFunction", "api", route, event, result(start, 50, payload=payload))


def outbox_record(
    event: dict[str, Any] | None, sequence_number: str, *, raw_envelope: str | None = None
) -> dict[str, Any]:
    """A stream record of an outbox INSERT (its envelope unreadable when raw_envelope is given)."""
    image: dict[str, Any] = {
        "PK": {"S": "ORDER#x"},
        "SK": {"S": "OUTBOX#000000000001#x"},
        "envelope": {"S": raw_envelope if raw_envelope is not None else json.dumps(event)},
    }
    if event is not None:
        image |= {
            "eventId": {"S": event["id"]},
            "eventType": {"S": event["type"]},
            "aggregateId": {"S": event["subject"]},
        }
    return {"eventName": "INSERT", "dynamodb": {"SequenceNumber": sequence_number, "NewImage": image}}


def relay(
    records: list[dict[str, Any]], start: float, *, table: str = "OrdersTable", failed: tuple[str, ...] = ()
) -> Invocation:
    answer = {"batchItemFailures": [{"itemIdentifier": f} for f in failed]}
    return Invocation(
        "OutboxRelayFunction",
        "dynamodb",
        table,
        {"Records": records},
        result(start, 40, payload=answer),
        failed,
    )


def message(event: dict[str, Any], *, receive_count: int = 1) -> dict[str, Any]:
    """An SQS record of an EventBridge rule target: the event, its envelope as the detail."""
    body = {"id": str(uuid.uuid4()), "detail-type": event["type"], "source": event["source"], "detail": event}
    return {
        "messageId": str(uuid.uuid4()),
        "body": json.dumps(body),
        "attributes": {"ApproximateReceiveCount": str(receive_count)},
    }


def consumer(
    function: str,
    queue: str,
    records: list[dict[str, Any]],
    start: float,
    *,
    error: FunctionError | None = None,
) -> Invocation:
    failed = tuple(r["messageId"] for r in records) if error is not None else ()
    return Invocation(function, "sqs", queue, {"Records": records}, result(start, 80, error=error), failed)


def notification(event: dict[str, Any], at: float) -> Publication:
    text = json.dumps({"eventId": event["id"], "type": event["type"], "orderId": event["subject"]})
    return Publication("NotificationTopic", text, message_id=str(uuid.uuid4()), at=T0 + at)


def confirmed_saga(order_id: str, correlation_id: str) -> list[Any]:
    """Every entry of an order confirmed and notified, in the order the stack records them."""
    created = envelope("OrderCreated", order_id, correlation_id)
    reserved = envelope("InventoryReserved", order_id, correlation_id, causation_id=created["id"])
    confirmed = envelope("OrderConfirmed", order_id, correlation_id, causation_id=reserved["id"], sequence=2)
    return [
        api_request(order_id, correlation_id, 0.0),
        relay([outbox_record(created, "100")], 0.10),
        consumer("InventoryFunction", "InventoryQueue", [message(created)], 0.20),
        relay([outbox_record(reserved, "200")], 0.35, table="InventoryTable"),
        consumer("OrderStatusFunction", "OrderStatusQueue", [message(reserved)], 0.45),
        relay([outbox_record(confirmed, "300")], 0.60),
        consumer("NotificationFunction", "NotificationQueue", [message(confirmed)], 0.70),
        notification(confirmed, 0.74),
    ]
