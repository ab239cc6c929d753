"""What AWS services do on their own with the template's resources is allowed, as AWS evaluates it.

The function's own calls are evaluated beside the scenarios that make them
(tests/unit/test_template.py, test_code_column_is_exactly_what_the_code_calls). Here, for each order
store, the template as deployed (SAM's transform run: tools/iam/deployed.py) is asked what AWS's
services need of it: Lambda running each function with its role and its event source mappings,
EventBridge delivering to each consumer queue and its dead-letter queue, EventBridge Scheduler invoking
the functions of OrderStore=postgres with the role SAM generates, CloudWatch publishing alarms to the
encrypted alarm topic, API Gateway invoking the API's function. Each request is decided by AWS's policy
evaluation (tools/iam/evaluation.py); and each check is shown able to fail, on a copy of the template's
data with a grant removed, narrowed or denied.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

import pytest

from tools.iam import Access, Decision, Request, Touch, decisions, deployed, refusals
from tools.template import ACCOUNT, REGION, Template

STORES = ("dynamodb", "postgres")
CONSUMERS = ("Inventory", "OrderStatus", "Notification")


@pytest.fixture(scope="module", params=STORES)
def template(request: pytest.FixtureRequest) -> Template:
    return Template.load(parameters={"OrderStore": request.param})


@pytest.fixture(scope="module")
def access(template: Template) -> Access:
    return Access(deployed(template))


@pytest.fixture(scope="module")
def services(access: Access) -> list[Decision]:
    return decisions(access.services())


def rebuilt(template: Template, data: dict[str, Any]) -> Access:
    return Access(deployed(Template(data, parameters=template.parameter_values)))


def test_every_service_may_do_what_the_template_asks_of_it(template: Template, services: list[Decision]):
    assert refusals(services) == []
    kinds = Counter(d.request.who.split(" ")[0] for d in services)
    assert set(kinds) == {"Lambda", "EventBridge", "CloudWatch", "API"}
    # every consumer queue and its dead-letter queue, reached by its rule only
    delivered = {
        (d.request.resource.rsplit(":", 1)[1], str(d.request.context["aws:SourceArn"]).rsplit("/", 1)[1])
        for d in services
        if d.request.principal == "events.amazonaws.com"
    }
    assert delivered == {
        (f"local-{consumer}{queue}", f"local-{consumer}Rule")
        for consumer in CONSUMERS
        for queue in ("Queue", "DeadLetterQueue")
    }
    # every alarm publishes to the alarm topic and uses its key
    alarms = {name for name, r in template.resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    published = {d.request.who.split(" ")[1] for d in services if d.request.action == "sns:Publish"}
    assert published == {a for a in alarms if template.is_created(a)}
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
        assert {d.request.who.split(" ")[1] for d in services if d.request.action == action} == published


def test_eventbridge_may_send_to_a_consumer_queue_only_for_that_consumers_rule(access: Access):
    rules = {consumer: access.aws.arn(f"{consumer}Rule") for consumer in CONSUMERS}
    others = [
        dataclasses.replace(request, context={**request.context, "aws:SourceArn": rule})
        for request in access.event_bridge()
        for consumer, rule in rules.items()
        if rule != request.context["aws:SourceArn"]
    ]
    assert len(others) == 2 * len(CONSUMERS) * (len(CONSUMERS) - 1)
    found = decisions(others)
    assert [str(d) for d in found if d.result != "ImplicitlyDenied"] == []


def test_a_consumer_may_touch_its_own_idempotency_records_and_no_other_consumers(access: Access):
    # Powertools keys a consumer's records "<function name>.<key prefix's rest>#<hash>"
    # (shop.runtime.consumer.idempotency_key_prefix). A consumer that could delete or overwrite another's
    # record could make that consumer apply an event's effect twice.
    table = access.aws.arn("IdempotencyTable")
    names = {consumer: access.aws.physical_name(f"{consumer}Function") for consumer in CONSUMERS}
    actions = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    asked = {
        (consumer, owner, action): access.calls(
            f"{consumer}Function",
            [Touch(action, table, (("dynamodb:LeadingKeys", (f"{name}.shop.consumer#{'0' * 32}",)),))],
        )[0]
        for consumer in CONSUMERS
        for owner, name in names.items()
        for action in actions
    }
    found = {key: d.result for key, d in zip(asked, decisions(list(asked.values())), strict=True)}
    assert {key for key, result in found.items() if result == "Allowed"} == {
        (consumer, consumer, action) for consumer in CONSUMERS for action in actions
    }
    # ... nor a record whose key only starts with its name (another function's name may extend it)
    [longer] = access.calls(
        "InventoryFunction",
        [Touch("dynamodb:PutItem", table, (("dynamodb:LeadingKeys", (f"{names['Inventory']}2.x#0",)),))],
    )
    assert [d.result for d in decisions([longer])] == ["ImplicitlyDenied"]


def test_only_this_stacks_alarms_of_this_account_may_publish_to_the_alarm_topic(access: Access):
    [publish, *_] = [r for r in access.cloudwatch() if r.action == "sns:Publish"]
    other_stack = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:other-stack-errors"
    other_account = str(publish.context["aws:SourceArn"]).replace(ACCOUNT, "210987654321")
    changed = [
        dataclasses.replace(publish, context={**publish.context, "aws:SourceArn": other_stack}),
        dataclasses.replace(
            publish,
            context={**publish.context, "aws:SourceArn": other_account, "aws:SourceAccount": "210987654321"},
        ),
    ]
    assert [d.result for d in decisions(changed)] == ["ImplicitlyDenied", "ImplicitlyDenied"]


def test_the_scheduler_invokes_the_postgres_functions_with_the_role_sam_generates(template: Template):
    # With SnapStart, each schedule targets the function's alias "live": the role SAM generates grants that.
    for snap_start in ("None", "PublishedVersions"):
        access = Access(
            deployed(Template(template.data, {**template.parameter_values, "SnapStart": snap_start}))
        )
        requests = access.scheduler()
        if template.parameter_values["OrderStore"] == "dynamodb":
            assert requests == []
            continue
        suffix = ":live" if snap_start == "PublishedVersions" else ""
        assert {(r.action, r.resource) for r in requests if r.action == "lambda:InvokeFunction"} == {
            ("lambda:InvokeFunction", access.aws.arn(function) + suffix)
            for function in ("OutboxPublisherFunction", "OrderStoreMaintenanceFunction")
        }
        assert {r.principal for r in requests if r.action == "sts:AssumeRole"} == {"scheduler.amazonaws.com"}
        assert refusals(decisions(requests)) == []


# --- the evaluation can fail ----------------------------------------------------------------------------
def only(requests: list[Request], who: str, action: str, resource: str) -> Request:
    [request] = [r for r in requests if r.who == who and (r.action, r.resource) == (action, resource)]
    return request


def test_a_service_is_refused_once_the_template_no_longer_grants_it(template: Template, access: Access):
    queue = access.aws.arn("InventoryQueue")
    dead_letters = access.aws.arn("InventoryDeadLetterQueue")
    key = access.aws.arn("AlarmTopicKey")
    mapping_poll = (
        "Lambda InventoryFunction mapping InventoryFunctionInventoryMessages",
        "sqs:ReceiveMessage",
        queue,
    )
    delivery = ("EventBridge InventoryRule", "sqs:SendMessage", dead_letters)
    encryption = ("CloudWatch InventoryQueueAgeAlarm", "kms:GenerateDataKey", key)

    # (a) the queue policy's statement removed: EventBridge may no longer send to the queues
    removed = copy.deepcopy(template.data)
    removed["Resources"]["InventoryQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"] = [
        {"Sid": "Unrelated", "Effect": "Allow", "Principal": {"Service": "sns.amazonaws.com"},
         "Action": "sqs:SendMessage", "Resource": {"Fn::GetAtt": ["InventoryQueue", "Arn"]}}
    ]  # fmt: skip
    # (b) the polling grant narrowed to the dead-letter queue, and the queue policy to the queue alone
    narrowed = copy.deepcopy(template.data)
    [poll] = narrowed["Resources"]["InventorySourcePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    poll["Resource"] = {"Fn::GetAtt": ["InventoryDeadLetterQueue", "Arn"]}
    [send] = narrowed["Resources"]["InventoryQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    send["Resource"] = {"Fn::GetAtt": ["InventoryQueue", "Arn"]}
    # (c) a Deny of the alarm key to CloudWatch added to the key policy
    denied = copy.deepcopy(template.data)
    denied["Resources"]["AlarmTopicKey"]["Properties"]["KeyPolicy"]["Statement"].append(
        {"Sid": "DeniedByTheTest", "Effect": "Deny", "Principal": {"Service": "cloudwatch.amazonaws.com"},
         "Action": "kms:GenerateDataKey*", "Resource": "*"}
    )  # fmt: skip

    asked: list[tuple[str, str, tuple[str, str, str]]] = [
        ("statement removed", "ImplicitlyDenied", delivery),
        ("resource narrowed", "ImplicitlyDenied", mapping_poll),
        ("resource narrowed", "ImplicitlyDenied", delivery),
        ("Deny added", "ExplicitlyDenied", encryption),
    ]
    changed = {"statement removed": removed, "resource narrowed": narrowed, "Deny added": denied}
    services = {change: rebuilt(template, data).services() for change, data in changed.items()}
    requests = [only(services[change], *call) for change, _, call in asked]
    # ... while on the template as it is, each of them is allowed
    assert all(d.allowed for d in decisions([only(access.services(), *call) for _, _, call in asked]))
    for (change, expected, (who, action, resource)), decision in zip(asked, decisions(requests), strict=True):
        assert decision.result == expected, f"{change}: {decision}"
        assert str(decision).startswith(f"{who}: {action} on {resource}"), str(decision)
