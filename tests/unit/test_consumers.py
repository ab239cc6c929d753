"""The three consumers against moto: idempotency, partial batch failures, ordering, crash windows."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.envelope import CloudEvent
from shop.domain.inventory import InventoryService, ReservationStatus
from shop.domain.orders import Order, OrderLine, OrderService, OrderStatus, PlaceOrder
from shop.domain.saga import OrderStatusPolicy
from shop.runtime.config import Settings
from tests.support import LambdaContext, load_event
from tests.support.clients import intercept_transactions
from tests.support.output import logged_with, metric_values
from tests.support.postgres import connect
from tests.unit.conftest import postgres_environment
from tools.template import Template

INVENTORY = "InventoryFunction"
ORDER_STATUS = "OrderStatusFunction"
NOTIFICATION = "NotificationFunction"
ORDER_ID = "o-0000000000000000000000000000a001"


class SimulatedCrash(BaseException):
    """Stands for the process dying: Powertools only cleans up after an Exception, not this."""


@contextmanager
def crashing(
    monkeypatch: pytest.MonkeyPatch, owner: type, method: str, *, write_first: bool
) -> Iterator[None]:
    """The process dies in `owner.method` (after its write when write_first) during the block, once."""
    real = getattr(owner, method)

    def crash(self: Any, *args: Any) -> None:
        if write_first:
            real(self, *args)
        raise SimulatedCrash

    monkeypatch.setattr(owner, method, crash)
    try:
        with pytest.raises(SimulatedCrash):
            yield
    finally:
        monkeypatch.setattr(owner, method, real)


@pytest.fixture
def settings(aws: None, template: Template, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("OrdersTable", "InventoryTable"):
        monkeypatch.setenv(f"{name[:-5].upper()}_TABLE_NAME", template.physical_name(name))
    return Settings.from_env()


@pytest.fixture
def inventory(settings: Settings) -> DynamoInventoryRepository:
    repository = DynamoInventoryRepository(settings)
    repository.set_stock("SKU-RED-MUG", 10)
    repository.set_stock("SKU-BLUE-PEN", 5)
    return repository


@pytest.fixture
def orders(settings: Settings) -> OrderService:
    return OrderService(DynamoOrderRepository(settings), settings, new_id=lambda: ORDER_ID)


@pytest.fixture
def pending_order(orders: OrderService) -> Order:
    command = PlaceOrder(
        "c-1001", "USD", (OrderLine("SKU-RED-MUG", 2, 1250), OrderLine("SKU-BLUE-PEN", 1, 399))
    )
    orders.place_order(command, idempotency_key=None, correlation_id="corr-demo-0001")
    return orders.get_order(ORDER_ID)


@pytest.fixture
def notifications(aws: None, template: Template) -> Callable[[], list[dict[str, Any]]]:
    sns = boto3.client("sns")
    sqs = boto3.client("sqs")
    topic = sns.create_topic(Name=template.physical_name("NotificationTopic"))["TopicArn"]
    queue_url = sqs.create_queue(QueueName="notifications-capture")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})

    def received() -> list[dict[str, Any]]:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    return received


@pytest.fixture
def effect_calls(monkeypatch: pytest.MonkeyPatch) -> Callable[[type, str], list[str]]:
    """effect_calls(cls, method): the ids of the CloudEvents that effect is called with from now on.

    Idempotency is what keeps a redelivered event from reaching the effect at all; the effects' own
    domain guards only make a repeat harmless. Call before the function's first invocation in the
    test: a consumer binds its effect when it is built.
    """

    def spy(owner: type, name: str) -> list[str]:
        calls: list[str] = []
        real = getattr(owner, name)

        def recording(self: Any, event: CloudEvent) -> str:
            calls.append(event.id)
            outcome: str = real(self, event)
            return outcome

        monkeypatch.setattr(owner, name, recording)
        return calls

    return spy


def outbox(template: Template, table: str) -> list[dict[str, Any]]:
    items = boto3.client("dynamodb").scan(TableName=template.physical_name(table))["Items"]
    return [json.loads(i["envelope"]["S"]) for i in items if i["SK"]["S"].startswith("OUTBOX#")]


def failures(response: dict[str, Any]) -> list[str]:
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def expire_in_progress_records(template: Template) -> None:
    """What time does to the IN_PROGRESS record of a dead consumer once its deadline passed (the
    deadline itself is the consumer's to write: see the in-progress read-back test below)."""
    client = boto3.client("dynamodb")
    table = template.physical_name("IdempotencyTable")
    past = str(int(time.time() * 1000) - 1000)
    for item in client.scan(TableName=table)["Items"]:
        client.update_item(
            TableName=table,
            Key={"id": item["id"]},
            UpdateExpression="SET in_progress_expiration = :past",
            ExpressionAttributeValues={":past": {"N": past}},
        )


def idempotency_records(template: Template) -> dict[str, dict[str, Any]]:
    """The consumers' idempotency records as Powertools wrote them, by id."""
    table = template.physical_name("IdempotencyTable")
    return {i["id"]["S"]: i for i in boto3.client("dynamodb").scan(TableName=table)["Items"]}


def idempotency_key(function_name: str, event_id: str) -> str:
    """The record id of a CloudEvent id: the pinned prefix (written out here: it must never change, or
    every consumer forgets what it applied), '#', and Powertools' hash of the key the consumer gives it,
    the `id` (aws_lambda_powertools/utilities/idempotency/persistence/base.py, _generate_hash)."""
    digest = hashlib.md5(json.dumps(event_id, sort_keys=True).encode()).hexdigest()  # noqa: S324
    return f"{function_name}.shop.runtime.consumer.IdempotentConsumer.__init__.<locals>.apply_once#{digest}"


def with_event_id(record: dict[str, Any], event_id: str) -> dict[str, Any]:
    """The same SQS record carrying the same CloudEvent under another id (another message)."""
    body = json.loads(record["body"])
    body["detail"]["id"] = event_id
    return delivered_as({**record, "body": json.dumps(body)}, f"m-{event_id}")


def forget_processed_events(template: Template) -> None:
    """What TTL does to idempotency records after expires_after_seconds."""
    client = boto3.client("dynamodb")
    table = template.physical_name("IdempotencyTable")
    for item in client.scan(TableName=table)["Items"]:
        client.delete_item(TableName=table, Key={"id": item["id"]})


# --- inventory ---------------------------------------------------------------------------------------
def test_order_created_reserves_every_line_and_emits_inventory_reserved(invoke, inventory, template):
    event = load_event("sqs_inventory_order_created.json")
    created = json.loads(event["Records"][0]["body"])["detail"]

    assert failures(invoke(INVENTORY, event)) == []

    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (8, 4)
    [reserved] = outbox(template, "InventoryTable")
    assert reserved["type"] == "InventoryReserved"
    assert reserved["subject"] == ORDER_ID
    assert reserved["causationid"] == created["id"]
    assert reserved["correlationid"] == created["correlationid"]


def test_one_event_delivered_in_three_messages_reaches_the_inventory_effect_once(
    invoke, inventory, template, effect_calls
):
    # Given the inventory effect is watched (it has its own guard: a second reserve would be a no-op)
    applied = effect_calls(InventoryService, "apply")
    duplicate = load_event("sqs_inventory_duplicate.json")
    [event_id] = {json.loads(r["body"])["detail"]["id"] for r in duplicate["Records"]}

    # When one OrderCreated arrives in two messages of one batch (distinct message ids), then a third
    assert failures(invoke(INVENTORY, duplicate)) == []
    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    # Then idempotency let it through to the effect once: the repeats never reached the guard
    assert applied == [event_id]
    assert inventory.available("SKU-RED-MUG") == 8
    assert len(outbox(template, "InventoryTable")) == 1


def test_a_malformed_message_fails_alone(invoke, inventory, template):
    event = load_event("sqs_inventory_malformed_batch.json")
    malformed = event["Records"][1]["messageId"]

    assert failures(invoke(INVENTORY, event)) == [malformed]

    assert inventory.available("SKU-RED-MUG") == 6  # both well-formed orders reserved 2 each
    assert sorted(e["subject"] for e in outbox(template, "InventoryTable")) == sorted(
        [ORDER_ID, "o-0000000000000000000000000000b002"]
    )


BAD_LINES = pytest.mark.parametrize(
    ("field", "value"),
    [
        ("quantity", -3),  # int() took it: the reservation added 3 to the stock
        ("quantity", 0),
        ("quantity", 2.9),
        ("quantity", "2"),
        ("quantity", True),
        ("quantity", None),
        ("sku", ""),
        ("sku", 7),
    ],
    ids=["negative", "zero", "fraction", "string", "bool", "null", "empty-sku", "number-sku"],
)


def with_bad_line(record: dict[str, Any], lines: str, field: str, value: Any) -> dict[str, Any]:
    """The record as another event (m-bad) whose line naming SKU-RED-MUG carries `value` as `field`."""
    bad = with_event_id(record, "e-bad")
    body = json.loads(bad["body"])
    [line] = [line for line in body["detail"]["data"][lines] if line["sku"] == "SKU-RED-MUG"]
    line[field] = value
    return delivered_as({**bad, "body": json.dumps(body)}, "m-bad")


def assert_a_bad_line_fails_alone(
    invoke: Any, function: str, sample: str, lines: str, field: str, value: Any, caplog: Any
) -> None:
    """The sample's message beside one whose line carries `value` as `field`: that one fails alone,
    logged with its event id as an InvalidEnvelope."""
    event = load_event(sample)
    [good] = event["Records"]
    event["Records"] = [with_bad_line(good, lines, field, value), good]

    assert failures(invoke(function, event)) == ["m-bad"]

    [logged] = logged_with(caplog, "message failed; it will be retried and then dead-lettered")
    assert (logged["event_id"], logged["error_type"]) == ("e-bad", "InvalidEnvelope")


@BAD_LINES
def test_an_order_line_the_contract_forbids_fails_its_message_alone_and_moves_no_stock(
    invoke, inventory, template, caplog, field, value
):
    assert_a_bad_line_fails_alone(
        invoke, INVENTORY, "sqs_inventory_order_created.json", "items", field, value, caplog
    )
    # Only the good message reserved: 2 mugs and a pen out of 10 and 5, one InventoryReserved of its lines.
    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (8, 4)
    [reserved] = outbox(template, "InventoryTable")
    assert reserved["data"]["lines"] == [
        {"sku": "SKU-BLUE-PEN", "quantity": 1},
        {"sku": "SKU-RED-MUG", "quantity": 2},
    ]


def test_a_failed_message_is_logged_with_its_message_and_event_ids_and_counted(
    invoke, inventory, monkeypatch, capsys, caplog
):
    event = load_event("sqs_inventory_order_created.json")
    [record] = event["Records"]

    def broken(self: InventoryService, cloud_event: CloudEvent) -> str:
        raise RuntimeError("inventory broke")

    monkeypatch.setattr(InventoryService, "apply", broken)

    # Every message of the batch failed: still reported message by message, not as a function error.
    assert failures(invoke(INVENTORY, event)) == [record["messageId"]]

    [logged] = logged_with(caplog, "message failed; it will be retried and then dead-lettered")
    assert logged["message_id"] == record["messageId"]
    assert logged["event_id"] == json.loads(record["body"])["detail"]["id"]
    assert (logged["error_type"], logged["error"]) == ("RuntimeError", "inventory broke")
    assert metric_values(capsys.readouterr().out, "MessagesFailed") == [1]


@pytest.mark.parametrize(
    "body",
    [
        "[1]",
        '{"detail": "not an object"}',
        "{}",
        "not json",
        '{"detail": ' + "[" * 100_000 + "]" * 100_000 + "}",  # past the recursion limit: RecursionError
        '{"detail": {"id": ' + "9" * 5_000 + "}}",  # past the integer digit limit: a plain ValueError
    ],
    ids=["a-list", "detail-a-string", "no-detail", "not-json", "nested-too-deeply", "integer-too-long"],
)
def test_a_message_that_is_no_event_fails_alone_logged_without_an_event_id(invoke, inventory, caplog, body):
    event = load_event("sqs_inventory_order_created.json")
    [good] = event["Records"]
    bad = {**good, "messageId": "m-bad", "body": body}
    event["Records"] = [bad, good]

    assert failures(invoke(INVENTORY, event)) == ["m-bad"]

    [logged] = logged_with(caplog, "message failed; it will be retried and then dead-lettered")
    assert (logged["message_id"], logged["event_id"]) == ("m-bad", None)
    assert inventory.available("SKU-RED-MUG") == 8  # the good message was applied


def test_each_duplicate_skipped_is_logged_with_its_idempotency_key_and_counted(
    invoke, inventory, capsys, caplog
):
    duplicate = load_event("sqs_inventory_duplicate.json")  # one event in two messages
    [event_id] = {json.loads(r["body"])["detail"]["id"] for r in duplicate["Records"]}

    assert failures(invoke(INVENTORY, duplicate)) == []

    [skipped] = logged_with(caplog, "duplicate event skipped")
    assert skipped["idempotency_key"] == idempotency_key("test-func", event_id)  # no AWS_LAMBDA_FUNCTION_NAME
    assert metric_values(capsys.readouterr().out, "DuplicatesSkipped") == [1]


def test_missing_stock_rejects_the_whole_order(invoke, inventory, template):
    inventory.set_stock("SKU-RED-MUG", 1)

    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (1, 5)
    [rejected] = outbox(template, "InventoryTable")
    assert rejected["type"] == "InventoryRejected"
    assert rejected["data"]["shortSkus"] == ["SKU-RED-MUG"]
    assert rejected["data"]["unknownSkus"] == []  # stocked, only short


def test_a_hot_sku_conflicting_with_other_reservations_still_reserves_without_a_failed_receive(
    invoke, inventory, template, monkeypatch
):
    """Many orders on one SKU at once: DynamoDB cancels all but one of the overlapping transactions
    (TransactionConflict). The consumer retries in-process, so the message does not fail and burn one
    of its maxReceiveCount receives per conflict (after 5 it would be dead-lettered, the order PENDING)."""
    conflicts = {"left": 4}

    def contended(client: Any, kwargs: dict[str, Any]) -> Any:
        """The next transactions are cancelled by overlapping ones."""
        if conflicts["left"]:
            conflicts["left"] -= 1
            reasons = [{"Code": "None"}] * (len(kwargs["TransactItems"]) - 1)
            response: Any = {
                "Error": {"Code": "TransactionCanceledException"},
                "CancellationReasons": [*reasons, {"Code": "TransactionConflict"}],
            }
            raise client.exceptions.TransactionCanceledException(response, "TransactWriteItems")
        return client.transact_write_items(**kwargs)

    intercept_transactions(monkeypatch, contended)

    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    assert conflicts["left"] == 0
    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (8, 4)
    assert [event["type"] for event in outbox(template, "InventoryTable")] == ["InventoryReserved"]


def key_name(key: dict[str, Any]) -> str:
    """An item's key as one string, PK#SK."""
    return f"{key[keys.PK]['S']}#{key[keys.SK]['S']}"


def refuse_transactions(monkeypatch: pytest.MonkeyPatch, refused: dict[str, str]) -> list[list[str]]:
    """From now on DynamoDB cancels every transaction with an action on an item of `refused` (keys: the
    item's PK#SK; values: the reason code of that action), every other action's reason None, as AWS
    answers: TransactionCanceledException with one CancellationReason per action, in order, and a
    message naming them (TransactWriteItems API reference: "a similar validation error occurs because of
    changes made by the transaction", e.g. `available + :q` on a deleted stock item). moto answers such
    an update with a plain ValidationException instead. Emptying `refused` lifts the refusal. Returns the
    codes of each cancellation."""
    cancellations: list[list[str]] = []

    def item(action: dict[str, Any]) -> str:
        [body] = action.values()
        return key_name(body["Key"] if "Key" in body else keys.item_key(body["Item"]))

    def transact(client: Any, kwargs: dict[str, Any]) -> Any:
        codes = [refused.get(item(action), "None") for action in kwargs["TransactItems"]]
        if set(codes) == {"None"}:
            return client.transact_write_items(**kwargs)
        cancellations.append(codes)
        response: Any = {
            "Error": {
                "Code": "TransactionCanceledException",
                "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons "
                f"[{', '.join(codes)}]",
            },
            "CancellationReasons": [{"Code": code} for code in codes],
        }
        raise client.exceptions.TransactionCanceledException(response, "TransactWriteItems")

    intercept_transactions(monkeypatch, transact)
    return cancellations


@pytest.mark.parametrize(
    "refused",
    [
        {"SKU-BLUE-PEN": "ValidationError"},
        {"SKU-BLUE-PEN": "ItemCollectionSizeLimitExceeded"},
        # One SKU short (no stock item) and the other refused: the shortage is not the whole answer.
        {"SKU-RED-MUG": "ConditionalCheckFailed", "SKU-BLUE-PEN": "ValidationError"},
    ],
    ids=["validation-error", "item-collection-too-large", "short-and-validation-error"],
)
def test_a_reservation_cancelled_for_anything_but_short_stock_fails_the_message_and_rejects_nothing(
    invoke, inventory, template, monkeypatch, caplog, refused
):
    """Only failed stock conditions make an order short. Any other reason is no shortage: a rejection
    would name SKUs that may not be short, or none at all (which the order side refuses forever, the
    order left PENDING); the message fails instead, is retried, then dead-lettered with its error."""
    event = load_event("sqs_inventory_order_created.json")
    cancellations = refuse_transactions(
        monkeypatch, {key_name(keys.stock_key(sku)): code for sku, code in refused.items()}
    )

    assert failures(invoke(INVENTORY, event)) == [event["Records"][0]["messageId"]]

    assert len(cancellations) == 1
    [logged] = logged_with(caplog, "message failed; it will be retried and then dead-lettered")
    assert logged["error_type"] == "TransactionCanceledException"
    assert all(code in logged["error"] for code in refused.values())
    assert inventory.get_reservation(ORDER_ID) is None
    assert outbox(template, "InventoryTable") == []
    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (10, 5)


def test_a_release_cancelled_for_a_stock_item_it_cannot_update_fails_until_that_is_fixed(
    invoke, inventory, template, monkeypatch, caplog
):
    """An operator deleted a SKU's stock item while an order held some: the release cannot add to it, and
    AWS cancels the transaction with ValidationError as that action's reason. The reservation did not
    change, so this is no stale cancel to acknowledge: the message fails (the mugs are not left reserved
    for good behind a completed idempotency record) and, once the stock item is back, its retry releases."""
    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []
    refused = {key_name(keys.stock_key("SKU-BLUE-PEN")): "ValidationError"}
    cancellations = refuse_transactions(monkeypatch, refused)
    cancelled = load_event("sqs_inventory_order_cancelled.json")

    assert failures(invoke(INVENTORY, cancelled)) == [cancelled["Records"][0]["messageId"]]

    assert cancellations == [["None", "None", "ValidationError", "None"]]  # reservation, event, pen, mug
    [logged] = logged_with(caplog, "message failed; it will be retried and then dead-lettered")
    assert logged["error_type"] == "TransactionCanceledException"
    assert "[None, None, ValidationError, None]" in logged["error"]
    reservation = inventory.get_reservation(ORDER_ID)
    assert reservation is not None
    assert reservation.status is ReservationStatus.RESERVED
    assert [e["type"] for e in outbox(template, "InventoryTable")] == ["InventoryReserved"]

    # The operator restores the stock item; the message's next receive releases what the order held
    refused.clear()
    assert failures(invoke(INVENTORY, cancelled)) == []

    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (10, 5)
    assert sorted(e["type"] for e in outbox(template, "InventoryTable")) == [
        "InventoryReleased",
        "InventoryReserved",
    ]


def test_a_cancel_first_whose_tombstone_is_refused_fails_after_one_attempt(invoke, inventory, monkeypatch):
    """The tombstone's write was refused, not beaten by a create: no reservation to release appears, so
    the cancel is not tried again and again in the same invocation (it recursed until RecursionError)."""
    cancellations = refuse_transactions(
        monkeypatch, {key_name(keys.reservation_key(ORDER_ID)): "ValidationError"}
    )
    cancelled = load_event("sqs_inventory_order_cancelled.json")

    assert failures(invoke(INVENTORY, cancelled)) == [cancelled["Records"][0]["messageId"]]

    assert cancellations == [["ValidationError"]]
    assert inventory.get_reservation(ORDER_ID) is None


def test_cancel_releases_what_was_reserved(invoke, inventory, template):
    invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))

    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_cancelled.json"))) == []

    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (10, 5)
    assert sorted(e["type"] for e in outbox(template, "InventoryTable")) == [
        "InventoryReleased",
        "InventoryReserved",
    ]


