"""Unit layer: AWS is moto in-process, and no test may open a socket."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pytest_socket import disable_socket, enable_socket

from shop.adapters.postgres.connection import ConnectionSettings
from tests.conftest import reset_process_state
from tests.support.lambda_client import LambdaStub, install_lambda_stub
from tests.support.publishing import RecordingBus
from tools.template import Template

# The X-Ray SDK opens its (unconnected) UDP emitter socket at import: import it before sockets close.
import aws_xray_sdk.core  # noqa: F401  isort: skip


def pytest_runtest_setup() -> None:
    disable_socket(allow_unix_socket=True)


def pytest_runtest_teardown() -> None:
    enable_socket()


def drain_queue(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """Receive and delete every message of a queue; their bodies, decoded."""
    out: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        if not batch:
            return out
        for message in batch:
            out.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def postgres_environment(order_database: ConnectionSettings) -> dict[str, str]:
    """The functions' variables for OrderStore=postgres, on the test's database."""
    return {
        "ORDER_STORE": "postgres",
        "DATABASE_HOST": order_database.host,
        "DATABASE_PORT": str(order_database.port),
        "DATABASE_NAME": order_database.dbname,
        "DATABASE_USER": order_database.user,
    }


def order_store_environment(order_database: ConnectionSettings, template: Template) -> dict[str, str]:
    """The PostgreSQL order store functions' variables as the template will give them (they are not in
    it yet): the test's database, the template's bus and relay poison queue."""
    return {
        **postgres_environment(order_database),
        "EVENT_BUS_NAME": template.physical_name("EventBus"),
        "RELAY_POISON_QUEUE_URL": template.function("OutboxRelayFunction").environment[
            "RELAY_POISON_QUEUE_URL"
        ],
    }


@pytest.fixture(autouse=True)
def put_events_through_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """This layer's AWS is moto in-process, which only the SDK's calls reach: a function the template
    configures with PUBLISH_TRANSPORT=crt (the PostgreSQL publisher) publishes through the SDK client
    here, whatever `events` is then (moto's, a recorder). The awscrt transport itself is held to the
    SDK's behaviour in tests/conformance/test_put_events_transport.py, and runs in the local stack."""
    from shop.adapters import aws as aws_clients

    monkeypatch.setattr(aws_clients, "events_over_crt", lambda: aws_clients.events())


@pytest.fixture
def aws(fake_credentials: None, template: Template) -> Iterator[None]:
    """moto with every table of template.yaml created from its definition."""
    with mock_aws():
        reset_process_state()
        client = boto3.client("dynamodb")
        for logical_id in template.of_type("AWS::DynamoDB::Table"):
            client.create_table(**template.create_table_kwargs(logical_id))
        yield
        reset_process_state()


@pytest.fixture
def bus(aws: None, template: Template) -> Callable[[], list[dict[str, Any]]]:
    """The template's bus with a catch-all rule into a capture queue; returns a reader of what arrived."""
    events = boto3.client("events")
    sqs = boto3.client("sqs")
    bus_name = template.physical_name("EventBus")
    events.create_event_bus(Name=bus_name)
    queue_url = sqs.create_queue(QueueName="capture")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(Name="all", EventBusName=bus_name, EventPattern='{"source": [{"prefix": ""}]}')
    events.put_targets(Rule="all", EventBusName=bus_name, Targets=[{"Id": "capture", "Arn": queue_arn}])

    return lambda: drain_queue(sqs, queue_url)


@pytest.fixture
def poison_queue(aws: None, template: Template) -> Callable[[], list[dict[str, Any]]]:
    """The template's relay poison queue; returns a reader of the (decoded) messages parked in it."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=template.physical_name("RelayPoisonQueue"))["QueueUrl"]

    return lambda: drain_queue(sqs, queue_url)


@pytest.fixture
def api(aws: None, invoke: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
    """api(event, env=None): the order API's handler with the template's environment; its response."""

    def call(event: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        response = invoke("OrdersApiFunction", event, env)
        assert isinstance(response, dict)
        return response

    return call


@pytest.fixture
def recording_bus(monkeypatch: pytest.MonkeyPatch) -> RecordingBus:
    """PutEvents answered by a recorder (tests/support/publishing.py), for the PostgreSQL publishers."""
    from shop.adapters import aws as aws_clients

    recording = RecordingBus()
    monkeypatch.setattr(aws_clients, "events", lambda: recording)
    return recording


@pytest.fixture
def lambda_stub(monkeypatch: pytest.MonkeyPatch) -> Callable[..., LambdaStub]:
    """lambda_stub(answer, function_error=False): the operator's commands invoke a stub answering `answer`
    instead of the maintenance function (tests/support/lambda_client.py); returns the stub."""
    return partial(install_lambda_stub, monkeypatch)
