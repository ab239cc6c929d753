"""Stream records as a DynamoDB stream event source mapping reads and delivers them.

GetRecords and DescribeStream against DynamoDB Local with each record as the response's JSON had it
(services/raw_json.py), a record reshaped as Lambda hands it to a function (lambda_stream_record), when a
record arrived in the stream (arrival_time, the basis of MaximumRecordAgeInSeconds) and which lane of a
shard an item's records go to at ParallelizationFactor N > 1 (item_lane). The poller
(stream_poller.py) reads through these; the console and the conformance tests use the same shapes.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from tools.local.services.raw_json import keep_raw_json, raw_json
from tools.template import REGION

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

GET_RECORDS_LIMIT = 1000


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


def arrival_time(created: float, read_at: float) -> float:
    """When a record arrived in the stream, from its ApproximateCreationDateTime and when it was first read.

    ApproximateCreationDateTime is the arrival rounded down: to the second on AWS, to the minute by
    DynamoDB Local. The record arrived before it was read, which a lane does within a poll interval of its
    arrival while the stack runs; records that arrived while it was stopped are bounded by the rounding.
    """
    rounding = 60.0 if created % 60 == 0 else 1.0
    return max(created, min(read_at, created + rounding))


def item_lane(record: dict[str, Any], lanes: int) -> int:
    """The lane (0 .. lanes - 1) of a stream record's item: a stable hash of its key (partition and sort key).

    Every record of one item goes to the same lane, in this process and the next (lane checkpoints are
    kept across restarts), so per-item order holds; items of one partition may go to different lanes.
    """
    key = json.dumps(record["dynamodb"]["Keys"], sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % lanes


class RawRecordsReader:
    """GetRecords (4 times a second and after writes) with each record as the response's JSON had it
    (services/raw_json.py: Lambda delivers that, not botocore's parsed form), and DescribeStream (every
    second)."""

    def __init__(self, streams: DynamoDBStreamsClient) -> None:
        self._streams = keep_raw_json(streams, "GetRecords")

    def get_records(self, iterator: str) -> tuple[list[dict[str, Any]], str | None]:
        data = raw_json(self._streams.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT))
        return list(data.get("Records", [])), data.get("NextShardIterator")

    def describe_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        description: dict[str, Any] = dict(self._streams.describe_stream(**params)["StreamDescription"])
        return description

    def close(self) -> None:
        self._streams.close()
