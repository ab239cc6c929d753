"""The EventBridge publisher: PutEvents in ordered chunks (shop.domain.publishing), retried entry by entry.

Guarantees of publish_in_order():
- chunks hold at most 10 entries and at most `max_request_bytes`, each in input order; they are
  packed rather than cut in runs, so that two events of one aggregate close together do not cut a call
  short (domain.publishing.ordered_chunks);
- a chunk never holds two events of one aggregate, so an aggregate's later event is never accepted
  while an earlier one failed (a failed entry is retried alone; its chunk-mates are other aggregates);
- retryable failures (throttling, internal errors) are retried with full-jitter backoff while the
  attempt budget and the invocation's remaining time allow;
- an entry EventBridge refuses for what it is (`MalformedDetail`, `InvalidArgument`: AWS lists them as
  non-retryable, and no retry or configuration change makes that record acceptable) is reported in
  `rejected`, never counted as published, and does not stop the others: the caller parks it as
  poison. With `on_rejected`, it is handed over once its call answered, unless an entry before it has
  failed (then it lies past the checkpoint and comes again); when the caller cannot put it away,
  publishing stops there (what was sent with it or beside it is on the bus beyond the checkpoint);
- with `max_in_flight` above 1, chunks of different aggregates are sent concurrently (at AWS's tens of
  milliseconds a call, one call at a time caps a relay near 200 events/s), while an aggregate's events
  are never in flight twice: a chunk waits until the chunks holding its aggregates' earlier events are
  settled (domain.publishing.ChunkSchedule);
- on the first failure that remains, no chunk holding an entry after it is sent (those answered or in
  flight before it was known may hold such entries: they are on the bus past the checkpoint, a retry
  republishes them, which consumers absorb), and the position of the first unpublished entry is
  returned, so the caller can checkpoint exactly there.
  Non-retryable errors of the account's configuration (`AccessDeniedException`,
  `NotAuthorizedForSourceException`, ...) are such failures: the stream waits in order until an
  operator fixes the permission.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from shop.adapters import aws
from shop.domain.outbox import OutboxEntry
from shop.domain.publishing import ChunkSchedule, OnRejected, PublishResult, ordered_chunks

RETRYABLE_ENTRY_CODES = frozenset({"ThrottlingException", "InternalFailure", "InternalException"})
# https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutEventsResultEntry.html
RECORD_REJECTED_CODES = frozenset({"MalformedDetail", "InvalidArgument"})
RETRYABLE_CALL_CODES = frozenset(
    {"ThrottlingException", "InternalFailure", "InternalException", "ServiceUnavailable", "RequestTimeout"}
)


def put_events_entry(entry: OutboxEntry, bus_name: str) -> dict[str, Any]:
    """The PutEvents entry of an outbox entry (the trace header continues the writer's trace)."""
    request: dict[str, Any] = {
        "EventBusName": bus_name,
        "Source": entry.source,
        "DetailType": entry.detail_type,
        "Detail": entry.detail,
    }
    if entry.trace_header:
        request["TraceHeader"] = entry.trace_header
    return request


@dataclass
class _ChunkResult:
    result: PublishResult
    failed_at: int | None  # the first position of the chunk left unpublished by a failure that remains


class EventPublisher:
    def __init__(
        self,
        bus_name: str,
        max_request_bytes: int,
        *,
        max_attempts: int = 6,
        base_delay_seconds: float = 0.05,
        max_delay_seconds: float = 2.0,
        max_in_flight: int = 1,
        transport: str = "sdk",
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._bus = bus_name
        self._max_request_bytes = max_request_bytes
        self._max_attempts = max_attempts
        self._base_delay = base_delay_seconds
        self._max_delay = max_delay_seconds
        self._sleep = sleep
        self._jitter = jitter
        self._max_in_flight = max_in_flight
        self._transport = transport  # "sdk" (boto3) or "crt" (adapters.eventbridge_crt, the same contract)
        self._executor: ThreadPoolExecutor | None = None  # started on first use, kept across invocations

    def _backoff(self, attempt: int, remaining_seconds: Callable[[], float]) -> bool:
        """Sleep before retry `attempt` (1-based); False when the budget or the clock says stop."""
        if attempt >= self._max_attempts:
            return False
        delay = self._jitter() * min(self._max_delay, self._base_delay * 2**attempt)
        # Keep a safety margin so the handler can still answer with its batchItemFailures.
        if remaining_seconds() - delay < 2.0:
            return False
        self._sleep(delay)
        return True

    def publish_in_order(
        self,
        entries: Sequence[OutboxEntry],
        remaining_seconds: Callable[[], float] = lambda: 60.0,
        on_rejected: OnRejected | None = None,
    ) -> PublishResult:
        result = PublishResult()
        chunks = ordered_chunks(entries, self._max_request_bytes)
        schedule = ChunkSchedule(entries, chunks)
        client = aws.put_events_client(self._transport)
        in_flight: dict[Future[_ChunkResult], int] = {}
        while True:
            for index in schedule.ready(self._max_in_flight - len(in_flight)):
                in_flight[self._send(client, entries, chunks[index], remaining_seconds)] = index
            if not in_flight:
                result.first_unpublished = schedule.first_unpublished()
                result.first_failed = schedule.first_failure()
                return result
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=in_flight.__getitem__):
                index = in_flight.pop(future)
                outcome = future.result()
                result.merge(outcome.result)
                failed_at = outcome.failed_at
                # Rejected entries before the chunk's failure are handed over in order; one the caller
                # cannot put away becomes the failure itself. One after an entry that already failed lies
                # past the checkpoint: it is not put away now but comes again, and its chunk is not
                # settled (its order's later events must not go out while it is neither on the bus nor
                # put away).
                for position in sorted(outcome.result.rejected):
                    if failed_at is not None and position > failed_at:
                        break
                    if schedule.past_a_failure(position):
                        failed_at = position
                        break
                    code, message = outcome.result.rejected[position]
                    if on_rejected is not None and not on_rejected(position, code, message):
                        failed_at = position
                        break
                schedule.settle(index, failed_at)

    def _send(
        self,
        client: Any,
        entries: Sequence[OutboxEntry],
        chunk: Sequence[int],
        remaining_seconds: Callable[[], float],
    ) -> Future[_ChunkResult]:
        """Publish one chunk: on a worker thread when calls may overlap, here and now otherwise."""
        if self._max_in_flight > 1:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._max_in_flight, thread_name_prefix="put-events")
            return self._executor.submit(self._publish_chunk, client, entries, chunk, remaining_seconds)
        done: Future[_ChunkResult] = Future()
        done.set_result(self._publish_chunk(client, entries, chunk, remaining_seconds))
        return done

    def _publish_chunk(
        self,
        client: Any,
        entries: Sequence[OutboxEntry],
        chunk: Sequence[int],
        remaining_seconds: Callable[[], float],
    ) -> _ChunkResult:
        """PutEvents of one chunk, retried entry by entry; touches nothing shared (it may run on a worker)."""
        result = PublishResult()
        pending = list(chunk)
        attempt = 0
        while True:
            attempt += 1
            try:
                response = client.put_events(
                    Entries=[put_events_entry(entries[p], self._bus) for p in pending]
                )
                result.calls += 1
            except ClientError as exc:
                result.calls += 1
                code = str(exc.response.get("Error", {}).get("Code", "Unknown"))
                result.count_failure(code)
                if code in RETRYABLE_CALL_CODES and self._backoff(attempt, remaining_seconds):
                    continue
                return _ChunkResult(result, pending[0])
            except BotoCoreError:
                # Connection or timeout: the call may or may not have landed; retrying can duplicate,
                # which consumers absorb, whereas giving up early only delays.
                result.count_failure("ConnectionError")
                if self._backoff(attempt, remaining_seconds):
                    continue
                return _ChunkResult(result, pending[0])
            still_failing: list[int] = []
            retryable = True
            for position, outcome in zip(pending, response["Entries"], strict=True):
                entry_code = outcome.get("ErrorCode")
                if entry_code in RECORD_REJECTED_CODES:
                    result.count_failure(entry_code)
                    result.rejected[position] = (entry_code, str(outcome.get("ErrorMessage", ""))[:500])
                elif entry_code:
                    result.count_failure(entry_code)
                    still_failing.append(position)
                    retryable = retryable and entry_code in RETRYABLE_ENTRY_CODES
                else:
                    result.accepted_positions.append(position)
            if not still_failing:
                return _ChunkResult(result, None)
            if not retryable or not self._backoff(attempt, remaining_seconds):
                return _ChunkResult(result, still_failing[0])
            pending = still_failing
