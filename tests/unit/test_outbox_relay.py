"""The outbox relay handler against moto EventBridge, with faults injected around the real client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest
from moto.events.models import EventPattern, EventPatternParser

import shop.aws
from local.template import Template
from tests.support import load_event
from tests.unit.fakes import FaultyEventBridge

RELAY = "OutboxRelayFunction"


@pytest.fixture
def faulty_bus(bus: Any, monkeypatch: pytest.MonkeyPatch) -> FaultyEventBridge:
    fake = FaultyEventBridge(boto3.client("events"))
    monkeypatch.setattr(shop.aws, "events", lambda: fake)
    return fake


def records(name: str) -> list[dict[str, Any]]:
    return list(load_event(name)["Records"])


def event_id(record: dict[str, Any]) -> str:
    return str(record["dynamodb"]["NewImage"]["eventId"]["S"])


def relay(invoke: Callable[..., Any], batch: list[dict[str, Any]]) -> list[str]:
    response = invoke(RELAY, {"Records": batch})
    return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]


def test_25_outbox_records_take_3_put_events_calls_and_all_arrive(faulty_bus, bus, invoke):
    batch = records("relay_outbox_insert_batch.json")

    failures = relay(invoke, batch)

    assert failures == []
    assert [len(call) for call in faulty_bus.calls] == [10, 10, 5]
    on_bus = bus()
    assert sorted(e["detail"]["id"] for e in on_bus) == sorted(event_id(r) for r in batch)
    first = next(e for e in on_bus if e["detail"]["id"] == event_id(batch[0]))
    assert first["source"] == "shop.orders"
    assert first["detail-type"] == "OrderCreated"
    assert first["detail"]["specversion"] == "1.0"


def test_a_permanent_failure_checkpoints_at_that_record_and_sends_nothing_later(faulty_bus, bus, invoke):
    batch = records("relay_outbox_insert_batch.json")
    seventh = batch[6]
    faulty_bus.fail_permanently = {event_id(seventh)}

    failures = relay(invoke, batch)

    # Lambda is told to resume at record 7; the chunk after the failing one was never sent
    assert failures == [seventh["dynamodb"]["SequenceNumber"]]
    assert len(faulty_bus.calls) == 1
    assert {event_id(r) for r in batch[10:]}.isdisjoint(faulty_bus.sent_ids())

    # When Lambda redelivers from the checkpoint and the entry now succeeds
    faulty_bus.fail_permanently = set()
    faulty_bus.calls.clear()
    assert relay(invoke, batch[6:]) == []

    # Then records 1-6 were never sent again and every event is on the bus
    assert {event_id(r) for r in batch[:6]}.isdisjoint(faulty_bus.sent_ids())
    on_bus = [e["detail"]["id"] for e in bus()]
    assert set(on_bus) == {event_id(r) for r in batch}
    assert all(on_bus.count(event_id(r)) == 1 for r in batch[:6])


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


def test_a_poison_record_is_reported_and_the_records_before_it_published(faulty_bus, bus, invoke):
    batch = records("relay_poison_record.json")

    failures = relay(invoke, batch)

    assert failures == [batch[2]["dynamodb"]["SequenceNumber"]]
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch[:2])
    # Once bisection has isolated the poison (it goes to the OnFailure queue), the rest flows
    assert relay(invoke, batch[2:3]) == [batch[2]["dynamodb"]["SequenceNumber"]]
    assert relay(invoke, batch[3:]) == []
    assert sorted(e["detail"]["id"] for e in bus()) == sorted(event_id(r) for r in batch[3:])


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
