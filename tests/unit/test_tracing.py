"""Trace context (shop.domain.tracing): X-Ray's trace header and the W3C traceparent it maps to, as the
X-Ray developer guide ("Tracing header", W3C trace ids) and W3C Trace Context define them."""

from __future__ import annotations

import json

import pytest

from shop.domain.tracing import TraceContext, from_traceparent, from_xray_header

# The X-Ray developer guide's example header, with a sampling decision.
HEADER = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


def test_an_xray_header_maps_to_the_w3c_traceparent_with_the_same_trace_and_parent() -> None:
    context = from_xray_header(HEADER)

    assert context == TraceContext("5759e988bd862e3fe1be46a994272793", "53995c3f42cd8ad8", sampled=True)
    assert context.traceparent == "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    assert context.xray_root == "1-5759e988-bd862e3fe1be46a994272793"


def test_an_unsampled_header_gives_the_unsampled_flag() -> None:
    context = from_xray_header(HEADER.replace("Sampled=1", "Sampled=0"))
    assert context is not None
    assert context.traceparent.endswith("-00")


def test_field_order_and_lambdas_lineage_field_do_not_matter() -> None:
    header = "Parent=53995c3f42cd8ad8;Sampled=1;Lineage=a87bd80c:0;Root=1-5759e988-bd862e3fe1be46a994272793"
    assert from_xray_header(header) == from_xray_header(HEADER)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",  # no parent: nothing to be a child of
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000",
        "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",  # unknown version
        "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",  # 23 hex digits
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad",
        "not a header",
    ],
)
def test_a_header_without_a_valid_root_and_parent_gives_no_context(header: str | None) -> None:
    assert from_xray_header(header) is None


def test_a_traceparent_round_trips_and_invalid_ones_are_ignored() -> None:
    value = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    context = from_traceparent(value)
    assert context is not None
    assert context.traceparent == value
    assert from_traceparent("00-" + "0" * 32 + "-53995c3f42cd8ad8-01") is None  # all-zero trace id
    assert from_traceparent("01-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01") is None
    assert from_traceparent("00-5759E988BD862E3FE1BE46A994272793-53995c3f42cd8ad8-01") is None  # uppercase


def test_an_event_written_with_a_trace_header_carries_its_traceparent_and_reads_back() -> None:
    from shop.domain.envelope import CloudEvent

    event = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    )

    traced = event.traced(HEADER)

    assert traced.to_dict()["traceparent"] == "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
    assert CloudEvent.from_json(traced.to_json()) == traced
    assert traced.id == event.id  # the trace is not part of the event's identity
    assert event.traced(None) is event
    assert "traceparent" not in event.to_dict()


def test_a_malformed_traceparent_never_makes_an_event_invalid() -> None:
    from shop.domain.envelope import CloudEvent

    raw = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    ).to_dict()

    assert CloudEvent.from_dict({**raw, "traceparent": 42}).traceparent is None
    assert CloudEvent.from_dict({**raw, "traceparent": "garbage"}).traceparent is None  # dropped


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        42,
        None,
        "00-00000000000000000000000000000000-53995c3f42cd8ad8-01",  # all-zero trace id: invalid (W3C)
        "00-5759E988BD862E3FE1BE46A994272793-53995c3f42cd8ad8-01",  # upper-case hex: invalid (W3C)
    ],
)
def test_the_relay_publishes_an_envelope_without_its_malformed_traceparent(traceparent: object) -> None:
    from shop.domain.envelope import CloudEvent
    from shop.domain.outbox import outbox_entry

    event = CloudEvent.new(
        source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
    )
    envelope = json.dumps({**event.to_dict(), "traceparent": traceparent})

    entry = outbox_entry(envelope, 262_144)

    # Dropped, not parked (tracing is best effort), as a trace header PutEvents would refuse is.
    assert json.loads(entry.detail) == event.to_dict()
    assert entry.size < len(envelope.encode()) + len(event.source) + len(event.type) + 14
    assert entry.trace_header is None
    assert CloudEvent.from_json(entry.detail) == event


