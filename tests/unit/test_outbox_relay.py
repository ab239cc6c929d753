"""The outbox relay handler against moto EventBridge, with faults injected around the real client."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ReadTimeoutError
from moto.events.models import EventPattern, EventPatternParser

import shop.adapters.aws
import shop.runtime.wiring.relay
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import outbox_item
from shop.adapters.eventbridge import EventPublisher
from shop.domain.envelope import CloudEvent
from shop.runtime.config import Settings
from tests.support import LambdaContext, load_event
from tests.support.output import logged_with, metric_values
from tests.unit.fakes import FaultyEventBridge
from tools.template import Template

RELAY = "OutboxRelayFunction"
STREAM_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/local-OrdersTable/stream/2026-11-21T00:00:00.000"


@pytest.fixture
def faulty_bus(bus: Any, monkeypatch: pytest.MonkeyPatch) -> FaultyEventBridge:
    fake = FaultyEventBridge(boto3.client("events"))
    monkeypatch.setattr(shop.adapters.aws, "events", lambda: fake)
    return fake


def records(name: str) -> list[dict[str, Any]]:
    return list(load_event(name)["Records"])


def outbox_stream_records(
    n: int, trace_header: str | None = None, events_per_order: int = 1
) -> list[dict[str, Any]]:
    """n stream records of outbox items of n // events_per_order orders, each order's events one after
    the other (OrderCreated, then OrderNoted), built by the writers' own code."""
    out = []
    for i in range(n):
        order, sequence = divmod(i, events_per_order)
        event = CloudEvent.new(
            source="shop.orders",
            type="OrderCreated" if sequence == 0 else "OrderNoted",
            subject=f"o-{order:032x}",
            sequence=sequence + 1,
            data={"orderId": f"o-{order:032x}"},
            correlation_id=f"corr-{i}",
        )
        image = outbox_item(
            event,
            keys.order_partition(event.subject),
            ttl_days=16,
            time_shards=8,
            max_event_bytes=262_144,
            trace_header=trace_header,
        )
        out.append(
            {
                "eventID": f"e{i}",
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "awsRegion": "us-east-1",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1795348800 + i,
                    "Keys": {keys.PK: image[keys.PK], keys.SK: image[keys.SK]},
                    "NewImage": image,
                    "SequenceNumber": str(100000000000000000000 + i),
                    "SizeBytes": 1000,
                    "StreamViewType": "NEW_IMAGE",
                },
                "eventSourceARN": STREAM_ARN,
            }
        )
    return out


def event_id(record: dict[str, Any]) -> str:
    """The event id of an outbox record: the end of its item's sort key (items of the sample events, written
    by earlier code, also carry it as `eventId`)."""
    event_id = keys.outbox_event_id(record["dynamodb"]["NewImage"][keys.SK]["S"])
    assert event_id is not None
    return event_id


def relay(invoke: Callable[..., Any], batch: list[dict[str, Any]]) -> list[str]:
    response = invoke(RELAY, {"Records": batch})
    return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def test_25_outbox_records_take_3_put_events_calls_and_all_arrive(faulty_bus, bus, invoke):
    batch = records("relay_outbox_insert_batch.json")

    failures = relay(invoke, batch)

    assert failures == []
    assert sorted(len(call) for call in faulty_bus.calls) == [5, 10, 10]  # in flight together: any order
    on_bus = bus()
    assert sorted(e["detail"]["id"] for e in on_bus) == sorted(event_id(r) for r in batch)
    first = next(e for e in on_bus if e["detail"]["id"] == event_id(batch[0]))
    assert first["source"] == "shop.orders"
    assert first["detail-type"] == "OrderCreated"
    assert first["detail"]["specversion"] == "1.0"


def test_the_writers_trace_header_travels_with_its_event_to_the_bus(faulty_bus, bus, invoke):
    trace = "Root=1-6740a1b0-0123456789abcdef01234567;Parent=0123456789abcdef;Sampled=1"
    traced, untraced = outbox_stream_records(1, trace_header=trace)[0], outbox_stream_records(2)[1]

    assert relay(invoke, [traced, untraced]) == []

    assert [entry.get("TraceHeader") for entry in faulty_bus.entries] == [trace, None]


