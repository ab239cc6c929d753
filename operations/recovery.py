"""Redrive and replay: republish outbox events from the stream or the table, and never claim more than
was done.

Redrive reads a relay dead-letter message (metadata only: stream, shard, sequence range, batch size),
reads that exact range back from the stream and republishes its outbox events. When the stream no
longer holds the range (24 h retention), it falls back to the outbox time index of the table, over
the batch's arrival window plus a margin: a superset, which is safe because consumers deduplicate on
event id. Replay republishes the outbox events of a time window, or given event ids, from the outbox
tables (the orders' and the inventory's: a replay reads every one it is given): both through the
OutboxByTime index, an event id by the buckets of the shard its id hashes to (operations/outbox_index.py);
an id found in none of them is named in `missing`, with every table it was looked for in.

A report is complete only when every record the message or window stands for was found and either
accepted by PutEvents or parked as poison. Whatever cannot be shown is named in `missing`:
- a stream read that did not reach `endSequenceNumber` (AWS: reaching records can take many
  GetRecords calls, and an empty page does not mean the end);
- fewer outbox records in the range or window than the failed batch's `batchSize`;
- keys BatchGetItem still left unprocessed after retries with backoff;
- a batch or window older than the outbox TTL horizon, whose items DynamoDB may have deleted;
- an entry EventBridge rejected (`MalformedDetail`, `InvalidArgument`): never counted as published;
- an item past its `expiresAt`: the end of its republish window. DynamoDB "typically deletes expired
  items within two days of expiration" and expired items "still show up in reads, queries, and scans"
  until then (API reference, UpdateTimeToLive), so such an item may still be read, but the consumers'
  memory of its event id is sized to the window, so republishing it could apply it twice (a customer
  notified again). It is not republished unless the operator asks for it explicitly (replay
  `--include-expired`).
The operator command deletes a dead-letter message only when its report is complete, and exits 1
unless every event is on the bus (`all_on_bus`): a record parked on the way is held whole by the
poison queue, so its message may go, but the operator must still act (`redrive-poison` after the fix).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from operations import outbox_index
from operations.outbox_index import EventSearch
from shop.adapters import aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import (
    decode_outbox_image,
    event_id_of_image,
    is_outbox_image,
    outbox_expiry,
    poison_record,
)
from shop.adapters.poison_queue import parked_poison
from shop.domain.envelope import now as utc_now
from shop.domain.envelope import parse_time
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import OutboxEntry, outbox_entry
from shop.domain.poison import ParkedPoison, PoisonSink, RowPosition, StreamPosition
from shop.domain.publishing import OutboxPublisher
from shop.runtime.observability import logger
from shop.runtime.relay import StreamChange

_STREAM_GONE = frozenset(
    {"TrimmedDataAccessException", "ExpiredIteratorException", "ResourceNotFoundException"}
)
_FALLBACK_MARGIN = timedelta(minutes=5)
# A stream read gives up (and says so) after this many GetRecords calls or seconds.
_MAX_READS = 2_000
_MAX_READ_SECONDS = 300.0
_BATCH_GET_ATTEMPTS = 8
# Replay by event id: how long after its expiresAt an item may still be read ("DynamoDB typically deletes
# expired items within two days of expiration": API reference, UpdateTimeToLive), and how far a writer's
# clock may run ahead of the operator's; ids looked for by one query (the filter's OR terms).
_EXPIRED_ITEMS_LINGER = timedelta(days=2)
_WRITER_CLOCK_SKEW = timedelta(hours=1)


def table_of_stream(stream_arn: str) -> str:
    """arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label> -> <name>"""
    return stream_arn.split(":table/", 1)[-1].split("/stream/", 1)[0]


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
        return table_of_stream(self.stream_arn)


@dataclass
class RecoveryReport:
    source: str  # "stream" or "table"
    expected: int | None = None  # records the failed batch held (its batchSize), when known
    found: int = 0
    published: int = 0
    unpublished: list[str] = field(default_factory=list)  # event ids still not on the bus
    poison: list[str] = field(default_factory=list)  # event ids parked in the poison queue
    expired: list[str] = field(default_factory=list)  # event ids past expiresAt, not republished
    missing: list[str] = field(default_factory=list)  # what could not be found or shown, in words
    # Parked rows an operator discarded (discard-poison): never to be published; their message may go.
    discarded: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every record was found and is on the bus or parked whole: its queue message may go."""
        return not self.unpublished and not self.missing

    @property
    def all_on_bus(self) -> bool:
        """Complete with nothing parked: no event is left for an operator to put on the bus. A parked
        event is held whole by the poison queue, but is on the bus only after `redrive-poison`."""
        return self.complete and not self.poison


