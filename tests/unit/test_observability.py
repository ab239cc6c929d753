"""What the functions log: ids and correlation ids on every line, never request bodies or event data.

Each test captures the JSON lines the one Powertools logger (shop.runtime.observability) writes while a
handler runs on a sample event, and asserts on them as an operator would see them in CloudWatch Logs.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime.config import Settings
from shop.runtime.observability import logger
from tests.support import load_event
from tools.template import Template

API = "OrdersApiFunction"
RELAY = "OutboxRelayFunction"
ORDER_ID = "o-0000000000000000000000000000a001"  # the order of the sqs_* sample events


# The generated parts of a line (timestamps, uuids, X-Ray, request and message ids, hex digests) are
# written with these characters only: a value written with them alone may appear inside one by chance.
_CHANCE_ALPHABET = re.compile(r"[0-9a-fA-F:.,+\-TZ ]*")


def _names(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, name) of every field of a parsed log record, nested fields included."""
    if isinstance(node, dict):
        for key, value in node.items():
            inner = f"{path}.{key}" if path else str(key)
            yield inner, str(key)
            yield from _names(value, inner)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _names(item, f"{path}[{index}]")


def _scalars(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) of every string and number in a parsed log record, nested ones included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _scalars(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _scalars(item, f"{path}[{index}]")
    elif isinstance(node, str | int | float) and not isinstance(node, bool):
        yield path, str(node)


@dataclass
class LogLines:
    buffer: io.StringIO

    @property
    def raw(self) -> list[str]:
        return [line for line in self.buffer.getvalue().splitlines() if line.strip()]

    @property
    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.raw]  # every line is one JSON object

    def with_message(self, message: str) -> list[dict[str, Any]]:
        return [record for record in self.records if record["message"] == message]

    def leaks(self, values: Iterable[str], names: Iterable[str] = ()) -> dict[str, list[str]]:
        """Where a forbidden value or field name occurs, by line and field; only what was found.

        Decided on the parsed fields, never by chance: a value leaks where a field equals it, where it
        is inside the message (text the code wrote, nothing generated), and, when no generated part can
        spell it by chance (it has a character outside _CHANCE_ALPHABET), inside any field at all.
        A name leaks where a field has that name.
        """
        values, names = set(values), set(names)
        found: dict[str, list[str]] = defaultdict(list)
        anywhere = {value for value in values if not _CHANCE_ALPHABET.fullmatch(value)}
        for number, record in enumerate(self.records, 1):
            for path, name in _names(record):
                if name in names:
                    found[name].append(f"line {number}: field {path}")
            for path, text in _scalars(record):
                for value in values:
                    if text == value or (value in text and (path == "message" or value in anywhere)):
                        found[value].append(f"line {number}: {path}={text[:80]!r}")
        return dict(found)


@pytest.fixture
def logs() -> Iterator[LogLines]:
    """The JSON lines the functions log during the test (Powertools' own handler, own formatter)."""
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    # Swapped, not setStream(): that flushes the previous stream, which an earlier pytest session in
    # this process (mutmut runs several) may have closed with its output capture.
    previous, handler.stream = handler.stream, buffer
    try:
        yield LogLines(buffer)
    finally:
        handler.stream = previous


def data_values(data: Any) -> set[str]:
    """Every string and number inside an event's `data` that is not an id."""
    if isinstance(data, dict):
        return {v for key, value in data.items() if key != "orderId" for v in data_values(value)}
    if isinstance(data, list):
        return {v for item in data for v in data_values(item)}
    if isinstance(data, bool) or data is None:
        return set()
    # Short values (quantities, versions, sequence numbers) equal ids that are logged on purpose.
    return {str(data)} if len(str(data)) >= 3 else set()


# --- the order API -------------------------------------------------------------------------------------
def create_order_requests() -> list[dict[str, Any]]:
    accepted = load_event("api_create_order.json")
    invalid = load_event("api_create_order_invalid_fields.json")
    malformed = load_event("api_create_order_malformed_json.json")
    wrong_type = load_event("api_create_order_wrong_content_type.json")
    return [accepted, accepted, invalid, malformed, wrong_type]  # the second is an idempotent replay


