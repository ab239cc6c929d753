"""The console survives any record an outbox or a queue can hold (tests/support/outbox_corpus.py), and says
what happened to each record: parked, ignored, failed with its error, dead-lettered."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types

from tests.support import LambdaContext
from tests.support.outbox_corpus import LONG_INTEGER, PoisonRecord, corpus
from tools.local.console.activity import DEAD_LETTERED, Invocation, Notice, Publication
from tools.local.console.render import Console, describe_record
from tools.local.console.reports import FunctionReports, RecordReport
from tools.local.pollers.stream_records import lambda_stream_record
from tools.local.runtime.functions import FunctionError, InvocationResult

STREAM_ARN = "arn:aws:dynamodb:ddblocal:000000000000:table/local-OrdersTable/stream/2026-11-22T00:00:00.000"
CORPUS = corpus()


def strict_console() -> tuple[Console, io.BytesIO]:
    """A console writing UTF-8 strictly, as a terminal's stream does: a lone surrogate would raise."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    return Console(stream, color=False), raw


def stream_record(
    poison: PoisonRecord, sequence: str = "000000000000000000101", *, legacy_attributes: bool = True
) -> dict[str, Any]:
    """The outbox item's INSERT as the relay receives it (Lambda's shape of DynamoDB Local's JSON). The
    corpus's items carry the attributes items written before 2026-11-26 repeat the event in; without
    them (legacy_attributes=False), the item as the writers shape it now."""
    # Binary values arrive base64-encoded, as GetRecords' JSON has them.
    item = {
        name: {"B": base64.b64encode(value["B"]).decode()} if "B" in value else value
        for name, value in poison.dynamodb_item().items()
        if legacy_attributes or name not in {"eventId", "eventType", "aggregateId", "sequence"}
    }
    raw = {
        "eventID": "1",
        "eventName": "INSERT",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "ddblocal",
        "dynamodb": {
            "ApproximateCreationDateTime": 1795320000.0,
            "Keys": {"PK": item["PK"], "SK": item["SK"]},
            "NewImage": item,
            "SequenceNumber": sequence,
            "SizeBytes": 100,
            "StreamViewType": "NEW_IMAGE",
        },
    }
    return lambda_stream_record(raw, STREAM_ARN)


def sqs_record(body: str, message_id: str = "m-1", receives: int = 1) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": "r",
        "body": body,
        "attributes": {"ApproximateReceiveCount": str(receives)},
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:local-InventoryQueue",
        "awsRegion": "us-east-1",
    }


def relay_invocation(records: list[dict[str, Any]], failed: tuple[str, ...] = ()) -> Invocation:
    result = InvocationResult("req-1", payload={"batchItemFailures": []}, duration_ms=12.0)
    return Invocation("OutboxRelayFunction", "dynamodb", "OrdersTable", {"Records": records}, result, failed)


def printed(console: Console, raw: io.BytesIO, lines: list[str]) -> str:
    for line in lines:
        console.print(line)
    return raw.getvalue().decode("utf-8")  # strict: the stream holds UTF-8 only


@pytest.mark.parametrize("poison", CORPUS, ids=[p.name for p in CORPUS])
def test_each_poison_record_on_the_stream_prints_one_parked_line_naming_its_event(
    poison: PoisonRecord,
) -> None:
    console, raw = strict_console()
    record = stream_record(poison)
    parked = RecordReport(
        "parked", "envelope is not valid JSON", poison.event_id, sequence_number="000000000000000000101"
    )

    output = printed(console, raw, console.lines(relay_invocation([record]), [parked]))

    assert output.count("\n") == 1
    assert f"parked in the relay poison queue: envelope is not valid JSON (event {poison.event_id})" in output
    assert poison.aggregate_id in output, "the item's aggregateId says which order, envelope or not"
    assert not set(output) & {"\x1b", "\x00", "\r", "\u202e"}, "no control character reaches the terminal"
    assert len(output) < 1000, "a huge field is cut"