@pytest.fixture
def calls_in_flight(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The relay's publisher with `request.param` PutEvents calls in flight at once (1: one at a time)."""
    in_flight = int(request.param)

    def publisher(settings: Settings) -> EventPublisher:
        return EventPublisher(settings.event_bus_name, settings.max_event_bytes, max_in_flight=in_flight)

    monkeypatch.setattr(shop.runtime.wiring.relay, "event_publisher", publisher)
    return in_flight


@pytest.mark.parametrize("calls_in_flight", [1, 16], indirect=True)
def test_a_permanent_failure_checkpoints_at_that_record_and_never_resends_what_precedes_it(
    faulty_bus, bus, invoke, calls_in_flight
):
    batch = records("relay_outbox_insert_batch.json")  # 25 orders' events: calls of 10, 10 and 5
    seventh = batch[6]
    faulty_bus.fail_permanently = {event_id(seventh)}

    failures = relay(invoke, batch)

    # Lambda is told to resume at record 7
    assert failures == [seventh["dynamodb"]["SequenceNumber"]]
    first_delivery = [e["detail"]["id"] for e in bus()]
    if calls_in_flight == 1:  # one call at a time: the chunks after the failing one were never sent
        assert len(faulty_bus.calls) == 1
        assert {event_id(r) for r in batch[10:]}.isdisjoint(faulty_bus.sent_ids())
    else:  # the later chunks were in flight beside it: on the bus, past the checkpoint
        assert len(faulty_bus.calls) == 3
        assert {event_id(r) for r in batch[10:]} <= set(first_delivery)

    # When Lambda redelivers from the checkpoint and the entry now succeeds
    faulty_bus.fail_permanently = set()
    faulty_bus.calls.clear()
    assert relay(invoke, batch[6:]) == []

    # Then records 1-6 were never sent again, every event is on the bus, and only events past the
    # checkpoint that were in flight at the failure are there twice (consumers absorb repeats)
    assert {event_id(r) for r in batch[:6]}.isdisjoint(faulty_bus.sent_ids())
    on_bus = first_delivery + [e["detail"]["id"] for e in bus()]
    assert set(on_bus) == {event_id(r) for r in batch}
    assert all(on_bus.count(event_id(r)) == 1 for r in batch[:6])
    # (records 8-10 went in record 7's call; with calls in flight, records 11-25 went too)
    assert len(on_bus) - len(batch) == (3 if calls_in_flight == 1 else 18)


def test_throttled_calls_and_entries_are_retried_within_the_invocation(faulty_bus, bus, invoke):
    batch = records("relay_outbox_insert_batch.json")
    faulty_bus.throttle_calls = 2
    faulty_bus.throttle_entries = {event_id(batch[3]): 1, event_id(batch[14]): 2}

    failures = relay(invoke, batch)

    assert failures == []
    on_bus = [e["detail"]["id"] for e in bus()]
    assert sorted(on_bus) == sorted(event_id(r) for r in batch)  # each exactly once


def test_foreign_modify_and_remove_records_cause_no_publish_and_no_failure(faulty_bus, bus, invoke):
    batch = records("relay_mixed_batch.json")
    outbox_inserts = [
        r
        for r in batch
        if r["eventName"] == "INSERT" and r["dynamodb"]["NewImage"]["SK"]["S"].startswith("OUTBOX#")
    ]

    failures = relay(invoke, batch)

    assert failures == []
    assert len(outbox_inserts) == 2
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in outbox_inserts)


def test_a_poison_record_is_parked_whole_and_every_other_record_published(
    faulty_bus, bus, poison_queue, invoke
):
    batch = records("relay_poison_record.json")
    poison = batch[2]

    failures = relay(invoke, batch)

    # Nothing for Lambda to retry or bisect: the shard moves on at once
    assert failures == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch if r is not poison)
    [parked] = poison_queue()
    assert parked["kind"] == "outbox-poison"
    assert parked["eventId"] == event_id(poison)
    assert parked["sequenceNumber"] == poison["dynamodb"]["SequenceNumber"]
    assert parked["streamArn"] == poison["eventSourceARN"]
    assert parked["item"] == poison["dynamodb"]["NewImage"]  # everything needed to republish it
    assert "JSON" in parked["reason"]


