"""An SQS event source mapping under throttling, as AWS documents it.

AWS:
- Knowledge center, "lambda-sqs-scaling" (https://repost.aws/knowledge-center/lambda-sqs-scaling): with
  reserved concurrency, Lambda throttles the function when it reaches the reserved value, and event source
  mappings don't account for reserved concurrency: they can take more messages off the queue than can be
  sent to the function. To limit concurrent invocations, use the mapping's maximum concurrency instead.
- "Handling errors for an SQS event source in Lambda"
  (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html): an invocation that fails
  because of throttling is retried with backoff until the message's visibility timeout runs out, then
  Lambda drops it: it is visible in the queue again, and its next receive counts toward the redrive
  policy's maxReceiveCount, after which SQS moves it to the dead-letter queue.
- "Configuring scaling behavior for SQS event source mappings"
  (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html): Lambda starts with five
  batches at a time; ScalingConfig.MaximumConcurrency limits the concurrent invocations the mapping makes,
  and with a reserved concurrency at least as large, Lambda does not throttle its messages.

The stack (here): HeldFunction (ReservedConcurrentExecutions 1) reads ReturningQueue (maxReceiveCount 10)
and DeadLetteringQueue (maxReceiveCount 2), both with a 1 s visibility timeout; CappedFunction and
UncappedFunction (ReservedConcurrentExecutions 2 each) read CappedQueue and UncappedQueue (2 s visibility,
maxReceiveCount 1), the first with MaximumConcurrency 2, the second without. Visibility timeouts this short
are below AWS's advice (six times the function timeout) so that each test takes seconds.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.conformance.stacks import (
    function_resource,
    reserved_concurrency_in_use,
    stack_fixture,
)
from tools.local.console.activity import Invocation
from tools.local.stack import LocalStack

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageTypeDef

KNOWLEDGE_CENTER = "https://repost.aws/knowledge-center/lambda-sqs-scaling"
ERROR_HANDLING = "https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html"
SCALING = "https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html"
WAIT_SECONDS = 20
CAP = 2


def queue(visibility_seconds: int, dead_letter_queue: str, max_receive_count: int) -> dict[str, Any]:
    return {
        "Type": "AWS::SQS::Queue",
        "Properties": {
            "VisibilityTimeout": visibility_seconds,
            "RedrivePolicy": {
                "deadLetterTargetArn": {"Fn::GetAtt": [dead_letter_queue, "Arn"]},
                "maxReceiveCount": max_receive_count,
            },
        },
    }


def sqs_event(queue_name: str, **more: Any) -> dict[str, Any]:
    return {
        "Type": "SQS",
        "Properties": {"Queue": {"Fn::GetAtt": [queue_name, "Arn"]}, "BatchSize": 1, **more},
    }


def throttling_resources(code_dir: Path) -> dict[str, Any]:
    plain_queue = {"Type": "AWS::SQS::Queue"}
    return {
        "ReturningQueue": queue(1, "ReturningDeadLetterQueue", 10),
        "ReturningDeadLetterQueue": plain_queue,
        "DeadLetteringQueue": queue(1, "DeadLetteringDeadLetterQueue", 2),
        "DeadLetteringDeadLetterQueue": plain_queue,
        "HeldFunction": function_resource(
            code_dir,
            {"Returning": sqs_event("ReturningQueue"), "DeadLettering": sqs_event("DeadLetteringQueue")},
            ReservedConcurrentExecutions=1,
        ),
        "CappedQueue": queue(2, "CappedDeadLetterQueue", 1),
        "CappedDeadLetterQueue": plain_queue,
        "CappedFunction": function_resource(
            code_dir,
            {"Capped": sqs_event("CappedQueue", ScalingConfig={"MaximumConcurrency": CAP})},
            ReservedConcurrentExecutions=CAP,
        ),
        "UncappedQueue": queue(2, "UncappedDeadLetterQueue", 1),
        "UncappedDeadLetterQueue": plain_queue,
        "UncappedFunction": function_resource(
            code_dir, {"Uncapped": sqs_event("UncappedQueue")}, ReservedConcurrentExecutions=CAP
        ),
    }


throttling_stack = stack_fixture("sqs-throttling", throttling_resources)


# --- helpers ------------------------------------------------------------------------------------------
def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def send(stack: LocalStack, queue_name: str, *bodies: str) -> list[str]:
    """Send each body as a message of its own; their message ids."""
    sqs = stack.clients.sqs()
    url = stack.queue_url(queue_name)
    return [sqs.send_message(QueueUrl=url, MessageBody=body)["MessageId"] for body in bodies]


def deliveries(stack: LocalStack, function: str, body: str) -> list[Invocation]:
    return [
        invocation
        for invocation in stack.activity.invocations(function)
        if any(record["body"] == body for record in invocation.records)
    ]


def receive_count(invocation: Invocation) -> int:
    (record,) = invocation.records
    return int(record["attributes"]["ApproximateReceiveCount"])


def dead_letters(stack: LocalStack, dead_letter_queue: str) -> list[str]:
    """The bodies in a dead-letter queue now: received, then made visible again, so they stay there."""
    sqs = stack.clients.sqs()
    url = stack.queue_url(dead_letter_queue)
    received: list[MessageTypeDef] = []
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30).get(
        "Messages", []
    ):
        received += batch
    for message in received:
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
    return [message["Body"] for message in received]


def throttled_receives(stack: LocalStack, mapping: str, message_id: str | None = None) -> list[list[str]]:
    """The message ids of each batch of a mapping ("Function.Event") that was throttled and left to return
    to the queue (the local stack's notice of it), or of those that held `message_id`."""
    batches = [
        list(notice.details["message_ids"])
        for notice in stack.activity.notices()
        if notice.component == mapping and "message_ids" in notice.details
    ]
    return [batch for batch in batches if message_id in (None, *batch)]


def span(invocation: Invocation) -> tuple[float, float]:
    return invocation.at - invocation.result.duration_ms / 1000, invocation.at


def most_at_once(invocations: list[Invocation]) -> int:
    edges = sorted([(span(i)[0], 1) for i in invocations] + [(span(i)[1], -1) for i in invocations])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


class InFlightSampler:
    """Samples a queue's ApproximateNumberOfMessagesNotVisible (received, not deleted) in the background."""

    def __init__(self, stack: LocalStack, queue_name: str) -> None:
        self._sqs = stack.clients.sqs()
        self._url = stack.queue_url(queue_name)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            attributes = self._sqs.get_queue_attributes(
                QueueUrl=self._url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
            )["Attributes"]
            self.samples.append(int(attributes["ApproximateNumberOfMessagesNotVisible"]))

    def __enter__(self) -> InFlightSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


# --- 1. a throttled batch goes back to the queue ------------------------------------------------------
def test_a_throttled_batch_returns_to_the_queue_and_its_receive_count_rises(
    throttling_stack: LocalStack, tmp_path: Path
) -> None:
    """Received while the function's reserved concurrency is in use: throttled, back after the visibility
    timeout, received again (ApproximateReceiveCount up), processed once the function is free.

    AWS: the mapping receives regardless of reserved concurrency (KNOWLEDGE_CENTER); a throttled
    invocation is retried until the visibility timeout runs out, then the message is dropped back into the
    queue (ERROR_HANDLING). HeldFunction reserves 1; a direct invocation holds it for 2.5 s, over two of
    ReturningQueue's 1 s visibility timeouts.
    """
    body = unique("returning")
    with reserved_concurrency_in_use(throttling_stack, "HeldFunction", 2.5, tmp_path) as holders:
        (message_id,) = send(throttling_stack, "ReturningQueue", body)
    (delivery,) = throttling_stack.wait_for(
        lambda: deliveries(throttling_stack, "HeldFunction", body), WAIT_SECONDS, f"{body} processed"
    )

    assert all(holder.ok for holder in holders)
    assert delivery.result.ok
    assert receive_count(delivery) >= 2, "received again after a throttled receive"
    throttled = throttled_receives(throttling_stack, "HeldFunction.Returning", message_id)
    assert len(throttled) == receive_count(delivery) - 1, "each receive before the last one was throttled"
    assert body not in dead_letters(throttling_stack, "ReturningDeadLetterQueue")


def test_under_throttling_a_valid_message_reaches_the_dead_letter_queue_after_max_receive_count(
    throttling_stack: LocalStack, tmp_path: Path
) -> None:
    """maxReceiveCount 2: two throttled receives, and SQS moves the message, never processed, to the DLQ.

    AWS: valid messages can reach the dead-letter queue when the function is throttled, because the
    mapping keeps receiving them (KNOWLEDGE_CENTER) and each throttled receive ends with the message back
    in the queue (ERROR_HANDLING), its receive count raised. DeadLetteringQueue: 1 s visibility,
    maxReceiveCount 2; HeldFunction's one environment is held for 6 s (a message back in the queue can
    wait up to a second for the next receive).
    """
    body = unique("dead-lettered")
    with reserved_concurrency_in_use(throttling_stack, "HeldFunction", 6, tmp_path):
        (message_id,) = send(throttling_stack, "DeadLetteringQueue", body)
        throttling_stack.wait_for(
            lambda: body in dead_letters(throttling_stack, "DeadLetteringDeadLetterQueue"),
            WAIT_SECONDS,
            f"{body} in the dead-letter queue",
        )

    assert deliveries(throttling_stack, "HeldFunction", body) == [], "the function never got it"
    throttled = throttled_receives(throttling_stack, "HeldFunction.DeadLettering", message_id)
    assert len(throttled) == 2, "received and throttled twice (maxReceiveCount), then moved"


# --- 2. MaximumConcurrency ----------------------------------------------------------------------------
def test_maximum_concurrency_within_reserved_concurrency_receives_no_more_than_it_can_run(
    throttling_stack: LocalStack,
) -> None:
    """With MaximumConcurrency 2 and 2 reserved, no message is taken beyond the cap, none is throttled and
    none reaches the DLQ; the same load on the twin mapping without the cap dead-letters some.

    AWS (SCALING, "Configuring maximum concurrency"): maximum concurrency limits the concurrent
    invocations the SQS event source makes; with the function's reserved concurrency at least as large,
    Lambda does not throttle its messages. Without it, the mapping starts with five batches at a time
    (SCALING) whatever the reserved concurrency (KNOWLEDGE_CENTER), so batches beyond the two that run are
    throttled; at maxReceiveCount 1 a throttled message's next receive moves it to the DLQ. Each message
    takes 1.2 s: within the 2 s visibility timeout, but two rounds of it do not fit there.
    """
    capped = [json.dumps({"sleep": 1.2, "id": unique("capped")}) for _ in range(5)]
    uncapped = [json.dumps({"sleep": 1.2, "id": unique("uncapped")}) for _ in range(5)]

    def capped_deliveries() -> list[list[Invocation]]:
        return [deliveries(throttling_stack, "CappedFunction", body) for body in capped]

    with InFlightSampler(throttling_stack, "CappedQueue") as in_flight:
        send(throttling_stack, "UncappedQueue", *uncapped)
        send(throttling_stack, "CappedQueue", *capped)
        processed = throttling_stack.wait_for(
            lambda: capped_deliveries() if all(capped_deliveries()) else None,
            WAIT_SECONDS,
            "every capped message processed",
        )
    twin_dead_letters = throttling_stack.wait_for(
        lambda: [b for b in uncapped if b in dead_letters(throttling_stack, "UncappedDeadLetterQueue")],
        WAIT_SECONDS,
        "a dead letter of the uncapped twin",
    )

    invocations = [invocation for found in processed for invocation in found]
    assert len(invocations) == len(capped), "each capped message processed once"
    assert all(invocation.result.ok for invocation in invocations)
    assert all(receive_count(invocation) == 1 for invocation in invocations), "never received again"
    assert most_at_once(invocations) <= CAP
    assert max(in_flight.samples) <= CAP, "never more messages received than the cap"
    assert throttled_receives(throttling_stack, "CappedFunction.Capped") == []
    assert not set(capped) & set(dead_letters(throttling_stack, "CappedDeadLetterQueue"))
    assert twin_dead_letters, "without the cap, valid messages were throttled into the DLQ"
    assert throttled_receives(throttling_stack, "UncappedFunction.Uncapped")