def test_a_cancel_that_arrives_first_means_the_late_create_reserves_nothing(invoke, inventory, template):
    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_cancelled.json"))) == []
    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (10, 5)
    assert outbox(template, "InventoryTable") == []


def test_a_stale_create_redelivered_after_its_record_expired_changes_nothing(invoke, inventory, template):
    invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))
    invoke(INVENTORY, load_event("sqs_inventory_order_cancelled.json"))
    forget_processed_events(template)

    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    assert inventory.available("SKU-RED-MUG") == 10
    assert len(outbox(template, "InventoryTable")) == 2


@pytest.mark.parametrize("crash_point", ["before-business-write", "after-business-write"])
def test_a_consumer_killed_mid_event_applies_it_exactly_once_after_in_progress_expiry(
    invoke, inventory, template, monkeypatch, crash_point
):
    event = load_event("sqs_inventory_order_created.json")
    write_first = crash_point == "after-business-write"
    with crashing(monkeypatch, DynamoInventoryRepository, "reserve", write_first=write_first):
        invoke(INVENTORY, event)

    # While the dead invocation's lock is still valid, a redelivery is refused (and retried later)
    assert failures(invoke(INVENTORY, event)) == [event["Records"][0]["messageId"]]
    expire_in_progress_records(template)
    assert failures(invoke(INVENTORY, event)) == []
    assert failures(invoke(INVENTORY, event)) == []  # and later duplicates stay no-ops

    assert inventory.available("SKU-RED-MUG") == 8
    assert [e["type"] for e in outbox(template, "InventoryTable")] == ["InventoryReserved"]


