"""Relay efficiency: this project's relay against the naive baseline on the same stream records.

Both run in this process against the same moto server (a separate process, so CPU time counts only
the relay). The record set is a realistic shard: orders created, some confirmed, some cancelled, with
their order items, request keys and status updates interleaved with the outbox items.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3

from tools.bench.baseline_relay import baseline_handler
from tools.bench.function_modules import load_function
from tools.local.runtime.context import LambdaContext
from tools.template import ROOT, Template

sys.path.insert(0, str(ROOT / "layers" / "shared"))

from shop.adapters import aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.order_repository import _order_attributes
from shop.adapters.dynamodb.outbox_items import decode_outbox_image, outbox_item
from shop.domain.orders import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_CREATED, Order, OrderLine, OrderStatus

STREAM_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/local-OrdersTable/stream/bench"


def _record(sequence: int, name: str, image: dict[str, Any]) -> dict[str, Any]:
    return {
        "eventID": f"{sequence:032x}",
        "eventName": name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1795348800,
            "Keys": {keys.PK: image[keys.PK], keys.SK: image[keys.SK]},
            "NewImage": image,
            "SequenceNumber": str(10**20 + sequence),
            "SizeBytes": len(json.dumps(image)),
            "StreamViewType": "NEW_IMAGE",
        },
        "eventSourceARN": STREAM_ARN,
    }


def stream_records(min_events: int, seed: int = 7) -> tuple[list[dict[str, Any]], int]:
    """A shard's records with at least `min_events` outbox items; returns (records, orders)."""
    rng = random.Random(seed)
    start = datetime(2026, 11, 21, 12, tzinfo=UTC)
    changes: list[tuple[float, str, dict[str, Any]]] = []
    events = 0
    orders = 0
    while events < min_events:
        orders += 1
        at = start + timedelta(milliseconds=orders * 20)
        stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        lines = tuple(
            OrderLine(f"SKU-{rng.randint(1, 500):04d}", rng.randint(1, 3), rng.randint(100, 9999))
            for _ in range(rng.randint(1, 5))
        )
        order = Order(
            f"o-{orders:032x}",
            f"c-{rng.randint(1, 10**6)}",
            "USD",
            lines,
            OrderStatus.PENDING,
            1,
            stamp,
            stamp,
        )
        history = [(order, ORDER_CREATED)]
        confirmed = order._replace(status=OrderStatus.CONFIRMED, version=2)
        history.append((confirmed, ORDER_CONFIRMED))
        if rng.random() < 0.2:
            history.append((confirmed._replace(status=OrderStatus.CANCELLED, version=3), ORDER_CANCELLED))
        for step, (state, event_type) in enumerate(history):
            when = at.timestamp() + step * 0.3 + rng.random() * 0.1
            name = "INSERT" if step == 0 else "MODIFY"
            changes.append((when, name, {**keys.order_key(state.order_id), **_order_attributes(state)}))
            event = state.event(event_type, f"corr-{orders}")
            item = outbox_item(
                event, keys.order_partition(state.order_id), ttl_days=7, time_shards=8, max_event_bytes=262144
            )
            changes.append((when + 0.0001, "INSERT", item))
            events += 1
    changes.sort(key=lambda change: change[0])
    return [_record(n, name, image) for n, (_, name, image) in enumerate(changes)], orders


def _passes_filter(record: dict[str, Any]) -> bool:
    # The template's FilterCriteria: NewImage.SK starts with OUTBOX# (checked by the relay tests).
    return bool(record["dynamodb"].get("NewImage", {}).get("SK", {}).get("S", "").startswith("OUTBOX#"))


def _count_calls(client: Any) -> list[int]:
    counter = [0]

    def count(**_: Any) -> None:
        counter[0] += 1

    client.meta.events.register("before-call.events.PutEvents", count)
    return counter


def run(moto_url: str, min_events: int, batch_size: int) -> dict[str, Any]:
    template = Template.load()
    bus = template.physical_name("EventBus")
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_EVENTBRIDGE": moto_url,  # botocore names it after the service id
            "EVENT_BUS_NAME": bus,
            "POWERTOOLS_METRICS_NAMESPACE": "Bench",
            "POWERTOOLS_SERVICE_NAME": "outbox-relay",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
    )
    # The relay is wired with its poison queue (none is parked here: every record is valid).
    poison_queue = boto3.client("sqs", endpoint_url=moto_url).create_queue(
        QueueName=template.physical_name("RelayPoisonQueue")
    )["QueueUrl"]
    os.environ.update({"AWS_ENDPOINT_URL_SQS": moto_url, "RELAY_POISON_QUEUE_URL": poison_queue})
    aws.reset_clients()
    boto3.client("events", endpoint_url=moto_url).create_event_bus(Name=bus)
    records, orders = stream_records(min_events)
    outbox = [r for r in records if _passes_filter(r)]
    events = len(outbox)
    decode_outbox_image(outbox[0]["dynamodb"]["NewImage"], 262144)  # sanity: the records are valid
    relay = load_function("outbox_relay", "relay")

    ours_calls = _count_calls(aws.events())
    baseline_client = boto3.client("events", endpoint_url=moto_url)
    baseline_calls = _count_calls(baseline_client)

    slices = 10  # medians over slices of the same records, ours and the baseline interleaved
    per_slice = math.ceil(len(records) / slices)
    ours_rates, base_rates = [], []
    ours_cpu = base_cpu = 0.0
    for index in range(slices):
        chunk = records[index * per_slice : (index + 1) * per_slice]
        chunk_outbox = [r for r in chunk if _passes_filter(r)]
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(chunk_outbox), batch_size):
            with contextlib.redirect_stdout(io.StringIO()):  # EMF metrics go to stdout
                response = relay.lambda_handler(
                    {"Records": chunk_outbox[start : start + batch_size]}, LambdaContext(timeout_seconds=30)
                )
            assert response["batchItemFailures"] == []
        ours_rates.append(len(chunk_outbox) / (time.perf_counter() - wall))
        ours_cpu += time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(chunk), batch_size):
            baseline_handler({"Records": chunk[start : start + batch_size]}, baseline_client, bus)
        base_rates.append(len(chunk_outbox) / (time.perf_counter() - wall))
        base_cpu += time.process_time() - cpu
    ours_eps = statistics.median(ours_rates)
    base_eps = statistics.median(base_rates)
    return {
        "orders": orders,
        "stream_records": len(records),
        "outbox_events": events,
        "batch_size": batch_size,
        "slices": slices,
        "ours": {
            "put_events_calls_per_event": ours_calls[0] / events,
            "records_delivered_per_order": events / orders,
            "invocations_per_order_full_batches": math.ceil(events / batch_size) / orders,
            "cpu_ms_per_1000_events": 1000 * ours_cpu / events * 1000,
            "events_per_second_median": ours_eps,
        },
        "baseline": {
            "put_events_calls_per_event": baseline_calls[0] / events,
            "records_delivered_per_order": len(records) / orders,
            "invocations_per_order_full_batches": math.ceil(len(records) / batch_size) / orders,
            "cpu_ms_per_1000_events": 1000 * base_cpu / events * 1000,
            "events_per_second_median": base_eps,
        },
        "speedup_events_per_second": ours_eps / base_eps,
    }