def test_the_relay_publishes_a_valid_traceparent_and_data_naming_one_as_stored() -> None:
    from shop.domain.envelope import CloudEvent
    from shop.domain.outbox import outbox_entry

    event = CloudEvent.new(
        source="shop.orders",
        type="OrderCreated",
        subject="o-1",
        sequence=1,
        data={"traceparent": "garbage"},  # data's own, not the attribute
        correlation_id="c",
    )
    for envelope in (event.to_json(), event.traced(HEADER).to_json()):
        assert outbox_entry(envelope, 262_144).detail == envelope


def test_the_relay_gets_the_x_ray_header_back_from_the_envelope_when_none_is_stored_beside_it() -> None:
    from shop.domain.envelope import CloudEvent
    from shop.domain.outbox import outbox_entry

    envelope = (
        CloudEvent.new(
            source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
        )
        .traced(HEADER)
        .to_json()
    )

    assert outbox_entry(envelope, 262_144).trace_header == HEADER  # Root, Parent, Sampled, as written
    assert (
        outbox_entry(envelope, 262_144, "Root=1-1-2;Parent=3").trace_header == "Root=1-1-2;Parent=3"
    )  # stored wins
    untraced = CloudEvent.new(source="s", type="T", subject="o", sequence=1, data={}, correlation_id="c")
    assert outbox_entry(untraced.to_json(), 262_144).trace_header is None


# --- the sampled flag -------------------------------------------------------------------------------------
TRACE_ID, PARENT_ID = "5759e988bd862e3fe1be46a994272793", "53995c3f42cd8ad8"


@pytest.mark.parametrize(
    ("flags", "sampled"),
    [("00", False), ("01", True), ("02", False), ("03", True), ("fe", False), ("ff", True)],
)
def test_sampled_is_the_low_bit_of_the_traceparent_flags_and_nothing_else(flags: str, sampled: bool) -> None:
    """W3C Trace Context, trace-flags: 8 bits, of which only the lowest (0x01, sampled) is defined; the
    others must be ignored, not read as a decision. A sampling decision is written back as 01 or 00."""
    context = from_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-{flags}")

    assert context == TraceContext(TRACE_ID, PARENT_ID, sampled=sampled)
    assert context.traceparent.endswith("-01" if sampled else "-00")
    assert context.xray_header.endswith(f";Sampled={1 if sampled else 0}")


@pytest.mark.parametrize(
    ("field", "sampled"),
    [("Sampled=1", True), ("Sampled=0", False), ("Sampled=?", False), ("", False)],
    ids=["sampled", "not-sampled", "deferred", "absent"],
)
def test_only_an_xray_header_that_says_sampled_1_is_sampled(field: str, sampled: bool) -> None:
    """X-Ray's header (developer guide, "Tracing header"): Sampled=1 records the trace, Sampled=0 does
    not, Sampled=? leaves the decision downstream, and a header may carry no decision at all: a trace
    a service was not asked to record must not become one that is."""
    header = f"Root=1-5759e988-bd862e3fe1be46a994272793;Parent={PARENT_ID}" + (f";{field}" if field else "")

    context = from_xray_header(header)

    assert context is not None
    assert context.sampled is sampled
    assert context.traceparent.endswith("-01" if sampled else "-00")


def test_an_unsampled_saga_stays_unsampled_through_the_envelope_and_back_to_x_ray() -> None:
    """The relay rebuilds PutEvents' TraceHeader from the envelope's traceparent when no header is stored
    beside it: a saga X-Ray did not sample is handed on as not sampled (the sampled case is above)."""
    from shop.domain.envelope import CloudEvent
    from shop.domain.outbox import outbox_entry

    unsampled = HEADER.replace("Sampled=1", "Sampled=0")
    envelope = (
        CloudEvent.new(
            source="shop.orders", type="OrderCreated", subject="o-1", sequence=1, data={}, correlation_id="c"
        )
        .traced(unsampled)
        .to_json()
    )

    assert json.loads(envelope)["traceparent"] == "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
    assert outbox_entry(envelope, 262_144).trace_header == unsampled
