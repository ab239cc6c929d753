"""EventBridge → SQS trace propagation as AWS documents it, on the local stack's moto server
(tools/local/services/moto_server.py: pass_trace_headers_to_sqs_targets).

EventBridge user guide, "Amazon EventBridge integration with AWS X-Ray"
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-xray-integ.html): "EventBridge passes the
original trace header to the target"; it can do so "only if the event came from a PutEvents request that
passed the trace context"; "The trace header is not available on the event that's delivered to the
invocation target". For an SQS target the header arrives as the message's AWSTraceHeader system
attribute (X-Ray developer guide, "Amazon SQS and AWS X-Ray"). The saga's one trace
(shop.runtime.trace_context) rests on this.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tools.local.services.emulators import LocalServices

HEADER_A = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
HEADER_B = "Root=1-6759e988-cd862e3fe1be46a994272794;Parent=63995c3f42cd8ad9;Sampled=1"


@pytest.fixture
def bus_to_queue(
    local_services: LocalServices, fake_credentials: None
) -> Iterator[tuple[Any, Any, str, str]]:
    """A bus with one rule sending every `conformance.trace` event to a fresh queue."""
    moto = local_services.endpoints.moto
    events = boto3.client("events", endpoint_url=moto, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto, region_name="us-east-1")
    name = f"trace-{uuid.uuid4().hex[:8]}"
    events.create_event_bus(Name=name)
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(Name=name, EventBusName=name, EventPattern=json.dumps({"source": ["conformance.trace"]}))
    events.put_targets(Rule=name, EventBusName=name, Targets=[{"Id": "queue", "Arn": queue_arn}])
    yield events, sqs, name, queue_url
    events.remove_targets(Rule=name, EventBusName=name, Ids=["queue"])
    events.delete_rule(Name=name, EventBusName=name)
    events.delete_event_bus(Name=name)
    sqs.delete_queue(QueueUrl=queue_url)


def entry(bus: str, marker: str, trace_header: str | None) -> dict[str, Any]:
    put: dict[str, Any] = {
        "EventBusName": bus,
        "Source": "conformance.trace",
        "DetailType": "Traced",
        "Detail": json.dumps({"marker": marker}),
    }
    if trace_header:
        put["TraceHeader"] = trace_header
    return put


def received(sqs: Any, queue_url: str, count: int) -> dict[str, dict[str, Any]]:
    """Messages by their detail's marker, with their system attributes."""
    found: dict[str, dict[str, Any]] = {}
    for _ in range(20):
        for message in sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=1
        ).get("Messages", []):
            found[json.loads(message["Body"])["detail"]["marker"]] = message
        if len(found) >= count:
            break
    return found


def test_each_entrys_trace_header_reaches_its_sqs_message_as_aws_trace_header_and_not_the_event(
    bus_to_queue: tuple[Any, Any, str, str],
) -> None:
    events, sqs, bus, queue_url = bus_to_queue

    answer = events.put_events(
        Entries=[entry(bus, "a", HEADER_A), entry(bus, "untraced", None), entry(bus, "b", HEADER_B)]
    )

    assert answer["FailedEntryCount"] == 0
    assert len(answer["Entries"]) == 3
    messages = received(sqs, queue_url, 3)
    assert messages["a"]["Attributes"]["AWSTraceHeader"] == HEADER_A
    assert messages["b"]["Attributes"]["AWSTraceHeader"] == HEADER_B  # per entry, not per request
    assert "AWSTraceHeader" not in messages["untraced"]["Attributes"]  # only a traced PutEvents passes one
    for message in messages.values():
        assert "Root=" not in message["Body"]  # "not available on the event that's delivered"


def test_a_message_sent_by_a_client_carries_no_trace_header_it_did_not_send(
    bus_to_queue: tuple[Any, Any, str, str],
) -> None:
    _, sqs, _, queue_url = bus_to_queue

    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"detail": {"marker": "client"}}))

    assert "AWSTraceHeader" not in received(sqs, queue_url, 1)["client"]["Attributes"]
