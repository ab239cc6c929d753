"""Domain rules that need no AWS: envelope, event ids, sizes, chunking, transitions, key design, the
outbox item, and the event types and statuses the domain declares (docs/events.md is generated from them)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import outbox_item
from shop.domain import inventory, orders
from shop.domain.envelope import CloudEvent, entry_size, event_id_for
from shop.domain.errors import IllegalTransition, InvalidEnvelope
from shop.domain.event_types import EVENT_TYPES, ORDER_STATUSES, REJECTION_REASONS, RESERVATION_STATUSES
from shop.domain.inventory import ReservationStatus
from shop.domain.orders import Order, OrderLine, OrderStatus, PlaceOrder, RejectionReason
from shop.domain.outbox import OutboxEntry, outbox_entry
from shop.domain.publishing import interleave_orders, ordered_chunks


def order(status: OrderStatus = OrderStatus.PENDING) -> Order:
    return Order("o-1", "c-1", "EUR", (OrderLine("A", 3, 199),), status, 1, "2026-01-01T00:00:00.000Z", "x")


def entry(aggregate: str, size: int = 100) -> OutboxEntry:
    return OutboxEntry("id", "s", "T", "{}", aggregate, 1, "2026-01-01T00:00:00.000Z", "c", None, size)


def test_event_ids_are_deterministic_per_change_and_distinct_across_changes():
    assert event_id_for("shop.orders", "o-1", 1, "OrderCreated") == event_id_for(
        "shop.orders", "o-1", 1, "OrderCreated"
    )
    assert event_id_for("shop.orders", "o-1", 1, "OrderCreated") != event_id_for(
        "shop.orders", "o-1", 2, "OrderCancelled"
    )


def test_envelope_round_trips_and_rejects_what_is_not_a_cloudevent():
    event = CloudEvent.new(
        source="shop.orders",
        type="OrderCreated",
        subject="o-1",
        sequence=1,
        data={"a": 1},
        correlation_id="c",
    )
    assert CloudEvent.from_json(event.to_json()) == event
    raw = json.loads(event.to_json())
    for broken in (
        {k: v for k, v in raw.items() if k != "id"},
        {**raw, "specversion": "0.3"},
        {**raw, "sequence": "1"},
        {**raw, "sequence": 0},
        {**raw, "time": "yesterday"},
        {**raw, "data": []},
    ):
        with pytest.raises(InvalidEnvelope):
            CloudEvent.from_dict(broken)
    with pytest.raises(InvalidEnvelope):
        CloudEvent.from_json("{not json")


def an_envelope() -> dict[str, Any]:
    """A valid envelope as stored: what the refused and accepted cases change one attribute of."""
    event = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    )
    return json.loads(event.to_json())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "change",
    [
        {"source": "shop orders%zz"},  # a space, and "%" not followed by two hex digits
        {"source": "shop.orders%2"},
        {"source": "1shop:orders"},  # a ":" in the first segment without a valid scheme before it
        {"source": "shop.orders#a#b"},
        {"Correlation-Id": "x"},
        {"foo_bar": 1},
        {"traceParent": "x"},
        {"data_base64": "AAAA"},
        {"datacontenttype": 5},
        {"datacontenttype": ""},
        {"dataschema": 5},
        {"dataschema": "not a uri"},
        {"dataschema": "schemas/order.json"},  # a relative reference: the URI type is absolute
        {"time": "20240101T000000Z"},  # ISO 8601's basic format
        {"time": "2024-01-01T00Z"},
        {"time": "2024-01-01T00:00Z"},
        {"time": "2024-01-01T00:00:00,5Z"},
        {"time": "2024-01-01 00:00:00Z"},
        {"time": "2024-01-01T00:00:00+0100"},
        {"time": "2024-01-01T00:00:00.Z"},
        {"time": "\uff12\uff10\uff12\uff14-01-01T00:00:00Z"},  # fullwidth digits (\d takes them)
        {"time": "2016-12-31T23:59:60Z"},  # RFC 3339 allows a leap second; no datetime holds one
    ],
    ids=lambda change: ",".join(f"{k}={v}" for k, v in change.items()),
)
def test_an_envelope_cloudevents_forbids_is_refused_and_a_relay_parks_it(change: dict[str, Any]) -> None:
    raw = an_envelope()

    with pytest.raises(InvalidEnvelope):
        CloudEvent.from_dict({**raw, **change})
    with pytest.raises(InvalidEnvelope):  # what every relay calls on a record before sending it
        outbox_entry(json.dumps({**raw, **change}), 262_144)


@pytest.mark.parametrize(
    "change",
    [
        {"source": "urn:shop:orders"},
        {"source": "https://shop.example/orders?x=%C3%A9#top"},
        {"source": "/orders"},
        {"partitionkey": "o-1"},  # any extension named by the rule
        {"averyverylongextensionname2": 1},  # longer than the 20 characters names SHOULD NOT exceed
        {"dataschema": "https://shop.example/schemas/order.json"},
        {"datacontenttype": "application/vnd.shop+json; charset=utf-8"},
        {"datacontenttype": None},  # JSON format: null is absent
        {"causationid": None},
        {"time": "2024-01-01t00:00:00z"},  # RFC 3339, 5.6: "T" and "Z" may be lower case
        {"time": "2024-01-01T00:00:00.123456789Z"},
        {"time": "2024-01-01T00:00:00-00:00"},
        {"time": "2024-01-01T01:00:00+01:00"},
    ],
    ids=lambda change: ",".join(f"{k}={v}" for k, v in change.items()),
)
def test_an_envelope_cloudevents_allows_is_accepted_and_published_as_stored(change: dict[str, Any]) -> None:
    raw = an_envelope()
    envelope = json.dumps({**raw, **change})

    CloudEvent.from_dict({**raw, **change})
    assert outbox_entry(envelope, 262_144).detail == envelope


@pytest.mark.parametrize("attribute", ["time", "specversion"])
def test_an_invalid_envelope_quotes_its_content_cut_to_a_thousand_characters(attribute: str):
    """A poison record's details go into one poison queue message and the relay's log line: quoted whole,
    an attribute of 300 KB made a message SQS refuses."""
    raw = json.loads(
        CloudEvent.new(source="s", type="T", subject="o", sequence=1, data={}, correlation_id="c").to_json()
    )

    with pytest.raises(InvalidEnvelope) as refused:
        CloudEvent.from_dict({**raw, attribute: "x" * 300_000})

    assert refused.value.details == {attribute: "x" * 1_000 + "... (299000 more characters cut)"}


def test_entry_size_counts_utf8_bytes_and_the_fixed_time_overhead():
    assert entry_size("s", "T", "é") == 14 + 1 + 1 + 2


def test_chunks_respect_ten_entries_the_byte_limit_and_one_event_per_aggregate():
    assert [len(c) for c in ordered_chunks([entry(str(n)) for n in range(25)], 10_000)] == [10, 10, 5]
    assert [len(c) for c in ordered_chunks([entry(str(n), 400) for n in range(5)], 1000)] == [2, 2, 1]
    # a's second event goes to the next chunk; c, after it, still fills the first
    assert [list(c) for c in ordered_chunks([entry("a"), entry("b"), entry("a"), entry("c")], 10_000)] == [
        [0, 1, 3],
        [2],
    ]


def test_an_entry_that_cannot_join_the_newest_chunk_does_not_cut_it_short():
    """Orders whose events sit close together in a stream batch, and an entry too large for the chunk
    it reaches: every call but the last is full, each order's events in chunks of rising index."""
    entries = [entry(f"o{n // 2}") for n in range(20)] + [entry(f"p{n}") for n in range(10)]
    chunks = ordered_chunks(entries, 10_000)
    assert [len(c) for c in chunks] == [10, 10, 10]
    chunk_of = {position: index for index, chunk in enumerate(chunks) for position in chunk}
    for first in range(0, 20, 2):
        assert chunk_of[first] < chunk_of[first + 1]  # an order's second event in a later call
    assert all(list(chunk) == sorted(chunk) for chunk in chunks)

    sized = [entry("a", 600), entry("b", 600), entry("c", 300), entry("d", 100)]
    assert [list(c) for c in ordered_chunks(sized, 1000)] == [[0, 2, 3], [1]]


