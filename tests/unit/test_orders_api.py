"""The order API handler, driven by the sample events in events/, against moto."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import boto3
import jsonschema  # type: ignore[import-untyped]  # no stubs in .venv; only validates here
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import shop.adapters.aws
import shop.adapters.dynamodb.transactions
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.domain.outbox import outbox_entry
from shop.runtime.config import Settings
from tests.support import header, json_body, load_event
from tools.template import ROOT, Template


@pytest.fixture
def table_items(template: Template) -> Callable[[], list[dict[str, Any]]]:
    def scan() -> list[dict[str, Any]]:
        client = boto3.client("dynamodb")
        return client.scan(TableName=template.physical_name("OrdersTable"))["Items"]

    return scan


def create_event(body: dict[str, Any] | None = None, key: str | None = "key-1") -> dict[str, Any]:
    event = load_event("api_create_order.json")
    if body is not None:
        event["body"] = json.dumps(body)
    if key is None:
        del event["headers"]["Idempotency-Key"]
    else:
        event["headers"]["Idempotency-Key"] = key
    return event


def order_event(name: str, order_id: str) -> dict[str, Any]:
    event = load_event(name)
    event["pathParameters"] = {"orderId": order_id}
    event["path"] = event["path"].replace("o-00000000000000000000000000000001", order_id)
    return event


def outbox_envelopes(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(i["envelope"]["S"]) for i in items if i["SK"]["S"].startswith("OUTBOX#")]


def table_items_of(template: Template, table: str) -> list[dict[str, Any]]:
    return boto3.client("dynamodb").scan(TableName=template.physical_name(table))["Items"]


def test_each_outbox_item_carries_the_trace_of_the_invocation_that_wrote_it(api, table_items, monkeypatch):
    """In its envelope's traceparent (no attribute of its own: the relay derives PutEvents' TraceHeader
    from it, shop.domain.outbox.outbox_entry)."""
    # Lambda sets _X_AMZN_TRACE_ID anew for every invocation (active tracing)
    create_trace = "Root=1-6740a1b0-00000000000000000000000a;Parent=000000000000000a;Sampled=1"
    cancel_trace = "Root=1-6740a1b1-00000000000000000000000b;Parent=000000000000000b;Sampled=1"
    monkeypatch.setenv("_X_AMZN_TRACE_ID", create_trace)
    order_id = json_body(api(create_event()))["orderId"]
    monkeypatch.setenv("_X_AMZN_TRACE_ID", cancel_trace)
    assert api(order_event("api_cancel_order.json", order_id))["statusCode"] == 200

    items = [i for i in table_items() if i["SK"]["S"].startswith("OUTBOX#")]
    traces = {
        json.loads(i["envelope"]["S"])["type"]: outbox_entry(i["envelope"]["S"], 262_144).trace_header
        for i in items
    }
    assert traces == {"OrderCreated": create_trace, "OrderCancelled": cancel_trace}
    assert all("traceHeader" not in i for i in items)


def test_without_a_trace_header_an_outbox_item_carries_none(api, table_items, monkeypatch):
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)

    api(create_event())

    [outbox] = [i for i in table_items() if i["SK"]["S"].startswith("OUTBOX#")]
    assert "traceHeader" not in outbox


def test_create_order_writes_order_and_created_event_together(api, table_items):
    # Given a valid order request with a correlation id
    event = create_event()

    # When it is posted
    response = api(event)

    # Then the order is created PENDING at version 1 with integer totals and a Location
    assert response["statusCode"] == 201
    order = json_body(response)
    assert order["status"] == "PENDING"
    assert order["version"] == 1
    assert order["totalAmount"] == 2 * 1250 + 399
    assert [line["lineTotal"] for line in order["items"]] == [2500, 399]
    assert header(response, "Location") == f"/dev/orders/{order['orderId']}"
    assert header(response, "X-Correlation-Id") == "corr-demo-0001"
    # And exactly one OrderCreated outbox event sits beside the order, in the same item collection
    items = table_items()
    orders = [i for i in items if i["SK"]["S"] == "ORDER"]
    events = outbox_envelopes(items)
    assert len(orders) == 1
    assert orders[0]["PK"]["S"] == f"ORDER#{order['orderId']}"
    assert len(events) == 1
    created = events[0]
    assert created["specversion"] == "1.0"
    assert created["type"] == "OrderCreated"
    assert created["source"] == "shop.orders"
    assert created["subject"] == order["orderId"]
    assert created["sequence"] == 1
    assert created["correlationid"] == "corr-demo-0001"
    assert created["data"] == order


def test_retry_with_same_key_and_body_replays_the_response_and_writes_nothing(api, table_items):
    first = api(create_event(key="retry-1"))
    items_after_first = table_items()

    second = api(create_event(key="retry-1"))

    assert second["statusCode"] == first["statusCode"] == 201
    assert json_body(second) == json_body(first)
    assert header(second, "Location") == header(first, "Location")
    assert header(second, "Idempotent-Replayed") == "true"
    assert table_items() == items_after_first


def test_same_key_with_a_different_body_is_refused(api, table_items):
    api(create_event(key="reuse-1"))
    before = table_items()
    other = json.loads(create_event()["body"])
    other["items"][0]["quantity"] = 7

    response = api(create_event(other, key="reuse-1"))

    assert response["statusCode"] == 422
    assert json_body(response)["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert table_items() == before


def test_without_idempotency_key_each_post_creates_an_order(api, table_items):
    first = json_body(api(create_event(key=None)))
    second = json_body(api(create_event(key=None)))

    assert first["orderId"] != second["orderId"]
    assert len(outbox_envelopes(table_items())) == 2


def test_malformed_json_is_a_400_with_error_body(api, table_items):
    response = api(load_event("api_create_order_malformed_json.json"))

    assert response["statusCode"] == 400
    assert json_body(response)["error"]["code"] == "MALFORMED_JSON"
    assert table_items() == []


def test_invalid_fields_are_a_422_naming_each_field(api, table_items):
    response = api(load_event("api_create_order_invalid_fields.json"))

    assert response["statusCode"] == 422
    error = json_body(response)["error"]
    assert error["code"] == "VALIDATION_FAILED"
    fields = {f["field"] for f in error["details"]["fields"]}
    assert {"currency", "items.0.quantity", "items.0.unitPrice", "coupon"} <= fields
    assert table_items() == []


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.pop("customerId"), "customerId"),
        (lambda b: b["items"][0].update(quantity=-1), "items.0.quantity"),
        (lambda b: b["items"][0].update(quantity="2"), "items.0.quantity"),
        (lambda b: b.update(items=[]), "items"),
        (lambda b: b.update(items=b["items"][:1] * 99), "items"),
    ],
    ids=["missing-field", "negative-quantity", "string-quantity", "no-lines", "99-lines"],
)
def test_each_rule_of_the_request_schema_is_enforced(api, mutate, field):
    body = json.loads(create_event()["body"])
    mutate(body)

    response = api(create_event(body))

    assert response["statusCode"] == 422
    assert field in {f["field"] for f in json_body(response)["error"]["details"]["fields"]}


def test_wrong_content_type_is_a_415(api, table_items):
    response = api(load_event("api_create_order_wrong_content_type.json"))

    assert response["statusCode"] == 415
    assert json_body(response)["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert table_items() == []


@pytest.mark.parametrize(
    ("body", "base64_encoded"),
    [
        ("[" * 50_000, False),
        ('{"customerId": "c-1", "currency": "EUR", "items": [], "n": ' + "9" * 5_000 + "}", False),
        # Found by the API fuzzer: API Gateway delivers a body that is not UTF-8 base64-encoded.
        (base64.b64encode(b"\xfc\xdd not UTF-8").decode(), True),
        ("not base64 at all!", True),
    ],
    ids=["nested-past-the-recursion-limit", "integer-past-the-digit-limit", "not-utf8", "bad-base64"],
)
def test_a_body_python_cannot_decode_as_json_is_a_400_not_a_500(api, table_items, body, base64_encoded):
    event = create_event()
    event["body"], event["isBase64Encoded"] = body, base64_encoded

    response = api(event)

    assert response["statusCode"] == 400
    assert json_body(response)["error"]["code"] == "MALFORMED_JSON"
    assert table_items() == []


def valid_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(create_event()["body"])
    return body


@pytest.mark.parametrize("depth", [254, 255, 5_000])
@pytest.mark.parametrize("field", ["extra", "customerId"])
def test_a_value_nested_past_the_validators_limit_is_a_422_naming_its_field(api, table_items, field, depth):
    """Python's json parser takes 5,000 levels; jsonschema-rs stops at 255 (it raised, a 500)."""
    body = valid_body()
    event = create_event()
    event["body"] = json.dumps(body)[:-1] + f', "{field}": ' + "[" * depth + "]" * depth + "}"

    response = api(event)

    assert response["statusCode"] == 422
    assert json_body(response)["error"]["details"]["fields"] == [
        {"field": field, "message": "the value is nested more than 32 levels deep"}
    ]
    assert table_items() == []