def test_one_poison_in_a_full_batch_of_100_parks_it_and_publishes_the_99(
    faulty_bus, bus, poison_queue, invoke
):
    batch = outbox_stream_records(100)
    batch[2]["dynamodb"]["NewImage"]["envelope"] = {"S": '{"specversion": "1.0", "id": "trunc'}

    failures = relay(invoke, batch)

    assert failures == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(
        event_id(r) for i, r in enumerate(batch) if i != 2
    )
    assert [p["eventId"] for p in poison_queue()] == [event_id(batch[2])]
    # The 2 events before the poison go out before it is parked, the 97 after it only then: 1 + 10 calls
    # (those 10 in flight together, so they may arrive in any order)
    assert len(faulty_bus.calls[0]) == 2
    assert sorted(len(call) for call in faulty_bus.calls[1:]) == [7] + [10] * 9


def test_a_poison_record_after_the_checkpoint_is_parked_only_when_redelivered(
    faulty_bus, bus, poison_queue, invoke
):
    batch = outbox_stream_records(30)
    batch[20]["dynamodb"]["NewImage"]["envelope"] = {"S": "not json"}
    faulty_bus.fail_permanently = {event_id(batch[5])}

    failures = relay(invoke, batch)

    # The transient failure at record 6 holds the shard there; the poison behind it waits too
    assert failures == [batch[5]["dynamodb"]["SequenceNumber"]]
    assert poison_queue() == []

    faulty_bus.fail_permanently = set()
    assert relay(invoke, batch[5:]) == []
    assert [p["eventId"] for p in poison_queue()] == [event_id(batch[20])]


def relay_with(invoke: Callable[..., Any], batch: list[dict[str, Any]], seconds_left: float) -> list[str]:
    """The relay invoked with `seconds_left` before Lambda times it out."""
    response = invoke(RELAY, {"Records": batch}, context=LambdaContext(RELAY, timeout_seconds=seconds_left))
    return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def test_a_poison_record_met_too_close_to_the_timeout_waits_for_the_next_invocation(
    faulty_bus, bus, poison_queue, invoke
):
    """The poison queue's call may take 24 s at worst (3 attempts of 2 s connect + 5 s read, backoff): begun
    later, it could outlast the invocation, and Lambda would retry the whole batch (bisected), the
    records published before it again. The relay answers instead, its checkpoint at the poison."""
    batch = records("relay_poison_record.json")
    poison = batch[2]

    assert relay_with(invoke, batch, seconds_left=20) == [poison["dynamodb"]["SequenceNumber"]]
    assert poison_queue() == []
    assert {e["detail"]["id"] for e in bus()} == {event_id(r) for r in batch[:2]}

    assert relay_with(invoke, batch[2:], seconds_left=30) == []  # the next invocation starts with it
    assert [p["eventId"] for p in poison_queue()] == [event_id(poison)]


def test_no_put_events_call_is_begun_unless_its_answer_can_come_before_the_timeout(faulty_bus, bus, invoke):
    """A PutEvents call may take 7 s at worst (one attempt: 2 s connect + 5 s read): a chunk's first call
    too is begun only with that and a second more left. Begun anyway, its answer could come after Lambda
    timed the relay out, which then retries the whole batch (bisected), what was published included."""
    batch = records("relay_outbox_insert_batch.json")[:5]

    assert relay_with(invoke, batch, seconds_left=7.9) == [batch[0]["dynamodb"]["SequenceNumber"]]
    assert faulty_bus.calls == []  # left unsent: the checkpoint covers it

    assert relay_with(invoke, batch, seconds_left=8.5) == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch)


@pytest.fixture
def longest_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay's publisher backs off as long as its jitter allows, without sleeping through the delays."""

    def without_sleeping(settings: Settings) -> EventPublisher:
        return EventPublisher(
            settings.event_bus_name, settings.max_event_bytes, sleep=lambda _: None, jitter=lambda: 1.0
        )

    monkeypatch.setattr(shop.runtime.wiring.relay, "event_publisher", without_sleeping)


