"""Redrive from the relay dead-letter queue and replay from the table (moto streams and EventBridge)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import operations.outbox_index
import operations.recovery
import shop.adapters.aws
import shop.domain.envelope
from operations.admin import main as outbox_admin
from operations.recovery import (
    FailedStreamBatch,
    OutboxRecovery,
    RecoveryReport,
    StreamRangeUnavailable,
    in_publish_order,
)
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.dynamodb.outbox_items import decode_outbox_image, outbox_item, poison_record
from shop.adapters.eventbridge import RECORD_REJECTED_CODES, EventPublisher
from shop.adapters.poison_queue import PoisonQueue, checked_poison_message, poison_message_body
from shop.adapters.postgres.outbox import OutboxRow
from shop.domain.envelope import CloudEvent
from shop.domain.errors import InvalidEnvelope
from shop.domain.inventory import InventoryService
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.domain.poison import PoisonRecord, StreamPosition
from shop.runtime.config import Settings
from tests.support.outbox_entries import order_entry
from tests.unit.fakes import FaultyEventBridge
from tools.template import ROOT, Template, load_yaml

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


def recovery_at(settings: Settings, template: Template, moment: datetime) -> OutboxRecovery:
    publisher = EventPublisher(template.physical_name("EventBus"), settings.max_event_bytes)
    return OutboxRecovery(
        publisher,
        PoisonQueue(template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]),
        max_event_bytes=settings.max_event_bytes,
        time_shards=settings.outbox_time_shards,
        ttl_days=settings.outbox_ttl_days,
        clock=lambda: moment,
        sleep=lambda _: None,
    )


@pytest.fixture
def recovery(settings: Settings, template: Template, poison_queue: Any) -> OutboxRecovery:
    """Recovery run a day after the orders were placed (well inside the outbox TTL)."""
    return recovery_at(settings, template, T0 + timedelta(days=1))


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


def item_event_id(image: dict[str, Any]) -> str:
    """The event id of an outbox item: the end of its sort key (the item repeats it nowhere else)."""
    event_id = keys.outbox_event_id(image[keys.SK]["S"])
    assert event_id is not None, image[keys.SK]
    return event_id


def outbox_event_ids(records: list[dict[str, Any]]) -> list[str]:
    return [
        item_event_id(r["dynamodb"]["NewImage"])
        for r in records
        if r["dynamodb"]["Keys"]["SK"]["S"].startswith("OUTBOX#")
    ]


def failed_batch(records: list[dict[str, Any]], arn: str, shard: str) -> FailedStreamBatch:
    """OnFailure metadata of a batch spanning `records` (the mapping's filter admitted its outbox items)."""
    size = len(outbox_event_ids(records))
    return FailedStreamBatch.from_message(failure_message(arn, shard, records[0], records[-1], size))


def test_redrive_republishes_exactly_the_events_of_the_failed_range(place_orders, recovery, bus, template):
    place_orders(5)
    arn, shard, records = stream_records(template)
    failed = records[2:6]  # order 2 and order 3: their order items and their outbox items
    batch = failed_batch(failed, arn, shard)

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
    batch = failed_batch(records[2:6], arn, shard)

    report = recovery.redrive(batch)

    # arrival window 10:01-10:02 plus 5 minutes either side covers every order placed 10:00-10:04
    assert report == RecoveryReport(source="table", expected=batch.batch_size, found=5, published=5)
    assert report.complete
    assert sorted(e["detail"]["subject"] for e in bus()) == sorted(o["orderId"] for o in placed)


def test_replay_republishes_exactly_a_time_window(place_orders, recovery, bus, template):
    placed = place_orders(6)
    table = template.physical_name("OrdersTable")

    report = recovery.replay_window([table], T0 + timedelta(minutes=2), T0 + timedelta(minutes=4))

    assert report.complete
    assert [e["detail"]["subject"] for e in bus()] == [o["orderId"] for o in placed[2:5]]


def test_replay_by_event_id(place_orders, recovery, bus, template):
    place_orders(3)
    _, _, records = stream_records(template)
    wanted = outbox_event_ids(records)[1]

    report = recovery.replay_events([template.physical_name("OrdersTable")], [wanted, "no-such-event"])

    assert [e["detail"]["id"] for e in bus()] == [wanted]
    assert (report.source, report.expected, report.found, report.published) == ("table", 2, 1, 1)
    assert not report.complete
    # Searched: the hours of the republish window (16 days) and the 2 days an expired item may linger,
    # up to an hour past the operator's clock (a day after T0), in the id's shard only.
    shard, table = keys.outbox_time_shard("no-such-event", 4), template.physical_name("OrdersTable")
    assert report.missing == [
        f"event no-such-event is not in {table} (unknown, or deleted by TTL): "
        f"no outbox item of it in the OutboxByTime buckets of its shard ({shard}) written between "
        "2026-11-04T10:00:00+00:00 and 2026-11-22T11:00:00+00:00; if it was written at another time, give "
        "that window (--from/--to) with --event-id"
    ]


def query_calls(monkeypatch: pytest.MonkeyPatch, limit: int | None = None) -> list[dict[str, Any]]:
    """Every Query the recovery sends (its parameters), optionally each limited to `limit` items read
    per page, so that a filtered page is often empty and still not the last."""
    calls: list[dict[str, Any]] = []

    def seen(params: dict[str, Any], **_: Any) -> None:
        if limit is not None:
            params["Limit"] = limit
        calls.append(dict(params))

    client = shop.adapters.aws.dynamodb()
    client.meta.events.register("provide-client-params.dynamodb.Query", seen)
    monkeypatch.setattr(shop.adapters.aws, "dynamodb", lambda: client)
    return calls


def test_replay_by_event_id_reads_only_its_shards_buckets_newest_first_and_stops_at_the_first_hit(
    place_orders, recovery, bus, template, monkeypatch
):
    placed = place_orders(3)  # 10:00, 10:01, 10:02 on T0; the recovery runs a day later
    wanted = outbox_event_ids(stream_records(template)[2])[0]
    calls = query_calls(monkeypatch)

    report = recovery.replay_events([template.physical_name("OrdersTable")], [wanted])

    assert report.all_on_bus
    assert [e["detail"]["subject"] for e in bus()] == [placed[0]["orderId"]]
    shard = keys.outbox_time_shard(wanted, 4)
    # From the hour after the operator's clock back to T0's hour, where the item is: 26 buckets, then none.
    assert [c["ExpressionAttributeValues"][":b"]["S"] for c in calls] == [
        f"{(T0 + timedelta(days=1, hours=1 - n)):%Y%m%d%H}#{shard}" for n in range(26)
    ]
    assert {c["IndexName"] for c in calls} == {keys.OUTBOX_TIME_INDEX}


def test_replay_by_event_id_reads_every_page_of_a_bucket_until_its_event(
    place_orders, recovery, bus, template, monkeypatch
):
    place_orders(40)  # 10:00 .. 10:39 on T0: one hour, 4 shards
    event_ids = outbox_event_ids(stream_records(template)[2])
    shard = keys.outbox_time_shard(event_ids[0], 4)
    in_shard = [e for e in event_ids if keys.outbox_time_shard(e, 4) == shard]
    assert len(in_shard) > 3  # others share its bucket: pages without it come first
    calls = query_calls(monkeypatch, limit=1)  # one index entry read per page

    report = recovery.replay_events([template.physical_name("OrdersTable")], [in_shard[0], in_shard[-1]])

    assert report.all_on_bus
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([in_shard[0], in_shard[-1]])
    t0_bucket = [c for c in calls if c["ExpressionAttributeValues"][":b"]["S"] == f"{T0:%Y%m%d%H}#{shard}"]
    assert len(t0_bucket) >= len(in_shard)  # a page per entry, empty ones included, to the last of them


def test_replay_by_event_id_looks_for_many_ids_a_shard_at_a_time_in_bounded_queries(
    place_orders, recovery, bus, template, monkeypatch
):
    place_orders(30)
    event_ids = outbox_event_ids(stream_records(template)[2])
    monkeypatch.setattr(operations.outbox_index, "_IDS_PER_QUERY", 3)
    calls = query_calls(monkeypatch)

    report = recovery.replay_events([template.physical_name("OrdersTable")], [*event_ids, event_ids[0]])

    assert report.all_on_bus
    assert report.expected == 30  # an id given twice is republished once
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_ids)
    assert max(c["FilterExpression"].count("contains(") for c in calls) == 3


