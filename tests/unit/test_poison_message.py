"""The relay poison queue's message: a parked record whole, whatever its strings hold."""

from __future__ import annotations

import json

from shop.adapters.poison_queue import MAX_MESSAGE_BYTES, checked_poison_message, poison_message_body
from shop.domain.poison import PoisonRecord


def record(payload: str) -> PoisonRecord:
    image = {"PK": {"S": "OUTBOX#o-1"}, "SK": {"S": "EVENT#1"}, "payload": {"S": payload}}
    return PoisonRecord("1", "e-1", "not a CloudEvent", image)


def test_a_record_holding_a_lone_surrogate_is_parked_whole_with_its_string_escaped():
    """A DynamoDB string may hold a lone surrogate, which UTF-8 cannot encode: the message escapes it
    (valid JSON, ASCII) instead of failing the relay's batch, and decodes to the same record."""
    body = poison_message_body(record("bad \ud800 text, café"))

    assert body.isascii()
    decoded = checked_poison_message(json.loads(body))
    assert decoded["item"]["payload"] == {"S": "bad \ud800 text, café"}


def test_other_text_stays_utf_8_as_it_is():
    body = poison_message_body(record("café ☕"))

    assert "café ☕" in body
    assert len(body.encode()) <= MAX_MESSAGE_BYTES
