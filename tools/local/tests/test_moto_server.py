"""The local stack's moto server (services/moto_server.py): the corrections it applies to moto's SQS."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.sqs.models import Message, Queue, SQSBackend, sqs_backends

from tools.local.services.moto_server import read_retention_per_message, serialise_sqs_deletes

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


def test_a_receive_checks_retention_as_moto_does_without_counting_the_queue(
    sqs_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        SQSBackend,
        "is_message_valid_based_on_retention_period",
        SQSBackend.is_message_valid_based_on_retention_period,  # restored after the test
    )
    sqs_backend.create_queue("q", MessageRetentionPeriod="60")
    for body in ("kept", "expired"):
        sqs_backend.send_message("q", body)
    queue = sqs_backend.get_queue("q")
    queue._messages[1].sent_timestamp -= 61_000  # sent 61 s ago, past the queue's 60 s
    moto_answers = [sqs_backend.is_message_valid_based_on_retention_period("q", m) for m in queue._messages]

    read_retention_per_message()
    monkeypatch.setattr(Queue, "attributes", property(lambda self: pytest.fail("counted the queue")))

    assert [sqs_backend.is_message_valid_based_on_retention_period("q", m) for m in queue._messages] == (
        moto_answers
    )
    assert moto_answers == [True, False]
    assert [m.body for m in sqs_backend.receive_message("q", 10, 0, 30)] == ["kept"]


def test_the_server_the_stack_starts_is_moto_server_with_the_correction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto import server

    from tools.local.services import moto_server

    monkeypatch.setattr(Queue, "delete_message", Queue.delete_message)  # restored after the test
    monkeypatch.setattr(
        SQSBackend,
        "is_message_valid_based_on_retention_period",
        SQSBackend.is_message_valid_based_on_retention_period,
    )
    started: list[list[str]] = []
    monkeypatch.setattr(server, "main", started.append)

    moto_server.main(["-H", "127.0.0.1", "-p", "5000"])

    assert started == [["-H", "127.0.0.1", "-p", "5000"]]  # moto.server's own main, its arguments as given
    assert getattr(Queue.delete_message, "__wrapped__", None) is not None  # deletes take the queue's lock
    assert SQSBackend.is_message_valid_based_on_retention_period.__module__ == moto_server.__name__
