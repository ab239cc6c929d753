"""The inspector's timeline builder (inspector/timeline.py): one order's hops from the activity log."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tools.local.inspector.timeline import (
    EventKeys,
    Hop,
    HopCache,
    build_hops,
    order_timeline,
    outbox_row_hop,
)
from tools.local.runtime.functions import FunctionError
from tools.local.tests.saga_entries import (
    T0,
    api_request,
    confirmed_saga,
    consumer,
    envelope,
    message,
    outbox_record,
    relay,
)

SAGA = [
    ("OrdersApiFunction", None),
    ("OutboxRelayFunction", "OrderCreated"),
    ("InventoryFunction", "OrderCreated"),
    ("OutboxRelayFunction", "InventoryReserved"),
    ("OrderStatusFunction", "InventoryReserved"),
    ("OutboxRelayFunction", "OrderConfirmed"),
    ("NotificationFunction", "OrderConfirmed"),
    ("NotificationTopic", "OrderConfirmed"),
]


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


def test_a_poison_record_is_on_its_orders_timeline_by_aggregate_id_and_parked_when_the_queue_holds_it() -> (
    None
):
    event = envelope("OrderCreated", "o-1", "corr-1")
    record = outbox_record(event, "100", raw_envelope="{not json")

    unparked = order_timeline(build_hops([relay([record], 0.0)]), "o-1")
    parked = order_timeline(build_hops([relay([record], 0.0)], parked=frozenset({event["id"]})), "o-1")

    assert [(h.keys.event_id, h.keys.event_type, h.outcome) for h in unparked] == [
        (event["id"], "OrderCreated", "ok")
    ]
    assert [(h.outcome, h.error) for h in parked] == [("parked", "parked in the relay poison queue")]


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
