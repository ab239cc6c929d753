"""Activity entries of one order's saga, shaped as the local stack records them (the gateway, the stream
and queue pollers, the topic watcher), for the inspector's unit tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shop.adapters.dynamodb import keys
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
    start: float,
    duration_ms: float,
    *,
    payload: Any = None,
    error: FunctionError | None = None,
    trace_header: str | None = None,
) -> Any:
    return InvocationResult(
        request_id=str(uuid.uuid4()),
        payload=payload,
        error=error,
        duration_ms=duration_ms,
        started_at=T0 + start,
        trace_header=trace_header,
    )


def trace_header() -> str:
    """An X-Ray trace header of a trace and segment of its own (as Lambda gives an API invocation)."""
    return f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]};Parent={uuid.uuid4().hex[:16]};Sampled=1"


def traceparent(header: str) -> str:
    """The W3C traceparent of an X-Ray trace header (shop/domain/tracing.py), as an envelope carries it."""
    fields = dict(part.split("=", 1) for part in header.split(";"))
    _, epoch, rest = fields["Root"].split("-")
    return f"00-{epoch}{rest}-{fields['Parent']}-01"


def api_request(
    order_id: str,
    correlation_id: str,
    start: float,
    *,
    method: str = "POST",
    status: int = 201,
    trace: str | None = None,
    path: str | None = None,
) -> Invocation:
    path = path or ("/orders" if method == "POST" else f"/orders/{order_id}")
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
    answer = result(start, 50, payload=payload, trace_header=trace)
    return Invocation("OrdersApiFunction", "api", route, event, answer)


def outbox_record(
    event: dict[str, Any] | None,
    sequence_number: str,
    *,
    raw_envelope: str | None = None,
    written_by_earlier_code: bool = False,
) -> dict[str, Any]:
    """A stream record of an outbox INSERT, its item shaped as the writers shape it
    (shop/adapters/dynamodb/outbox_items.py: keys and envelope), its envelope unreadable when
    raw_envelope is given; written_by_earlier_code: with the eventId, eventType and aggregateId
    attributes items written before 2026-11-26 carry."""
    key = (
        keys.outbox_key(keys.order_partition(event["subject"]), event["sequence"], event["id"])
        if event is not None
        else keys.outbox_key(keys.order_partition("x"), 1, "x")
    )
    image: dict[str, Any] = {
        **key,
        "envelope": {"S": raw_envelope if raw_envelope is not None else json.dumps(event)},
    }
    if event is not None and written_by_earlier_code:
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


def message(event: dict[str, Any], *, receive_count: int = 1, trace: str | None = None) -> dict[str, Any]:
    """An SQS record of an EventBridge rule target: the event, its envelope as the detail (and the trace
    header PutEvents was given, as its AWSTraceHeader)."""
    body = {"id": str(uuid.uuid4()), "detail-type": event["type"], "source": event["source"], "detail": event}
    attributes = {"ApproximateReceiveCount": str(receive_count)}
    if trace is not None:
        attributes["AWSTraceHeader"] = trace
    return {"messageId": str(uuid.uuid4()), "body": json.dumps(body), "attributes": attributes}


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


# Each hop of a confirmed saga, in order, as the inspector's timeline shows it: (function, event type).
CONFIRMED_SAGA_HOPS: list[tuple[str, str | None]] = [
    ("OrdersApiFunction", None),
    ("OutboxRelayFunction", "OrderCreated"),
    ("InventoryFunction", "OrderCreated"),
    ("OutboxRelayFunction", "InventoryReserved"),
    ("OrderStatusFunction", "InventoryReserved"),
    ("OutboxRelayFunction", "OrderConfirmed"),
    ("NotificationFunction", "OrderConfirmed"),
    ("NotificationTopic", "OrderConfirmed"),
]


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


def traced_saga(order_id: str, correlation_id: str, trace: str) -> dict[str, Any]:
    """A confirmed order's saga as it runs with active tracing: the API's trace header written into each
    envelope (traceparent) and handed on as each message's AWSTraceHeader (shop/runtime/trace_context.py).
    Its entries ("entries", in recording order) and envelopes ("created", "reserved", "confirmed")."""
    created = envelope("OrderCreated", order_id, correlation_id)
    reserved = envelope("InventoryReserved", order_id, correlation_id, causation_id=created["id"])
    confirmed = envelope("OrderConfirmed", order_id, correlation_id, causation_id=reserved["id"], sequence=2)
    for event in (created, reserved, confirmed):
        event["traceparent"] = traceparent(trace)
    entries = [
        api_request(order_id, correlation_id, 0.0, trace=trace),
        relay([outbox_record(created, "100")], 0.10),
        consumer("InventoryFunction", "InventoryQueue", [message(created, trace=trace)], 0.20),
        relay([outbox_record(reserved, "200")], 0.35, table="InventoryTable"),
        consumer("OrderStatusFunction", "OrderStatusQueue", [message(reserved, trace=trace)], 0.45),
        relay([outbox_record(confirmed, "300")], 0.60),
        consumer("NotificationFunction", "NotificationQueue", [message(confirmed, trace=trace)], 0.70),
        notification(confirmed, 0.74),
    ]
    return {"entries": entries, "created": created, "reserved": reserved, "confirmed": confirmed}
