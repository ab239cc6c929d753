"""EventBridge Pipes as the DynamoDB store's relay (tools/bench/cost_model.py): what a pipe per table costs
per million orders against the relay, worked out by hand from the known figures of `bench_figures`
(3 events and 3 consumed messages an order; the relay: 0.03 invocations an order, 700 ms of CPU per
1,000 events; 30 write units and 3 reads an order)."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import charts, cost_model
from tools.bench.tests.test_order_store_costs import bench_figures

# The lines a pipe does not change, per million orders: API Gateway $3.50, 30 write units x $0.625 =
# $18.75, 3 reads x $0.125 = $0.375, 3 events x $1.00 = $3.00 on the bus, 3 messages x 1.2 requests x
# $0.40 = $1.44 of SQS, one SNS publish $0.50.
UNCHANGED = 3.50 + 18.75 + 0.375 + 3.00 + 1.44 + 0.50
# The handlers' Lambda (the API and 3 consumers, 50 ms each at 0.5 GB): 1e6 x 0.5 x 0.0000133334 x 0.2 s.
HANDLERS_DURATION = 1.33334
# The relay's CPU: 700 ms per 1,000 events x 3 events = 2.1 ms an order -> 1e6 x 0.5 x 0.0000133334 x 0.0021.
RELAY_DURATION = 0.01400007


def test_a_pipe_with_an_input_transformer_drops_the_relay_and_pays_a_request_per_event() -> None:
    lines = cost_model.pipes_cost_per_million_orders(bench_figures(), "transformer")

    assert lines["Lambda requests"] == pytest.approx(0.26)  # the API's 1 + 3 consumers' 0.3: no relay
    assert lines["Lambda duration"] == pytest.approx(HANDLERS_DURATION)
    assert lines["EventBridge Pipes"] == pytest.approx(1.20)  # 3 requests after filtering x $0.40/M
    assert lines["EventBridge"] == pytest.approx(3.00)  # PutEvents is charged per event, batched or not
    assert lines["total"] == pytest.approx(UNCHANGED + 0.26 + HANDLERS_DURATION + 1.20)


def test_the_enrichment_lambda_is_invoked_once_per_batch_of_ten_at_the_relays_cpu_per_event() -> None:
    lines = cost_model.pipes_cost_per_million_orders(bench_figures(), "enrichment")

    assert lines["Lambda requests"] == pytest.approx(0.20 * (1.3 + 0.3))  # 3 events / 10 per batch
    assert lines["Lambda duration"] == pytest.approx(HANDLERS_DURATION + RELAY_DURATION)
    assert lines["total"] == pytest.approx(UNCHANGED + 0.32 + HANDLERS_DURATION + RELAY_DURATION + 1.20)


def test_against_the_relay_the_enriched_pipe_costs_its_requests_and_its_invocations() -> None:
    bench = bench_figures()
    relay = cost_model.cost_per_million_orders(bench, "ours")
    pipe = cost_model.pipes_cost_per_million_orders(bench, "enrichment")

    # + $1.20 of pipe requests, + 0.3 - 0.03 invocations an order x $0.20/M.
    assert pipe["total"] - relay["total"] == pytest.approx(1.20 + 0.27 * 0.20)


def test_if_a_batch_of_ten_is_one_request_the_pipes_line_is_a_tenth() -> None:
    lines = cost_model.pipes_cost_per_million_orders(bench_figures(), "enrichment", requests_per_event=0.1)

    assert lines["EventBridge Pipes"] == pytest.approx(0.12)


def test_the_pipes_poll_every_shard_four_times_a_second_whatever_the_orders() -> None:
    # 4 GetRecords a second x 3,600 x 730 hours = 10,512,000 a shard-month, at $0.02 per 100,000.
    assert sum(cost_model.pipes_fixed_per_month(shards=1).values()) == pytest.approx(2.1024)
    assert sum(cost_model.pipes_fixed_per_month().values()) == pytest.approx(4.2048)  # two tables' streams


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="variant"):
        cost_model.pipes_cost_per_million_orders(bench_figures(), "input-transformer")


def test_the_relays_table_has_a_column_per_relay_and_the_pipes_fixed_month() -> None:
    table = cost_model.render_relays(bench_figures())
    rows = [line for line in table if line.startswith("|")]

    assert rows[0] == (
        "| Item | stream relay (this project) | baseline relay | Pipe, input transformer "
        "| Pipe + enrichment Lambda |"
    )
    assert all(row.count("|") == 6 for row in rows)
    assert "| EventBridge Pipes | $0.00 | $0.00 | $1.20 | $1.20 |" in rows
    assert rows[-1] == "| **fixed, per month** (2 stream shards) | $0.00 | $0.00 | $4.20 | $4.20 |"
    assert any("EventBridge Pipes costs $0.12" in line for line in table)
    assert "| Item | stream relay (this project)" in cost_model.render(bench_figures())


def test_the_cost_chart_draws_the_enriched_pipe_beside_the_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    stacked: dict[str, list[float]] = {}
    bar = matplotlib.axes.Axes.bar

    def recording_bar(self: Any, x: Any, height: Any, *args: Any, **kwargs: Any) -> Any:
        stacked[kwargs["label"]] = list(height)
        return bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", recording_bar)
    bench = bench_figures()
    charts.write_cost_by_service(bench, [])

    assert all(len(heights) == 4 for heights in stacked.values())  # 3 stores + the pipe
    assert stacked["EventBridge Pipes"] == pytest.approx([0.0, 0.0, 0.0, 1.20])
    pipe_total = cost_model.pipes_cost_per_million_orders(bench, "enrichment")["total"]
    assert sum(heights[3] for heights in stacked.values()) == pytest.approx(pipe_total)
