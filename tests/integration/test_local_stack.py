"""The local stack itself: HTTP in front of the handlers, event sources with Lambda's semantics, start-up.

Real DynamoDB Local and moto server; the real handlers (local_stack) or test-only probe handlers
(probe_stack) whose behaviour each record chooses. Every wait is bounded.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import requests
import yaml

from shop.adapters.dynamodb import keys
from tests.integration.conftest import probe_template_data, start_stack, stop_stack
from tests.support import load_event, stream_table_resource
from tools.local.console.activity import Invocation
from tools.local.invoke import invoke
from tools.local.processes import StartupError, live_children
from tools.local.runtime.functions import function_environment
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.local.stack_state import write_state
from tools.template import ROOT, Template

HTTP_TIMEOUT = 10
STREAM_SECONDS = 15
# On a DynamoDB Local of its own an expired item goes in about 1 s (see ttl_stack); AWS takes up to days,
# so nothing in the product waits for TTL.
TTL_SECONDS = 30


# --- helpers ------------------------------------------------------------------------------------------
def create_order(stack: LocalStack) -> tuple[str, str]:
    """POST /orders over HTTP with the sample request; returns (order id, Location)."""
    sample = load_event("api_create_order.json")
    response = requests.post(
        f"{stack.api_url}/orders",
        data=sample["body"],
        headers={"Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 201, response.text
    return response.json()["orderId"], response.headers["Location"]


def stream_functions(stack: LocalStack, table: str) -> list[str]:
    return [source.function for source in stack.sources.streams if source.table == table]


def deliveries(stack: LocalStack, function: str, key: str) -> list[tuple[Invocation, dict[str, Any]]]:
    """Every (invocation, record) in which a stream record with partition key `key` was delivered."""
    return [
        (invocation, record)
        for invocation in stack.activity.invocations(function)
        for record in invocation.records
        if record["dynamodb"]["Keys"]["PK"]["S"] == key
    ]


def probe_item(key: str, action: str = "ok", kind: str = "probe") -> dict[str, Any]:
    return {"PK": {"S": key}, "action": {"S": action}, "kind": {"S": kind}}


def write_together(stack: LocalStack, *items: dict[str, Any]) -> None:
    """One transaction, so the records arrive in one stream read and one batch."""
    table = stack.template.physical_name("ProbeTable")
    stack.clients.dynamodb().transact_write_items(
        TransactItems=[{"Put": {"TableName": table, "Item": item}} for item in items]
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class FailureQueue:
    """Reads the probe OnFailure queue once and keeps what it saw, so tests find their own messages."""

    def __init__(self, stack: LocalStack) -> None:
        self._sqs = stack.clients.sqs()
        self._url = stack.queue_url("ProbeFailureQueue")
        self.seen: list[dict[str, Any]] = []

    def find(self, sequence_number: str) -> dict[str, Any] | None:
        for message in self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            self.seen.append(json.loads(message["Body"]))
            self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])
        return next(
            (m for m in self.seen if m["DDBStreamBatchInfo"]["startSequenceNumber"] == sequence_number), None
        )


@pytest.fixture(scope="module")
def failure_queue(probe_stack: LocalStack) -> FailureQueue:
    return FailureQueue(probe_stack)


# --- API ----------------------------------------------------------------------------------------------
def test_the_api_serves_the_handlers_responses_over_http(local_stack: LocalStack) -> None:
    order_id, location = create_order(local_stack)

    got = requests.get(f"{local_stack.api_url}{location}", timeout=HTTP_TIMEOUT)
    staged = requests.get(f"{local_stack.api_url}/dev/orders/{order_id}", timeout=HTTP_TIMEOUT)
    unknown = requests.delete(f"{local_stack.api_url}/orders", timeout=HTTP_TIMEOUT)

    assert location == f"/orders/{order_id}"
    assert got.status_code == 200
    assert got.json()["orderId"] == order_id
    assert got.headers["Content-Type"] == "application/json"
    assert staged.status_code == 200, "the stage prefix of the execute-api URL is accepted too"
    assert unknown.status_code == 403
    assert unknown.json() == {"message": "Missing Authentication Token"}
    event = next(
        i.event
        for i in local_stack.activity.invocations()
        if i.trigger == "api" and i.event["path"] == location
    )
    assert event["resource"] == "/orders/{orderId}"
    assert event["pathParameters"] == {"orderId": order_id}
    assert event["requestContext"]["stage"] == "dev"
    assert event["requestContext"]["resourcePath"] == "/orders/{orderId}"
    assert set(load_event("api_get_order.json")) <= set(event), "the proxy event has every key of a real one"


def test_make_invoke_runs_a_function_against_the_running_stack(
    local_stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    invoke_get_order_against(local_stack, tmp_path, capsys)


def test_make_invoke_runs_a_function_as_a_running_postgres_stack_runs_it(
    postgres_stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stack's parameters (OrderStore=postgres) and its database come from its state file: the order
    is read from the PostgreSQL store, not looked for in a DynamoDB table. A Secrets Manager client made
    earlier in this process (as another test or command may) does not take it to AWS."""
    from shop.adapters import aws

    aws.reset_clients()
    with mock.patch.dict("os.environ", {"AWS_DEFAULT_REGION": "us-east-1"}):
        aws.secrets_manager()  # made without the local endpoints
    invoke_get_order_against(postgres_stack, tmp_path, capsys)