def test_a_throttled_call_is_retried_only_while_its_answer_can_come_before_the_timeout(
    faulty_bus, bus, invoke, longest_backoff
):
    """The first retry waits 0.1 s (0.05 s doubled, full jitter at its most): with 8.1 s left, its call could
    not be answered with a second to spare, so it is not begun and the relay answers with its checkpoint."""
    batch = records("relay_outbox_insert_batch.json")[:5]
    faulty_bus.throttle_entries = {event_id(batch[0]): 1}

    assert relay_with(invoke, batch, seconds_left=8.1) == [batch[0]["dynamodb"]["SequenceNumber"]]
    assert len(faulty_bus.calls) == 1  # not retried

    faulty_bus.throttle_entries = {event_id(batch[0]): 1}
    assert relay_with(invoke, batch, seconds_left=9) == []
    assert len(faulty_bus.calls) == 3  # throttled, then retried


@pytest.mark.parametrize(
    ("client", "attempts", "operation", "request_parameters"),
    [
        (
            "events",
            shop.adapters.aws.PUT_EVENTS_ATTEMPTS,
            "put_events",
            {"Entries": [{"Source": "s", "DetailType": "d", "Detail": "{}"}]},
        ),
        (
            "sqs",
            shop.adapters.aws.SDK_ATTEMPTS,
            "send_message",
            {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/1/q", "MessageBody": "x"},
        ),
    ],
)
def test_a_call_that_never_answers_is_attempted_as_often_as_the_relays_time_budget_counts(
    fake_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    client: str,
    attempts: int,
    operation: str,
    request_parameters: dict[str, Any],
):
    """The budget (longest_call_seconds: 7 s a PutEvents call, 24 s a poison queue call) counts 1 and 3
    attempts in standard mode. botocore's `max_attempts` counts retries and a merged Config replaced the
    retries whole: the clients made 2 attempts in legacy mode and 4, and a relay answered after 31.9 s
    of a 30 s invocation against an endpoint that never answered (a review's measurement)."""
    shop.adapters.aws.reset_clients()
    made = getattr(shop.adapters.aws, client)()
    assert made.meta.config.retries == {"mode": "standard", "total_max_attempts": attempts}

    sent: list[str] = []
    waited: list[float] = []

    def never_answered(request: Any, **_: Any) -> None:
        sent.append(request.url)
        raise ReadTimeoutError(endpoint_url=request.url)

    made.meta.events.register("before-send", never_answered)
    # the backoff botocore sleeps before each retry, recorded rather than slept (time.sleep, for this test)
    monkeypatch.setattr("botocore.endpoint.time.sleep", waited.append)
    with pytest.raises(ReadTimeoutError):
        getattr(made, operation)(**request_parameters)
    shop.adapters.aws.reset_clients()

    assert len(sent) == attempts
    # each attempt its timeouts (a read timeout is the last of them), the backoff before each retry
    worst = attempts * (shop.adapters.aws.CONNECT_TIMEOUT_SECONDS + shop.adapters.aws.READ_TIMEOUT_SECONDS)
    assert worst + sum(waited) <= shop.adapters.aws.longest_call_seconds(attempts)


def test_when_the_poison_queue_fails_the_relay_checkpoints_at_the_poison(faulty_bus, bus, aws, invoke):
    batch = records("relay_poison_record.json")  # no poison queue exists: SendMessage fails

    failures = relay(invoke, batch)

    assert failures == [batch[2]["dynamodb"]["SequenceNumber"]]
    assert {e["detail"]["id"] for e in bus()} >= {event_id(r) for r in batch[:2]}


def test_a_naive_timestamp_is_poison_before_publishing_not_an_error_after_it(
    faulty_bus, bus, poison_queue, invoke
):
    batch = outbox_stream_records(3)
    image = batch[1]["dynamodb"]["NewImage"]
    envelope = json.loads(image["envelope"]["S"])
    envelope["time"] = "2026-11-21T10:00:00"  # no offset: RFC 3339 requires one
    image["envelope"] = {"S": json.dumps(envelope)}

    failures = relay(invoke, batch)

    assert failures == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([event_id(batch[0]), event_id(batch[2])])
    [parked] = poison_queue()
    assert "offset" in parked["reason"]


def test_an_event_whose_source_eventbridge_reserves_for_aws_is_parked_and_the_rest_published(
    faulty_bus, bus, poison_queue, invoke
):
    """EventBridge's event structure: "Customer-generated events can have any value here, as long as it
    doesn't begin with aws.". No retry or permission makes such an event publishable, so it is poison;
    sent, its refusal held the shard as a failure of the account's configuration until its age limit."""
    batch = outbox_stream_records(3)
    envelope = json.loads(batch[1]["dynamodb"]["NewImage"]["envelope"]["S"])
    poison_envelope(batch[1], json.dumps({**envelope, "source": "aws.orders"}))

    assert relay(invoke, batch) == []

    assert event_id(batch[1]) not in faulty_bus.sent_ids()
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([event_id(batch[0]), event_id(batch[2])])
    [parked] = poison_queue()
    assert (parked["eventId"], parked["details"]) == (event_id(batch[1]), {"source": "aws.orders"})


def test_a_stored_trace_header_longer_than_put_events_takes_is_left_out_and_the_event_published(
    faulty_bus, bus, poison_queue, invoke
):
    """PutEvents' TraceHeader holds at most 500 characters, and a longer one fails the whole call (every
    entry in it), on every retry: the shard held. Tracing is best effort: the event goes without it."""
    batch = outbox_stream_records(
        3, trace_header="Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8"
    )
    batch[1]["dynamodb"]["NewImage"]["traceHeader"] = {
        "S": "Root=1-5759e988-bd862e3fe1be46a994272793;" + "x" * 500
    }

    assert relay(invoke, batch) == []

    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch)
    # It went with its envelope's traceparent instead: the same trace as its neighbours'
    assert len({entry["TraceHeader"] for entry in faulty_bus.entries}) == 1
    assert len(faulty_bus.entries[1]["TraceHeader"]) <= 500
    assert poison_queue() == []


