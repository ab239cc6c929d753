"""The evaluation (tools/iam/evaluation.py) decides as AWS documents its policy evaluation logic:
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html and the pages
it links (requests within a single account, the policy grammar's Action/NotAction, Resource/NotResource
and wildcards, condition operators, KMS key policies, role trust policies). Each case is a documented
rule, on policies written after AWS's own examples; each test asks its cases in one batch (one process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.iam import Request, SimulatorError, decisions
from tools.iam.evaluation import ALLOWED, ERROR, EXPLICITLY_DENIED, IMPLICITLY_DENIED

ACCOUNT = "111122223333"
ELSEWHERE = "444455556666"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/worker"
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/worker/session-1"
USER = f"arn:aws:iam::{ACCOUNT}:user/carlossalazar"
TABLE = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/Orders"
QUEUE = f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders"
RULE = f"arn:aws:events:us-east-1:{ACCOUNT}:rule/bus/orders"
KEY = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"

Case = tuple[Request, str]  # a request and the decision AWS documents for it


def policy(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def allow(action: Any, resource: Any = "*", **more: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **more}


def deny(action: Any, resource: Any = "*", **more: Any) -> dict[str, Any]:
    return {"Effect": "Deny", "Action": action, "Resource": resource, **more}


def ask(
    action: str,
    resource: str,
    *identity: dict[str, Any],
    principal: str = SESSION,
    resource_policy: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
) -> Request:
    return Request(
        who=f"{principal} {action} {resource}",
        principal=principal,
        action=action,
        resource=resource,
        identity_policies=tuple((f"p{i}", document) for i, document in enumerate(identity)),
        resource_policy=resource_policy,
        context=context or {},
        account=ACCOUNT,
    )


def assert_decided(*cases: Case) -> None:
    found = decisions([request for request, _ in cases])
    assert [(str(d.request), d.result) for d in found] == [(str(r), expected) for r, expected in cases]


# --- the order: an explicit Deny, then an Allow, else the default deny ----------------------------------
def test_nothing_allows_it_so_it_is_denied_by_default() -> None:
    assert_decided(
        (ask("dynamodb:GetItem", TABLE, policy(allow("dynamodb:PutItem", TABLE))), IMPLICITLY_DENIED),
        (ask("dynamodb:GetItem", TABLE), IMPLICITLY_DENIED),
    )


def test_an_explicit_deny_in_any_policy_overrides_every_allow() -> None:
    # After the documented example of Carlos, whose own policy denies buckets named *log*: the bucket
    # policy of his logs bucket allowing him to put objects does not help.
    carlos = policy(
        {
            "Sid": "AllowS3Self",
            **allow("s3:*", ["arn:aws:s3:::carlossalazar/*", "arn:aws:s3:::carlossalazar"]),
        },
        {"Sid": "DenyS3Logs", **deny("s3:*", "arn:aws:s3:::*log*")},
    )
    bucket = policy(allow("s3:PutObject", "arn:aws:s3:::carlossalazar-logs/*", Principal={"AWS": USER}))
    logs = "arn:aws:s3:::carlossalazar-logs/report.txt"
    closed = policy(deny("sqs:SendMessage", QUEUE, Principal="*"))
    assert_decided(
        (ask("s3:PutObject", logs, carlos, principal=USER, resource_policy=bucket), EXPLICITLY_DENIED),
        (ask("s3:PutObject", "arn:aws:s3:::carlossalazar/a.txt", carlos, principal=USER), ALLOWED),
        # ... and a Deny in the resource's policy overrides the identity's Allow
        (ask("sqs:SendMessage", QUEUE, policy(allow("sqs:*")), resource_policy=closed), EXPLICITLY_DENIED),
    )


def test_within_one_account_an_allow_in_either_the_identity_or_the_resource_policy_suffices() -> None:
    grants_user = policy(allow("sqs:SendMessage", QUEUE, Principal={"AWS": USER}))
    own = policy(allow("sqs:SendMessage", QUEUE))
    # a principal of another account needs both: its own policy's Allow and the resource policy's
    elsewhere = SESSION.replace(ACCOUNT, ELSEWHERE)
    grants_elsewhere = policy(
        allow("sqs:SendMessage", QUEUE, Principal={"AWS": f"arn:aws:iam::{ELSEWHERE}:root"})
    )
    assert_decided(
        (ask("sqs:SendMessage", QUEUE, principal=USER, resource_policy=grants_user), ALLOWED),
        (ask("sqs:SendMessage", QUEUE, own, resource_policy=grants_user), ALLOWED),
        (ask("sqs:SendMessage", QUEUE, own, principal=elsewhere), IMPLICITLY_DENIED),
        (
            ask("sqs:SendMessage", QUEUE, principal=elsewhere, resource_policy=grants_elsewhere),
            IMPLICITLY_DENIED,
        ),
        (ask("sqs:SendMessage", QUEUE, own, principal=elsewhere, resource_policy=grants_elsewhere), ALLOWED),
        # a service principal has no identity policy: only the resource's policy can let it in
        (ask("sqs:SendMessage", QUEUE, principal="events.amazonaws.com"), IMPLICITLY_DENIED),
    )


# --- Action / NotAction, Resource / NotResource, wildcards ------------------------------------------------
def test_not_action_and_not_resource_match_everything_but_what_they_list() -> None:
    everything_but_iam = policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})
    only_orders = policy(
        allow("dynamodb:*"), {"Effect": "Deny", "Action": "dynamodb:*", "NotResource": TABLE}
    )
    assert_decided(
        (ask("sqs:SendMessage", QUEUE, everything_but_iam), ALLOWED),
        (ask("iam:CreateUser", f"arn:aws:iam::{ACCOUNT}:user/bob", everything_but_iam), IMPLICITLY_DENIED),
        (ask("dynamodb:GetItem", TABLE, only_orders), ALLOWED),
        (ask("dynamodb:GetItem", TABLE.replace("Orders", "Stock"), only_orders), EXPLICITLY_DENIED),
    )


def test_actions_match_case_insensitively_and_resources_case_sensitively_with_star_and_question_mark() -> (
    None
):
    index = f"{TABLE}/index/ByTime"
    assert_decided(
        (ask("dynamodb:GetItem", TABLE, policy(allow("DynamoDB:get*", TABLE))), ALLOWED),
        (ask("dynamodb:GetItem", TABLE, policy(allow("dynamodb:?etItem", TABLE))), ALLOWED),
        (ask("dynamodb:GetItem", TABLE, policy(allow("dynamodb:GetItem", TABLE.lower()))), IMPLICITLY_DENIED),
        (
            ask(
                "dynamodb:GetItem",
                TABLE,
                policy(allow("dynamodb:GetItem", TABLE.replace("Orders", "Ord?rs"))),
            ),
            ALLOWED,
        ),
        # a table's ARN is not its indexes': a Query on an index needs the index's ARN (or a wildcard)
        (ask("dynamodb:Query", index, policy(allow("dynamodb:Query", TABLE))), IMPLICITLY_DENIED),
        (ask("dynamodb:Query", index, policy(allow("dynamodb:Query", f"{TABLE}/index/*"))), ALLOWED),
    )


# --- conditions ---------------------------------------------------------------------------------------------
def test_a_condition_holds_only_on_the_value_the_request_carries() -> None:
    # After the documented queue policy for an EventBridge rule's target: only that rule may send.
    only_the_rule = policy(
        allow(
            "sqs:SendMessage",
            QUEUE,
            Principal={"Service": "events.amazonaws.com"},
            Condition={"ArnEquals": {"aws:SourceArn": RULE}},
        )
    )

    def sent_by(context: dict[str, Any]) -> Request:
        return ask(
            "sqs:SendMessage",
            QUEUE,
            principal="events.amazonaws.com",
            resource_policy=only_the_rule,
            context=context,
        )

    assert_decided(
        (sent_by({"aws:SourceArn": RULE}), ALLOWED),
        (sent_by({"aws:SourceArn": RULE.replace("orders", "other")}), IMPLICITLY_DENIED),
        (sent_by({}), IMPLICITLY_DENIED),  # a key the request does not carry satisfies no condition ...
    )


def test_if_exists_and_like_operators() -> None:
    # ... but an ...IfExists one, and a Like operator matches its wildcards
    if_exists = policy(
        allow("sqs:SendMessage", QUEUE, Condition={"StringEqualsIfExists": {"aws:SourceAccount": ACCOUNT}})
    )
    alarms = policy(
        allow(
            "sqs:SendMessage",
            QUEUE,
            Condition={"ArnLike": {"aws:SourceArn": "arn:aws:cloudwatch:*:*:alarm:stack-*"}},
        )
    )
    alarm = f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:stack-errors"
    assert_decided(
        (ask("sqs:SendMessage", QUEUE, if_exists), ALLOWED),
        (
            ask("sqs:SendMessage", QUEUE, if_exists, context={"aws:SourceAccount": ELSEWHERE}),
            IMPLICITLY_DENIED,
        ),
        (ask("sqs:SendMessage", QUEUE, alarms, context={"aws:SourceArn": alarm}), ALLOWED),
        (
            ask(
                "sqs:SendMessage", QUEUE, alarms, context={"aws:SourceArn": alarm.replace("stack-", "other-")}
            ),
            IMPLICITLY_DENIED,
        ),
    )


# --- services whose own policy must allow: KMS keys, role trust -------------------------------------------
def test_a_kms_key_is_used_only_as_its_key_policy_allows() -> None:
    role_may = policy(allow("kms:Decrypt", KEY))
    service_only = policy(allow("kms:Decrypt", Principal={"Service": "cloudwatch.amazonaws.com"}))
    account_too = policy(
        allow("kms:*", Principal={"AWS": f"arn:aws:iam::{ACCOUNT}:root"}),
        allow("kms:Decrypt", Principal={"Service": "cloudwatch.amazonaws.com"}),
    )
    assert_decided(
        # without the key policy's statement for the account, an IAM policy cannot grant the key
        (ask("kms:Decrypt", KEY, role_may, resource_policy=service_only), IMPLICITLY_DENIED),
        (ask("kms:Decrypt", KEY, role_may, resource_policy=account_too), ALLOWED),
        (
            ask("kms:Decrypt", KEY, principal="cloudwatch.amazonaws.com", resource_policy=service_only),
            ALLOWED,
        ),
        (
            ask("kms:Decrypt", KEY, principal="sns.amazonaws.com", resource_policy=service_only),
            IMPLICITLY_DENIED,
        ),
    )


def test_a_role_is_assumed_only_by_whom_its_trust_policy_names() -> None:
    trust = policy(
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    )
    assert_decided(
        (ask("sts:AssumeRole", ROLE, principal="lambda.amazonaws.com", resource_policy=trust), ALLOWED),
        (
            ask("sts:AssumeRole", ROLE, principal="scheduler.amazonaws.com", resource_policy=trust),
            IMPLICITLY_DENIED,
        ),
    )


# --- what is not a decision ---------------------------------------------------------------------------------
def test_a_request_aws_would_not_recognise_is_an_error_not_a_denial() -> None:
    anything = policy(allow("*"))
    assert_decided(
        (ask("dynamodb:GetItems", TABLE, anything), ERROR),  # no such action
        (ask("dynamodb:GetItem", QUEUE, anything), ERROR),  # no resource type of the action
        (ask("xray:PutTraceSegments", TABLE, anything), ERROR),  # no resource-level permissions: "*" only
    )


def test_each_decision_names_the_caller_the_action_the_resource_and_the_deciding_statements() -> None:
    grant = policy({"Sid": "ReadOrders", **allow("dynamodb:GetItem", TABLE)})
    found = decisions(
        [
            Request("a", SESSION, "dynamodb:GetItem", TABLE, (("role/p", grant),), account=ACCOUNT),
            Request("b", SESSION, "dynamodb:PutItem", TABLE, (("role/p", grant),), account=ACCOUNT),
        ]
    )
    assert [(d.request.who, d.result) for d in found] == [("a", ALLOWED), ("b", IMPLICITLY_DENIED)]
    assert str(found[0]) == f"a: dynamodb:GetItem on {TABLE}: Allowed by identity role/p ReadOrders"
    assert str(found[1]) == (
        f"b: dynamodb:PutItem on {TABLE}: ImplicitlyDenied by no identity statement allows it"
    )
    assert decisions([]) == []


def test_without_the_simulator_installed_it_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tools.iam import evaluation

    monkeypatch.setattr(evaluation, "SIMULATOR", tmp_path / "missing")
    with pytest.raises(SimulatorError, match=r"make tools/iam/node_modules/\.installed"):
        decisions([Request("a", SESSION, "dynamodb:GetItem", TABLE)])


def test_a_simulator_that_stopped_is_started_again() -> None:
    from tools.iam import evaluation

    request = ask("dynamodb:GetItem", TABLE, policy(allow("dynamodb:GetItem", TABLE)))
    assert [d.result for d in decisions([request])] == [ALLOWED]
    [running] = evaluation._running
    running.process.kill()
    running.process.wait()
    assert [d.result for d in decisions([request])] == [ALLOWED]
    assert evaluation._running != [running]


def test_a_condition_on_a_key_the_request_does_not_set_is_named() -> None:
    from tools.iam import missing_condition_keys

    leading = policy(
        allow(
            "dynamodb:GetItem",
            TABLE,
            Condition={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["a"]}},
        ),
        allow("dynamodb:PutItem", TABLE, Condition={"StringEqualsIfExists": {"dynamodb:Attributes": ["b"]}}),
        allow("sqs:*", QUEUE, Condition={"Bool": {"aws:SecureTransport": "true"}}),
    )
    assert missing_condition_keys(ask("dynamodb:GetItem", TABLE, leading)) == {"dynamodb:leadingkeys"}
    assert (
        missing_condition_keys(ask("dynamodb:PutItem", TABLE, leading)) == set()
    )  # ...IfExists: absent is meant
    assert missing_condition_keys(ask("sqs:SendMessage", QUEUE, leading)) == {"aws:securetransport"}
    assert (
        missing_condition_keys(
            ask("sqs:SendMessage", QUEUE, leading, context={"aws:SecureTransport": "true"})
        )
        == set()
    )
