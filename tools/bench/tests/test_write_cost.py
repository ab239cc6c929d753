"""The bench's write-cost meter (tools/bench/write_cost.py), and what it measures pinned: the items a
confirmed order writes, their sizes against the 1 KB write-unit boundary, and the AWS write units.

A regression here raises the DynamoDB bill silently (docs/performance.md, "Write cost"): a write more
per event, an index more per item, an item over 1 KB. The outbox item's attributes are pinned with the
domain's rules, in tests/unit/test_domain.py.
"""

from __future__ import annotations

from collections import Counter

import boto3
import pytest

from shop.adapters import aws as shop_aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.envelope import CloudEvent
from shop.domain.inventory import InventoryService
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.domain.saga import OrderStatusPolicy
from shop.runtime import config
from shop.runtime.config import Settings
from tools.bench.write_cost import (
    TYPICAL_TRACE_HEADER,
    DynamoMeter,
    Write,
    breakdown,
    index_writes,
    item_size,
    units,
)
from tools.template import Template

# A typical order: two lines, as the bench places it.
COMMAND = PlaceOrder("c-bench", "USD", (OrderLine("SKU-A", 1, 100), OrderLine("SKU-B", 2, 250)))
KB = 1024


@pytest.fixture
def settings(aws: None, template: Template, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("OrdersTable", "InventoryTable"):
        monkeypatch.setenv(f"{name[:-5].upper()}_TABLE_NAME", template.physical_name(name))
    monkeypatch.setenv("_X_AMZN_TRACE_ID", TYPICAL_TRACE_HEADER)  # active tracing, as deployed
    return Settings.from_env()


def test_item_size_follows_dynamodb_rules() -> None:
    assert item_size({"ab": {"S": "xyz"}}) == 5
    assert item_size({"n": {"N": "12345"}}) == 1 + 4  # 5 significant digits: 3 bytes + 1
    assert item_size({"n": {"N": "600"}}) == 1 + 2  # leading and trailing zeros do not count
    assert item_size({"l": {"L": [{"S": "a"}, {"N": "1"}]}}) == 1 + 3 + (1 + 1) + (1 + 2)
    assert item_size({"m": {"M": {"k": {"S": "v"}}}}) == 1 + 3 + 1 + 1 + 1
    assert [units(0), units(1024), units(1025)] == [1, 1, 2]


def test_index_writes_count_entries_entered_moved_and_left() -> None:
    index = {"ByX": ["x"]}
    key = {"PK": {"S": "p"}}
    assert index_writes(index, key, None, {**key, "y": {"S": "1"}}) == []  # sparse: not indexed
    assert len(index_writes(index, key, None, {**key, "x": {"S": "1"}})) == 1  # entered
    assert index_writes(index, key, {**key, "x": {"S": "1"}}, {**key, "x": {"S": "1"}}) == []
    assert len(index_writes(index, key, {**key, "x": {"S": "1"}}, {**key, "x": {"S": "2"}})) == 2  # moved
    assert len(index_writes(index, key, {**key, "x": {"S": "1"}}, {**key})) == 1  # left


def test_the_breakdown_says_where_each_unit_went() -> None:
    outbox = Write("Put", "OrdersTable outbox item", 0, 926, True, True, ["OutboxByTime"], 4, 3, 2, 2)
    order = Write("Update", "OrdersTable order item", 314, 316, True, True, [], 2, 2, 2, 0)
    rows = breakdown([outbox, outbox, order, order], 2)
    assert [
        (r["item"], r["wcu_aws"], r["wcu_aws_item"], r["wcu_aws_indexes"], r["indexes"]) for r in rows
    ] == [
        ("OrdersTable outbox item", 4.0, 2.0, 2.0, ["OutboxByTime"]),
        ("OrdersTable order item", 2.0, 2.0, 0.0, []),
    ]


def test_a_confirmed_order_writes_these_items_and_no_more(settings: Settings) -> None:
    tables = {name: settings.require(f"{name[:-5].lower()}_table_name") for name in ("OrdersTable",)}
    tables["InventoryTable"] = settings.require("inventory_table_name")
    client = boto3.client("dynamodb")
    index_keys = {
        physical: {
            i["IndexName"]: [k["AttributeName"] for k in i["KeySchema"]]
            for i in client.describe_table(TableName=physical)["Table"].get("GlobalSecondaryIndexes", [])
        }
        for physical in tables.values()
    }
    inventory = DynamoInventoryRepository(settings, trace_header=config.trace_header_from_env)
    for sku in ("SKU-A", "SKU-B"):
        inventory.set_stock(sku, 100)
    orders = OrderService(
        DynamoOrderRepository(settings, trace_header=config.trace_header_from_env), settings
    )
    meter = DynamoMeter(shop_aws.dynamodb(), tables, index_keys)

    placed = orders.place_order(COMMAND, idempotency_key="k-1", correlation_id="c", caller="caller").order
    created = _outbox_event(tables["OrdersTable"], "OrderCreated")
    InventoryService(inventory).apply(created)
    reserved = _outbox_event(tables["InventoryTable"], "InventoryReserved")
    OrderStatusPolicy(orders).apply(reserved)
    assert orders.get_order(placed["orderId"]).status == "CONFIRMED"

    written = Counter((w.item, w.transactional, tuple(w.indexes)) for w in meter.writes)
    by_time = ("OutboxByTime",)  # the only index: replay by event id reads it too (no OutboxByEventId)
    assert written == {
        ("OrdersTable order item", True, ()): 2,  # created, confirmed
        ("OrdersTable request item", True, ()): 1,
        ("OrdersTable outbox item", True, by_time): 2,  # OrderCreated, OrderConfirmed
        ("InventoryTable reservation item", True, ()): 1,
        ("InventoryTable sku item", True, ()): 2,  # one per line
        ("InventoryTable outbox item", True, by_time): 1,
    }
    sizes = {w.item: max(w.bytes_after, w.bytes_before) for w in meter.writes}
    assert all(size <= KB for size in sizes.values()), sizes
    # Every outbox item under 1 KB with a trace header, OrderConfirmed (the whole order again, with
    # causationid) the largest: 926 bytes here on 2026-11-26 (1,081 in the bench before the event-id
    # index and the attributes repeating the envelope went).
    outbox_sizes = [w.bytes_after for w in meter.writes if "outbox" in w.item]
    assert max(outbox_sizes) == outbox_sizes[2] <= 1000, outbox_sizes
    # Where each unit goes: an item write of under 1 KB is 2 in a transaction, an outbox item's one index
    # entry 2 more (index writes doubled inside a transaction: the upper bound, tools/bench/write_cost.py).
    assert [(w.units_aws_item, w.units_aws_indexes) for w in meter.writes if "outbox" in w.item] == [
        (2, 2)
    ] * 3
    assert all(w.units_aws == w.units_aws_item + w.units_aws_indexes for w in meter.writes)
    # The business writes of the saga; the three consumers' Powertools idempotency records (a put and
    # an update of under 1 KB each) add 6, the bench counts them: 30 per confirmed order in all.
    assert sum(w.units_aws for w in meter.writes) == 24


def _outbox_event(table: str, event_type: str) -> CloudEvent:
    items = boto3.client("dynamodb").scan(TableName=table)["Items"]
    envelopes = [
        CloudEvent.from_json(i["envelope"]["S"]) for i in items if keys.is_outbox_sort_key(i["SK"]["S"])
    ]
    (event,) = [e for e in envelopes if e.type == event_type]
    return event
