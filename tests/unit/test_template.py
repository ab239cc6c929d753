"""template.yaml: the promises the README makes about resources, outputs, permissions and settings."""

from __future__ import annotations

import re
from typing import Any

import pytest

from local.template import ROOT, Template

README = (ROOT / "README.md").read_text()


def readme_table(section: str) -> list[list[str]]:
    block = README.split(f"<!-- {section}:start -->")[1].split(f"<!-- {section}:end -->")[0]
    rows = [line for line in block.strip().splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def statements(template: Template, logical_id: str) -> list[dict[str, Any]]:
    policies = template.function(logical_id).policies
    return [statement for policy in policies for statement in policy["Statement"]]


def test_resources_are_the_ones_the_readme_lists(template: Template):
    documented = {ticked(name)[0]: ticked(kind)[0] for name, kind in readme_table("resources")}
    assert documented == {name: r["Type"] for name, r in template.resources.items()}


def test_outputs_are_the_ones_the_readme_lists(template: Template):
    documented = {ticked(row[0])[0] for row in readme_table("outputs")}
    assert documented == set(template.data["Outputs"])


def test_each_function_is_granted_exactly_the_actions_the_readme_lists(template: Template):
    documented = {ticked(row[0])[0]: set(ticked(row[1])) - {"*"} for row in readme_table("permissions")}
    granted = {}
    for logical_id in template.functions():
        actions: set[str] = set()
        for statement in statements(template, logical_id):
            action = statement["Action"]
            actions.update([action] if isinstance(action, str) else action)
        granted[logical_id] = actions
    assert granted == documented


def test_no_function_uses_a_wildcard_resource_except_list_streams(template: Template):
    for logical_id in template.functions():
        for statement in statements(template, logical_id):
            resources = (
                statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            )
            if "*" in resources:
                assert statement["Action"] == "dynamodb:ListStreams", (logical_id, statement)


def test_every_function_runs_python313_on_arm64_with_its_own_log_group(template: Template):
    globals_ = template.data["Globals"]["Function"]
    assert (globals_["Runtime"], globals_["Architectures"]) == ("python3.13", ["arm64"])
    for logical_id in template.functions():
        props = template.resources[logical_id]["Properties"]
        assert "Runtime" not in props, logical_id
        assert "Architectures" not in props, logical_id
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert template.resources[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_tables_are_encrypted_with_point_in_time_recovery_and_ttl(template: Template):
    for logical_id in template.of_type("AWS::DynamoDB::Table"):
        props = template.properties(logical_id)
        assert props["SSESpecification"]["SSEEnabled"] is True
        assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert props["TimeToLiveSpecification"]["Enabled"] is True


def test_queues_are_encrypted_and_consumer_queues_redrive_to_their_dlq(template: Template):
    for logical_id in template.of_type("AWS::SQS::Queue"):
        assert template.properties(logical_id)["SqsManagedSseEnabled"] is True
    for name in ("Inventory", "OrderStatus", "Notification"):
        queue = template.resources[f"{name}Queue"]["Properties"]
        assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {
            "Fn::GetAtt": [f"{name}DeadLetterQueue", "Arn"]
        }
        [target] = template.resources[f"{name}Rule"]["Properties"]["Targets"]
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [f"{name}DeadLetterQueue", "Arn"]}


def test_queue_policies_let_only_their_own_rule_send(template: Template):
    for name in ("Inventory", "OrderStatus", "Notification"):
        [statement] = template.resources[f"{name}QueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "events.amazonaws.com"}
        assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [f"{name}Rule", "Arn"]}


def test_visibility_timeout_and_idempotency_window_fit_the_retry_budget(template: Template):
    receives = int(template.parameter_values["ConsumerMaxReceiveCount"])
    expires = int(template.parameter_values["IdempotencyExpiresAfterSeconds"])
    for name in ("Inventory", "OrderStatus", "Notification"):
        visibility = template.properties(f"{name}Queue")["VisibilityTimeout"]
        assert visibility >= 6 * template.function(f"{name}Function").timeout
        assert expires >= visibility * receives + 600  # and a buffer of at least 10 minutes
        assert template.function(f"{name}Function").environment["IDEMPOTENCY_EXPIRES_AFTER_SECONDS"] == str(
            expires
        )


@pytest.mark.parametrize("event", ["OrdersOutbox", "InventoryOutbox"])
def test_relay_stream_mappings_report_item_failures_and_dead_letter(template: Template, event: str):
    props = template.function("OutboxRelayFunction").events[event]["Properties"]
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BisectBatchOnFunctionError"] is True
    assert int(props["MaximumRecordAgeInSeconds"]) < 24 * 3600
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == template.arn("RelayDeadLetterQueue")


def test_outbox_ttl_outlives_stream_retention(template: Template):
    assert int(template.parameter_values["OutboxTtlDays"]) >= 2
    assert template.data["Parameters"]["OutboxTtlDays"]["MinValue"] >= 2


def test_api_auth_is_iam_by_default_and_none_is_allowed(template: Template):
    spec = template.data["Parameters"]["ApiAuthType"]
    assert spec["Default"] == "AWS_IAM"
    assert spec["AllowedValues"] == ["AWS_IAM", "NONE"]
    assert template.properties("OrdersApi")["Auth"] == {"DefaultAuthorizer": "AWS_IAM"}
    assert Template(template.data, {"ApiAuthType": "NONE"}).properties("OrdersApi")["Auth"] == {}


def test_every_sample_event_is_used_by_a_test():
    sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    unused = [p.name for p in sorted((ROOT / "events").glob("*.json")) if p.name not in sources]
    assert unused == []