def test_the_template_keeps_powertools_event_logging_off(template: Template):
    for name, spec in template.functions().items():
        assert spec.environment["POWERTOOLS_LOGGER_LOG_EVENT"] == "false", name
        assert spec.environment["POWERTOOLS_LOG_LEVEL"] == "INFO", name


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_order_api_logs_never_contain_the_body_or_customer_data(aws, invoke, logs, level):
    # Given the order requests of the sample events, accepted and refused ones (at INFO, the default,
    # and at DEBUG, which an operator may switch on while investigating)
    requests = create_order_requests()
    body = json.loads(requests[0]["body"])
    previous = logger.log_level
    logger.setLevel(level)
    try:
        # When the API handles them
        responses = [invoke(API, request) for request in requests]
    finally:
        logger.setLevel(previous)

    # Then they were logged, each line with its correlation id...
    assert [r["statusCode"] for r in responses] == [201, 201, 422, 400, 415]
    records = logs.records
    assert records, "the API logged nothing"
    assert {r.get("correlation_id") for r in records} <= {
        request["headers"].get("X-Correlation-Id") or request["requestContext"]["requestId"]
        for request in requests
    }
    assert all(r.get("correlation_id") for r in records)
    order_id = json.loads(responses[0]["body"])["orderId"]
    assert logs.with_message("order created")[0]["order_id"] == order_id
    # ... and no line holds a body, the customer id, a line item, or the raw event
    forbidden = [request["body"] for request in requests if request.get("body")]
    forbidden += [body["customerId"], *(item["sku"] for item in body["items"]), "customerId"]
    forbidden += [requests[0]["headers"]["X-Amz-Cf-Id"], "requestContext", "multiValueHeaders"]
    fields = ["items", "customerId", "requestContext", "multiValueHeaders"]
    assert logs.leaks(forbidden, fields) == {}


def test_order_api_uses_the_request_id_when_no_correlation_id_is_sent(aws, invoke, logs):
    request = load_event("api_create_order.json")
    del request["headers"]["X-Correlation-Id"]
    response = invoke(API, request)
    assert response["statusCode"] == 201
    assert {r["correlation_id"] for r in logs.records} == {request["requestContext"]["requestId"]}


# --- the relay ------------------------------------------------------------------------------------------
def outbox_envelopes(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(r["dynamodb"]["NewImage"]["envelope"]["S"]) for r in event["Records"]]


def test_relay_logs_each_published_event_with_ids_and_correlation_id_but_no_data(bus, invoke, logs):
    # Given a batch of 25 outbox records
    event = load_event("relay_outbox_insert_batch.json")
    envelopes = outbox_envelopes(event)

    # When the relay publishes them
    assert invoke(RELAY, event) == {"batchItemFailures": []}

    # Then a line per ten events names each event, its type, its order and its saga's correlation id, in
    # publishing order
    published = logs.with_message("events published")
    assert [len(r["event_ids"]) for r in published] == [10, 10, 5]
    named = [
        (event_id, event_type, aggregate, correlation_id)
        for r in published
        for event_id, event_type, aggregate, correlation_id in zip(
            r["event_ids"], r["event_types"], r["aggregates"], r["correlation_ids"], strict=True
        )
    ]
    assert named == [
        (e["id"], e["type"], f"{e['source']}|{e['subject']}", e["correlationid"]) for e in envelopes
    ]
    # ... and no line carries any event's data
    forbidden = {value for e in envelopes for value in data_values(e["data"])}
    assert logs.leaks(forbidden, ["data"]) == {}


def test_a_poison_record_is_logged_by_event_id_and_sequence_number_without_its_data(
    bus, poison_queue, invoke, logs
):
    event = load_event("relay_poison_record.json")
    invoke(RELAY, event)
    [poison] = logs.with_message("poison outbox record")
    assert poison["event_id"]
    assert poison["sequence_number"]
    images = [r["dynamodb"]["NewImage"] for r in event["Records"]]
    forbidden: set[str] = set()
    for image in images:
        try:
            forbidden |= data_values(json.loads(image["envelope"]["S"]).get("data"))
        except (json.JSONDecodeError, KeyError):
            continue  # the poison record itself may not decode
    assert logs.leaks(forbidden, ["data"]) == {}


