"""What IAM authorises for a call (tools/iam/calls.py), after the Service Authorization Reference."""

from __future__ import annotations

import pytest

from tools.iam import ResourceNames, Touch, UnknownResource, touches
from tools.iam.calls import queue_arn

ACCOUNT = "123456789012"
TABLE = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/orders"
STOCK = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/stock"


def test_a_dynamodb_transaction_is_authorised_item_by_item() -> None:
    items = [
        {"Put": {"TableName": "orders", "Item": {}}},
        {"Put": {"TableName": "orders", "Item": {}}},
        {"Update": {"TableName": "stock", "Key": {}}},
        {"ConditionCheck": {"TableName": "stock", "Key": {}}},
        {"Delete": {"TableName": TABLE, "Key": {}}},  # a table may be named by its ARN
    ]
    assert touches("dynamodb", "TransactWriteItems", {"TransactItems": items}) == [
        Touch("dynamodb:PutItem", TABLE),
        Touch("dynamodb:UpdateItem", STOCK),
        Touch("dynamodb:ConditionCheckItem", STOCK),
        Touch("dynamodb:DeleteItem", TABLE),
    ]
    gets = [{"Get": {"TableName": "orders", "Key": {}}}, {"Get": {"TableName": "stock", "Key": {}}}]
    assert touches("dynamodb", "TransactGetItems", {"TransactItems": gets}) == [
        Touch("dynamodb:GetItem", TABLE),
        Touch("dynamodb:GetItem", STOCK),
    ]


def test_a_batch_per_table_and_a_query_on_an_index_on_the_indexs_arn() -> None:
    assert touches("dynamodb", "BatchWriteItem", {"RequestItems": {"orders": [], "stock": []}}) == [
        Touch("dynamodb:BatchWriteItem", TABLE),
        Touch("dynamodb:BatchWriteItem", STOCK),
    ]
    assert touches("dynamodb", "Query", {"TableName": "orders", "IndexName": "ByTime"}) == [
        Touch("dynamodb:Query", f"{TABLE}/index/ByTime")
    ]
    assert touches("dynamodb", "Query", {"TableName": "orders"}) == [Touch("dynamodb:Query", TABLE)]
    assert touches("dynamodb", "GetItem", {"TableName": "orders", "Key": {}}) == [
        Touch("dynamodb:GetItem", TABLE)
    ]


def test_a_call_on_one_item_carries_its_partition_key_as_leading_keys() -> None:
    names = ResourceNames(partition_keys={TABLE: "pk"})  # orders: pk (HASH), sk; stock: not known
    leading = (("dynamodb:LeadingKeys", ("ORDER#1",)),)
    key = {"pk": {"S": "ORDER#1"}, "sk": {"S": "META"}}
    for operation in ("GetItem", "UpdateItem", "DeleteItem"):
        assert touches("dynamodb", operation, {"TableName": "orders", "Key": key}, names) == [
            Touch(f"dynamodb:{operation}", TABLE, leading)
        ]
    item = {**key, "n": {"N": "1"}}
    assert touches("dynamodb", "PutItem", {"TableName": "orders", "Item": item}, names) == [
        Touch("dynamodb:PutItem", TABLE, leading)
    ]
    items = [
        {"Put": {"TableName": "orders", "Item": key}},
        {"ConditionCheck": {"TableName": "orders", "Key": {"pk": {"N": "7"}, "sk": {"S": "x"}}}},
        {"Update": {"TableName": "stock", "Key": {"sku": {"S": "A"}}}},  # no partition key known
    ]
    assert touches("dynamodb", "TransactWriteItems", {"TransactItems": items}, names) == [
        Touch("dynamodb:PutItem", TABLE, leading),
        Touch("dynamodb:ConditionCheckItem", TABLE, (("dynamodb:LeadingKeys", ("7",)),)),
        Touch("dynamodb:UpdateItem", STOCK),
    ]
    # a Query names no item here (its key condition is an expression): no leading keys
    assert touches("dynamodb", "Query", {"TableName": "orders"}, names) == [Touch("dynamodb:Query", TABLE)]


def test_sqs_names_a_queue_by_url_and_authorises_a_batch_as_its_single_action() -> None:
    url = f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/poison"
    assert touches("sqs", "SendMessageBatch", {"QueueUrl": url, "Entries": []}) == [
        Touch("sqs:SendMessage", f"arn:aws:sqs:eu-west-1:{ACCOUNT}:poison")
    ]
    assert (
        queue_arn(f"https://eu-west-1.queue.amazonaws.com/{ACCOUNT}/q")
        == f"arn:aws:sqs:eu-west-1:{ACCOUNT}:q"
    )
    with pytest.raises(UnknownResource):
        queue_arn("poison")


def test_put_events_on_each_entrys_bus_with_its_source_and_detail_type() -> None:
    entries = [
        {"Source": "shop.orders", "DetailType": "OrderCreated", "Detail": "{}", "EventBusName": "bus"},
        {"Source": "shop.orders", "DetailType": "OrderCreated", "Detail": "{}", "EventBusName": "bus"},
        {"Source": "shop.stock", "DetailType": "Reserved", "Detail": "{}"},
    ]
    bus = f"arn:aws:events:us-east-1:{ACCOUNT}:event-bus/"
    assert touches("events", "PutEvents", {"Entries": entries}) == [
        Touch(
            "events:PutEvents",
            bus + "bus",
            (("events:detail-type", "OrderCreated"), ("events:source", "shop.orders")),
        ),
        Touch(
            "events:PutEvents",
            bus + "default",
            (("events:detail-type", "Reserved"), ("events:source", "shop.stock")),
        ),
    ]


def test_names_the_code_was_given_are_turned_into_arns_where_aws_naming_cannot() -> None:
    secret = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:db-AbCdEf"
    names = ResourceNames({"local-db-secret": secret})
    assert touches("secretsmanager", "GetSecretValue", {"SecretId": "local-db-secret"}, names) == [
        Touch("secretsmanager:GetSecretValue", secret)
    ]
    assert touches("secretsmanager", "GetSecretValue", {"SecretId": secret}) == [
        Touch("secretsmanager:GetSecretValue", secret)
    ]
    with pytest.raises(UnknownResource, match="ARN"):  # a name: its ARN ends with characters AWS chose
        touches("secretsmanager", "GetSecretValue", {"SecretId": "db"})


def test_actions_without_resource_level_permissions_are_on_star_and_unauthorised_calls_on_nothing() -> None:
    assert touches("xray", "PutTraceSegments", {"TraceSegmentDocuments": []}) == [
        Touch("xray:PutTraceSegments", "*")
    ]
    assert touches("dynamodb", "ListStreams", {"TableName": "orders"}) == [Touch("dynamodb:ListStreams", "*")]
    assert touches("sts", "GetCallerIdentity", {}) == []
    with pytest.raises(UnknownResource, match="s3:PutObject"):
        touches("s3", "PutObject", {"Bucket": "b", "Key": "k"})
