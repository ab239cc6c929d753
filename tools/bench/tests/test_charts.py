"""The relay comparison chart (tools/bench/charts.py): drawn from the run's own figures, each relay in its
place, and written as a PNG wherever asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.bench import charts, cost_model
from tools.bench.tests.test_order_store_costs import bench_figures


def results() -> dict[str, Any]:
    bench = bench_figures()
    bench["date"] = "2026-11-25T12:00:00+00:00"
    bench["relay"]["ours"]["events_per_second_median"] = 1000.0
    bench["latency"] = {"median_hop_ms": {"relay OrderCreated": 24.0}}
    for relay, (p50, p99, speed, statements) in {
        "polling": (100, 200, 850, 0.03),
        "logical": (90, 180, 900, 0.02),
    }.items():
        bench["postgres_relays"][relay]["lag"] = {"p50_ms": p50, "p99_ms": p99}
        bench["postgres_relays"][relay]["throughput"]["events_per_second"] = speed
        bench["postgres_relays"][relay]["throughput"]["sql_statements_per_event"] = statements
    return bench


def test_each_relay_gets_its_own_figures_and_unmeasured_ones_stay_empty() -> None:
    figures = charts.relay_figures(results())

    assert figures["lag_p50_ms"] == [24.0, 100, 90]
    assert figures["lag_p99_ms"] == [None, 200, 180]  # the stack's hop has a median only
    assert figures["events_per_second"] == [1000.0, 850, 900]
    assert figures["database_cpu_ms_per_event"] == [None, 0.1, 0.05]
    fixed = sum(cost_model.postgres_fixed_per_month().values())
    logical = cost_model.postgres_cost_per_million_orders(results(), "logical")["total"]
    assert figures["cost_per_month"][2] == pytest.approx(logical + fixed)


def test_the_chart_is_written_as_a_png_to_every_path(tmp_path: Path) -> None:
    paths = [tmp_path / "bench" / "chart.png", tmp_path / "docs" / "chart.png"]

    charts.write_relay_comparison(results(), paths)

    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10_000


def test_cost_by_service_adds_up_to_each_stores_total() -> None:
    bench = results()
    costs = charts.cost_by_service(bench)

    assert list(costs) == ["dynamodb", "postgres, polling", "postgres, logical"]
    assert sum(costs["dynamodb"].values()) == pytest.approx(
        cost_model.cost_per_million_orders(bench, "ours")["total"]
    )
    logical = cost_model.postgres_cost_per_million_orders(bench, "logical")["total"]
    assert sum(costs["postgres, logical"].values()) == pytest.approx(logical)
    assert costs["dynamodb"].get("Aurora I/O", 0.0) == 0.0


def test_the_cost_chart_stacks_each_item_once_to_each_stores_total(monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    stacked: list[tuple[str, list[float]]] = []
    bar = matplotlib.axes.Axes.bar

    def recording_bar(self: Any, x: Any, height: Any, *args: Any, **kwargs: Any) -> Any:
        stacked.append((kwargs["label"], list(height)))
        return bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", recording_bar)
    bench = results()
    charts.write_cost_by_service(bench, [])

    labels = [label for label, _ in stacked]
    assert len(labels) == len(set(labels)), labels
    totals = [sum(heights[i] for _, heights in stacked) for i in range(3)]
    expected = [sum(lines.values()) for lines in charts.cost_by_service(bench).values()]
    assert totals == pytest.approx(expected)


def test_the_latency_and_cost_charts_are_written_as_pngs(tmp_path: Path) -> None:
    bench = results()
    bench["latency"].update(
        offered_rate_per_s=4.0,
        seconds=30.0,
        orders_accepted=3,
        post_to_confirmed={"p50_ms": 120.0, "p99_ms": 200.0, "samples_ms": [100.0, 120.0, 200.0]},
        post_to_notification={"p50_ms": 190.0, "p99_ms": 300.0, "samples_ms": [150.0, 190.0, 300.0]},
    )

    charts.write_latency_distribution(bench, [tmp_path / "latency.png"])
    charts.write_cost_by_service(bench, [tmp_path / "cost.png"])

    for name in ("latency.png", "cost.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