def test_an_order_whose_two_events_end_a_batch_does_not_cost_a_call_of_its_own():
    """Eighteen orders with one event, then one order's two: placed in input order the second would
    land beside the first in the last call and take a third; placed busiest first, twenty events fill
    two calls. Each order's events keep their sequence in calls of rising index."""
    entries = [entry(f"o{n}") for n in range(18)] + [entry("z"), entry("z")]
    chunks = ordered_chunks(entries, 10_000)
    assert [len(chunk) for chunk in chunks] == [10, 10]
    assert [index for index, chunk in enumerate(chunks) for position in chunk if position >= 18] == [0, 1]
    ranked = interleave_orders(["o1", "z", "o2", "z"], lambda order: order, busiest_first=True)
    assert ranked == ["z", "o1", "o2", "z"]
    assert interleave_orders(["o1", "z", "o2", "z"], lambda order: order) == ["o1", "z", "o2", "z"]


def test_order_state_machine():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    confirmed = order().transition_to(OrderStatus.CONFIRMED, at)
    assert (confirmed.status, confirmed.version) == (OrderStatus.CONFIRMED, 2)
    assert confirmed.transition_to(OrderStatus.CANCELLED, at).version == 3
    with pytest.raises(IllegalTransition):
        order(OrderStatus.REJECTED).transition_to(OrderStatus.CANCELLED, at)
    with pytest.raises(IllegalTransition):
        confirmed.transition_to(OrderStatus.REJECTED, at)


