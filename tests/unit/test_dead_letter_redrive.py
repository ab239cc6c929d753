"""`python -m operations redrive-dlq`: a consumer dead-letter queue's messages back to their queue, as
SQS's DLQ redrive moves them (operations/dead_letters.py), on moto's SQS with a real redrive policy."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import operations.stack
import shop.adapters.aws
from operations import admin
from operations.dead_letters import move_messages

TRACE = "Root=1-6b07e9a3-ff0f6c0d362160012270ae30;Parent=53995c3f42cd8ad8;Sampled=1"
MAX_RECEIVES = 2


@pytest.fixture
def queues(aws: None) -> tuple[Any, str, str]:
    """A consumer queue whose redrive policy moves a message to its dead-letter queue on the receive
    after its MAX_RECEIVES-th; (sqs client, queue url, dead-letter queue url)."""
    sqs = boto3.client("sqs")
    dead_letter_queue = sqs.create_queue(QueueName="InventoryDeadLetterQueue")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dead_letter_queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(MAX_RECEIVES)})
    queue = sqs.create_queue(
        QueueName="InventoryQueue", Attributes={"RedrivePolicy": policy, "VisibilityTimeout": "0"}
    )["QueueUrl"]
    return sqs, queue, dead_letter_queue


def dead_letter(sqs: Any, queue: str, body: str, **extra: Any) -> str:
    """Send a message and fail it MAX_RECEIVES times, so SQS moves it to the dead-letter queue."""
    message_id = str(sqs.send_message(QueueUrl=queue, MessageBody=body, **extra)["MessageId"])
    for _ in range(MAX_RECEIVES):
        assert sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)["Messages"]
    assert sqs.receive_message(QueueUrl=queue).get("Messages", []) == []  # moved on this receive
    return message_id


def everything(sqs: Any, queue: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = sqs.receive_message(
        QueueUrl=queue,
        MaxNumberOfMessages=10,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    ).get("Messages", [])
    return messages


def test_the_messages_go_back_to_their_source_queue_with_their_body_attributes_and_trace(
    queues: tuple[Any, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    sqs, queue, dead_letter_queue = queues
    traced = dead_letter(
        sqs,
        queue,
        '{"detail": {"id": "e-1"}}',
        MessageAttributes={"ERROR_CODE": {"DataType": "String", "StringValue": "SQS_QUEUE_FULL"}},
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}},
    )
    plain = dead_letter(sqs, queue, '{"detail": {"id": "e-2"}}')

    assert admin.main(["redrive-dlq", "--queue-url", dead_letter_queue]) == 0

    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed[-1] == {"redriven": 2, "kept": 0}
    assert sorted((r["messageId"], r["destination"], r["complete"]) for r in printed[:-1]) == sorted(
        [(traced, queue, True), (plain, queue, True)]
    )
    assert everything(sqs, dead_letter_queue) == []
    back = {m["Body"]: m for m in everything(sqs, queue)}
    assert set(back) == {'{"detail": {"id": "e-1"}}', '{"detail": {"id": "e-2"}}'}
    moved = back['{"detail": {"id": "e-1"}}']
    assert moved["MessageAttributes"]["ERROR_CODE"]["StringValue"] == "SQS_QUEUE_FULL"
    assert moved["Attributes"]["AWSTraceHeader"] == TRACE
    assert "AWSTraceHeader" not in back['{"detail": {"id": "e-2"}}']["Attributes"]
    # As the move task does: a new message, counted from its first receive again.
    assert {m["MessageId"] for m in back.values()}.isdisjoint({traced, plain})
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in back.values()} == {"1"}
    reported_new = {r["newMessageId"] for r in printed[:-1]}
    assert reported_new == {m["MessageId"] for m in back.values()}


def test_with_the_stacks_name_the_consumer_names_the_output(
    queues: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sqs, queue, dead_letter_queue = queues
    dead_letter(sqs, queue, "{}")
    asked: list[str] = []

    def describe(stack_name: str) -> dict[str, Any]:
        asked.append(stack_name)
        output = {"OutputKey": "InventoryDeadLetterQueueUrl", "OutputValue": dead_letter_queue}
        parameter = {"ParameterKey": "OutboxTtlDays", "ParameterValue": "16"}
        return {"Outputs": [output], "Parameters": [parameter]}

    monkeypatch.setattr(operations.stack, "describe_stack", describe)

    assert admin.main(["--stack-name", "shop", "redrive-dlq", "--consumer", "Inventory"]) == 0

    assert set(asked) == {"shop"}
    assert [m["Body"] for m in everything(sqs, queue)] == ["{}"]


def test_a_queue_that_is_no_ones_dead_letter_queue_needs_a_destination(aws: None) -> None:
    sqs = boto3.client("sqs")
    lonely = sqs.create_queue(QueueName="Lonely")["QueueUrl"]
    elsewhere = sqs.create_queue(QueueName="Elsewhere")["QueueUrl"]
    sqs.send_message(QueueUrl=lonely, MessageBody="x")

    with pytest.raises(SystemExit, match="dead-letter queue of 0 queue"):
        admin.main(["redrive-dlq", "--queue-url", lonely])
    assert admin.main(["redrive-dlq", "--queue-url", lonely, "--to-queue-url", elsewhere]) == 0

    assert [m["Body"] for m in everything(sqs, elsewhere)] == ["x"]


def test_a_message_whose_send_fails_stays_in_the_dead_letter_queue_visible_and_named(
    queues: tuple[Any, str, str],
) -> None:
    sqs, queue, dead_letter_queue = queues
    stuck = dead_letter(sqs, queue, '"refused"')
    dead_letter(sqs, queue, '"taken"')
    send = sqs.send_message

    def refusing(**kwargs: Any) -> Any:
        if kwargs["MessageBody"] == '"refused"':
            raise ClientError({"Error": {"Code": "KmsThrottled", "Message": "slow down"}}, "SendMessage")
        return send(**kwargs)

    sqs.send_message = refusing

    summary = move_messages(sqs, dead_letter_queue, queue, 1000, report=lambda _: None)

    assert summary.closing() == {"redriven": 1, "kept": 1}
    [failed] = [r for r in summary.reports if not r["complete"]]
    assert failed["messageId"] == stuck
    assert "SendMessage failed" in failed["error"]
    assert "KmsThrottled" in failed["error"]
    assert [m["Body"] for m in everything(sqs, dead_letter_queue)] == ['"refused"']  # visible at once
    assert [m["Body"] for m in everything(sqs, queue)] == ['"taken"']


def test_the_command_exits_1_and_says_what_it_kept(
    queues: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sqs, queue, dead_letter_queue = queues
    dead_letter(sqs, queue, '"refused"')

    def no_destination(*_: Any, **__: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "SendMessage")

    client = boto3.client("sqs")
    client.send_message = no_destination  # type: ignore[method-assign]
    monkeypatch.setattr(shop.adapters.aws, "sqs", lambda: client)

    assert admin.main(["redrive-dlq", "--queue-url", dead_letter_queue]) == 1

    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1]) == {"redriven": 0, "kept": 1}
    assert f"1 message(s) kept in {dead_letter_queue}" in err


def test_at_most_max_messages_are_moved(queues: tuple[Any, str, str]) -> None:
    sqs, queue, dead_letter_queue = queues
    for n in range(3):
        dead_letter(sqs, queue, str(n))

    assert admin.main(["redrive-dlq", "--queue-url", dead_letter_queue, "--max-messages", "2"]) == 0

    assert len(everything(sqs, queue)) == 2
    assert len(everything(sqs, dead_letter_queue)) == 1


def consumer_message(event_id: str, age: timedelta) -> str:
    when = (datetime.now(UTC) - age).isoformat()
    return json.dumps({"detail-type": "OrderCreated", "detail": {"id": event_id, "time": when}})


@pytest.mark.parametrize("include_expired", [False, True], ids=["by-default", "include-expired"])
def test_a_message_older_than_the_consumers_memory_once_moved_stays_unless_the_operator_says(
    queues: tuple[Any, str, str], capsys: pytest.CaptureFixture[str], include_expired: bool
) -> None:
    """Consumers remember an event id for OutboxTtlDays + 19 days (35 by default); a moved message starts
    a new retention (here the queue's default, 4 days), so one whose event is 32 days old could reach its
    consumer after its id is forgotten (a notification would repeat). One 30 days old cannot."""
    sqs, queue, dead_letter_queue = queues
    old = dead_letter(sqs, queue, consumer_message("e-old", timedelta(days=32)))
    recent = dead_letter(sqs, queue, consumer_message("e-recent", timedelta(days=30)))
    undated = dead_letter(sqs, queue, '{"detail": {"id": "e-undated"}}')

    code = admin.main(
        ["redrive-dlq", "--queue-url", dead_letter_queue, *(["--include-expired"] * include_expired)]
    )

    moved = sorted(json.loads(m["Body"])["detail"]["id"] for m in everything(sqs, queue))
    reports = {
        r["messageId"]: r for r in map(json.loads, capsys.readouterr().out.splitlines()) if "messageId" in r
    }
    if include_expired:
        assert (code, moved) == (0, ["e-old", "e-recent", "e-undated"])
    else:
        assert (code, moved) == (1, ["e-recent", "e-undated"])
        assert reports[old]["complete"] is False
        assert "--include-expired" in reports[old]["error"]
        [left] = everything(sqs, dead_letter_queue)
        assert json.loads(left["Body"])["detail"]["id"] == "e-old"
    assert reports[recent]["complete"] is True
    assert reports[undated]["complete"] is True
