"""The relays at AWS latency part (tools/bench/relay_latency.py): the report's shape, what its targets
read, how it writes orders and drains a relay, and its chart; without DynamoDB Local or PostgreSQL (the
part itself runs in `make bench`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shop.domain.orders import OrderService
from shop.domain.outbox import OutboxEntry
from shop.runtime.config import Settings
from shop.runtime.outbox_publishing import PublishOutcome
from tests.support.memory import InMemoryOrderRepository
from tools.bench import charts, relay_latency
from tools.bench.__main__ import TARGETS, _met, parts_to_run, render
from tools.bench.latency_bus import Recorder, entry_of
from tools.bench.relay_latency_stream import parents_first

LATENCY_TARGETS = [name for name in TARGETS if "latency" in name or "a PutEvents" in name]


def row(latency_ms: int, events_per_s: float, **overrides: Any) -> dict[str, Any]:
    return {
        "putevents_ms": latency_ms,
        "events_per_s": events_per_s,
        "calls_per_event": 0.1,
        "out_of_order": 0,
        "events": 4400,
        "calls": 440,
        "seconds": 4400 / events_per_s,
        "relay_cpu_ms_per_event": 0.5,
        "in_flight_twice": 0,
        "peak_calls_in_flight": 16,
        **overrides,
    }


def measured(stream_at_50: float = 450.0, **overrides: Any) -> dict[str, Any]:
    rates = {"stream": stream_at_50, "polling": 3200.0, "logical": 3400.0}
    return {
        "date": "2026-11-26T12:00:00+00:00",
        "relays_at_aws_latency": {
            relay: [row(ms, rate * 50 / ms, **overrides) for ms in relay_latency.LATENCIES_MS]
            for relay, rate in rates.items()
        },
    }


def test_the_part_runs_by_default_and_alone() -> None:
    assert "relay_latency" in parts_to_run({})
    assert parts_to_run({"BENCH_PARTS": "relay_latency"}) == {"relay_latency"}


def test_its_figures_per_latency_come_from_what_the_bus_received() -> None:
    bus = Recorder()  # the bus's record, its calls made here (the bus itself: test_latency_bus.py)
    details = [{"id": f"e{n}", "subject": f"o-{n % 3}", "sequence": 1 + n // 3} for n in range(12)]
    bus.put_events([entry_of({"Detail": json.dumps(d)}) for d in details[:10]])
    bus.put_events([entry_of({"Detail": json.dumps(d)}) for d in details[10:]])

    figures = relay_latency.figures(bus, 50, 12, seconds=0.5, cpu_seconds=0.006, rounds=2)

    assert {"putevents_ms", "events_per_s", "calls_per_event", "out_of_order"} <= set(figures)
    assert figures["putevents_ms"] == 50
    assert figures["events_per_s"] == pytest.approx(24.0)
    assert figures["calls_per_event"] == pytest.approx(2 / 12)
    assert figures["relay_cpu_ms_per_event"] == pytest.approx(0.5)
    # A function of 1,769 MB has one vCPU: at 0.5 ms of CPU an event it could move 2,000/s, so the rate
    # measured (24/s) is what it moves; at 128 MB (0.072 vCPU) its share caps it at 145/s.
    assert figures["events_per_s_on_lambda"] == pytest.approx(24.0)
    small = relay_latency.figures(bus, 50, 12, seconds=0.001, cpu_seconds=0.006, memory_mb=128)
    assert small["lambda_vcpus"] == pytest.approx(128 / 1769)
    assert small["events_per_s_on_lambda"] == pytest.approx(128 / 1769 * 12 / 0.006)
    assert figures["out_of_order"] == 0
    assert (figures["events"], figures["calls"], figures["rounds"]) == (12, 2, 2)
    with pytest.raises(AssertionError, match="received 12 of the 13 events"):
        relay_latency.figures(bus, 50, 13, seconds=0.5, cpu_seconds=0.006)


def test_the_targets_read_each_relay_at_50_ms_and_every_latency_for_order_and_calls() -> None:
    assert len(LATENCY_TARGETS) == 5
    assert all(_met(TARGETS[name], measured()) for name in LATENCY_TARGETS)

    slow = measured(stream_at_50=380.0)
    assert not _met(TARGETS["stream relay >= 400 events/s at 50 ms a PutEvents"], slow)
    # The rate on a core is not the rate on Lambda: the target reads what the function's vCPU share allows.
    starved = measured()
    starved["relays_at_aws_latency"]["polling"][1].update(events_per_s_on_lambda=1000.0, lambda_memory_mb=512)
    assert not _met(TARGETS["polling publisher >= 3,000 events/s at 50 ms a PutEvents"], starved)
    inverted = measured()
    inverted["relays_at_aws_latency"]["logical"][2]["out_of_order"] = 1  # at 100 ms
    assert not _met(
        TARGETS["relays at AWS latency: 0 events out of order (every relay, every latency)"], inverted
    )
    calls_target = TARGETS[
        "relays at AWS latency: PutEvents calls per event <= 0.10 (every relay, every latency)"
    ]
    chatty = measured(calls_per_event=0.105, calls=462)
    assert not _met(calls_target, chatty)
    # A drain's last call may be short (what is left of the backlog); a second short call misses.
    assert _met(calls_target, measured(calls_per_event=441 / 4400, calls=441))
    assert not _met(calls_target, measured(calls_per_event=442 / 4400, calls=442))
    # The part not run: its targets read as missed.
    assert not any(_met(TARGETS[name], {}) for name in LATENCY_TARGETS)


def test_the_table_shows_every_relay_at_every_latency() -> None:
    results = measured()
    results.update(machine={"cpu": "cpu", "cores": 2}, targets={}, seconds=1.0)

    text = render(results)

    assert "relays at AWS latency" in text
    for relay in relay_latency.RELAYS:
        assert len([line for line in text.splitlines() if line.strip().startswith(relay)]) == 3
    assert ["stream", "50", "450", "0.1000", "0", "16", "0.50", "-"] in [
        line.split() for line in text.splitlines()
    ]
    results["relays_at_aws_latency"]["polling"][1].update(events_per_s_on_lambda=1000.0, lambda_memory_mb=512)
    assert ["polling", "50", "3200", "0.1000", "0", "16", "0.50", "1,000", "(512", "MB)"] in [
        line.split() for line in render(results).splitlines()
    ]
    # A report from before the relay's CPU was measured still renders.
    del results["relays_at_aws_latency"]["stream"][0]["relay_cpu_ms_per_event"]
    assert ["stream", "20", "1125", "0.1000", "0", "16", "-", "-"] in [
        line.split() for line in render(results).splitlines()
    ]


def test_orders_are_written_interleaved_with_several_events_each_by_several_writers() -> None:
    settings = Settings.from_env({})
    repository = InMemoryOrderRepository()
    service = OrderService(repository, settings)

    written, seconds = relay_latency.write_orders([service, service], 41, "t")

    # 21 and 20 orders, each created and confirmed, one in five of each writer's cancelled (5 and 4).
    assert written == 41 + 41 + 9
    assert seconds > 0
    sequences = [[e.sequence for e in repository.outbox.events(order)] for order in repository.orders]
    assert len(sequences) == 41
    assert sum(len(s) for s in sequences) == written
    assert all(s in ([1, 2], [1, 2, 3]) for s in sequences)


def outcome(taken: int, backlog: bool = False) -> PublishOutcome[Any]:
    entry = OutboxEntry(
        "e", "shop.orders", "OrderCreated", "{}", "o-1", 1, "2026-11-26T12:00:00Z", "c", None, 2
    )
    return PublishOutcome(taken=taken, published=[(None, entry)] * taken, backlog=backlog)


def test_a_relay_is_drained_until_a_round_takes_nothing_and_reports_no_backlog() -> None:
    # An empty round with a backlog (a window of the log without outbox rows) does not end the drain.
    rounds = iter([outcome(100), outcome(0, backlog=True), outcome(40), outcome(0)])

    events, counted, seconds, cpu_seconds = relay_latency.drain(lambda: next(rounds))

    assert (events, counted) == (140, 3)
    assert seconds >= 0
    assert cpu_seconds >= 0


def test_a_round_that_leaves_events_pending_stops_the_drain() -> None:
    left = outcome(10)
    left.published = left.published[:5]

    with pytest.raises(AssertionError, match="5 were left pending"):
        relay_latency.drain(lambda: left)


def test_shards_are_read_parents_first() -> None:
    shards = [
        {"ShardId": "c", "ParentShardId": "b"},
        {"ShardId": "a"},
        {"ShardId": "b", "ParentShardId": "a"},
        {"ShardId": "d", "ParentShardId": "gone"},  # a parent trimmed from the stream
    ]

    assert [shard["ShardId"] for shard in parents_first(shards)] == ["a", "b", "c", "d"]


def test_the_environment_is_restored_after_the_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENT_BUS_NAME", "before")
    monkeypatch.delenv("AWS_ENDPOINT_URL_EVENTBRIDGE", raising=False)

    with relay_latency._environment({"EVENT_BUS_NAME": "bench", "AWS_ENDPOINT_URL_EVENTBRIDGE": "http://x"}):
        assert os.environ["EVENT_BUS_NAME"] == "bench"

    assert os.environ["EVENT_BUS_NAME"] == "before"
    assert "AWS_ENDPOINT_URL_EVENTBRIDGE" not in os.environ


def test_the_chart_is_written_as_a_png(tmp_path: Path) -> None:
    paths = [tmp_path / "bench" / "relays.png", tmp_path / "docs" / "relays.png"]

    charts.write_relays_at_aws_latency(measured(), paths)

    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