# --- order status ------------------------------------------------------------------------------------
def test_inventory_reserved_confirms_the_pending_order_and_a_redelivery_never_reaches_the_effect(
    invoke, orders, pending_order, template, effect_calls
):
    # Given the order-status effect is watched (it has its own guard: only a PENDING order moves)
    applied = effect_calls(OrderStatusPolicy, "apply")
    event = load_event("sqs_order_status_inventory_reserved.json")
    reserved = json.loads(event["Records"][0]["body"])["detail"]

    # When the InventoryReserved message is delivered twice
    assert failures(invoke(ORDER_STATUS, event)) == []
    assert failures(invoke(ORDER_STATUS, event)) == []

    # Then the effect ran once (the redelivery was answered from the idempotency record)...
    assert applied == [reserved["id"]]
    # ... and the order was confirmed once, with one OrderConfirmed event caused by that message
    order = orders.get_order(ORDER_ID)
    assert (order.status, order.version) == (OrderStatus.CONFIRMED, 2)
    confirmed = [e for e in outbox(template, "OrdersTable") if e["type"] == "OrderConfirmed"]
    assert len(confirmed) == 1
    assert confirmed[0]["causationid"] == reserved["id"]
    assert confirmed[0]["sequence"] == 2


def test_inventory_rejected_rejects_the_pending_order(invoke, orders, pending_order, template):
    assert failures(invoke(ORDER_STATUS, load_event("sqs_order_status_inventory_rejected.json"))) == []

    assert orders.get_order(ORDER_ID).status is OrderStatus.REJECTED
    assert [e["type"] for e in outbox(template, "OrdersTable")].count("OrderRejected") == 1


