"""The EventBridge publisher: PutEvents in ordered chunks (shop.domain.publishing), retried entry by entry.

Guarantees of publish_in_order():
- chunks hold at most 10 entries and at most `max_request_bytes`, each in input order; they are
  packed rather than cut in runs, so that two events of one aggregate close together do not cut a call
  short (domain.publishing.ordered_chunks);
- a chunk never holds two events of one aggregate, so an aggregate's later event is never accepted
  while an earlier one failed (a failed entry is retried alone; its chunk-mates are other aggregates);
- retryable failures (throttling, internal errors) are retried with full-jitter backoff while the
  attempt budget and the caller's time allow;
- no call, a chunk's first or a retry, is begun unless it can be answered (at worst by its transport's
  timeouts: aws.longest_put_events_seconds) with aws.ANSWER_SECONDS to spare before the invocation
  ends, so the relay answers with its checkpoint rather than time out: a chunk there is no time for is
  left unsent (`out_of_time`), and the position of its first entry is where publishing stands;
- an entry EventBridge refuses for what it is (`MalformedDetail`, `InvalidArgument`: AWS lists them as
  non-retryable, and no retry or configuration change makes that record acceptable) is reported in
  `rejected`, never counted as published, and does not stop the others: the caller parks it as
  poison. With `on_rejected`, it is handed over once its call answered, unless an entry before it has
  failed (then it lies past the checkpoint and comes again); when the caller cannot put it away,
  publishing stops there (what was sent with it or beside it is on the bus beyond the checkpoint);
- with `max_in_flight` above 1, chunks of different aggregates are sent concurrently (at AWS's tens of
  milliseconds a call, one call at a time caps a relay near 200 events/s), while an aggregate's events
  are never in flight twice: a chunk waits until the chunks holding its aggregates' earlier events are
  settled (domain.publishing.ChunkSchedule). Calls are begun and their answers taken as they come, on the
  publishing thread, which also waits out each retry's backoff: the AWS Common Runtime's transport
  answers by callback (adapters.eventbridge_crt), an SDK client's blocking calls run on worker threads
  (ThreadedPutEvents);
- on the first failure that remains, no chunk holding an entry after it is sent (those answered or in
  flight before it was known may hold such entries: they are on the bus past the checkpoint, a retry
  republishes them, which consumers absorb), and the position of the first unpublished entry is
  returned, so the caller can checkpoint exactly there.
  Non-retryable errors of the account's configuration (`AccessDeniedException`,
  `NotAuthorizedForSourceException`, ...) are such failures: the stream waits in order until an
  operator fixes the permission.
"""

from __future__ import annotations

import heapq
import queue
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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


# A PutEvents call's result as the SDK client returns it, or the exception it raises.
Answer = dict[str, Any] | BaseException


@runtime_checkable
class PutEventsCalls(Protocol):
    """PutEvents calls begun now and answered later: adapters.eventbridge_crt.CrtPutEvents, or an SDK
    client through ThreadedPutEvents."""

    def begin(self, entries: list[dict[str, Any]], answer: Callable[[Answer], None]) -> None:
        """Send one call; `answer` is called once, from any thread, with its result or error."""

    def expire_overdue(self) -> float | None:
        """Answer the calls past their deadline with a timeout; the seconds until the next deadline (None:
        none, or the calls time out by themselves)."""


class ThreadedPutEvents:
    """An SDK client's blocking put_events as calls begun and answered: on worker threads when `workers`
    is given, at once on the caller's thread otherwise. botocore times its calls out itself."""

    def __init__(self, client: Any, workers: ThreadPoolExecutor | None) -> None:
        self._client = client
        self._workers = workers

    def begin(self, entries: list[dict[str, Any]], answer: Callable[[Answer], None]) -> None:
        if self._workers is None:
            answer(self._call(entries))
            return
        self._workers.submit(self._call, entries).add_done_callback(lambda done: answer(_outcome(done)))

    def expire_overdue(self) -> float | None:
        return None

    def _call(self, entries: list[dict[str, Any]]) -> Answer:
        try:
            response: dict[str, Any] = self._client.put_events(Entries=entries)
        except BaseException as exc:  # noqa: BLE001 -- the publisher retries the SDK's errors, raises others
            return exc
        return response


def _outcome(done: Future[Answer]) -> Answer:
    """A worker's answer; whatever ended it otherwise (cancelled at shutdown) answers too, never lost."""
    try:
        return done.result()
    except BaseException as exc:  # noqa: BLE001 -- the publisher raises what is not the SDK's
        return exc


