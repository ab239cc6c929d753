"""The template as deployed (tools/iam/deployed.py): SAM's transform run, AWS's ARNs, every policy."""

from __future__ import annotations

import copy

import pytest

from tools.iam import (
    Access,
    DeploymentError,
    Touch,
    decisions,
    deployed,
    local_names,
    partition_keys,
    resource_policies,
    role_policies,
)
from tools.iam.deployed import NESTED_ARNS
from tools.template import ACCOUNT, REGION, Template

PREFIX = f"arn:aws:{{}}:{REGION}:{ACCOUNT}:"


def arn(service: str, rest: str) -> str:
    return PREFIX.format(service) + rest


@pytest.fixture(scope="module")
def postgres() -> Template:
    return Template.load(parameters={"OrderStore": "postgres", "SnapStart": "PublishedVersions"})


def test_arns_and_refs_are_awss_for_what_iam_sees(postgres: Template) -> None:
    aws = deployed(postgres)
    assert aws.arn("OrdersApiFunctionRole") == f"arn:aws:iam::{ACCOUNT}:role/local-OrdersApiFunctionRole"
    assert aws.arn("InventoryRule") == arn("events", "rule/local-EventBus/local-InventoryRule")
    assert aws.arn("OrdersApiLogGroup") == arn("logs", "log-group:local-OrdersApiLogGroup:*")
    assert aws.arn("AlarmTopicKey") == arn("kms", f"key/{aws.resolve({'Ref': 'AlarmTopicKey'})}")
    # what SAM generated: the alias SnapStart publishes, the schedule and its role
    assert aws.resolve({"Ref": "OutboxPublisherFunctionAliaslive"}) == arn(
        "lambda", "function:local-OutboxPublisherFunction:live"
    )
    assert aws.resources["OutboxPublisherFunctionEveryMinute"]["Type"] == "AWS::Scheduler::Schedule"
    assert aws.resources["OutboxPublisherFunctionEveryMinuteRole"]["Type"] == "AWS::IAM::Role"
    # each table's partition key attribute, by its ARN (a call on one item carries its value)
    assert partition_keys(aws)[arn("dynamodb", "table/local-IdempotencyTable")] == "id"
    assert set(partition_keys(aws)) == {aws.arn(t) for t in aws.of_type("AWS::DynamoDB::Table")}
    # the nested stack's secret, an ARN where the reader has a placeholder, and the name the code had
    secret = {"Fn::GetAtt": ["OrderDatabase", "Outputs.SecretArn"]}
    assert aws.resolve(secret) == NESTED_ARNS["SecretArn"]
    assert local_names(postgres, aws)[postgres.resolve(secret)] == NESTED_ARNS["SecretArn"]


def test_every_policy_attached_to_a_role_and_each_resources_own(postgres: Template) -> None:
    aws = deployed(postgres)
    assert {name for name, _ in role_policies(aws, "InventoryFunctionRole")} == {
        "InventoryFunctionRole/least-privilege",
        "InventorySourcePolicy/source",
        "InventoryIdempotencyPolicy/idempotency",
        "InventoryEffectPolicy/effect",
    }
    policies = resource_policies(aws)
    # SAM's Lambda permission for the API, its Fn::Sub variables resolved (SAM CLI's resolver alone
    # leaves `${__ApiId__}` in place)
    permissions = policies[arn("lambda", "function:local-OrdersApiFunction:live")]["Statement"]
    [get] = [s for s in permissions if s["Condition"]["ArnLike"]["aws:SourceArn"].endswith("/GET/orders/*")]
    assert get["Principal"] == {"Service": "apigateway.amazonaws.com"}
    assert get["Condition"] == {
        "ArnLike": {"aws:SourceArn": arn("execute-api", "local-OrdersApi/*/GET/orders/*")}
    }
    assert set(policies) >= {
        arn("sqs", "local-InventoryQueue"),
        arn("sqs", "local-InventoryDeadLetterQueue"),
        arn("sns", "local-AlarmTopic"),
        aws.arn("AlarmTopicKey"),
        aws.arn("OutboxPublisherFunctionEveryMinuteRole"),
    }


def test_a_policy_this_evaluation_cannot_see_is_refused(postgres: Template) -> None:
    data = copy.deepcopy(postgres.data)
    data["Resources"]["InventoryFunctionRole"]["Properties"]["ManagedPolicyArns"] = [
        "arn:aws:iam::aws:policy/AdministratorAccess"
    ]
    aws = deployed(Template(data, parameters=postgres.parameter_values))
    with pytest.raises(DeploymentError, match="ManagedPolicyArns"):
        role_policies(aws, "InventoryFunctionRole")


def test_a_tables_own_policy_decides_for_the_table_and_its_indexes(postgres: Template) -> None:
    data = copy.deepcopy(postgres.data)
    deny = {"Effect": "Deny", "Principal": "*", "Action": "dynamodb:*", "Resource": "*"}
    data["Resources"]["InventoryTable"]["Properties"]["ResourcePolicy"] = {
        "PolicyDocument": {"Version": "2012-10-17", "Statement": [deny]}
    }
    access = Access(deployed(Template(data, parameters=postgres.parameter_values)))
    table = access.aws.arn("InventoryTable")
    requests = access.calls(
        "InventoryFunction",
        [Touch("dynamodb:GetItem", table), Touch("dynamodb:Query", f"{table}/index/OutboxByTime")],
    )
    assert [d.result for d in decisions(requests)] == ["ExplicitlyDenied", "ExplicitlyDenied"]
