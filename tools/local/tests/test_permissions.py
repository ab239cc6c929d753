"""Which tables a function's role may write (reader/permissions.py): what wakes a stream mapping early."""

from __future__ import annotations

from typing import Any

import pytest

from tools.local.reader.permissions import tables_written
from tools.template import Template

TABLE = {"Type": "AWS::DynamoDB::Table", "Properties": {}}


def function(**properties: Any) -> dict[str, Any]:
    return {
        "Type": "AWS::Serverless::Function",
        "Properties": {"CodeUri": "x", "Handler": "app.handler", "Runtime": "python3.13", **properties},
    }


def allow(action: Any, resource: Any) -> dict[str, Any]:
    return {"Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}]}


def role(*documents: dict[str, Any], **properties: Any) -> dict[str, Any]:
    return {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {},
            "Policies": [{"PolicyName": f"p{i}", "PolicyDocument": d} for i, d in enumerate(documents)],
            **properties,
        },
    }


def written(resources: dict[str, Any], name: str = "F") -> set[str] | None:
    tables = tables_written(Template({"Resources": {"A": TABLE, "B": TABLE, **resources}}), name)
    return None if tables is None else set(tables)


def arn(table: str) -> dict[str, Any]:
    return {"Fn::GetAtt": [table, "Arn"]}


@pytest.mark.parametrize("order_store", ["dynamodb", "postgres"])
def test_the_projects_functions_write_what_their_roles_allow(order_store: str) -> None:
    template = Template.load(parameters={"OrderStore": order_store})
    orders_table = ["OrdersTable"] if order_store == "dynamodb" else []  # postgres: orders in Aurora

    found = {
        f: tables_written(template, f)
        for f in template.of_type("AWS::Serverless::Function")
        if template.is_created(f)
    }

    expected = {
        "OrdersApiFunction": orders_table,
        "OutboxRelayFunction": [],  # reads streams only
        "InventoryFunction": ["IdempotencyTable", "InventoryTable"],
        "OrderStatusFunction": ["IdempotencyTable", *orders_table],
        "NotificationFunction": ["IdempotencyTable"],
    }
    if order_store == "postgres":
        postgres_only = (
            "OutboxPublisherFunction",
            "OrderStoreMaintenanceFunction",
            "OrderDatabaseMigrationFunction",
        )
        expected |= {function: [] for function in postgres_only}  # they write the database only
    assert {f: None if tables is None else sorted(tables) for f, tables in found.items()} == expected


def test_sam_policy_templates_arrive_expanded_and_reads_are_not_writes() -> None:
    policies = [
        "AWSLambdaBasicExecutionRole",
        {"DynamoDBCrudPolicy": {"TableName": {"Ref": "A"}}},
        {"DynamoDBReadPolicy": {"TableName": {"Ref": "B"}}},
    ]

    assert written({"F": function(Policies=policies)}) == {"A"}
    assert written({"F": function()}) == set[str]()  # SAM's generated role: basic execution only


@pytest.mark.parametrize(
    ("action", "resource", "expected"),
    [
        ("dynamodb:PutItem", arn("B"), {"B"}),
        (["dynamodb:GetItem", "dynamodb:Query"], "*", set()),
        ("dynamodb:*", "*", {"A", "B"}),
        ("DynamoDB:update*", "*", {"A", "B"}),  # IAM matches actions case-insensitively
        ("*", {"Fn::Sub": "arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/local-A*"}, {"A"}),
    ],
)
def test_actions_and_resources_match_as_iam_matches_them(
    action: Any, resource: Any, expected: set[str]
) -> None:
    resources = {"R": role(allow(action, resource)), "F": function(Role=arn("R"))}

    assert written(resources) == expected


def test_policies_attached_to_the_role_count_and_others_do_not() -> None:
    resources = {
        "R": role(),
        "Other": role(),
        "F": function(Role=arn("R")),
        "Attached": {
            "Type": "AWS::IAM::RolePolicy",
            "Properties": {
                "RoleName": {"Ref": "R"},
                "PolicyName": "a",
                "PolicyDocument": allow("dynamodb:PutItem", arn("A")),
            },
        },
        "Elsewhere": {
            "Type": "AWS::IAM::Policy",
            "Properties": {
                "Roles": [{"Ref": "Other"}],
                "PolicyName": "b",
                "PolicyDocument": allow("dynamodb:PutItem", arn("B")),
            },
        },
    }

    assert written(resources) == {"A"}


def test_a_connector_with_write_permission_counts() -> None:
    connector = {
        "Type": "AWS::Serverless::Connector",
        "Properties": {"Source": {"Id": "F"}, "Destination": {"Id": "B"}, "Permissions": ["Read", "Write"]},
    }

    assert written({"F": function(), "C": connector}) == {"B"}


@pytest.mark.parametrize(
    "resources",
    [
        {"F": function(Role="arn:aws:iam::123456789012:role/from-elsewhere")},
        {"F": function(Policies=["AmazonDynamoDBFullAccess"])},
        {
            "F": function(
                Policies=[{"Statement": [{"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"}]}]
            )
        },
        {
            "R": role(ManagedPolicyArns=["arn:aws:iam::123456789012:policy/custom"]),
            "F": function(Role=arn("R")),
        },
    ],
    ids=["role from outside", "unknown managed policy", "NotAction", "managed policy from outside"],
)
def test_what_cannot_be_read_may_write_every_table(resources: dict[str, Any]) -> None:
    assert written(resources) is None
