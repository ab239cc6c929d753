"""The poison corpus: records an outbox can hold that every reader must survive (the relay parks them).

Each entry is an outbox envelope as a writer could store it, in both stores where the store accepts it:
the `envelope` attribute of a DynamoDB outbox item (any attribute type, any text DynamoDB stores) and the
`envelope` column of a PostgreSQL outbox row (`json`: PostgreSQL itself refuses text that is not JSON, and
text that is not UTF-8). None of them is a CloudEvent the relay could publish, so each one is poison: the
relay (or the polling publisher) parks it in the poison queue, and every reader after it (the stream
poller, the console, the inspector) sees the record as it is.

What each one breaks in a careless reader:
    long-integer       json.loads and str() raise ValueError past Python's 4,300-digit limit
    deep-nesting       json.loads raises RecursionError (Python's limit is 1,000 frames)
    lone-surrogate     a "\\ud800" escape decodes to a lone surrogate, which no UTF-8 stream can write
    control-characters escape sequences that would drive the terminal, a NUL, a bidi override
    not-json           text that is no JSON at all
    not-utf8           bytes that are not UTF-8 (a binary attribute: DynamoDB only)
    wrong-types        JSON whose fields have the wrong types (a list for the type, an object for the id)
    huge-text          a 300,000-character field in a 400 KB item
    no-envelope        an outbox item without the attribute (DynamoDB only)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from shop.adapters.dynamodb import keys

LONG_INTEGER_DIGITS = 5_000
NESTING_DEPTH = 100_000
POSTGRES_NESTING_DEPTH = (
    12_000  # past Python 3.13's json limit (10,000), within PostgreSQL's (max_stack_depth 2 MB)
)
HUGE_TEXT_CHARS = 300_000
REAL_ORDER_SEQUENCE = 1_000_000
# The SQL the polling publisher's outbox takes a row by (docs/order-database.sql).
INSERT_OUTBOX_ROW = (
    "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
    " VALUES (%(event_id)s, %(aggregate_id)s, %(sequence)s, 'OrderCreated', %(envelope)s)"
)
LONG_INTEGER = "long-integer"


def _envelope(event_id: str, aggregate: str, **fields: Any) -> dict[str, Any]:
    """A CloudEvent's first fields and no sequence: never publishable, whatever else it holds."""
    return {"specversion": "1.0", "id": event_id, "type": "OrderCreated", "subject": aggregate, **fields}


def _with_raw(document: dict[str, Any], name: str, raw_json: str) -> str:
    """The document's JSON with one more field whose value is written as is (`raw_json`)."""
    text = json.dumps(document)
    return f'{text[:-1]}, "{name}": {raw_json}}}'


@dataclass(frozen=True)
class PoisonRecord:
    """One outbox record of the corpus: its envelope in each store that can hold it."""

    name: str
    event_id: str
    aggregate_id: str
    dynamodb: dict[str, Any] | None  # the item's `envelope` attribute (None: the item has none)
    postgres: str | None  # the row's `envelope` (None: PostgreSQL cannot hold this one)
    sequence: int = 1

    def of_order(self, order_id: str, index: int = 0) -> PoisonRecord:
        """The same kind of record in a real order's outbox, with an event id of its own, far past any
        sequence the order reaches (so it takes no event's place): the `index`th one there."""
        return replace(_record(self.name, order_id), sequence=REAL_ORDER_SEQUENCE + index)

    def dynamodb_item(self) -> dict[str, Any]:
        """The outbox item to put in the orders table (in its order's partition)."""
        key = keys.outbox_key(keys.order_partition(self.aggregate_id), self.sequence, self.event_id)
        item: dict[str, Any] = {
            **key,
            "eventId": {"S": self.event_id},
            "eventType": {"S": "OrderCreated"},
            "aggregateId": {"S": self.aggregate_id},
            "sequence": {"N": str(self.sequence)},
        }
        if self.dynamodb is not None:
            item["envelope"] = self.dynamodb
        return item

    def postgres_row(self) -> dict[str, Any]:
        """The values of an outbox row (event_id, aggregate_id, sequence, envelope)."""
        assert self.postgres is not None, f"{self.name}: PostgreSQL cannot hold it"
        return {
            "event_id": self.event_id,
            "aggregate_id": self.aggregate_id,
            "sequence": self.sequence,
            "envelope": self.postgres,
        }


def corpus() -> list[PoisonRecord]:
    """The corpus, one record of each kind, each with a fresh event id and an aggregate of its own."""
    return [_record(name, f"poison-{name}-{uuid.uuid4().hex[:8]}") for name in _BUILDERS]


def raw_surrogate() -> PoisonRecord:
    """An item whose envelope text itself holds a lone surrogate (DynamoDB Local stores it: boto3 sends
    it as a JSON escape). Not in corpus(): the relay fails on it instead of parking it (its test says why)."""
    event_id, aggregate = str(uuid.uuid4()), f"poison-raw-surrogate-{uuid.uuid4().hex[:8]}"
    text = json.dumps(_envelope(event_id, aggregate), ensure_ascii=False).replace(
        "OrderCreated", "Order\ud800"
    )
    return PoisonRecord("raw-surrogate", event_id, aggregate, {"S": text}, None)


def _record(name: str, aggregate: str) -> PoisonRecord:
    event_id = str(uuid.uuid4())
    dynamodb, postgres = _BUILDERS[name](event_id, aggregate)
    return PoisonRecord(name, event_id, aggregate, dynamodb, postgres)


def _long_integer(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    text = _with_raw(
        _envelope(event_id, aggregate), "data", '{"quantity": ' + "9" * LONG_INTEGER_DIGITS + "}"
    )
    return {"S": text}, text


def _deep_nesting(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    def nested(depth: int) -> str:
        return _with_raw(_envelope(event_id, aggregate), "data", "[" * depth + "]" * depth)

    return {"S": nested(NESTING_DEPTH)}, nested(POSTGRES_NESTING_DEPTH)


def _lone_surrogate(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    # The escape as JSON text (ASCII): it decodes to U+D800 alone.
    text = json.dumps(_envelope(event_id, aggregate)).replace('"OrderCreated"', '"Order\\ud800Created"')
    return {"S": text}, text


def _control_characters(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    kind = "\x1b[2J\x1b[31mOrderCreated\x00\u202e\r"
    text = json.dumps(_envelope(event_id, aggregate, type=kind))  # as \u escapes: the column takes them
    return {"S": text}, text


def _not_json(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    return {"S": '{"specversion": "1.0", "id": "' + event_id + '", poison: not JSON'}, None


def _not_utf8(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    return {"B": b'\xff\xfe{"id": "' + event_id.encode() + b'"}\xc3\x28'}, None


def _wrong_types(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    text = json.dumps(
        _envelope(event_id, aggregate, type=["OrderCreated"], data={"id": {"nested": [1.5e308]}})
    )
    return {"S": text}, text


def _huge_text(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    text = json.dumps(_envelope(event_id, aggregate, type="Order" + "x" * HUGE_TEXT_CHARS))
    return {"S": text}, text


def _no_envelope(event_id: str, aggregate: str) -> tuple[dict[str, Any] | None, str | None]:
    return None, None


_BUILDERS = {
    LONG_INTEGER: _long_integer,
    "deep-nesting": _deep_nesting,
    "lone-surrogate": _lone_surrogate,
    "control-characters": _control_characters,
    "not-json": _not_json,
    "not-utf8": _not_utf8,
    "wrong-types": _wrong_types,
    "huge-text": _huge_text,
    "no-envelope": _no_envelope,
}
