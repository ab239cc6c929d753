"""The DynamoDB stream event source mapping, with Lambda's semantics, against DynamoDB Local.

Per shard, in order, one batch at a time: records are read (4 times a second as Lambda does, and at once
after any function invocation, since it may have written to the table), shaped exactly as Lambda delivers
them, filtered (filtered-out records are dropped for good), batched (BatchSize,
MaximumBatchingWindowInSeconds) and handed to the function. Failures follow Lambda's rules:
ReportBatchItemFailures checkpoints at the lowest failed sequence number, BisectBatchOnFunctionError
splits a failing batch (splits do not count as retries), MaximumRetryAttempts and
MaximumRecordAgeInSeconds discard records, and discarded batches are described to the OnFailure
destination with the metadata message Lambda sends. A child shard waits until its parent is done.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from local.activity import ActivityLog, Invocation
from local.checkpoints import CheckpointStore
from local.destinations import FailureDestinations, UnsupportedDestination
from local.event_sources import StreamSource
from local.functions import FunctionRuntime, InvocationResult
from local.patterns import matches
from local.template import ACCOUNT, REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

# Lambda polls each shard 4 times a second. Writes made by the stack's functions are read sooner: the
# end of any invocation wakes the pollers (see StreamPoller._idle).
POLL_INTERVAL_SECONDS = 0.25
DISCOVERY_INTERVAL_SECONDS = 1.0
_GET_RECORDS_LIMIT = 1000
_MAX_BACKOFF_SECONDS = 2.0
_ERROR_PAUSE_SECONDS = 1.0
# DynamoDB Local moves an empty shard's start to the first record it gets (sequence numbers are global
# across tables), so an iterator taken on an empty shard reads as "trimmed": renew it from our position.
_RENEW_ITERATOR_ON = frozenset({"ExpiredIteratorException", "TrimmedDataAccessException"})


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def lambda_stream_record(raw: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A GetRecords record (raw JSON) in the shape Lambda delivers it to a function."""
    record = dict(raw)
    record["awsRegion"] = REGION  # DynamoDB Local says "ddblocal"
    dynamodb = dict(record.get("dynamodb", {}))
    if "ApproximateCreationDateTime" in dynamodb:
        dynamodb["ApproximateCreationDateTime"] = _integral(dynamodb["ApproximateCreationDateTime"])
    record["dynamodb"] = dynamodb
    if record.get("eventName") == "UNKNOWN_TO_SDK_VERSION":
        # DynamoDB Local's name for a TTL deletion; Lambda delivers REMOVE by the DynamoDB service.
        record["eventName"] = "REMOVE"
        record["userIdentity"] = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    # The ARN stays DynamoDB Local's own, so code that reads the stream back (redrive) can use it.
    record["eventSourceARN"] = stream_arn
    return record


def _iso(epoch_seconds: float, milliseconds: bool = False) -> str:
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    text = moment.isoformat(timespec="milliseconds" if milliseconds else "seconds")
    return text.replace("+00:00", "Z")


class _RawRecordsReader:
    """GetRecords with the response's raw JSON: boto3's parsed form drops Lambda-relevant fields."""

    def __init__(self, client: DynamoDBStreamsClient) -> None:
        self._client = client
        self._local = threading.local()
        client.meta.events.register("after-call.dynamodbstreams.GetRecords", self._capture)

    def _capture(self, http_response: Any, **_: Any) -> None:
        self._local.body = http_response.content

    def get_records(self, iterator: str) -> tuple[list[dict[str, Any]], str | None]:
        self._local.body = b""
        self._client.get_records(ShardIterator=iterator, Limit=_GET_RECORDS_LIMIT)
        data = json.loads(self._local.body)
        return list(data.get("Records", [])), data.get("NextShardIterator")


@dataclass
class _Pending:
    record: dict[str, Any]
    sequence_number: str
    created_at: float  # ApproximateCreationDateTime (DynamoDB Local rounds it down to the minute)
    seen_at: float  # wall clock when first read: the basis of record age locally
    seen_monotonic: float


@dataclass
class _Shard:
    shard_id: str
    parent_id: str | None
    iterator: str | None = None
    closed: bool = False
    pending: list[_Pending] = field(default_factory=list)
    # Sizes of the next batches while a failing batch is being bisected.
    planned: list[int] = field(default_factory=list)
    attempts: int = 0  # failed invocations of the batch at the head (bisection excluded)
    retry_at: float = 0.0
    next_fetch_at: float = 0.0
    last_sequence: str | None = None
    skipping: bool = False  # reading up to the current end without invoking (StartingPosition LATEST)

    @property
    def finished(self) -> bool:
        return self.closed and not self.pending


