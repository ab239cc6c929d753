"""Idempotency-Key is scoped to the caller: one caller's key never reaches another caller's order, and a
role's sessions are one caller (docs/api.md, shop/domain/principals.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from shop.adapters.dynamodb import keys
from shop.domain.principals import ANONYMOUS_CALLER, idempotency_caller
from tests.support import header, json_body, load_event, load_handler_module
from tools.template import Template

API = "OrdersApiFunction"
ALICE = "arn:aws:iam::123456789012:user/alice"
BOB = "arn:aws:sts::210987654321:assumed-role/Buyer/bob"
COGNITO_ROLE = "arn:aws:sts::123456789012:assumed-role/Cognito_Auth_Role"
BUYER_ROLE = "arn:aws:sts::210987654321:assumed-role/Buyer"  # BOB's role, its session name stripped


@pytest.fixture
def table_items(template: Template) -> Callable[[], list[dict[str, Any]]]:
    def scan() -> list[dict[str, Any]]:
        items = boto3.client("dynamodb").scan(TableName=template.physical_name("OrdersTable"))["Items"]
        return sorted(items, key=lambda item: (item["PK"]["S"], item["SK"]["S"]))

    return scan


def create_event(
    caller: str | None, key: str = "shared-key-1", quantity: int | None = None
) -> dict[str, Any]:
    """POST /orders with an Idempotency-Key, as API Gateway delivers it for `caller` (None: no principal)."""
    event = load_event("api_create_order.json")
    event["headers"]["Idempotency-Key"] = key
    event["multiValueHeaders"]["Idempotency-Key"] = [key]
    event["requestContext"]["identity"]["userArn"] = caller
    if quantity is not None:
        body = json.loads(event["body"])
        body["items"][0]["quantity"] = quantity
        event["body"] = json.dumps(body)
    return event


def request_records(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in items if item["SK"]["S"] == "REQUEST"]


def test_two_callers_with_the_same_key_and_body_get_two_orders(api, table_items):
    alice = api(create_event(ALICE))
    bob = api(create_event(BOB))

    assert alice["statusCode"] == bob["statusCode"] == 201
    assert json_body(alice)["orderId"] != json_body(bob)["orderId"]
    assert header(alice, "Idempotent-Replayed") is None
    assert header(bob, "Idempotent-Replayed") is None
    items = table_items()
    assert len([i for i in items if i["SK"]["S"] == "ORDER"]) == 2
    records = request_records(items)
    assert {r["PK"]["S"] for r in records} == {
        keys.request_key(ALICE, "shared-key-1")[keys.PK]["S"],
        keys.request_key(idempotency_caller(user_arn=BOB), "shared-key-1")[keys.PK]["S"],
    }
    assert {r["orderId"]["S"] for r in records} == {json_body(alice)["orderId"], json_body(bob)["orderId"]}


def test_another_callers_key_with_a_different_body_creates_the_callers_own_order(api):
    alice = json_body(api(create_event(ALICE)))

    bob = api(create_event(BOB, quantity=7))

    assert bob["statusCode"] == 201
    assert header(bob, "Idempotent-Replayed") is None
    assert json_body(bob)["orderId"] != alice["orderId"]
    assert json_body(bob)["items"][0]["quantity"] == 7
    assert alice["orderId"] not in bob["body"]


def test_the_same_caller_retrying_still_gets_its_own_order_replayed(api, table_items):
    alice_first = api(create_event(ALICE))
    bob_first = api(create_event(BOB))
    before = table_items()

    alice_again = api(create_event(ALICE))
    bob_again = api(create_event(BOB))

    assert header(alice_again, "Idempotent-Replayed") == header(bob_again, "Idempotent-Replayed") == "true"
    assert json_body(alice_again) == json_body(alice_first)
    assert json_body(bob_again) == json_body(bob_first)
    assert json_body(alice_first)["orderId"] != json_body(bob_first)["orderId"]
    assert table_items() == before


def test_a_reused_key_is_refused_naming_only_the_callers_own_order(api, table_items):
    alice = json_body(api(create_event(ALICE)))
    bob = json_body(api(create_event(BOB)))
    before = table_items()

    refused = api(create_event(BOB, quantity=7))

    assert refused["statusCode"] == 422
    error = json_body(refused)["error"]
    assert error["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert error["details"] == {"orderId": bob["orderId"]}
    assert bob["orderId"] != alice["orderId"]
    assert table_items() == before


def test_requests_without_a_principal_share_the_anonymous_namespace(api, table_items):
    first = api(create_event(None))
    second = api(create_event(None))

    assert header(second, "Idempotent-Replayed") == "true"
    assert json_body(second) == json_body(first)
    [record] = request_records(table_items())
    assert record["PK"] == keys.request_key(ANONYMOUS_CALLER, "shared-key-1")[keys.PK]


def test_request_keys_are_scoped_by_a_fixed_length_digest_of_the_caller():
    alice = keys.request_key(ALICE, "k-1")[keys.PK]["S"]
    longest = keys.request_key(BOB, "x" * 255)[keys.PK]["S"]

    assert alice != keys.request_key(BOB, "k-1")[keys.PK]["S"]
    assert alice == keys.request_key(ALICE, "k-1")[keys.PK]["S"]
    assert alice == f"REQUEST#{keys.caller_scope(ALICE)}#k-1"
    assert len(keys.caller_scope(ALICE)) == 32
    assert "arn:" not in alice
    assert "alice" not in alice
    assert len(longest) == len("REQUEST#") + 32 + 1 + 255
    assert keys.request_key(ALICE, "k-1")[keys.SK] == {"S": "REQUEST"}


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        ({"userArn": ALICE, "caller": "AIDAALICE", "accountId": "123456789012"}, ALICE),
        ({"userArn": BOB, "caller": "AROABUYER:bob", "accountId": "210987654321"}, BUYER_ROLE),
        (
            {"userArn": f"{BUYER_ROLE}/i-0a1b2c3d4e5f", "caller": "AROABUYER:i-0a1b2c3d4e5f"},
            BUYER_ROLE,
        ),
        (
            {"userArn": "arn:aws-cn:sts::123456789012:assumed-role/Worker/task/with/slashes"},
            "arn:aws-cn:sts::123456789012:assumed-role/Worker",
        ),
        (
            {"userArn": "arn:aws:sts::123456789012:federated-user/carol", "caller": "123456789012:carol"},
            "arn:aws:sts::123456789012:federated-user/carol",
        ),
        ({"userArn": "arn:aws:iam::123456789012:root"}, "arn:aws:iam::123456789012:root"),
        (
            {
                "userArn": f"{COGNITO_ROLE}/CognitoIdentityCredentials",
                "cognitoIdentityId": "us-east-1:0f2a",
            },
            f"{COGNITO_ROLE}#cognito:us-east-1:0f2a",
        ),
        ({"userArn": None, "caller": "AROABOB:bob", "accountId": "210987654321"}, "AROABOB"),
        ({"userArn": None, "caller": "AIDAALICE", "accountId": "210987654321"}, "AIDAALICE"),
        ({"userArn": "", "caller": None, "accountId": "210987654321"}, "210987654321"),
        ({"userArn": None, "caller": None, "accountId": None, "sourceIp": "127.0.0.1"}, ANONYMOUS_CALLER),
        (None, ANONYMOUS_CALLER),
    ],
    ids=[
        "iam-user",
        "role-session",
        "another-session-of-the-role",
        "session-name-with-slashes-other-partition",
        "federated-user",
        "root",
        "cognito-identity",
        "caller-of-a-role-session",
        "caller-of-a-user",
        "account",
        "no-principal",
        "no-identity",
    ],
)
def test_caller_of_takes_the_stable_iam_principal_from_the_request_context(template, identity, expected):
    app = load_handler_module(template.function(API))
    event = load_event("api_create_order.json")
    event["requestContext"]["identity"] = identity

    assert app.caller_of(event) == expected
    assert app.caller_of({"requestContext": None}) == ANONYMOUS_CALLER


def test_a_worker_retrying_from_another_session_of_its_role_gets_its_order_replayed(api, table_items):
    """The retry case Idempotency-Key exists for: the first try ran on one ECS task, the retry on
    another (another role session name); one order, one OrderCreated."""
    first = api(create_event(f"{BUYER_ROLE}/ecs-task-1111"))
    retry = api(create_event(f"{BUYER_ROLE}/ecs-task-2222"))
    refreshed = api(create_event(f"{BUYER_ROLE}/botocore-session-1732500000"))

    assert first["statusCode"] == 201
    assert header(retry, "Idempotent-Replayed") == header(refreshed, "Idempotent-Replayed") == "true"
    assert json_body(retry)["orderId"] == json_body(refreshed)["orderId"] == json_body(first)["orderId"]
    items = table_items()
    assert len([item for item in items if item["SK"]["S"].startswith("OUTBOX#")]) == 1
    assert [record["PK"] for record in request_records(items)] == [
        keys.request_key(BUYER_ROLE, "shared-key-1")[keys.PK]
    ]


def test_two_roles_of_one_account_keep_their_keys_apart(api):
    buyer = api(create_event("arn:aws:sts::210987654321:assumed-role/Buyer/task-1"))
    seller = api(create_event("arn:aws:sts::210987654321:assumed-role/Seller/task-1"))

    assert buyer["statusCode"] == seller["statusCode"] == 201
    assert json_body(buyer)["orderId"] != json_body(seller)["orderId"]


def test_cognito_identities_behind_one_role_keep_their_keys_apart():
    role_session = f"{COGNITO_ROLE}/CognitoIdentityCredentials"

    one = idempotency_caller(user_arn=role_session, cognito_identity_id="us-east-1:aaaa")
    other = idempotency_caller(user_arn=role_session, cognito_identity_id="us-east-1:bbbb")

    assert one != other
    assert one == idempotency_caller(user_arn=role_session, cognito_identity_id="us-east-1:aaaa")
