"""TransactWriteItems under contention: retried in-process within the budget, one token per outcome.

The SDK does not retry TransactionCanceledException; AWS recommends retrying conflicts with backoff
(DynamoDB developer guide, "Transaction conflict handling"). ClientRequestToken makes a resent
transaction idempotent for 10 minutes (TransactWriteItems API reference).
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

import shop.adapters.aws
import shop.adapters.dynamodb.transactions as dynamo
from shop.domain.errors import ServiceBusy

ACTIONS = [{"Put": {"TableName": "t", "Item": {"PK": {"S": "a"}}}}]


def cancelled(*codes: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
            "CancellationReasons": [{"Code": code} for code in codes],
        },
        "TransactWriteItems",
    )


def plain(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "TransactWriteItems")


class ScriptedDynamoDB:
    """Answers TransactWriteItems with the given failures in turn, then succeeds; records each call."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls: list[dict[str, Any]] = []

    def transact_write_items(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if self.failures:
            raise self.failures.pop(0)
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def run(monkeypatch: pytest.MonkeyPatch, client: ScriptedDynamoDB, clock: Clock, **kwargs: Any) -> None:
    monkeypatch.setattr(shop.adapters.aws, "dynamodb", lambda: client)
    dynamo.transact_write_items(
        ACTIONS, sleep=clock.sleep, clock=lambda: clock.now, jitter=lambda: 1.0, **kwargs
    )


def test_conflicts_are_retried_until_the_transaction_commits(monkeypatch, clock):
    client = ScriptedDynamoDB(
        cancelled("None", "TransactionConflict"),
        cancelled("ThrottlingError", "None"),
        # Throttled on a provisioned table or index (ThrottlingError is an on-demand one's): the same
        # capacity shortfall as ProvisionedThroughputExceededException (TransactWriteItems API reference,
        # TransactionCanceledException reason codes)
        cancelled("None", "ProvisionedThroughputExceeded"),
        plain("ThrottlingException"),
    )

    run(monkeypatch, client, clock)

    assert len(client.calls) == 5
    assert all(call["TransactItems"] == ACTIONS for call in client.calls)
    # Exponential, capped: each pause at most twice the one before (jitter 1.0 = the ceiling).
    assert clock.sleeps == [0.025, 0.05, 0.1, 0.2]


def test_a_cancelled_attempt_wrote_nothing_so_the_next_is_a_new_request(monkeypatch, clock):
    client = ScriptedDynamoDB(cancelled("TransactionConflict"), cancelled("TransactionConflict"))

    run(monkeypatch, client, clock)

    tokens = [call["ClientRequestToken"] for call in client.calls]
    assert len(set(tokens)) == 3
    assert all(0 < len(token) <= 36 for token in tokens)  # ClientRequestToken: 1-36 characters


@pytest.mark.parametrize(
    "unknown",
    [ReadTimeoutError(endpoint_url="http://dynamodb"), plain("TransactionInProgressException")],
    ids=["read-timeout", "in-progress"],
)
def test_after_an_unknown_outcome_the_same_token_is_sent_again(monkeypatch, clock, unknown):
    """The first attempt may have committed: resent with its token, DynamoDB answers it as committed."""
    client = ScriptedDynamoDB(unknown)

    run(monkeypatch, client, clock)

    assert [call["ClientRequestToken"] for call in client.calls] == [
        client.calls[0]["ClientRequestToken"]
    ] * 2


@pytest.mark.parametrize(
    "failure",
    [
        cancelled("TransactionConflict", "ConditionalCheckFailed"),
        cancelled("ConditionalCheckFailed"),
        cancelled("ValidationError"),
        plain("ValidationException"),
    ],
    ids=["conflict-and-condition", "condition", "cancelled-invalid", "invalid"],
)
def test_a_failed_condition_or_an_invalid_request_is_never_retried(monkeypatch, clock, failure):
    client = ScriptedDynamoDB(failure)

    with pytest.raises(ClientError) as raised:
        run(monkeypatch, client, clock)

    assert raised.value is failure
    assert len(client.calls) == 1
    assert clock.sleeps == []


def test_contention_that_outlasts_the_budget_is_service_busy(monkeypatch, clock):
    client = ScriptedDynamoDB(*[cancelled("TransactionConflict")] * 1000)

    with pytest.raises(ServiceBusy):
        run(monkeypatch, client, clock)

    assert sum(clock.sleeps) <= dynamo.MAX_RETRY_SECONDS
    assert max(clock.sleeps) == 1.0  # the backoff cap
    assert len(client.calls) > 5


def test_retries_stop_short_of_the_invocation_deadline(monkeypatch, clock):
    """A consumer's batch holds other messages and the API must still answer: the last seconds of the
    invocation are never spent waiting for a retry."""
    client = ScriptedDynamoDB(*[cancelled("TransactionConflict")] * 1000)
    deadline = 3.0

    with pytest.raises(ServiceBusy):
        run(monkeypatch, client, clock, seconds_left=lambda: deadline - clock.now)

    assert deadline - clock.now >= dynamo.RESERVE_SECONDS
    assert clock.sleeps  # it did retry while there was time


@pytest.mark.parametrize(
    "unknown",
    [ReadTimeoutError(endpoint_url="http://dynamodb"), plain("TransactionInProgressException")],
    ids=["read-timeout", "transaction-in-progress"],
)
def test_an_unknown_outcome_that_outlasts_the_budget_is_service_busy(monkeypatch, clock, unknown):
    """As on PostgreSQL (a COMMIT whose answer was lost): the API answers 503 and its caller's retry, with
    the same Idempotency-Key, finds the order committed or writes it."""
    client = ScriptedDynamoDB(*[unknown] * 1000)

    with pytest.raises(ServiceBusy) as raised:
        run(monkeypatch, client, clock, seconds_left=lambda: 1.0)

    assert raised.value.__cause__ is unknown
    assert len(client.calls) == 1