@BAD_LINES
def test_an_inventory_rejected_line_the_contract_forbids_fails_its_message_alone(
    invoke, orders, pending_order, caplog, field, value
):
    assert_a_bad_line_fails_alone(
        invoke, ORDER_STATUS, "sqs_order_status_inventory_rejected.json", "lines", field, value, caplog
    )
    rejection = orders.get_order(ORDER_ID).rejection
    assert rejection is not None
    assert [(line.sku, line.quantity) for line in rejection.lines] == [("SKU-RED-MUG", 2)]


def test_status_write_that_landed_before_a_crash_is_not_applied_twice(
    invoke, orders, pending_order, template, monkeypatch
):
    event = load_event("sqs_order_status_inventory_reserved.json")
    with crashing(monkeypatch, DynamoOrderRepository, "save_transition", write_first=True):
        invoke(ORDER_STATUS, event)
    expire_in_progress_records(template)

    assert failures(invoke(ORDER_STATUS, event)) == []

    assert orders.get_order(ORDER_ID).version == 2
    assert [e["type"] for e in outbox(template, "OrdersTable")].count("OrderConfirmed") == 1


def test_a_cancel_racing_the_reservation_wins_and_the_stock_is_released(
    invoke, orders, pending_order, inventory, template
):
    # Given inventory reserved the order, and the customer cancelled before the order was confirmed
    invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))
    cancelled = orders.cancel_order(ORDER_ID, correlation_id="corr-demo-0002")
    cancel_event = next(e for e in outbox(template, "OrdersTable") if e["type"] == "OrderCancelled")
    assert cancel_event["sequence"] == cancelled.version

    # When the late InventoryReserved reaches the order and the OrderCancelled reaches inventory
    assert failures(invoke(ORDER_STATUS, load_event("sqs_order_status_inventory_reserved.json"))) == []
    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_cancelled.json"))) == []

    # Then the order stays cancelled and the stock is back
    assert orders.get_order(ORDER_ID).status is OrderStatus.CANCELLED
    assert "OrderConfirmed" not in [e["type"] for e in outbox(template, "OrdersTable")]
    assert (inventory.available("SKU-RED-MUG"), inventory.available("SKU-BLUE-PEN")) == (10, 5)