def test_a_422_stays_small_however_many_faults_the_body_has(api):
    """One jsonschema-rs error lists every unknown key; copied to each key's field, 3,000 keys (a 30 KB
    body) made a 78 MB answer, past Lambda's 6 MB response limit (a 502 from API Gateway)."""
    many_keys = {**valid_body(), **{f"k{n}": 0 for n in range(3_000)}}
    long_key = {**valid_body(), "k" * 200_000: 0}
    many_lines = {**valid_body(), "items": [{}] * 30_000}

    answers = [json_body(api(create_event(body))) for body in (many_keys, long_key, many_lines)]

    details = [answer["error"]["details"] for answer in answers]
    assert [len(d["fields"]) for d in details] == [100, 1, 100]
    assert details[0]["fieldsOmitted"] == 2_900
    assert details[0]["fields"][0] == {
        "field": "k0",
        "message": "Additional properties are not allowed ('k0' was unexpected)",
    }
    assert details[1]["fields"][0]["field"] == "k" * 64 + "…"
    assert "fieldsOmitted" not in details[1]
    assert {"field": "items", "message": "the value has more than 98 items"} in details[2]["fields"]
    assert all(len(json.dumps(answer)) < 20_000 for answer in answers)


def test_body_larger_than_the_event_limit_is_a_413(api):
    event = create_event()
    event["body"] = json.dumps({"customerId": "c-1", "pad": "x" * 300_000})

    response = api(event)

    assert response["statusCode"] == 413
    assert json_body(response)["error"]["code"] == "BODY_TOO_LARGE"