@dataclass(frozen=True, slots=True)
class _TimeLeft:
    """What a call may be begun in: the caller's time for publishing (retries only within it), the
    invocation's (no call begun that could outlast it), and what a call needs of either: its worst case
    and the answer's margin."""

    publishing: Callable[[], float]
    invocation: Callable[[], float]
    call_seconds: float

    def allows_a_call(self) -> bool:
        return self.invocation() >= self.call_seconds

    def allows_a_retry(self, delay: float) -> bool:
        return min(self.publishing(), self.invocation()) - delay >= self.call_seconds


class _Chunk:
    """One chunk being published: its entries not yet accepted, its attempts, what its calls did, and,
    once done, the first of its positions a failure that remains left unpublished (None: none)."""

    __slots__ = ("attempt", "failed_at", "index", "pending", "result")

    def __init__(self, index: int, positions: Sequence[int]) -> None:
        self.index = index
        self.pending = list(positions)
        self.attempt = 0
        self.result = PublishResult()
        self.failed_at: int | None = None


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
        """`sleep`: how the publishing thread waits out a retry's backoff when no call is in flight (with
        calls in flight it waits for their answers meanwhile)."""
        self._bus = bus_name
        self._max_request_bytes = max_request_bytes
        self._max_attempts = max_attempts
        self._base_delay = base_delay_seconds
        self._max_delay = max_delay_seconds
        self._sleep = sleep
        self._jitter = jitter
        self._max_in_flight = max_in_flight
        self._transport = transport  # "sdk" (boto3) or "crt" (adapters.eventbridge_crt, the same contract)
        self._workers: ThreadPoolExecutor | None = None  # for an SDK client: started on first use, kept

    def _retry_delay(self, attempt: int, time_left: _TimeLeft) -> float | None:
        """The wait before retry `attempt` (1-based); None when the budget or the clock says stop."""
        if attempt >= self._max_attempts:
            return None
        delay: float = self._jitter() * min(self._max_delay, self._base_delay * 2**attempt)
        return delay if time_left.allows_a_retry(delay) else None

    def _calls(self) -> PutEventsCalls:
        client = aws.put_events_client(self._transport)
        if isinstance(client, PutEventsCalls):  # the AWS Common Runtime's: calls answered by callback
            return client
        if self._max_in_flight > 1 and self._workers is None:
            self._workers = ThreadPoolExecutor(self._max_in_flight, thread_name_prefix="put-events")
        return ThreadedPutEvents(client, self._workers if self._max_in_flight > 1 else None)

    def publish_in_order(
        self,
        entries: Sequence[OutboxEntry],
        remaining_seconds: Callable[[], float] = lambda: 60.0,
        on_rejected: OnRejected | None = None,
        invocation_seconds_left: Callable[[], float] | None = None,
    ) -> PublishResult:
        result = PublishResult()
        chunks = ordered_chunks(entries, self._max_request_bytes)
        schedule = ChunkSchedule(entries, chunks)
        calls = self._calls()
        # A call is begun only when it can be answered (at worst by its timeouts) with a second to spare,
        # so the handler still answers with its batchItemFailures rather than time out: Lambda would retry
        # the whole batch, what was published included (bisected), poison parked again.
        time_left = _TimeLeft(
            remaining_seconds,
            invocation_seconds_left or remaining_seconds,
            aws.longest_put_events_seconds(self._transport) + aws.ANSWER_SECONDS,
        )
        answers: queue.SimpleQueue[tuple[_Chunk, Answer]] = queue.SimpleQueue()
        retries: list[tuple[float, int, _Chunk]] = []  # (when, index, chunk): a heap, soonest first
        unsettled = 0  # chunks begun and not settled: in a call, or waiting to retry
        while True:
            room = self._max_in_flight - unsettled
            if room and schedule.holds_unsent() and not time_left.allows_a_call():
                room = 0  # what is unsent stays so, and publishing stands at its first entry
                result.out_of_time = True
            for index in schedule.ready(room):
                unsettled += 1
                self._begin(calls, entries, _Chunk(index, chunks[index]), answers)
            if not unsettled:
                result.first_unpublished = schedule.first_unpublished()
                result.first_failed = schedule.first_failure()
                return result
            answered = self._wait(calls, entries, answers, retries, unsettled - len(retries))
            for chunk, answer in sorted(answered, key=lambda pair: pair[0].index):
                retry_in = self._answered(chunk, answer, time_left)
                if retry_in is not None:
                    heapq.heappush(retries, (time.monotonic() + retry_in, chunk.index, chunk))
                    continue
                unsettled -= 1
                result.merge(chunk.result)
                failed_at = chunk.failed_at
                # Rejected entries before the chunk's failure are handed over in order; one the caller
                # cannot put away becomes the failure itself. One after an entry that already failed lies
                # past the checkpoint: it is not put away now but comes again, and its chunk is not
                # settled (its order's later events must not go out while it is neither on the bus nor
                # put away).
                for position in sorted(chunk.result.rejected):
                    if failed_at is not None and position > failed_at:
                        break
                    if schedule.past_a_failure(position):
                        failed_at = position
                        break
                    code, message = chunk.result.rejected[position]
                    if on_rejected is not None and not on_rejected(position, code, message):
                        failed_at = position
                        break
                schedule.settle(chunk.index, failed_at)

    def _begin(
        self,
        calls: PutEventsCalls,
        entries: Sequence[OutboxEntry],
        chunk: _Chunk,
        answers: queue.SimpleQueue[tuple[_Chunk, Answer]],
    ) -> None:
        chunk.attempt += 1
        calls.begin(
            [put_events_entry(entries[position], self._bus) for position in chunk.pending],
            lambda answer: answers.put((chunk, answer)),
        )

    def _wait(
        self,
        calls: PutEventsCalls,
        entries: Sequence[OutboxEntry],
        answers: queue.SimpleQueue[tuple[_Chunk, Answer]],
        retries: list[tuple[float, int, _Chunk]],
        calling: int,
    ) -> list[tuple[_Chunk, Answer]]:
        """The answers that came (at least one), each retry begun once due and each call past its
        deadline answered with a timeout meanwhile. `calling`: how many calls are in flight."""
        while True:
            now = time.monotonic()
            while retries and retries[0][0] <= now:
                self._begin(calls, entries, heapq.heappop(retries)[2], answers)
                calling += 1
            deadline = calls.expire_overdue()  # the calls past it are answered now, into `answers`
            answered = _take_all(answers)
            if answered:
                return answered
            if not calling:  # only retries are waiting: sleep until the soonest
                when, _, chunk = heapq.heappop(retries)
                self._sleep(max(0.0, when - time.monotonic()))
                self._begin(calls, entries, chunk, answers)
                calling += 1
                continue
            waits = [when - now for when, _, _ in retries[:1]]
            if deadline is not None:
                waits.append(deadline)
            try:
                first = answers.get(timeout=min(waits) if waits else None)
            except queue.Empty:
                continue
            return [first, *_take_all(answers)]

    def _answered(self, chunk: _Chunk, answer: Answer, time_left: _TimeLeft) -> float | None:
        """Count a call's answer into its chunk: the seconds to wait before retrying the entries still
        failing, or None when the chunk is done (its failed_at set). A failed call's error that is not
        the SDK's is raised here."""
        result = chunk.result
        if isinstance(answer, ClientError):
            result.calls += 1
            code = str(answer.response.get("Error", {}).get("Code", "Unknown"))
            result.count_failure(code)
            return self._retry_or_fail(chunk, code in RETRYABLE_CALL_CODES, time_left)
        if isinstance(answer, BotoCoreError):
            # Connection or timeout: the call may or may not have landed; retrying can duplicate,
            # which consumers absorb, whereas giving up early only delays.
            result.count_failure("ConnectionError")
            return self._retry_or_fail(chunk, True, time_left)
        if isinstance(answer, BaseException):
            raise answer
        result.calls += 1
        still_failing: list[int] = []
        retryable = True
        for position, outcome in zip(chunk.pending, answer["Entries"], strict=True):
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
            return None
        chunk.pending = still_failing
        return self._retry_or_fail(chunk, retryable, time_left)

    def _retry_or_fail(self, chunk: _Chunk, retryable: bool, time_left: _TimeLeft) -> float | None:
        """The wait before retrying the chunk's pending entries, or, when the failure is not retryable or
        the budget or the clock says stop, None with the chunk failed at its first pending entry."""
        delay = self._retry_delay(chunk.attempt, time_left) if retryable else None
        if delay is None:
            chunk.failed_at = chunk.pending[0]
        return delay


def _take_all(answers: queue.SimpleQueue[tuple[_Chunk, Answer]]) -> list[tuple[_Chunk, Answer]]:
    taken = []
    while True:
        try:
            taken.append(answers.get_nowait())
        except queue.Empty:
            return taken