def test_replay_by_event_id_searches_the_hours_it_is_given(place_orders, settings, template, bus):
    place_orders(1)  # T0
    [event_id] = outbox_event_ids(stream_records(template)[2])
    table = template.physical_name("OrdersTable")
    # 30 days on, past the republish window and the days an expired item may linger: not looked for there
    later = recovery_at(settings, template, T0 + timedelta(days=30))

    assert later.replay_events([table], [event_id]).found == 0
    found = later.replay_events(
        [table], [event_id], include_expired=True, written_from=T0 - timedelta(hours=1), written_to=T0
    )
    assert (found.found, found.published) == (1, 1)
    assert later.replay_events([table], [event_id], written_from=T0 + timedelta(hours=1)).found == 0


def written_by_earlier_code(item: dict[str, Any]) -> dict[str, Any]:
    """An outbox item as the code before 2026-11-26 wrote it: what the event is repeated in attributes
    (its id also the key of the OutboxByEventId index), and before that an id suffix on outboxTime."""
    event = CloudEvent.from_json(item["envelope"]["S"])
    return {
        **item,
        "eventId": {"S": event.id},
        "eventType": {"S": event.type},
        "aggregateId": {"S": event.subject},
        "sequence": {"N": str(event.sequence)},
        keys.OUTBOX_TIME: {"S": f"{item[keys.OUTBOX_TIME]['S']}#{event.id}"},
    }


def test_items_written_by_earlier_code_are_relayed_replayed_and_redriven(
    settings, recovery, bus, template, poison_queue, invoke
):
    table = template.physical_name("OrdersTable")
    events = [
        CloudEvent.new(
            source="shop.orders",
            type="OrderCreated",
            subject=f"o-old-{n}",
            sequence=1,
            data={"orderId": f"o-old-{n}"},
            correlation_id="c",
            time=T0 + timedelta(minutes=n),
        )
        for n in range(2)
    ]
    items = [
        written_by_earlier_code(
            outbox_item(
                e, keys.order_partition(e.subject), ttl_days=16, time_shards=4, max_event_bytes=262_144
            )
        )
        for e in events
    ]
    for item in items:
        boto3.client("dynamodb").put_item(TableName=table, Item=item)
    arn, shard, records = stream_records(template)
    ids = [e.id for e in events]

    # relayed: the relay publishes them from their stream records as it does any item
    assert invoke("OutboxRelayFunction", {"Records": records}) == {"batchItemFailures": []}
    assert [e["detail"]["id"] for e in bus()] == ids
    # replayed by window (outboxTime with its former suffix) and by id (no OutboxByEventId index now)
    assert recovery.replay_window([table], T0, T0 + timedelta(minutes=1)).published == 2
    assert recovery.replay_events([table], ids).published == 2
    # redriven: from the stream, and from the table's time index once the stream lost the range
    assert recovery.redrive(failed_batch(records, arn, shard)).published == 2
    assert recovery._redrive_from_table(failed_batch(records, arn, shard)).published == 2
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(ids * 4)
    # a poison record among them is named by its event id, as before
    spoiled = {**items[0], "envelope": {"S": "not json"}}
    assert poison_record(spoiled, InvalidEnvelope("bad"), StreamPosition("1")).event_id == ids[0]


