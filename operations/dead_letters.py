"""Move a consumer dead-letter queue's messages back to the queue they came from, as SQS's dead-letter
queue redrive does (StartMessageMoveTask, the console's "Start DLQ redrive").

AWS's move task is asynchronous and reports counts only; moto (the unit tests, the local stack) does not
implement it. This is the same move done message by message, so each one is reported: receive from the
dead-letter queue, send its body with its message attributes and its AWSTraceHeader (the saga's trace,
which the consumer's writes carry on) to the destination, delete it from the dead-letter queue once the
send succeeded. As with the move task, a moved message is a new message (a new message id, its receive
count and retention starting again). The destination defaults to the dead-letter queue's only source
queue (ListDeadLetterSourceQueues), as the move task's does.

A message whose send fails stays in the dead-letter queue, visible again when the run ends. One sent but
not deleted is in both queues: it is reported as kept, and its second delivery is harmless (consumers
apply each event id once).

A moved message starts a new retention, so it can reach its consumer after the consumers forgot its
event id (they remember it for OutboxTtlDays + 19 days: shop/runtime/config.py): inventory and order
status would still change nothing twice, a notification could repeat. A message whose event is older
than `oldest_safe` (that window less the destination's retention, from now) is therefore kept, and
named, unless the operator moves it anyway (--include-expired). One whose event time cannot be read is
moved: it holds no event a consumer can apply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from botocore.exceptions import BotoCoreError, ClientError

from operations.queue_run import QueueRun
from shop.domain.envelope import parse_time

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        MessageAttributeValueTypeDef,
        MessageSystemAttributeValueTypeDef,
        MessageTypeDef,
    )

TRACE_HEADER: Final = "AWSTraceHeader"


class NoDestination(ValueError):
    """The dead-letter queue has no single source queue, and no destination was given."""


@dataclass
class MoveSummary:
    moved: int = 0
    kept: int = 0
    reports: list[dict[str, Any]] = field(default_factory=list)

    def closing(self) -> dict[str, int]:
        """The closing line every queue command prints (operations/admin.py)."""
        return {"redriven": self.moved, "kept": self.kept}


def source_queue(sqs: SQSClient, dead_letter_queue_url: str) -> str:
    """The queue whose redrive policy names this dead-letter queue: the move task's default destination."""
    sources = sqs.list_dead_letter_source_queues(QueueUrl=dead_letter_queue_url).get("queueUrls", [])
    if len(sources) != 1:
        found = ", ".join(sources) or "none"
        raise NoDestination(
            f"{dead_letter_queue_url} is the dead-letter queue of {len(sources)} queue(s) ({found}): "
            "give --to-queue-url"
        )
    return sources[0]


def _attributes(message: MessageTypeDef) -> dict[str, MessageAttributeValueTypeDef]:
    """The message attributes as SendMessage takes them (the list forms are reserved and unused)."""
    kept: dict[str, MessageAttributeValueTypeDef] = {}
    for name, value in message.get("MessageAttributes", {}).items():
        attribute: MessageAttributeValueTypeDef = {"DataType": value["DataType"]}
        if "StringValue" in value:
            attribute["StringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            attribute["BinaryValue"] = value["BinaryValue"]
        kept[name] = attribute
    return kept


def _trace(message: MessageTypeDef) -> dict[Literal["AWSTraceHeader"], MessageSystemAttributeValueTypeDef]:
    """The message's AWSTraceHeader, the one system attribute SendMessage may set."""
    header = message.get("Attributes", {}).get(TRACE_HEADER)
    return {TRACE_HEADER: {"DataType": "String", "StringValue": header}} if header else {}


def event_time(body: str) -> datetime | None:
    """The time of the CloudEvent a consumer message carries (the EventBridge event's `detail`), if any."""
    try:
        return parse_time(json.loads(body)["detail"]["time"])
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def move_messages(
    sqs: SQSClient,
    dead_letter_queue_url: str,
    destination_url: str,
    max_messages: int,
    report: Callable[[dict[str, Any]], None] = lambda document: print(json.dumps(document)),
    oldest_safe: datetime | None = None,
) -> MoveSummary:
    """Move up to `max_messages` messages, oldest first as SQS returns them; each one's report is handed
    to `report` as it is made. With `oldest_safe`, a message whose event is older stays (module doc)."""
    summary = MoveSummary()
    run = QueueRun(sqs, dead_letter_queue_url)

    def told(document: dict[str, Any]) -> None:
        summary.reports.append(document)
        report(document)

    while summary.moved + summary.kept < max_messages:
        messages = run.receive(
            min(10, max_messages - summary.moved - summary.kept),
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=[TRACE_HEADER],
        )
        if not messages:
            break
        for message in messages:
            document: dict[str, Any] = {"messageId": message["MessageId"], "destination": destination_url}
            when = event_time(message["Body"])
            if oldest_safe is not None and when is not None and when < oldest_safe:
                summary.kept += 1
                run.keep(message)
                document["eventTime"] = when.isoformat()
                document["error"] = (
                    "not moved: its event is older than the consumers would still remember once it is "
                    "delivered (a notification could repeat); move it anyway with --include-expired"
                )
                told({**document, "complete": False})
                continue
            sent = None
            try:
                sent = sqs.send_message(
                    QueueUrl=destination_url,
                    MessageBody=message["Body"],
                    MessageAttributes=_attributes(message),
                    MessageSystemAttributes=_trace(message),
                )
                sqs.delete_message(QueueUrl=dead_letter_queue_url, ReceiptHandle=message["ReceiptHandle"])
            except (ClientError, BotoCoreError) as exc:
                summary.kept += 1
                run.keep(message)
                if sent is None:
                    document["error"] = f"not moved: SendMessage failed: {exc}"
                else:
                    document["newMessageId"] = sent["MessageId"]
                    document["error"] = (
                        f"moved, but not deleted from the dead-letter queue ({exc}): it will be delivered "
                        "again if redriven again (the consumer applies its event once)"
                    )
                told({**document, "complete": False})
                continue
            summary.moved += 1
            told({**document, "newMessageId": sent["MessageId"], "complete": True})
    run.end()
    return summary