@pytest.mark.parametrize("poison", CORPUS, ids=[p.name for p in CORPUS])
def test_a_poison_item_without_the_former_attributes_is_named_by_the_event_id_its_key_ends_with(
    poison: PoisonRecord,
) -> None:
    console, raw = strict_console()
    record = stream_record(poison, legacy_attributes=False)
    parked = RecordReport(
        "parked", "envelope is not valid JSON", poison.event_id, sequence_number="000000000000000000101"
    )

    output = printed(console, raw, console.lines(relay_invocation([record]), [parked]))

    assert output.count("\n") == 1
    assert f"parked in the relay poison queue: envelope is not valid JSON (event {poison.event_id})" in output
    assert not set(output) & {"\x1b", "\x00", "\r", "\u202e"}, "no control character reaches the terminal"
    assert poison.aggregate_id in output, "the envelope's subject, or the order its partition key names"
    assert describe_record(record).event_id == poison.event_id


@pytest.mark.parametrize(
    "poison", [p for p in CORPUS if p.dynamodb is not None and "S" in p.dynamodb], ids=lambda p: p.name
)
def test_each_poison_body_on_a_queue_and_on_a_topic_prints_a_line(poison: PoisonRecord) -> None:
    console, raw = strict_console()
    body = poison.dynamodb["S"] if poison.dynamodb else ""
    result = InvocationResult("req-2", error=FunctionError("InvalidEnvelope", body[:100]))
    consumer = Invocation(
        "InventoryFunction", "sqs", "InventoryQueue", {"Records": [sqs_record(body)]}, result, ("m-1",)
    )
    lines = console.lines(consumer) + console.lines(Publication("NotificationTopic", body, subject=body[:50]))

    output = printed(console, raw, lines)

    assert output.count("\n") == 2
    assert "FAILED InvalidEnvelope" in output


def test_a_5000_digit_integer_does_not_hide_the_event_it_is_in() -> None:
    poison = next(p for p in CORPUS if p.name == LONG_INTEGER)

    view = describe_record(stream_record(poison))

    # Read with the integer kept as a description, not raised on: the envelope's own type and subject.
    assert view.what == f"OrderCreated {poison.aggregate_id}"
    assert view.event_id == poison.event_id


def test_a_lone_surrogate_and_controls_are_escaped_not_written() -> None:
    console, raw = strict_console()
    envelope = (
        '{"specversion": "1.0", "id": "e-1", "type": "Order\\ud800\\u001b[31mCreated", "subject": "o-1"}'
    )
    poison = PoisonRecord("x", "e-1", "o-1", {"S": envelope}, None)

    output = printed(console, raw, console.lines(relay_invocation([stream_record(poison)])))

    assert "Order\\ud800\\x1b[31mCreated o-1" in output


def test_an_entry_that_cannot_be_rendered_prints_a_line_saying_so() -> None:
    class Exploding(dict[str, Any]):
        def get(self, *_: object) -> Any:
            raise RuntimeError("boom")

    console, raw = strict_console()
    invocation = relay_invocation([Exploding(dynamodb={})])

    output = printed(console, raw, console.lines(invocation))

    assert "(Invocation the console cannot show: RuntimeError: boom)" in output


# --- what happened to each record ------------------------------------------------------------------------
def consumer_invocation(failed: tuple[str, ...] = ()) -> Invocation:
    body = json.dumps(
        {
            "detail-type": "InventoryReserved",
            "detail": {"specversion": "1.0", "id": "e-7", "type": "InventoryReserved", "subject": "o-7"},
        }
    )
    result = InvocationResult("req-7", payload={"batchItemFailures": [{"itemIdentifier": f} for f in failed]})
    return Invocation(
        "OrderStatusFunction",
        "sqs",
        "OrderStatusQueue",
        {"Records": [sqs_record(body, "m-7")]},
        result,
        failed,
    )


