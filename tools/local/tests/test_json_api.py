"""JSON-protocol calls without boto3 (services/json_api.py), against the local moto server: the same
answers and errors boto3 gets, binary values as Lambda delivers them, connections kept alive."""

from __future__ import annotations

import base64
import http.client
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import BotoCoreError, ClientError

from tools.local.pollers.queue_poller import lambda_sqs_record
from tools.local.processes import free_port
from tools.local.services.emulators import FAKE_CREDENTIALS, START_TIMEOUT_SECONDS, MotoServer
from tools.local.services.json_api import JsonApi

KEY = FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"]


@pytest.fixture(scope="module")
def sqs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = MotoServer(free_port(), tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    try:
        server.wait_ready(time.monotonic() + START_TIMEOUT_SECONDS)
        yield boto3.client(
            "sqs",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id=KEY,
            aws_secret_access_key=KEY,
        )
    finally:
        server.stop()


def test_a_received_message_is_boto3s_with_binary_values_as_lambda_delivers_them(sqs: Any) -> None:
    # Given a message with string and binary attributes
    url = sqs.create_queue(QueueName="attributes")["QueueUrl"]
    attributes = {
        "origin": {"DataType": "String", "StringValue": "test"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    sqs.send_message(QueueUrl=url, MessageBody="hello", MessageAttributes=attributes)
    receive = {"QueueUrl": url, "MessageAttributeNames": ["All"], "VisibilityTimeout": 0}

    # When it is received without boto3, and then again with it
    [raw] = JsonApi.like(sqs, KEY).call("ReceiveMessage", receive)["Messages"]
    [parsed] = sqs.receive_message(**receive)["Messages"]

    # Then the fields are boto3's, binary values still base64, which is what Lambda delivers
    assert {k: raw[k] for k in ("MessageId", "Body", "MD5OfBody", "MD5OfMessageAttributes")} == {
        k: parsed[k] for k in ("MessageId", "Body", "MD5OfBody", "MD5OfMessageAttributes")
    }
    assert base64.b64decode(raw["MessageAttributes"]["blob"]["BinaryValue"]) == b"\x00\xff"
    record = lambda_sqs_record(raw, "arn:aws:sqs:us-east-1:123456789012:attributes")
    assert record["messageAttributes"]["blob"] == {
        "binaryValue": "AP8=",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "Binary",
    }
    assert record["messageAttributes"]["origin"]["stringValue"] == "test"


def test_an_error_has_the_code_boto3_reports(sqs: Any) -> None:
    missing = {"QueueUrl": f"{sqs.meta.endpoint_url}/123456789012/missing"}

    with pytest.raises(ClientError) as by_boto3:
        sqs.receive_message(**missing)
    with pytest.raises(ClientError) as plain:
        JsonApi.like(sqs, KEY).call("ReceiveMessage", missing)

    assert plain.value.response["Error"]["Code"] == by_boto3.value.response["Error"]["Code"]
    assert plain.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"


def test_calls_one_after_another_share_one_kept_alive_connection(sqs: Any) -> None:
    api = JsonApi.like(sqs, KEY)

    api.call("ListQueues", {})
    [connection] = api._idle
    socket_after_first = connection.sock
    api.call("ListQueues", {})

    assert api._idle == [connection]
    assert connection.sock is socket_after_first is not None
    api.close()
    assert api._idle == []


def test_kept_alive_connections_that_broke_while_idle_are_replaced_without_an_error(sqs: Any) -> None:
    # Given idle kept-alive connections that no longer work (as ones the server closed while they were
    # idle), more of them than a call has attempts
    api = JsonApi.like(sqs, KEY)
    address = urllib.parse.urlsplit(sqs.meta.endpoint_url)
    broken = []
    for _ in range(4):
        connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=5)
        connection.connect()
        assert connection.sock is not None
        connection.sock.shutdown(socket.SHUT_RDWR)
        broken.append(connection)
    api._idle.extend(broken)

    # When the next call is made, then it succeeds on a new connection
    assert "QueueUrls" in api.call("ListQueues", {})
    [replacement] = api._idle
    assert replacement not in broken
    api.close()


def test_a_server_that_is_not_there_is_a_botocore_error() -> None:
    nobody = JsonApi(f"http://127.0.0.1:{free_port()}", "AmazonSQS", "1.0", "sqs", KEY)

    # BotoCoreError: what the pollers report and carry on after
    with pytest.raises(BotoCoreError, match="Could not connect"):
        nobody.call("ListQueues", {})
