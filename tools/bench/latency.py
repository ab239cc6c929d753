"""End-to-end latency in the local stack at a fixed offered load.

An open-loop generator POSTs orders at `rate` per second for `seconds` (late requests are not
skipped, so a slow system shows as latency, not as a lower rate). Hop times come from the stack's
activity log: each invocation is stamped when it returned, and carries the events it handled. They are
collected as invocations happen (the log keeps only its latest entries, fewer than a long run makes),
and the wait for the last notification costs nothing per invocation (the stack is measured while
it drains).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tools.local.console.activity import Invocation
from tools.local.stack import LocalStack

_HOPS = (
    ("api", "OrdersApiFunction", None),
    ("relay OrderCreated", "OutboxRelayFunction", "OrderCreated"),
    ("inventory", "InventoryFunction", "OrderCreated"),
    ("relay InventoryReserved", "OutboxRelayFunction", "InventoryReserved"),
    ("order status (CONFIRMED)", "OrderStatusFunction", "InventoryReserved"),
    ("relay OrderConfirmed", "OutboxRelayFunction", "OrderConfirmed"),
    ("notification", "NotificationFunction", "OrderConfirmed"),
)
_HOP_FUNCTIONS = {function for _, function, _ in _HOPS}


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


def offer_at_rate(post: Callable[[float], None], rate: float, seconds: float, workers: int) -> float:
    """Calls post(scheduled time) `rate` times a second for `seconds` (open loop); the seconds it took."""
    began = time.time()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for index in range(int(rate * seconds)):
            scheduled = began + index / rate
            delay = scheduled - time.time()
            if delay > 0:
                time.sleep(delay)
            pool.submit(post, scheduled)
        return time.time() - began


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

    hop_of = {(function, event_type): hop for hop, function, event_type in _HOPS[1:]}
    last_hop = _HOPS[-1][0]
    done_at: dict[str, dict[str, float]] = defaultdict(dict)
    waiting: set[str] = set()  # accepted orders not notified yet
    sending_done = threading.Event()
    all_notified = threading.Event()

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
            if order_id not in done_at[last_hop]:
                waiting.add(order_id)

    def on_entry(entry: object) -> None:
        # Runs in the stack's threads as each invocation is recorded: kept cheap.
        if not isinstance(entry, Invocation) or entry.function not in _HOP_FUNCTIONS:
            return
        for event in _events_of(entry):
            hop = hop_of.get((entry.function, event["type"]))
            if hop is None:
                continue
            with lock:
                done_at[hop].setdefault(event["subject"], entry.at)
                if hop == last_hop:
                    waiting.discard(event["subject"])
                    if not waiting and sending_done.is_set():
                        all_notified.set()

    stack.activity.subscribe(on_entry)
    offered_seconds = offer_at_rate(post, rate, seconds, workers=16)
    with lock:
        sending_done.set()
        if not waiting:
            all_notified.set()
    if not all_notified.wait(drain_seconds):
        errors.append("drain timeout")
    with lock:
        done_at = defaultdict(
            dict, {hop: {o: at for o, at in times.items() if o in sent} for hop, times in done_at.items()}
        )
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

    def summary(values: list[float]) -> dict[str, Any]:
        return {
            "p50_ms": 1000 * _percentile(values, 0.50),
            "p95_ms": 1000 * _percentile(values, 0.95),
            "p99_ms": 1000 * _percentile(values, 0.99),
            "count": len(values),
            "samples_ms": sorted(round(1000 * value, 1) for value in values),  # the distribution chart's
        }

    return {
        "offered_rate_per_s": rate,
        "seconds": seconds,
        "orders_sent": int(rate * seconds),
        "orders_accepted": len(sent),
        "achieved_rate_per_s": len(sent) / offered_seconds,
        "errors": errors[:20],
        "post_to_confirmed": summary(confirmed) if confirmed else {},
        "post_to_notification": summary(notified) if notified else {},
        "median_hop_ms": hops,
        "dominant_hop": max(hops, key=lambda h: hops[h] if hops[h] == hops[h] else -1),
    }