def test_an_event_that_could_not_be_published_is_never_written(api, table_items):
    body = json.loads(create_event()["body"])
    body["items"] = [{"sku": f"SKU-{n:04d}", "quantity": 1, "unitPrice": 100} for n in range(60)]

    response = api(create_event(body), env={"MAX_EVENT_BYTES": "4096"})

    assert response["statusCode"] == 413
    assert json_body(response)["error"]["code"] == "EVENT_TOO_LARGE"
    assert table_items() == []


def test_get_returns_the_order_and_404_for_an_unknown_id(api):
    created = json_body(api(create_event()))

    found = api(order_event("api_get_order.json", created["orderId"]))
    missing = api(load_event("api_get_order.json"))

    assert found["statusCode"] == 200
    assert json_body(found) == created
    assert missing["statusCode"] == 404
    assert json_body(missing)["error"]["code"] == "ORDER_NOT_FOUND"


def sqs_message(envelope: dict[str, Any]) -> dict[str, Any]:
    """An SQS batch of one message carrying `envelope` as EventBridge delivers it (the sample's shape)."""
    event = load_event("sqs_order_status_inventory_rejected.json")
    [record] = event["Records"]
    body = json.loads(record["body"])
    body.update({"detail-type": envelope["type"], "source": envelope["source"], "detail": envelope})
    record.update({"messageId": f"m-{envelope['id']}", "body": json.dumps(body)})
    return event


def order_schema() -> jsonschema.Draft202012Validator:
    """The OpenAPI document's Order (tools/docs/openapi.json), its references resolved in the document."""
    document = json.loads((ROOT / "tools" / "docs" / "openapi.json").read_text())
    return jsonschema.Draft202012Validator(
        {"$ref": "urn:openapi#/components/schemas/Order"},
        registry=Registry().with_resource("urn:openapi", Resource.from_contents(document, DRAFT202012)),
    )


def test_get_of_a_rejected_order_says_why_and_which_lines(api, invoke, template):
    # The whole saga through the handlers: the API's OrderCreated to the inventory (the mug short, the pen
    # never stocked), its InventoryRejected to the order-status consumer, then GET.
    created = json_body(api(create_event()))  # SKU-RED-MUG x2, SKU-BLUE-PEN x1
    DynamoInventoryRepository(Settings.from_env()).set_stock("SKU-RED-MUG", 1)
    [order_created] = outbox_envelopes(table_items_of(template, "OrdersTable"))
    assert invoke("InventoryFunction", sqs_message(order_created))["batchItemFailures"] == []
    [inventory_rejected] = outbox_envelopes(table_items_of(template, "InventoryTable"))
    assert invoke("OrderStatusFunction", sqs_message(inventory_rejected))["batchItemFailures"] == []

    response = api(order_event("api_get_order.json", created["orderId"]))

    assert response["statusCode"] == 200
    order = json_body(response)
    assert order["status"] == "REJECTED"
    assert order["rejection"] == {
        "reason": "UNKNOWN_SKU",
        "lines": [
            {"sku": "SKU-BLUE-PEN", "quantity": 1, "reason": "UNKNOWN_SKU"},
            {"sku": "SKU-RED-MUG", "quantity": 2, "reason": "INSUFFICIENT_STOCK"},
        ],
    }
    order_schema().validate(order)


