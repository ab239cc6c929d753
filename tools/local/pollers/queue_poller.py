"""The SQS event source mapping, with Lambda's semantics, against moto.

Long-polls the queue (1 s waits, so stopping is quick), gathers up to BatchSize messages (within
MaximumBatchingWindowInSeconds when set) and hands them to the function in Lambda's SQS event shape,
several batches at once as Lambda's pollers do. Each batch then deletes what succeeded: everything on
success, the unreported messages with ReportBatchItemFailures, nothing on a function error. Undeleted
messages come back after the queue's visibility timeout, and the queue's RedrivePolicy (enforced by moto)
moves them to the dead-letter queue after maxReceiveCount receives. Messages that FilterCriteria rejects
are deleted, as Lambda does.

How many batches are received at once, and throttling (tests/conformance/test_sqs_event_source.py):
- A function without ReservedConcurrentExecutions is not throttled on AWS (Lambda scales out): locally a
  batch is received only when one of the function's environments (LOCAL_MAX_CONCURRENCY) can take it,
  or fewer with the mapping's ScalingConfig.MaximumConcurrency.
- With ReservedConcurrentExecutions, "event source mappings don't account for reserved concurrency and can
  process more messages off your queue than can be sent to your function"
  (https://repost.aws/knowledge-center/lambda-sqs-scaling): the mapping receives up to its
  MaximumConcurrency batches at once, else the five Lambda starts with
  (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html), whatever the reserved
  concurrency. An invocation beyond it is throttled; "Lambda continues to retry the message until the
  message's timestamp exceeds your queue's visibility timeout, at which point Lambda drops the message"
  (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html): the batch is left in
  the queue, comes back after the visibility timeout with its receive count raised, and so can reach the
  dead-letter queue unprocessed. MaximumConcurrency no higher than the reserved concurrency avoids it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from tools.local.console.activity import DEAD_LETTERED, ActivityLog, Invocation
from tools.local.pollers.batch_response import InvalidBatchResponse, reported_identifiers
from tools.local.pollers.event_sources import QueueSource
from tools.local.pollers.patterns import matches
from tools.local.pollers.threads import MappingThreads
from tools.local.runtime.functions import FunctionRuntime, InvocationResult
from tools.local.services.raw_json import keep_raw_json, raw_json
from tools.template import REGION

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

_WAIT_SECONDS = 1
_MAX_RECEIVE = 10
_ERROR_PAUSE_SECONDS = 1.0
# Batches a mapping processes at once when it starts (Lambda then scales up with the backlog, which is not
# emulated): https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
LAMBDA_INITIAL_BATCHES = 5
# Retries of a throttled invocation: a throttle costs nothing locally, so retry soon.
_THROTTLE_BACKOFF_SECONDS = 0.05
_MAX_THROTTLE_BACKOFF_SECONDS = 0.5
# A throttled batch is not invoked this close to its visibility timeout: it would run while the message
# is receivable again.
_VISIBILITY_MARGIN_SECONDS = 0.1


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    # Binary values arrive base64-encoded in the JSON protocol, as Lambda delivers them.
    shaped: dict[str, Any] = {
        "stringListValues": list(value.get("StringListValues", [])),
        "binaryListValues": list(value.get("BinaryListValues", [])),
        "dataType": value.get("DataType", "String"),
    }
    if "StringValue" in value:
        shaped["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        shaped["binaryValue"] = value["BinaryValue"]
    return shaped


def lambda_sqs_record(message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
    """A received message (ReceiveMessage's JSON, as it arrived) in the shape Lambda delivers it."""
    attributes = message.get("MessageAttributes", {})
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {name: _message_attribute(dict(v)) for name, v in attributes.items()},
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def _filterable(record: dict[str, Any]) -> dict[str, Any]:
    # Lambda matches patterns on "body" against the parsed body when the body is a JSON object.
    try:
        body = json.loads(record["body"])
    except (json.JSONDecodeError, TypeError):
        return record
    return {**record, "body": body} if isinstance(body, dict) else record


def batches_at_once(source: QueueSource, function: FunctionRuntime) -> int:
    """How many batches the mapping receives and processes at once (see the module's docstring)."""
    if function.reserved_concurrency is not None:
        # Throttling is possible: the mapping does not bound itself by the reserved concurrency.
        return source.maximum_concurrency or LAMBDA_INITIAL_BATCHES
    limits = [function.max_concurrency]
    if source.maximum_concurrency is not None:
        limits.append(source.maximum_concurrency)
    return max(1, min(limits))


class QueuePoller(MappingThreads):
    def __init__(
        self,
        source: QueueSource,
        function: FunctionRuntime,
        queue_url: str,
        queue_arn: str,
        sqs: SQSClient,
        activity: ActivityLog,
    ) -> None:
        super().__init__(name=f"sqs-{source.label}")
        self.source = source
        self._function = function
        self._queue_url = queue_url
        self._queue_arn = queue_arn
        # Received messages as the response's JSON had them (binary attributes in base64, as Lambda
        # delivers them; services/raw_json.py).
        self._sqs = keep_raw_json(sqs, "ReceiveMessage")
        self._activity = activity
        self.concurrency = batches_at_once(source, function)
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._attributes: dict[str, str] | None = None  # the queue's, read when polling starts
        self._batch_numbers = itertools.count(1)

    def _run(self) -> None:
        # Anything but an SQS error that escapes is reported by the thread's edge (supervision.py), which
        # runs this loop again.
        while not self._stop.is_set():
            # Receive only as many batches as are processed at once: a received batch is invoked
            # at once (and throttled if the function's reserved concurrency is in use).
            if not self._slots.acquire(timeout=_WAIT_SECONDS):
                continue
            handed_over = False
            try:
                handed_over = self._poll_once()
            except (ClientError, BotoCoreError) as exc:
                if self._stop.is_set():
                    return
                self._activity.notice("error", self.source.label, f"queue poll failed: {exc}")
                self._stop.wait(_ERROR_PAUSE_SECONDS)
            finally:
                if not handed_over:
                    self._slots.release()

    def _receive(self, limit: int, wait_seconds: int) -> list[dict[str, Any]]:
        response = self._sqs.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=min(_MAX_RECEIVE, limit),
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(raw_json(response).get("Messages", []))

    def _queue_attributes(self) -> dict[str, str]:
        """The queue's VisibilityTimeout and RedrivePolicy, read when polling starts."""
        if self._attributes is None:
            found = self._sqs.get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["VisibilityTimeout", "RedrivePolicy"]
            )["Attributes"]
            self._attributes = {str(name): value for name, value in found.items()}
        return self._attributes

    def _visibility_deadline(self, received_at: float) -> float:
        """When messages received at `received_at` (monotonic) become receivable again."""
        return received_at + float(self._queue_attributes().get("VisibilityTimeout", 30))

    def _redrive_policy(self) -> tuple[str, int] | None:
        """The dead-letter queue's name and maxReceiveCount, when the queue has a RedrivePolicy."""
        try:
            policy = json.loads(self._queue_attributes().get("RedrivePolicy", "null"))
            return str(policy["deadLetterTargetArn"]).rsplit(":", 1)[-1], int(policy["maxReceiveCount"])
        except (ValueError, TypeError, KeyError):
            return None

    def _report_dead_lettered(self, records: list[dict[str, Any]]) -> None:
        """A notice for each unfinished message at its queue's maxReceiveCount: the next receive moves it
        to the dead-letter queue, as SQS (moto) does once its visibility timeout ends."""
        policy = self._redrive_policy()
        if policy is None:
            return
        dead_letter_queue, max_receives = policy
        for record in records:
            try:
                receives = int(record.get("attributes", {}).get("ApproximateReceiveCount", 0))
            except (ValueError, TypeError):
                continue
            if receives < max_receives:
                continue
            moved = {
                "queue": self.source.queue,
                "deadLetterQueue": dead_letter_queue,
                "receiveCount": receives,
                "maxReceiveCount": max_receives,
                "record": record,
            }
            self._activity.notice(
                "error",
                self.source.label,
                f"message {record['messageId']} dead-lettered → {dead_letter_queue} after {receives} "
                f"receives (maxReceiveCount {max_receives})",
                {DEAD_LETTERED: moved},
            )

    def _gather(self) -> tuple[list[dict[str, Any]], float]:
        """A batch, and when its first messages were received (monotonic)."""
        batch_size = self.source.batch_size
        batch = self._receive(batch_size, _WAIT_SECONDS)
        received_at = time.monotonic()
        if not batch or self.source.batching_window_seconds <= 0:
            return batch, received_at
        deadline = time.monotonic() + self.source.batching_window_seconds
        while len(batch) < batch_size and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for message in self._receive(batch_size - len(batch), min(_WAIT_SECONDS, int(remaining))):
                # A visibility timeout shorter than the window lets a message come back within it.
                batch = [m for m in batch if m["MessageId"] != message["MessageId"]] + [message]
            if remaining < _WAIT_SECONDS:
                self._stop.wait(min(remaining, 0.05))
        return batch, received_at

    def _poll_once(self) -> bool:
        """Receive a batch and hand it to a thread of its own; True when one was handed over."""
        messages, received_at = self._gather()
        if not messages or self._stop.is_set():
            return False
        deadline = self._visibility_deadline(received_at)
        self._start_batch(
            self._deliver, (messages, deadline), name=f"sqs-{self.source.label}-{next(self._batch_numbers)}"
        )
        return True

    def _deliver(self, messages: list[dict[str, Any]], visibility_deadline: float) -> None:
        try:
            self._process(messages, visibility_deadline)
        except (ClientError, BotoCoreError) as exc:
            if not self._stop.is_set():
                self._activity.notice("error", self.source.label, f"queue batch failed: {exc}")
        finally:  # anything else is reported by the batch thread's edge (threads.py)
            self._slots.release()

    def _process(self, messages: list[dict[str, Any]], visibility_deadline: float) -> None:
        records = [lambda_sqs_record(m, self._queue_arn) for m in messages]
        if self.source.filters:
            kept = [r for r in records if any(matches(p, _filterable(r)) for p in self.source.filters)]
            self._delete([r for r in records if r not in kept])
            records = kept
        if not records:
            return
        result = self._invoke(records, visibility_deadline)
        if self._stop.is_set():
            return  # interrupted by shutdown: the messages reappear
        if result is None:  # throttled until the visibility timeout: back to the queue, receive count raised
            self._report_dead_lettered(records)
            return
        failed = self._failed_ids(result, records)
        self._delete([r for r in records if r["messageId"] not in failed])
        self._activity.add(
            Invocation(
                function=self.source.function,
                trigger="sqs",
                source=self.source.queue,
                event={"Records": records},
                result=result,
                failed_ids=tuple(r["messageId"] for r in records if r["messageId"] in failed),
            )
        )
        self._report_dead_lettered([r for r in records if r["messageId"] in failed])

    def _invoke(self, records: list[dict[str, Any]], visibility_deadline: float) -> InvocationResult | None:
        """The function's answer to the batch; None when every attempt was throttled until the messages'
        visibility timeout (they are left in the queue, to be received again)."""
        pause = _THROTTLE_BACKOFF_SECONDS
        throttles = 0
        while True:
            result = self._function.invoke({"Records": records}, throttle=True)
            if not result.throttled:
                return result
            throttles += 1
            if self._stop.is_set():
                return None
            if time.monotonic() + pause > visibility_deadline - _VISIBILITY_MARGIN_SECONDS:
                break
            self._stop.wait(pause)
            pause = min(pause * 2, _MAX_THROTTLE_BACKOFF_SECONDS)
        ids = [record["messageId"] for record in records]
        self._activity.notice(
            "warning",
            self.source.label,
            f"{len(ids)} message(s) throttled {throttles} time(s) until the visibility timeout "
            f"({self._function.reserved_concurrency} reserved concurrency in use): back to the queue",
            {"message_ids": ids, "throttles": throttles},
        )
        return None

    def _failed_ids(self, result: InvocationResult, records: list[dict[str, Any]]) -> set[str]:
        everything = {r["messageId"] for r in records}
        if not result.ok:
            return everything
        if not self.source.report_batch_item_failures:
            return set()
        try:
            failed = set(reported_identifiers(result.payload))
        except InvalidBatchResponse:
            return everything  # an invalid response fails the whole batch
        return everything if failed - everything else failed  # an id not in the batch: the same

    def _delete(self, records: list[dict[str, Any]]) -> None:
        for start in range(0, len(records), _MAX_RECEIVE):
            chunk = records[start : start + _MAX_RECEIVE]
            entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
                {"Id": str(i), "ReceiptHandle": r["receiptHandle"]} for i, r in enumerate(chunk)
            ]
            response = self._sqs.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)
            for failure in response.get("Failed", []):
                self._activity.notice(
                    "warning", self.source.label, f"delete failed: {failure.get('Message')}"
                )
