"""Write cost on real DynamoDB Local: WCU per order create/cancel, DynamoDB calls per consumed event.

Capacity comes from `ReturnConsumedCapacity=TOTAL`, added to every DynamoDB call by a botocore hook
(the production code does not ask for it). Consumers run in this process on SQS events shaped as
Lambda delivers them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import uuid
from collections import Counter
from typing import Any

import boto3

from tools.local.reader.template import ROOT, Template
from tools.local.runtime.context import LambdaContext

sys.path.insert(0, str(ROOT / "layers" / "shared"))

from shop.adapters import aws
from shop.adapters.inventory_repository import DynamoInventoryRepository
from shop.adapters.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime import config

_CAPACITY_OPERATIONS = {"PutItem", "UpdateItem", "DeleteItem", "GetItem", "TransactWriteItems", "Query"}
_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"}


class DynamoMeter:
    """Counts DynamoDB calls by operation and sums the write capacity they consumed.

    DynamoDB Local reports `CapacityUnits` as for standard writes; AWS bills a transactional write
    twice (2 WCU per KB per item), so `wcu_aws` doubles what transactions report.
    """

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        self.wcu = 0.0
        self.wcu_aws = 0.0
        client.meta.events.register("provide-client-params.dynamodb.*", self._ask_for_capacity)
        client.meta.events.register("after-call.dynamodb.*", self._record)

    def _ask_for_capacity(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in _CAPACITY_OPERATIONS:
            params.setdefault("ReturnConsumedCapacity", "TOTAL")

    def _record(self, http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name not in _WRITES:
            return
        consumed = parsed.get("ConsumedCapacity") or []
        for entry in consumed if isinstance(consumed, list) else [consumed]:
            units = float(entry.get("CapacityUnits", 0.0) or 0.0)
            self.wcu += units
            self.wcu_aws += units * (2 if model.name == "TransactWriteItems" else 1)

    def reset(self) -> None:
        self.calls.clear()
        self.wcu = 0.0
        self.wcu_aws = 0.0


def _load(function: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"bench_{function}", ROOT / "functions" / function / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        "wcu_dynamodb_local": meter.wcu / count,
        "wcu_aws": meter.wcu_aws / count,
        "calls": {op: n / count for op, n in sorted(meter.calls.items())},
    }


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
    meter = DynamoMeter(aws.dynamodb())
    settings = config.get_settings()

    inventory = DynamoInventoryRepository(settings)
    for sku in ("SKU-A", "SKU-B", "SKU-C"):
        inventory.set_stock(sku, 10**9)
    service = OrderService(DynamoOrderRepository(settings), settings)
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
        handler = _load(function)
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
    return {"orders": orders, "create": create, "cancel": cancel, "consumers": consumers}
