"""End-to-end latency in the local stack at a fixed offered load.

An open-loop generator POSTs orders at `rate` per second for `seconds` (late requests are not
skipped, so a slow system shows as latency, not as a lower rate). Hop times come from the stack's
activity log: each invocation is stamped when it returned, and carries the events it handled.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from local.stack import LocalStack

_HOPS = (
    ("api", "OrdersApiFunction", None),
    ("relay OrderCreated", "OutboxRelayFunction", "OrderCreated"),
    ("inventory", "InventoryFunction", "OrderCreated"),
    ("relay InventoryReserved", "OutboxRelayFunction", "InventoryReserved"),
    ("order status (CONFIRMED)", "OrderStatusFunction", "InventoryReserved"),
    ("relay OrderConfirmed", "OutboxRelayFunction", "OrderConfirmed"),
    ("notification", "NotificationFunction", "OrderConfirmed"),
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _events_of(invocation: Any) -> list[dict[str, Any]]:
    """The CloudEvents an invocation handled (stream images or SQS bodies)."""
    found = []
    for record in invocation.records:
        if "dynamodb" in record:
            raw = record["dynamodb"].get("NewImage", {}).get("envelope", {}).get("S")
            if raw:
                found.append(json.loads(raw))
        elif "body" in record:
            try:
                found.append(json.loads(record["body"])["detail"])
            except (ValueError, KeyError, TypeError):
                continue
    return found


def run(
    stack: LocalStack, sku: str, rate: float, seconds: float, drain_seconds: float = 30.0
) -> dict[str, Any]:
    sent: dict[str, float] = {}
    api_done: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()
    session = requests.Session()
    body: dict[str, Any] = {
        "customerId": "c-bench",
        "currency": "USD",
        "items": [{"sku": sku, "quantity": 1, "unitPrice": 100}],
    }

    def post(scheduled: float) -> None:
        started = time.time()
        try:
            response = session.post(
                f"{stack.api_url}/orders",
                json=body,
                headers={"Idempotency-Key": str(uuid.uuid4())},
                timeout=30,
            )
        except requests.RequestException as exc:
            with lock:
                errors.append(type(exc).__name__)
            return
        if response.status_code != 201:
            with lock:
                errors.append(str(response.status_code))
            return
        order_id = response.json()["orderId"]
        with lock:
            sent[order_id] = min(started, scheduled)
            api_done[order_id] = time.time()

    total = int(rate * seconds)
    began = time.time()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for index in range(total):
            scheduled = began + index / rate
            delay = scheduled - time.time()
            if delay > 0:
                time.sleep(delay)
            pool.submit(post, scheduled)
    offered_seconds = time.time() - began

    def all_notified() -> bool:
        notified = {
            event["subject"]
            for invocation in stack.activity.invocations("NotificationFunction")
            for event in _events_of(invocation)
        }
        return all(order_id in notified for order_id in sent) or None  # type: ignore[return-value]

    try:
        stack.wait_for(all_notified, drain_seconds, "every order notified")
    except TimeoutError:
        errors.append("drain timeout")

    done_at: dict[str, dict[str, float]] = defaultdict(dict)
    for hop, function, event_type in _HOPS[1:]:
        for invocation in stack.activity.invocations(function):
            for event in _events_of(invocation):
                if event["type"] == event_type and event["subject"] in sent:
                    done_at[hop].setdefault(event["subject"], invocation.at)
    for order_id, at in api_done.items():
        done_at["api"][order_id] = at

    confirmed = [
        done_at["order status (CONFIRMED)"][o] - sent[o]
        for o in sent
        if o in done_at["order status (CONFIRMED)"]
    ]
    notified = [done_at["notification"][o] - sent[o] for o in sent if o in done_at["notification"]]
    hops: dict[str, float] = {}
    previous = None
    for hop, _, _ in _HOPS:
        deltas = [
            done_at[hop][o] - (done_at[previous][o] if previous else sent[o])
            for o in sent
            if o in done_at[hop] and (previous is None or o in done_at[previous])
        ]
        hops[hop] = 1000 * statistics.median(deltas) if deltas else float("nan")
        previous = hop

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": 1000 * _percentile(values, 0.50),
            "p95_ms": 1000 * _percentile(values, 0.95),
            "p99_ms": 1000 * _percentile(values, 0.99),
            "count": len(values),
        }

    return {
        "offered_rate_per_s": rate,
        "seconds": seconds,
        "orders_sent": total,
        "orders_accepted": len(sent),
        "achieved_rate_per_s": len(sent) / offered_seconds,
        "errors": errors[:20],
        "post_to_confirmed": summary(confirmed) if confirmed else {},
        "post_to_notification": summary(notified) if notified else {},
        "median_hop_ms": hops,
        "dominant_hop": max(hops, key=lambda h: hops[h] if hops[h] == hops[h] else -1),
    }