# --- the consumers --------------------------------------------------------------------------------------
@pytest.fixture
def stock(aws: None, template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stock for the sample events' lines, and their pending order (o-…a001)."""
    for table in ("OrdersTable", "InventoryTable"):
        monkeypatch.setenv(f"{table[:-5].upper()}_TABLE_NAME", template.physical_name(table))
    settings = Settings.from_env()
    repository = DynamoInventoryRepository(settings)
    repository.set_stock("SKU-RED-MUG", 10)
    repository.set_stock("SKU-BLUE-PEN", 5)
    OrderService(DynamoOrderRepository(settings), settings, new_id=lambda: ORDER_ID).place_order(
        PlaceOrder("c-1001", "USD", (OrderLine("SKU-RED-MUG", 2, 1250), OrderLine("SKU-BLUE-PEN", 1, 399))),
        idempotency_key=None,
        correlation_id="corr-demo-0001",
    )


def sqs_envelopes(event: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(r["body"])["detail"] for r in event["Records"]]


CONSUMER_EVENTS = [
    ("InventoryFunction", "sqs_inventory_order_created.json"),
    ("InventoryFunction", "sqs_inventory_order_cancelled.json"),
    ("OrderStatusFunction", "sqs_order_status_inventory_reserved.json"),
    ("OrderStatusFunction", "sqs_order_status_inventory_rejected.json"),
    ("NotificationFunction", "sqs_notification_order_confirmed.json"),
    ("NotificationFunction", "sqs_notification_order_rejected.json"),
    ("NotificationFunction", "sqs_notification_order_cancelled.json"),
]


@pytest.mark.parametrize(("function", "event_file"), CONSUMER_EVENTS)
def test_consumer_logs_carry_event_and_correlation_ids_but_no_data(
    stock, template, invoke, logs, function, event_file
):
    boto3.client("sns").create_topic(Name=template.physical_name("NotificationTopic"))
    event = load_event(event_file)
    [envelope] = sqs_envelopes(event)

    invoke(function, event)

    records = logs.records
    assert records, f"{function} logged nothing"
    # every line of the invocation belongs to the event's saga and names the event
    assert {(r.get("correlation_id"), r.get("causation_id")) for r in records} == {
        (envelope["correlationid"], envelope["id"])
    }
    [applied] = logs.with_message("event applied")
    assert applied["event_id"] == envelope["id"]
    assert logs.leaks(data_values(envelope["data"]), ["data"]) == {}


def test_a_failed_message_is_logged_with_its_ids_and_no_body(stock, invoke, logs):
    event = load_event("sqs_inventory_malformed_batch.json")
    response = invoke("InventoryFunction", event)
    [failed_id] = [f["itemIdentifier"] for f in response["batchItemFailures"]]
    [failure] = logs.with_message("message failed; it will be retried and then dead-lettered")
    assert failure["message_id"] == failed_id
    [broken] = [r["body"] for r in event["Records"] if r["messageId"] == failed_id]
    good = [json.loads(r["body"])["detail"] for r in event["Records"] if r["messageId"] != failed_id]
    forbidden = {broken} | {value for e in good for value in data_values(e["data"])}
    assert logs.leaks(forbidden, ["data", "body"]) == {}


def test_a_message_that_cannot_be_parsed_is_not_logged_under_another_sagas_correlation_id(
    stock, invoke, logs
):
    # Given a batch whose second message is not a CloudEvent, after a good one
    event = load_event("sqs_inventory_malformed_batch.json")
    first = json.loads(event["Records"][0]["body"])["detail"]

    invoke("InventoryFunction", event)

    # Then the failure line does not claim to belong to the first message's saga
    [failure] = logs.with_message("message failed; it will be retried and then dead-lettered")
    assert failure.get("correlation_id") != first["correlationid"]
    assert failure.get("causation_id") != first["id"]