# --- notifications -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("event_file", "event_type"),
    [
        ("sqs_notification_order_confirmed.json", "OrderConfirmed"),
        ("sqs_notification_order_rejected.json", "OrderRejected"),
        ("sqs_notification_order_cancelled.json", "OrderCancelled"),
    ],
)
def test_each_outcome_notifies_the_customer_exactly_once(invoke, notifications, event_file, event_type):
    event = load_event(event_file)

    assert failures(invoke(NOTIFICATION, event)) == []
    assert failures(invoke(NOTIFICATION, event)) == []

    [message] = notifications()
    assert message["type"] == event_type
    assert message["orderId"] == ORDER_ID
    assert message["eventId"] == json.loads(event["Records"][0]["body"])["detail"]["id"]
    assert set(message) == {"eventId", "type", "orderId", "customerId", "status", "sequence"}


def delivered_as(record: dict[str, Any], message_id: str) -> dict[str, Any]:
    """The same body in another SQS message: SQS delivers at least once, and a republish is new."""
    return {**record, "messageId": message_id, "receiptHandle": f"handle-{message_id}"}


@pytest.mark.parametrize("batches", [1, 2], ids=["in-one-batch", "in-two-batches"])
def test_one_event_in_two_sqs_messages_notifies_the_customer_once(invoke, notifications, batches):
    # Given one OrderConfirmed carried by two SQS messages with different message ids
    record = load_event("sqs_notification_order_confirmed.json")["Records"][0]
    messages = [delivered_as(record, "m-first"), delivered_as(record, "m-second")]

    # When they are consumed, together or one after the other
    for batch in [messages] if batches == 1 else [[m] for m in messages]:
        assert failures(invoke(NOTIFICATION, {"Records": batch})) == []

    # Then the customer got one notification: the effect is keyed on the CloudEvent id, not the message
    [message] = notifications()
    assert message["eventId"] == json.loads(record["body"])["detail"]["id"]