def rejected_order(api: Callable[..., dict[str, Any]]) -> str:
    """An order placed, then REJECTED in its item as written before reasons were kept (no rejection)."""
    order_id = str(json_body(api(create_event()))["orderId"])
    boto3.client("dynamodb").update_item(
        TableName="local-OrdersTable",
        Key={"PK": {"S": f"ORDER#{order_id}"}, "SK": {"S": "ORDER"}},
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":s": {"S": "REJECTED"}},
    )
    return order_id


def test_get_of_an_order_rejected_before_reasons_were_kept_answers_without_one(api):
    response = api(order_event("api_get_order.json", rejected_order(api)))

    assert response["statusCode"] == 200
    order = json_body(response)
    assert (order["status"], "rejection" in order) == ("REJECTED", False)
    order_schema().validate(order)


def test_cancel_moves_to_cancelled_with_an_event_and_is_idempotent(api, table_items):
    created = json_body(api(create_event()))

    first = api(order_event("api_cancel_order.json", created["orderId"]))
    again = api(order_event("api_cancel_order.json", created["orderId"]))

    assert first["statusCode"] == again["statusCode"] == 200
    assert json_body(first)["status"] == "CANCELLED"
    assert json_body(first)["version"] == 2
    assert json_body(again) == json_body(first)
    types = [(e["type"], e["sequence"]) for e in outbox_envelopes(table_items())]
    assert sorted(types) == [("OrderCancelled", 2), ("OrderCreated", 1)]


def test_cancelling_a_rejected_order_is_a_409(api, table_items):
    response = api(order_event("api_cancel_order.json", rejected_order(api)))

    assert response["statusCode"] == 409
    assert json_body(response)["error"]["code"] == "ILLEGAL_TRANSITION"
    assert [e["type"] for e in outbox_envelopes(table_items())] == ["OrderCreated"]


def test_throttled_write_is_a_503_with_retry_after(api, table_items, monkeypatch):
    api(create_event(key="warm-up"))  # builds the cached client the stub attaches to
    before = table_items()
    # throttled past the retry budget
    monkeypatch.setattr(shop.adapters.dynamodb.transactions, "MAX_RETRY_SECONDS", 0.0)
    with Stubber(shop.adapters.aws.dynamodb()) as stub:
        stub.add_client_error("transact_write_items", service_error_code="ThrottlingException")

        response = api(create_event(key="throttled"))

    assert response["statusCode"] == 503
    assert header(response, "Retry-After") == "1"
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"
    assert table_items() == before


def test_a_throttled_read_is_a_503_with_retry_after(api):
    created = json_body(api(create_event(key="warm-up")))  # also builds the client the stub attaches to
    with Stubber(shop.adapters.aws.dynamodb()) as stub:
        stub.add_client_error("get_item", service_error_code="ProvisionedThroughputExceededException")

        response = api(order_event("api_get_order.json", created["orderId"]))

    assert response["statusCode"] == 503
    assert header(response, "Retry-After") == "1"
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"


def test_a_replay_whose_key_record_read_is_throttled_is_a_503(api, monkeypatch):
    api(create_event(key="k-1"))
    with Stubber(shop.adapters.aws.dynamodb()) as stub:  # the retry finds the key taken, then reads it
        stub.add_client_error(
            "transact_write_items",
            service_error_code="TransactionCanceledException",
            modeled_fields={
                "CancellationReasons": [
                    {"Code": "None"},
                    {"Code": "None"},
                    {"Code": "ConditionalCheckFailed"},
                ]
            },
        )
        stub.add_client_error("get_item", service_error_code="ThrottlingException")

        response = api(create_event(key="k-1"))

    assert response["statusCode"] == 503
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"


