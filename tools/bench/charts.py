"""`make bench`'s charts, from the run's own figures (matplotlib, no display), written next to the run's
JSON (.bench/*.png) and to docs/images/, where docs/performance.md and the README show them:
- relay-comparison.png: the DynamoDB stream relay, and the PostgreSQL store's polling publisher and
  logical relay side by side (the stream relay's lag is the local stack's relay hop: its poller reads a
  shard as soon as a function writes, sooner than Lambda's 4 reads a second, and is labelled so);
- latency-distribution.png: POST → CONFIRMED and POST → notification of every order of the local
  stack's latency run (a report: the emulators' times, not AWS's);
- cost-by-service.png: cost per million orders by AWS service, for each store and relay, and for the
  DynamoDB store with EventBridge Pipes instead of the relay (priced, not deployed);
- relays-at-aws-latency.png: each relay's events/s per invocation, PutEvents calls per event and events
  out of order with PutEvents answered after 20, 50 and 100 ms (tools/bench/relay_latency.py).
Only what the run measured is drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench import cost_model, relay_latency

RELAYS = ("DynamoDB\nstream relay", "PostgreSQL\npolling", "PostgreSQL\nlogical (WAL)")
COLOURS = ("#4c72b0", "#dd8452", "#55a868")
ORDERS_PER_MONTH = 1_000_000  # the cost panel: a million orders a month, the fixed costs included


def relay_figures(results: dict[str, Any]) -> dict[str, list[float | None]]:
    """The chart's numbers, relay by relay in RELAYS' order (None: not measured for that relay)."""
    postgres = [results["postgres_relays"][relay] for relay in ("polling", "logical")]
    hop = results.get("latency", {}).get("median_hop_ms", {}).get("relay OrderCreated")
    fixed = sum(cost_model.postgres_fixed_per_month().values())
    scale = ORDERS_PER_MONTH / 1_000_000
    return {
        "lag_p50_ms": [hop, *(p["lag"]["p50_ms"] for p in postgres)],
        "lag_p99_ms": [None, *(p["lag"]["p99_ms"] for p in postgres)],
        "events_per_second": [
            results["relay"]["ours"]["events_per_second_median"],
            *(p["throughput"]["events_per_second"] for p in postgres),
        ],
        "sql_statements_per_event": [None, *(p["throughput"]["sql_statements_per_event"] for p in postgres)],
        "database_cpu_ms_per_event": [
            None,
            *(p["throughput"]["database_cpu_ms_per_event"] for p in postgres),
        ],
        "cost_per_month": [
            cost_model.cost_per_million_orders(results, "ours")["total"] * scale,
            *(
                cost_model.postgres_cost_per_million_orders(results, relay)["total"] * scale + fixed
                for relay in ("polling", "logical")
            ),
        ],
    }


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, paths: list[Path]) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
    _pyplot().close(fig)


def write_relay_comparison(results: dict[str, Any], paths: list[Path]) -> None:
    plt = _pyplot()

    figures = relay_figures(results)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2), layout="constrained")
    panels = (
        ("publish lag, ms (p50 bar, p99 tick)", "lag_p50_ms", "{:.0f}"),
        ("events/s, one relay in process", "events_per_second", "{:.0f}"),
        ("database CPU, ms per event", "database_cpu_ms_per_event", "{:.2f}"),
        (f"$ per month at {ORDERS_PER_MONTH / 1e6:.0f}M orders", "cost_per_month", "${:.0f}"),
    )
    for axis, (title, key, label) in zip(axes, panels, strict=True):
        values = figures[key]
        heights = [value or 0.0 for value in values]
        bars = axis.bar(range(len(RELAYS)), heights, color=COLOURS)
        for bar, value in zip(bars, values, strict=True):
            text = label.format(value) if value is not None else "n/a"
            axis.annotate(
                text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom"
            )
        if key == "lag_p50_ms":
            for index, p99 in enumerate(figures["lag_p99_ms"]):
                if p99 is not None:
                    axis.plot([index - 0.3, index + 0.3], [p99, p99], color="black")
                    axis.annotate(f"p99 {p99:.0f}", (index, p99), ha="center", va="bottom", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.set_xticks(range(len(RELAYS)), RELAYS, fontsize=8)
        axis.margins(y=0.2)
    fig.suptitle(
        f"make bench {results['date'][:10]}: the three relays on one machine "
        "(stream relay lag: the local stack's hop, median only)",
        fontsize=11,
    )
    _save(fig, paths)


def write_latency_distribution(results: dict[str, Any], paths: list[Path]) -> None:
    """Cumulative distribution of the latency run's orders (each order a point): where p50 and p99 sit."""
    plt = _pyplot()
    latency = results["latency"]
    fig, axis = plt.subplots(figsize=(8, 4.2), layout="constrained")
    for key, label in (
        ("post_to_confirmed", "POST → CONFIRMED"),
        ("post_to_notification", "POST → notification"),
    ):
        samples = latency[key].get("samples_ms", [])
        if samples:
            share = [(index + 1) / len(samples) for index in range(len(samples))]
            axis.step(
                samples,
                share,
                where="post",
                label=f"{label} (p50 {latency[key]['p50_ms']:.0f} ms, p99 {latency[key]['p99_ms']:.0f} ms)",
            )
    axis.set_xlabel("ms")
    axis.set_ylabel("share of orders")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(
        f"local stack, {latency['offered_rate_per_s']:.0f} orders/s for {latency['seconds']:.0f} s "
        f"({latency['orders_accepted']} orders; emulators' times, not AWS's)",
        fontsize=10,
    )
    _save(fig, paths)