def test_a_malformed_notification_message_fails_alone(invoke, notifications):
    good = load_event("sqs_notification_order_confirmed.json")["Records"][0]
    bad = {**good, "messageId": "m-bad", "body": "{}"}

    response = invoke(NOTIFICATION, {"Records": [bad, good]})

    assert failures(response) == ["m-bad"]
    assert len(notifications()) == 1


# --- the idempotency records, read back ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("function", "event_file"),
    [
        (INVENTORY, "sqs_inventory_order_created.json"),
        (ORDER_STATUS, "sqs_order_status_inventory_reserved.json"),
        (NOTIFICATION, "sqs_notification_order_confirmed.json"),
    ],
)
def test_each_consumer_keys_its_record_on_its_function_name_and_the_cloud_event_id(
    invoke, inventory, pending_order, notifications, template, function, event_file
):
    event = load_event(event_file)
    event_id = json.loads(event["Records"][0]["body"])["detail"]["id"]
    function_name = template.physical_name(function)  # what Lambda sets AWS_LAMBDA_FUNCTION_NAME to

    assert failures(invoke(function, event, env={"AWS_LAMBDA_FUNCTION_NAME": function_name})) == []

    [record] = idempotency_records(template).values()
    assert record["id"]["S"] == idempotency_key(function_name, event_id)
    assert record["status"]["S"] == "COMPLETED"