@pytest.fixture
def relay_dlq(aws: None, template: Template) -> Callable[..., str]:
    """The relay DLQ; relay_dlq(*bodies) sends each body (a dict is sent as JSON) and returns its url."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=template.physical_name("RelayDeadLetterQueue"))["QueueUrl"]

    def send(*bodies: dict[str, Any] | str) -> str:
        for body in bodies:
            sqs.send_message(
                QueueUrl=queue_url, MessageBody=body if isinstance(body, str) else json.dumps(body)
            )
        return str(queue_url)

    return send


def admin(template: Template, *args: str) -> int:
    poison_url = template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]
    return outbox_admin(
        ["--bus", template.physical_name("EventBus"), "--poison-queue-url", poison_url, *args]
    )


def test_redrive_command_empties_the_dead_letter_queue(
    place_orders, bus, poison_queue, relay_dlq, template, capsys
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    queue_url = relay_dlq(failure_message(arn, shard, records[0], records[-1], 2), "not a failure record")

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1  # the malformed message is kept and reported
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(records))
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"redriven": 1, "kept": 1, "parked": []}


# --- nothing is claimed that was not done ---------------------------------------------------------------


class PagingStreams:
    """The real (moto) streams client, but GetRecords first answers `empty_pages` empty pages, as AWS
    may while it walks towards the records (an empty page is not the end of the shard)."""

    def __init__(self, real: Any, empty_pages: int) -> None:
        self._real = real
        self.empty_pages = empty_pages
        self.calls = 0

    def get_shard_iterator(self, **kwargs: Any) -> Any:
        return self._real.get_shard_iterator(**kwargs)

    def get_records(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.empty_pages:
            return {"Records": [], "NextShardIterator": kwargs["ShardIterator"]}
        return self._real.get_records(**kwargs)


def test_redrive_pages_past_empty_reads_to_the_end_of_the_range(
    place_orders, recovery, bus, template, monkeypatch
):
    place_orders(3)
    arn, shard, records = stream_records(template)
    pager = PagingStreams(boto3.client("dynamodbstreams"), empty_pages=8)
    monkeypatch.setattr(shop.adapters.aws, "dynamodb_streams", lambda: pager)

    report = recovery.redrive(failed_batch(records, arn, shard))

    assert report.complete
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(records))


def test_a_stream_read_that_never_reaches_the_end_sequence_is_incomplete(
    place_orders, recovery, bus, template, monkeypatch
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    monkeypatch.setattr(operations.recovery, "_MAX_READS", 3)
    pager = PagingStreams(boto3.client("dynamodbstreams"), empty_pages=1_000)
    monkeypatch.setattr(shop.adapters.aws, "dynamodb_streams", lambda: pager)

    report = recovery.redrive(failed_batch(records, arn, shard))

    assert not report.complete
    assert any("before reaching endSequenceNumber" in line for line in report.missing)


def test_a_range_holding_fewer_records_than_the_batch_size_is_incomplete(
    place_orders, recovery, bus, template
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    message = failure_message(arn, shard, records[0], records[-1], size=5)  # the batch held 5; 2 remain

    report = recovery.redrive(FailedStreamBatch.from_message(message))

    assert not report.complete
    assert any("found 2 of the batch's 5 records" in line for line in report.missing)


def test_redrive_of_a_batch_older_than_the_outbox_ttl_is_refused_and_kept(
    place_orders, bus, poison_queue, relay_dlq, settings, template, monkeypatch, capsys
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    queue_url = relay_dlq(failure_message(arn, shard, records[0], records[-1], 2))

    def trimmed(self: OutboxRecovery, batch: FailedStreamBatch) -> None:
        raise StreamRangeUnavailable(batch.stream_arn)

    monkeypatch.setattr(OutboxRecovery, "read_stream_range", trimmed)
    # Seventeen days later: the TTL (16 days) may have deleted the items the message stands for
    monkeypatch.setattr(operations.recovery, "utc_now", lambda: T0 + timedelta(days=17))

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1
    out = capsys.readouterr()
    [report] = [json.loads(line) for line in out.out.splitlines() if line.startswith('{"messageId"')]
    assert report["complete"] is False
    assert any("TTL" in line for line in report["missing"])
    assert "kept" in out.err
    assert bus() == []  # nothing claimed, nothing sent
    assert messages_in(queue_url) == 1  # still there, not deleted


class UnprocessedDynamo:
    """The real (moto) client whose BatchGetItem leaves every key unprocessed `times` times."""

    def __init__(self, real: Any, times: int) -> None:
        self._real = real
        self.times = times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        if self.times > 0:
            self.times -= 1
            return {"Responses": {}, "UnprocessedKeys": RequestItems}
        answer: dict[str, Any] = self._real.batch_get_item(RequestItems=RequestItems)
        return answer


@pytest.mark.parametrize(("unprocessed_times", "complete"), [(3, True), (100, False)])
def test_unprocessed_keys_are_retried_and_reported_when_they_persist(
    place_orders, recovery, bus, template, monkeypatch, unprocessed_times, complete
):
    placed = place_orders(2)
    table = template.physical_name("OrdersTable")
    fake = UnprocessedDynamo(boto3.client("dynamodb"), unprocessed_times)
    monkeypatch.setattr(shop.adapters.aws, "dynamodb", lambda: fake)

    report = recovery.replay_window([table], T0, T0 + timedelta(minutes=5))

    assert report.complete is complete
    published = sorted(e["detail"]["subject"] for e in bus())
    if complete:
        assert published == sorted(o["orderId"] for o in placed)
    else:
        assert published == []
        assert sum("still unprocessed" in line for line in report.missing) == 2


def test_replay_of_a_window_reaching_past_the_ttl_horizon_says_so(
    place_orders, settings, template, poison_queue, bus
):
    place_orders(1)
    late = recovery_at(settings, template, T0 + timedelta(days=20))

    report = late.replay_window([template.physical_name("OrdersTable")], T0, T0 + timedelta(minutes=5))

    assert not report.complete
    assert any("TTL horizon" in line for line in report.missing)


def test_replay_keeps_each_orders_events_in_sequence_whatever_the_writers_clocks_said():
    # order A's second event was stamped earlier than its first by a skewed clock
    entries = [
        order_entry("A", 1, occurred_at="2026-11-21T10:05:00.000Z"),
        order_entry("B", 1, occurred_at="2026-11-21T10:01:00.000Z"),
        order_entry("A", 2, occurred_at="2026-11-21T10:00:00.000Z"),
        order_entry("B", 2, occurred_at="2026-11-21T10:06:00.000Z"),
    ]

    ordered = [e.event_id for e in in_publish_order(entries)]

    assert ordered.index("A-1") < ordered.index("A-2")
    assert ordered.index("B-1") < ordered.index("B-2")
    assert sorted(ordered) == ["A-1", "A-2", "B-1", "B-2"]


def stream_poison(event_id: str, reason: str, image: dict[str, Any]) -> PoisonRecord:
    """A record of a table stream, parked."""
    return PoisonRecord(StreamPosition("1"), event_id, reason, image, keys.item_key(image))


def test_a_parked_poison_record_is_republished_once_it_decodes(recovery, poison_queue, bus, template):
    image = outbox_image_of_new_order()
    body = json.loads(poison_message_body(stream_poison("e-1", "was unpublishable", image)))

    report = recovery.redrive_parked(checked_poison_message(body))

    assert report == RecoveryReport(source="poison queue", expected=1, found=1, published=1)
    assert report.all_on_bus
    assert [e["detail"]["id"] for e in bus()] == [item_event_id(image)]


def test_a_parked_record_that_still_cannot_be_published_stays_parked(recovery, poison_queue, bus):
    image = outbox_image_of_new_order()
    image["envelope"] = {"S": "still not json"}
    body = json.loads(poison_message_body(stream_poison("e-1", "bad", image)))

    report = recovery.redrive_parked(checked_poison_message(body))

    assert not report.complete
    assert (report.found, report.published, report.unpublished) == (1, 0, ["e-1"])
    assert [line for line in report.missing if "event e-1 is still unpublishable" in line]
    assert bus() == []
    assert poison_queue() == []  # not parked a second time: the operator's message stays where it is


def parked_row(envelope: str) -> dict[str, Any]:
    """The poison message of an outbox row the PostgreSQL polling publisher parked."""
    row = OutboxRow(7, "e-7", "o-1", 1, envelope, None, T0, 1)
    return checked_poison_message(json.loads(poison_message_body(row.poison_record(InvalidEnvelope("bad")))))


def test_a_row_the_polling_publisher_parked_is_republished_once_it_decodes(recovery, poison_queue, bus):
    image = outbox_image_of_new_order()

    report = recovery.redrive_parked(parked_row(image["envelope"]["S"]))

    assert report == RecoveryReport(source="poison queue", expected=1, found=1, published=1)
    assert [e["detail"]["id"] for e in bus()] == [item_event_id(image)]


def test_a_parked_row_that_still_cannot_be_published_is_named_and_not_published(recovery, poison_queue, bus):
    report = recovery.redrive_parked(parked_row('{"not": "a cloudevent"}'))

    assert (report.found, report.published, report.unpublished) == (1, 0, ["e-7"])
    assert bus() == []


def test_a_row_too_large_for_a_queue_message_is_parked_by_position_and_named_not_fetched(
    recovery, poison_queue, bus
):
    envelope = outbox_image_of_new_order()["envelope"]["S"]
    row = OutboxRow(7, "e-7", "o-1", 1, envelope + " " * 300_000, None, T0, 1)
    body = json.loads(poison_message_body(row.poison_record(InvalidEnvelope("too large"))))

    assert "item" not in body
    assert body["key"] == {"store": "postgres", "position": 7, "eventId": "e-7"}
    report = recovery.redrive_parked(checked_poison_message(body))
    # The order database is out of the operator's reach: the row is named, nothing is published, and
    # the report is incomplete (the command keeps the message and exits 1).
    assert (report.found, report.published, report.complete) == (0, 0, False)
    assert "outbox row 7 of the order database" in report.missing[0]
    assert bus() == []


def parked_by_key(stream_arn: str, item: dict[str, Any]) -> dict[str, Any]:
    """The poison message of an item too large for a queue message: its key and stream only."""
    record = poison_record(
        {**item, "pad": {"S": "x" * 300_000}}, InvalidEnvelope("too large"), StreamPosition("1", stream_arn)
    )
    body = json.loads(poison_message_body(record))
    assert "item" not in body  # the message holds the key instead
    return checked_poison_message(body)


def test_a_parked_record_held_by_key_is_read_from_its_table_and_republished(
    place_orders, recovery, bus, template
):
    place_orders(1)
    arn, _, records = stream_records(template)
    [item] = [r["dynamodb"]["NewImage"] for r in records if "envelope" in r["dynamodb"]["NewImage"]]

    report = recovery.redrive_parked(parked_by_key(arn, item))

    assert report == RecoveryReport(source="poison queue", expected=1, found=1, published=1)
    assert [e["detail"]["id"] for e in bus()] == [item_event_id(item)]


def test_a_parked_record_held_by_key_and_gone_from_its_table_is_reported_missing(
    place_orders, recovery, bus, template
):
    place_orders(1)
    arn, _, records = stream_records(template)
    [item] = [r["dynamodb"]["NewImage"] for r in records if "envelope" in r["dynamodb"]["NewImage"]]
    table = template.physical_name("OrdersTable")
    boto3.client("dynamodb").delete_item(
        TableName=table, Key={keys.PK: item[keys.PK], keys.SK: item[keys.SK]}
    )

    report = recovery.redrive_parked(parked_by_key(arn, item))

    assert (report.found, report.published, report.complete) == (0, 0, False)
    assert report.missing == [f"parked event {item_event_id(item)} is no longer in {table} (deleted by TTL?)"]
    assert bus() == []


def outbox_image_of_new_order() -> dict[str, Any]:
    event = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    )
    return outbox_item(
        event, keys.order_partition("o-1"), ttl_days=16, time_shards=8, max_event_bytes=262_144
    )


def spoil_outbox_item(table: str, order_id: str) -> str:
    """Make an order's outbox item undecodable (poison), as a writer's bug would; its event id."""
    client = boto3.client("dynamodb")
    [poisoned] = [
        i
        for i in client.scan(TableName=table)["Items"]
        if i[keys.SK]["S"].startswith(keys.OUTBOX_SK_PREFIX)
        and keys.outbox_aggregate_id(i[keys.PK]["S"]) == order_id
    ]
    client.update_item(
        TableName=table,
        Key={keys.PK: poisoned[keys.PK], keys.SK: poisoned[keys.SK]},
        UpdateExpression="SET envelope = :bad",
        ExpressionAttributeValues={":bad": {"S": "not json"}},
    )
    return item_event_id(poisoned)


def test_a_replay_names_poison_in_its_window_and_never_parks_it_again(
    place_orders, settings, recovery, poison_queue, bus, template
):
    placed = place_orders(2)
    table = template.physical_name("OrdersTable")
    poisoned = spoil_outbox_item(table, placed[0]["orderId"])

    report = recovery.replay_window([table], T0, T0 + timedelta(minutes=5))

    assert not report.complete
    assert report.unpublished == [poisoned]
    assert any("redrive-poison" in line for line in report.missing)
    assert [e["detail"]["subject"] for e in bus()] == [placed[1]["orderId"]]
    assert poison_queue() == []  # the relay parked it when it first met it: not a second copy


def test_replay_by_event_id_of_an_undecodable_item_names_it_exits_1_and_never_parks_it(
    place_orders, poison_queue, bus, template, capsys, day_after_t0
):
    placed = place_orders(2)
    table = template.physical_name("OrdersTable")
    event_ids = outbox_event_ids(stream_records(template)[2])
    poisoned = spoil_outbox_item(table, placed[0]["orderId"])
    [healthy] = [i for i in event_ids if i != poisoned]

    code = admin(template, "replay", "--table", table, "--event-id", poisoned, "--event-id", healthy)

    assert code == 1
    [report] = reports_printed(capsys)
    assert (report["unpublished"], report["poison"], report["published"]) == ([poisoned], [], 1)
    assert any(poisoned in line and "redrive-poison" in line for line in report["missing"])
    assert [e["detail"]["id"] for e in bus()] == [healthy]
    assert poison_queue() == []  # the relay parked it when it first met it: not a second copy


def test_an_aws_failure_on_one_message_keeps_it_and_the_command_goes_on(
    place_orders, bus, poison_queue, relay_dlq, template, monkeypatch, capsys
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    good = failure_message(arn, shard, records[0], records[-1], 2)
    broken = failure_message(arn + "-gone", shard, records[0], records[-1], 2)
    queue_url = relay_dlq(broken, good)
    real = OutboxRecovery.read_stream_range

    def read(self: OutboxRecovery, batch: FailedStreamBatch) -> Any:
        if batch.stream_arn.endswith("-gone"):
            raise ClientError({"Error": {"Code": "InternalFailure", "Message": "boom"}}, "GetRecords")
        return real(self, batch)

    monkeypatch.setattr(OutboxRecovery, "read_stream_range", read)

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1
    lines = capsys.readouterr().out.splitlines()
    assert any('"error": "AWS call failed' in line for line in lines)
    assert json.loads(lines[-1]) == {"redriven": 1, "kept": 1, "parked": []}
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(records))


# --- against a bus that fails: nothing counted that is not on the bus, nothing deleted or parked again ------


@pytest.fixture
def failing_bus(bus: Any, monkeypatch: pytest.MonkeyPatch) -> FaultyEventBridge:
    """The bus behind the project's fault-injecting EventBridge (tests/unit/fakes.py)."""
    fake = FaultyEventBridge(boto3.client("events"))
    monkeypatch.setattr(shop.adapters.aws, "events", lambda: fake)
    return fake


