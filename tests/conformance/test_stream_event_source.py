"""Error handling of a DynamoDB stream event source mapping, as AWS documents it.

AWS Lambda developer guide:
- "Configuring partial batch response with DynamoDB and Lambda"
  (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html): which answers
  are a complete success, which a complete failure, the checkpoint at the lowest returned sequence
  number, and bisecting with a partial batch response.
- "Retain discarded records for a DynamoDB event source in Lambda"
  (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html): retries, record age,
  bisecting on function errors ("Splitting batches doesn't consume the retry quota") and the document
  sent to the OnFailure destination (its example invocation record).
  The same page separates errors before the function is invoked from errors during the invocation: a
  mapping unable to invoke the function because of throttling retries until the records expire or exceed
  MaximumRecordAgeInSeconds; only a function that was invoked and returned an error is held to
  MaximumRetryAttempts.
- "Understanding retry behavior in Lambda" (https://docs.aws.amazon.com/lambda/latest/dg/invocation-retries.html):
  a stream mapping retries the batch and blocks the shard until the error is resolved or the records expire.

Three stacks:
- `probe_stack` (tests/conftest.py) with the mappings tests/integration/probe/fragment.yaml adds for
  these tests, each on a table and OnFailure queue of its own: ProbeBisectMapping (BatchSize 10,
  BisectBatchOnFunctionError, ReportBatchItemFailures, MaximumRetryAttempts 1, a filter on kind "probe")
  and ProbeAgeMapping (BatchSize 1, MaximumRecordAgeInSeconds 1). Their function is the probe handler:
  each record's `action` chooses what it does (tests/integration/probe/handlers.py).
- `answer_stack` (here): a function whose answer a record spells out, for the answers the probe handler
  cannot give (an empty or null itemIdentifier, one under a wrong key, a null response).
- `throttle_stack` (here): functions whose reserved concurrency is used up, for invocations throttled
  before the function runs.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.stacks import (
    function_resource,
    reserved_concurrency_in_use,
    stack_fixture,
)
from tests.support import stream_table_resource
from tools.local.console.activity import Invocation
from tools.local.stack import LocalStack

WAIT_SECONDS = 20
PROBE = "ProbeStreamFunction"
ANSWERS = "AnswerFunction"
ISO_MILLISECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")  # "2019-11-14T00:13:49.717Z"
ISO_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")  # "2019-11-14T00:13:19Z"


# --- helpers ------------------------------------------------------------------------------------------
def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def write_together(stack: LocalStack, table: str, *items: dict[str, Any]) -> None:
    """One transaction, so the records are read from the stream together, in this order."""
    name = stack.template.physical_name(table)
    stack.clients.dynamodb().transact_write_items(
        TransactItems=[{"Put": {"TableName": name, "Item": item}} for item in items]
    )


def probe_item(
    key: str, action: str = "ok", kind: str = "probe", seconds: float | None = None
) -> dict[str, Any]:
    item: dict[str, Any] = {"PK": {"S": key}, "action": {"S": action}, "kind": {"S": kind}}
    if seconds is not None:
        item["seconds"] = {"N": str(seconds)}
    return item


def key_of(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["Keys"]["PK"]["S"])


def sequence_of(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["SequenceNumber"])


def batches_with(stack: LocalStack, function: str, table: str, key: str) -> list[Invocation]:
    """The invocations, in order, whose batch held the record of `key` from `table`."""
    return [
        invocation
        for invocation in stack.activity.invocations(function)
        if invocation.source == table and any(key_of(r) == key for r in invocation.records)
    ]


def keys_in(invocation: Invocation) -> list[str]:
    return [key_of(record) for record in invocation.records]


def record_of(invocation: Invocation, key: str) -> dict[str, Any]:
    return next(record for record in invocation.records if key_of(record) == key)


def wait_for_delivery(stack: LocalStack, function: str, table: str, key: str) -> Invocation:
    return stack.wait_for(
        lambda: next(iter(batches_with(stack, function, table, key)), None), WAIT_SECONDS, f"{key} delivered"
    )


def stream_sequence_number(stack: LocalStack, table: str, key: str) -> str:
    """The sequence number of the record of `key`, read from the table's stream (it may not be delivered)."""
    streams = stack.clients.streams()
    arn = stack.stream_arn(table)
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator: str | None = streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator)
            for record in page["Records"]:
                if record["dynamodb"]["Keys"]["PK"]["S"] == key:
                    return str(record["dynamodb"]["SequenceNumber"])
            iterator = page.get("NextShardIterator") if page["Records"] else None
    raise AssertionError(f"no record of {key} in the stream of {table}")