def test_two_events_of_one_saga_are_two_records_and_both_reach_the_effect(
    invoke, inventory, template, effect_calls
):
    applied = effect_calls(InventoryService, "apply")
    record = load_event("sqs_inventory_order_created.json")["Records"][0]
    first = json.loads(record["body"])["detail"]["id"]
    second = str(uuid.uuid4())  # same correlation id, same order: only the id differs
    batch = {"Records": [record, with_event_id(record, second)]}
    function_name = template.physical_name(INVENTORY)

    assert failures(invoke(INVENTORY, batch, env={"AWS_LAMBDA_FUNCTION_NAME": function_name})) == []

    assert applied == [first, second]
    assert set(idempotency_records(template)) == {
        idempotency_key(function_name, first),
        idempotency_key(function_name, second),
    }


def test_an_applied_event_is_remembered_for_the_whole_republish_window(invoke, inventory, template):
    window = (int(template.parameter_values["OutboxTtlDays"]) + 19) * 86_400  # docs/guarantees.md
    before = time.time()

    assert failures(invoke(INVENTORY, load_event("sqs_inventory_order_created.json"))) == []

    [record] = idempotency_records(template).values()
    assert before + window - 1 <= int(record["expiration"]["N"]) <= time.time() + window


def test_an_in_progress_record_expires_at_the_deadline_of_the_invocation_that_wrote_it(
    invoke, inventory, template, monkeypatch
):
    timeout = 137.0  # not the function's Timeout: the deadline must come from the context
    started = time.time()
    context = LambdaContext(function_name=INVENTORY, timeout_seconds=timeout)
    with crashing(monkeypatch, DynamoInventoryRepository, "reserve", write_first=False):
        invoke(INVENTORY, load_event("sqs_inventory_order_created.json"), context=context)
    ended = time.time()

    # The process died with the record IN_PROGRESS: a redelivery waits for exactly that deadline
    [record] = idempotency_records(template).values()
    assert record["status"]["S"] == "INPROGRESS"
    deadline = int(record["in_progress_expiration"]["N"]) / 1000
    assert started + timeout - 1 <= deadline <= ended + timeout


# --- which trace a consumer's writes continue ------------------------------------------------------------
# The message's AWSTraceHeader (EventBridge hands it the PutEvents TraceHeader) and the invocation's own
# trace (Lambda's _X_AMZN_TRACE_ID for the SQS-triggered invocation): two different traces.
MESSAGE_TRACE = "Root=1-6740a1b0-00000000000000000000000c;Parent=000000000000000c;Sampled=1"
INVOCATION_TRACE = "Root=1-6740a1b1-00000000000000000000000d;Parent=000000000000000d;Sampled=1"


def with_trace_header(event: dict[str, Any], header: str | None) -> dict[str, Any]:
    for record in event["Records"]:
        if header is not None:
            record["attributes"]["AWSTraceHeader"] = header
    return event


@pytest.mark.parametrize("message_trace", [MESSAGE_TRACE, None], ids=["traced-message", "untraced-message"])
def test_a_consumers_writes_continue_the_consumed_messages_trace_not_the_invocations(
    invoke, pending_order, inventory, template, monkeypatch, message_trace
):
    """One saga, one trace (shop.runtime.trace_context): the event a consumer writes carries the trace of
    the message that caused it, so the relay's PutEvents continues the saga's trace; the invocation's own
    trace (X-Ray links it to the message's) only when the message carries none."""
    from shop.domain.tracing import from_xray_header

    monkeypatch.setenv("_X_AMZN_TRACE_ID", INVOCATION_TRACE)
    created = with_trace_header(load_event("sqs_inventory_order_created.json"), message_trace)
    reserved = with_trace_header(load_event("sqs_order_status_inventory_reserved.json"), message_trace)

    assert failures(invoke(INVENTORY, created)) == []
    assert failures(invoke(ORDER_STATUS, reserved)) == []

    expected = from_xray_header(message_trace or INVOCATION_TRACE)
    assert expected is not None
    written = {
        e["type"]: e.get("traceparent")
        for table in ("InventoryTable", "OrdersTable")
        for e in outbox(template, table)
        if e["type"] in {"InventoryReserved", "OrderConfirmed"}
    }
    assert written == {"InventoryReserved": expected.traceparent, "OrderConfirmed": expected.traceparent}