def test_totals_are_integer_minor_units():
    assert order().total_amount == 597
    assert order().to_dict()["items"][0]["lineTotal"] == 597


@pytest.mark.parametrize(
    "other",
    [
        PlaceOrder("d", "EUR", (OrderLine("A", 1, 100),)),
        PlaceOrder("c", "USD", (OrderLine("A", 1, 100),)),
        PlaceOrder("c", "EUR", (OrderLine("B", 1, 100),)),
        PlaceOrder("c", "EUR", (OrderLine("A", 2, 100),)),
        PlaceOrder("c", "EUR", (OrderLine("A", 1, 101),)),
        PlaceOrder("c", "EUR", (OrderLine("A", 1, 100), OrderLine("A", 1, 100))),
    ],
    ids=["customerId", "currency", "sku", "quantity", "unitPrice", "another-line"],
)
def test_request_fingerprint_tells_bodies_apart(other):
    one = PlaceOrder("c", "EUR", (OrderLine("A", 1, 100),))
    assert one.fingerprint() == PlaceOrder("c", "EUR", (OrderLine("A", 1, 100),)).fingerprint()
    assert one.fingerprint() != other.fingerprint()


def test_outbox_time_buckets_cover_every_hour_and_shard_of_a_window():
    start = datetime(2026, 1, 1, 10, 59, tzinfo=UTC)
    end = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    buckets = list(keys.outbox_buckets(start, end, 2))
    assert buckets == [f"20260101{h}#{s}" for h in ("10", "11", "12") for s in (0, 1)]
    attrs = keys.outbox_time_attributes(datetime(2026, 1, 1, 11, 30, tzinfo=UTC), "e-1", 2)
    assert attrs["outboxBucket"]["S"] in buckets
    low, high = keys.outbox_time_bounds(start, end)
    assert low <= attrs["outboxTime"]["S"] <= high


