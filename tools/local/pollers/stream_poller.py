"""The DynamoDB stream event source mapping, with Lambda's semantics, against DynamoDB Local.

Per lane of a shard, in order, one batch at a time: records are read (4 times a second as Lambda does,
and at once after an invocation of a function whose role may write the table), shaped exactly as
Lambda delivers them, filtered (filtered-out records are dropped for good), batched (BatchSize,
MaximumBatchingWindowInSeconds) and handed to the function. The lane keeps reading while its batch is
being processed, so it knows when each record arrived. A child shard waits until its parent is done.

Failures follow what AWS documents (tests/conformance/test_stream_event_source.py checks each rule):
- "Configuring partial batch response with DynamoDB and Lambda",
  https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html: with
  ReportBatchItemFailures an empty or null batchItemFailures, or an empty or null response, is a complete
  success; an empty, null or missing (wrongly keyed) itemIdentifier is a complete failure, the whole batch
  retried; otherwise the checkpoint is the lowest returned sequence number and the records from there are
  retried as one batch, also with BisectBatchOnFunctionError ("the batch is bisected at the returned
  sequence number and Lambda retries only the remaining records"). Each of these retries counts toward
  MaximumRetryAttempts.
- "Retain discarded records for a DynamoDB event source in Lambda",
  https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html: a function error (an
  exception, a timeout) with BisectBatchOnFunctionError splits the batch in two, and splitting does not
  consume the retry quota; records past MaximumRetryAttempts, or older than MaximumRecordAgeInSeconds since
  they arrived in the stream, are discarded and their batch described to the OnFailure destination in the
  document Lambda sends (no record contents). The same page: "Before invocation: If a Lambda event source
  mapping is unable to invoke the function due to throttling or other issues, it retries until the
  records expire or exceed the maximum age": an invocation throttled because the function's reserved
  concurrency is in use (the function did not run) is retried with backoff, is not a retry toward
  MaximumRetryAttempts, is not bisected, and leaves the batch's records to age.

A shard has one lane, which takes every record, unless the mapping's ParallelizationFactor is N > 1.
Lambda then processes up to N batches of one shard concurrently and still keeps each item's records
(partition and sort key) in order, not a partition's or a shard's: see "Using Lambda with DynamoDB",
https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html (polling and batching streams, concurrent
batches per shard). Locally the shard then has N lanes: each reads it with an iterator of its own, keeps
the records whose item key hashes to it (item_lane) and runs its own batches, checkpoint, retries,
bisection and OnFailure messages exactly as a single lane does, while the other lanes' batches run.

Beside this module: stream_records.py (reading, and records as Lambda delivers them), stream_lanes.py
(the state of each shard's lanes) and stream_failures.py (what an invocation's result means, and the
OnFailure document).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from tools.local.console.activity import ActivityLog, Invocation
from tools.local.pollers.checkpoints import CheckpointStore
from tools.local.pollers.destinations import FailureDestinations, UnsupportedDestination
from tools.local.pollers.event_sources import StreamSource
from tools.local.pollers.patterns import matches
from tools.local.pollers.stream_failures import Outcome, batch_outcome, on_failure_document
from tools.local.pollers.stream_lanes import Failure, Lane, Pending, Shard
from tools.local.pollers.stream_records import (
    GET_RECORDS_LIMIT,
    RawRecordsReader,
    arrival_time,
    item_lane,
    lambda_stream_record,
)
from tools.local.pollers.threads import MappingThreads
from tools.local.runtime.context import function_arn
from tools.local.runtime.functions import SYNC_PAYLOAD_LIMIT, FunctionRuntime, InvocationResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

# Lambda polls each shard 4 times a second. Writes made by the stack's functions are read sooner: the
# end of an invocation of a function that may write the table wakes its pollers (see StreamPoller._idle).
POLL_INTERVAL_SECONDS = 0.25
DISCOVERY_INTERVAL_SECONDS = 1.0
# Reads started by invocations' ends are at most this often per mapping (a few ms of latency at most,
# where each read costs the stack and DynamoDB Local about 2 ms of CPU).
_WOKEN_READ_GAP_SECONDS = 0.025
_MAX_BACKOFF_SECONDS = 2.0
# Retries of a throttled invocation: a throttle costs nothing locally, so retry soon, and at least twice
# a second, so the batch goes as soon as the function has an environment free.
_THROTTLE_BACKOFF_SECONDS = 0.05
_MAX_THROTTLE_BACKOFF_SECONDS = 0.5
_ERROR_PAUSE_SECONDS = 1.0
# A lane reads ahead of its batches (to know when records arrived) up to this many records.
_READ_AHEAD_RECORDS = 10_000
# DynamoDB Local moves an empty shard's start to the first record it gets (sequence numbers are global
# across tables), so an iterator taken on an empty shard reads as "trimmed": renew it from our position.
_RENEW_ITERATOR_ON = frozenset({"ExpiredIteratorException", "TrimmedDataAccessException"})


def records_within_payload(batch: list[Pending]) -> int:
    """How many of the batch's first records one invocation's event holds within Lambda's 6 MB synchronous
    payload (at least one: a record is at most DynamoDB's 400 KB item, twice, in its images)."""
    size = len(b'{"Records": []}')
    for count, pending in enumerate(batch):
        size += len(json.dumps(pending.record).encode()) + len(b", ")
        if size > SYNC_PAYLOAD_LIMIT and count:
            return count
    return len(batch)


class StreamPoller(MappingThreads):
    def __init__(
        self,
        source: StreamSource,
        function: FunctionRuntime,
        stream_arn: str,
        streams: DynamoDBStreamsClient,
        destinations: FailureDestinations,
        activity: ActivityLog,
        checkpoints: CheckpointStore | None = None,
        woken_by: frozenset[str] | None = None,
    ) -> None:
        """woken_by: the functions whose invocations may write the table (their end starts a read at
        once; tools.local.reader.permissions); None: every function's."""
        super().__init__(name=f"stream-{source.label}")
        self.source = source
        self._checkpoints = checkpoints
        self._function = function
        self._stream_arn = stream_arn
        self._streams = streams
        self._reader = RawRecordsReader(streams)
        self._destinations = destinations
        self._activity = activity
        self._shards: dict[str, Shard] = {}
        self._finished: set[str] = set()
        self._first_discovery = True
        self._lanes_per_shard = source.parallelization_factor
        # Batches invoked in threads of their own (ParallelizationFactor > 1), and what they returned:
        # the poller's thread settles them, so only it ever changes a lane.
        self._returned: queue.SimpleQueue[tuple[Lane, list[Pending], InvocationResult | None]] = (
            queue.SimpleQueue()
        )
        # Set when an invocation of a function in woken_by ends (it may have written to the table, so
        # read at once) or a batch of this mapping's own returns.
        self._woken_by = woken_by
        self._written = threading.Event()  # a woken_by invocation ended: read at once
        self._wake = threading.Event()
        self._woken_read_at = 0.0  # when a read started by an invocation's end last happened (monotonic)
        activity.subscribe(self._on_activity)

    # --- lifecycle (start, join: MappingThreads) ---------------------------------------------------
    def stop(self) -> None:
        super().stop()
        self._wake.set()

    def _on_activity(self, entry: object) -> None:
        if isinstance(entry, Invocation) and (self._woken_by is None or entry.function in self._woken_by):
            self._written.set()
            self._wake.set()

    def _idle(self) -> None:
        """Wait for the next poll: the poll interval, or less when an invocation may have written."""
        if not self._wake.wait(POLL_INTERVAL_SECONDS) or self._stop.is_set():
            return
        self._wake.clear()
        if not self._written.is_set():
            return  # a batch of this mapping's own returned: it is settled now; it wrote nothing to read
        if self._returned.empty():
            # A writer's invocation ended: the reads such ends start are coalesced, one per
            # _WOKEN_READ_GAP_SECONDS (under load every invocation would otherwise cost a read). A batch
            # of this mapping's own that returned is settled at once.
            self._stop.wait(self._woken_read_at + _WOKEN_READ_GAP_SECONDS - time.monotonic())
        self._wake.clear()
        self._written.clear()  # before the read: whatever is written from here on wakes it again
        self._woken_read_at = time.monotonic()
        for shard in self._shards.values():
            for lane in shard.lanes:
                lane.next_fetch_at = 0.0

    def _run(self) -> None:
        try:
            next_discovery = 0.0
            while not self._stop.is_set():
                progressed = False
                try:
                    progressed = self._settle_returned()
                    if time.monotonic() >= next_discovery:
                        self._discover()
                        next_discovery = time.monotonic() + DISCOVERY_INTERVAL_SECONDS
                    for shard in list(self._shards.values()):
                        if self._stop.is_set():
                            return
                        if self._parent_done(shard):
                            for lane in shard.lanes:
                                progressed |= self._step(lane)
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
        finally:
            # Anything else that escapes is reported by the thread's edge (supervision.py), which runs
            # this loop again on the same lanes: the reader is closed only when the mapping stops.
            if self._stop.is_set():
                self._reader.close()

    # --- shards -----------------------------------------------------------------------------------
    def _discover(self) -> None:
        shards: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            kwargs: dict[str, Any] = {"StreamArn": self._stream_arn}
            if start:
                kwargs["ExclusiveStartShardId"] = start
            description = self._reader.describe_stream(kwargs)
            shards.extend(description.get("Shards", []))
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
            lanes = [self._open_lane(shard_id, index, latest) for index in range(self._lanes_per_shard)]
            self._shards[shard_id] = Shard(shard_id, shard.get("ParentShardId"), lanes)
        self._first_discovery = False

    def _open_lane(self, shard_id: str, index: int, latest: bool) -> Lane:
        # LATEST is read as "skip what is there now", so the position is always a sequence number
        # and a renewed iterator (see _fetch) cannot jump back before the mapping's start.
        lane = Lane(shard_id=shard_id, index=index, skipping=latest)
        saved = self._saved_position(lane)
        if saved is not None:
            lane.skipping, lane.last_sequence = False, saved
            lane.iterator = self._renewed_iterator(lane)
        else:
            lane.iterator = self._streams.get_shard_iterator(
                StreamArn=self._stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
        return lane

    def _checkpoint_key(self, lane: Lane) -> str:
        key = f"{self.source.label}|{self._stream_arn}|{lane.shard_id}"
        if self._lanes_per_shard == 1:
            return key
        return f"{key}|lane {lane.index + 1} of {self._lanes_per_shard}"

    def _saved_position(self, lane: Lane) -> str | None:
        if self._checkpoints is None:
            return None
        saved = self._checkpoints.get(self._checkpoint_key(lane))
        if saved is None and self._lanes_per_shard > 1:
            # No position of its own yet: start where the shard's single lane left off, if it ran with
            # ParallelizationFactor 1 before (everything up to there was done in every lane).
            saved = self._checkpoints.get(f"{self.source.label}|{self._stream_arn}|{lane.shard_id}")
        return saved

    def _done_with(self, lane: Lane, count: int) -> None:
        """The first `count` pending records are finished for good (processed or discarded)."""
        if count and self._checkpoints is not None:
            self._checkpoints.put(self._checkpoint_key(lane), lane.pending[count - 1].sequence_number)
        del lane.pending[:count]

    def _parent_done(self, shard: Shard) -> bool:
        parent = shard.parent_id
        return parent is None or parent in self._finished or parent not in self._shards

    def _fetch(self, lane: Lane) -> bool:
        assert lane.iterator is not None
        try:
            raw_records, lane.iterator = self._reader.get_records(lane.iterator)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _RENEW_ITERATOR_ON:
                raise
            lane.iterator = self._renewed_iterator(lane)
            return False
        if lane.iterator is None:
            lane.closed = True
        now_wall, now = time.time(), time.monotonic()
        if lane.skipping:
            if raw_records:
                lane.last_sequence = str(raw_records[-1]["dynamodb"]["SequenceNumber"])
            else:
                lane.skipping = False  # caught up: from here on, records are new
            return bool(raw_records)
        for raw in raw_records:
            record = lambda_stream_record(raw, self._stream_arn)
            sequence = str(record["dynamodb"]["SequenceNumber"])
            lane.last_sequence = sequence
            if self._lanes_per_shard > 1 and item_lane(record, self._lanes_per_shard) != lane.index:
                continue  # another lane's item: that lane delivers it
            if self.source.filters and not any(matches(p, record) for p in self.source.filters):
                continue  # Lambda drops filtered-out records for good
            created = float(record["dynamodb"].get("ApproximateCreationDateTime", now_wall))
            lane.pending.append(Pending(record, sequence, created, arrival_time(created, now_wall), now))
        # Read again at once only when the read stopped at the record limit (more may be there): a
        # shorter one returned everything written so far, and later writes wake the poller or wait for
        # the poll (so does a read DynamoDB cut at 1 MB first).
        full = len(raw_records) >= GET_RECORDS_LIMIT
        lane.next_fetch_at = now if full else now + POLL_INTERVAL_SECONDS
        return bool(raw_records)

    def _renewed_iterator(self, lane: Lane) -> str:
        kwargs: dict[str, Any] = {"StreamArn": self._stream_arn, "ShardId": lane.shard_id}
        if lane.last_sequence is None:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=lane.last_sequence)
        return self._streams.get_shard_iterator(**kwargs)["ShardIterator"]

    # --- batches ----------------------------------------------------------------------------------
    def _step(self, lane: Lane) -> bool:
        """Read and invoke at most once for this lane; True when something happened."""
        source = self.source
        progressed = False
        now = time.monotonic()
        read_ahead = max(source.batch_size, _READ_AHEAD_RECORDS)
        if lane.iterator is not None and len(lane.pending) < read_ahead and now >= lane.next_fetch_at:
            # Also while a batch is in flight: a record's age counts from its arrival, not from its turn.
            progressed = self._fetch(lane)
        if lane.in_flight:
            return progressed  # one batch at a time per lane: the next one waits for this one's outcome
        if not lane.pending or time.monotonic() < lane.retry_at:
            return progressed
        waited = time.monotonic() - lane.pending[0].seen_monotonic
        if (
            not lane.planned
            and len(lane.pending) < source.batch_size
            and not lane.closed
            and waited < source.batching_window_seconds
        ):
            return progressed  # still gathering records inside the batching window
        if self._discard_expired(lane):
            return True
        # A planned size is a part of a batch that fitted already (bisection).
        size = lane.planned[0] if lane.planned else records_within_payload(lane.pending[: source.batch_size])
        # The other lanes, and this lane's reads, go on meanwhile.
        self._invoke_apart(lane, lane.pending[:size])
        return True

    def _finish(self, lane: Lane, batch: list[Pending], result: InvocationResult) -> None:
        if result.throttled:
            self._throttled(lane, batch, result)
            return
        lane.throttles = 0
        outcome = batch_outcome(result, batch, self.source.report_batch_item_failures)
        self._record(batch, result, outcome)
        self._settle(lane, batch, result, outcome)

    def _invoke_apart(self, lane: Lane, batch: list[Pending]) -> None:
        """Invoke a lane's batch in a thread of its own; the poller settles it when it returns (at
        shutdown it is not settled: the batch was not processed)."""
        lane.in_flight = True
        self._start_batch(
            self._invoke_batch,
            (lane, batch),
            name=f"stream-{self.source.label}-{lane.shard_id[-8:]}-{lane.index + 1}",
        )

    def _invoke_batch(self, lane: Lane, batch: list[Pending]) -> None:
        result: InvocationResult | None = None
        try:  # an exception is reported by the batch thread's edge (threads.py)
            result = self._function.invoke({"Records": [p.record for p in batch]}, throttle=True)
        finally:  # the lane must not stay in flight: with no result, its batch is tried again
            self._returned.put((lane, batch, result))
            self._wake.set()

    def _settle_returned(self) -> bool:
        """Settle the batches whose invocation in a thread of its own returned; True if there were any."""
        settled = False
        while not self._stop.is_set():  # at shutdown a batch was not processed: nothing to settle
            try:
                lane, batch, result = self._returned.get_nowait()
            except queue.Empty:
                break
            lane.in_flight, settled = False, True
            if result is not None:
                self._finish(lane, batch, result)
        return settled

    def _throttled(self, lane: Lane, batch: list[Pending], result: InvocationResult) -> None:
        """The function did not run: the same batch again after a backoff, no retry counted, nothing split
        (record age still applies, in _step)."""
        lane.throttles += 1
        pause = min(_THROTTLE_BACKOFF_SECONDS * 2 ** (lane.throttles - 1), _MAX_THROTTLE_BACKOFF_SECONDS)
        lane.retry_at = time.monotonic() + pause
        if lane.throttles == 1:
            assert result.error is not None
            first, last = batch[0].sequence_number, batch[-1].sequence_number
            self._activity.notice(
                "warning",
                self.source.label,
                f"{len(batch)} record(s) {first}..{last} throttled ({result.error.message}): retrying",
                {"shard": lane.shard_id, "sequence_numbers": [p.sequence_number for p in batch]},
            )

    def _settle(self, lane: Lane, batch: list[Pending], result: InvocationResult, outcome: Outcome) -> None:
        if lane.planned:
            lane.planned.pop(0)
        if outcome.succeeded == len(batch):
            self._done_with(lane, len(batch))
            lane.attempts, lane.last_failure = 0, None
            return
        lane.last_failure = Failure(result, outcome.function_error)
        if outcome.function_error and self.source.bisect_on_error and len(batch) > 1:
            # BisectBatchOnFunctionError: a failed invocation splits the batch in two, whatever
            # ReportBatchItemFailures says; "splitting batches doesn't consume the retry quota"
            # (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html).
            first = (len(batch) + 1) // 2
            lane.planned[:0] = [first, len(batch) - first]
            lane.retry_at = 0.0
            return
        # A partial batch response checkpoints at the lowest returned sequence number and retries the
        # remaining records as one batch; with BisectBatchOnFunctionError too ("the batch is bisected at
        # the returned sequence number and Lambda retries only the remaining records",
        # https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html). A complete
        # failure, or a function error that is not split, retries the whole batch. Either is a retry.
        if outcome.succeeded:
            # Everything before the checkpoint is done for good; the retries count from the checkpoint
            # (AWS does not document whether progress resets the count).
            self._done_with(lane, outcome.succeeded)
            lane.attempts = 0
        remaining = len(batch) - outcome.succeeded
        lane.attempts += 1
        retries = self.source.maximum_retry_attempts
        if retries >= 0 and lane.attempts > retries:
            failed = lane.pending[:remaining]
            self._done_with(lane, remaining)
            self._send_to_destination(lane, failed, "RetryAttemptsExhausted")
            lane.attempts, lane.last_failure = 0, None
            return
        lane.planned.insert(0, remaining)
        lane.retry_at = time.monotonic() + min(0.1 * 2 ** (lane.attempts - 1), _MAX_BACKOFF_SECONDS)

    def _discard_expired(self, lane: Lane) -> bool:
        """Discard the next batch's leading records older than MaximumRecordAgeInSeconds since they arrived
        in the stream; True if there were any (one OnFailure document per discarded batch)."""
        limit = self.source.maximum_record_age_seconds
        if limit < 0:
            return False
        now = time.time()
        head = lane.planned[0] if lane.planned else self.source.batch_size
        count = 0
        while count < min(head, len(lane.pending)) and now - lane.pending[count].arrived_at > limit:
            count += 1
        if not count:
            return False
        expired = lane.pending[:count]
        self._done_with(lane, count)
        self._send_to_destination(lane, expired, "RecordAgeExceeded")
        if lane.planned and lane.planned[0] > count:
            lane.planned[0] -= count  # the rest of a batch being retried is still that batch
        else:
            if lane.planned:
                lane.planned.pop(0)
            lane.attempts, lane.last_failure = 0, None
        lane.throttles = 0
        return True

    def _send_to_destination(self, lane: Lane, batch: list[Pending], condition: str) -> None:
        """Describe a discarded batch to the mapping's OnFailure destination (stream_failures), or say it
        was discarded with none."""
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
        message = on_failure_document(
            lane,
            batch,
            condition,
            function_arn=function_arn(self._function.physical_name),
            stream_arn=self._stream_arn,
        )
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

    def _record(self, batch: list[Pending], result: InvocationResult, outcome: Outcome) -> None:
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
