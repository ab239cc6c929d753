"""The local stack's stream records: DynamoDB Local's GetRecords JSON turned into what Lambda delivers."""

from __future__ import annotations

from tools.local.pollers.stream_records import lambda_stream_record

STREAM_ARN = "arn:aws:dynamodb:ddblocal:000000000000:table/t/stream/2026-11-22T00:00:00.000"


def raw_record(event_name: str, **dynamodb: object) -> dict[str, object]:
    """A record as DynamoDB Local's GetRecords returns it (raw JSON, before botocore parses it)."""
    return {
        "eventID": "0a1b2c3d-0000-0000-0000-000000000001",
        "eventName": event_name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "ddblocal",
        "dynamodb": {
            "ApproximateCreationDateTime": 1795320000.0,
            "Keys": {"PK": {"S": "ttl#1"}},
            "SequenceNumber": "000000000000000000101",
            "SizeBytes": 20,
            "StreamViewType": "NEW_IMAGE",
            **dynamodb,
        },
    }


def test_a_ttl_deletion_arrives_as_a_remove_by_the_dynamodb_service() -> None:
    record = lambda_stream_record(raw_record("UNKNOWN_TO_SDK_VERSION"), STREAM_ARN)

    assert record["eventName"] == "REMOVE"
    assert record["userIdentity"] == {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    assert "NewImage" not in record["dynamodb"]


def test_an_insert_keeps_its_name_and_gets_lambdas_region_arn_and_integral_timestamp() -> None:
    raw = raw_record("INSERT", NewImage={"PK": {"S": "ttl#1"}})

    record = lambda_stream_record(raw, STREAM_ARN)

    assert record["eventName"] == "INSERT"
    assert "userIdentity" not in record
    assert record["awsRegion"] == "us-east-1"
    assert record["eventSourceARN"] == STREAM_ARN
    assert record["dynamodb"]["ApproximateCreationDateTime"] == 1795320000
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], int)
    assert raw["awsRegion"] == "ddblocal"  # the input is not changed