def test_an_entry_eventbridge_rejects_for_what_it_is_is_parked_and_the_rest_published(
    faulty_bus, bus, poison_queue, invoke
):
    batch = records("relay_outbox_insert_batch.json")
    faulty_bus.reject = {event_id(batch[4])}  # MalformedDetail: no retry or permission fixes it

    failures = relay(invoke, batch)

    assert failures == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch if r is not batch[4])
    [parked] = poison_queue()
    assert parked["eventId"] == event_id(batch[4])
    assert parked["reason"] == "EventBridge rejected the entry: MalformedDetail"
    assert parked["item"] == batch[4]["dynamodb"]["NewImage"]


def test_with_two_failed_entries_in_one_call_the_checkpoint_is_the_first(faulty_bus, bus, invoke):
    batch = records("relay_outbox_insert_batch.json")
    faulty_bus.fail_permanently = {event_id(batch[3]), event_id(batch[7])}

    failures = relay(invoke, batch)

    # Lambda resumes at the lowest failed record, so record 4 (not 8) is the one to report
    assert failures == [batch[3]["dynamodb"]["SequenceNumber"]]


def test_an_update_or_removal_of_an_outbox_item_is_never_published(faulty_bus, bus, invoke):
    inserted, modified, removed = outbox_stream_records(3)
    modified["eventName"] = "MODIFY"
    removed["eventName"] = "REMOVE"

    failures = relay(invoke, [inserted, modified, removed])

    assert failures == []
    assert [e["detail"]["id"] for e in bus()] == [event_id(inserted)]


def test_an_aggregates_later_event_is_never_sent_before_its_failed_predecessor(faulty_bus, bus, invoke):
    batch = records("relay_mixed_batch.json")
    created, cancelled = (
        r
        for r in batch
        if r["eventName"] == "INSERT" and r["dynamodb"]["NewImage"]["SK"]["S"].startswith("OUTBOX#")
    )
    faulty_bus.fail_permanently = {event_id(created)}

    failures = relay(invoke, batch)

    assert failures == [created["dynamodb"]["SequenceNumber"]]
    assert event_id(cancelled) not in faulty_bus.sent_ids()
    assert bus() == []


