"""The relays' poison queue (SQS): poison outbox records (shop.domain.poison), parked whole, and the one
codec of its message (poison_message_body writes it, parked_poison reads it back).

A poison record (undecodable image, invalid envelope, event larger than the bus accepts) fails the
same way on every retry. Reporting it in `batchItemFailures` would hold its shard and, with
`BisectBatchOnFunctionError`, AWS "bisects at the returned sequence number and retries only the
remaining records": its healthy later neighbours would be dead-lettered with it. So the relay parks
it here itself, with everything needed to inspect or republish it, and moves on.

The message body (JSON, `kind` = "outbox-poison", `version` = 1), the same for either store:
    eventId, sequenceNumber, streamArn, reason, details, parkedAt,
    item   the record exactly as its store delivered it: a DynamoDB outbox item as the stream delivered
           it (attribute-value form), or a PostgreSQL outbox row (`store` = "postgres", `position`, ...);
    itemOmitted / key   when the item is too large for one queue message: only its key (the item's
                        key in its table, which holds it until its TTL; or the row's store, position
                        and event id), and the item stays readable in its store;
    detailsOmitted      when even that is too large (details no relay builds: the envelope's content
                        they quote is cut to a thousand characters): no details, and an event id or
                        reason longer than any store keys cut. What redrive needs (the position, the
                        key, the stream) is never left out, so every poison record can be parked.
The position is the record's: a stream record's sequenceNumber and streamArn, or a row's position as
sequenceNumber (streamArn null).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from shop.adapters import aws
from shop.domain.envelope import format_time, now
from shop.domain.poison import ParkedPoison, PoisonPosition, PoisonRecord, RowPosition, StreamPosition

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

POISON_KIND = "outbox-poison"
# SQS accepts 256 KiB per message (1 MiB since 2025 in some regions): stay under the smaller limit. The
# message attributes count toward it, each its name, data type and value (SendMessage).
MAX_MESSAGE_BYTES = 262_144
# What SQS refuses in a message, body or attribute value: anything but #x9 | #xA | #xD | #x20-#xD7FF |
# #xE000-#xFFFD | #x10000-#x10FFFF (SendMessage).
_REFUSED_BY_SQS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# An event id or reason longer than this is none a store keys (an item written by earlier code may carry
# any eventId attribute): cut in the attributes, and in a body that would not fit otherwise.
_LONGEST_KEPT_ID = 4_096


def _message_text(body: dict[str, Any]) -> tuple[str, int]:
    """The body as JSON and its size in bytes. UTF-8 as it is, unless it holds what UTF-8 cannot encode (a
    lone surrogate, which a DynamoDB string may hold): then every non-ASCII character escaped, so the
    record is still parked whole instead of failing its batch. U+FFFE and U+FFFF, valid in a DynamoDB
    string, are outside the characters SQS accepts in a message (#x9 | #xA | #xD | #x20-#xD7FF |
    #xE000-#xFFFD | #x10000-#x10FFFF: SendMessage): always escaped (JSON escapes the controls itself)."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("\ufffe", "\\ufffe").replace("\uffff", "\\uffff")
    try:
        return text, len(text.encode())
    except UnicodeEncodeError:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=True)
        return text, len(text)


def poison_message_attributes(record: PoisonRecord) -> dict[str, MessageAttributeValueTypeDef]:
    """The message's attributes (for a look at the queue without decoding bodies): the event id and the
    reason's start, what SQS refuses in them escaped as JSON would (\\uXXXX), an empty one left out (SQS
    refuses empty values). The body holds both as they are (unless detailsOmitted)."""
    values = {"eventId": record.event_id[:_LONGEST_KEPT_ID], "reason": record.reason[:256]}
    return {
        name: {"DataType": "String", "StringValue": _REFUSED_BY_SQS.sub(_escaped, value)}
        for name, value in values.items()
        if value
    }


