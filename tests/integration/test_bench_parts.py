"""`make bench`'s relay-efficiency and write-cost parts, small, on emulators of their own: they run end to end
(the relay part once broke unnoticed until a `make bench`), measure what the product does, and the bench's
target checks read the keys they write (a renamed key would read as a silently missed target)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import reset_process_state
from tools.bench import cost_model, postgres_relays, relay_efficiency, relay_latency, write_cost
from tools.bench.__main__ import TARGETS, render
from tools.local.services.emulators import LocalServices

RELAY_TARGETS = ("relay calls per event <= 0.10", "relay events/s >= 5x baseline")
WRITE_TARGETS = ("DynamoDB write units per confirmed order <= 30",)


@pytest.fixture
def bench_services(tmp_path: Path, fake_credentials: None) -> Iterator[LocalServices]:
    """Fresh emulators (the bench creates the template's bus and tables itself); the environment the bench
    parts set is restored afterwards."""
    saved = dict(os.environ)
    services = LocalServices(tmp_path / "services")
    services.start()
    try:
        yield services
    finally:
        services.stop()
        os.environ.clear()
        os.environ.update(saved)
        reset_process_state()


def test_the_relay_and_write_cost_parts_measure_the_product_and_feed_their_targets(
    bench_services: LocalServices, tmp_path: Path
) -> None:
    relay = relay_efficiency.run(bench_services.endpoints.moto, 300, 100)
    cost = write_cost.run(bench_services.endpoints.dynamodb, bench_services.endpoints.moto, 5)
    relays = postgres_relays.run(bench_services.endpoints.moto, tmp_path / "postgres", 40, 5.0, 2.0)

    # The relay batches up to 10 events per PutEvents (the baseline: one each), and both relays
    # published every outbox event of the same stream records.
    assert relay["outbox_events"] >= 300
    assert relay["baseline"]["put_events_calls_per_event"] == 1.0
    assert 0.1 <= relay["ours"]["put_events_calls_per_event"] < 0.15
    assert relay["speedup_events_per_second"] > 1
    # A confirmed order's writes as AWS bills them (docs/performance.md, write cost table).
    assert cost["wcu_per_confirmed_order"] == 30
    assert cost["consumers"]["inventory_consumer"]["dynamodb_calls_per_event"] == 3
    # Each PostgreSQL relay published every event of the orders it confirmed, in calls of up to 10; the
    # lag run's orders all arrived.
    for figures in relays.values():
        assert figures["throughput"]["events"] == 2 * 40
        assert 0.1 <= figures["throughput"]["put_events_calls_per_event"] < 0.15
        assert figures["lag"]["events"] >= 9
        assert 0 < figures["lag"]["p50_ms"] <= figures["lag"]["p99_ms"]
    assert set(relays) == {"polling", "logical"}

    results: dict[str, Any] = {
        "date": "test",
        "machine": {"cpu": "test", "cores": 2},
        "relay": relay,
        "write_cost": cost,
        "postgres_relays": relays,
        "seconds": 0.0,
    }
    for name in (*RELAY_TARGETS, *WRITE_TARGETS):
        assert isinstance(TARGETS[name](results), bool), name  # reads real keys: no KeyError
    results["targets"] = {name: bool(TARGETS[name](results)) for name in (*RELAY_TARGETS, *WRITE_TARGETS)}
    assert results["targets"]["DynamoDB write units per confirmed order <= 30"] is True
    text = render(results)
    assert "PutEvents calls per event" in text
    assert "write cost: create 8 WCU" in text
    assert "polling relay (OrderStore=postgres, PostgresRelay=polling" in text
    assert "logical relay (OrderStore=postgres, PostgresRelay=logical" in text
    # The stores' table is priced from this run's figures: the orders table's write units are what the
    # postgres store stops paying, so its variable cost is lower and a break-even exists.
    rendered = cost_model.render(results)
    for name in ("polling", "logical"):
        even = cost_model.break_even_orders_per_month(results, name)
        assert even is not None
        assert f"Break-even with PostgresRelay={name}: {even:,.0f} orders a month" in rendered


def test_the_relays_at_aws_latency_part_runs_each_relay_on_its_source_and_feeds_its_targets(
    bench_services: LocalServices, tmp_path: Path
) -> None:
    measured = relay_latency.run(
        bench_services.endpoints.dynamodb,
        tmp_path / "postgres",
        latencies=(20,),
        stream_orders=30,
        postgres_orders=30,
    )

    assert set(measured) == {"stream", "polling", "logical"}
    for relay, rows in measured.items():
        (row,) = rows
        # every event written reached the latency bus, an order's events in sequence and never in two calls
        # at once, in calls of up to 10
        assert row["putevents_ms"] == 20, relay
        assert row["events"] >= 60, relay
        assert row["out_of_order"] == 0, relay
        assert row["in_flight_twice"] == 0, relay
        assert 0.1 <= row["calls_per_event"] < 0.2, relay
        assert row["events_per_s"] > 0, relay
    results: dict[str, Any] = {"relays_at_aws_latency": measured}
    latency_targets = [name for name in TARGETS if "at AWS latency" in name or "a PutEvents" in name]
    assert len(latency_targets) == 5
    results["relays_at_aws_latency"] = {
        relay: [{**row, "putevents_ms": 50} for row in rows] for relay, rows in measured.items()
    }
    for name in latency_targets:
        assert isinstance(TARGETS[name](results), bool), name  # reads real keys: no KeyError
