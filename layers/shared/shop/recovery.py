"""Redrive and replay: republish outbox events from the table, for what the relay gave up on.

Redrive reads a relay dead-letter message (metadata only: stream, shard, sequence range), reads that
exact range back from the stream and republishes its outbox events. When the stream no longer holds
the range (24 h retention), it falls back to the outbox time index of the table, over the batch's
arrival window plus a margin: a superset, which is safe because consumers deduplicate on event id.
Replay republishes the outbox events of a time window, or given event ids, from the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from shop import aws, keys
from shop.envelope import parse_time
from shop.errors import InvalidEnvelope
from shop.observability import logger
from shop.outbox import OutboxEntry, decode_outbox_image, is_outbox_image
from shop.publisher import EventPublisher
from shop.relay import StreamChange

_STREAM_GONE = frozenset(
    {"TrimmedDataAccessException", "ExpiredIteratorException", "ResourceNotFoundException"}
)
_FALLBACK_MARGIN = timedelta(minutes=5)
_MAX_EMPTY_READS = 3
_MAX_READS = 10_000


class StreamRangeUnavailable(Exception):
    """The stream no longer holds the requested records."""


@dataclass(frozen=True, slots=True)
class FailedStreamBatch:
    """The metadata Lambda sends to a stream mapping's OnFailure destination."""

    stream_arn: str
    shard_id: str
    start_sequence_number: str
    end_sequence_number: str
    first_arrival: datetime
    last_arrival: datetime
    batch_size: int

    @classmethod
    def from_message(cls, body: dict[str, Any]) -> FailedStreamBatch:
        try:
            info = body["DDBStreamBatchInfo"]
            return cls(
                stream_arn=info["streamArn"],
                shard_id=info["shardId"],
                start_sequence_number=info["startSequenceNumber"],
                end_sequence_number=info["endSequenceNumber"],
                first_arrival=parse_time(info["approximateArrivalOfFirstRecord"]),
                last_arrival=parse_time(info["approximateArrivalOfLastRecord"]),
                batch_size=int(info["batchSize"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidEnvelope("not a stream failure record", {"error": str(exc)}) from exc

    @property
    def table_name(self) -> str:
        # arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label>
        return self.stream_arn.split(":table/", 1)[1].split("/stream/", 1)[0]


@dataclass
class RecoveryReport:
    source: str  # "stream" or "table"
    found: int = 0
    published: int = 0
    unpublished: list[str] = field(default_factory=list)  # event ids still not on the bus
    poison: list[str] = field(default_factory=list)  # item keys that cannot be decoded

    @property
    def complete(self) -> bool:
        return not self.unpublished and not self.poison


class OutboxRecovery:
    def __init__(self, publisher: EventPublisher, max_event_bytes: int, time_shards: int) -> None:
        self._publisher = publisher
        self._max_event_bytes = max_event_bytes
        self._time_shards = time_shards

    # --- redrive --------------------------------------------------------------------------------
    def redrive(self, batch: FailedStreamBatch) -> RecoveryReport:
        try:
            changes = self.read_stream_range(batch)
        except StreamRangeUnavailable:
            logger.warning("stream range trimmed; redriving from the table's time index")
            return self.replay_window(
                batch.table_name,
                batch.first_arrival - _FALLBACK_MARGIN,
                batch.last_arrival + _FALLBACK_MARGIN,
            )
        report = RecoveryReport(source="stream")
        images = [c.new_image for c in changes if c.event_name == "INSERT" and is_outbox_image(c.new_image)]
        return self._publish_images([i for i in images if i is not None], report)

    def read_stream_range(self, batch: FailedStreamBatch) -> list[StreamChange]:
        client = aws.dynamodb_streams()
        try:
            iterator = client.get_shard_iterator(
                StreamArn=batch.stream_arn,
                ShardId=batch.shard_id,
                ShardIteratorType="AT_SEQUENCE_NUMBER",
                SequenceNumber=batch.start_sequence_number,
            )["ShardIterator"]
            return self._read_until(iterator, int(batch.end_sequence_number))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _STREAM_GONE:
                raise StreamRangeUnavailable(batch.stream_arn) from exc
            raise

    @staticmethod
    def _read_until(iterator: str | None, end: int) -> list[StreamChange]:
        client = aws.dynamodb_streams()
        changes: list[StreamChange] = []
        empty_reads = 0
        for _ in range(_MAX_READS):
            if iterator is None or empty_reads >= _MAX_EMPTY_READS:
                break
            response = client.get_records(ShardIterator=iterator, Limit=1000)
            records = response.get("Records", [])
            empty_reads = 0 if records else empty_reads + 1
            for record in records:
                data = record["dynamodb"]
                if int(data["SequenceNumber"]) > end:
                    return changes
                changes.append(
                    StreamChange(
                        data["SequenceNumber"],
                        record.get("eventName", ""),
                        data.get("NewImage"),
                    )
                )
            iterator = response.get("NextShardIterator")
        return changes

    # --- replay ---------------------------------------------------------------------------------
    def replay_window(self, table: str, start: datetime, end: datetime) -> RecoveryReport:
        low, high = keys.outbox_time_bounds(start, end)
        item_keys: list[dict[str, Any]] = []
        paginator = aws.dynamodb().get_paginator("query")
        for bucket in keys.outbox_buckets(start, end, self._time_shards):
            for page in paginator.paginate(
                TableName=table,
                IndexName=keys.OUTBOX_TIME_INDEX,
                KeyConditionExpression="#b = :b AND #t BETWEEN :low AND :high",
                ExpressionAttributeNames={"#b": keys.OUTBOX_BUCKET, "#t": keys.OUTBOX_TIME},
                ExpressionAttributeValues={":b": {"S": bucket}, ":low": {"S": low}, ":high": {"S": high}},
            ):
                item_keys.extend({keys.PK: i[keys.PK], keys.SK: i[keys.SK]} for i in page.get("Items", []))
        return self._publish_images(self._get_items(table, item_keys), RecoveryReport(source="table"))

    def replay_events(self, table: str, event_ids: list[str]) -> RecoveryReport:
        item_keys: list[dict[str, Any]] = []
        report = RecoveryReport(source="table")
        for event_id in event_ids:
            items = aws.dynamodb().query(
                TableName=table,
                IndexName=keys.OUTBOX_EVENT_ID_INDEX,
                KeyConditionExpression="eventId = :id",
                ExpressionAttributeValues={":id": {"S": event_id}},
            )["Items"]
            if not items:
                report.unpublished.append(event_id)  # unknown (or expired) event id
            item_keys.extend({keys.PK: i[keys.PK], keys.SK: i[keys.SK]} for i in items)
        return self._publish_images(self._get_items(table, item_keys), report)

    def _get_items(self, table: str, item_keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for start in range(0, len(item_keys), 100):
            pending: dict[str, Any] = {
                table: {"Keys": item_keys[start : start + 100], "ConsistentRead": True}
            }
            for _ in range(10):
                if not pending:
                    break
                response = aws.dynamodb().batch_get_item(RequestItems=pending)
                items.extend(response.get("Responses", {}).get(table, []))
                pending = dict(response.get("UnprocessedKeys") or {})
        return items

    def _publish_images(self, images: list[dict[str, Any]], report: RecoveryReport) -> RecoveryReport:
        entries: list[OutboxEntry] = []
        for image in images:
            try:
                entries.append(decode_outbox_image(image, self._max_event_bytes))
            except InvalidEnvelope:
                report.poison.append(f"{image[keys.PK]['S']}|{image[keys.SK]['S']}")
        # Oldest first, and an aggregate's events by sequence, as the relay would have sent them.
        entries.sort(key=lambda e: (e.occurred_at, e.aggregate, e.sequence))
        report.found = len(entries) + len(report.poison)
        result = self._publisher.publish_in_order(entries)
        report.published = result.confirmed
        if result.first_unpublished is not None:
            report.unpublished.extend(e.event_id for e in entries[result.first_unpublished :])
        logger.info(
            "outbox events republished",
            extra={"source": report.source, "found": report.found, "published": report.published},
        )
        return report