STORES = (("dynamodb", None), ("postgres, polling", "polling"), ("postgres, logical", "logical"))


def cost_by_service(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Cost per million orders by line item (the cost model's), for each store and relay."""
    out: dict[str, dict[str, float]] = {}
    for label, relay in STORES:
        lines = (
            cost_model.cost_per_million_orders(results, "ours")
            if relay is None
            else cost_model.postgres_cost_per_million_orders(results, relay)
        )
        out[label] = {name: value for name, value in lines.items() if name != "total"}
    return out


def cost_with_pipes(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The DynamoDB store with a pipe per table and its enrichment Lambda instead of the relay, by line
    item: priced by the cost model for comparison, not deployed by the template (docs/performance.md)."""
    lines = cost_model.pipes_cost_per_million_orders(results, "enrichment")
    return {"dynamodb,\nPipe + enrichment": {name: value for name, value in lines.items() if name != "total"}}


def write_cost_by_service(results: dict[str, Any], paths: list[Path]) -> None:
    plt = _pyplot()
    costs = {**cost_by_service(results), **cost_with_pipes(results)}
    named = dict.fromkeys(name for lines in costs.values() for name in lines)  # every item once, in order
    services = [name for name in named if any(lines.get(name, 0.0) > 0 for lines in costs.values())]
    fig, axis = plt.subplots(figsize=(9, 4.6), layout="constrained")
    bottoms = [0.0] * len(costs)
    colours = plt.get_cmap("tab20").colors
    for index, service in enumerate(services):
        heights = [c.get(service, 0.0) for c in costs.values()]
        axis.bar(list(costs), heights, bottom=bottoms, label=service, color=colours[index % len(colours)])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for position, total in enumerate(bottoms):
        axis.annotate(f"${total:,.2f}", (position, total), ha="center", va="bottom")
    axis.set_ylabel("$ per million orders (variable)")
    axis.set_title(  # \$: a second dollar sign would open matplotlib's mathtext
        "cost per million orders by service, us-east-1 list prices\nfixed a month on top: postgres "
        f"\\${sum(cost_model.postgres_fixed_per_month().values()):,.2f}, the pipes' stream reads "
        f"\\${sum(cost_model.pipes_fixed_per_month().values()):,.2f}",
        fontsize=10,
    )
    axis.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axis.set_ylim(0, max(bottoms) * 1.15)
    _save(fig, paths)


def write_relays_at_aws_latency(results: dict[str, Any], paths: list[Path]) -> None:
    """The relays at AWS latency (tools/bench/relay_latency.py): each relay's events/s per invocation,
    PutEvents calls per event and events out of order, at each latency the bus answered PutEvents after;
    the targets drawn dashed (events/s at 50 ms, calls per event at every latency)."""
    plt = _pyplot()
    measured = results["relays_at_aws_latency"]
    latencies = sorted({row["putevents_ms"] for rows in measured.values() for row in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), layout="constrained")
    panels: tuple[tuple[str, Callable[[dict[str, Any]], Any], str], ...] = (
        (
            "events/s, one relay invocation as deployed\n(its MemorySize's vCPU share)",
            relay_latency.on_lambda,
            "{:,.0f}",
        ),
        ("PutEvents calls per event", lambda row: row["calls_per_event"], "{:.3f}"),
        ("events out of per-order sequence", lambda row: row["out_of_order"], "{:d}"),
    )
    width = 0.8 / len(RELAYS)

    def offsets(index: int) -> list[float]:
        return [position + (index - (len(RELAYS) - 1) / 2) * width for position in range(len(latencies))]

    for axis, (title, read, label) in zip(axes, panels, strict=True):
        for index, (relay, name, colour) in enumerate(
            zip(relay_latency.RELAYS, RELAYS, COLOURS, strict=True)
        ):
            rows = {row["putevents_ms"]: row for row in measured.get(relay, [])}
            values = [read(rows[ms]) if ms in rows else None for ms in latencies]
            bars = axis.bar(
                offsets(index),
                [value or 0 for value in values],
                width,
                color=colour,
                label=name.replace("\n", " "),
            )
            for bar, value in zip(bars, values, strict=True):
                text = label.format(value) if value is not None else "n/a"
                axis.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        axis.set_title(title, fontsize=10)
        axis.set_xticks(range(len(latencies)), [f"{ms} ms" for ms in latencies])
        axis.set_xlabel("PutEvents answered after")
        axis.margins(y=0.2)
    if relay_latency.TARGET_LATENCY_MS in latencies:  # events/s targets: one dashed line per value
        at = latencies.index(relay_latency.TARGET_LATENCY_MS)
        for target in sorted(set(relay_latency.TARGET_EVENTS_PER_S.values())):
            held = [
                i
                for i, r in enumerate(relay_latency.RELAYS)
                if relay_latency.TARGET_EVENTS_PER_S[r] == target
            ]
            left, right = offsets(held[0])[at] - width / 2, offsets(held[-1])[at] + width / 2
            axes[0].plot([left, right], [target, target], color="black", linestyle="--", linewidth=1)
            axes[0].annotate(f"target {target:,} ", (left, target), ha="right", va="center", fontsize=7)
    axes[1].axhline(relay_latency.TARGET_CALLS_PER_EVENT, color="black", linestyle="--", linewidth=0.8)
    worst = max((row["out_of_order"] for rows in measured.values() for row in rows), default=0)
    axes[2].set_ylim(0, max(1, worst * 1.3))
    axes[2].legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"make bench {results['date'][:10]}: the three relays at AWS latency, each relay's code on its real "
        "source (dashed: the targets)",
        fontsize=11,
    )
    _save(fig, paths)
