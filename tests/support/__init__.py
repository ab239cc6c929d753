"""Helpers shared by the test layers: loading handlers from their CodeUri, events, Lambda contexts."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.context import LambdaContext
from tools.template import ROOT, FunctionSpec

EVENTS_DIR = ROOT / "events"

# Each sample event of events/ and the function it is shaped for (test_sam_local checks it is every one).
SAMPLE_EVENTS: dict[str, list[str]] = {
    "OrdersApiFunction": [
        "api_create_order.json",
        "api_get_order.json",
        "api_cancel_order.json",
        "api_create_order_invalid_fields.json",
        "api_create_order_malformed_json.json",
        "api_create_order_wrong_content_type.json",
    ],
    "OutboxRelayFunction": [
        "relay_outbox_insert_batch.json",
        "relay_mixed_batch.json",
        "relay_poison_record.json",
    ],
    "InventoryFunction": [
        "sqs_inventory_order_created.json",
        "sqs_inventory_order_cancelled.json",
        "sqs_inventory_duplicate.json",
        "sqs_inventory_malformed_batch.json",
    ],
    "OrderStatusFunction": [
        "sqs_order_status_inventory_reserved.json",
        "sqs_order_status_inventory_rejected.json",
    ],
    "NotificationFunction": [
        "sqs_notification_order_confirmed.json",
        "sqs_notification_order_rejected.json",
        "sqs_notification_order_cancelled.json",
    ],
    "OutboxPublisherFunction": ["scheduler_tick.json"],  # EventBridge Scheduler's Input: none, so {}
    "OrderStoreMaintenanceFunction": ["scheduler_tick.json"],
    "OrderDatabaseMigrationFunction": ["cfn_order_database_schema_update.json"],
}


def load_event(name: str) -> dict[str, Any]:
    """A sample event from events/ (a fresh copy each time, so tests may edit it)."""
    data = json.loads((EVENTS_DIR / name).read_text())
    assert isinstance(data, dict)
    return copy.deepcopy(data)


def load_handler_module(spec: FunctionSpec) -> ModuleType:
    """Import a function's handler module from its CodeUri under a unique module name."""
    module_file, _ = spec.handler.rsplit(".", 1)
    unique = f"fn_{spec.logical_id}"
    if unique in sys.modules:
        return sys.modules[unique]
    code_dir = str(spec.code_uri)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)  # sibling modules (e.g. schemas.py), as in the Lambda runtime
    module_spec = importlib.util.spec_from_file_location(unique, spec.code_uri / f"{module_file}.py")
    assert module_spec is not None
    assert module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[unique] = module
    module_spec.loader.exec_module(module)
    return module


def clear_module_caches(module: ModuleType) -> None:
    """Forget functools.cache'd factories (service objects bound to a previous environment)."""
    for value in vars(module).values():
        if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == (
            module.__name__
        ):
            value.cache_clear()


def read_root_file(relative: str) -> str:
    return (ROOT / relative).read_text()


def json_body(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def header(response: dict[str, Any], name: str) -> str | None:
    for key, values in (response.get("multiValueHeaders") or {}).items():
        if key.lower() == name.lower():
            return str(values[0])
    for key, value in (response.get("headers") or {}).items():
        if key.lower() == name.lower():
            return str(value)
    return None


__all__ = ["ROOT", "LambdaContext", "Path"]


def stream_table_resource() -> dict[str, Any]:
    """A test-only table definition: hash key PK, its stream on (NEW_IMAGE), on demand."""
    return {
        "Type": "AWS::DynamoDB::Table",
        "Properties": {
            "BillingMode": "PAY_PER_REQUEST",
            "AttributeDefinitions": [{"AttributeName": "PK", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "PK", "KeyType": "HASH"}],
            "StreamSpecification": {"StreamViewType": "NEW_IMAGE"},
        },
    }