# --- the PostgreSQL order store's inbox: recorded with the transition, or not at all ----------------------
@pytest.fixture
def postgres_orders(
    settings: Settings, order_database: ConnectionSettings, database: Database
) -> tuple[dict[str, str], OrderService]:
    """The order-status consumer's environment for OrderStore=postgres, and the order service on the same
    (emptied) database with ORDER_ID placed, PENDING."""
    environment = postgres_environment(order_database)
    service = OrderService(PostgresOrderRepository(database, settings), settings, new_id=lambda: ORDER_ID)
    command = PlaceOrder("c-1001", "USD", (OrderLine("SKU-RED-MUG", 2, 1250),))
    service.place_order(command, idempotency_key=None, correlation_id="corr-demo-0001")
    return environment, service


def order_database_rows(settings: ConnectionSettings) -> dict[str, list[tuple[Any, ...]]]:
    """The order's status, its outbox rows and the inbox, as committed."""
    with connect(settings) as connection:
        return {
            "status": connection.execute("SELECT status, version FROM orders").fetchall(),
            "outbox": connection.execute("SELECT event_type FROM outbox ORDER BY sequence").fetchall(),
            "inbox": connection.execute("SELECT consumer, event_id FROM inbox").fetchall(),
        }


def test_a_transition_that_fails_after_its_inbox_row_leaves_neither_and_the_redelivery_applies_it(
    invoke, postgres_orders, order_database, monkeypatch
):
    """The inbox row, the status change and the outbox row are one transaction: the last statement
    failing (the outbox insert, past its statement timeout) leaves none of them, so the message fails
    and its redelivery applies the transition, once. An inbox row kept alone would refuse that
    redelivery (its cause "applied already"), a status change kept alone would lose OrderConfirmed."""
    import psycopg

    environment, _ = postgres_orders
    event = load_event("sqs_order_status_inventory_reserved.json")
    cause = json.loads(event["Records"][0]["body"])["detail"]["id"]
    with monkeypatch.context() as patch:

        def timed_out(*args: Any, **kwargs: Any) -> None:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

        patch.setattr("shop.adapters.postgres.order_repository.insert_outbox_row", timed_out)
        assert failures(invoke(ORDER_STATUS, event, env=environment)) == [event["Records"][0]["messageId"]]

    assert order_database_rows(order_database) == {
        "status": [("PENDING", 1)],
        "outbox": [("OrderCreated",)],
        "inbox": [],
    }
    assert failures(invoke(ORDER_STATUS, event, env=environment)) == []

    assert order_database_rows(order_database) == {
        "status": [("CONFIRMED", 2)],
        "outbox": [("OrderCreated",), ("OrderConfirmed",)],
        "inbox": [("order-status", cause)],
    }


def test_on_postgres_the_order_status_consumers_write_continues_the_consumed_messages_trace(
    invoke, postgres_orders, order_database, monkeypatch
):
    """OrderStore=postgres: the outbox row keeps the message's trace header beside the envelope, which
    carries its traceparent; the polling publisher or the logical relay hands it to PutEvents."""
    from shop.domain.tracing import from_xray_header

    environment, _ = postgres_orders
    monkeypatch.setenv("_X_AMZN_TRACE_ID", INVOCATION_TRACE)
    event = with_trace_header(load_event("sqs_order_status_inventory_reserved.json"), MESSAGE_TRACE)

    assert failures(invoke(ORDER_STATUS, event, env=environment)) == []

    with connect(order_database) as connection:
        found = connection.execute(
            "SELECT trace_header, envelope->>'traceparent' FROM outbox WHERE event_type = 'OrderConfirmed'"
        ).fetchall()
    expected = from_xray_header(MESSAGE_TRACE)
    assert expected is not None
    assert found == [(MESSAGE_TRACE, expected.traceparent)]


def test_a_transition_refused_at_its_version_leaves_no_inbox_row(
    invoke, postgres_orders, order_database, monkeypatch
):
    """The order changes between the consumer's read and its write (a cancel): the version condition
    refuses the transition, and the inbox row written before it in the same transaction goes with it.
    The consumer reads the order again, finds it cancelled and leaves it: nothing is recorded as applied."""
    environment, service = postgres_orders
    event = load_event("sqs_order_status_inventory_reserved.json")
    real_save = PostgresOrderRepository.save_transition
    writes: list[str] = []

    def cancel_first(self: PostgresOrderRepository, order: Order, expected_version: int, event: CloudEvent):
        writes.append(event.type)
        if writes == ["OrderConfirmed"]:  # the customer's cancel commits between the read and the write
            service.cancel_order(ORDER_ID, correlation_id="corr-demo-0002")
        real_save(self, order, expected_version, event)

    monkeypatch.setattr(PostgresOrderRepository, "save_transition", cancel_first)

    assert failures(invoke(ORDER_STATUS, event, env=environment)) == []

    assert writes == ["OrderConfirmed", "OrderCancelled"]  # the consumer's one write, refused
    assert order_database_rows(order_database) == {
        "status": [("CANCELLED", 2)],
        "outbox": [("OrderCreated",), ("OrderCancelled",)],
        "inbox": [],
    }