@dataclass
class _StreamRead:
    changes: list[StreamChange]
    reached_end: bool
    calls: int


def in_publish_order(entries: Sequence[OutboxEntry]) -> list[OutboxEntry]:
    """Oldest first, but each aggregate's events strictly by sequence whatever their clocks say.

    Events are interleaved by time, then every aggregate's slots are refilled with its own events
    in sequence order: a writer's clock skew can move an aggregate among others, never reorder it.
    """
    by_time = sorted(entries, key=lambda e: (e.occurred_at, e.aggregate, e.sequence))
    by_aggregate: dict[str, list[OutboxEntry]] = defaultdict(list)
    for entry in by_time:
        by_aggregate[entry.aggregate].append(entry)
    queues = {name: iter(sorted(items, key=lambda e: e.sequence)) for name, items in by_aggregate.items()}
    return [next(queues[entry.aggregate]) for entry in by_time]


class OutboxRecovery:
    def __init__(
        self,
        publisher: OutboxPublisher,
        poison_sink: PoisonSink,
        *,
        max_event_bytes: int,
        time_shards: int,
        ttl_days: int,
        clock: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        order_store: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """`order_store` (OrderStore=postgres): sends a request to the order database's maintenance
        function and returns its answer (operations/admin.py); parked rows are then redriven from the
        database."""
        self._order_store = order_store
        self._publisher = publisher
        self._poison_sink = poison_sink
        self._max_event_bytes = max_event_bytes
        self._time_shards = time_shards
        self._ttl = timedelta(days=ttl_days)
        self._clock = clock or (lambda: utc_now())  # read at call time: tests move the clock
        self._sleep = sleep

    # --- redrive --------------------------------------------------------------------------------
    def redrive(self, batch: FailedStreamBatch) -> RecoveryReport:
        try:
            read = self.read_stream_range(batch)
        except StreamRangeUnavailable:
            logger.warning("stream range trimmed; redriving from the table's time index")
            return self._redrive_from_table(batch)
        report = RecoveryReport(source="stream", expected=batch.batch_size)
        if not read.reached_end:
            report.missing.append(
                f"the stream read stopped after {read.calls} GetRecords calls before reaching "
                f"endSequenceNumber {batch.end_sequence_number} of shard {batch.shard_id}"
            )
        # The mapping's filter let outbox items through; the failed batch held exactly those.
        images = [c.new_image for c in read.changes if is_outbox_image(c.new_image)]
        outbox = [i for i in images if i is not None]
        if len(outbox) < batch.batch_size:
            report.missing.append(
                f"found {len(outbox)} of the batch's {batch.batch_size} records in shard {batch.shard_id} "
                f"{batch.start_sequence_number}..{batch.end_sequence_number}"
            )
        inserts = [
            c.new_image
            for c in read.changes
            if c.event_name == "INSERT" and c.new_image is not None and is_outbox_image(c.new_image)
        ]
        # The relay never saw these records past its checkpoint: poison among them is parked now.
        return self._publish_images(inserts, report, park_poison=True, stream_arn=batch.stream_arn)

    def _redrive_from_table(self, batch: FailedStreamBatch) -> RecoveryReport:
        start = batch.first_arrival - _FALLBACK_MARGIN
        end = batch.last_arrival + _FALLBACK_MARGIN
        horizon = self._ttl_horizon()
        if start < horizon:
            report = RecoveryReport(source="table", expected=batch.batch_size)
            report.missing.append(
                f"the batch arrived at {batch.first_arrival.isoformat()}, before the outbox TTL horizon "
                f"{horizon.isoformat()} ({self._ttl.days} days): its events may have been deleted from "
                f"{batch.table_name}; {batch.batch_size} records of shard {batch.shard_id} "
                f"{batch.start_sequence_number}..{batch.end_sequence_number} cannot be shown republished"
            )
            return report
        report = self.replay_window([batch.table_name], start, end)
        report.expected = batch.batch_size
        if report.found < batch.batch_size:
            report.missing.append(
                f"found {report.found} outbox items in {batch.table_name} between {start.isoformat()} and "
                f"{end.isoformat()}, fewer than the batch's {batch.batch_size} records"
            )
        return report

    def read_stream_range(self, batch: FailedStreamBatch) -> _StreamRead:
        client = aws.dynamodb_streams()
        try:
            iterator = client.get_shard_iterator(
                StreamArn=batch.stream_arn,
                ShardId=batch.shard_id,
                ShardIteratorType="AT_SEQUENCE_NUMBER",
                SequenceNumber=batch.start_sequence_number,
            )["ShardIterator"]
            return self._read_until(iterator, int(batch.end_sequence_number), batch.stream_arn)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _STREAM_GONE:
                raise StreamRangeUnavailable(batch.stream_arn) from exc
            raise

    @staticmethod
    def _read_until(iterator: str | None, end: int, stream_arn: str) -> _StreamRead:
        """Page through the shard until a record at or past `end`; an empty page is not the end."""
        client = aws.dynamodb_streams()
        changes: list[StreamChange] = []
        deadline = time.monotonic() + _MAX_READ_SECONDS
        calls = 0
        while iterator is not None and calls < _MAX_READS and time.monotonic() < deadline:
            response = client.get_records(ShardIterator=iterator, Limit=1000)
            calls += 1
            for record in response.get("Records", []):
                data = record["dynamodb"]
                sequence = int(data["SequenceNumber"])
                if sequence > end:
                    return _StreamRead(changes, reached_end=True, calls=calls)
                changes.append(
                    StreamChange(
                        data["SequenceNumber"], record.get("eventName", ""), data.get("NewImage"), stream_arn
                    )
                )
                if sequence == end:
                    return _StreamRead(changes, reached_end=True, calls=calls)
            iterator = response.get("NextShardIterator")
        return _StreamRead(changes, reached_end=False, calls=calls)

    # --- parked poison ----------------------------------------------------------------------------
    def redrive_parked(self, body: dict[str, Any]) -> RecoveryReport:
        """Republish a record the relay parked, once whatever made it unpublishable has been fixed: the
        record's position hands it to the redrive for its store (from_stream, from_outbox_row)."""
        return parked_poison(body).redrive(self)

    def from_stream(self, parked: ParkedPoison, position: StreamPosition) -> RecoveryReport:
        """A record a stream relay parked: an outbox item (DynamoDB attribute-value form), from the message
        or, too large for it, from its table by its key."""
        report = RecoveryReport(source="poison queue", expected=1)
        event_id, image = parked.event_id, parked.image
        if image is None:  # too large for the message: read it from the table by its key
            table = table_of_stream(str(position.stream_arn or ""))
            image = aws.dynamodb().get_item(TableName=table, Key=parked.key, ConsistentRead=True).get("Item")
            if image is None:
                report.missing.append(f"parked event {event_id} is no longer in {table} (deleted by TTL?)")
                return report
        if not isinstance(image, dict):
            report.missing.append(f"parked event {event_id}: the message's item is not a DynamoDB item")
            return report
        item, limit = image, self._max_event_bytes
        return self._republish_parked(event_id, report, lambda: decode_outbox_image(item, limit))

    def from_outbox_row(self, parked: ParkedPoison, position: RowPosition) -> RecoveryReport:
        """A row the PostgreSQL outbox publisher parked: through the order database when its maintenance
        function is at hand (redrive_parked_row), else from the message."""
        if self._order_store is not None:
            return self.redrive_parked_row(parked.event_id, parked.image)
        return self._republish_parked_row(parked.event_id, parked.image, parked.key)

    def _republish_parked_row(self, event_id: str, row: object, key: dict[str, Any]) -> RecoveryReport:
        report = RecoveryReport(source="poison queue", expected=1)
        if not isinstance(row, dict):
            # Too large for the message, and the order database is out of reach (a private VPC).
            report.missing.append(
                f"parked event {event_id} is outbox row {key.get('position')} of the order database, "
                "too large for a queue message: redrive it from the order database through its maintenance "
                "function (give --stack-name, or --order-store-function)"
            )
            return report
        return self._republish_parked(event_id, report, lambda: self._row_entry(row))

    def _republish_parked(
        self, event_id: str, report: RecoveryReport, entry_of: Callable[[], OutboxEntry]
    ) -> RecoveryReport:
        report.found = 1
        try:
            entry = entry_of()
        except InvalidEnvelope as exc:
            report.unpublished.append(event_id)
            report.missing.append(f"event {event_id} is still unpublishable: {exc.message} {exc.details}")
            return report
        result = self._publisher.publish_in_order([entry])
        report.published = result.published
        if result.rejected:
            code, message = result.rejected[0]
            report.unpublished.append(entry.event_id)
            report.missing.append(
                f"event {entry.event_id}: EventBridge still rejects it ({code}: {message}); fix the cause, "
                "then redrive again"
            )
        elif result.first_unpublished is not None:
            report.unpublished.append(entry.event_id)
            report.missing.append(
                f"event {entry.event_id} is not on the bus: PutEvents failed ({result.failures_by_code})"
            )
        return report

    def redrive_parked_row(self, event_id: str, image: object) -> RecoveryReport:
        """OrderStore=postgres: redrive the parked row from the order database, through its maintenance
        function (shop.runtime.order_store_poison), so that the row is marked redriven and, whatever its
        message holds, republished under either relay. A row no longer in the database is republished
        from the message when the message holds it whole."""
        assert self._order_store is not None
        answer = self._order_store({"redriveParked": {"eventIds": [event_id]}})
        if event_id in answer.get("missing", []) and isinstance(image, dict):
            logger.info(
                "parked row not in the order database: republished from its message",
                extra={"event_id": event_id},
            )
            return self._republish_parked_row(event_id, image, {})
        report = RecoveryReport(source="order database", expected=1)
        if event_id in answer.get("missing", []):
            report.missing.append(
                f"parked event {event_id} is not in the order database's outbox (discarded and past the "
                "republish window?) and its message holds only its key: it cannot be republished"
            )
            return report
        report.found = 1
        if event_id in answer.get("republished", []):
            report.published = 1
        elif event_id in answer.get("parkedAgain", []):
            report.poison.append(event_id)  # a new poison message holds it, with the reason
        elif event_id in answer.get("discarded", []):
            report.discarded.append(event_id)
        else:
            report.unpublished.append(event_id)
            report.missing.append(
                f"event {event_id} is pending again in the order database but was not on the bus when the "
                f"function's invocation ended ({answer.get('relay')} relay): it will be sent; run "
                "redrive-poison again to confirm"
            )
        return report

    def _row_entry(self, row: dict[str, Any]) -> OutboxEntry:
        """The entry of an outbox row the PostgreSQL outbox publisher parked, as its message holds it."""
        envelope, trace_header = row.get("envelope"), row.get("traceHeader")
        if not isinstance(envelope, str):
            raise InvalidEnvelope("the parked outbox row has no envelope string")
        return outbox_entry(
            envelope, self._max_event_bytes, trace_header if isinstance(trace_header, str) else None
        )

    # --- replay ---------------------------------------------------------------------------------
    def _ttl_horizon(self) -> datetime:
        """Items written before this may already be deleted by TTL."""
        return self._clock() - self._ttl

    def replay_window(
        self, tables: Sequence[str], start: datetime, end: datetime, *, include_expired: bool = False
    ) -> RecoveryReport:
        """Republish the outbox events written between start and end to any of `tables`, in one publish
        order (each aggregate's events are in one table: a service writes its own)."""
        report = RecoveryReport(source="table")
        horizon = self._ttl_horizon()
        if start < horizon:
            report.missing.append(
                f"the window starts at {start.isoformat()}, before the outbox TTL horizon "
                f"{horizon.isoformat()}: events written before it may have been deleted"
            )
        images: list[dict[str, Any]] = []
        for table in tables:
            item_keys = outbox_index.keys_written_between(table, start, end, self._time_shards)
            images.extend(self._get_items(table, item_keys, report))
        return self._publish_images(images, report, park_poison=False, include_expired=include_expired)

    def replay_events(
        self,
        tables: Sequence[str],
        event_ids: list[str],
        *,
        include_expired: bool = False,
        written_from: datetime | None = None,
        written_to: datetime | None = None,
    ) -> RecoveryReport:
        """Republish these events from whichever of `tables` holds each (find_events, then replay_found)."""
        search = self.find_events(tables, event_ids, written_from=written_from, written_to=written_to)
        return self.replay_found(search, event_ids, include_expired=include_expired)

    def find_events(
        self,
        tables: Sequence[str],
        event_ids: list[str],
        *,
        written_from: datetime | None = None,
        written_to: datetime | None = None,
    ) -> EventSearch:
        """Where each of these events' outbox item is, in the first of `tables` that holds it
        (outbox_index.find_in_tables): by default in the hours of the republish window, plus the days
        DynamoDB may keep an expired item, plus an hour of writers' clock skew; `written_from`/`written_to`
        search other hours instead (an item whose window outlived a lowered OutboxTtlDays)."""
        now = self._clock()
        oldest = written_from or now - self._ttl - _EXPIRED_ITEMS_LINGER
        newest = written_to or now + _WRITER_CLOCK_SKEW
        return outbox_index.find_in_tables(tables, event_ids, oldest, newest, self._time_shards)

    def replay_found(
        self, search: EventSearch, event_ids: list[str], *, include_expired: bool = False
    ) -> RecoveryReport:
        """Republish these events from where `search` found them; one it did not find is named in
        `missing`, with every table and the hours it was looked for in."""
        wanted = list(dict.fromkeys(event_ids))
        report = RecoveryReport(source="table", expected=len(wanted))
        for event_id in wanted:
            if event_id not in search.found:
                report.missing.append(
                    f"event {event_id} is not in {' or '.join(search.tables)} (unknown, or deleted by TTL): "
                    f"no outbox item of it in the OutboxByTime buckets of its shard "
                    f"({keys.outbox_time_shard(event_id, self._time_shards)}) written between "
                    f"{search.oldest.isoformat()} and {search.newest.isoformat()}; if it was written at "
                    "another time, give that window (--from/--to) with --event-id"
                )
        images: list[dict[str, Any]] = []
        for table in search.tables:
            item_keys = [
                search.found[e][1] for e in wanted if e in search.found and search.found[e][0] == table
            ]
            if item_keys:
                images.extend(self._get_items(table, item_keys, report))
        return self._publish_images(images, report, park_poison=False, include_expired=include_expired)

    def _get_items(
        self, table: str, item_keys: list[dict[str, Any]], report: RecoveryReport
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for start in range(0, len(item_keys), 100):
            pending: dict[str, Any] = {
                table: {"Keys": item_keys[start : start + 100], "ConsistentRead": True}
            }
            for attempt in range(_BATCH_GET_ATTEMPTS):
                if attempt:  # full-jitter backoff: 0.1 s, 0.2 s ... capped at 5 s
                    self._sleep(random.random() * min(5.0, 0.1 * 2**attempt))  # noqa: S311
                response = aws.dynamodb().batch_get_item(RequestItems=pending)
                items.extend(response.get("Responses", {}).get(table, []))
                pending = dict(response.get("UnprocessedKeys") or {})
                if not pending:
                    break
            for key in (pending.get(table) or {}).get("Keys", []):
                report.missing.append(
                    f"item {key[keys.PK]['S']}|{key[keys.SK]['S']} of {table} still unprocessed by "
                    f"BatchGetItem after {_BATCH_GET_ATTEMPTS} attempts"
                )
        return items

    def _publish_images(
        self,
        images: list[dict[str, Any]],
        report: RecoveryReport,
        *,
        park_poison: bool,
        stream_arn: str | None = None,
        include_expired: bool = False,
    ) -> RecoveryReport:
        """Publish what decodes. Poison is parked when the relay cannot have parked it already (a
        dead-lettered batch); a replay of the table only names it, so replays never park it twice."""
        report.found = len(images)
        if not include_expired:
            images = self._without_expired(images, report)
        entries: list[OutboxEntry] = []
        for image in images:
            try:
                entries.append(decode_outbox_image(image, self._max_event_bytes))
            except InvalidEnvelope as exc:
                if park_poison:
                    self._park(image, exc, report, stream_arn)
                else:
                    event_id = event_id_of_image(image)
                    report.unpublished.append(event_id)
                    report.missing.append(
                        f"event {event_id} cannot be published ({exc.message}): the relay parked it when it "
                        "first met it; fix it and use redrive-poison"
                    )
        ordered = in_publish_order(entries)
        result = self._publisher.publish_in_order(ordered)
        report.published = result.published
        stopped_at = len(ordered) if result.first_unpublished is None else result.first_unpublished
        if stopped_at < len(ordered):
            # Chunk-mates of the failed entry may be on the bus; everything else from there on is not.
            accepted = set(result.accepted_positions)
            not_sent = [e.event_id for p, e in enumerate(ordered) if p >= stopped_at and p not in accepted]
            report.unpublished.extend(not_sent)
            report.missing.append(
                f"PutEvents failed at event {ordered[stopped_at].event_id} ({result.failures_by_code}): "
                f"{len(not_sent)} events from there on were not republished"
            )
        by_event_id = {event_id_of_image(image): image for image in images}
        for position, (code, message) in sorted(result.rejected.items()):
            if position >= stopped_at:
                break  # already named among the unpublished
            event_id = ordered[position].event_id
            refused = InvalidEnvelope(f"EventBridge rejected the entry: {code}", {"errorMessage": message})
            if park_poison:
                self._park(by_event_id[event_id], refused, report, stream_arn)
            else:
                report.unpublished.append(event_id)
                report.missing.append(f"event {event_id}: {refused.message} ({message})")
        logger.info(
            "outbox events republished",
            extra={
                "source": report.source,
                "found": report.found,
                "published": report.published,
                "complete": report.complete,
            },
        )
        return report

    def _without_expired(self, images: list[dict[str, Any]], report: RecoveryReport) -> list[dict[str, Any]]:
        """Leave out items past their expiresAt, naming them in the report."""
        now = self._clock().timestamp()
        kept: list[dict[str, Any]] = []
        for image in images:
            expires_at = outbox_expiry(image)
            if expires_at is not None and expires_at <= now:
                report.expired.append(event_id_of_image(image))
            else:
                kept.append(image)
        if report.expired:
            report.missing.append(
                f"{len(report.expired)} events are past their expiresAt (the end of their republish window: "
                "consumers may no longer remember them, so republishing could apply them twice) and were not "
                "republished; to republish them anyway, replay them with --include-expired"
            )
        return kept

    def _park(
        self, image: dict[str, Any], exc: InvalidEnvelope, report: RecoveryReport, stream_arn: str | None
    ) -> None:
        record = poison_record(image, exc, StreamPosition("", stream_arn))
        event_id = record.event_id
        try:
            self._poison_sink.park(record)
        except ClientError as error:
            report.unpublished.append(event_id)
            report.missing.append(f"poison record {event_id} could not be parked: {error}")
            return
        report.poison.append(event_id)
