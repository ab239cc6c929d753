"""The local stack's moto server (services/moto_server.py): the correction it applies to moto's SQS,
connections kept alive, and SNS certificates built once per key with every message still signed."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.sqs.models import Message, Queue, sqs_backends

from tools.local.processes import free_port
from tools.local.services.emulators import START_TIMEOUT_SECONDS, MotoServer
from tools.local.services.moto_server import _build_sns_certificate_once, serialise_sqs_deletes

PAUSE_SECONDS = 0.5


@pytest.fixture
def sqs_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(Queue, "delete_message", Queue.delete_message)  # restored after the test
    serialise_sqs_deletes()
    with mock_aws():
        yield sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]


def test_a_send_between_two_concurrent_deletes_is_kept(
    sqs_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two received messages, and a delete of the first paused halfway through its scan
    sqs_backend.create_queue("q")
    for body in ("first", "second"):
        sqs_backend.send_message("q", body)
    received = {m.body: m.receipt_handle for m in sqs_backend.receive_message("q", 10, 0, 30)}
    others_done = threading.Event()
    scanning = Message.had_receipt_handle
    checks = 0

    def paused_scan(self: Message, receipt_handle: str) -> bool:
        nonlocal checks
        if threading.current_thread().name == "first-delete":
            checks += 1
            if checks == 2:  # the first check finds the message; the second is in the list rebuild
                others_done.wait(PAUSE_SECONDS)  # without the lock, the others finish meanwhile
        return scanning(self, receipt_handle)

    monkeypatch.setattr(Message, "had_receipt_handle", paused_scan)

    def delete_the_second_and_send() -> None:
        sqs_backend.delete_message("q", received["second"])
        sqs_backend.send_message("q", "sent meanwhile")
        others_done.set()

    # When the second is deleted and a third message sent while the first delete is under way
    first = threading.Thread(
        target=sqs_backend.delete_message, args=("q", received["first"]), name="first-delete"
    )
    first.start()
    others = threading.Thread(target=delete_the_second_and_send)
    others.start()
    first.join(10)
    others.join(10)

    # Then the queue holds exactly the message sent meanwhile: not lost, no deleted one back
    assert [m.body for m in sqs_backend.get_queue("q")._messages] == ["sent meanwhile"]


@pytest.fixture
def moto_server(tmp_path: Path) -> Iterator[MotoServer]:
    server = MotoServer(free_port(), tmp_path / "moto.log")
    server.start()
    try:
        server.wait_ready(time.monotonic() + START_TIMEOUT_SECONDS)
        yield server
    finally:
        server.stop()


def _sqs_request(connection: http.client.HTTPConnection, action: str) -> http.client.HTTPResponse:
    body = f"Action={action}&Version=2012-11-05&QueueName=q"
    connection.request(
        "POST",
        "/",
        body=body,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/sqs/aws4_request, "
            "SignedHeaders=host, Signature=0",
        },
    )
    return connection.getresponse()


def test_connections_are_kept_alive_between_requests(moto_server: MotoServer) -> None:
    # Given one HTTP/1.1 connection to the local moto server
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=10)
    try:
        # When two requests are sent on it, one after the other
        first = _sqs_request(connection, "CreateQueue")
        first_body = first.read()
        socket_after_first = connection.sock
        second = _sqs_request(connection, "ListQueues")
        second_body = second.read()

        # Then both are answered on the same open connection
        assert first.status == second.status == 200
        assert first.getheader("Connection") is None
        assert second.getheader("Connection") is None
        assert socket_after_first is not None
        assert connection.sock is socket_after_first
        assert b"<QueueUrl>" in first_body
        assert b"/q</QueueUrl>" in second_body
    finally:
        connection.close()


def test_a_chunked_request_still_closes_its_connection(moto_server: MotoServer) -> None:
    # Given a request whose body has no Content-Length (chunked): its end is the server's to find
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=10)
    try:
        connection.request(
            "POST",
            "/",
            body=iter([b"Action=ListQueues&Version=2012-11-05"]),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/sqs/aws4_request, "
                "SignedHeaders=host, Signature=0",
            },
            encode_chunked=True,
        )
        response = connection.getresponse()
        response.read()

        # Then it is answered, and the connection closed as Werkzeug does
        assert response.status == 200
        assert response.getheader("Connection") == "close"
    finally:
        connection.close()


def test_sns_messages_are_signed_with_one_certificate_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.sns import models as sns_models

    monkeypatch.setattr(
        sns_models, "cryptography", vars(sns_models)["cryptography"]
    )  # restored after the test
    _build_sns_certificate_once()
    with mock_aws():
        # Given a topic with a queue subscribed (not raw: the envelope carries the signature)
        sns = boto3.client("sns", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        topic = sns.create_topic(Name="t")["TopicArn"]
        queue = sqs.create_queue(QueueName="copies")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

        # When two messages are published
        for text in ("one", "two"):
            sns.publish(TopicArn=topic, Message=text)
        envelopes = [
            json.loads(m["Body"])
            for m in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
        ]

        # Then each is signed (SignatureVersion 2) by the key of the certificate at its SigningCertURL
        keys = sns_models.sns_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]._message_public_keys
        certificates = set()
        for envelope in envelopes:
            pem = keys[envelope["SigningCertURL"].rsplit("/", 1)[1]]
            certificate = x509.load_pem_x509_certificate(pem)
            certificates.add(pem)
            signed = "".join(
                f"{name}\n{envelope[name]}\n"
                for name in ("Message", "MessageId", "Timestamp", "TopicArn", "Type")
            )
            public_key = certificate.public_key()
            assert isinstance(public_key, rsa.RSAPublicKey)
            public_key.verify(
                base64.b64decode(envelope["Signature"]), signed.encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        assert sorted(e["Message"] for e in envelopes) == ["one", "two"]
        assert len(certificates) == 1  # built once for the subscription's key