@pytest.fixture
def day_after_t0(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator commands read the clock: run them a day after the orders were placed."""
    monkeypatch.setattr(operations.recovery, "utc_now", lambda: T0 + timedelta(days=1))


def messages_in(queue_url: str) -> int:
    attributes = boto3.client("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])[
        "Attributes"
    ]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def visible_bodies(queue_url: str) -> list[Any]:
    """The bodies a receive would get now (looked at, and left visible)."""
    messages = (
        boto3.client("sqs")
        .receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        .get("Messages", [])
    )
    return [json.loads(m["Body"]) for m in messages]


@dataclass(frozen=True)
class Printed:
    """What an operator command printed: its reports, its closing summary line, its stderr."""

    reports: list[dict[str, Any]]
    summary: dict[str, Any] | None  # {"redriven", "kept", "parked"} of the queue commands
    err: str


def printed(capsys: pytest.CaptureFixture[str]) -> Printed:
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    summaries = [line for line in lines if "redriven" in line]
    return Printed([line for line in lines if "complete" in line], summaries[-1] if summaries else None, err)


def reports_printed(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return printed(capsys).reports


def outbox_items(table: str) -> dict[str, dict[str, Any]]:
    """The outbox items of a table, by event id, as stored."""
    items = boto3.client("dynamodb").scan(TableName=table)["Items"]
    return {item_event_id(i): i for i in items if i[keys.SK]["S"].startswith(keys.OUTBOX_SK_PREFIX)}


@dataclass(frozen=True)
class BusFault:
    """A way the bus fails an event: its entry answered with `code` (a rejection when the code is one
    of RECORD_REJECTED_CODES), or, with `every_call`, every PutEvents call raising it whole."""

    code: str
    every_call: bool = False

    def inject(self, bus: FaultyEventBridge, event_id: str) -> None:
        if self.every_call:
            bus.raise_on_every_call = self.code
        elif self.code in RECORD_REJECTED_CODES:
            bus.reject, bus.reject_code = {event_id}, self.code
        else:
            bus.fail_permanently = {event_id}

    def keeps_off_the_bus(self, event_id: str, event_ids: list[str]) -> list[str]:
        """The events not on the bus after a run over `event_ids` (in publish order) with the fault
        injected for `event_id`: a call that raises takes every event with it."""
        return list(event_ids) if self.every_call else [event_id]


NOT_POISON = [
    pytest.param(BusFault("AccessDeniedException"), id="entry-access-denied"),
    pytest.param(BusFault("AccessDeniedException", every_call=True), id="every-call-raises-access-denied"),
]
REJECTIONS = [
    pytest.param(BusFault("MalformedDetail"), id="entry-rejected-malformed-detail"),
    pytest.param(BusFault("InvalidArgument"), id="entry-rejected-invalid-argument"),
]
BUS_FAILURES = NOT_POISON + REJECTIONS


@pytest.mark.parametrize("fault", NOT_POISON)
def test_redrive_while_the_bus_fails_keeps_the_message_and_names_what_is_not_on_the_bus(
    place_orders, failing_bus, bus, poison_queue, relay_dlq, template, capsys, day_after_t0, fault
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    event_ids = outbox_event_ids(records)
    fault.inject(failing_bus, event_ids[1])
    message = failure_message(arn, shard, records[0], records[-1], 2)
    queue_url = relay_dlq(message)

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1
    failed = fault.keeps_off_the_bus(event_ids[1], event_ids)
    out = printed(capsys)
    [report] = out.reports
    assert (report["unpublished"], report["complete"]) == (failed, False)
    assert report["published"] == 2 - len(failed)
    assert out.summary == {"redriven": 0, "kept": 1, "parked": []}
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(set(event_ids) - set(failed))
    # Kept for the next run, and visible again now the run is over
    assert messages_in(queue_url) == 1
    assert visible_bodies(queue_url) == [message]
    assert poison_queue() == []  # a failing bus is not poison


@pytest.mark.parametrize("fault", REJECTIONS)
def test_redrive_parks_an_entry_the_bus_rejects_whole_deletes_its_message_and_exits_1_naming_it(
    place_orders, failing_bus, bus, poison_queue, relay_dlq, settings, template, capsys, day_after_t0, fault
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    first, second = outbox_event_ids(records)
    fault.inject(failing_bus, first)
    queue_url = relay_dlq(failure_message(arn, shard, records[0], records[-1], 2))

    code = admin(template, "redrive", "--queue-url", queue_url)

    # The relay never met these records past its checkpoint: the rejected one is parked whole, as the
    # relay would have. The dead-letter message held only metadata, the poison queue now holds the
    # record itself: the message may go. But the event is not on the bus, so the operator must act.
    out = printed(capsys)
    [report] = out.reports
    assert (report["published"], report["poison"], report["complete"]) == (1, [first], True)
    assert code == 1
    assert out.summary == {"redriven": 1, "kept": 0, "parked": [first]}
    assert first in out.err
    assert "redrive-poison" in out.err
    assert [e["detail"]["id"] for e in bus()] == [second]
    [parked] = poison_queue()
    assert (parked["eventId"], parked["reason"]) == (first, f"EventBridge rejected the entry: {fault.code}")
    assert parked["item"] == outbox_items(settings.orders_table_name)[first]  # whole: all a redrive needs
    assert messages_in(queue_url) == 0


@pytest.mark.parametrize("fault", BUS_FAILURES)
def test_redrive_poison_against_a_failing_bus_keeps_the_parked_message(
    failing_bus, bus, poison_queue, template, capsys, fault
):
    image = outbox_image_of_new_order()
    event_id = item_event_id(image)
    fault.inject(failing_bus, event_id)
    poison_url = template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]
    PoisonQueue(poison_url).park(stream_poison(event_id, "was unpublishable", image))

    code = admin(template, "redrive-poison")

    assert code == 1
    out = printed(capsys)
    [report] = out.reports
    assert (report["published"], report["unpublished"], report["complete"]) == (0, [event_id], False)
    assert out.summary == {"redriven": 0, "kept": 1, "parked": []}
    assert bus() == []
    # Still parked, once: not deleted, and not parked a second time; visible again for the next run
    assert messages_in(poison_url) == 1
    assert [body["eventId"] for body in visible_bodies(poison_url)] == [event_id]


@pytest.mark.parametrize("fault", BUS_FAILURES)
@pytest.mark.parametrize("how", ["window", "event-id"])
def test_replay_against_a_failing_bus_exits_1_naming_the_events_and_parks_or_deletes_nothing(
    place_orders, failing_bus, bus, poison_queue, template, capsys, day_after_t0, fault, how
):
    place_orders(2)
    table = template.physical_name("OrdersTable")
    event_ids = outbox_event_ids(stream_records(template)[2])
    fault.inject(failing_bus, event_ids[0])
    stored = outbox_items(table)
    selection = (
        ["--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T10:05:00Z"]
        if how == "window"
        else ["--event-id", event_ids[0], "--event-id", event_ids[1]]
    )

    code = admin(template, "replay", "--table", table, *selection)

    assert code == 1
    failed = fault.keeps_off_the_bus(event_ids[0], event_ids)
    [report] = reports_printed(capsys)
    assert (report["unpublished"], report["complete"]) == (failed, False)
    assert report["published"] == 2 - len(failed)
    # Another order's event, in the same call, is on the bus unless the call itself failed
    assert [e["detail"]["id"] for e in bus()] == [i for i in event_ids if i not in failed]
    assert poison_queue() == []  # the relay parks poison; a replay only names it
    assert outbox_items(table) == stored  # the table is where a later replay finds them


def test_a_redrive_run_deletes_exactly_the_messages_whose_events_are_all_on_the_bus(
    place_orders, failing_bus, bus, poison_queue, relay_dlq, template, capsys, day_after_t0
):
    place_orders(3)
    arn, shard, records = stream_records(template)
    # One dead-letter message per order: its order item and its outbox item
    ranges = [records[i : i + 2] for i in range(0, len(records), 2)]
    messages = [failure_message(arn, shard, r[0], r[-1], 1) for r in ranges]
    [[first], [second], [third]] = [outbox_event_ids(r) for r in ranges]
    failing_bus.fail_permanently = {second}
    queue_url = relay_dlq(*messages)

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1
    assert printed(capsys).summary == {"redriven": 2, "kept": 1, "parked": []}
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([first, third])
    assert messages_in(queue_url) == 1
    assert visible_bodies(queue_url) == [messages[1]]  # the failed one's, and only it


def test_a_parked_record_eventbridge_still_rejects_is_not_published_and_says_why(
    recovery, failing_bus, poison_queue, bus
):
    image = outbox_image_of_new_order()
    failing_bus.reject = {item_event_id(image)}
    body = json.loads(poison_message_body(stream_poison("e-1", "was unpublishable", image)))

    report = recovery.redrive_parked(checked_poison_message(body))

    assert (report.published, report.unpublished, report.complete) == (0, [item_event_id(image)], False)
    assert any("still rejects" in line and "MalformedDetail" in line for line in report.missing)


def test_the_redrive_command_survives_any_message_and_redrives_the_others(
    place_orders, bus, poison_queue, relay_dlq, template, capsys, day_after_t0
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    queue_url = relay_dlq(
        "[" * 100_000,  # JSON nested past Python's recursion limit
        {"DDBStreamBatchInfo": ["not", "a", "map"]},
        failure_message(arn, shard, records[0], records[-1], 2),
    )

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(outbox_event_ids(records))
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"redriven": 1, "kept": 2, "parked": []}
    assert messages_in(queue_url) == 2


def test_redrive_parks_a_record_that_fails_to_decode_in_any_way(
    place_orders, bus, poison_queue, relay_dlq, settings, template, capsys, day_after_t0
):
    place_orders(1)
    deep = outbox_image_of_new_order()
    deep["envelope"] = {"S": "[" * 100_000}
    boto3.client("dynamodb").put_item(TableName=settings.orders_table_name, Item=deep)
    arn, shard, records = stream_records(template)
    queue_url = relay_dlq(failure_message(arn, shard, records[0], records[-1], 2))

    code = admin(template, "redrive", "--queue-url", queue_url)

    assert code == 1  # parked, so not on the bus: named for the operator
    assert printed(capsys).summary == {"redriven": 1, "kept": 0, "parked": [item_event_id(deep)]}
    assert [p["eventId"] for p in poison_queue()] == [item_event_id(deep)]
    assert len(bus()) == 1
    assert messages_in(queue_url) == 0  # the poison queue holds the record whole


# --- expiry: the republish window ends at expiresAt ---------------------------------------------------------


def test_replay_by_event_id_refuses_an_event_past_its_expiry_unless_told_to(
    place_orders, settings, template, poison_queue, bus
):
    place_orders(1)
    _, _, records = stream_records(template)
    [event_id] = outbox_event_ids(records)
    table = template.physical_name("OrdersTable")
    # An hour past expiresAt (written + OutboxTtlDays): DynamoDB may still hold it for days
    later = recovery_at(settings, template, T0 + timedelta(days=settings.outbox_ttl_days, hours=1))

    refused = later.replay_events([table], [event_id])
    assert (refused.expired, refused.complete, bus()) == ([event_id], False, [])
    assert any("--include-expired" in line for line in refused.missing)

    forced = later.replay_events([table], [event_id], include_expired=True)
    assert forced.complete
    assert [e["detail"]["id"] for e in bus()] == [event_id]


@pytest.fixture
def two_day_outbox_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_TTL_DAYS", "2")


def test_replay_of_a_window_leaves_out_items_past_their_own_expiry(
    two_day_outbox_ttl, place_orders, template, poison_queue, bus, monkeypatch, capsys
):
    placed = place_orders(5)  # 10:00 .. 10:04 with a 2-day window: they expire 10:00 .. 10:04 two days later
    # The window has since been raised to 16 days: each item's own expiresAt still ends its window
    monkeypatch.setenv("OUTBOX_TTL_DAYS", "16")
    monkeypatch.setattr(operations.recovery, "utc_now", lambda: T0 + timedelta(days=2, minutes=3))
    table = template.physical_name("OrdersTable")
    window = ["--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T10:05:00Z"]

    code = admin(template, "replay", "--table", table, *window)

    assert code == 1
    [report] = reports_printed(capsys)
    assert len(report["expired"]) == 4  # 10:00-10:03 are past expiry at 10:03 two days later
    assert [e["detail"]["subject"] for e in bus()] == [placed[4]["orderId"]]

    assert admin(template, "replay", "--table", table, *window, "--include-expired") == 0
    assert len(bus()) == 5


# --- seed, and names read from the stack's outputs ---------------------------------------------------
def stack_with_outputs(outputs: dict[str, str], parameters: dict[str, str] | None = None) -> str:
    """A CloudFormation stack (moto) whose outputs are these names, as `sam deploy` leaves ours, deployed
    with these parameter values."""
    parameters = parameters or {}
    body = {
        "Parameters": {key: {"Type": "String"} for key in parameters},
        "Resources": {"Nothing": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(
        StackName="shop",
        TemplateBody=json.dumps(body),
        Parameters=[{"ParameterKey": key, "ParameterValue": value} for key, value in parameters.items()],
    )
    return "shop"


def test_seed_sets_each_skus_stock_in_the_table_the_stack_names(template, settings, tmp_path, capsys):
    table = template.physical_name("InventoryTable")
    stack = stack_with_outputs({"InventoryTableName": table})
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(
        json.dumps({"stock": [{"sku": "SKU-A", "available": 7}, {"sku": "SKU-B", "available": 0}]})
    )

    code = outbox_admin(["--stack-name", stack, "seed", "--file", str(seed_file)])

    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"table": table, "skus": 2}
    repository = DynamoInventoryRepository(Settings.from_env({"INVENTORY_TABLE_NAME": table}))
    assert (repository.available("SKU-A"), repository.available("SKU-B")) == (7, 0)


@pytest.mark.parametrize("where", ["before the command", "after the command"])
def test_the_common_options_are_taken_before_or_after_the_command(
    template, settings, tmp_path, monkeypatch, where
):
    # As the module's help shows them: `python -m operations seed --stack-name NAME --file ...`
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(json.dumps({"stock": [{"sku": "SKU-A", "available": 5}]}))
    table = template.physical_name("InventoryTable")
    stack = stack_with_outputs({"InventoryTableName": table})
    command = ["seed", "--file", str(seed_file)]
    common = ["--stack-name", stack]

    argv = [*common, *command] if where == "before the command" else [*command, *common]
    assert outbox_admin(argv) == 0
    repository = DynamoInventoryRepository(Settings.from_env({"INVENTORY_TABLE_NAME": table}))
    assert repository.available("SKU-A") == 5

    # --local too: read, then refused because no local stack runs on that port (not "unrecognized")
    monkeypatch.setenv("PORT", "1")
    local = ["--local"]
    argv = [*local, *command] if where == "before the command" else [*command, *local]
    with pytest.raises(SystemExit, match="no local stack runs on port 1"):
        outbox_admin(argv)


def test_a_name_given_on_the_command_line_wins_over_the_stacks_and_none_at_all_is_an_error(
    template, settings, tmp_path
):
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(json.dumps({"stock": [{"sku": "SKU-A", "available": 3}]}))
    stack = stack_with_outputs({"InventoryTableName": "no-such-table"})
    table = template.physical_name("InventoryTable")

    assert outbox_admin(["--stack-name", stack, "seed", "--table", table, "--file", str(seed_file)]) == 0
    with pytest.raises(SystemExit, match="give --table, --stack-name or --local"):
        outbox_admin(["seed", "--file", str(seed_file)])


def test_replay_by_event_id_on_the_command_line_reads_the_stacks_outbox_tables_and_honours_include_expired(
    place_orders, template, poison_queue, bus, monkeypatch, capsys
):
    place_orders(1)
    _, _, records = stream_records(template)
    [event_id] = outbox_event_ids(records)
    table, inventory = template.physical_name("OrdersTable"), template.physical_name("InventoryTable")
    stack = stack_with_outputs({"OrdersTableName": table, "InventoryTableName": inventory})
    monkeypatch.setattr(operations.recovery, "utc_now", lambda: T0 + timedelta(days=17))  # past expiresAt
    poison_url = template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]
    names = [
        "--stack-name",
        stack,
        "--bus",
        template.physical_name("EventBus"),
        "--poison-queue-url",
        poison_url,
    ]
    replay = [*names, "replay", "--event-id", event_id]  # no --table: the stack's outbox tables

    assert outbox_admin(replay) == 1
    [refused] = reports_printed(capsys)
    assert (refused["tables"], refused["expired"], bus()) == ([table, inventory], [event_id], [])

    assert outbox_admin([*replay, "--include-expired"]) == 0
    assert [e["detail"]["id"] for e in bus()] == [event_id]


def inventory_answers(
    template: Template, settings: Settings, monkeypatch: pytest.MonkeyPatch, n: int
) -> list[str]:
    """The inventory service's answer to n of the orders table's OrderCreated events (an InventoryReserved,
    written to the inventory table's outbox at T0 + 30 minutes); their event ids."""
    monkeypatch.setattr(shop.domain.envelope, "now", lambda: minutes_after_t0(30))
    inventory = settings._replace(inventory_table_name=template.physical_name("InventoryTable"))
    repository = DynamoInventoryRepository(inventory)
    repository.set_stock("SKU-1", 100)
    service = InventoryService(repository, clock=lambda: minutes_after_t0(30))
    for item in list(outbox_items(template.physical_name("OrdersTable")).values())[:n]:
        entry = decode_outbox_image(item, settings.max_event_bytes)
        assert service.apply(CloudEvent.from_json(entry.detail)) == "reserved"
    return list(outbox_items(template.physical_name("InventoryTable")))


def test_replay_of_a_window_reads_every_outbox_table_of_the_stack_or_the_one_table_given(
    place_orders, template, settings, poison_queue, bus, day_after_t0, monkeypatch, capsys
):
    # Given two orders (their OrderCreated in the orders table) and the inventory's InventoryReserved
    # for each (in the inventory table)
    place_orders(2)
    created = outbox_event_ids(stream_records(template)[2])
    reserved = inventory_answers(template, settings, monkeypatch, 2)
    orders, inventory = template.physical_name("OrdersTable"), template.physical_name("InventoryTable")
    stack = stack_with_outputs({"OrdersTableName": orders, "InventoryTableName": inventory})
    window = ["--from", "2026-11-21T09:00:00Z", "--to", "2026-11-21T11:00:00Z"]

    # When the window is replayed with the stack's names alone, every event of both tables is on the bus
    assert admin(template, "--stack-name", stack, "replay", *window) == 0
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([*created, *reserved])
    [report] = reports_printed(capsys)
    assert (report["tables"], report["found"], report["published"]) == ([orders, inventory], 4, 4)

    # --table narrows it to that table
    assert admin(template, "--stack-name", stack, "replay", "--table", inventory, *window) == 0
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(reserved)


def test_replay_by_event_id_looks_in_every_outbox_table_and_names_them_all_for_an_id_in_none(
    place_orders, template, settings, poison_queue, bus, day_after_t0, monkeypatch, capsys
):
    place_orders(1)
    [reserved] = inventory_answers(template, settings, monkeypatch, 1)
    orders, inventory = template.physical_name("OrdersTable"), template.physical_name("InventoryTable")
    stack = stack_with_outputs({"OrdersTableName": orders, "InventoryTableName": inventory})

    code = admin(
        template, "--stack-name", stack, "replay", "--event-id", reserved, "--event-id", "no-such-event"
    )

    assert code == 1
    assert [e["detail"]["id"] for e in bus()] == [reserved]
    [report] = reports_printed(capsys)
    assert (report["tables"], report["found"], report["published"]) == ([orders, inventory], 1, 1)
    assert [line.split(" (")[0] for line in report["missing"]] == [
        f"event no-such-event is not in {orders} or {inventory}"
    ]


def test_with_an_order_database_replay_covers_it_and_the_outbox_tables(
    place_orders, template, settings, poison_queue, bus, day_after_t0, lambda_stub, monkeypatch, capsys
):
    # OrderStore=postgres: the orders' events are in the order database (its maintenance function replays
    # them); the inventory's are still in its DynamoDB table
    place_orders(1)
    [reserved] = inventory_answers(template, settings, monkeypatch, 1)
    orders, inventory = template.physical_name("OrdersTable"), template.physical_name("InventoryTable")
    outputs = {"OrdersTableName": orders, "InventoryTableName": inventory}
    stack = stack_with_outputs({**outputs, "OrderStoreMaintenanceFunctionName": "shop-maintenance"})
    window = ["--from", "2026-11-21T09:00:00Z", "--to", "2026-11-21T11:00:00Z"]
    stub = lambda_stub({"reset": ["o-1"], "missing": [], "republished": 1, "complete": True})

    assert admin(template, "--stack-name", stack, "replay", *window) == 0
    request = {"from": "2026-11-21T09:00:00Z", "to": "2026-11-21T11:00:00Z"}
    assert stub.requests == [("shop-maintenance", {"replay": request})]
    assert reserved in [e["detail"]["id"] for e in bus()]

    # By id: what no table holds is asked of the order database; what none holds is named with them all
    stub = lambda_stub({"reset": [], "missing": ["no-such-event"], "republished": 0, "complete": False})
    code = admin(
        template, "--stack-name", stack, "replay", "--event-id", reserved, "--event-id", "no-such-event"
    )

    assert code == 1
    assert stub.requests == [("shop-maintenance", {"replay": {"eventIds": ["no-such-event"]}})]
    assert [e["detail"]["id"] for e in bus()] == [reserved]
    err = capsys.readouterr().err
    assert f"not in the order database nor in {orders} or {inventory}" in err
    assert "no-such-event" in err


def test_replay_reads_the_outbox_tables_the_template_has():
    # Every table of the template with an outbox (its OutboxByTime index) is named by an output replay reads.
    from operations.stack import OUTBOX_TABLE_OUTPUTS

    template = load_yaml(ROOT / "template.yaml")
    outbox_tables = {
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::DynamoDB::Table"
        and any(
            index["IndexName"] == keys.OUTBOX_TIME_INDEX
            for index in resource["Properties"].get("GlobalSecondaryIndexes", [])
        )
    }
    named = {template["Outputs"][output]["Value"]["Ref"] for output in OUTBOX_TABLE_OUTPUTS}
    assert (len(outbox_tables), named) == (2, outbox_tables)


@pytest.mark.parametrize("window", [["--from", "2026-11-21T10:00:00Z"], ["--to", "2026-11-21T10:05:00Z"], []])
def test_replay_needs_event_ids_or_a_whole_window(template, settings, poison_queue, window):
    table = template.physical_name("OrdersTable")

    with pytest.raises(SystemExit, match="give --event-id, or both --from and --to"):
        admin(template, "replay", "--table", table, *window)


# --- bad operator input, and the stack's own configuration ---------------------------------------------


@pytest.mark.parametrize(
    ("start", "refusal"),
    [
        ("2026-11-21T10:00:00", "--from '2026-11-21T10:00:00' is not an RFC 3339 time with an offset"),
        ("yesterday", "--from 'yesterday' is not an RFC 3339 time"),
    ],
)
def test_replay_refuses_a_time_that_is_not_rfc_3339_saying_which_option(
    template, settings, poison_queue, start, refusal
):
    table = template.physical_name("OrdersTable")
    with pytest.raises(SystemExit, match=refusal):
        admin(template, "replay", "--table", table, "--from", start, "--to", "2026-11-21T11:00:00Z")


def test_replay_reads_rfc_3339s_lower_case_t_and_z(place_orders, template, settings, poison_queue, bus):
    place_orders(2)  # at T0 and T0 + 1 min
    table = template.physical_name("OrdersTable")

    code = admin(
        template, "replay", "--table", table, "--from", "2026-11-21t09:59:00z", "--to", "2026-11-21t10:05:00z"
    )

    assert (code, len(bus())) == (0, 2)


def test_replay_refuses_a_window_that_ends_before_it_starts(
    place_orders, template, settings, poison_queue, bus
):
    place_orders(3)
    table = template.physical_name("OrdersTable")

    with pytest.raises(SystemExit, match="--from 2026-11-21T10:05:00Z is after --to 2026-11-21T10:00:00Z"):
        admin(
            template,
            "replay",
            "--table",
            table,
            "--from",
            "2026-11-21T10:05:00Z",
            "--to",
            "2026-11-21T10:00:00Z",
        )
    assert bus() == []


class FailingFirstDelete:
    """The real (moto) SQS client, but the first DeleteMessage fails."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.deletes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def delete_message(self, **kwargs: Any) -> Any:
        self.deletes += 1
        if self.deletes == 1:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "DeleteMessage")
        return self._real.delete_message(**kwargs)


def test_a_message_that_could_not_be_deleted_is_kept_and_the_run_goes_on(
    place_orders, bus, poison_queue, relay_dlq, template, monkeypatch, capsys
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    body = failure_message(arn, shard, records[0], records[-1], 2)
    queue_url = relay_dlq(body, body)
    sqs = FailingFirstDelete(boto3.client("sqs"))
    monkeypatch.setattr(shop.adapters.aws, "sqs", lambda: sqs)

    code = admin(template, "redrive", "--queue-url", queue_url)

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert lines[-1] == {"redriven": 1, "kept": 1, "parked": []}
    assert any("redriven, but not deleted from the queue" in line.get("error", "") for line in lines)
    # the kept one is visible again at once for the next run (which redrives it again: consumers absorb it)
    left = boto3.client("sqs").receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    assert len(left.get("Messages", [])) == 1


@pytest.mark.parametrize("command", ["redrive", "redrive-poison"])
def test_redrive_handles_at_most_max_messages(
    place_orders, bus, poison_queue, relay_dlq, template, capsys, command
):
    place_orders(2)
    arn, shard, records = stream_records(template)
    body = failure_message(arn, shard, records[0], records[-1], 2)
    queue_url = relay_dlq(*[body] * 5)
    options = ["--queue-url", queue_url] if command == "redrive" else []
    if command == "redrive-poison":
        poison_url = template.function("OutboxRelayFunction").environment["RELAY_POISON_QUEUE_URL"]
        for _ in range(5):
            boto3.client("sqs").send_message(QueueUrl=poison_url, MessageBody="not a poison record")

    admin(template, command, *options, "--max-messages", "2")

    summary = printed(capsys).summary
    assert summary is not None
    assert summary["redriven"] + summary["kept"] == 2, summary


def test_redrive_dlq_names_the_consumers_it_knows_and_a_missing_output(aws, capsys):
    with pytest.raises(SystemExit) as refused:
        outbox_admin(["--stack-name", "shop", "redrive-dlq", "--consumer", "inventory"])
    assert refused.value.code == 2  # argparse: "invalid choice"
    assert "Inventory" in capsys.readouterr().err

    stack = stack_with_outputs({"OrderStatusDeadLetterQueueUrl": "https://sqs/q"})
    with pytest.raises(SystemExit, match=f"stack {stack} has no output InventoryDeadLetterQueueUrl"):
        outbox_admin(["--stack-name", stack, "redrive-dlq", "--consumer", "Inventory"])


def test_a_stack_that_does_not_exist_is_named_with_the_region_it_was_looked_for_in(aws):
    with pytest.raises(SystemExit, match=r"error: stack nowhere in region us-east-1: .*does not exist"):
        outbox_admin(["--stack-name", "nowhere", "replay", "--event-id", "e1"])


def test_no_region_at_all_is_said_so_not_a_traceback(fake_credentials, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")  # no profile's region either
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)

    with pytest.raises(SystemExit, match=r"error: no AWS region: .* or act on the local stack with --local"):
        outbox_admin(["--stack-name", "shop", "replay", "--event-id", "e1"])


def test_the_stack_settings_the_commands_read_are_the_ones_its_functions_get():
    # Each (parameter, variable) the commands read from the stack is how template.yaml's Globals set it.
    from operations.stack import STACK_SETTINGS

    environment = load_yaml(ROOT / "template.yaml")["Globals"]["Function"]["Environment"]["Variables"]
    for parameter, variable in STACK_SETTINGS.items():
        assert environment[variable] == {"Ref": parameter}


def test_replay_reads_max_event_bytes_from_the_stack_not_the_operators_shell(
    place_orders, template, poison_queue, bus, monkeypatch, capsys
):
    # Given a stack deployed with MaxEventBytes=1048576 and a 300 KB event it wrote
    place_orders(1)
    table = template.physical_name("OrdersTable")
    client = boto3.client("dynamodb")
    items = outbox_items(table)
    [(event_id, item)] = items.items()
    envelope = json.loads(item["envelope"]["S"])
    envelope["data"]["note"] = "x" * 300_000
    client.update_item(
        TableName=table,
        Key={keys.PK: item[keys.PK], keys.SK: item[keys.SK]},
        UpdateExpression="SET envelope = :e",
        ExpressionAttributeValues={":e": {"S": json.dumps(envelope)}},
    )
    outputs = {"OrdersTableName": table, "InventoryTableName": template.physical_name("InventoryTable")}
    stack = stack_with_outputs(outputs, parameters={"MaxEventBytes": "1048576"})
    # and an operator's shell that does not say (the default is EventBridge's 256 KB)
    monkeypatch.delenv("MAX_EVENT_BYTES", raising=False)
    monkeypatch.setattr(operations.recovery, "utc_now", lambda: T0 + timedelta(days=1))

    # When it is replayed by id from the stack's name
    code = admin(template, "--stack-name", stack, "replay", "--event-id", event_id)

    # Then it is republished, not called poison
    [report] = reports_printed(capsys)
    assert (code, report["poison"], [e["detail"]["id"] for e in bus()]) == (0, [], [event_id])


@pytest.mark.parametrize(
    "content", [None, "not json", '{"stock": [{"sku": "SKU-A", "available": "7"}]}', '{"items": []}']
)
def test_seed_refuses_a_file_that_is_not_a_seed_file_saying_so(template, settings, tmp_path, content):
    seed_file = tmp_path / "seed.json"
    if content is not None:
        seed_file.write_text(content)
    table = template.physical_name("InventoryTable")

    with pytest.raises(SystemExit, match=f"error: {seed_file} is not a seed file"):
        outbox_admin(["seed", "--table", table, "--file", str(seed_file)])
