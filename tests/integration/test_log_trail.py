"""One request's correlation id in the log lines of every hop of the saga, in the local stack.

What an operator's Logs Insights query (docs/operations.md) relies on: the id a client sent as
X-Correlation-Id is on the log lines of the order API, of the relay for each event of the saga (both
table streams), and of each consumer; and no function logs the customer's data on the way.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import requests

from tools.local.stack import LocalStack

SAGA_SECONDS = 20.0  # a bound on waiting, not a speed target
HOPS = ("OrdersApiFunction", "OutboxRelayFunction", "InventoryFunction", "OrderStatusFunction")
LAST_HOP = "NotificationFunction"


def log_lines(stack: LocalStack, function: str) -> list[str]:
    path = stack.options.log_dir / f"{function}.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def log_records(stack: LocalStack, function: str) -> list[dict[str, Any]]:
    records = []
    for line in log_lines(stack, function):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # not a structured line (the runtime's own output)
        if isinstance(record, dict):
            records.append(record)
    return records


def of_saga(stack: LocalStack, function: str, correlation_id: str) -> list[dict[str, Any]]:
    """The function's lines about the saga: those with its correlation id, or naming it among others (the
    relays' "events published" lines name ten events each)."""
    return [
        r
        for r in log_records(stack, function)
        if r.get("correlation_id") == correlation_id or correlation_id in r.get("correlation_ids", ())
    ]


def test_one_requests_correlation_id_is_in_the_log_lines_of_every_hop(local_stack: LocalStack):
    # Given an order for a SKU nobody stocks (so the saga runs to OrderRejected through every hop)
    correlation_id = f"corr-trail-{uuid.uuid4().hex[:12]}"
    customer_id = f"c-trail-{uuid.uuid4().hex[:12]}"
    sku = f"SKU-TRAIL-{uuid.uuid4().hex[:12]}"

    # When it is placed with an X-Correlation-Id
    response = requests.post(
        f"{local_stack.api_url}/orders",
        json={
            "customerId": customer_id,
            "currency": "USD",
            "items": [{"sku": sku, "quantity": 1, "unitPrice": 1}],
        },
        headers={"X-Correlation-Id": correlation_id, "Idempotency-Key": str(uuid.uuid4())},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    assert response.headers["X-Correlation-Id"] == correlation_id

    # Then the last hop logs it once the saga is through ...
    local_stack.wait_for(
        lambda: [
            r for r in of_saga(local_stack, LAST_HOP, correlation_id) if r["message"] == "event applied"
        ],
        SAGA_SECONDS,
        "the notification consumer applied the saga's last event",
    )
    # ... and so did every hop before it
    assert {hop: bool(of_saga(local_stack, hop, correlation_id)) for hop in HOPS} == dict.fromkeys(HOPS, True)
    published = {
        event_type
        for r in of_saga(local_stack, "OutboxRelayFunction", correlation_id)
        if r["message"] == "events published"
        for event_type, of in zip(r["event_types"], r["correlation_ids"], strict=True)
        if of == correlation_id
    }
    assert published == {"OrderCreated", "InventoryRejected", "OrderRejected"}  # both table streams
    applied = {
        (function, r["event_type"])
        for function in ("InventoryFunction", "OrderStatusFunction", LAST_HOP)
        for r in of_saga(local_stack, function, correlation_id)
        if r["message"] == "event applied"
    }
    assert applied == {
        ("InventoryFunction", "OrderCreated"),
        ("OrderStatusFunction", "InventoryRejected"),
        (LAST_HOP, "OrderRejected"),
    }
    # and no function logged the customer's data on the way
    leaked = {
        f: [line for line in log_lines(local_stack, f) if customer_id in line or sku in line] for f in HOPS
    }
    assert leaked == {hop: [] for hop in HOPS}
    assert [line for line in log_lines(local_stack, LAST_HOP) if customer_id in line] == []
