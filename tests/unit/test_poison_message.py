"""The relays' poison queue message: a parked record whole, whatever its strings hold, in the one format
messages already parked on a deployment hold (so they stay redrivable)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

import shop.adapters.aws
import shop.adapters.poison_queue
from shop.adapters.dynamodb import keys
from shop.adapters.poison_queue import (
    MAX_MESSAGE_BYTES,
    PoisonQueue,
    checked_poison_message,
    parked_poison,
    poison_message_body,
)
from shop.domain.poison import PoisonRecord, RowPosition, StreamPosition


def record(payload: str) -> PoisonRecord:
    image = {"PK": {"S": "OUTBOX#o-1"}, "SK": {"S": "EVENT#1"}, "payload": {"S": payload}}
    return PoisonRecord(StreamPosition("1"), "e-1", "not a CloudEvent", image, keys.item_key(image))


def test_a_record_holding_a_lone_surrogate_is_parked_whole_with_its_string_escaped():
    """A DynamoDB string may hold a lone surrogate, which UTF-8 cannot encode: the message escapes it
    (valid JSON, ASCII) instead of failing the relay's batch, and decodes to the same record."""
    body = poison_message_body(record("bad \ud800 text, café"))

    assert body.isascii()
    decoded = checked_poison_message(json.loads(body))
    assert decoded["item"]["payload"] == {"S": "bad \ud800 text, café"}


# SendMessage's characters: #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF
SQS_CHARACTERS = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


@pytest.mark.parametrize("character", ["\ufffe", "\uffff", "\x01"], ids=["U+FFFE", "U+FFFF", "a-control"])
def test_a_record_holding_a_character_sqs_refuses_is_parked_whole_with_it_escaped(character: str):
    """Valid in a DynamoDB string, refused in an SQS message (InvalidMessageContents): sent raw, the record
    could not be parked and held its shard for the record age limit."""
    body = poison_message_body(record(f"odd {character} text, café"))

    assert SQS_CHARACTERS.fullmatch(body)
    assert "café" in body  # the rest stays UTF-8
    decoded = checked_poison_message(json.loads(body))
    assert decoded["item"]["payload"] == {"S": f"odd {character} text, café"}


def test_other_text_stays_utf_8_as_it_is():
    body = poison_message_body(record("café ☕"))

    assert "café ☕" in body
    assert len(body.encode()) <= MAX_MESSAGE_BYTES


# --- the format, as the relays wrote it before the poison record named its store ----------------------------
ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/Orders/stream/2026-11-20T00:00:00.000"
ITEM = {
    "PK": {"S": "ORDER#o-1"},
    "SK": {"S": "OUTBOX#000000000001#e-1"},
    "eventId": {"S": "e-1"},
    "envelope": {"S": "not json, café"},
}
ROW = {
    "store": "postgres",
    "position": 7,
    "eventId": "e-7",
    "aggregateId": "o-1",
    "sequence": 1,
    "envelope": "not json",
    "traceHeader": None,
    "createdAt": "2026-11-20T09:00:00+00:00",
    "attempts": 1,
}
ROW_KEY = {"store": "postgres", "position": 7, "eventId": "e-7"}
# Written by the relays' code before this change (the same records, the same clock), byte for byte.
WRITTEN_BEFORE = {
    "stream record": (
        '{"kind":"outbox-poison","version":1,"eventId":"e-1","sequenceNumber":"4960000000000000000001",'
        '"streamArn":"arn:aws:dynamodb:eu-west-1:123456789012:table/Orders/stream/2026-11-20T00:00:00.000",'
        '"reason":"not a CloudEvent","details":{"error":"x"},"parkedAt":"2026-11-20T09:30:00.000Z",'
        '"item":{"PK":{"S":"ORDER#o-1"},"SK":{"S":"OUTBOX#000000000001#e-1"},"eventId":{"S":"e-1"},'
        '"envelope":{"S":"not json, café"}}}'
    ),
    "stream record by key": (
        '{"kind":"outbox-poison","version":1,"eventId":"e-1","sequenceNumber":"4960000000000000000001",'
        '"streamArn":"arn:aws:dynamodb:eu-west-1:123456789012:table/Orders/stream/2026-11-20T00:00:00.000",'
        '"reason":"too large","details":{},"parkedAt":"2026-11-20T09:30:00.000Z",'
        '"itemOmitted":"larger than one queue message; read it from the table by key before its TTL",'
        '"key":{"PK":{"S":"ORDER#o-1"},"SK":{"S":"OUTBOX#000000000001#e-1"}}}'
    ),
    "outbox row": (
        '{"kind":"outbox-poison","version":1,"eventId":"e-7","sequenceNumber":"7","streamArn":null,'
        '"reason":"not a CloudEvent","details":{"outboxPosition":7},"parkedAt":"2026-11-20T09:30:00.000Z",'
        '"item":{"store":"postgres","position":7,"eventId":"e-7","aggregateId":"o-1","sequence":1,'
        '"envelope":"not json","traceHeader":null,"createdAt":"2026-11-20T09:00:00+00:00","attempts":1}}'
    ),
    "outbox row by key": (
        '{"kind":"outbox-poison","version":1,"eventId":"e-7","sequenceNumber":"7","streamArn":null,'
        '"reason":"too large","details":{"outboxPosition":7},"parkedAt":"2026-11-20T09:30:00.000Z",'
        '"itemOmitted":"larger than one queue message; the row stays in the order database\'s outbox",'
        '"key":{"store":"postgres","position":7,"eventId":"e-7"}}'
    ),
}
RECORDS = {
    "stream record": PoisonRecord(
        StreamPosition("4960000000000000000001", ARN),
        "e-1",
        "not a CloudEvent",
        ITEM,
        keys.item_key(ITEM),
        {"error": "x"},
    ),
    "stream record by key": PoisonRecord(
        StreamPosition("4960000000000000000001", ARN),
        "e-1",
        "too large",
        {**ITEM, "pad": {"S": "x" * 300_000}},
        keys.item_key(ITEM),
    ),
    "outbox row": PoisonRecord(
        RowPosition(7), "e-7", "not a CloudEvent", ROW, ROW_KEY, {"outboxPosition": 7}
    ),
    "outbox row by key": PoisonRecord(
        RowPosition(7), "e-7", "too large", {**ROW, "envelope": "x" * 300_000}, ROW_KEY, {"outboxPosition": 7}
    ),
}