class OnFailureQueue:
    """An OnFailure destination queue: what it received so far, found by the failed batch's first record."""

    def __init__(self, stack: LocalStack, queue: str) -> None:
        self._stack = stack
        self._sqs = stack.clients.sqs()
        self._url = stack.queue_url(queue)
        self.received: list[dict[str, Any]] = []

    def _read(self) -> None:
        answer = self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=10)
        for message in answer.get("Messages", []):
            self.received.append(json.loads(message["Body"]))
            self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])

    def messages_from(self, start_sequence_number: str) -> list[dict[str, Any]]:
        self._read()
        return [
            m
            for m in self.received
            if m["DDBStreamBatchInfo"]["startSequenceNumber"] == start_sequence_number
        ]

    def wait_for(self, start_sequence_number: str) -> dict[str, Any]:
        found = self._stack.wait_for(
            lambda: self.messages_from(start_sequence_number),
            WAIT_SECONDS,
            f"the OnFailure message of the batch from {start_sequence_number}",
        )
        assert len(found) == 1, found
        return found[0]


def failed_batch(
    stack: LocalStack, function: str, table: str, key: str, failures: OnFailureQueue
) -> tuple[Invocation, dict[str, Any], list[Invocation]]:
    """The first batch the function got with the record of `key`; the OnFailure document of the batch
    that starts at that record; then every batch that held it, in order."""
    first = wait_for_delivery(stack, function, table, key)
    message = failures.wait_for(sequence_of(record_of(first, key)))
    return first, message, batches_with(stack, function, table, key)


def assert_lambdas_failure_document(message: dict[str, Any], stack: LocalStack, table: str) -> None:
    """Every field of the document Lambda sends to a stream mapping's OnFailure destination, typed as AWS's.

    The example invocation record of https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html.
    """
    assert set(message) == {"requestContext", "responseContext", "version", "timestamp", "DDBStreamBatchInfo"}
    request, response, info = (
        message["requestContext"],
        message["responseContext"],
        message["DDBStreamBatchInfo"],
    )
    assert set(request) == {"requestId", "functionArn", "condition", "approximateInvokeCount"}
    assert isinstance(request["requestId"], str)
    assert request["requestId"]
    function = next(s.function for s in stack.sources.streams if s.table == table)
    assert request["functionArn"] == stack.template.arn(function)
    assert request["condition"] in {"RetryAttemptsExhausted", "RecordAgeExceeded"}
    assert type(request["approximateInvokeCount"]) is int
    assert set(response) == {"statusCode", "executedVersion", "functionError"}
    assert response["statusCode"] == 200
    assert response["executedVersion"] == "$LATEST"
    assert response["functionError"] in {None, "Unhandled"}
    assert message["version"] == "1.0"
    assert ISO_MILLISECONDS.match(message["timestamp"]), message["timestamp"]
    sent = datetime.fromisoformat(message["timestamp"])
    assert abs((datetime.now(UTC) - sent).total_seconds()) < 60
    assert set(info) == {
        "shardId",
        "startSequenceNumber",
        "endSequenceNumber",
        "approximateArrivalOfFirstRecord",
        "approximateArrivalOfLastRecord",
        "batchSize",
        "streamArn",
    }
    assert isinstance(info["shardId"], str)
    assert info["shardId"].startswith("shardId-")
    assert isinstance(info["startSequenceNumber"], str)
    assert isinstance(info["endSequenceNumber"], str)
    assert int(info["startSequenceNumber"]) <= int(info["endSequenceNumber"])
    for arrival in ("approximateArrivalOfFirstRecord", "approximateArrivalOfLastRecord"):
        assert ISO_SECONDS.match(info[arrival]), info[arrival]
    first = datetime.fromisoformat(info["approximateArrivalOfFirstRecord"])
    last = datetime.fromisoformat(info["approximateArrivalOfLastRecord"])
    assert first <= last <= sent
    assert type(info["batchSize"]) is int
    assert info["batchSize"] >= 1
    assert info["streamArn"] == stack.stream_arn(table)


