"""DynamoDB Local's Query of the OutboxByTime index, where replay of one event by id relies on it.

There is no index by event id (docs/performance.md, "Write cost"): replay finds an event's outbox item in
OutboxByTime, the hourly buckets of the shard its id hashes to, filtering each bucket's entries on the
table's sort key, which ends with the event id (operations/outbox_index.py, find_outbox_items). What that
relies on, from the DynamoDB documentation:
- KEYS_ONLY: "Only the index and primary keys are projected into the index" (API reference,
  Projection): each entry carries the table's PK and SK;
- "A filter expression cannot contain partition key or sort key attributes" (Developer Guide,
  Query.FilterExpression): those of what is queried, here the index's outboxBucket and outboxTime; the
  table's sort key, projected into the index, may be filtered on;
- "A Query operation can retrieve a maximum of 1 MB of data. This limit applies before the filter
  expression is evaluated" (same page), as does `Limit` ("the maximum number of items to evaluate (not
  necessarily the number of matching items)", API reference, Query): a page may match nothing and still
  not be the last, so every page up to the last LastEvaluatedKey is read.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

import shop.adapters.aws
from operations.recovery import OutboxRecovery
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import outbox_item
from shop.adapters.eventbridge import EventPublisher
from shop.domain.envelope import CloudEvent
from tests.conformance.test_dynamodb_transactions import dynamodb, orders_table  # noqa: F401 (fixtures)
from tests.support.publishing import ListSink, RecordingBus

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
SHARDS = 8


def event_of(order_id: str, minutes: int) -> CloudEvent:
    return CloudEvent.new(
        source="shop.orders",
        type="OrderCreated",
        subject=order_id,
        sequence=1,
        data={"orderId": order_id},
        correlation_id="c",
        time=T0 + timedelta(minutes=minutes),
    )


def item_of(event: CloudEvent, *, written_by_earlier_code: bool = False) -> dict[str, Any]:
    item = outbox_item(
        event, keys.order_partition(event.subject), ttl_days=16, time_shards=SHARDS, max_event_bytes=262_144
    )
    if written_by_earlier_code:  # as before 2026-11-26: the event repeated in attributes, an id suffix
        item |= {
            "eventId": {"S": event.id},
            "eventType": {"S": event.type},
            "aggregateId": {"S": event.subject},
            "sequence": {"N": str(event.sequence)},
            keys.OUTBOX_TIME: {"S": f"{item[keys.OUTBOX_TIME]['S']}#{event.id}"},
        }
    return item


@pytest.fixture
def recovery(dynamodb: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[OutboxRecovery, RecordingBus]:  # noqa: F811
    """Recovery a day after T0, on DynamoDB Local, publishing to a bus that records what it accepted."""
    bus = RecordingBus()
    monkeypatch.setattr(shop.adapters.aws, "events", lambda: bus)
    return (
        OutboxRecovery(
            EventPublisher("conformance-bus", 262_144),
            ListSink(),
            max_event_bytes=262_144,
            time_shards=SHARDS,
            ttl_days=16,
            clock=lambda: T0 + timedelta(days=1),
            sleep=lambda _: None,
        ),
        bus,
    )


def test_a_query_of_the_time_index_may_filter_on_the_tables_sort_key_not_on_its_own_keys(
    dynamodb: Any,  # noqa: F811
    orders_table: str,  # noqa: F811
) -> None:
    event = event_of("o-1", 0)
    item = item_of(event)
    dynamodb.put_item(TableName=orders_table, Item=item)
    query = {
        "TableName": orders_table,
        "IndexName": keys.OUTBOX_TIME_INDEX,
        "KeyConditionExpression": "#b = :b",
        "ExpressionAttributeValues": {
            ":b": item[keys.OUTBOX_BUCKET],
            ":id": {"S": keys.outbox_sort_key_suffix(event.id)},
        },
    }

    found = dynamodb.query(
        **query,
        FilterExpression="contains(#sk, :id)",
        ExpressionAttributeNames={"#b": "outboxBucket", "#sk": "SK"},
    )
    assert [i[keys.SK] for i in found["Items"]] == [item[keys.SK]]
    assert set(found["Items"][0]) == {keys.PK, keys.SK, keys.OUTBOX_BUCKET, keys.OUTBOX_TIME}  # KEYS_ONLY

    with pytest.raises(ClientError) as refused:  # the index's own sort key belongs in the key condition
        dynamodb.query(
            **query,
            FilterExpression="contains(#t, :id)",
            ExpressionAttributeNames={"#b": "outboxBucket", "#t": keys.OUTBOX_TIME},
        )
    assert refused.value.response["Error"]["Code"] == "ValidationException"


def test_replay_by_event_id_finds_items_of_either_shape_through_pages_that_match_nothing(
    dynamodb: Any,  # noqa: F811
    orders_table: str,  # noqa: F811
    recovery: tuple[OutboxRecovery, RecordingBus],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replay, bus = recovery
    events = [event_of(f"o-{n}", n) for n in range(40)]  # 10:00 .. 10:39: one hour, 8 shards
    for n, event in enumerate(events):
        dynamodb.put_item(TableName=orders_table, Item=item_of(event, written_by_earlier_code=n % 2 == 1))
    # One index entry read per page: pages of a bucket's other events come back empty, not last.
    client = shop.adapters.aws.dynamodb()
    client.meta.events.register(
        "provide-client-params.dynamodb.Query", lambda params, **_: params.__setitem__("Limit", 1)
    )
    monkeypatch.setattr(shop.adapters.aws, "dynamodb", lambda: client)
    wanted = [events[0].id, events[38].id, events[39].id, "no-such-event"]

    report = replay.replay_events([orders_table], wanted)

    assert sorted(event_id for _, _, event_id in bus.accepted) == sorted(wanted[:3])
    assert (report.found, report.published) == (3, 3)
    assert [line.split(" (")[0] for line in report.missing] == [
        f"event no-such-event is not in {orders_table}"
    ]
