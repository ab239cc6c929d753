"""Write cost on real DynamoDB Local: AWS write units per operation, itemised write by write.

Every DynamoDB call is metered by botocore hooks (the production code is unchanged): the items a write
touches are read before and after it through a client without the hooks, and each write is billed as
AWS documents it: per item, 1 unit per started KB of the larger of its before and after images, 2 in a
`TransactWriteItems`; plus each global secondary index the write enters, changes or leaves, 1 unit per
KB of the index entry. Whether AWS doubles index writes inside a transaction is not documented; the
headline figure (`wcu_aws`) doubles them (the upper bound; DynamoDB Local reports so), and
`wcu_aws_index_writes_single` does not (reported by third parties measuring real DynamoDB).

DynamoDB Local's own `ConsumedCapacity` is kept as `wcu_dynamodb_local`: it already doubles
transactional writes, but sizes a transaction per table rather than per item, so it is no bill. The
meter used until 2026-11-23 doubled that figure once more (`wcu_former_meter`, kept to compare).

Consumers run in this process on SQS events shaped as Lambda delivers them, with the trace header
Lambda sets under active tracing (it is written into every outbox item).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import boto3

from tools.bench.function_modules import load_function
from tools.local.runtime.context import LambdaContext
from tools.template import ROOT, Template

sys.path.insert(0, str(ROOT / "layers" / "shared"))

from shop.adapters import aws
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime import config

_CAPACITY_OPERATIONS = {"PutItem", "UpdateItem", "DeleteItem", "GetItem", "TransactWriteItems", "Query"}
_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"}
KB = 1024
# The shape of the header Lambda sets under active tracing (template Globals: Tracing: Active):
# Root, Parent, Sampled, and Lineage (recursive loop detection).
TYPICAL_TRACE_HEADER = (
    "Root=1-674a3c1e-5f0c2b7d4e6a8b9c1d2e3f40;Parent=3f6a1b2c4d5e6f70;Sampled=1;Lineage=1:8f3c2a1b:0"
)

Item = dict[str, Any]


def attribute_value_size(value: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for one attribute value (Developer Guide, "Item sizes and formats")."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(inner.encode())
    if kind == "B":
        return len(inner) if isinstance(inner, bytes) else len(inner.encode())
    if kind == "N":  # about 1 byte per 2 significant digits, plus 1
        digits = inner.lstrip("-").replace(".", "").strip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + attribute_value_size(v) for v in inner)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + attribute_value_size(v) for k, v in inner.items())
    if kind in ("SS", "NS", "BS"):
        return sum(attribute_value_size({kind[0]: v}) for v in inner)
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: Item | None) -> int:
    """An item's size as DynamoDB bills it: attribute names plus values, UTF-8 bytes."""
    return sum(len(name.encode()) + attribute_value_size(v) for name, v in (item or {}).items())


def units(size: int) -> int:
    """Write units of one item write, standard (1 per started KB; an empty item still costs 1)."""
    return max(1, math.ceil(size / KB))


def item_kind(table: str, key: Item) -> str:
    """A readable name for the item a write targets: table, and the entity its key names."""
    if "PK" not in key:
        return f"{table} idempotency record"
    partition, sort = key["PK"]["S"], key["SK"]["S"]
    if sort.startswith("OUTBOX#"):
        return f"{table} outbox item"
    return f"{table} {partition.split('#', 1)[0].lower()} item"


@dataclass
class Write:
    """One item written, and what AWS bills for it."""

    operation: str
    item: str
    bytes_before: int
    bytes_after: int
    transactional: bool
    conditional: bool
    indexes: list[str] = field(default_factory=list)
    units_aws: int = 0
    units_aws_index_writes_single: int = 0
    units_aws_item: int = 0  # of units_aws: the item's own write (doubled in a transaction)
    units_aws_indexes: int = 0  # of units_aws: its index entries' writes (doubled in a transaction)


def index_writes(
    index_keys: dict[str, list[str]], key: Item, before: Item | None, after: Item | None
) -> list[tuple[str, int]]:
    """(index, entry bytes) for every index the write puts an entry into, changes or removes from.

    All indexes here are KEYS_ONLY: an entry is the index keys plus the table keys, and it changes
    only when an index key attribute changes (AWS: one write to put or remove, two to move).
    """
    writes = []
    for name, attributes in index_keys.items():
        old = [before.get(a) for a in attributes] if before else None
        new = [after.get(a) for a in attributes] if after else None
        was = old is not None and None not in old
        now = new is not None and None not in new
        if (was or now) and old != new:
            source = after if now else before
            assert source is not None
            entry = {**key, **{a: source[a] for a in attributes}}
            writes += [(name, item_size(entry))] * (2 if was and now else 1)
    return writes