def test_a_failure_is_logged_with_the_event_that_failed_and_the_checkpoint_may_lie_before_it(
    faulty_bus, bus, invoke, caplog
):
    """Ten orders' two events one after the other: every order's first goes in one call, every second in
    the next, which waits for the first. The sixth order's first event fails for good: nothing of the
    second call is sent, so the checkpoint is the first order's second event (record 2), and the log
    names the event that failed, not the one the checkpoint stands at."""
    batch = outbox_stream_records(20, events_per_order=2)
    failing = batch[10]
    faulty_bus.fail_permanently = {event_id(failing)}

    failures = relay(invoke, batch)

    assert failures == [batch[1]["dynamodb"]["SequenceNumber"]]
    assert len(faulty_bus.calls) == 1
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(
        event_id(r) for r in batch[0:20:2] if r is not failing
    )
    (line,) = logged_with(caplog, "publish failed; checkpointing")
    assert line["event_id"] == event_id(failing)
    assert line["sequence_number"] == batch[1]["dynamodb"]["SequenceNumber"]


def test_filter_criteria_admit_only_outbox_inserts(template: Template):
    event = template.function(RELAY).events["OrdersOutbox"]["Properties"]
    patterns = [
        EventPattern(f["Pattern"], EventPatternParser(f["Pattern"]).parse())
        for f in event["FilterCriteria"]["Filters"]
    ]
    admitted = [
        r["eventName"]
        for r in records("relay_mixed_batch.json")
        if any(p.matches_event(r) for p in patterns)  # type: ignore[arg-type]
    ]
    insert_batch = records("relay_outbox_insert_batch.json")

    assert admitted == ["INSERT", "INSERT"]
    assert all(any(p.matches_event(r) for p in patterns) for r in insert_batch)  # type: ignore[arg-type]


def poison_envelope(record: dict[str, Any], envelope: str) -> dict[str, Any]:
    record["dynamodb"]["NewImage"]["envelope"] = {"S": envelope}
    return record


@pytest.mark.parametrize(
    "envelope",
    [
        pytest.param("[" * 100_000, id="nested-past-the-recursion-limit"),
        pytest.param('{"specversion": "1.0", "n": ' + "7" * 5_000 + "}", id="integer-past-the-digit-limit"),
        pytest.param(
            '{"specversion":"1.0","id":"e","source":"shop.\\ud800","type":"OrderCreated","subject":"o",'
            '"time":"2026-11-21T10:00:00.000Z","sequence":1,"correlationid":"c","data":{}}',
            id="lone-surrogate-escape",
        ),
    ],
)
def test_every_envelope_that_fails_to_decode_is_parked_not_an_invocation_error(
    faulty_bus, bus, poison_queue, invoke, envelope
):
    batch = outbox_stream_records(3)
    poison_envelope(batch[1], envelope)

    failures = relay(invoke, batch)

    # Parked like any poison: no function error, so no bisection, no 23 h of retries, no neighbour in a DLQ
    assert failures == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted([event_id(batch[0]), event_id(batch[2])])
    assert [p["eventId"] for p in poison_queue()] == [event_id(batch[1])]


def test_a_poison_record_whose_details_are_larger_than_a_message_is_parked_and_the_shard_moves_on(
    faulty_bus, bus, poison_queue, invoke
):
    """An invalid time of 388 KB (a lone surrogate, then emoji: 12 bytes each in an escaped message): the
    message without its item still held the time, SQS refused it, and the relay checkpointed at the record
    on every retry until it was 23 h old and took its neighbours to the DLQ."""
    batch = outbox_stream_records(5)
    raw = json.loads(batch[2]["dynamodb"]["NewImage"]["envelope"]["S"])
    poison_envelope(
        batch[2], json.dumps({**raw, "time": "\ud800" + "\U0001f600" * 97_000}, ensure_ascii=False)
    )

    assert relay(invoke, batch) == []

    assert sorted(e["detail"]["id"] for e in bus()) == sorted(
        event_id(r) for i, r in enumerate(batch) if i != 2
    )
    [parked] = poison_queue()
    assert parked["key"] == keys.item_key(batch[2]["dynamodb"]["NewImage"])  # redrive reads it from the table
    assert parked["details"]["time"].endswith("... (96001 more characters cut)")