def _escaped(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def _attributes_bytes(attributes: dict[str, MessageAttributeValueTypeDef]) -> int:
    return sum(
        len(name.encode()) + len(value["DataType"].encode()) + len(value.get("StringValue", "").encode())
        for name, value in attributes.items()
    )


def poison_message_body(record: PoisonRecord) -> str:
    """Encode: the message of a record parked whole, or by its key when too large for one message with its
    attributes, or, when even that is too large, by its key without its details: never larger than SQS
    takes, or the record could never be parked and would hold its shard or its order until it expired."""
    room = MAX_MESSAGE_BYTES - _attributes_bytes(poison_message_attributes(record))
    body: dict[str, Any] = {
        "kind": POISON_KIND,
        "version": 1,
        "eventId": record.event_id,
        "sequenceNumber": record.position.marker,
        "streamArn": record.position.stream_arn if isinstance(record.position, StreamPosition) else None,
        "reason": record.reason,
        "details": record.details,
        "parkedAt": format_time(now()),
        "item": record.image,
    }
    text, size = _message_text(body)
    if size <= room:
        return text
    del body["item"]
    body["itemOmitted"] = _OMITTED[record.store]
    body["key"] = record.key
    text, size = _message_text(body)
    if size <= room:
        return text
    # Only what finds the record again. Its key and position are what its store allows (a DynamoDB key at
    # most 3 KB; an outbox row's event id what its unique index takes, 2,704 bytes once compressed, some
    # 230 KB of a repetitive id, which its key alone then holds whole: parked_poison reads it there), so
    # this fits whatever the record holds.
    body["details"] = {}
    body["detailsOmitted"] = "larger than one queue message; the record's key finds it in its store"
    body["eventId"] = _cut(record.event_id, _LONGEST_KEPT_ID)
    body["reason"] = _cut(record.reason, _LONGEST_KEPT_ID)
    return _message_text(body)[0]


def _cut(text: str, characters: int) -> str:
    return text if len(text) <= characters else f"{text[:characters]}... ({len(text) - characters} more cut)"


_OMITTED = {
    StreamPosition.store: "larger than one queue message; read it from the table by key before its TTL",
    RowPosition.store: "larger than one queue message; the row stays in the order database's outbox",
}


def checked_poison_message(body: object) -> dict[str, Any]:
    """A decoded poison queue message body, checked for the fields redrive relies on."""
    if not isinstance(body, dict) or body.get("kind") != POISON_KIND:
        raise ValueError("not an outbox poison message")
    if body.get("item") is None and body.get("key") is None:
        raise ValueError("poison message holds neither the item nor its key")
    return body


def parked_poison(body: dict[str, Any]) -> ParkedPoison:
    """Decode: the parked record of a message body (checked_poison_message checks it first). A row of the
    PostgreSQL outbox says so in its item, or its key (`store`); anything else is a stream record."""
    image = body.get("item")
    key = body.get("key")
    key = key if isinstance(key, dict) else {}
    held = image if isinstance(image, dict) else key if image is None else {}
    position: PoisonPosition
    event_id = str(body.get("eventId"))
    if held.get("store") == RowPosition.store:
        at = held.get("position")
        position = RowPosition(at if isinstance(at, int) else -1)
        # The row's own id, whole: the smallest message cuts the body's, and the order database finds a
        # parked row by its id.
        whole = held.get("eventId")
        event_id = whole if isinstance(whole, str) else event_id
    else:
        arn = body.get("streamArn")
        position = StreamPosition(
            str(body.get("sequenceNumber") or ""), arn if isinstance(arn, str) else None
        )
    return ParkedPoison(event_id=event_id, position=position, image=image, key=key)


class PoisonQueue:
    """The relay's poison queue (SQS)."""

    def __init__(self, queue_url: str) -> None:
        self._queue_url = queue_url

    def park(self, record: PoisonRecord) -> None:
        aws.sqs().send_message(
            QueueUrl=self._queue_url,
            MessageBody=poison_message_body(record),
            MessageAttributes=poison_message_attributes(record),
        )
