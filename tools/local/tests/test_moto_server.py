"""The local stack's moto server (services/moto_server.py): the corrections it applies to moto's SQS."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonpath_ng.ext as jsonpath_ext
import pytest
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.sqs.models import Message, Queue, sqs_backends

from tools.local.services.moto_server import (
    parse_each_input_path_once,
    read_queue_attributes_on_demand,
    serialise_sqs_deletes,
)

PAUSE_SECONDS = 0.5
JSONPATH: Any = jsonpath_ext  # its parse is not in the stubs' exports
JSONPATH_PARSE = JSONPATH.parse  # moto's, restored after each test that caches it


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


QUEUES = {
    "standard": {},
    "policies": {
        "Policy": '{"Version": "2012-10-17", "Statement": []}',
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:123456789012:dlq", "maxReceiveCount": 3}
        ),
    },
    "fifo.fifo": {"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    "encrypted": {"KmsMasterKeyId": "alias/aws/sqs", "DelaySeconds": "5"},
}


COUNTS = (  # the attributes that walk the queue's messages
    "approximate_number_of_messages",
    "approximate_number_of_messages_delayed",
    "approximate_number_of_messages_not_visible",
)


@pytest.fixture
def attributes_on_demand(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(Queue, "attributes", Queue.attributes)  # restored after the test
    with mock_aws():
        backend = sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
        backend.create_queue("dlq")
        yield backend


@pytest.mark.parametrize("name", QUEUES)
def test_queue_attributes_read_on_demand_are_moto_s(attributes_on_demand: Any, name: str) -> None:
    # Given a queue with visible, received and delayed messages, and moto's own attributes of it
    backend = attributes_on_demand
    backend.create_queue(name, **QUEUES[name])
    group = {"group_id": "g"} if name.endswith(".fifo") else {}
    for body in ("visible", "received"):
        backend.send_message(name, body, **group)
    backend.receive_message(name, 1, 0, 30)
    if not group:
        backend.send_message(name, "delayed", delay_seconds=60)
    moto_answers = dict(backend.get_queue(name).attributes)

    # When they are read on demand
    read_queue_attributes_on_demand()
    attributes = backend.get_queue(name).attributes

    # Then the names, their order and every value are moto's, read whole, one by one or by the API
    assert list(attributes.items()) == list(moto_answers.items())
    assert {key: attributes.get(key) for key in moto_answers} == moto_answers
    assert backend.get_queue_attributes(name, ["All"]) == moto_answers
    assert attributes.get("NoSuchAttribute") is None


def test_a_send_and_a_receive_do_not_count_the_queue(
    attributes_on_demand: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue whose retention has expired for one of its messages
    backend = attributes_on_demand
    backend.create_queue("q", MessageRetentionPeriod="60")
    for body in ("kept", "expired"):
        backend.send_message("q", body)
    backend.get_queue("q")._messages[1].sent_timestamp -= 61_000  # sent 61 s ago, past the queue's 60 s

    # When attributes are read on demand, and counting the queue fails the test
    read_queue_attributes_on_demand()
    for count in COUNTS:
        monkeypatch.setattr(Queue, count, property(lambda self: pytest.fail("counted the queue")))

    # Then a send and a receive work without counting, and the receive still applies the retention
    backend.send_message("q", "sent")
    received = [m.body for _ in range(3) for m in backend.receive_message("q", 10, 0, 30)]
    assert sorted(received) == ["kept", "sent"]


def test_the_server_the_stack_starts_is_moto_server_with_the_correction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto import server

    from tools.local.services import moto_server

    monkeypatch.setattr(Queue, "delete_message", Queue.delete_message)  # restored after the test
    monkeypatch.setattr(Queue, "attributes", Queue.attributes)
    monkeypatch.setattr(jsonpath_ext, "parse", JSONPATH_PARSE)
    started: list[list[str]] = []
    monkeypatch.setattr(server, "main", started.append)

    moto_server.main(["-H", "127.0.0.1", "-p", "5000"])

    assert started == [["-H", "127.0.0.1", "-p", "5000"]]  # moto.server's own main, its arguments as given
    assert getattr(Queue.delete_message, "__wrapped__", None) is not None  # deletes take the queue's lock
    assert isinstance(Queue.attributes, property)
    assert Queue.attributes.fget is moto_server._QueueAttributes  # attributes read on demand
    assert hasattr(JSONPATH.parse, "cache_info")  # each JSONPath parsed once


def test_targets_receive_the_events_moto_renders_with_each_path_parsed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jsonpath_ng.parser import JsonPathParser
    from moto.events.utils import EventTemplateParser

    monkeypatch.setattr(jsonpath_ext, "parse", JSONPATH_PARSE)  # restored after the test
    events: list[Any] = [  # as moto's put_events hands them to targets: the time still a timestamp
        {
            "id": f"id-{n}",
            "time": 1_764_190_800.0,
            "detail-type": "OrderCreated",
            "source": "shop.orders",
            "account": "123456789012",
            "region": "us-east-1",
            "resources": [],
            "detail": {"orderId": f"order-{n}", "nested": {"list": [1, "two", None]}},
            "ingestion-time": 1_764_190_800.0,
        }
        for n in range(3)
    ]
    targets: list[Any] = [  # one without an InputTransformer, one with
        (None, {}),
        ('{"order": "<order>"}', {"order": "$.detail.orderId"}),
    ]

    def rendered() -> list[Any]:
        return [
            EventTemplateParser.parse(template, paths, event)
            for event in events
            for template, paths in targets
        ]

    moto_renders = rendered()
    parse_each_input_path_once()
    parse_each_input_path_once()  # applied twice, still one cache
    rendered()  # the first rendering parses each expression
    parsers_built = 0
    build = JsonPathParser.__init__

    def counted_build(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal parsers_built
        parsers_built += 1
        build(self, *args, **kwargs)

    monkeypatch.setattr(JsonPathParser, "__init__", counted_build)

    assert rendered() == moto_renders
    assert parsers_built == 0