class DynamoMeter:
    """Counts DynamoDB calls by operation and lists every item written with its AWS write units."""

    def __init__(
        self, client: Any, tables: dict[str, str], index_keys: dict[str, dict[str, list[str]]]
    ) -> None:
        self.calls: Counter[str] = Counter()
        self.wcu_dynamodb_local = 0.0
        self.wcu_former_meter = 0.0
        self.writes: list[Write] = []
        self._logical = {physical: logical for logical, physical in tables.items()}
        self._index_keys = index_keys  # physical table -> index -> key attributes
        self._peek = boto3.client("dynamodb")  # unmetered: reads an item before and after its write
        self._pending: list[tuple[str, str, Item, Item | None, Item]] = []
        client.meta.events.register("provide-client-params.dynamodb.*", self._before_call)
        client.meta.events.register("after-call.dynamodb.*", self._record)

    def _read(self, table: str, key: Item) -> Item | None:
        item: Item | None = self._peek.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        return item

    def _before_call(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in _CAPACITY_OPERATIONS:
            params.setdefault("ReturnConsumedCapacity", "TOTAL")
        if model.name == "TransactWriteItems":
            actions = [(op, body) for action in params["TransactItems"] for op, body in action.items()]
        elif model.name in _WRITES:
            actions = [(model.name.removesuffix("Item"), params)]
        else:
            return
        self._pending = []
        for operation, body in actions:
            if operation == "ConditionCheck":
                continue
            table = body["TableName"]
            key = body.get("Key") or {
                name: body["Item"][name] for name in ("PK", "SK", "id") if name in body["Item"]
            }
            self._pending.append((operation, table, key, self._read(table, key), body))

    def _record(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name not in _WRITES:
            return
        consumed = parsed.get("ConsumedCapacity") or []
        transactional = model.name == "TransactWriteItems"
        factor = 2 if transactional else 1
        for entry in consumed if isinstance(consumed, list) else [consumed]:
            reported = float(entry.get("CapacityUnits", 0.0) or 0.0)
            self.wcu_dynamodb_local += reported
            self.wcu_former_meter += reported * factor
        succeeded = http_response.status_code == 200
        for operation, table, key, before, body in self._pending:
            # A refused write is billed too (for the item as it stands); nothing changes in an index.
            after = self._read(table, key) if succeeded else before
            entries = index_writes(self._index_keys.get(table, {}), key, before, after)
            size_before, size_after = item_size(before), item_size(after)
            table_units = units(max(size_before, size_after)) * factor
            index_units = sum(units(size) for _, size in entries)
            self.writes.append(
                Write(
                    operation=operation if succeeded else f"{operation} (refused)",
                    item=item_kind(self._logical.get(table, table), key),
                    bytes_before=size_before,
                    bytes_after=size_after,
                    transactional=transactional,
                    conditional="ConditionExpression" in body,
                    indexes=[name for name, _ in entries],
                    units_aws=table_units + index_units * factor,
                    units_aws_index_writes_single=table_units + index_units,
                    units_aws_item=table_units,
                    units_aws_indexes=index_units * factor,
                )
            )
        self._pending = []

    @property
    def wcu_aws(self) -> int:
        return sum(w.units_aws for w in self.writes)

    def reset(self) -> None:
        self.calls.clear()
        self.wcu_dynamodb_local = 0.0
        self.wcu_former_meter = 0.0
        self.writes = []


def _sqs_event(envelopes: list[dict[str, Any]]) -> dict[str, Any]:
    records = []
    for envelope in envelopes:
        body = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": envelope["type"],
            "source": envelope["source"],
            "account": "123456789012",
            "time": envelope["time"],
            "region": "us-east-1",
            "resources": [],
            "detail": envelope,
        }
        records.append(
            {
                "messageId": str(uuid.uuid4()),
                "receiptHandle": "r",
                "body": json.dumps(body),
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "awsRegion": "us-east-1",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:bench",
            }
        )
    return {"Records": records}


def _outbox(table: str, event_type: str) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb")
    items = [i for page in client.get_paginator("scan").paginate(TableName=table) for i in page["Items"]]
    envelopes = [json.loads(i["envelope"]["S"]) for i in items if i["SK"]["S"].startswith("OUTBOX#")]
    return [e for e in envelopes if e["type"] == event_type]


def _figures(meter: DynamoMeter, count: int) -> dict[str, Any]:
    return {
        "wcu_aws": meter.wcu_aws / count,
        "wcu_aws_index_writes_single": sum(w.units_aws_index_writes_single for w in meter.writes) / count,
        "wcu_dynamodb_local": meter.wcu_dynamodb_local / count,
        "wcu_former_meter": meter.wcu_former_meter / count,
        "calls": {op: n / count for op, n in sorted(meter.calls.items())},
        "writes": breakdown(meter.writes, count),
    }


def breakdown(writes: list[Write], count: int) -> list[dict[str, Any]]:
    """The writes of one operation, grouped by what they are, with mean sizes and AWS units: in all
    (`wcu_aws`), and where they went, the item itself (`wcu_aws_item`) and its index entries
    (`wcu_aws_indexes`)."""
    groups: dict[tuple[Any, ...], list[Write]] = {}
    for w in writes:
        kind = (w.operation, w.item, w.transactional, w.conditional, tuple(w.indexes))
        groups.setdefault(kind, []).append(w)
    return [
        {
            "operation": operation,
            "item": item,
            "per_operation": len(members) / count,
            "bytes_before": round(sum(w.bytes_before for w in members) / len(members)),
            "bytes_after": round(sum(w.bytes_after for w in members) / len(members)),
            "transactional": transactional,
            "conditional": conditional,
            "indexes": list(indexes),
            "wcu_aws": sum(w.units_aws for w in members) / count,
            "wcu_aws_item": sum(w.units_aws_item for w in members) / count,
            "wcu_aws_indexes": sum(w.units_aws_indexes for w in members) / count,
        }
        for (operation, item, transactional, conditional, indexes), members in groups.items()
    ]


def run(dynamodb_url: str, moto_url: str, orders: int) -> dict[str, Any]:
    template = Template.load()
    names = {logical: template.physical_name(logical) for logical in template.of_type("AWS::DynamoDB::Table")}
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_url,
            "AWS_ENDPOINT_URL_SNS": moto_url,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "ORDERS_TABLE_NAME": names["OrdersTable"],
            "INVENTORY_TABLE_NAME": names["InventoryTable"],
            "IDEMPOTENCY_TABLE_NAME": names["IdempotencyTable"],
            "POWERTOOLS_METRICS_NAMESPACE": "Bench",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
            "AWS_LAMBDA_FUNCTION_NAME": "bench",
        }
    )
    ddb = boto3.client("dynamodb")
    for logical in names:
        with contextlib.suppress(ddb.exceptions.ResourceInUseException):
            ddb.create_table(**template.create_table_kwargs(logical))
    topic = boto3.client("sns", endpoint_url=moto_url).create_topic(
        Name=template.physical_name("NotificationTopic")
    )
    os.environ["NOTIFICATION_TOPIC_ARN"] = topic["TopicArn"]
    config.get_settings.cache_clear()
    aws.reset_clients()
    index_keys = {
        physical: {
            index["IndexName"]: [k["AttributeName"] for k in index["KeySchema"]]
            for index in template.create_table_kwargs(logical).get("GlobalSecondaryIndexes", [])
        }
        for logical, physical in names.items()
    }
    meter = DynamoMeter(aws.dynamodb(), names, index_keys)
    settings = config.get_settings()

    inventory = DynamoInventoryRepository(settings)
    for sku in ("SKU-A", "SKU-B", "SKU-C"):
        inventory.set_stock(sku, 10**9)
    # As in Lambda with active tracing (template Globals: Tracing: Active): every outbox item written
    # carries the invocation's X-Ray trace header, which counts towards the item's size.
    os.environ["_X_AMZN_TRACE_ID"] = TYPICAL_TRACE_HEADER
    service = OrderService(
        DynamoOrderRepository(settings, trace_header=config.trace_header_from_env), settings
    )
    command = PlaceOrder("c-bench", "USD", (OrderLine("SKU-A", 1, 100), OrderLine("SKU-B", 2, 250)))

    meter.reset()
    placed = [
        service.place_order(command, idempotency_key=str(uuid.uuid4()), correlation_id="b").order
        for _ in range(orders)
    ]
    create = _figures(meter, orders)

    consumers: dict[str, Any] = {}
    for function, source_table, event_type in (
        ("inventory_consumer", "OrdersTable", "OrderCreated"),
        ("order_status_consumer", "InventoryTable", "InventoryReserved"),
        ("notification_consumer", "OrdersTable", "OrderConfirmed"),
    ):
        handler = load_function(function, "write_cost")
        envelopes = _outbox(names[source_table], event_type)
        meter.reset()
        for start in range(0, len(envelopes), 10):
            with contextlib.redirect_stdout(io.StringIO()):
                response = handler.lambda_handler(_sqs_event(envelopes[start : start + 10]), LambdaContext())
            assert response["batchItemFailures"] == [], response
        consumers[function] = {
            "events": len(envelopes),
            "dynamodb_calls_per_event": sum(meter.calls.values()) / len(envelopes),
            **_figures(meter, len(envelopes)),
        }

    meter.reset()
    for order in placed:
        service.cancel_order(order["orderId"], correlation_id="b")
    cancel = _figures(meter, orders)
    return {
        "orders": orders,
        # AWS units of one confirmed order's whole saga: its create, and the one event each consumer
        # applies on the confirm path (OrderCreated, InventoryReserved, OrderConfirmed).
        "wcu_per_confirmed_order": create["wcu_aws"] + sum(c["wcu_aws"] for c in consumers.values()),
        "wcu_per_confirmed_order_index_writes_single": create["wcu_aws_index_writes_single"]
        + sum(c["wcu_aws_index_writes_single"] for c in consumers.values()),
        "wcu_per_confirmed_order_former_meter": create["wcu_former_meter"]
        + sum(c["wcu_former_meter"] for c in consumers.values()),
        "create": create,
        "cancel": cancel,
        "consumers": consumers,
    }