def invoke_get_order_against(
    local_stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id, _ = create_order(local_stack)
    event = load_event("api_get_order.json")
    event["pathParameters"] = {"orderId": order_id}
    event["path"] = f"/orders/{order_id}"
    event_file = tmp_path / "event.json"
    event_file.write_text(json.dumps(event))
    state_file = tmp_path / "stack.json"
    write_state(local_stack, state_file)

    code = invoke("OrdersApiFunction", event_file, state_file)

    printed = capsys.readouterr()
    response = json.loads(printed.out)
    assert code == 0
    assert "against the running local stack" in printed.err
    assert response["statusCode"] == 200
    assert json.loads(response["body"])["orderId"] == order_id, "it sees the running stack's data"


# --- DynamoDB stream mapping --------------------------------------------------------------------------
def test_an_outbox_insert_reaches_the_relay_in_lambdas_shape(local_stack: LocalStack) -> None:
    (relay,) = stream_functions(local_stack, "OrdersTable")
    order_id, _ = create_order(local_stack)
    partition = keys.order_partition(order_id)

    _, record = local_stack.wait_for(
        lambda: next(iter(deliveries(local_stack, relay, partition)), None),
        STREAM_SECONDS,
        "the outbox record reaching the relay",
    )

    assert set(record) == {
        "eventID",
        "eventName",
        "eventVersion",
        "eventSource",
        "awsRegion",
        "dynamodb",
        "eventSourceARN",
    }
    assert record["eventName"] == "INSERT"
    assert record["eventSource"] == "aws:dynamodb"
    assert record["eventVersion"] == "1.1"
    assert record["awsRegion"] == "us-east-1"
    assert record["eventSourceARN"] == local_stack.stream_arn("OrdersTable")
    stream = record["dynamodb"]
    assert set(stream) == {
        "ApproximateCreationDateTime",
        "Keys",
        "NewImage",
        "SequenceNumber",
        "SizeBytes",
        "StreamViewType",
    }
    assert isinstance(stream["ApproximateCreationDateTime"], int | float)
    assert abs(stream["ApproximateCreationDateTime"] - time.time()) < 120
    assert keys.is_outbox_sort_key(stream["Keys"]["SK"]["S"])
    delivered_sort_keys = [
        r["dynamodb"]["Keys"]["SK"]["S"] for _, r in deliveries(local_stack, relay, partition)
    ]
    assert all(keys.is_outbox_sort_key(sk) for sk in delivered_sort_keys), "the order item is filtered out"


def test_a_record_the_filter_excludes_never_invokes_the_function(probe_stack: LocalStack) -> None:
    excluded, marker = unique("excluded"), unique("marker")
    write_together(probe_stack, probe_item(excluded, kind="other"))
    write_together(probe_stack, probe_item(marker))

    # Records of a shard arrive in order: once the later marker is delivered, the first was passed over.
    probe_stack.wait_for(
        lambda: deliveries(probe_stack, "ProbeStreamFunction", marker), STREAM_SECONDS, "the marker record"
    )

    assert deliveries(probe_stack, "ProbeStreamFunction", excluded) == []


def test_a_reported_failure_checkpoints_at_the_lowest_failed_record(probe_stack: LocalStack) -> None:
    first, failing, last = unique("a"), unique("b"), unique("c")
    write_together(probe_stack, probe_item(first), probe_item(failing, "fail-once"), probe_item(last))

    def done() -> bool:
        finals = deliveries(probe_stack, "ProbeStreamFunction", last)
        return len(finals) == 2 and not finals[-1][0].failed_ids

    probe_stack.wait_for(done, STREAM_SECONDS, "the retried records")

    (batch, failing_record), retry = deliveries(probe_stack, "ProbeStreamFunction", failing)
    assert [r["dynamodb"]["Keys"]["PK"]["S"] for r in batch.records] == [first, failing, last]
    assert batch.failed_ids == (failing_record["dynamodb"]["SequenceNumber"],)
    assert retry[0].records[0]["dynamodb"]["Keys"]["PK"]["S"] == failing, "the retry starts at the checkpoint"
    assert len(deliveries(probe_stack, "ProbeStreamFunction", first)) == 1, "nothing before it is redelivered"


def test_exhausted_retries_send_lambdas_failure_metadata(
    probe_stack: LocalStack, failure_queue: FailureQueue
) -> None:
    key = unique("poison")
    write_together(probe_stack, probe_item(key, "fail"))
    _, record = probe_stack.wait_for(
        lambda: next(iter(deliveries(probe_stack, "ProbeStreamFunction", key)), None),
        STREAM_SECONDS,
        "delivery",
    )
    sequence = record["dynamodb"]["SequenceNumber"]

    message = probe_stack.wait_for(
        lambda: failure_queue.find(sequence), STREAM_SECONDS, "the OnFailure message"
    )

    assert set(message) == {"requestContext", "responseContext", "version", "timestamp", "DDBStreamBatchInfo"}
    assert message["version"] == "1.0"
    assert message["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert message["requestContext"]["approximateInvokeCount"] == 2, "the first attempt and one retry"
    assert message["requestContext"]["functionArn"].endswith(":function:probe-ProbeStreamFunction")
    # A reported failure is no function error: AWS sends functionError null, not no functionError
    # (https://docs.aws.amazon.com/lambda/latest/dg/services-dynamodb-errors.html).
    assert message["responseContext"] == {
        "statusCode": 200,
        "executedVersion": "$LATEST",
        "functionError": None,
    }
    info = message["DDBStreamBatchInfo"]
    assert info["startSequenceNumber"] == info["endSequenceNumber"] == sequence
    assert info["batchSize"] == 1
    assert info["streamArn"] == probe_stack.stream_arn("ProbeTable")
    assert info["shardId"].startswith("shardId-")
    assert info["approximateArrivalOfFirstRecord"].endswith("Z")
    assert len(deliveries(probe_stack, "ProbeStreamFunction", key)) == 2


def test_a_function_error_is_bisected_down_to_the_failing_record(
    probe_stack: LocalStack, failure_queue: FailureQueue
) -> None:
    before, poison, after = unique("x1"), unique("x2"), unique("x3")
    write_together(probe_stack, probe_item(before), probe_item(poison, "raise"), probe_item(after))

    def succeeded(key: str) -> bool:
        return any(
            not invocation.failed_ids for invocation, _ in deliveries(probe_stack, "ProbeStreamFunction", key)
        )

    probe_stack.wait_for(
        lambda: succeeded(before) and succeeded(after), STREAM_SECONDS, "the healthy records"
    )
    alone = [i for i, _ in deliveries(probe_stack, "ProbeStreamFunction", poison) if len(i.records) == 1]
    sequence = alone[0].records[0]["dynamodb"]["SequenceNumber"]
    message = probe_stack.wait_for(
        lambda: failure_queue.find(sequence), STREAM_SECONDS, "the OnFailure message"
    )

    assert len(alone) == 2, "isolated by bisection, then retried once (splits are not retries)"
    assert all(i.result.error is not None and i.result.error.error_type == "RuntimeError" for i in alone)
    assert message["responseContext"]["functionError"] == "Unhandled"
    assert message["DDBStreamBatchInfo"]["batchSize"] == 1


@pytest.fixture(scope="module")
def ttl_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The probe stack on a DynamoDB Local of its own.

    DynamoDB Local's TTL sweeper is one small thread pool over every table of the instance, paging 20
    items and waiting 10 s between pages: on the session's shared instance (dozens of tables) an expired
    item took from seconds to more than 90 s to go. Alone with its tables it is deleted in about 1 s
    (measured 0.8-1.1 s, three runs), so the wait below is a bound, not a hope.
    """
    services = LocalServices(tmp_path_factory.mktemp("ttl-services"))
    services.start()
    options = StackOptions(
        api_port=0,
        data_dir=tmp_path_factory.mktemp("ttl-stack"),
        seed_file=None,
        only_functions=frozenset({"ProbeStreamFunction"}),
    )
    try:
        stack = start_stack(Template(probe_template_data(), stack_name="ttl"), options, services)
        try:
            yield stack
        finally:
            stop_stack(stack)
    finally:
        services.stop()


def test_ttl_deletions_arrive_as_lambda_delivers_them(ttl_stack: LocalStack) -> None:
    # DynamoDB Local names TTL deletions UNKNOWN_TO_SDK_VERSION; Lambda delivers REMOVE by the service.
    key = f"ttl#{uuid.uuid4().hex[:10]}"
    expired = {"PK": {"S": key}, "expiresAt": {"N": str(int(time.time()) - 60)}}
    ttl_stack.clients.dynamodb().put_item(
        TableName=ttl_stack.template.physical_name("ProbeTtlTable"), Item=expired
    )

    def removal() -> dict[str, Any] | None:
        records = [r for _, r in deliveries(ttl_stack, "ProbeStreamFunction", key)]
        return next((r for r in records if r["eventName"] != "INSERT"), None)

    record = ttl_stack.wait_for(removal, TTL_SECONDS, "the TTL deletion record")

    assert record["eventName"] == "REMOVE"
    assert record["userIdentity"] == {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
    assert "NewImage" not in record["dynamodb"]


# --- functions ----------------------------------------------------------------------------------------
def test_a_function_sees_exactly_the_environment_its_definition_gives_it(probe_stack: LocalStack) -> None:
    spec = probe_stack.template.function("ProbeStreamFunction")
    physical = probe_stack.template.physical_name("ProbeStreamFunction")

    result = probe_stack.invoke("ProbeStreamFunction", {})

    seen = result.payload
    environment = seen["environment"]
    # Python adds LC_CTYPE when it coerces the C locale; the runtime adds the trace header per invocation.
    allowed = set(function_environment(spec, physical, probe_stack.endpoints)) | {
        "_X_AMZN_TRACE_ID",
        "LC_CTYPE",
    }
    assert set(environment) <= allowed
    assert spec.environment.items() <= environment.items()
    assert environment["PROBE_TABLE_NAME"] == "probe-ProbeTable"
    assert environment["STAGE"] == "dev", "Globals apply"
    assert environment["AWS_ENDPOINT_URL_DYNAMODB"] == probe_stack.endpoints.dynamodb
    assert environment["AWS_LAMBDA_FUNCTION_NAME"] == physical
    assert seen["sys_path"][:2] == [str(spec.code_uri), str(ROOT / "layers" / "shared")]
    assert str(ROOT) not in seen["sys_path"]
    assert seen["cwd"] == str(spec.code_uri)
    assert 0 < seen["remaining_ms"] <= spec.timeout * 1000


def sleeping_record_event(prefix: str, seconds: float) -> dict[str, Any]:
    """A stream event of one record that asks the probe handler to sleep `seconds`."""
    image = {"action": {"S": "sleep"}, "seconds": {"N": str(seconds)}}
    record = {"dynamodb": {"Keys": {"PK": {"S": unique(prefix)}}, "NewImage": image, "SequenceNumber": "1"}}
    return {"Records": [record]}


def test_an_invocation_outliving_the_timeout_is_a_function_error(probe_stack: LocalStack) -> None:
    spec = probe_stack.template.function("ProbeStreamFunction")
    slow = sleeping_record_event("slow", spec.timeout + 3)

    timed_out = probe_stack.invoke("ProbeStreamFunction", slow)
    next_call = probe_stack.invoke("ProbeStreamFunction", {})

    assert timed_out.error is not None
    assert timed_out.error.error_type == "Sandbox.Timedout"
    assert spec.timeout * 1000 <= timed_out.duration_ms < (spec.timeout + 2) * 1000
    assert next_call.ok
    assert next_call.environment_number != timed_out.environment_number, "a timed-out environment is replaced"
    assert (
        timed_out.environment_number not in probe_stack.functions["ProbeStreamFunction"].environment_numbers()
    )


def test_an_invocation_that_overruns_its_timeout_a_little_is_timed_out_too(probe_stack: LocalStack) -> None:
    # AWS: an invocation that runs past its Timeout fails with "Task timed out", however little past.
    spec = probe_stack.template.function("ProbeStreamFunction")
    overrun = sleeping_record_event("overrun", spec.timeout + 0.1)

    result = probe_stack.invoke("ProbeStreamFunction", overrun)

    assert result.error is not None
    assert result.error.error_type == "Sandbox.Timedout"


# --- SQS mapping --------------------------------------------------------------------------------------
def queue_deliveries(stack: LocalStack, body: str) -> list[tuple[Invocation, dict[str, Any]]]:
    return [
        (i, r)
        for i in stack.activity.invocations("ProbeQueueFunction")
        for r in i.records
        if r["body"] == body
    ]


def test_partial_batch_failures_return_to_the_queue_until_the_redrive_policy_moves_them(
    probe_stack: LocalStack,
) -> None:
    sqs = probe_stack.clients.sqs()
    healthy, failing = unique("ok"), unique("fail")
    sqs.send_message(
        QueueUrl=probe_stack.queue_url("ProbeQueue"),
        MessageBody=healthy,
        MessageAttributes={"origin": {"DataType": "String", "StringValue": "test"}},
    )
    sqs.send_message(QueueUrl=probe_stack.queue_url("ProbeQueue"), MessageBody=failing)
    dead_letters = probe_stack.queue_url("ProbeDeadLetterQueue")

    def in_dead_letter_queue() -> bool:
        messages = sqs.receive_message(QueueUrl=dead_letters, MaxNumberOfMessages=10).get("Messages", [])
        return any(m["Body"] == failing for m in messages)

    probe_stack.wait_for(in_dead_letter_queue, STREAM_SECONDS, "the failing message in the dead-letter queue")

    ((_, record),) = queue_deliveries(probe_stack, healthy)
    attempts = queue_deliveries(probe_stack, failing)
    assert [r["attributes"]["ApproximateReceiveCount"] for _, r in attempts] == ["1", "2"]
    assert all(r["messageId"] in i.failed_ids for i, r in attempts)
    assert set(record) == {
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "md5OfMessageAttributes",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    }
    assert record["eventSource"] == "aws:sqs"
    assert record["eventSourceARN"] == probe_stack.template.arn("ProbeQueue")
    assert record["awsRegion"] == "us-east-1"
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert record["messageAttributes"]["origin"] == {
        "stringValue": "test",
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }


def test_the_batch_size_comes_from_the_template(
    probe_stack: LocalStack, local_services: LocalServices, tmp_path: Path
) -> None:
    data = probe_template_data()
    queue_event = data["Resources"]["ProbeQueueFunction"]["Properties"]["Events"]["Queue"]["Properties"]
    queue_event["BatchSize"] = 5
    # Without a batching window Lambda may invoke with what one receive returned (fewer than five when the
    # poll wakes while the batch is still being sent); within a window it gathers up to BatchSize.
    queue_event["MaximumBatchingWindowInSeconds"] = 2
    copy = tmp_path / "template.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    options = StackOptions(
        api_port=0,
        data_dir=tmp_path / "data",
        seed_file=None,
        only_functions=frozenset({"ProbeQueueFunction"}),
    )
    edited = start_stack(Template.load(copy, stack_name="batch"), options, local_services)
    try:
        sizes = {}
        for stack in (probe_stack, edited):
            bodies = [unique("batch") for _ in range(5)]
            stack.clients.sqs().send_message_batch(
                QueueUrl=stack.queue_url("ProbeQueue"),
                Entries=[{"Id": str(n), "MessageBody": body} for n, body in enumerate(bodies)],
            )

            def all_delivered(stack: LocalStack = stack, bodies: list[str] = bodies) -> bool:
                return all(queue_deliveries(stack, body) for body in bodies)

            stack.wait_for(all_delivered, STREAM_SECONDS, "all five messages")
            sizes[stack.template.stack_name] = max(
                len(i.records) for b in bodies for i, _ in queue_deliveries(stack, b)
            )
    finally:
        stop_stack(edited)

    assert sizes == {"probe": 3, "batch": 5}
    # A stack that borrowed the services drops its tables: the shared DynamoDB Local's TTL sweeps stay live.
    tables = probe_stack.clients.dynamodb().list_tables()["TableNames"]
    assert [t for t in tables if t.startswith("batch-")] == []
    assert "probe-ProbeTable" in tables


# --- start-up -----------------------------------------------------------------------------------------
@pytest.fixture
def taken_port() -> Any:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_taken_port_fails_start_up_quickly_and_clearly(
    taken_port: int, local_services: LocalServices, tmp_path: Path
) -> None:
    running = {child.pid for child in live_children()}
    services = LocalServices(tmp_path, dynamodb_port=taken_port)
    stack = LocalStack(
        Template.load(), StackOptions(api_port=taken_port, data_dir=tmp_path), services=local_services
    )

    started = time.monotonic()
    with pytest.raises(StartupError, match=f"port {taken_port} for DynamoDB Local is already in use"):
        services.start()
    with pytest.raises(StartupError, match=f"port {taken_port} for the local API is already in use"):
        stack.start()
    elapsed = time.monotonic() - started

    assert elapsed < 5
    assert {child.pid for child in live_children()} == running, "nothing is left running"


def test_missing_java_is_a_clear_start_up_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StartupError, match="Java is required"):
        LocalServices(tmp_path).start()


# --- concurrency --------------------------------------------------------------------------------------
SLOW_HANDLERS = """
import json
import os
import time


def _seconds(event):
    if "httpMethod" in event:
        return float((event.get("queryStringParameters") or {}).get("sleep", "0"))
    if "Records" in event:
        return max(_record_seconds(record) for record in event["Records"])
    return float(event.get("sleep", 0))


def _record_seconds(record):
    if "body" in record:
        return float(json.loads(record["body"]).get("sleep", 0))
    return float(record["dynamodb"].get("NewImage", {}).get("sleep", {}).get("N", "0"))


def handler(event, context):
    started = time.time()
    time.sleep(_seconds(event))
    answer = {"pid": os.getpid(), "started": started, "ended": time.time()}
    if "httpMethod" in event:
        return {"statusCode": 200, "body": json.dumps(answer)}
    return answer
"""
CONCURRENCY_LIMIT = 3


def concurrency_template(code_dir: Path) -> Template:
    """Slow handlers behind an API route, a queue and a table stream, with the stack's limit of 3 per
    function, and one function whose ReservedConcurrentExecutions is 1."""

    def function(events: dict[str, Any], **properties: Any) -> dict[str, Any]:
        return {
            "Type": "AWS::Serverless::Function",
            "Properties": {
                "CodeUri": str(code_dir),
                "Handler": "slow_handlers.handler",
                "Runtime": "python3.13",
                "Timeout": 10,
                "Events": events,
                **properties,
            },
        }

    resources = {
        "SlowQueue": {"Type": "AWS::SQS::Queue", "Properties": {"VisibilityTimeout": 30}},
        "SlowTable": stream_table_resource(),
        "SlowFunction": function(
            {
                "Slow": {"Type": "Api", "Properties": {"Path": "/slow", "Method": "get"}},
                "Queue": {
                    "Type": "SQS",
                    "Properties": {"Queue": {"Fn::GetAtt": ["SlowQueue", "Arn"]}, "BatchSize": 1},
                },
            }
        ),
        "OrderedFunction": function(
            {
                "Stream": {
                    "Type": "DynamoDB",
                    "Properties": {
                        "Stream": {"Fn::GetAtt": ["SlowTable", "StreamArn"]},
                        "StartingPosition": "TRIM_HORIZON",
                        "BatchSize": 2,
                    },
                }
            }
        ),
        "ReservedFunction": function({}, ReservedConcurrentExecutions=1, Timeout=1),
    }
    return Template({"Resources": resources}, stack_name="concurrency")


@pytest.fixture(scope="module")
def concurrency_stack(local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory) -> Any:
    code_dir = tmp_path_factory.mktemp("concurrency-code")
    (code_dir / "slow_handlers.py").write_text(SLOW_HANDLERS)
    options = StackOptions(
        api_port=0,
        data_dir=tmp_path_factory.mktemp("concurrency-stack"),
        seed_file=None,
        max_concurrency=CONCURRENCY_LIMIT,
    )
    stack = start_stack(concurrency_template(code_dir), options, local_services)
    yield stack
    stop_stack(stack)


def spans(payloads: list[dict[str, Any]]) -> list[tuple[float, float]]:
    return sorted((p["started"], p["ended"]) for p in payloads)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of the intervals that share a moment."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def invoke_together(stack: LocalStack, function: str, events: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=len(events)) as pool:
        return list(pool.map(lambda event: stack.invoke(function, event), events))


def test_invocations_of_one_function_run_in_separate_environments_at_once(
    concurrency_stack: LocalStack,
) -> None:
    runtime = concurrency_stack.functions["SlowFunction"]

    first, second = invoke_together(concurrency_stack, "SlowFunction", [{"sleep": 1}, {"sleep": 1}])
    later = concurrency_stack.invoke("SlowFunction", {})

    assert first.ok
    assert second.ok
    assert first.environment_number != second.environment_number
    assert first.payload["pid"] != second.payload["pid"]
    assert most_at_once(spans([first.payload, second.payload])) == 2, "the two invocations overlapped"
    assert not later.cold_start, "an idle environment is reused"
    assert later.environment_number in {first.environment_number, second.environment_number}
    assert runtime.max_concurrency == CONCURRENCY_LIMIT


def test_the_environments_of_a_function_are_bounded_by_its_maximum(concurrency_stack: LocalStack) -> None:
    runtime = concurrency_stack.functions["SlowFunction"]

    results = invoke_together(concurrency_stack, "SlowFunction", [{"sleep": 0.5}] * (CONCURRENCY_LIMIT + 2))

    assert all(result.ok for result in results)
    assert len({result.environment_number for result in results}) <= CONCURRENCY_LIMIT
    assert len(runtime.environment_numbers()) <= CONCURRENCY_LIMIT
    assert most_at_once(spans([result.payload for result in results])) <= CONCURRENCY_LIMIT


def test_reserved_concurrency_in_the_template_bounds_the_function(concurrency_stack: LocalStack) -> None:
    runtime = concurrency_stack.functions["ReservedFunction"]

    first, second = invoke_together(concurrency_stack, "ReservedFunction", [{"sleep": 0.3}, {"sleep": 0.3}])
    timed_out = concurrency_stack.invoke("ReservedFunction", {"sleep": 3})
    after = concurrency_stack.invoke("ReservedFunction", {})

    assert runtime.max_concurrency == 1
    assert first.ok
    assert second.ok
    assert first.environment_number == second.environment_number
    assert most_at_once(spans([first.payload, second.payload])) == 1, "one at a time"
    assert timed_out.error is not None
    assert timed_out.error.error_type == "Sandbox.Timedout"
    assert after.ok
    assert after.cold_start, "the timed-out environment was replaced by a new one"
    assert after.environment_number != timed_out.environment_number
    assert runtime.environment_numbers() == [after.environment_number]


def test_the_api_serves_requests_concurrently(concurrency_stack: LocalStack) -> None:
    url = f"{concurrency_stack.api_url}/slow?sleep=1"
    with ThreadPoolExecutor(max_workers=2) as pool:
        responses = list(pool.map(lambda _: requests.get(url, timeout=HTTP_TIMEOUT), range(2)))

    assert [response.status_code for response in responses] == [200, 200]
    answers = [response.json() for response in responses]
    assert answers[0]["pid"] != answers[1]["pid"]
    assert most_at_once(spans(answers)) == 2, "the two requests were handled at the same time"


def test_queue_batches_are_processed_concurrently_up_to_the_functions_maximum(
    concurrency_stack: LocalStack,
) -> None:
    sqs = concurrency_stack.clients.sqs()
    bodies = [json.dumps({"sleep": 1, "id": unique("slow")}) for _ in range(CONCURRENCY_LIMIT + 2)]
    sqs.send_message_batch(
        QueueUrl=concurrency_stack.queue_url("SlowQueue"),
        Entries=[{"Id": str(n), "MessageBody": body} for n, body in enumerate(bodies)],
    )

    def delivered() -> list[Invocation] | None:
        found = [
            invocation
            for invocation in concurrency_stack.activity.invocations("SlowFunction")
            if invocation.trigger == "sqs" and invocation.records[0]["body"] in bodies
        ]
        return found if len(found) == len(bodies) else None

    invocations = concurrency_stack.wait_for(delivered, STREAM_SECONDS, "every slow message")

    assert all(invocation.result.ok and len(invocation.records) == 1 for invocation in invocations)
    overlap = most_at_once(spans([invocation.result.payload for invocation in invocations]))
    assert 2 <= overlap <= CONCURRENCY_LIMIT, "several batches at once, never more than the maximum"
    assert not sqs.receive_message(QueueUrl=concurrency_stack.queue_url("SlowQueue")).get("Messages")


def test_a_stream_shard_is_still_processed_one_batch_at_a_time_in_order(
    concurrency_stack: LocalStack,
) -> None:
    table = concurrency_stack.template.physical_name("SlowTable")
    dynamodb = concurrency_stack.clients.dynamodb()
    written = [unique(f"ordered-{n}") for n in range(6)]
    for key in written:
        dynamodb.put_item(TableName=table, Item={"PK": {"S": key}, "sleep": {"N": "0.3"}})

    def delivered() -> list[Invocation] | None:
        found = [
            invocation
            for invocation in concurrency_stack.activity.invocations("OrderedFunction")
            if any(record["dynamodb"]["Keys"]["PK"]["S"] in written for record in invocation.records)
        ]
        keys = [r["dynamodb"]["Keys"]["PK"]["S"] for invocation in found for r in invocation.records]
        return found if set(written) <= set(keys) else None

    invocations = concurrency_stack.wait_for(delivered, STREAM_SECONDS, "every stream record")
    invocations.sort(key=lambda invocation: invocation.result.payload["started"])

    delivered_keys = [r["dynamodb"]["Keys"]["PK"]["S"] for i in invocations for r in i.records]
    assert delivered_keys == written, "in write order, each record once"
    assert most_at_once(spans([invocation.result.payload for invocation in invocations])) == 1
