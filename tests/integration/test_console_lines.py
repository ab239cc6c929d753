"""The console says what happened, from what the functions themselves report (tools/local/console/reports.py)
on a running stack: an event a consumer ignored says "ignored", a failed message carries its error, a
message its queue's redrive policy moves says where; and the start-up hint places an order as docs/api.md
asks (with an Idempotency-Key)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import requests

from tests.integration.watched_stacks import WatchedStack, place_order, statuses, watched_stack
from tools.local.console.summary import curl_example
from tools.local.services.emulators import LocalServices
from tools.template import Template

SETTLE_SECONDS = 30.0
VISIBILITY_SECONDS = 2  # the dead-lettered message's queue, so its next receive moves it soon
LONG_POLL_SECONDS = 1.5  # longer than the queue poller's receive waits (1 s)


@pytest.fixture(scope="module")
def watched(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WatchedStack]:
    """A stack of its own whose consumer queues dead-letter a message at its first failed receive."""
    template = Template.load(parameters={"ConsumerMaxReceiveCount": "1"}, stack_name="lines")
    with watched_stack(local_services, tmp_path_factory.mktemp("lines"), template) as stack:
        yield stack


def wait_for_line(watched: WatchedStack, pattern: str) -> str:
    found = watched.stack.wait_for(
        lambda: re.search(pattern, watched.printed()), SETTLE_SECONDS, f"a console line matching {pattern!r}"
    )
    return found.group()


def test_an_event_the_consumer_ignored_says_ignored_not_ok(watched: WatchedStack) -> None:
    stack = watched.stack
    order = place_order(stack)
    stack.wait_for(
        lambda: statuses(stack, [order])[order] == "CONFIRMED", SETTLE_SECONDS, "the order confirmed"
    )
    body: str = stack.wait_for(
        lambda: next(
            (
                record["body"]
                for invocation in stack.activity.invocations("OrderStatusFunction")
                for record in invocation.records
                if order in record["body"]
            ),
            None,
        ),
        SETTLE_SECONDS,
        "the inventory's answer the order-status consumer applied",  # recorded once the invocation ends
    )
    answer = json.loads(body)
    answer["detail"]["id"] = str(uuid.uuid4())  # the same answer again, as another event
    sqs, queue = stack.clients.sqs(), stack.queue_url("OrderStatusQueue")

    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(answer))
    sqs.send_message(QueueUrl=queue, MessageBody=body)  # the event it applied, delivered again

    wait_for_line(watched, rf"OrderStatusQueue  InventoryReserved {order}  ignored \(order CONFIRMED\)")
    wait_for_line(watched, rf"OrderStatusQueue  InventoryReserved {order}  ignored \(duplicate\)")


def test_a_failed_message_says_why_and_where_it_is_dead_lettered(watched: WatchedStack) -> None:
    stack = watched.stack
    sqs, queue = stack.clients.sqs(), stack.queue_url("InventoryQueue")
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"VisibilityTimeout": str(VISIBILITY_SECONDS)})
    time.sleep(LONG_POLL_SECONDS)  # a receive already waiting took the queue's previous visibility timeout
    marker = f"malformed-{uuid.uuid4().hex[:8]}"
    body = json.dumps(
        {"version": "0", "id": marker, "detail-type": "OrderCreated", "detail": {"type": "OrderCreated"}}
    )

    sqs.send_message(QueueUrl=queue, MessageBody=body)

    # The consumer's own error for that message, from its log line (the answer names the message only).
    wait_for_line(watched, rf"InventoryQueue  OrderCreated  FAILED InvalidEnvelope: .*\(event {marker}\)")
    wait_for_line(
        watched,
        rf"InventoryQueue  OrderCreated  dead-lettered → lines-InventoryDeadLetterQueue after 1 receives "
        rf"\(maxReceiveCount 1\) \(event {marker}\)",
    )
    dead_letters = stack.queue_url("InventoryDeadLetterQueue")

    def in_the_dead_letter_queue() -> bool:
        received = sqs.receive_message(QueueUrl=dead_letters, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return any(marker in message["Body"] for message in received.get("Messages", []))

    stack.wait_for(
        in_the_dead_letter_queue, SETTLE_SECONDS, "the message in the dead-letter queue, as the line said"
    )


def test_the_start_up_hint_places_an_order_with_an_idempotency_key(watched: WatchedStack) -> None:
    stack = watched.stack
    hint = curl_example(stack.api_url, stack.sources.routes)
    assert hint is not None
    assert re.search(r"-H 'Idempotency-Key: [0-9a-f-]{36}'", hint)

    first = subprocess.run(shlex.split(hint), capture_output=True, text=True, timeout=30, check=True).stdout
    again = subprocess.run(shlex.split(hint), capture_output=True, text=True, timeout=30, check=True).stdout

    location = re.compile(r"(?im)^Location: (/orders/o-[0-9a-f]+)")
    assert first.startswith("HTTP/1.1 201")
    created = location.search(first)
    assert created is not None
    assert requests.get(f"{stack.api_url}{created.group(1)}", timeout=10).status_code == 200
    # The same key again replays that order (the identical answer), as docs/api.md says: it was sent.
    assert re.search(r"(?im)^Idempotent-Replayed: true", again)
    replayed = location.search(again)
    assert replayed is not None
    assert replayed.group(1) == created.group(1)
    assert curl_example(stack.api_url, stack.sources.routes) != hint, (
        "each start-up's hint has a key of its own"
    )