@pytest.mark.parametrize(
    ("report", "says"),
    [
        (RecordReport("applied", "confirmed", "e-7"), "InventoryReserved o-7  ok"),
        (
            RecordReport("ignored", "order CANCELLED", "e-7"),
            "InventoryReserved o-7  ignored (order CANCELLED)",
        ),
        (RecordReport("ignored", "duplicate", "e-7"), "ignored (duplicate)"),
    ],
)
def test_an_event_a_consumer_ignored_says_ignored_not_ok(report: RecordReport, says: str) -> None:
    console, _ = strict_console()

    (line,) = console.lines(consumer_invocation(), [report])

    assert says in line


def test_a_failed_line_carries_the_error_the_function_logged_for_that_message() -> None:
    console, _ = strict_console()
    report = RecordReport("failed", "OrderNotFound: no order with this id", "e-7", message_id="m-7")

    (line,) = console.lines(consumer_invocation(failed=("m-7",)), [report])

    assert "FAILED OrderNotFound: no order with this id (event e-7)" in line
    (without,) = console.lines(consumer_invocation(failed=("m-7",)), [])
    assert "FAILED, reported for retry (event e-7)" in without, "no log line for it: what the answer says"


def test_a_dead_lettered_message_prints_where_it_went_and_after_how_many_receives() -> None:
    console, _ = strict_console()
    (record,) = consumer_invocation().records
    moved = {
        "queue": "OrderStatusQueue",
        "deadLetterQueue": "local-OrderStatusDeadLetterQueue",
        "receiveCount": 5,
        "maxReceiveCount": 5,
        "record": record,
    }

    line = console.notice_line(
        Notice("error", "OrderStatusFunction.OrderStatusMessages", "dead-lettered", {DEAD_LETTERED: moved})
    )

    assert "OrderStatus" in line
    assert (
        "OrderStatusQueue  InventoryReserved o-7  dead-lettered → local-OrderStatusDeadLetterQueue "
        "after 5 receives (maxReceiveCount 5) (event e-7)" in line
    )


# --- the functions' reports, from their log lines ---------------------------------------------------------
def log_line(message: str, **fields: Any) -> str:
    return json.dumps({"level": "INFO", "message": message, "function_request_id": "req-7", **fields})


def test_reports_are_read_from_the_functions_own_log_lines() -> None:
    reports = FunctionReports()
    reports.on_log_line(
        "OrderStatusFunction", log_line("event applied", event_id="e-7", outcome="ignored:CANCELLED")
    )
    reports.on_log_line("OrderStatusFunction", log_line("duplicate event skipped", causation_id="e-8"))
    reports.on_log_line(
        "OrderStatusFunction",
        log_line(
            "message failed; it will be retried and then dead-lettered",
            message_id="m-9",
            event_id="e-9",
            error_type="KeyError",
            error="'x'",
        ),
    )
    reports.on_log_line(
        "OutboxRelayFunction",
        log_line(
            "poison outbox record", event_id="e-10", sequence_number="11", reason="envelope is not valid JSON"
        ),
    )
    reports.on_log_line(
        "OutboxRelayFunction",
        log_line("events published", event_ids=["e-13", "e-14"], correlation_ids=["c-1", "c-2"]),
    )
    reports.on_log_line("OutboxRelayFunction", log_line("stream poller noise", event_id="e-12"))

    assert reports.of("req-7") == [
        RecordReport("ignored", "order CANCELLED", "e-7"),
        RecordReport("ignored", "duplicate", "e-8"),
        RecordReport("failed", "KeyError: 'x'", "e-9", message_id="m-9"),
        RecordReport("parked", "envelope is not valid JSON", "e-10", sequence_number="11"),
        RecordReport("published", "", "e-13"),
        RecordReport("published", "", "e-14"),
    ]
    assert reports.reports("OrderStatusFunction")
    assert not reports.reports("InventoryFunction")