def test_outbox_item_carries_only_what_relay_replay_and_checks_read() -> None:
    event = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    )
    item = outbox_item(event, "ORDER#o-1", ttl_days=16, time_shards=8, max_event_bytes=262144)
    # What the event is (id, type, subject, sequence) is in the envelope, and its id ends the sort key:
    # no attribute repeats them, and no index by event id (docs/performance.md, "Write cost").
    assert set(item) == {"PK", "SK", "envelope", "outboxBucket", "outboxTime", "expiresAt"}
    assert item["outboxTime"]["S"] == event.time  # index sort keys need not be unique: no id suffix
    assert keys.outbox_event_id(item["SK"]["S"]) == event.id
    assert keys.outbox_aggregate_id(item["PK"]["S"]) == event.subject
    assert item["outboxBucket"]["S"].endswith(f"#{keys.outbox_time_shard(event.id, 8)}")


def test_an_outbox_items_event_id_and_order_are_read_from_its_keys() -> None:
    assert keys.outbox_event_id("OUTBOX#000000000002#e-1") == "e-1"
    assert keys.outbox_event_id("OUTBOX#000000000002#e#1") == "e#1"  # everything after the sequence
    for not_outbox in (
        "ORDER",
        "OUTBOX#",
        "OUTBOX#2",
        "OUTBOX#x#e-1",
        "OUTBOX#000000000002#",
        "X#OUTBOX#1#e",
    ):
        assert keys.outbox_event_id(not_outbox) is None, not_outbox
    assert keys.outbox_aggregate_id(keys.order_partition("o-1")) == "o-1"
    assert keys.outbox_aggregate_id(keys.reservation_partition("o-1")) == "o-1"
    assert keys.outbox_aggregate_id("SKU#A") is None
    assert keys.outbox_aggregate_id("ORDER#") is None
    sort_key = keys.outbox_key("ORDER#o-1", 7, "e-1")["SK"]["S"]
    assert sort_key.endswith(keys.outbox_sort_key_suffix("e-1"))


def test_an_events_buckets_are_its_own_shards_newest_hour_first() -> None:
    written = datetime(2026, 1, 1, 11, 30, tzinfo=UTC)
    bucket = keys.outbox_time_attributes(written, "e-1", 8)[keys.OUTBOX_BUCKET]["S"]
    shard = keys.outbox_time_shard("e-1", 8)
    buckets = list(
        keys.outbox_shard_buckets(
            shard, datetime(2026, 1, 1, 9, 59, tzinfo=UTC), datetime(2026, 1, 1, 12, tzinfo=UTC)
        )
    )
    assert buckets == [f"20260101{hour}#{shard}" for hour in ("12", "11", "10", "09")]
    assert bucket in buckets  # where the writer put it


def test_outbox_time_bounds_find_items_with_and_without_the_former_id_suffix() -> None:
    moment = datetime(2026, 1, 1, 11, 30, tzinfo=UTC)
    low, high = keys.outbox_time_bounds(moment, moment)
    current = keys.outbox_time_attributes(moment, "e-1", 4)[keys.OUTBOX_TIME]["S"]
    assert low <= current <= high
    assert low <= f"{current}#e-1" <= high


def camel_case_constants(module: ModuleType) -> set[str]:
    return {
        value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"(?:[A-Z][a-z]+){2,}", value)
    }


def test_every_event_type_and_source_the_domain_names_is_declared():
    declared = {t.name for t in EVENT_TYPES}
    assert camel_case_constants(orders) | camel_case_constants(inventory) == declared
    assert {orders.EVENT_SOURCE, inventory.EVENT_SOURCE} == {t.source for t in EVENT_TYPES}


def test_declared_statuses_are_the_domains():
    assert tuple(OrderStatus) == ORDER_STATUSES
    assert set(RESERVATION_STATUSES) == set(ReservationStatus) - {ReservationStatus.CANCELLED}
    assert tuple(RejectionReason) == REJECTION_REASONS
