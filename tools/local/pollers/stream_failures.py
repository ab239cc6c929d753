"""How a DynamoDB stream batch's invocation ended, and the OnFailure document of a discarded batch.

What AWS documents, read off an invocation's result: with ReportBatchItemFailures an empty or null
batchItemFailures, or an empty or null response, is a complete success; an invalid response (not an
object, batchItemFailures not a list: batch_response.py) or an empty, null or missing (wrongly keyed)
itemIdentifier is a complete failure; otherwise the checkpoint is the lowest returned sequence
number ("Configuring partial batch response with DynamoDB and Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-batchfailurereporting.html). A discarded
batch is described to the mapping's OnFailure destination in the document Lambda sends, metadata only
("Retain discarded records for a DynamoDB event source in Lambda",
https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html). The poller
(stream_poller.py) decides what follows: retries, bisection, discarding.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tools.local.pollers.batch_response import InvalidBatchResponse, reported_identifiers
from tools.local.pollers.stream_lanes import Lane, Pending
from tools.local.runtime.functions import InvocationResult


@dataclass(frozen=True)
class Outcome:
    """How a batch ended: all done, or a checkpoint after `succeeded` records (0: a complete failure);
    `function_error` when the invocation itself failed (not a failure the function reported)."""

    succeeded: int
    function_error: bool
    failed_ids: tuple[str, ...] = ()


def batch_outcome(
    result: InvocationResult, batch: list[Pending], report_batch_item_failures: bool
) -> Outcome:
    everything = tuple(p.sequence_number for p in batch)
    if not result.ok:
        return Outcome(succeeded=0, function_error=True, failed_ids=everything)
    if not report_batch_item_failures:
        return Outcome(succeeded=len(batch), function_error=False)
    positions = {p.sequence_number: index for index, p in enumerate(batch)}
    try:
        identifiers = reported_identifiers(result.payload)
    except InvalidBatchResponse:
        identifiers = [""]  # judged below as an identifier not in the batch
    if not identifiers:
        # An empty or null batchItemFailures, an empty or null response: a complete success.
        return Outcome(succeeded=len(batch), function_error=False)
    if any(identifier not in positions for identifier in identifiers):
        # An invalid response, an empty, null or missing (wrongly keyed) itemIdentifier, or one that is
        # not in the batch: a complete failure, the whole batch retried. The function did not fail.
        return Outcome(succeeded=0, function_error=False, failed_ids=everything)
    failed = [positions[identifier] for identifier in identifiers]
    reported = tuple(batch[index].sequence_number for index in sorted(set(failed)))
    return Outcome(succeeded=min(failed), function_error=False, failed_ids=reported)


def _iso(epoch_seconds: float, milliseconds: bool = False) -> str:
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    text = moment.isoformat(timespec="milliseconds" if milliseconds else "seconds")
    return text.replace("+00:00", "Z")


def on_failure_document(
    lane: Lane,
    batch: list[Pending],
    condition: str,
    *,
    function_arn: str,
    stream_arn: str,
) -> dict[str, Any]:
    """The document Lambda sends to a stream mapping's OnFailure destination, as in the example
    invocation record of https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html:
    metadata only, batchSize the records of the failed batch (after filtering), functionError null
    when the function returned (a reported failure) and "Unhandled" when it failed."""
    failure = lane.last_failure
    first, last_record = batch[0], batch[-1]
    return {
        "requestContext": {
            "requestId": failure.result.request_id if failure is not None else str(uuid.uuid4()),
            "functionArn": function_arn,
            "condition": condition,
            "approximateInvokeCount": lane.attempts,
        },
        "responseContext": {
            "statusCode": 200,
            "executedVersion": "$LATEST",
            "functionError": "Unhandled" if failure is not None and failure.function_error else None,
        },
        "version": "1.0",
        "timestamp": _iso(time.time(), milliseconds=True),
        "DDBStreamBatchInfo": {
            "shardId": lane.shard_id,
            "startSequenceNumber": first.sequence_number,
            "endSequenceNumber": last_record.sequence_number,
            "approximateArrivalOfFirstRecord": _iso(first.created_at),
            "approximateArrivalOfLastRecord": _iso(last_record.created_at),
            "batchSize": len(batch),
            "streamArn": stream_arn,
        },
    }