@pytest.mark.parametrize("poison", [p for p in CORPUS if p.postgres is not None], ids=lambda p: p.name)
def test_no_log_line_breaks_the_reports(poison: PoisonRecord) -> None:
    reports = FunctionReports()
    assert poison.postgres is not None
    for line in (
        poison.postgres,
        log_line("poison outbox record", event_id=poison.event_id, reason=poison.postgres),
        '{"message": "event applied", "function_request_id": "req-7", "outcome": ' + "9" * 5000 + "}",
        "[" * 100_000 + '"event applied"',
        "event applied \ud800 not json",
    ):
        reports.on_log_line("OutboxPublisherFunction", line)

    assert [(r.kind, r.event_id) for r in reports.of("req-7")] == [("parked", poison.event_id)]


def test_the_consoles_own_colours_stay_and_a_records_escape_sequences_do_not() -> None:
    raw = io.BytesIO()
    console = Console(io.TextIOWrapper(raw, encoding="utf-8", write_through=True), color=True)
    poison = next(p for p in CORPUS if p.name == "control-characters")
    parked = RecordReport(
        "parked", "envelope lacks required attributes", poison.event_id, sequence_number="1"
    )

    output = printed(console, raw, console.lines(relay_invocation([stream_record(poison, "1")]), [parked]))

    assert "\x1b[33mparked in the relay poison queue" in output, "the console's yellow"
    assert "\\x1b[2J\\x1b[31mOrderCreated" in output, "the record's own sequences, escaped"
    assert "\x1b[2J" not in output


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (InvocationResult("req-1", payload={"replayed": 3, "missing": []}), "replayed=3 missing=(list of 0)"),
        (
            InvocationResult("req-1", error=FunctionError("ValueError", "no such event")),
            "FAILED ValueError: no such event",
        ),
    ],
    ids=["returned", "failed"],
)
def test_an_invocation_through_the_invoke_api_prints_what_the_function_returned(
    result: InvocationResult, says: str
) -> None:
    console, raw = strict_console()
    invocation = Invocation("OrderStoreMaintenanceFunction", "direct", "Invoke API", {"replay": {}}, result)

    text = printed(console, raw, console.invocation_lines(invocation))

    assert "invoked by Invoke API" in text
    assert says in text


API_EVENT = {
    "httpMethod": "POST",
    "path": "/orders",
    "resource": "/orders",
    "headers": {},
    "multiValueHeaders": {},
    "requestContext": {"path": "/orders", "stage": "Prod", "requestId": "req-1"},
    "body": "{}",
    "isBase64Encoded": False,
}


def powertools_answer(location: str) -> dict[str, Any]:
    """What the Order API's resolver (Powertools' REST resolver) answers a created order with."""
    app = APIGatewayRestResolver()

    @app.post("/orders")
    def create() -> Response[Any]:
        return Response(201, content_types.APPLICATION_JSON, {"orderId": "o-1"}, {"Location": location})

    context: Any = LambdaContext()  # what Lambda gives the handler, as the unit tests' invocations have it
    return dict(app.resolve(API_EVENT, context))


@pytest.mark.parametrize(
    "answer",
    [
        powertools_answer("/orders/o-a50d"),  # multiValueHeaders alone
        {"statusCode": 201, "headers": {"location": "/orders/o-a50d"}, "body": "{}"},
        {
            "statusCode": 201,
            "headers": {"Location": "/x"},
            "multiValueHeaders": {"Location": ["/orders/o-a50d"]},
        },
    ],
    ids=["powertools", "headers", "both"],
)
def test_an_api_line_shows_the_location_the_answer_gives_in_either_header_map(answer: dict[str, Any]) -> None:
    console, raw = strict_console()
    invocation = Invocation(
        "OrdersApiFunction", "api", "POST /orders", API_EVENT, InvocationResult("r", payload=answer)
    )

    text = printed(console, raw, console.invocation_lines(invocation))

    assert "POST /orders 201 → /orders/o-a50d  " in text
