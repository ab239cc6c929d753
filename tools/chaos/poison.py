"""Poison pills on purpose: undecodable outbox items in the tables, malformed messages on consumer queues.

An outbox item is written straight into a table (keys from shop.adapters.dynamodb.keys, like any
outbox item), so its stream record reaches the relay, which cannot decode it: the relay parks it whole
in its poison queue and moves on (the relay dead-letter queue stays empty). A malformed message is sent
straight to a consumer's queue: it fails on every receive and SQS moves it to the consumer's dead-letter
queue. Each is written to the ledger, and the checks expect exactly these in the poison and dead-letter
queues.

With OrderStore=postgres, poison rows go into the order database's outbox table instead
(tools/chaos/postgres_store.py writes them; postgres_envelope builds them): JSON that is not a
CloudEvent, or a CloudEvent larger than MaxEventBytes (the column is `json`, so not-JSON cannot be
stored). The polling publisher parks them in the same poison queue and marks them parked.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import ENVELOPE
from shop.domain.envelope import CloudEvent, format_time, now
from shop.domain.orders import EVENT_SOURCE as ORDERS_SOURCE
from tools.chaos.ledger import Ledger
from tools.local.stack import LocalStack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

NOT_JSON, INVALID_ENVELOPE, NO_ENVELOPE = "not-json", "invalid-envelope", "no-envelope"
NOT_A_CLOUDEVENT = "not-a-cloudevent"
OVERSIZE = "oversize"  # a CloudEvent of this system, larger than MaxEventBytes
POSTGRES_OUTBOX = "outbox"  # PoisonItem.table of a row of the order database's outbox


@dataclass(frozen=True)
class PoisonItem:
    table: str  # logical id
    pk: str
    sk: str
    event_id: str
    variant: str
    real_order: bool = False  # a row of an order that exists (postgres), not of a made-up aggregate


@dataclass(frozen=True)
class MalformedMessage:
    queue: str  # logical id
    function: str
    marker: str
    body: str
    variant: str


def _envelope(variant: str, event_id: str) -> dict[str, Any]:
    if variant == NOT_JSON:
        return {ENVELOPE: {"S": '{"specversion": "1.0", "id": "' + event_id + '", chaos: not JSON'}}
    if variant == INVALID_ENVELOPE:
        # JSON, but not a CloudEvent of this system: no sequence, no subject, no data.
        return {ENVELOPE: {"S": json.dumps({"specversion": "1.0", "id": event_id, "type": "OrderCreated"})}}
    return {}  # NO_ENVELOPE


def postgres_envelope(
    variant: str, event_id: str, aggregate: str, sequence: int, max_event_bytes: int
) -> str:
    """The envelope text of a poison outbox row: valid JSON (the column is `json`), never publishable."""
    if variant == INVALID_ENVELOPE:
        # A CloudEvent's first fields, no subject, no sequence, no data.
        return json.dumps({"specversion": "1.0", "id": event_id, "type": "OrderCreated"})
    if variant != OVERSIZE:
        raise ValueError(f"no poison row of variant {variant!r}")
    event = CloudEvent(
        id=event_id,
        source=ORDERS_SOURCE,
        type="OrderCreated",
        subject=aggregate,
        time=format_time(now()),
        sequence=sequence,
        correlationid=event_id,
        data={"orderId": aggregate, "padding": ""},
    )
    # Past the limit by a little: the row still fits one poison queue message, so it is parked whole.
    event.data["padding"] = "x" * max(0, max_event_bytes + 1 - event.entry_size())
    return event.to_json()


def write_poison_item(
    dynamodb: DynamoDBClient, stack: LocalStack, ledger: Ledger, table: str, variant: str
) -> PoisonItem:
    """An outbox item of an aggregate that does not exist, which the relay cannot decode."""
    event_id = str(uuid.uuid4())
    aggregate = f"chaos-poison-{uuid.uuid4().hex[:12]}"
    partition = (
        keys.reservation_partition(aggregate)
        if table == "InventoryTable"
        else keys.order_partition(aggregate)
    )
    key = keys.outbox_key(partition, 1, event_id)
    # As the writers shape an outbox item (shop/adapters/dynamodb/outbox_items.py): what the event is
    # lives in its envelope and key only, so the relay names the poison by its key's event id.
    item: dict[str, Any] = {**key, **_envelope(variant, event_id)}
    dynamodb.put_item(TableName=stack.template.physical_name(table), Item=item)
    poison = PoisonItem(table, key[keys.PK]["S"], key[keys.SK]["S"], event_id, variant)
    ledger.append(
        "poison.outbox_item",
        "OutboxRelayFunction",
        "PutItem",
        table=table,
        event_ids=[event_id],
        variant=variant,
    )
    return poison


def send_malformed_message(
    stack: LocalStack, ledger: Ledger, queue: str, function: str, variant: str
) -> MalformedMessage:
    marker = f"chaos-malformed-{uuid.uuid4().hex[:12]}"
    if variant == NOT_JSON:
        body = f"{marker}: this is not JSON {{"
    else:
        # An EventBridge event whose detail is not a CloudEvent (no id, no sequence, no data).
        body = json.dumps(
            {
                "version": "0",
                "id": marker,
                "detail-type": "OrderCreated",
                "source": "shop.orders",
                "chaosMarker": marker,
                "detail": {"specversion": "1.0", "type": "OrderCreated"},
            }
        )
    stack.clients.sqs().send_message(QueueUrl=stack.queue_url(queue), MessageBody=body)
    ledger.append(
        "poison.malformed_message", function, "SendMessage", queue=queue, marker=marker, variant=variant
    )
    return MalformedMessage(queue, function, marker, body, variant)