@pytest.mark.parametrize("case", sorted(WRITTEN_BEFORE))
def test_the_message_is_byte_for_byte_the_one_written_before(monkeypatch: pytest.MonkeyPatch, case: str):
    monkeypatch.setattr(shop.adapters.poison_queue, "now", lambda: datetime(2026, 11, 20, 9, 30, tzinfo=UTC))

    assert poison_message_body(RECORDS[case]) == WRITTEN_BEFORE[case]


@pytest.mark.parametrize(
    ("case", "position", "image", "key"),
    [
        ("stream record", StreamPosition("4960000000000000000001", ARN), ITEM, {}),
        ("stream record by key", StreamPosition("4960000000000000000001", ARN), None, keys.item_key(ITEM)),
        ("outbox row", RowPosition(7), ROW, {}),
        ("outbox row by key", RowPosition(7), None, ROW_KEY),
    ],
)
def test_a_message_parked_before_decodes_to_its_store_position_and_image(
    case: str, position: StreamPosition | RowPosition, image: dict[str, Any] | None, key: dict[str, Any]
):
    parked = parked_poison(checked_poison_message(json.loads(WRITTEN_BEFORE[case])))

    assert (parked.event_id, parked.position, parked.image, parked.key) == (
        RECORDS[case].event_id,
        position,
        image,
        key,
    )
    assert parked.position.store == ("postgres" if "row" in case else "dynamodb")


def test_a_message_without_a_stream_decodes_to_a_stream_position_without_one():
    """A record redrive parked out of the table (no sequence number, the batch's stream)."""
    parked = parked_poison({"kind": "outbox-poison", "eventId": "e-1", "sequenceNumber": "", "item": ITEM})

    assert parked.position == StreamPosition("", None)


