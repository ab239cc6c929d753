"""What a chaos run reads of the stack's state: the order store and the InventoryTable in full, and the
dead-letter queues.

collect() reads the stores (tables scanned in full, consistently) into a Snapshot. The order store is
read through an OrderStore: DynamoOrderStore (the OrdersTable, the default) or
tools/chaos/postgres_store.PostgresOrderStore (OrderStore=postgres: orders, request keys, the outbox
rows with their publishing state and the inbox, in PostgreSQL). Inventory is always the InventoryTable.
A record's `table` is its side of the saga (ORDERS_SIDE, INVENTORY_SIDE), whichever store keeps it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from boto3.dynamodb.types import TypeDeserializer

from operations.recovery import FailedStreamBatch
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import ENVELOPE
from tools.local.stack import LocalStack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

_DESERIALIZER = TypeDeserializer()
# The sides of the saga, named after their DynamoDB tables (logical ids); the order side is read from
# PostgreSQL when the order store is there.
ORDERS_SIDE, INVENTORY_SIDE = "OrdersTable", "InventoryTable"
# What the PostgreSQL outbox records of a row (OutboxRecord.state). With PostgresRelay=logical the slot
# is the bookmark: a row it still holds is PENDING, one it has moved past PUBLISHED (postgres_store.py).
PUBLISHED, PARKED, PENDING = "published", "parked", "pending"


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def scan(dynamodb: DynamoDBClient, table: str) -> list[dict[str, Any]]:
    """Every item of a table, in attribute-value form (consistent reads)."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**kwargs)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass(frozen=True)
class OutboxRecord:
    table: str  # the side (ORDERS_SIDE, INVENTORY_SIDE), whichever store keeps it
    pk: str
    sk: str
    envelope: dict[str, Any] | None  # None: undecodable
    # What the store records of its publishing: PUBLISHED, PARKED or PENDING (the PostgreSQL outbox); None
    # where it records nothing (a DynamoDB outbox item is published off the table's stream).
    state: str | None = None
    position: int | None = None  # the PostgreSQL row's position (commit order, roughly)
    created_at: float | None = None  # epoch seconds, when the store records it
    marked_at: float | None = None  # when it was marked published or parked
    item: dict[str, Any] | None = field(default=None, compare=False)  # the row as it is parked

    @property
    def live(self) -> bool:
        """An event of a committed change, to be published: decodable and not parked as poison."""
        return self.envelope is not None and self.state != PARKED


def postgres_row_key(aggregate_id: str, sequence: int, event_id: str) -> tuple[str, str]:
    """The (pk, sk) a PostgreSQL outbox row goes by in the checks (unique, as (aggregate, sequence) is)."""
    return aggregate_id, f"{sequence:012d}#{event_id}"


@dataclass
class Snapshot:
    order_store: str = "dynamodb"
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    request_orders: dict[str, list[str]] = field(default_factory=dict)  # request key PK -> order ids
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)
    stock: dict[str, int] = field(default_factory=dict)
    outbox: list[OutboxRecord] = field(default_factory=list)
    other_items: int = 0
    inbox: list[tuple[str, str]] = field(default_factory=list)  # (consumer, event id): PostgreSQL only
    # PostgresRelay=logical: the outbox rows the replication slot still holds (None: no slot is read).
    slot_rows: int | None = None

    def decodable(self) -> dict[str, OutboxRecord]:
        """The events to be published, by id: decodable, and not parked (parked rows are poison, which
        the dead-letter check holds to what was injected)."""
        return {str(r.envelope["id"]): r for r in self.outbox if r.envelope is not None and r.live}

    def history(self, table: str) -> dict[str, list[dict[str, Any]]]:
        """Outbox envelopes per aggregate (subject) of one side, in sequence order."""
        by_aggregate: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.outbox:
            if record.table == table and record.envelope is not None and record.live:
                by_aggregate[str(record.envelope["subject"])].append(record.envelope)
        for envelopes in by_aggregate.values():
            envelopes.sort(key=lambda e: int(e["sequence"]))
        return by_aggregate


def _envelope_of(item: dict[str, Any]) -> dict[str, Any] | None:
    return envelope_of(item.get(ENVELOPE, {}).get("S"))