@pytest.fixture(scope="module")
def bisect_failures(probe_stack: LocalStack) -> OnFailureQueue:
    return OnFailureQueue(probe_stack, "ProbeBisectFailureQueue")


@pytest.fixture(scope="module")
def age_failures(probe_stack: LocalStack) -> OnFailureQueue:
    return OnFailureQueue(probe_stack, "ProbeAgeFailureQueue")


# --- the answer stack ---------------------------------------------------------------------------------
ANSWER_HANDLER = """
import json

_failed_once = set()  # lives as long as the execution environment (the function reserves just one)


def handler(event, context):
    records = event["Records"]
    for record in records:
        image = record["dynamodb"].get("NewImage") or {}
        if "respond" in image:  # the whole answer, spelled out; $SEQ is this record's sequence number
            return json.loads(image["respond"]["S"].replace("$SEQ", record["dynamodb"]["SequenceNumber"]))
    failures = []
    for record in records:
        image = record["dynamodb"].get("NewImage") or {}
        key = record["dynamodb"]["Keys"]["PK"]["S"]
        if "fail-once" in image and key not in _failed_once:
            _failed_once.add(key)
            failures.append({"itemIdentifier": record["dynamodb"]["SequenceNumber"]})
    return {"batchItemFailures": failures[::-1]}  # highest sequence number first
"""


def answer_resources(code_dir: Path) -> dict[str, Any]:
    """AnswerFunction reads AnswerTable (no bisect) and AnswerBisectTable (BisectBatchOnFunctionError),
    both with ReportBatchItemFailures, BatchSize 10, MaximumRetryAttempts 1, OnFailure AnswerFailureQueue."""

    def mapping(table: str, **more: Any) -> dict[str, Any]:
        properties = {
            "Stream": {"Fn::GetAtt": [table, "StreamArn"]},
            "StartingPosition": "TRIM_HORIZON",
            "BatchSize": 10,
            "MaximumRetryAttempts": 1,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "DestinationConfig": {
                "OnFailure": {"Type": "SQS", "Destination": {"Fn::GetAtt": ["AnswerFailureQueue", "Arn"]}}
            },
            **more,
        }
        return {"Type": "DynamoDB", "Properties": properties}

    return {
        "AnswerTable": stream_table_resource(),
        "AnswerBisectTable": stream_table_resource(),
        "AnswerFailureQueue": {"Type": "AWS::SQS::Queue"},
        ANSWERS: {
            "Type": "AWS::Serverless::Function",
            "Properties": {
                "CodeUri": str(code_dir),
                "Handler": "answers.handler",
                "Runtime": "python3.13",
                "Timeout": 5,
                "ReservedConcurrentExecutions": 1,
                "Events": {
                    "Plain": mapping("AnswerTable"),
                    "Bisect": mapping("AnswerBisectTable", BisectBatchOnFunctionError=True),
                },
            },
        },
    }


answer_stack = stack_fixture("answers", answer_resources, {"answers": ANSWER_HANDLER})


@pytest.fixture(scope="module")
def answer_failures(answer_stack: LocalStack) -> OnFailureQueue:
    return OnFailureQueue(answer_stack, "AnswerFailureQueue")


