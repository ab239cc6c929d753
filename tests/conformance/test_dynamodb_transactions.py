"""DynamoDB Local's TransactWriteItems against the API reference, where the order store relies on it.

TransactWriteItems, ClientRequestToken (DynamoDB API reference): "multiple identical calls have the
same effect as one single call"; "If you submit a request with the same client token but a change in
other parameters within the 10-minute idempotency window, DynamoDB returns an
IdempotentParameterMismatch exception." The order store resends a transaction whose outcome it does not
know (a read timeout after the SDK's retries) with its token
(shop/adapters/dynamodb/transactions.py): a transaction that committed answers as committed, so the API
answers like the first call instead of 500.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from shop.adapters.dynamodb import keys, outbox_items
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.runtime.config import Settings
from tests.conftest import reset_process_state
from tests.support.clients import intercept_transactions
from tools.local.services.emulators import FAKE_CREDENTIALS, AwsClients, LocalServices
from tools.template import REGION, Template


@pytest.fixture
def dynamodb(local_services: LocalServices, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session's DynamoDB Local, as the product's clients see it (endpoint from the environment)."""
    for name, value in {**FAKE_CREDENTIALS, **local_services.endpoints.environment()}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    reset_process_state()
    yield AwsClients(local_services.endpoints).dynamodb()
    reset_process_state()


@pytest.fixture
def orders_table(dynamodb: Any, template: Template) -> str:
    """A fresh copy of the template's orders table (its key schema and indexes), under a new name."""
    kwargs = template.create_table_kwargs("OrdersTable")
    kwargs["TableName"] = f"conformance-orders-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(**kwargs)
    return str(kwargs["TableName"])


def put_once(table: str, pk: str) -> list[dict[str, Any]]:
    """A transaction that can commit only once without a token: its item must not exist yet."""
    return [
        {
            "Put": {
                "TableName": table,
                "Item": {"PK": {"S": pk}, "SK": {"S": "ORDER"}},
                "ConditionExpression": "attribute_not_exists(PK)",
            }
        }
    ]


def test_an_identical_request_with_the_same_token_succeeds_without_writing_again(dynamodb, orders_table):
    token = str(uuid.uuid4())
    actions = put_once(orders_table, "probe-token")

    dynamodb.transact_write_items(TransactItems=actions, ClientRequestToken=token)
    dynamodb.transact_write_items(TransactItems=actions, ClientRequestToken=token)  # answered as committed

    with pytest.raises(ClientError) as without_token:
        dynamodb.transact_write_items(TransactItems=actions)  # a new request: its condition fails
    assert without_token.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert dynamodb.scan(TableName=orders_table)["Count"] == 1


def test_the_same_token_with_other_parameters_is_an_idempotent_parameter_mismatch(dynamodb, orders_table):
    token = str(uuid.uuid4())
    dynamodb.transact_write_items(TransactItems=put_once(orders_table, "probe-a"), ClientRequestToken=token)

    with pytest.raises(ClientError) as mismatch:
        dynamodb.transact_write_items(
            TransactItems=put_once(orders_table, "probe-b"), ClientRequestToken=token
        )

    assert mismatch.value.response["Error"]["Code"] == "IdempotentParameterMismatchException"
    assert dynamodb.scan(TableName=orders_table)["Count"] == 1


def test_an_order_whose_commit_answer_was_lost_is_answered_like_the_first_call(
    dynamodb, orders_table, monkeypatch
):
    """The API's write commits, then its answer is lost (a read timeout after the SDK's own retries);
    without the token, the resent transaction's conditions would fail on the order it wrote itself
    (500 without an Idempotency-Key). With it, the order is placed once and answered as placed."""
    lost = {"answers": 1}

    def answer_lost(client: Any, kwargs: dict[str, Any]) -> Any:
        answer = client.transact_write_items(**kwargs)
        if lost["answers"]:
            lost["answers"] -= 1
            raise ReadTimeoutError(endpoint_url="dynamodb (answer lost after commit)")
        return answer

    intercept_transactions(monkeypatch, answer_lost)
    settings = Settings.from_env({"ORDERS_TABLE_NAME": orders_table})
    service = OrderService(DynamoOrderRepository(settings), settings)
    command = PlaceOrder("c-1", "EUR", (OrderLine("SKU-1", 1, 100),))

    placed = service.place_order(command, idempotency_key=None, correlation_id="corr-lost-answer")

    assert lost["answers"] == 0
    assert placed.replayed is False
    items = dynamodb.scan(TableName=orders_table)["Items"]
    assert len(items) == 2  # the order and its one outbox item
    assert {item[keys.PK]["S"] for item in items} == {keys.order_key(placed.order["orderId"])[keys.PK]["S"]}
    assert sum(1 for item in items if outbox_items.is_outbox_image(item)) == 1
