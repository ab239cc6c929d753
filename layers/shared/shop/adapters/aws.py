"""AWS clients, created lazily on first use (never at import time) and reused across invocations.

Endpoints come from the standard `AWS_ENDPOINT_URL_<SERVICE>` variables, so the local stack and
tests redirect them without code changes.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient

    from shop.adapters.eventbridge_crt import CrtPutEvents

# The SDK's own retries stay short: the API answers 503 + Retry-After and the relay and consumers
# have their own retry budgets, so a throttled call should fail fast rather than eat the timeout.
CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 5
SDK_ATTEMPTS = 3  # a call's attempts, its first included
PUT_EVENTS_ATTEMPTS = 1  # the publisher retries PutEvents itself, entry by entry


def _client_config(
    attempts: int,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    **options: Any,
) -> Config:
    """A client's configuration: `attempts` in all, in standard mode (its backoff is what
    longest_call_seconds counts), and the timeouts. botocore's `max_attempts` counts the retries, one
    attempt more than it says, and a Config merged over this one replaces its retries whole (the mode
    with them): so the attempts are given here only, as botocore's `total_max_attempts`."""
    return Config(
        retries={"mode": "standard", "total_max_attempts": attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        **options,
    )


_CLIENT_CONFIG = _client_config(SDK_ATTEMPTS)


ANSWER_SECONDS = 1.0  # what a handler keeps after its last call, to answer before its invocation times out


def longest_call_seconds(
    attempts: int = SDK_ATTEMPTS,
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = READ_TIMEOUT_SECONDS,
) -> float:
    """How long one SDK call of a client of _client_config(attempts, ...) can take before it answers or
    fails: each attempt its connect and read timeouts, and standard mode's backoff before each retry (at
    most 1 s, then 2 s, doubling). Work that must end before its invocation does starts such a call only
    with this much time left."""
    backoff = float(2 ** (attempts - 1) - 1)  # 1 + 2 + ... s before attempts 2..n
    return attempts * (connect_timeout + read_timeout) + backoff


# awscrt times a connect itself (its socket's connect timeout); past it by this much, the AWS Common
# Runtime's transport (adapters.eventbridge_crt) answers the call with a connect timeout whatever awscrt did.
CRT_CONNECT_GRACE_SECONDS = 1.0


def longest_put_events_seconds(transport: str) -> float:
    """How long a PutEvents call through `transport` (put_events_client) can take before it answers or
    fails: the events client's attempts (one), or through the AWS Common Runtime one attempt whose
    connect may outlast its timeout by CRT_CONNECT_GRACE_SECONDS."""
    if transport == "crt":
        return CONNECT_TIMEOUT_SECONDS + CRT_CONNECT_GRACE_SECONDS + READ_TIMEOUT_SECONDS
    return longest_call_seconds(PUT_EVENTS_ATTEMPTS)


@cache
def dynamodb() -> DynamoDBClient:
    return boto3.client("dynamodb", config=_CLIENT_CONFIG)


@cache
def dynamodb_streams() -> DynamoDBStreamsClient:
    return boto3.client("dynamodbstreams", config=_CLIENT_CONFIG)


@cache
def events() -> EventBridgeClient:
    # PutEvents failures are handled entry by entry by the publisher: no SDK-level retries. Its calls
    # overlap (runtime.config's publish concurrency, at most 50): a connection for each.
    return boto3.client("events", config=_client_config(PUT_EVENTS_ATTEMPTS, max_pool_connections=50))


@cache
def events_over_crt() -> CrtPutEvents:
    """PutEvents through the AWS Common Runtime, with the SDK client's endpoint, region, timeouts and
    credentials. Imported on first use: only a function that ships awscrt (the PostgreSQL publisher's
    requirements.txt) can send through it."""
    from shop.adapters.eventbridge_crt import CrtPutEvents

    client = events()
    # boto3.client() made it from boto3's default session: the same credentials sign both.
    return CrtPutEvents(client, boto3.DEFAULT_SESSION.get_credentials() if boto3.DEFAULT_SESSION else None)


def put_events_client(transport: str) -> EventBridgeClient | CrtPutEvents:
    """What a relay's PutEvents go through: the SDK client ("sdk") or the AWS Common Runtime ("crt",
    runtime.config's PUBLISH_TRANSPORT)."""
    return events_over_crt() if transport == "crt" else events()


# The order database's password (OrderStore=postgres) is fetched when a connection opens, in the order
# API's request too, whose Lambda times out at 10 s: the fetch (at most 5 s with these), then the connect
# (shop.adapters.postgres.connection.CONNECT_TIMEOUT_SECONDS), must leave it time to answer 503. Botocore's
# defaults (60 s to connect, 60 s to read, 5 attempts) outlasted the invocation: API Gateway's 502. Secrets
# Manager answers a small secret in milliseconds; a fetch that fails is retried by the caller (503).
SECRETS_ATTEMPTS = 2
SECRETS_CONNECT_TIMEOUT_SECONDS = 1
SECRETS_READ_TIMEOUT_SECONDS = 1


@cache
def secrets_manager() -> SecretsManagerClient:
    config = _client_config(SECRETS_ATTEMPTS, SECRETS_CONNECT_TIMEOUT_SECONDS, SECRETS_READ_TIMEOUT_SECONDS)
    return boto3.client("secretsmanager", config=config)


@cache
def sqs() -> SQSClient:
    return boto3.client("sqs", config=_CLIENT_CONFIG)


@cache
def sns() -> SNSClient:
    return boto3.client("sns", config=_CLIENT_CONFIG)


_FACTORIES = (dynamodb, dynamodb_streams, events, events_over_crt, secrets_manager, sqs, sns)


def reset_clients() -> None:
    """Forget every cached client (tests switch endpoints and credentials between cases)."""
    for factory in _FACTORIES:
        factory.cache_clear()