def answer_item(key: str, respond: str | None = None, fail_once: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = {"PK": {"S": key}}
    if respond is not None:
        item["respond"] = {"S": respond}
    if fail_once:
        item["fail-once"] = {"BOOL": True}
    return item


# --- 1. which partial batch responses are valid -------------------------------------------------------
def three_written_together(stack: LocalStack, table: str, prefix: str, response: str) -> list[str]:
    """Three items written together, the function answering `response` to the first: their keys, in order."""
    keys = [unique(prefix), unique("second"), unique("third")]
    write_together(stack, table, answer_item(keys[0], respond=response), *map(answer_item, keys[1:]))
    return keys


COMPLETE_SUCCESS = {
    "an empty batchItemFailures list": '{"batchItemFailures": []}',
    "a null batchItemFailures list": '{"batchItemFailures": null}',
    "an empty response": "{}",
    "a null response": "null",
}
COMPLETE_FAILURE = {
    "an empty string itemIdentifier": '{"batchItemFailures": [{"itemIdentifier": ""}]}',
    "a null itemIdentifier": '{"batchItemFailures": [{"itemIdentifier": null}]}',
    "an itemIdentifier under a wrong key name": '{"batchItemFailures": [{"itemId": "$SEQ"}]}',
    # "an invalid JSON response": not the documented shape (tools/local/pollers/batch_response.py)
    "a response that is not an object": '"ok"',
    "a batchItemFailures that is not a list": '{"batchItemFailures": {}}',
}


@pytest.mark.parametrize("response", list(COMPLETE_SUCCESS.values()), ids=list(COMPLETE_SUCCESS))
def test_an_empty_or_null_answer_is_a_complete_success(answer_stack: LocalStack, response: str) -> None:
    """The batch is checkpointed whole: nothing in it is delivered again.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html, "Success
    and failure conditions"): Lambda treats a batch as a complete success if the function returns an
    empty batchItemFailures list, a null batchItemFailures list, an empty EventResponse or a null
    EventResponse.
    """
    answering, other, marker = unique("answering"), unique("other"), unique("marker")
    write_together(answer_stack, "AnswerTable", answer_item(answering, respond=response), answer_item(other))
    batch = wait_for_delivery(answer_stack, ANSWERS, "AnswerTable", answering)
    write_together(answer_stack, "AnswerTable", answer_item(marker))

    # The shard is read in order: once the later marker is delivered, no retry of the batch is pending.
    wait_for_delivery(answer_stack, ANSWERS, "AnswerTable", marker)

    assert keys_in(batch) == [answering, other]
    assert batch.result.ok
    assert batch.result.payload == json.loads(response)
    assert batches_with(answer_stack, ANSWERS, "AnswerTable", answering) == [batch], "delivered once"
    assert batches_with(answer_stack, ANSWERS, "AnswerTable", other) == [batch], "delivered once"


@pytest.mark.parametrize("response", list(COMPLETE_FAILURE.values()), ids=list(COMPLETE_FAILURE))
def test_an_invalid_item_identifier_fails_the_whole_batch_and_counts_a_retry(
    answer_stack: LocalStack, answer_failures: OnFailureQueue, response: str
) -> None:
    """The whole batch is retried, then, with MaximumRetryAttempts 1, discarded whole; no function error.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html): Lambda
    treats a batch as a complete failure if the function returns an invalid JSON response, an empty string
    itemIdentifier, a null itemIdentifier or an itemIdentifier with a bad key name, and retries failures
    based on the retry
    strategy; mappings that read from streams retry the entire batch
    (https://docs.aws.amazon.com/lambda/latest/dg/invocation-retries.html). The function did return: the
    OnFailure document (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html) has
    no functionError.
    """
    answering, second, third = three_written_together(answer_stack, "AnswerTable", "bad-answer", response)

    first_batch, message, attempts = failed_batch(
        answer_stack, ANSWERS, "AnswerTable", answering, answer_failures
    )

    assert [keys_in(batch) for batch in attempts] == [[answering, second, third]] * 2, (
        "the whole batch, twice"
    )
    assert all(batch.result.ok for batch in attempts)
    assert message["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert message["requestContext"]["approximateInvokeCount"] == 2, "the first attempt and one retry"
    assert message["responseContext"]["functionError"] is None
    assert message["DDBStreamBatchInfo"]["batchSize"] == 3
    assert message["DDBStreamBatchInfo"]["endSequenceNumber"] == sequence_of(record_of(first_batch, third))
    assert_lambdas_failure_document(message, answer_stack, "AnswerTable")


def test_with_bisect_an_invalid_item_identifier_still_retries_the_whole_batch(
    answer_stack: LocalStack, answer_failures: OnFailureQueue
) -> None:
    """An invalid answer is a complete failure of the batch, not a function error: the batch is not split.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html): the batch
    is bisected "if your invocation fails"; an invalid itemIdentifier makes the batch a complete failure,
    retried by the retry strategy. Here the function returned normally, so nothing bisects it: the whole
    batch is retried, once, and discarded whole (AnswerBisectTable: BisectBatchOnFunctionError on).
    """
    response = COMPLETE_FAILURE["an empty string itemIdentifier"]
    answering, second, third = three_written_together(
        answer_stack, "AnswerBisectTable", "bisect-bad-answer", response
    )

    _, message, attempts = failed_batch(
        answer_stack, ANSWERS, "AnswerBisectTable", answering, answer_failures
    )

    assert [keys_in(batch) for batch in attempts] == [[answering, second, third]] * 2, "never split"
    assert message["requestContext"]["approximateInvokeCount"] == 2
    assert message["DDBStreamBatchInfo"]["batchSize"] == 3
    assert message["responseContext"]["functionError"] is None
    assert_lambdas_failure_document(message, answer_stack, "AnswerBisectTable")


def test_a_partial_response_checkpoints_at_the_lowest_returned_sequence_number(
    answer_stack: LocalStack,
) -> None:
    """The retry starts at the lowest reported record, whatever the order of the list, and holds the rest.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html, "Report
    syntax"): if batchItemFailures holds several items, Lambda uses the record with the lowest sequence
    number as the checkpoint, then retries all records starting from that checkpoint. The handler lists
    the failures highest first.
    """
    before, low, high, after = unique("before"), unique("low"), unique("high"), unique("after")
    write_together(
        answer_stack,
        "AnswerTable",
        answer_item(before),
        answer_item(low, fail_once=True),
        answer_item(high, fail_once=True),
        answer_item(after),
    )

    def retried() -> list[Invocation] | None:
        found = batches_with(answer_stack, ANSWERS, "AnswerTable", after)
        return found if len(found) == 2 else None

    first, retry = answer_stack.wait_for(retried, WAIT_SECONDS, "the retry")

    assert keys_in(first) == [before, low, high, after]
    assert first.failed_ids == tuple(sequence_of(record_of(first, key)) for key in (low, high))
    assert keys_in(retry) == [low, high, after], "from the lowest reported record to the end of the batch"
    assert retry.result.ok
    assert not retry.failed_ids
    assert batches_with(answer_stack, ANSWERS, "AnswerTable", before) == [first], "checkpointed, not retried"


# --- 2. bisecting -------------------------------------------------------------------------------------
def test_a_partial_response_with_bisect_retries_only_the_remaining_records_and_counts_the_retry(
    probe_stack: LocalStack, bisect_failures: OnFailureQueue
) -> None:
    """Split at the returned sequence number, not in half: the poison keeps its later neighbours with it.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html, "Bisecting
    a batch"): when a partial batch success response is received and both BisectBatchOnFunctionError and
    ReportBatchItemFailures are turned on, the batch is bisected at the returned sequence number and
    Lambda retries only the remaining records. It is a retry (MaximumRetryAttempts 1 here): the second
    failure discards the remaining records. Their OnFailure document
    (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html) gives the failed batch's
    first and last sequence numbers and its batchSize: the records the function was given, so not the
    record between them that the filter dropped.
    """
    healthy, poison, dropped, third, fourth = (
        unique("healthy"),
        unique("poison"),
        unique("dropped"),
        unique("third"),
        unique("fourth"),
    )
    write_together(
        probe_stack,
        "ProbeBisectTable",
        probe_item(healthy),
        probe_item(poison, "fail"),
        probe_item(dropped, kind="other"),
        probe_item(third),
        probe_item(fourth),
    )

    first, message, attempts = failed_batch(probe_stack, PROBE, "ProbeBisectTable", poison, bisect_failures)

    poison_sequence = sequence_of(record_of(first, poison))
    assert [keys_in(batch) for batch in attempts] == [
        [healthy, poison, third, fourth],
        [poison, third, fourth],
    ]
    assert all(batch.failed_ids == (poison_sequence,) for batch in attempts)
    assert batches_with(probe_stack, PROBE, "ProbeBisectTable", healthy) == [first], "before the checkpoint"
    assert batches_with(probe_stack, PROBE, "ProbeBisectTable", third) == attempts, (
        "never apart from the poison"
    )
    assert message["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert message["requestContext"]["approximateInvokeCount"] == 2, "the partial response counted a retry"
    assert message["responseContext"]["functionError"] is None, "a reported failure is not a function error"
    info = message["DDBStreamBatchInfo"]
    assert info["endSequenceNumber"] == sequence_of(record_of(first, fourth))
    assert info["batchSize"] == 3, "poison, third and fourth: the filtered-out record is not counted"
    assert_lambdas_failure_document(message, probe_stack, "ProbeBisectTable")


def test_a_function_error_with_bisect_splits_the_batch_in_two_without_consuming_retries(
    probe_stack: LocalStack, bisect_failures: OnFailureQueue
) -> None:
    """Halves until the failing record is alone, then MaximumRetryAttempts (1) retries of it alone.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html): for function
    errors, BisectBatchOnFunctionError splits a failed batch into two smaller batches; splitting batches
    doesn't consume the retry quota. And
    (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html) if the
    invocation fails, the batch is bisected regardless of the ReportBatchItemFailures setting.
    """
    first, second, poison, last = unique("first"), unique("second"), unique("raising"), unique("last")
    write_together(
        probe_stack,
        "ProbeBisectTable",
        probe_item(first),
        probe_item(second),
        probe_item(poison, "raise"),
        probe_item(last),
    )
    whole = wait_for_delivery(probe_stack, PROBE, "ProbeBisectTable", poison)

    message = bisect_failures.wait_for(sequence_of(record_of(whole, poison)))
    probe_stack.wait_for(
        lambda: any(b.result.ok for b in batches_with(probe_stack, PROBE, "ProbeBisectTable", last)),
        WAIT_SECONDS,
        "the record after the poison processed",
    )

    attempts = batches_with(probe_stack, PROBE, "ProbeBisectTable", poison)
    assert [keys_in(batch) for batch in attempts] == [
        [first, second, poison, last],
        [poison, last],
        [poison],
        [poison],
    ], "split in two, then in two again; then retried once alone (the splits were no retries)"
    assert all(batch.result.error is not None for batch in attempts)
    for healthy in (first, second, last):
        assert any(b.result.ok for b in batches_with(probe_stack, PROBE, "ProbeBisectTable", healthy))
    assert message["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert message["responseContext"]["functionError"] == "Unhandled"
    assert message["DDBStreamBatchInfo"]["batchSize"] == 1
    assert (
        message["DDBStreamBatchInfo"]["endSequenceNumber"]
        == message["DDBStreamBatchInfo"]["startSequenceNumber"]
    )
    assert_lambdas_failure_document(message, probe_stack, "ProbeBisectTable")


# --- 3. record age ------------------------------------------------------------------------------------
def test_record_age_counts_from_the_records_arrival_in_the_stream_not_from_its_read(
    probe_stack: LocalStack, age_failures: OnFailureQueue
) -> None:
    """A record that waited in the stream behind a slow batch is too old when its turn comes: discarded.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html): Lambda retries until
    the records exceed the maximum age configured on the mapping (MaximumRecordAgeInSeconds), then
    discards them and sends the OnFailure document. The age is the time since the record arrived in the
    stream (its ApproximateCreationDateTime), however late the mapping gets to it. ProbeAgeMapping:
    BatchSize 1, MaximumRecordAgeInSeconds 1 (see the fragment). The first record outlives the function's
    2 s timeout; the second arrives half a second later, so it is over 1 s old when the first batch ends,
    and is discarded unseen by the function, though its turn came only then.
    """
    warm_up, slow, waiting = unique("warm-up"), unique("slow"), unique("waiting")
    # DynamoDB Local reads a new table's empty shard late once: get past that first.
    write_together(probe_stack, "ProbeAgeTable", probe_item(warm_up))
    wait_for_delivery(probe_stack, PROBE, "ProbeAgeTable", warm_up)
    write_together(probe_stack, "ProbeAgeTable", probe_item(slow, "sleep", seconds=5))
    time.sleep(0.5)  # the mapping reads 4 times a second: the slow batch is in flight by now
    write_together(probe_stack, "ProbeAgeTable", probe_item(waiting))
    waiting_sequence = stream_sequence_number(probe_stack, "ProbeAgeTable", waiting)

    message = age_failures.wait_for(waiting_sequence)

    (slow_batch,) = batches_with(probe_stack, PROBE, "ProbeAgeTable", slow)
    assert slow_batch.result.error is not None
    assert slow_batch.result.error.error_type == "Sandbox.Timedout"
    slow_message = age_failures.wait_for(sequence_of(record_of(slow_batch, slow)))
    assert slow_message["requestContext"]["condition"] == "RecordAgeExceeded", "too old for a retry"
    assert slow_message["responseContext"]["functionError"] == "Unhandled", "its invocation timed out"
    assert batches_with(probe_stack, PROBE, "ProbeAgeTable", waiting) == [], "never sent to the function"
    assert message["requestContext"]["condition"] == "RecordAgeExceeded"
    info = message["DDBStreamBatchInfo"]
    assert info["startSequenceNumber"] == info["endSequenceNumber"] == waiting_sequence
    assert info["batchSize"] == 1
    for document in (message, slow_message):
        assert_lambdas_failure_document(document, probe_stack, "ProbeAgeTable")


# --- 4. the OnFailure document ------------------------------------------------------------------------
def test_the_on_failure_document_is_the_one_lambda_sends(
    probe_stack: LocalStack, bisect_failures: OnFailureQueue
) -> None:
    """Field by field, with AWS's types and formats, for a record reported failed until retries ran out.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html, the example
    invocation record): requestContext {requestId, functionArn, condition, approximateInvokeCount},
    responseContext {statusCode, executedVersion, functionError}, version "1.0", timestamp
    (ISO 8601, milliseconds, Z) and DDBStreamBatchInfo {shardId, startSequenceNumber, endSequenceNumber,
    approximateArrivalOfFirstRecord, approximateArrivalOfLastRecord (ISO 8601, seconds, Z), batchSize
    (a number), streamArn}; no record contents. functionError is null when the function returned (a
    partial batch response), "Unhandled" when it raised.
    """
    poison = unique("reported")
    write_together(probe_stack, "ProbeBisectTable", probe_item(poison, "fail"))
    written = time.time()
    batch = wait_for_delivery(probe_stack, PROBE, "ProbeBisectTable", poison)
    record = record_of(batch, poison)

    message = bisect_failures.wait_for(sequence_of(record))

    assert_lambdas_failure_document(message, probe_stack, "ProbeBisectTable")
    assert message["requestContext"] == {
        "requestId": message["requestContext"]["requestId"],
        "functionArn": probe_stack.template.arn(PROBE),
        "condition": "RetryAttemptsExhausted",
        "approximateInvokeCount": 2,
    }
    retry = batches_with(probe_stack, PROBE, "ProbeBisectTable", poison)[-1]
    assert message["requestContext"]["requestId"] == retry.result.request_id, "the last invocation's"
    assert message["responseContext"] == {
        "statusCode": 200,
        "executedVersion": "$LATEST",
        "functionError": None,
    }
    info = message["DDBStreamBatchInfo"]
    assert info["shardId"] in {
        shard["ShardId"]
        for shard in probe_stack.clients.streams().describe_stream(
            StreamArn=probe_stack.stream_arn("ProbeBisectTable")
        )["StreamDescription"]["Shards"]
    }
    assert info["startSequenceNumber"] == info["endSequenceNumber"] == sequence_of(record)
    assert info["batchSize"] == 1
    arrival = datetime.fromisoformat(info["approximateArrivalOfFirstRecord"]).timestamp()
    assert arrival == int(record["dynamodb"]["ApproximateCreationDateTime"]), "the record's own creation time"
    assert arrival <= written + 1
    assert info["approximateArrivalOfLastRecord"] == info["approximateArrivalOfFirstRecord"]
    assert "Records" not in json.dumps(message)


# --- 5. throttled before the function runs ------------------------------------------------------------
DYNAMODB_ERRORS = "https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html"
# Clocks of the test and of the poller, read a few milliseconds apart.
CLOCK_SLACK_SECONDS = 0.1


def throttle_resources(code_dir: Path) -> dict[str, Any]:
    """ZeroFunction (ReservedConcurrentExecutions 0: always throttled) reads ZeroTable with BatchSize 10;
    BusyFunction (ReservedConcurrentExecutions 1) reads BusyTable with BatchSize 1. Both mappings:
    MaximumRetryAttempts 0 (a failed invocation is not retried), MaximumRecordAgeInSeconds 2 (below AWS's
    minimum of 60, for speed, as ProbeAgeMapping), OnFailure to a queue of their own."""

    def stream(table: str, failures: str, batch_size: int) -> dict[str, Any]:
        properties = {
            "Stream": {"Fn::GetAtt": [table, "StreamArn"]},
            "StartingPosition": "TRIM_HORIZON",
            "BatchSize": batch_size,
            "MaximumRetryAttempts": 0,
            "MaximumRecordAgeInSeconds": 2,
            "DestinationConfig": {
                "OnFailure": {"Type": "SQS", "Destination": {"Fn::GetAtt": [failures, "Arn"]}}
            },
        }
        return {"Stream": {"Type": "DynamoDB", "Properties": properties}}

    return {
        "ZeroTable": stream_table_resource(),
        "ZeroFailureQueue": {"Type": "AWS::SQS::Queue"},
        "ZeroFunction": function_resource(
            code_dir, stream("ZeroTable", "ZeroFailureQueue", 10), ReservedConcurrentExecutions=0
        ),
        "BusyTable": stream_table_resource(),
        "BusyFailureQueue": {"Type": "AWS::SQS::Queue"},
        "BusyFunction": function_resource(
            code_dir, stream("BusyTable", "BusyFailureQueue", 1), ReservedConcurrentExecutions=1
        ),
    }


throttle_stack = stack_fixture("stream-throttling", throttle_resources)


def test_a_throttled_batch_is_retried_until_too_old_not_counted_toward_maximum_retry_attempts(
    throttle_stack: LocalStack,
) -> None:
    """Every invocation throttled: the batch is kept until its records are too old, never given up as retried.

    AWS (DYNAMODB_ERRORS): "Before invocation: If a Lambda event source mapping is unable to invoke the
    function due to throttling or other issues, it retries until the records expire or exceed the maximum
    age configured on the event source mapping (MaximumRecordAgeInSeconds)"; MaximumRetryAttempts applies
    "during invocation", when the function is invoked and returns an error. ZeroFunction reserves no
    concurrency at all, so it never runs; MaximumRetryAttempts 0 would discard a failed batch after its
    first attempt, MaximumRecordAgeInSeconds 2 discards this one 2 s after its record arrived.
    """
    failures = OnFailureQueue(throttle_stack, "ZeroFailureQueue")
    key = unique("throttled")
    write_together(throttle_stack, "ZeroTable", probe_item(key))
    written = time.time()
    sequence = stream_sequence_number(throttle_stack, "ZeroTable", key)

    message = failures.wait_for(sequence)

    discarded = datetime.fromisoformat(message["timestamp"]).timestamp()
    assert message["requestContext"]["condition"] == "RecordAgeExceeded", "too old, not out of retries"
    assert discarded >= written + 2 - CLOCK_SLACK_SECONDS, "kept until over MaximumRecordAgeInSeconds"
    assert throttle_stack.activity.invocations("ZeroFunction") == [], "the function never ran"
    assert message["DDBStreamBatchInfo"]["batchSize"] == 1
    assert_lambdas_failure_document(message, throttle_stack, "ZeroTable")


def test_record_age_still_applies_to_a_throttled_batch_and_the_next_runs_once_the_function_is_free(
    throttle_stack: LocalStack, tmp_path: Path
) -> None:
    """Throttled while the reserved concurrency is in use: a record that gets too old meanwhile is discarded
    without reaching the function; one that is still young when the function frees up is processed.

    AWS (DYNAMODB_ERRORS, "Before invocation"): a throttled batch is retried until its records exceed
    MaximumRecordAgeInSeconds; the throttles are not retries (MaximumRetryAttempts 0 here). BusyFunction
    reserves 1, which a direct invocation holds for 3.5 s: the first record is over 2 s old before then,
    the second, written 2.5 s in, is not.
    """
    failures = OnFailureQueue(throttle_stack, "BusyFailureQueue")
    too_old, in_time = unique("too-old"), unique("in-time")
    with reserved_concurrency_in_use(throttle_stack, "BusyFunction", 3.5, tmp_path) as holders:
        write_together(throttle_stack, "BusyTable", probe_item(too_old))
        time.sleep(2.5)
        write_together(throttle_stack, "BusyTable", probe_item(in_time))
    holder = [i for i in throttle_stack.activity.invocations("BusyFunction") if i.trigger == "direct"][-1]

    delivery = wait_for_delivery(throttle_stack, "BusyFunction", "BusyTable", in_time)
    message = failures.wait_for(stream_sequence_number(throttle_stack, "BusyTable", too_old))

    assert all(result.ok for result in holders)
    assert message["requestContext"]["condition"] == "RecordAgeExceeded"
    assert message["DDBStreamBatchInfo"]["batchSize"] == 1
    assert batches_with(throttle_stack, "BusyFunction", "BusyTable", too_old) == [], "never invoked with it"
    assert delivery.result.ok
    assert batches_with(throttle_stack, "BusyFunction", "BusyTable", in_time) == [delivery], "once"
    started = delivery.at - delivery.result.duration_ms / 1000
    assert started >= holder.at - CLOCK_SLACK_SECONDS, "it ran only once the function was free"
    assert failures.messages_from(sequence_of(record_of(delivery, in_time))) == []
    assert_lambdas_failure_document(message, throttle_stack, "BusyTable")