class RecordingSqs:
    """What PoisonQueue.park sends, checked as SendMessage checks it: every character of the body and of
    each attribute value, and the body with the attributes (name, type, value) within the size limit."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **request: Any) -> dict[str, str]:
        size = len(request["MessageBody"].encode())
        assert SQS_CHARACTERS.fullmatch(request["MessageBody"])
        for name, value in request["MessageAttributes"].items():
            assert value["StringValue"], f"SQS refuses an empty attribute value ({name})"
            assert SQS_CHARACTERS.fullmatch(value["StringValue"]), (name, value["StringValue"])
            size += len(name.encode()) + len(value["DataType"].encode()) + len(value["StringValue"].encode())
        assert size <= MAX_MESSAGE_BYTES, f"{size} bytes: SQS refuses the message"
        self.sent.append(request)
        return {"MessageId": "m-1"}


def park(monkeypatch: pytest.MonkeyPatch, parked: PoisonRecord) -> dict[str, Any]:
    sqs = RecordingSqs()
    monkeypatch.setattr(shop.adapters.aws, "sqs", lambda: sqs)
    PoisonQueue("https://sqs.invalid/poison").park(parked)
    [request] = sqs.sent
    return request


def row_record(event_id: str, envelope: str) -> PoisonRecord:
    row = {**ROW, "eventId": event_id, "envelope": envelope}
    return PoisonRecord(RowPosition(7), event_id, "not a CloudEvent", row, {**ROW_KEY, "eventId": event_id})


def test_a_record_whose_body_alone_just_fits_is_parked_by_its_key_not_refused(
    monkeypatch: pytest.MonkeyPatch,
):
    # The largest envelope this code still parks whole, then the next 100 sizes: the message attributes
    # count toward SQS's limit, so a body that fits alone must not go out with them.
    low, high = 1, MAX_MESSAGE_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        whole = '"item"' in poison_message_body(row_record("e-7", "x" * middle))
        low, high = (middle, high) if whole else (low, middle - 1)
    for size in range(low, low + 100):
        request = park(monkeypatch, row_record("e-7", "x" * size))
        assert checked_poison_message(json.loads(request["MessageBody"]))["eventId"] == "e-7"


@pytest.mark.parametrize(
    "event_id", ["", "odd \uffff id", "lone \ud800"], ids=["empty", "U+FFFF", "surrogate"]
)
def test_a_record_whose_event_id_sqs_refuses_as_an_attribute_is_parked_whole(
    monkeypatch: pytest.MonkeyPatch, event_id: str
):
    request = park(monkeypatch, row_record(event_id, "not json"))

    # The body holds the event id as it is; the attribute is escaped, or left out when empty
    assert checked_poison_message(json.loads(request["MessageBody"]))["eventId"] == event_id
    assert ("eventId" in request["MessageAttributes"]) is bool(event_id)


# Details no relay builds (it cuts what it quotes of an envelope): a lone surrogate makes the message
# escape every character, each of these 12 bytes, so they are over 1 MB in the message.
HUGE_DETAILS = {"time": "\ud800" + "\U0001f600" * 97_000}
TOO_LARGE_EVERY_WAY = {
    "stream record": PoisonRecord(
        StreamPosition("4960000000000000000001", ARN),
        "e-1",
        "not a CloudEvent",
        {**ITEM, "envelope": {"S": "x" * 300_000}},
        keys.item_key(ITEM),
        HUGE_DETAILS,
    ),
    "outbox row": PoisonRecord(
        RowPosition(7), "e-7", "not a CloudEvent", {**ROW, "envelope": "x" * 300_000}, ROW_KEY, HUGE_DETAILS
    ),
}


@pytest.mark.parametrize("case", sorted(TOO_LARGE_EVERY_WAY))
def test_a_record_whose_details_do_not_fit_either_is_parked_by_its_key_without_them(
    monkeypatch: pytest.MonkeyPatch, case: str
):
    """Without its item the message was still over SQS's limit: SendMessage refused it, the relay took the
    poison queue for unavailable and held the shard (or the order) at the record until it expired."""
    parked = TOO_LARGE_EVERY_WAY[case]

    request = park(monkeypatch, parked)

    body = checked_poison_message(json.loads(request["MessageBody"]))
    assert (body["details"], body["reason"]) == ({}, "not a CloudEvent")
    assert "larger than one queue message" in body["detailsOmitted"]
    found = parked_poison(body)  # what redrive-poison finds it by
    assert (found.event_id, found.position, found.image, found.key) == (
        parked.event_id,
        parked.position,
        None,
        parked.key,
    )


def test_a_record_whose_event_id_no_store_keys_is_parked_with_it_cut(monkeypatch: pytest.MonkeyPatch):
    """An item written by earlier code names its event in any eventId attribute: 300 KB of it went out
    twice, in the body and as an attribute, and the message could never be sent."""
    image = {**ITEM, "SK": {"S": "OUTBOX#"}, "eventId": {"S": "e" * 300_000}}
    parked = PoisonRecord(StreamPosition("1", ARN), "e" * 300_000, "no id", image, keys.item_key(image))

    request = park(monkeypatch, parked)

    body = checked_poison_message(json.loads(request["MessageBody"]))
    assert body["eventId"] == "e" * 4_096 + "... (295904 more cut)"
    assert body["key"] == keys.item_key(image)  # still found by its key


def test_an_outbox_row_whose_event_id_is_cut_in_its_message_is_found_by_its_whole_id(
    monkeypatch: pytest.MonkeyPatch,
):
    """The order database's unique index takes an id of some 230 KB (compressed): the smallest message cuts
    the body's eventId, and redrive-poison asked the database for the cut id, found nothing, and called a
    row still in the outbox impossible to republish."""
    event_id = "a" * 200_000
    row = {**ROW, "eventId": event_id, "envelope": "{}"}
    key = {**ROW_KEY, "eventId": event_id}
    parked = PoisonRecord(RowPosition(7), event_id, "not a CloudEvent", row, key, {})

    request = park(monkeypatch, parked)

    body = checked_poison_message(json.loads(request["MessageBody"]))
    assert body["eventId"] != event_id  # cut, so that the message fits
    assert parked_poison(body).event_id == event_id