def test_while_the_poison_queue_is_down_no_retry_sends_anything_twice(faulty_bus, bus, invoke, template):
    batch = outbox_stream_records(9)
    poison_envelope(batch[3], "not json")  # no poison queue exists yet: SendMessage fails

    # Lambda retries from the reported checkpoint, again and again while the queue is down
    checkpoints = [relay(invoke, batch)] + [relay(invoke, batch[3:]) for _ in range(3)]

    assert checkpoints == [[batch[3]["dynamodb"]["SequenceNumber"]]] * 4
    # The three events before the poison went out once; nothing after it was sent before it is parked
    assert faulty_bus.sent_ids() == [event_id(r) for r in batch[:3]]

    # When the queue is back, the poison is parked and the rest published, each once
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=template.physical_name("RelayPoisonQueue"))["QueueUrl"]
    assert relay(invoke, batch[3:]) == []
    on_bus = [e["detail"]["id"] for e in bus()]
    assert sorted(on_bus) == sorted(event_id(r) for i, r in enumerate(batch) if i != 3)
    parked = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    assert [json.loads(m["Body"])["eventId"] for m in parked] == [event_id(batch[3])]


@pytest.mark.parametrize("calls_in_flight", [1, 16], indirect=True)
def test_an_entry_the_bus_rejects_that_cannot_be_parked_is_the_checkpoint(
    faulty_bus, bus, invoke, calls_in_flight
):
    batch = records("relay_outbox_insert_batch.json")  # 25 records: calls of 10, 10 and 5
    faulty_bus.reject = {event_id(batch[4])}  # and no poison queue: it cannot be parked

    failures = relay(invoke, batch)

    assert failures == [batch[4]["dynamodb"]["SequenceNumber"]]
    if calls_in_flight == 1:
        # Only its own call went out (its chunk-mates after it are the one unavoidable repeat on retry)
        assert len(faulty_bus.calls) == 1
        assert {event_id(r) for r in batch[10:]}.isdisjoint(faulty_bus.sent_ids())
    else:
        assert len(faulty_bus.calls) == 3  # the chunks in flight beside it; none sent after it was known
    assert event_id(batch[4]) not in {e["detail"]["id"] for e in bus()}


@pytest.fixture
def unhurried_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay's publisher backs off as configured, without sleeping through the delays."""

    def without_sleeping(settings: Settings) -> EventPublisher:
        return EventPublisher(settings.event_bus_name, settings.max_event_bytes, sleep=lambda seconds: None)

    monkeypatch.setattr(shop.runtime.wiring.relay, "event_publisher", without_sleeping)


def test_throttling_that_outlasts_the_retries_checkpoints_at_the_first_throttled_entry_and_parks_nothing(
    faulty_bus, bus, poison_queue, invoke, unhurried_backoff
):
    batch = records("relay_outbox_insert_batch.json")
    faulty_bus.throttle_entries = {event_id(batch[13]): 1_000, event_id(batch[16]): 1_000}

    failures = relay(invoke, batch)

    assert failures == [batch[13]["dynamodb"]["SequenceNumber"]]
    assert poison_queue() == []  # throttling is transient: never poison
    on_bus = {e["detail"]["id"] for e in bus()}
    assert event_id(batch[12]) in on_bus
    assert {event_id(r) for r in batch[20:]}.isdisjoint(faulty_bus.sent_ids())  # nothing after its call
    assert len(faulty_bus.calls) == 2 + 5  # the first two calls, then the 5 retries of 6 attempts


def test_calls_throttled_for_the_rest_of_the_invocation_checkpoint_at_the_first_record_not_on_the_bus(
    faulty_bus, bus, poison_queue, invoke, unhurried_backoff, capsys
):
    batch = records("relay_outbox_insert_batch.json")  # 25 records: calls of 10, 10 and 5
    faulty_bus.raise_on_every_call, faulty_bus.calls_before_raising = "ThrottlingException", 1

    failures = relay(invoke, batch)

    # Lambda resumes at record 11, the first of the throttled call; the 10 before it are published once
    assert failures[0] == batch[10]["dynamodb"]["SequenceNumber"]
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch[:10])
    assert metric_values(capsys.readouterr().out, "EventsPublished") == [10]
    assert poison_queue() == []  # throttling is transient: never poison
    # The throttled call was retried whole until the attempts ran out; the chunk after it never sent
    assert faulty_bus.calls[1:] == [[event_id(r) for r in batch[10:20]]] * 6