def envelope_of(raw: object) -> dict[str, Any] | None:
    """A stored envelope, decoded; None when it is not one of this system's CloudEvents."""
    try:
        envelope = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    required = ("id", "type", "subject", "sequence")
    if not isinstance(envelope, dict) or any(name not in envelope for name in required):
        return None
    return envelope


class OrderStore(Protocol):
    """Where the orders are, as the checks read them: the orders (orderId, status, version, lines),
    their request keys (named as keys.request_key names them) and the order side's outbox."""

    name: str

    def read(self, snapshot: Snapshot) -> None:
        """Add the order store's orders, request keys and outbox records (and inbox) to `snapshot`."""
        ...


def _scan_into(snapshot: Snapshot, stack: LocalStack, table: str) -> None:
    for raw in scan(stack.clients.dynamodb(), stack.template.physical_name(table)):
        sort_key = raw[keys.SK]["S"]
        if keys.is_outbox_sort_key(sort_key):
            snapshot.outbox.append(OutboxRecord(table, raw[keys.PK]["S"], sort_key, _envelope_of(raw)))
            continue
        item = _plain({name: _DESERIALIZER.deserialize(value) for name, value in raw.items()})
        kind = item.get("entityType")
        if kind == "Order":
            snapshot.orders[item["orderId"]] = item
        elif kind == "RequestKey":
            snapshot.request_orders.setdefault(item[keys.PK], []).append(item["orderId"])
        elif kind == "Reservation":
            snapshot.reservations[item["orderId"]] = item
        elif kind == "Stock":
            snapshot.stock[item["sku"]] = int(item["available"])
        else:
            snapshot.other_items += 1


class DynamoOrderStore:
    """OrderStore for OrderStore=dynamodb: the OrdersTable, scanned in full."""

    name = "dynamodb"

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack

    def read(self, snapshot: Snapshot) -> None:
        _scan_into(snapshot, self._stack, ORDERS_SIDE)


def collect(stack: LocalStack, order_store: OrderStore | None = None) -> Snapshot:
    """The order store (the OrdersTable unless told) and the InventoryTable, read in full."""
    store = order_store or DynamoOrderStore(stack)
    snapshot = Snapshot(order_store=store.name)
    store.read(snapshot)
    _scan_into(snapshot, stack, INVENTORY_SIDE)
    return snapshot


# --- dead-letter queues -----------------------------------------------------------------------------
def read_dlq(stack: LocalStack, queue: str) -> list[str]:
    """Bodies of every message in a dead-letter queue; they are made visible again afterwards."""
    sqs = stack.clients.sqs()
    url = stack.queue_url(queue)
    bodies: dict[str, str] = {}
    handles: list[str] = []
    for _ in range(1000):  # bounded: 10,000 messages
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300, WaitTimeSeconds=0
        ).get("Messages", [])
        if not messages:
            break
        bodies.update({m["MessageId"]: m["Body"] for m in messages})
        handles.extend(m["ReceiptHandle"] for m in messages)
    for handle in handles:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    return list(bodies.values())


def stream_range_keys(streams: DynamoDBStreamsClient, batch: FailedStreamBatch) -> list[tuple[str, str]]:
    """Keys of the outbox INSERT records in a failed batch's sequence range, read back from the stream."""
    iterator: str | None = streams.get_shard_iterator(
        StreamArn=batch.stream_arn,
        ShardId=batch.shard_id,
        ShardIteratorType="AT_SEQUENCE_NUMBER",
        SequenceNumber=batch.start_sequence_number,
    )["ShardIterator"]
    end = int(batch.end_sequence_number)
    found: list[tuple[str, str]] = []
    for _ in range(1000):
        if iterator is None:
            break
        page = streams.get_records(ShardIterator=iterator, Limit=1000)
        records = page.get("Records", [])
        for record in records:
            data = record["dynamodb"]
            if int(data["SequenceNumber"]) > end:
                return found
            image = data.get("NewImage") or {}
            sort_key = str(image.get(keys.SK, {}).get("S", ""))
            if record.get("eventName") == "INSERT" and keys.is_outbox_sort_key(sort_key):
                found.append((str(image[keys.PK]["S"]), sort_key))
        if not records:
            break
        iterator = page.get("NextShardIterator")
    return found
