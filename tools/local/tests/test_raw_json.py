"""boto3 calls that also return the response's JSON as it arrived (services/raw_json.py): what the pollers
hand functions is what the service sent, as Lambda delivers it, while errors stay boto3's own."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tools.local.pollers.queue_poller import lambda_sqs_record
from tools.local.pollers.stream_records import lambda_stream_record
from tools.local.processes import free_port
from tools.local.services.emulators import FAKE_CREDENTIALS, START_TIMEOUT_SECONDS, MotoServer
from tools.local.services.raw_json import RAW_JSON, UnreadableResponse, keep_raw_json, raw_json

KEY = FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"]
STREAM_ARN = "arn:aws:dynamodb:ddblocal:000000000000:table/t/stream/2026-01-01T00:00:00.000"


def _client(service: Any, endpoint_url: str, config: Config | None = None) -> Any:
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=KEY,
        config=config,
    )


@pytest.fixture(scope="module")
def sqs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = MotoServer(free_port(), tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    try:
        server.wait_ready(time.monotonic() + START_TIMEOUT_SECONDS)
        yield _client("sqs", server.endpoint)
    finally:
        server.stop()


class _Body:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def answering(client: Any, operation: str, body: bytes) -> Any:
    """The client, its `operation` answered with `body` instead of sending the request."""
    service = client.meta.service_model.service_id.hyphenize()

    def send(request: Any, **_: Any) -> AWSResponse:
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.0"
        return AWSResponse(request.url, 200, headers, _Body(body))

    client.meta.events.register(f"before-send.{service}.{operation}", send)
    return client


def test_a_received_message_is_boto3s_with_binary_values_as_lambda_delivers_them(sqs: Any) -> None:
    # Given a message with string and binary attributes
    url = sqs.create_queue(QueueName="attributes")["QueueUrl"]
    attributes = {
        "origin": {"DataType": "String", "StringValue": "test"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="hello", MessageAttributes=attributes)
    receive = {"QueueUrl": url, "MessageAttributeNames": ["All"], "VisibilityTimeout": 0}
    raw_client = keep_raw_json(_client("sqs", sqs.meta.endpoint_url), "ReceiveMessage")

    # When it is received keeping the JSON, and then again by a plain client
    response = raw_client.receive_message(**receive)
    [raw] = raw_json(response)["Messages"]
    [parsed] = sqs.receive_message(**receive)["Messages"]

    # Then the JSON has boto3's fields, binary values still base64, which is what Lambda delivers
    fields = ("MessageId", "Body", "MD5OfBody", "MD5OfMessageAttributes")
    assert {k: raw[k] for k in fields} == {k: parsed[k] for k in fields}
    assert parsed["MessageAttributes"]["blob"]["BinaryValue"] == b"\x00\xff"  # boto3's parsed form: bytes
    assert raw["MessageAttributes"]["blob"]["BinaryValue"] == "AP8="
    assert response["Messages"][0]["MessageId"] == raw["MessageId"]  # the parsed response is still there
    record = lambda_sqs_record(raw, "arn:aws:sqs:us-east-1:123456789012:attributes")
    assert record["messageAttributes"]["blob"] == {
        "binaryValue": "AP8=",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "Binary",
    }
    assert record["messageAttributes"]["origin"]["stringValue"] == "test"


def test_an_error_is_the_client_error_boto3_raises(sqs: Any) -> None:
    missing = {"QueueUrl": f"{sqs.meta.endpoint_url}/123456789012/missing"}
    raw_client = keep_raw_json(_client("sqs", sqs.meta.endpoint_url), "ReceiveMessage")

    with pytest.raises(ClientError) as by_boto3:
        sqs.receive_message(**missing)
    with pytest.raises(ClientError) as keeping_json:
        raw_client.receive_message(**missing)

    assert keeping_json.value.response["Error"] == by_boto3.value.response["Error"]
    assert keeping_json.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"


def test_a_stream_record_is_the_json_getrecords_returned() -> None:
    # Given a GetRecords answer with a creation time in epoch seconds and a binary attribute
    answer = {
        "Records": [
            {
                "eventID": "1",
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "awsRegion": "ddblocal",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1767225600.0,
                    "Keys": {"PK": {"S": "k"}},
                    "NewImage": {"PK": {"S": "k"}, "blob": {"B": "AP8="}},
                    "SequenceNumber": "000000000000000000001",
                    "SizeBytes": 12,
                    "StreamViewType": "NEW_IMAGE",
                },
            }
        ],
        "NextShardIterator": "next",
    }
    streams = _client("dynamodbstreams", "http://127.0.0.1:9")
    answering(streams, "GetRecords", json.dumps(answer).encode())
    keep_raw_json(streams, "GetRecords")

    # When the records are read
    response = streams.get_records(ShardIterator="iterator")

    # Then the JSON is as it arrived, where boto3's parsed form has a datetime and bytes
    [raw] = raw_json(response)["Records"]
    [parsed] = response["Records"]
    assert raw == answer["Records"][0]
    assert isinstance(parsed["dynamodb"]["ApproximateCreationDateTime"], datetime)
    assert parsed["dynamodb"]["NewImage"]["blob"]["B"] == b"\x00\xff"
    record = lambda_stream_record(raw, STREAM_ARN)
    assert record["dynamodb"]["ApproximateCreationDateTime"] == 1767225600
    assert record["dynamodb"]["NewImage"]["blob"] == {"B": base64.b64encode(b"\x00\xff").decode()}


def test_only_the_operations_named_keep_their_json() -> None:
    streams = _client("dynamodbstreams", "http://127.0.0.1:9")
    answering(streams, "DescribeStream", b'{"StreamDescription": {"Shards": []}}')
    keep_raw_json(streams, "GetRecords")
    keep_raw_json(streams, "GetRecords")  # again: changes nothing

    assert RAW_JSON not in streams.describe_stream(StreamArn=STREAM_ARN)


def test_a_successful_answer_that_is_not_json_is_a_botocore_error() -> None:
    streams = _client("dynamodbstreams", "http://127.0.0.1:9")
    answering(streams, "GetRecords", b"<html>not an AWS answer</html>")
    keep_raw_json(streams, "GetRecords")

    # BotoCoreError: what the pollers report and carry on after
    with pytest.raises(UnreadableResponse, match="GetRecords: unreadable response") as error:
        streams.get_records(ShardIterator="iterator")
    assert isinstance(error.value, BotoCoreError)


def test_a_server_that_is_not_there_is_a_botocore_error() -> None:
    once = Config(retries={"mode": "standard", "max_attempts": 1})
    nobody = keep_raw_json(_client("sqs", f"http://127.0.0.1:{free_port()}", once), "ReceiveMessage")

    with pytest.raises(BotoCoreError, match="Could not connect"):
        nobody.receive_message(QueueUrl="http://127.0.0.1/123456789012/q")


def test_a_client_that_does_not_answer_in_json_is_refused() -> None:
    with pytest.raises(ValueError, match="does not answer in JSON"):
        keep_raw_json(_client("sns", "http://127.0.0.1:9"), "Publish")