@dataclass(frozen=True)
class _Outcome:
    """How a batch ended: all done, a checkpoint after `succeeded` records, or a function error."""

    succeeded: int
    function_error: bool
    failed_ids: tuple[str, ...] = ()


class StreamPoller:
    def __init__(
        self,
        source: StreamSource,
        function: FunctionRuntime,
        stream_arn: str,
        streams: DynamoDBStreamsClient,
        destinations: FailureDestinations,
        activity: ActivityLog,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        self.source = source
        self._checkpoints = checkpoints
        self._function = function
        self._stream_arn = stream_arn
        self._streams = streams
        self._reader = _RawRecordsReader(streams)
        self._destinations = destinations
        self._activity = activity
        self._shards: dict[str, _Shard] = {}
        self._finished: set[str] = set()
        self._first_discovery = True
        self._stop = threading.Event()
        # Set when a function invocation ends: it may have written to the table, so read at once.
        self._wake = threading.Event()
        activity.subscribe(self._on_activity)
        self._thread = threading.Thread(target=self._run, name=f"stream-{source.label}", daemon=True)
        self.filtered_out = 0

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _on_activity(self, entry: object) -> None:
        if isinstance(entry, Invocation):
            self._wake.set()

    def _idle(self) -> None:
        """Wait for the next poll: the poll interval, or less when an invocation may have written."""
        if self._wake.wait(POLL_INTERVAL_SECONDS) and not self._stop.is_set():
            self._wake.clear()
            for shard in self._shards.values():
                shard.next_fetch_at = 0.0

    def _run(self) -> None:
        try:
            next_discovery = 0.0
            while not self._stop.is_set():
                progressed = False
                try:
                    if time.monotonic() >= next_discovery:
                        self._discover()
                        next_discovery = time.monotonic() + DISCOVERY_INTERVAL_SECONDS
                    for shard in list(self._shards.values()):
                        if self._stop.is_set():
                            return
                        if self._parent_done(shard):
                            progressed |= self._step(shard)
                        if shard.finished:
                            self._finished.add(shard.shard_id)
                            del self._shards[shard.shard_id]
                            next_discovery = 0.0  # a closed shard means a child to pick up
                except (ClientError, BotoCoreError) as exc:
                    if self._stop.is_set():
                        return
                    self._activity.notice("error", self.source.label, f"stream read failed: {exc}")
                    self._stop.wait(_ERROR_PAUSE_SECONDS)
                if not progressed:
                    self._idle()
        except Exception as exc:
            self._activity.notice("error", self.source.label, f"stream poller stopped: {exc!r}")
            raise

    # --- shards -----------------------------------------------------------------------------------
    def _discover(self) -> None:
        shards: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            kwargs: dict[str, Any] = {"StreamArn": self._stream_arn}
            if start:
                kwargs["ExclusiveStartShardId"] = start
            description = self._streams.describe_stream(**kwargs)["StreamDescription"]
            shards.extend(description.get("Shards", []))  # type: ignore[arg-type]
            start = description.get("LastEvaluatedShardId")
            if not start:
                break
        for shard in shards:
            shard_id = shard["ShardId"]
            if shard_id in self._shards or shard_id in self._finished:
                continue
            is_closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            # LATEST applies to shards that exist when the mapping starts; later shards are read whole.
            latest = self._first_discovery and self.source.starting_position == "LATEST"
            if latest and is_closed:
                self._finished.add(shard_id)
                continue
            # LATEST is read as "skip what is there now", so the position is always a sequence number
            # and a renewed iterator (see _fetch) cannot jump back before the mapping's start.
            state = _Shard(shard_id=shard_id, parent_id=shard.get("ParentShardId"), skipping=latest)
            saved = self._checkpoints.get(self._checkpoint_key(shard_id)) if self._checkpoints else None
            if saved is not None:
                state.skipping, state.last_sequence = False, saved
                state.iterator = self._renewed_iterator(state)
            else:
                state.iterator = self._streams.get_shard_iterator(
                    StreamArn=self._stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            self._shards[shard_id] = state
        self._first_discovery = False

    def _checkpoint_key(self, shard_id: str) -> str:
        return f"{self.source.label}|{self._stream_arn}|{shard_id}"

    def _done_with(self, shard: _Shard, count: int) -> None:
        """The first `count` pending records are finished for good (processed or discarded)."""
        if count and self._checkpoints is not None:
            self._checkpoints.put(
                self._checkpoint_key(shard.shard_id), shard.pending[count - 1].sequence_number
            )
        del shard.pending[:count]

    def _parent_done(self, shard: _Shard) -> bool:
        parent = shard.parent_id
        return parent is None or parent in self._finished or parent not in self._shards

    def _fetch(self, shard: _Shard) -> bool:
        assert shard.iterator is not None
        try:
            raw_records, shard.iterator = self._reader.get_records(shard.iterator)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _RENEW_ITERATOR_ON:
                raise
            shard.iterator = self._renewed_iterator(shard)
            return False
        if shard.iterator is None:
            shard.closed = True
        now_wall, now = time.time(), time.monotonic()
        if shard.skipping:
            if raw_records:
                shard.last_sequence = str(raw_records[-1]["dynamodb"]["SequenceNumber"])
            else:
                shard.skipping = False  # caught up: from here on, records are new
            return bool(raw_records)
        for raw in raw_records:
            record = lambda_stream_record(raw, self._stream_arn)
            sequence = str(record["dynamodb"]["SequenceNumber"])
            shard.last_sequence = sequence
            if self.source.filters and not any(matches(p, record) for p in self.source.filters):
                self.filtered_out += 1  # Lambda drops filtered-out records for good
                continue
            created = float(record["dynamodb"].get("ApproximateCreationDateTime", now_wall))
            shard.pending.append(_Pending(record, sequence, created, now_wall, now))
        shard.next_fetch_at = now if raw_records else now + POLL_INTERVAL_SECONDS
        return bool(raw_records)

    def _renewed_iterator(self, shard: _Shard) -> str:
        kwargs: dict[str, Any] = {"StreamArn": self._stream_arn, "ShardId": shard.shard_id}
        if shard.last_sequence is None:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=shard.last_sequence)
        return self._streams.get_shard_iterator(**kwargs)["ShardIterator"]

    # --- batches ----------------------------------------------------------------------------------
    def _step(self, shard: _Shard) -> bool:
        """Read and invoke at most once for this shard; True when something happened."""
        source = self.source
        progressed = False
        now = time.monotonic()
        if (
            shard.iterator is not None
            and len(shard.pending) < source.batch_size
            and now >= shard.next_fetch_at
        ):
            progressed = self._fetch(shard)
        if not shard.pending or time.monotonic() < shard.retry_at:
            return progressed
        waited = time.monotonic() - shard.pending[0].seen_monotonic
        if (
            not shard.planned
            and len(shard.pending) < source.batch_size
            and not shard.closed
            and waited < source.batching_window_seconds
        ):
            return progressed  # still gathering records inside the batching window
        if self._discard_expired(shard):
            return True
        size = shard.planned[0] if shard.planned else min(source.batch_size, len(shard.pending))
        batch = shard.pending[:size]
        result = self._function.invoke({"Records": [p.record for p in batch]})
        if self._stop.is_set():
            return True  # interrupted by shutdown: the batch was not processed, nothing to settle
        outcome = self._outcome(result, batch)
        self._record(batch, result, outcome)
        self._settle(shard, batch, result, outcome)
        return True

    def _outcome(self, result: InvocationResult, batch: list[_Pending]) -> _Outcome:
        everything = tuple(p.sequence_number for p in batch)
        if not result.ok:
            return _Outcome(succeeded=0, function_error=True, failed_ids=everything)
        if not self.source.report_batch_item_failures:
            return _Outcome(succeeded=len(batch), function_error=False)
        payload = result.payload
        failures = payload.get("batchItemFailures") if isinstance(payload, dict) else None
        if not failures:
            return _Outcome(succeeded=len(batch), function_error=False)
        positions = {p.sequence_number: index for index, p in enumerate(batch)}
        failed: list[int] = []
        for failure in failures if isinstance(failures, list) else [None]:
            identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
            if not isinstance(identifier, str) or identifier not in positions:
                # Lambda treats an empty, null or unknown identifier as a failure of the whole batch.
                return _Outcome(succeeded=0, function_error=True, failed_ids=everything)
            failed.append(positions[identifier])
        reported = tuple(batch[index].sequence_number for index in sorted(set(failed)))
        return _Outcome(succeeded=min(failed), function_error=False, failed_ids=reported)

    def _settle(
        self, shard: _Shard, batch: list[_Pending], result: InvocationResult, outcome: _Outcome
    ) -> None:
        if outcome.succeeded == len(batch):
            self._done_with(shard, len(batch))
            if shard.planned:
                shard.planned.pop(0)
            shard.attempts = 0
            return
        if outcome.succeeded:
            # Checkpoint: everything before the lowest failed record is done for good.
            self._done_with(shard, outcome.succeeded)
            shard.attempts = 0
        remaining = len(batch) - outcome.succeeded
        if shard.planned:
            shard.planned.pop(0)
        if self.source.bisect_on_error and remaining > 1:
            first = (remaining + 1) // 2
            shard.planned[:0] = [first, remaining - first]
            shard.retry_at = 0.0
            return
        shard.attempts += 1
        retries = self.source.maximum_retry_attempts
        if retries >= 0 and shard.attempts > retries:
            failed = shard.pending[:remaining]
            self._done_with(shard, remaining)
            self._send_to_destination(
                shard, failed, "RetryAttemptsExhausted", shard.attempts, result, outcome.function_error
            )
            shard.attempts = 0
            return
        shard.planned.insert(0, remaining)
        shard.retry_at = time.monotonic() + min(0.1 * 2 ** (shard.attempts - 1), _MAX_BACKOFF_SECONDS)

    def _discard_expired(self, shard: _Shard) -> bool:
        limit = self.source.maximum_record_age_seconds
        if limit < 0:
            return False
        now = time.time()
        count = 0
        while count < len(shard.pending) and now - shard.pending[count].seen_at > limit:
            count += 1
        if not count:
            return False
        expired = shard.pending[:count]
        self._done_with(shard, count)
        shard.planned.clear()
        self._send_to_destination(shard, expired, "RecordAgeExceeded", shard.attempts, None, False)
        shard.attempts = 0
        return True

    def _send_to_destination(
        self,
        shard: _Shard,
        batch: list[_Pending],
        condition: str,
        attempts: int,
        last: InvocationResult | None,
        function_error: bool,
    ) -> None:
        arn = self.source.on_failure_arn
        first, last_record = batch[0], batch[-1]
        summary = (
            f"{len(batch)} record(s) {first.sequence_number}..{last_record.sequence_number} ({condition})"
        )
        if arn is None:
            self._activity.notice(
                "error", self.source.label, f"discarded {summary}; no OnFailure destination"
            )
            return
        response_context: dict[str, Any] = {"statusCode": 200, "executedVersion": "$LATEST"}
        if function_error:
            response_context["functionError"] = "Unhandled"
        message = {
            "requestContext": {
                "requestId": last.request_id if last is not None else str(uuid.uuid4()),
                "functionArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self._function.physical_name}",
                "condition": condition,
                "approximateInvokeCount": attempts,
            },
            "responseContext": response_context,
            "version": "1.0",
            "timestamp": _iso(time.time(), milliseconds=True),
            "DDBStreamBatchInfo": {
                "shardId": shard.shard_id,
                "startSequenceNumber": first.sequence_number,
                "endSequenceNumber": last_record.sequence_number,
                "approximateArrivalOfFirstRecord": _iso(first.created_at),
                "approximateArrivalOfLastRecord": _iso(last_record.created_at),
                "batchSize": len(batch),
                "streamArn": self._stream_arn,
            },
        }
        try:
            self._destinations.send(arn, message)
        except (ClientError, BotoCoreError, UnsupportedDestination) as exc:
            self._activity.notice("error", self.source.label, f"discarded {summary}; OnFailure failed: {exc}")
            return
        self._activity.notice(
            "error",
            self.source.label,
            f"discarded {summary} → OnFailure {arn.rsplit(':', 1)[-1]}",
            {"destination": arn, "message": message},
        )

    def _record(self, batch: list[_Pending], result: InvocationResult, outcome: _Outcome) -> None:
        self._activity.add(
            Invocation(
                function=self.source.function,
                trigger="dynamodb",
                source=self.source.table,
                event={"Records": [p.record for p in batch]},
                result=result,
                failed_ids=outcome.failed_ids,
            )
        )