@pytest.mark.parametrize(
    "failure",
    [
        ReadTimeoutError(endpoint_url="http://dynamodb"),
        EndpointConnectionError(endpoint_url="http://dynamodb"),
    ],
    ids=["read-timeout", "no-connection"],
)
@pytest.mark.parametrize("request_name", ["api_get_order.json", "api_cancel_order.json"])
def test_a_read_the_sdk_gave_up_on_is_a_503_as_on_postgresql(api, monkeypatch, failure, request_name):
    created = json_body(api(create_event(key="warm-up")))
    client = shop.adapters.aws.dynamodb()

    def gave_up(**kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr(client, "get_item", gave_up)

    response = api(order_event(request_name, created["orderId"]))

    assert response["statusCode"] == 503
    assert header(response, "Retry-After") == "1"
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"


@pytest.mark.parametrize(
    "failure",
    [
        ReadTimeoutError(endpoint_url="http://dynamodb"),
        ClientError({"Error": {"Code": "TransactionInProgressException"}}, "TransactWriteItems"),
    ],
    ids=["read-timeout", "transaction-in-progress"],
)
def test_a_create_whose_outcome_stays_unknown_is_a_503_and_its_retry_creates_one_order(
    api, table_items, monkeypatch, failure
):
    api(create_event(key="warm-up"))
    monkeypatch.setattr(shop.adapters.dynamodb.transactions, "MAX_RETRY_SECONDS", 0.0)
    client = shop.adapters.aws.dynamodb()
    commit = client.transact_write_items

    def lost(**kwargs: Any) -> Any:
        commit(**kwargs)  # committed, and then its answer is lost
        raise failure

    monkeypatch.setattr(client, "transact_write_items", lost)
    response = api(create_event(key="lost"))
    monkeypatch.setattr(client, "transact_write_items", commit)
    retried = api(create_event(key="lost"))

    assert response["statusCode"] == 503
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"
    assert retried["statusCode"] == 201
    assert header(retried, "Idempotent-Replayed") == "true"
    assert len(outbox_envelopes(table_items())) == 2  # warm-up's and this one's


def test_unexpected_failure_is_a_500_without_internals(api):
    api(create_event(key="warm-up"))
    with Stubber(shop.adapters.aws.dynamodb()) as stub:
        stub.add_client_error("transact_write_items", service_error_code="InternalServerError")

        response = api(create_event(key="boom"))

    assert response["statusCode"] == 500
    assert json_body(response) == {
        "error": {"code": "INTERNAL_ERROR", "message": "the request could not be completed", "details": {}}
    }
    assert "Traceback" not in response["body"]
    assert "local-OrdersTable" not in response["body"]
    assert header(response, "X-Correlation-Id") == "corr-demo-0001"  # errors carry it too


REQUEST_ID = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"  # requestContext.requestId of the sample events


def unknown_route_event() -> dict[str, Any]:
    event = load_event("api_get_order.json")
    event["path"] = event["resource"] = "/nowhere"
    event["pathParameters"] = None
    return event


def wrong_media_type_event() -> dict[str, Any]:
    return load_event("api_create_order_wrong_content_type.json")


def bad_key_event() -> dict[str, Any]:
    return create_event(key="has spaces")


@pytest.mark.parametrize(
    ("event", "status", "code"),
    [
        (create_event, 201, None),
        (unknown_route_event, 404, "ROUTE_NOT_FOUND"),
        (wrong_media_type_event, 415, "UNSUPPORTED_MEDIA_TYPE"),
        (bad_key_event, 400, "INVALID_HEADER"),
        (lambda: load_event("api_create_order_invalid_fields.json"), 422, "VALIDATION_FAILED"),
    ],
    ids=["created", "unknown-route", "media-type", "bad-idempotency-key", "invalid-fields"],
)
def test_every_answer_carries_the_correlation_id(api, event, status, code):
    request = event()
    request["headers"]["X-Correlation-Id"] = "corr-every-answer"

    response = api(request)

    assert response["statusCode"] == status
    assert header(response, "X-Correlation-Id") == "corr-every-answer"
    if code is not None:
        assert json_body(response)["error"]["code"] == code


@pytest.mark.parametrize("given", [None, "", "has spaces", "x" * 129, "é"])
def test_a_missing_or_malformed_correlation_id_is_replaced_by_the_request_id(api, given):
    request = create_event()
    del request["headers"]["X-Correlation-Id"]
    if given is not None:
        request["headers"]["X-Correlation-Id"] = given

    assert header(api(request), "X-Correlation-Id") == REQUEST_ID


def test_headers_are_read_whatever_their_case(api, table_items):
    request = create_event(key="lower-1")
    request["headers"] = {k.lower(): v for k, v in request["headers"].items()}
    request["multiValueHeaders"] = {k.lower(): v for k, v in request["multiValueHeaders"].items()}
    request["headers"]["x-correlation-id"] = "corr-lower"

    first = api(request)
    replay = api(copy.deepcopy(request))

    assert first["statusCode"] == 201
    assert header(first, "X-Correlation-Id") == "corr-lower"
    assert header(replay, "Idempotent-Replayed") == "true"  # idempotency-key was read


def test_an_idempotency_key_that_is_not_printable_ascii_is_a_400(api, table_items):
    response = api(create_event(key="x" * 256))

    assert response["statusCode"] == 400
    assert json_body(response)["error"]["code"] == "INVALID_HEADER"
    assert table_items() == []
