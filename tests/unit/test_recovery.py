"""Redrive from the relay dead-letter queue and replay from the table (moto streams and EventBridge)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import boto3
import pytest

from local.template import Template
from scripts.outbox_admin import main as outbox_admin
from shop.config import Settings
from shop.order_repository import DynamoOrderRepository
from shop.orders import OrderLine, OrderService, PlaceOrder
from shop.publisher import EventPublisher
from shop.recovery import FailedStreamBatch, OutboxRecovery, StreamRangeUnavailable

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def minutes_after_t0(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def settings(aws: None, template: Template, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
    monkeypatch.setenv("OUTBOX_TIME_SHARDS", "4")
    return Settings.from_env()


@pytest.fixture
def place_orders(settings: Settings) -> Callable[[int], list[dict[str, Any]]]:
    """Place n orders one minute apart from T0; returns their OrderCreated envelopes in order."""

    def place(n: int) -> list[dict[str, Any]]:
        placed = []
        for i in range(n):
            service = OrderService(
                DynamoOrderRepository(settings), settings, clock=partial(minutes_after_t0, i)
            )
            order = service.place_order(
                PlaceOrder(f"c-{i}", "EUR", (OrderLine("SKU-1", 1, 100),)),
                idempotency_key=None,
                correlation_id="r",
            ).order
            placed.append(order)
        return placed

    return place


@pytest.fixture
def recovery(settings: Settings, template: Template) -> OutboxRecovery:
    publisher = EventPublisher(template.physical_name("EventBus"), settings.max_event_bytes)
    return OutboxRecovery(publisher, settings.max_event_bytes, settings.outbox_time_shards)


def stream_records(template: Template) -> tuple[str, str, list[Any]]:
    streams = boto3.client("dynamodbstreams")
    arn = boto3.client("dynamodb").describe_table(TableName=template.physical_name("OrdersTable"))["Table"][
        "LatestStreamArn"
    ]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    return arn, shard, streams.get_records(ShardIterator=iterator)["Records"]


def failure_message(
    arn: str, shard: str, first: dict[str, Any], last: dict[str, Any], size: int
) -> dict[str, Any]:
    """The body Lambda sends to a stream mapping's OnFailure queue."""
    return {
        "requestContext": {
            "requestId": "r-1",
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": 6,
        },
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "version": "1.0",
        "timestamp": "2026-11-21T10:30:00.000Z",
        "DDBStreamBatchInfo": {
            "shardId": shard,
            "startSequenceNumber": first["dynamodb"]["SequenceNumber"],
            "endSequenceNumber": last["dynamodb"]["SequenceNumber"],
            "approximateArrivalOfFirstRecord": "2026-11-21T10:01:00.000Z",
            "approximateArrivalOfLastRecord": "2026-11-21T10:02:00.000Z",
            "batchSize": size,
            "streamArn": arn,
        },
    }


def outbox_event_ids(records: list[dict[str, Any]]) -> list[str]:
    return [
        r["dynamodb"]["NewImage"]["eventId"]["S"]
        for r in records
        if r["dynamodb"]["Keys"]["SK"]["S"].startswith("OUTBOX#")
    ]


def test_redrive_republishes_exactly_the_events_of_the_failed_range(place_orders, recovery, bus, template):
    place_orders(5)
    arn, shard, records = stream_records(template)
    failed = records[2:6]  # order 2 and order 3: their order items and their outbox items
    batch = FailedStreamBatch.from_message(failure_message(arn, shard, failed[0], failed[-1], len(failed)))

    report = recovery.redrive(batch)

    assert report.source == "stream"
    assert report.complete
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(failed))
    assert len(outbox_event_ids(failed)) == 2


def test_redrive_falls_back_to_the_time_index_when_the_stream_was_trimmed(
    place_orders, recovery, bus, template, monkeypatch
):
    placed = place_orders(5)
    arn, shard, records = stream_records(template)

    def trimmed(batch: FailedStreamBatch) -> None:
        raise StreamRangeUnavailable(batch.stream_arn)

    monkeypatch.setattr(recovery, "read_stream_range", trimmed)
    batch = FailedStreamBatch.from_message(failure_message(arn, shard, records[2], records[5], 4))

    report = recovery.redrive(batch)

    # arrival window 10:01-10:02 plus 5 minutes either side covers every order placed 10:00-10:04
    assert report.source == "table"
    assert sorted(e["detail"]["subject"] for e in bus()) == sorted(o["orderId"] for o in placed)


def test_replay_republishes_exactly_a_time_window(place_orders, recovery, bus, template):
    placed = place_orders(6)
    table = template.physical_name("OrdersTable")

    report = recovery.replay_window(table, T0 + timedelta(minutes=2), T0 + timedelta(minutes=4))

    assert report.complete
    assert [e["detail"]["subject"] for e in bus()] == [o["orderId"] for o in placed[2:5]]


def test_replay_by_event_id(place_orders, recovery, bus, template):
    place_orders(3)
    _, _, records = stream_records(template)
    wanted = outbox_event_ids(records)[1]

    report = recovery.replay_events(template.physical_name("OrdersTable"), [wanted, "no-such-event"])

    assert [e["detail"]["id"] for e in bus()] == [wanted]
    assert report.unpublished == ["no-such-event"]


def test_redrive_command_empties_the_dead_letter_queue(place_orders, bus, template, capsys):
    place_orders(2)
    arn, shard, records = stream_records(template)
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=template.physical_name("RelayDeadLetterQueue"))["QueueUrl"]
    sqs.send_message(
        QueueUrl=queue_url, MessageBody=json.dumps(failure_message(arn, shard, records[0], records[-1], 4))
    )
    sqs.send_message(QueueUrl=queue_url, MessageBody="not a failure record")

    code = outbox_admin(["--bus", template.physical_name("EventBus"), "redrive", "--queue-url", queue_url])

    assert code == 1  # the malformed message is kept and reported
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(records))
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"redriven": 1, "kept": 1}
