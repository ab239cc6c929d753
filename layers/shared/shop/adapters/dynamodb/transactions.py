"""Helpers shared by the DynamoDB repositories: transactions that ride out contention, and error
classification for transactions and throttling."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from shop.adapters import aws
from shop.domain.errors import ServiceBusy

_THROTTLING_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
# Reasons a transaction is cancelled that say nothing about the data: another transaction held one of
# its items, or a partition was throttled (TransactWriteItems API reference, cancellation reason codes:
# ThrottlingError on an on-demand table or index, ProvisionedThroughputExceeded on a provisioned one, the
# shortfall ProvisionedThroughputExceededException reports outside a transaction). The same transaction
# may commit a moment later.
_CONTENTION_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
CONDITION_FAILED = "ConditionalCheckFailed"
# Errors after which the transaction's outcome is unknown (it may have committed): retried with the
# same ClientRequestToken, so a committed transaction answers as committed instead of running again.
_OUTCOME_UNKNOWN = (ConnectionError, HTTPClientError)
_OUTCOME_UNKNOWN_CODES = frozenset({"TransactionInProgressException"})

# Full-jitter exponential backoff (AWS Architecture blog, "Exponential Backoff And Jitter"; DynamoDB
# developer guide, "Error retries and exponential backoff"): sleep U(0, min(cap, base * 2**attempt)).
_BACKOFF_BASE_SECONDS = 0.025
_BACKOFF_CAP_SECONDS = 1.0
# A write keeps retrying for at most this long, and never into the last seconds of its invocation: a
# consumer's batch holds other messages, and the API must still answer (503 + Retry-After).
MAX_RETRY_SECONDS = 5.0
RESERVE_SECONDS = 2.0

SecondsLeft = Callable[[], float]


def unbounded() -> float:
    """No invocation deadline (scripts, tests): only MAX_RETRY_SECONDS bounds the retries."""
    return float("inf")


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def cancellation_reasons(exc: ClientError) -> list[dict[str, Any]]:
    """Per-action reasons of a cancelled transaction, in the order of its TransactItems: each one's `Code`,
    and its `Item` as it stood when an action with ReturnValuesOnConditionCheckFailure=ALL_OLD failed
    its condition on an item that exists (API CancellationReason)."""
    reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons", [])  # type: ignore[assignment]
    return reasons


def cancellation_codes(exc: ClientError) -> list[str]:
    """Per-action reason codes of a cancelled transaction, in the order of its TransactItems."""
    return [str(reason.get("Code", "None")) for reason in cancellation_reasons(exc)]


def only_conditions_failed(codes: Sequence[str]) -> bool:
    """Whether the reasons of a cancelled transaction name nothing but failed conditions, contention and
    actions that were fine: then its failed conditions are the whole answer. Any other reason (a
    validation error caused by the transaction's changes, an item collection over its size limit) says
    nothing of the conditions, and its ClientError is the answer."""
    return set(codes) <= _CONTENTION_REASONS | {"None", CONDITION_FAILED}


def is_contention(exc: ClientError) -> bool:
    """Throttled, or cancelled only because of other transactions or throttling (no condition failed)."""
    code = error_code(exc)
    if code in _THROTTLING_CODES:
        return True
    if code != "TransactionCanceledException":
        return False
    reasons = set(cancellation_codes(exc))
    return bool(reasons & _CONTENTION_REASONS) and reasons <= _CONTENTION_REASONS | {"None"}


def raise_if_throttled(exc: ClientError) -> None:
    """Turn throttling or contention (plain or inside a cancelled transaction) into ServiceBusy."""
    if is_contention(exc):
        raise ServiceBusy("the order store is busy; retry shortly") from exc


_UNAVAILABLE = "the order store did not answer; retry shortly"


@contextmanager
def busy_when_unavailable() -> Iterator[None]:
    """A read that was throttled, or that the SDK gave up on after its own retries (a timeout, a broken
    connection), raises ServiceBusy: the API answers 503 + Retry-After, as it does for the PostgreSQL
    store, and a consumer's message is retried. Any other ClientError propagates, for the caller."""
    try:
        yield
    except ClientError as exc:
        raise_if_throttled(exc)
        raise
    except _OUTCOME_UNKNOWN as exc:
        raise ServiceBusy(_UNAVAILABLE) from exc


def new_request_token() -> str:
    return str(uuid.uuid4())  # ClientRequestToken: 1-36 characters


def transact_write_items(
    actions: Sequence[dict[str, Any]],
    *,
    seconds_left: SecondsLeft = unbounded,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """TransactWriteItems that rides out contention within the invocation's time budget.

    The SDK does not retry TransactionCanceledException, so a hot item (many orders on one SKU) would
    fail each conflicting transaction and burn one SQS receive of its message per conflict. A
    cancellation for contention only (TransactionConflict, ThrottlingError, ProvisionedThroughputExceeded;
    no condition failed) is retried here with jittered backoff; a cancellation means nothing was
    written, so each new attempt is a new request (a new ClientRequestToken). After an error that
    leaves the outcome unknown (a read timeout the SDK gave up on, TransactionInProgressException) the
    same token is sent again: DynamoDB answers a committed transaction's token as a success without
    writing (TransactWriteItems, ClientRequestToken), and the caller answers like the first call.
    Raises ServiceBusy when the budget runs out (contention, or an outcome still unknown), and the
    ClientError of any other failure (a condition that failed, a validation error) for the caller to
    classify.
    """
    started = clock()
    token = new_request_token()
    attempt = 0
    while True:
        try:
            aws.dynamodb().transact_write_items(
                TransactItems=list(actions),  # type: ignore[arg-type]
                ClientRequestToken=token,
            )
        except ClientError as exc:
            if error_code(exc) in _OUTCOME_UNKNOWN_CODES:
                failure: Exception = exc
            elif is_contention(exc):
                failure, token = exc, new_request_token()
            else:
                raise
        except _OUTCOME_UNKNOWN as exc:
            failure = exc
        else:
            return
        delay = jitter() * min(_BACKOFF_CAP_SECONDS, _BACKOFF_BASE_SECONDS * 2**attempt)
        spent = clock() - started
        if spent + delay > MAX_RETRY_SECONDS or seconds_left() - delay < RESERVE_SECONDS:
            if isinstance(failure, ClientError):
                raise_if_throttled(failure)
                if error_code(failure) not in _OUTCOME_UNKNOWN_CODES:
                    raise failure
            # The outcome is unknown: a retry of the same request (the same Idempotency-Key, the same
            # cancel) finds the transaction committed or runs it, so the caller is told to retry.
            raise ServiceBusy(_UNAVAILABLE) from failure
        attempt += 1
        sleep(delay)
