"""The relay's poison queue (SQS): poison outbox records (shop.domain.poison), parked whole.

A poison record (undecodable image, invalid envelope, event larger than the bus accepts) fails the
same way on every retry. Reporting it in `batchItemFailures` would hold its shard and, with
`BisectBatchOnFunctionError`, AWS "bisects at the returned sequence number and retries only the
remaining records": its healthy later neighbours would be dead-lettered with it. So the relay parks
it here itself, with everything needed to inspect or republish it, and moves on.

The message body (JSON, `kind` = "outbox-poison", `version` = 1):
    eventId, sequenceNumber, streamArn, reason, details, parkedAt,
    item   the outbox item exactly as the stream delivered it (DynamoDB attribute-value form),
    itemOmitted / key   when the item is too large for one queue message: only its key, and the item
                        stays readable in the table until its TTL.
"""

from __future__ import annotations

import json
from typing import Any

from shop.adapters import aws, keys
from shop.domain.envelope import format_time, now
from shop.domain.poison import PoisonRecord

POISON_KIND = "outbox-poison"
# SQS accepts 256 KiB per message (1 MiB since 2025 in some regions): stay under the smaller limit.
MAX_MESSAGE_BYTES = 262_144


def _message_text(body: dict[str, Any]) -> tuple[str, int]:
    """The body as JSON and its size in bytes. UTF-8 as it is, unless it holds what UTF-8 cannot encode (a
    lone surrogate, which a DynamoDB string may hold): then every non-ASCII character escaped, so the
    record is still parked whole instead of failing its batch."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        return text, len(text.encode())
    except UnicodeEncodeError:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=True)
        return text, len(text)


def poison_message_body(record: PoisonRecord) -> str:
    body: dict[str, Any] = {
        "kind": POISON_KIND,
        "version": 1,
        "eventId": record.event_id,
        "sequenceNumber": record.sequence_number,
        "streamArn": record.stream_arn,
        "reason": record.reason,
        "details": record.details,
        "parkedAt": format_time(now()),
        "item": record.image,
    }
    text, size = _message_text(body)
    if size <= MAX_MESSAGE_BYTES:
        return text
    del body["item"]
    if record.image.get("store") == "postgres":  # a row the polling publisher parked
        body["itemOmitted"] = "larger than one queue message; the row stays in the order database's outbox"
        body["key"] = {name: record.image.get(name) for name in ("store", "position", "eventId")}
    else:
        body["itemOmitted"] = "larger than one queue message; read it from the table by key before its TTL"
        body["key"] = {name: record.image.get(name) for name in (keys.PK, keys.SK)}
    return _message_text(body)[0]


def checked_poison_message(body: object) -> dict[str, Any]:
    """A decoded poison queue message body, checked for the fields redrive relies on."""
    if not isinstance(body, dict) or body.get("kind") != POISON_KIND:
        raise ValueError("not an outbox poison message")
    if body.get("item") is None and body.get("key") is None:
        raise ValueError("poison message holds neither the item nor its key")
    return body


class PoisonQueue:
    """The relay's poison queue (SQS)."""

    def __init__(self, queue_url: str) -> None:
        self._queue_url = queue_url

    def park(self, record: PoisonRecord) -> None:
        aws.sqs().send_message(
            QueueUrl=self._queue_url,
            MessageBody=poison_message_body(record),
            MessageAttributes={
                "eventId": {"DataType": "String", "StringValue": record.event_id},
                "reason": {"DataType": "String", "StringValue": record.reason[:256]},
            },
        )
