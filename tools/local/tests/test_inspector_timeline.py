"""The inspector's timeline builder (inspector/timeline.py): one order's hops from the activity log."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tools.local.console.activity import Invocation
from tools.local.console.reports import RecordReport
from tools.local.inspector.timeline import (
    EventKeys,
    Hop,
    HopCache,
    build_hops,
    order_timeline,
    outbox_row_hop,
    report_notice,
)
from tools.local.runtime.functions import FunctionError
from tools.local.tests.saga_entries import (
    CONFIRMED_SAGA_HOPS,
    T0,
    api_request,
    confirmed_saga,
    consumer,
    envelope,
    message,
    notification,
    outbox_record,
    relay,
    result,
    trace_header,
    traced_saga,
    traceparent,
)

SAGA = CONFIRMED_SAGA_HOPS


def shape(hops: list[Hop]) -> list[tuple[str, str | None]]:
    return [(hop.function, hop.keys.event_type) for hop in hops]


def test_an_orders_hops_are_every_hop_of_its_saga_in_order_and_none_of_another_order() -> None:
    entries = confirmed_saga("o-1", "corr-1")
    other = confirmed_saga("o-2", "corr-2")
    interleaved = [entry for pair in zip(entries, other, strict=True) for entry in pair]

    timeline = order_timeline(build_hops(interleaved), "o-1")

    assert shape(timeline) == SAGA
    assert {hop.keys.correlation_id for hop in timeline} == {"corr-1"}
    assert [hop.outcome for hop in timeline] == ["ok"] * len(SAGA)
    assert [hop.retries for hop in timeline] == [0] * len(SAGA)
    api = timeline[0]
    assert (api.detail, api.keys.order_id, api.duration_ms) == ("POST /orders 201", "o-1", 50)
    assert api.started_at == T0


def test_start_times_come_from_the_runtime_and_order_the_hops_whatever_order_they_were_recorded_in() -> None:
    entries = confirmed_saga("o-1", "corr-1")

    timeline = order_timeline(build_hops(list(reversed(entries))), "o-1")

    assert shape(timeline) == SAGA
    starts = [hop.started_at for hop in timeline]
    assert starts == sorted(starts)
    assert starts[1] - starts[0] == pytest.approx(0.10)


def test_without_the_runtimes_start_a_hop_starts_its_duration_before_it_was_recorded() -> None:
    entry = api_request("o-1", "corr-1", 0.0)
    unknown_start = replace(entry, result=replace(entry.result, started_at=0.0), at=T0 + 5)

    (hop,) = build_hops([unknown_start])

    assert hop.started_at == pytest.approx(T0 + 5 - 0.050)


def test_the_publication_is_a_child_of_the_notification_invocation_indented_under_it() -> None:
    timeline = order_timeline(build_hops(confirmed_saga("o-1", "corr-1")), "o-1")

    notification, published = timeline[-2], timeline[-1]
    assert published.parent == notification.id
    assert (notification.depth, published.depth) == (0, 1)
    assert published.keys.correlation_id == "corr-1"  # it carries none itself: its parent's


def test_a_child_follows_its_parent_even_when_other_hops_started_in_between() -> None:
    # Trace context (W3C traceparent) will give hops parents; the waterfall lists a span's children
    # under it, as trace viewers do, and draws each bar from its own start.
    keys = EventKeys(order_id="o-1")
    root = Hop("root", "A", "api", "r", T0, 500, "ok", keys)
    sibling = Hop("sibling", "B", "sqs", "q", T0 + 0.1, 10, "ok", keys)
    child = Hop("child", "C", "sqs", "q", T0 + 0.2, 10, "ok", keys, parent="root")
    grandchild = Hop("grandchild", "D", "sqs", "q", T0 + 0.3, 10, "ok", keys, parent="child")
    orphan = Hop("orphan", "E", "sqs", "q", T0 + 0.4, 10, "ok", keys, parent="not-in-this-timeline")

    timeline = order_timeline([orphan, grandchild, sibling, child, root], "o-1")

    assert [(hop.id, hop.depth) for hop in timeline] == [
        ("root", 0),
        ("child", 1),
        ("grandchild", 2),
        ("sibling", 0),
        ("orphan", 0),
    ]


def test_hops_whose_parents_form_a_cycle_are_each_shown_once() -> None:
    keys = EventKeys(order_id="o-1")
    a = Hop("a", "A", "sqs", "q", T0, 1, "ok", keys, parent="b")
    b = Hop("b", "B", "sqs", "q", T0 + 1, 1, "ok", keys, parent="a")

    assert sorted(hop.id for hop in order_timeline([a, b], "o-1")) == ["a", "b"]


def test_a_retried_stream_batch_counts_attempts_and_a_redelivered_message_its_receive_count() -> None:
    created = envelope("OrderCreated", "o-1", "corr-1")
    failure = FunctionError("RuntimeError", "boom")
    entries = [
        api_request("o-1", "corr-1", 0.0),
        relay([outbox_record(created, "100")], 0.1, failed=("100",)),
        relay([outbox_record(created, "100")], 0.3),
        consumer("InventoryFunction", "InventoryQueue", [message(created)], 0.4, error=failure),
        consumer("InventoryFunction", "InventoryQueue", [message(created, receive_count=2)], 1.5),
    ]

    timeline = order_timeline(build_hops(entries), "o-1")

    assert [(h.function, h.outcome, h.retries) for h in timeline] == [
        ("OrdersApiFunction", "ok", 0),
        ("OutboxRelayFunction", "failed", 0),
        ("OutboxRelayFunction", "ok", 1),
        ("InventoryFunction", "failed", 0),
        ("InventoryFunction", "ok", 1),
    ]
    assert timeline[1].error == "reported as failed (batchItemFailures): retried"
    assert timeline[3].error == "RuntimeError: boom"


def test_a_batch_is_one_hop_per_record_each_on_its_own_orders_timeline() -> None:
    first, second = envelope("OrderCreated", "o-1", "c1"), envelope("OrderCreated", "o-2", "c2")

    hops = build_hops([relay([outbox_record(first, "1"), outbox_record(second, "2")], 0.0)])

    assert [(h.keys.order_id, h.batch_size) for h in hops] == [("o-1", 2), ("o-2", 2)]
    assert [h.keys.event_id for h in order_timeline(hops, "o-2")] == [second["id"]]


def test_a_poison_record_is_on_its_orders_timeline_by_its_key_and_parked_when_the_queue_holds_it() -> None:
    event = envelope("OrderCreated", "o-1", "corr-1")
    record = outbox_record(event, "100", raw_envelope="{not json")

    unparked = order_timeline(build_hops([relay([record], 0.0)]), "o-1")
    parked = order_timeline(build_hops([relay([record], 0.0)], parked=frozenset({event["id"]})), "o-1")

    # The envelope unreadable, the item's keys still say which event (its sort key) of which order
    # (its partition key); its type is in the envelope only.
    assert [(h.keys.event_id, h.keys.event_type, h.outcome) for h in unparked] == [(event["id"], None, "ok")]
    assert [(h.outcome, h.error) for h in parked] == [("parked", "parked in the relay poison queue")]


def test_a_poison_record_written_by_earlier_code_is_named_by_its_attributes() -> None:
    event = envelope("OrderCreated", "o-1", "corr-1")
    record = outbox_record(event, "100", raw_envelope="{not json", written_by_earlier_code=True)

    timeline = order_timeline(build_hops([relay([record], 0.0)]), "o-1")

    assert [(h.keys.event_id, h.keys.event_type, h.outcome) for h in timeline] == [
        (event["id"], "OrderCreated", "ok")
    ]


def test_a_request_with_no_order_joins_the_timeline_by_its_correlation_id() -> None:
    entries = [*confirmed_saga("o-1", "corr-1"), api_request("", "corr-1", 2.0, status=400)]
    failed_api = api_request("", "corr-other", 3.0, status=500)

    timeline = order_timeline(build_hops([*entries, failed_api]), "o-1")

    assert timeline[-1].detail == "POST /orders 400"
    assert timeline[-1].outcome == "ok"  # the function answered: a client error is not a failed hop
    assert len(timeline) == len(SAGA) + 1
    assert build_hops([failed_api])[0].outcome == "failed"


def test_an_outbox_row_of_the_postgresql_store_is_its_events_relay_hop() -> None:
    event = envelope("OrderCreated", "o-1", "corr-1")
    row = {
        "position": 7,
        "event_id": event["id"],
        "aggregate_id": "o-1",
        "event_type": "OrderCreated",
        "envelope": event,
        "created_at": T0,
        "published_at": T0 + 0.25,
        "parked_at": None,
        "attempts": 1,
        "last_error": None,
    }

    published = outbox_row_hop(row, frozenset())
    parked = outbox_row_hop(
        {**row, "published_at": None, "parked_at": T0 + 1, "last_error": "too big"}, frozenset()
    )
    logical = outbox_row_hop({**row, "published_at": None}, frozenset({event["id"]}))
    waiting = outbox_row_hop(
        {**row, "published_at": None, "attempts": 3, "last_error": "throttled"}, frozenset()
    )

    assert (published.outcome, published.duration_ms, published.keys.correlation_id) == (
        "ok",
        250.0,
        "corr-1",
    )
    assert (parked.outcome, parked.error) == ("parked", "parked in the relay poison queue: too big")
    assert (logical.outcome, logical.duration_ms) == ("ok", 0.0)
    assert "records no publish time" in logical.detail
    assert (waiting.outcome, waiting.retries, waiting.error) == ("pending", 2, "throttled")


def test_a_hop_in_json_names_its_keys_parent_and_retries() -> None:
    hop = replace(build_hops(confirmed_saga("o-1", "corr-1"))[-1], depth=1)

    document = hop.to_json()

    assert document["parent"] is not None
    assert {k: document[k] for k in ("function", "trigger", "eventType", "orderId", "depth", "retries")} == {
        "function": "NotificationTopic",
        "trigger": "sns",
        "eventType": "OrderConfirmed",
        "orderId": "o-1",
        "depth": 1,
        "retries": 0,
    }
    assert document["startMs"] == round(hop.started_at * 1000, 3)


def test_the_cache_reads_each_entry_once_and_forgets_the_entries_the_log_dropped() -> None:
    cache = HopCache()
    first, second = confirmed_saga("o-1", "corr-1"), confirmed_saga("o-2", "corr-2")

    before = cache.hops(first)
    after = cache.hops(first[2:] + second)

    assert all(any(hop is again for again in after) for hop in before[2:])  # not read again
    assert not any(hop is again for hop in before[:2] for again in after)
    assert [h.to_json() for h in build_hops(first + second, cache=cache)] == [
        h.to_json() for h in build_hops(first + second)
    ]


# --- one tree per saga, on every order store ------------------------------------------------------------
def tree(timeline: list[Hop]) -> list[tuple[str, str | None, int, str | None, tuple[str, str | None] | None]]:
    """Each hop as (function, event type, depth, relation, its parent's (function, event type))."""
    by_id = {hop.id: hop for hop in timeline}
    return [
        (
            hop.function,
            hop.keys.event_type,
            hop.depth,
            hop.relation,
            (by_id[hop.parent].function, by_id[hop.parent].keys.event_type) if hop.parent in by_id else None,
        )
        for hop in timeline
    ]


def expected_tree(order_publisher: str) -> list[Any]:
    """The saga's tree: each publication under the API request whose trace it continues, each consumer
    under the publication of its event, the SNS publication under its consumer."""
    api = ("OrdersApiFunction", None)
    return [
        (*api, 0, None, None),
        (order_publisher, "OrderCreated", 1, "child", api),
        ("InventoryFunction", "OrderCreated", 2, "linked", (order_publisher, "OrderCreated")),
        ("OutboxRelayFunction", "InventoryReserved", 1, "child", api),
        (
            "OrderStatusFunction",
            "InventoryReserved",
            2,
            "linked",
            ("OutboxRelayFunction", "InventoryReserved"),
        ),
        (order_publisher, "OrderConfirmed", 1, "child", api),
        ("NotificationFunction", "OrderConfirmed", 2, "linked", (order_publisher, "OrderConfirmed")),
        ("NotificationTopic", "OrderConfirmed", 3, None, ("NotificationFunction", "OrderConfirmed")),
    ]


def outbox_row(
    position: int, event: dict[str, Any], created: float, published: float | None
) -> dict[str, Any]:
    """A row of the PostgreSQL order store's outbox, as stack_view.outbox_rows reads it."""
    return {
        "position": position,
        "event_id": event["id"],
        "aggregate_id": event["subject"],
        "event_type": event["type"],
        "envelope": event,
        "created_at": T0 + created,
        "published_at": None if published is None else T0 + published,
        "parked_at": None,
        "attempts": 0,
        "last_error": None,
    }


def test_on_dynamodb_the_saga_is_one_tree_under_its_api_request() -> None:
    saga = traced_saga("o-1", "corr-1", trace_header())

    timeline = order_timeline(build_hops(saga["entries"]), "o-1")

    assert tree(timeline) == expected_tree("OutboxRelayFunction")


@pytest.mark.parametrize("relay", ["polling", "logical"])
def test_on_postgresql_the_outbox_rows_publications_hang_under_the_api_and_the_consumers_under_them(
    relay: str,
) -> None:
    """The order events are published from the outbox table (their hops are its rows, made apart from the
    entries: the polling publisher records a publish time, the logical relay none); the inventory's
    still go through the stream relay."""
    saga = traced_saga("o-1", "corr-1", trace_header())
    entries = [
        entry
        for entry in saga["entries"]
        if not (
            isinstance(entry, Invocation) and entry.trigger == "dynamodb" and entry.source == "OrdersTable"
        )
    ]
    hops = build_hops(entries)
    consumed = frozenset(h.keys.event_id for h in hops if h.trigger == "sqs" and h.keys.event_id)
    published = {"polling": 0.15, "logical": None}[relay]
    rows = [
        outbox_row(1, saga["created"], 0.05, published),
        outbox_row(2, saga["confirmed"], 0.55, published),
    ]

    timeline = order_timeline([*hops, *(outbox_row_hop(row, consumed) for row in rows)], "o-1")

    assert tree(timeline) == expected_tree("OutboxPublisherFunction")


def test_a_consumer_hangs_under_the_publication_that_put_its_event_on_the_bus() -> None:
    trace = trace_header()
    created = envelope("OrderCreated", "o-1", "corr-1") | {"traceparent": traceparent(trace)}
    entries = [
        api_request("o-1", "corr-1", 0.0, trace=trace),
        relay([outbox_record(created, "100")], 0.1, failed=("100",)),
        relay([outbox_record(created, "100")], 0.3),
        consumer("InventoryFunction", "InventoryQueue", [message(created, trace=trace)], 0.5),
    ]

    first, failed, published, handled = order_timeline(build_hops(entries), "o-1")

    assert (failed.outcome, published.outcome) == ("failed", "ok")
    assert (handled.parent, handled.relation) == (published.id, "linked")
    assert {failed.parent, published.parent} == {first.id}


def test_a_consumer_whose_publication_is_not_on_the_timeline_hangs_under_the_trace_segment_itself() -> None:
    """A message an operator command republished (redrive, replay): no hop of the stack published it."""
    saga = traced_saga("o-1", "corr-1", trace_header())
    entries = [e for e in saga["entries"] if not (isinstance(e, Invocation) and e.trigger == "dynamodb")]

    timeline = order_timeline(build_hops(entries), "o-1")

    api = timeline[0]
    consumers = [hop for hop in timeline if hop.trigger == "sqs"]
    assert [(hop.parent, hop.relation, hop.depth) for hop in consumers] == [(api.id, "linked", 1)] * 3


def test_hops_without_trace_context_stand_alone() -> None:
    timeline = order_timeline(build_hops(confirmed_saga("o-1", "corr-1")), "o-1")

    assert [hop.depth for hop in timeline] == [0] * 7 + [1]  # the SNS publication: under its consumer


# --- what the functions said about each record ----------------------------------------------------------
def reported(entry: Invocation, *reports: RecordReport) -> list[Any]:
    """The entry with its function's reports, as the stack view hands them to the timeline."""
    return [entry, *(report_notice(entry.function, entry.result.request_id, r) for r in reports)]


def test_an_event_a_consumer_ignored_says_ignored_and_why() -> None:
    reserved = envelope("InventoryReserved", "o-1", "corr-1")
    late = consumer("OrderStatusFunction", "OrderStatusQueue", [message(reserved)], 0.0)
    applied = consumer("OrderStatusFunction", "OrderStatusQueue", [message(reserved)], 1.0)
    said = RecordReport("ignored", "order CANCELLED", reserved["id"])

    ignored, confirmed = build_hops(
        [*reported(late, said), *reported(applied, RecordReport("applied", "confirmed", reserved["id"]))]
    )

    assert (ignored.outcome, ignored.result) == ("ignored", "ignored: order CANCELLED")
    assert ignored.to_json()["outcome"] == "ignored"
    assert (confirmed.outcome, confirmed.result) == ("ok", "confirmed")


def test_a_failed_message_shows_the_error_its_consumer_logged_for_it() -> None:
    created, other = envelope("OrderCreated", "o-1", "corr-1"), envelope("OrderCreated", "o-2", "corr-2")
    records = [message(created), message(other)]
    failing = Invocation(
        "InventoryFunction",
        "sqs",
        "InventoryQueue",
        {"Records": records},
        result(0.0, 80, payload={"batchItemFailures": [{"itemIdentifier": records[0]["messageId"]}]}),
        (records[0]["messageId"],),
    )
    why = RecordReport(
        "failed", "TimeoutError: DynamoDB did not answer", created["id"], records[0]["messageId"]
    )

    failed, fine = build_hops(reported(failing, why))

    assert (failed.outcome, failed.error) == ("failed", "TimeoutError: DynamoDB did not answer")
    assert (fine.outcome, fine.error) == ("ok", None)


def test_a_record_the_relay_parked_says_why_though_its_message_has_left_the_poison_queue() -> None:
    event = envelope("OrderCreated", "o-1", "corr-1")
    parking = relay([outbox_record(event, "100")], 0.0)
    why = RecordReport(
        "parked", "EventBridge rejected the entry: MalformedDetail", event["id"], sequence_number="100"
    )

    (hop,) = build_hops(reported(parking, why))

    assert (hop.outcome, hop.error) == (
        "parked",
        "parked in the relay poison queue: EventBridge rejected the entry: MalformedDetail",
    )


def test_a_report_is_told_only_to_the_invocation_and_record_it_names() -> None:
    created = envelope("OrderCreated", "o-1", "corr-1")
    first = consumer("InventoryFunction", "InventoryQueue", [message(created)], 0.0)
    second = consumer("InventoryFunction", "InventoryQueue", [message(created)], 1.0)
    elsewhere = report_notice(
        "InventoryFunction", first.result.request_id, RecordReport("ignored", "stale", "e-x")
    )

    hops = build_hops(
        [first, *reported(second, RecordReport("ignored", "duplicate", created["id"])), elsewhere]
    )

    assert [(hop.outcome, hop.result) for hop in hops] == [("ok", None), ("ignored", "ignored: duplicate")]


def test_a_notification_hangs_under_the_consumer_that_says_it_published_it_not_another_of_its_event() -> None:
    """OrderCancelled reaches inventory and notification: both may be running when SNS publishes."""
    cancelled = envelope("OrderCancelled", "o-1", "corr-1", sequence=3)
    notifying = consumer("NotificationFunction", "NotificationQueue", [message(cancelled)], 0.0)
    releasing = consumer("InventoryFunction", "InventoryQueue", [message(cancelled)], 0.01)
    published = notification(cancelled, 0.05)
    said = RecordReport("applied", f"notified:{published.message_id}", cancelled["id"])
    entries = [*reported(notifying, said), releasing, published]

    hops = {hop.function: hop for hop in build_hops(entries)}

    assert hops["NotificationTopic"].parent == hops["NotificationFunction"].id
    # Without the report, the consumer running when it was published that started last is all there is.
    (guessed,) = [h for h in build_hops([notifying, releasing, published]) if h.trigger == "sns"]
    assert guessed.parent == hops["InventoryFunction"].id
