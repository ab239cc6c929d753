"""`make bench`: relay efficiency, end-to-end latency, cold start and write cost, in one run.

Prints a table and writes .bench/latest.json, or .bench/$BENCH_REPORT (figures, medians, ratios, versions,
machine facts).
Sizes can be lowered for a quick look: BENCH_EVENTS, BENCH_RATE, BENCH_SECONDS, BENCH_SAMPLES,
BENCH_SINGLE_ORDERS, BENCH_LATENCIES_MS, BENCH_LATENCY_STREAM_ORDERS, BENCH_LATENCY_ORDERS; BENCH_PARTS
(comma-separated: stack, relay, relay_latency, cold_start, capacity; all but capacity by default) runs only
those parts (a quick look; the targets of the parts not run read as missed).

`relay_latency` runs each relay's own code on its real source (DynamoDB Local's stream, the embedded
PostgreSQL's outbox and slot) against a bus that answers each PutEvents after 20, 50 and 100 ms
(tools/bench/relay_latency.py, tools/bench/latency_bus.py): events/s per relay invocation, PutEvents calls
per event, events out of per-order sequence.

`capacity` (`make bench-capacity`) is a report, not a target: a ramp of offered rates to the highest one
the local stack keeps up with, with CPU per order by process (tools/bench/capacity.py; BENCH_RAMP in
orders/s, comma-separated, BENCH_STEP_SECONDS, BENCH_DRAIN_SECONDS). The local stack is built for
fidelity to AWS, not for throughput, so its capacity on this machine says little about the product.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from tools.local.reader.artefacts import build_for_host
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import ROOT

sys.path.insert(0, str(ROOT / "layers" / "shared"))
# Powertools reads the namespace when shop.runtime.observability creates its Metrics, on import (the
# polling publisher part imports it with this module): the in-process parts' metrics need one.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Bench")

from shop.adapters import aws
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.runtime import config
from tools.bench import (
    capacity,
    charts,
    cold_start,
    cost_model,
    latency,
    postgres_relays,
    relay_efficiency,
    relay_latency,
    write_cost,
)

OUT_DIR = ROOT / ".bench"
Check = Callable[[dict[str, Any]], bool]
# Targets are what users pay for on AWS: relay calls, write units, cold start (and the cost model they
# feed). The local stack's latency is reported, never a target: it measures moto and DynamoDB Local,
# which are built to behave as AWS documents, not to be fast (issue 20, docs/performance.md).
TARGETS: dict[str, Check] = {
    "relay calls per event <= 0.10": lambda r: r["relay"]["ours"]["put_events_calls_per_event"] <= 0.1001,
    "relay events/s >= 5x baseline": lambda r: r["relay"]["speedup_events_per_second"] >= 5,
    "DynamoDB write units per confirmed order <= 30": lambda r: (
        r["write_cost"].get("wcu_per_confirmed_order", 1e9) <= 30
    ),
    # The default store with this project's relay, priced by the cost model (docs/performance.md).
    "cost per million orders (DynamoDB) <= $30": lambda r: (
        r["cost_per_million_orders"]["ours"]["total"] <= 30
    ),
    # Cold start, as tools/bench/cold_start.py measures it (the ratio in one interpreter, median of fresh
    # interpreters): met only when the median's 95% interval is at or under the target (`meets_target`),
    # so a busy machine cannot flip the verdict. The default store's functions, then OrderStore=postgres's.
    "cold start <= 1.2x import boto3, default store (with .pyc)": lambda r: all(
        s["meets_target"]
        for n, s in r["cold_start"]["subjects"].items()
        if n != cold_start.BOTO3 and not n.endswith(cold_start.POSTGRES_LABEL)
    ),
    "cold start <= 1.3x import boto3, PostgreSQL variants (with .pyc)": lambda r: all(
        s["meets_target"]
        for n, s in r["cold_start"]["subjects"].items()
        if n.endswith(cold_start.POSTGRES_LABEL)
    ),
    # Relays at AWS latency (issue 35; the figures in tools/bench/relay_latency.py): one relay invocation
    # with every PutEvents answered after 50 ms, at the vCPU share its MemorySize buys on Lambda. A stream
    # shard's partition writes about 110 outbox items a second: 400 is over 3x that.
    "stream relay >= 400 events/s at 50 ms a PutEvents": lambda r: _latency_target_met(r, "stream"),
    "polling publisher >= 3,000 events/s at 50 ms a PutEvents": lambda r: _latency_target_met(r, "polling"),
    "logical relay >= 3,000 events/s at 50 ms a PutEvents": lambda r: _latency_target_met(r, "logical"),
    "relays at AWS latency: 0 events out of order (every relay, every latency)": lambda r: all(
        row["out_of_order"] == 0 for row in relay_latency.every_row(r)
    ),
    # 0.10, but for a drain's last call, which may be short (relay_latency.SHORT_CALLS_PER_DRAIN).
    "relays at AWS latency: PutEvents calls per event <= 0.10 (every relay, every latency)": lambda r: all(
        relay_latency.calls_within_target(row) for row in relay_latency.every_row(r)
    ),
}


def _latency_target_met(results: dict[str, Any], relay: str) -> bool:
    row = relay_latency.at(results, relay, relay_latency.TARGET_LATENCY_MS)
    return relay_latency.on_lambda(row) >= relay_latency.TARGET_EVENTS_PER_S[relay]


DEFAULT_PARTS = "stack,relay,relay_latency,cold_start"
PARTS = frozenset({"stack", "relay", "relay_latency", "cold_start", "capacity"})


def parts_to_run(environ: Mapping[str, str]) -> set[str]:
    """BENCH_PARTS, or the default parts (every one but the capacity ramp)."""
    parts = set(filter(None, environ.get("BENCH_PARTS", DEFAULT_PARTS).split(",")))
    if unknown := parts - PARTS:
        raise SystemExit(f"BENCH_PARTS: unknown part(s) {', '.join(sorted(unknown))}; known: {sorted(PARTS)}")
    return parts


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _env_ints(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A comma-separated list of integers, e.g. BENCH_LATENCIES_MS=20,50."""
    raw = os.environ.get(name)
    return tuple(int(value) for value in raw.split(",")) if raw else default


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "java": subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False
        ).stderr.splitlines()[0],
        "load_average_at_start": os.getloadavg(),
    }


def _versions() -> dict[str, str]:
    return {
        name: metadata.version(name) for name in ("boto3", "aws-lambda-powertools", "moto", "aws-sam-cli")
    }


def _seed_stock(stack: LocalStack, sku: str) -> None:
    os.environ.update(
        {
            "AWS_ENDPOINT_URL_DYNAMODB": stack.endpoints.dynamodb,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "INVENTORY_TABLE_NAME": stack.template.physical_name("InventoryTable"),
        }
    )
    config.get_settings.cache_clear()
    aws.reset_clients()
    DynamoInventoryRepository(config.Settings.from_env()).set_stock(sku, 10**9)


def main() -> int:
    OUT_DIR.mkdir(exist_ok=True)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    began = time.monotonic()
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "versions": _versions(),
    }

    parts = parts_to_run(os.environ)
    if parts & {"stack", "capacity"}:
        measured = "one order at a time, latency at a rate it carries" if "stack" in parts else "a warm-up"
        ramp = ", capacity ramp" if "capacity" in parts else ""
        print(f"1/4 the local stack: {measured}{ramp} ...", flush=True)
        _bench_stack(results, latency_runs="stack" in parts, ramp="capacity" in parts)
    if parts & {"relay", "relay_latency"}:
        services = LocalServices(OUT_DIR / "services")
        services.start()
        try:
            if "relay" in parts:
                print("2/4 relay efficiency, the polling publisher and 3/4 write cost ...", flush=True)
                _bench_relay(results, services)
            if "relay_latency" in parts:
                print("2/4 the three relays at AWS latency (PutEvents answered late) ...", flush=True)
                results["relays_at_aws_latency"] = relay_latency.run(
                    services.endpoints.dynamodb,
                    OUT_DIR / "postgres-latency",
                    _env_ints("BENCH_LATENCIES_MS", relay_latency.LATENCIES_MS),
                    _env_int("BENCH_LATENCY_STREAM_ORDERS", relay_latency.STREAM_ORDERS),
                    _env_int("BENCH_LATENCY_ORDERS", relay_latency.POSTGRES_ORDERS),
                )
        finally:
            services.stop()
    if "cold_start" in parts:
        print("4/4 cold start of the built artefacts ...", flush=True)
        host_build = build_for_host(OUT_DIR / "host-build")
        results["cold_start"] = cold_start.run(
            host_build, OUT_DIR / "cold-start", _env_int("BENCH_SAMPLES", cold_start.SAMPLES)
        )

    if {"relay", "cold_start"} <= parts:
        results["cost_per_million_orders"] = {
            relay: cost_model.cost_per_million_orders(results, relay) for relay in ("ours", "baseline")
        }
    _write_charts(results)
    # The capacity report alone has no target: none is listed as missed then.
    targeted = bool(parts - {"capacity"})
    results["targets"] = {name: _met(check, results) for name, check in TARGETS.items()} if targeted else {}
    results["seconds"] = time.monotonic() - began
    report = OUT_DIR / os.environ.get("BENCH_REPORT", "latest.json")  # a name in .bench/, or a path
    results["report"] = str(report.relative_to(ROOT) if report.is_relative_to(ROOT) else report)
    report.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))
    if "cost_per_million_orders" in results:
        print()
        print(cost_model.render(results))
    return 0


def _bench_relay(results: dict[str, Any], services: LocalServices) -> None:
    """Relay efficiency, write cost and the PostgreSQL store's two relays, on the services."""
    results["relay"] = relay_efficiency.run(services.endpoints.moto, _env_int("BENCH_EVENTS", 10_000), 100)
    results["write_cost"] = write_cost.run(services.endpoints.dynamodb, services.endpoints.moto, 200)
    # OrderStore=postgres: its two relays (polling, logical) on a real PostgreSQL, beside the relay.
    results["postgres_relays"] = postgres_relays.run(
        services.endpoints.moto,
        OUT_DIR / "postgres",
        _env_int("BENCH_PUBLISHER_ORDERS", 2000),
        float(_env_int("BENCH_PUBLISHER_RATE", 10)),
        float(_env_int("BENCH_PUBLISHER_SECONDS", 10)),
    )


def _write_charts(results: dict[str, Any]) -> None:
    """Each chart next to the run's JSON and in docs/images (tools/bench/charts.py): the relay comparison,
    cost and latency ones from a run of the relay and cold start parts together (their figures feed the
    cost model), the relays at AWS latency whenever that part ran (its figures are its own)."""
    drawn: list[tuple[str, Callable[[dict[str, Any], list[Path]], None]]] = []
    if "cost_per_million_orders" in results:
        drawn += [
            ("relay-comparison.png", charts.write_relay_comparison),
            ("cost-by-service.png", charts.write_cost_by_service),
        ]
        if "latency" in results:
            drawn.append(("latency-distribution.png", charts.write_latency_distribution))
    if "relays_at_aws_latency" in results:
        drawn.append(("relays-at-aws-latency.png", charts.write_relays_at_aws_latency))
    for name, draw in drawn:
        draw(results, [OUT_DIR / name, ROOT / "docs" / "images" / name])


def _met(check: Check, results: dict[str, Any]) -> bool:
    """A target of a part that did not run (BENCH_PARTS) reads as missed."""
    try:
        return bool(check(results))
    except KeyError:
        return False


def _bench_stack(results: dict[str, Any], latency_runs: bool, ramp: bool) -> None:
    """On one stack: one order at a time after start-up, latency at BENCH_RATE orders/s and one order at
    a time on the warmed stack (latency_runs), then the capacity ramp (ramp). All of it a report."""
    stack = LocalStack(options=StackOptions(api_port=0, data_dir=OUT_DIR / "stack"))
    stack.start()
    try:
        _seed_stock(stack, "SKU-BENCH")
        single_orders = _env_int("BENCH_SINGLE_ORDERS", 20)
        # 4/s: a rate the stack without its old speed-ups carries on 2 cores (about 5-6 orders/s), so the
        # figures read as latency, not as a queue growing (docs/performance.md).
        rate = float(_env_int("BENCH_RATE", 4))
        scale_out_seconds = float(_env_int("BENCH_SCALE_OUT_SECONDS", 15))
        if latency_runs:
            # Right after start-up DynamoDB Local's JIT and every process are still warming up: reported
            # apart.
            results["single_order_after_start"] = capacity.one_at_a_time(stack, "SKU-BENCH", single_orders)
            # The first seconds at the rate scale each function out from the one environment the single
            # orders left warm: their cold starts are in this run's tail, reported apart
            # (latency_scale_out). The latency reported is the steady state that follows, at the same
            # rate, on the same stack.
            results["latency_scale_out"] = latency.run(stack, "SKU-BENCH", rate, scale_out_seconds)
            results["latency"] = latency.run(stack, "SKU-BENCH", rate, float(_env_int("BENCH_SECONDS", 30)))
            # One order at a time on the stack warmed by the runs above.
            results["single_order"] = capacity.one_at_a_time(stack, "SKU-BENCH", single_orders)
        if ramp:
            if not latency_runs:  # the ramp's first step should not pay the functions' scale-out
                results["capacity_warm_up"] = latency.run(stack, "SKU-BENCH", rate, scale_out_seconds)
            rates = [float(r) for r in os.environ.get("BENCH_RAMP", "10,20,30,40,50,60,70,80").split(",")]
            results["capacity"] = capacity.run(
                stack,
                "SKU-BENCH",
                rates,
                float(_env_int("BENCH_STEP_SECONDS", 20)),
                float(_env_int("BENCH_DRAIN_SECONDS", 5)),
            )
    finally:
        stack.stop()


def render(results: dict[str, Any]) -> str:
    lines = [f"make bench  {results['date']}  {results['machine']['cpu']} x{results['machine']['cores']}"]
    if "relay" in results:
        lines += ["", *_render_relay(results["relay"])]
    if "postgres_relays" in results:
        for relay, figures in results["postgres_relays"].items():
            lines += ["", *_render_postgres_relay(relay, figures)]
    if "relays_at_aws_latency" in results:
        lines += ["", *relay_latency.render(results["relays_at_aws_latency"])]
    if "latency" in results:
        lines += ["", *_render_stack(results)]
    if "capacity" in results:
        lines += ["", *_render_capacity(results["capacity"])]
    if "cold_start" in results:
        lines += [
            "",
            "cold start (median ms)         as shipped   with .pyc   ratio vs boto3 (.pyc)   95% interval",
        ]
        for name, figures in results["cold_start"]["subjects"].items():
            interval = figures.get("ratio_ci95_with_pyc")
            shown = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else ""
            lines.append(
                f"  {name:<28} {figures['as_shipped_ms']:>8.0f} {figures['with_pyc_ms']:>10.0f} "
                f"{figures['ratio_to_boto3_with_pyc']:>12.3f}   {shown:>14}"
            )
    if "write_cost" in results:
        cost = results["write_cost"]
        lines += [
            "",
            f"write cost: create {cost['create']['wcu_aws']:.0f} WCU, "
            f"cancel {cost['cancel']['wcu_aws']:.0f} WCU (AWS billing of DynamoDB Local's units)",
        ]
        for function, figures in cost["consumers"].items():
            lines.append(
                f"  {function:<24} {figures['dynamodb_calls_per_event']:.1f} DynamoDB calls, "
                f"{figures['wcu_aws']:.0f} WCU per event"
            )
    if results["targets"]:
        lines += ["", "targets:"] + [
            f"  {'met ' if ok else 'MISS'} {name}" for name, ok in results["targets"].items()
        ]
    lines.append(f"\n{results['seconds']:.0f} s; figures in {results.get('report', '.bench/latest.json')}")
    return "\n".join(lines)


def _render_relay(relay: dict[str, Any]) -> list[str]:
    lines = ["relay (same records, same endpoint)        ours        baseline"]
    for label, key, fmt in (
        ("PutEvents calls per event", "put_events_calls_per_event", ".4f"),
        ("records delivered per order", "records_delivered_per_order", ".2f"),
        ("CPU ms per 1000 events", "cpu_ms_per_1000_events", ".0f"),
        ("events/s (median of slices)", "events_per_second_median", ".0f"),
    ):
        lines.append(f"  {label:<34} {relay['ours'][key]:>10{fmt}} {relay['baseline'][key]:>12{fmt}}")
    lines.append(f"  speed-up                           {relay['speedup_events_per_second']:>10.1f}x")
    return lines


def _render_postgres_relay(relay: str, figures: dict[str, Any]) -> list[str]:
    throughput, lag = figures["throughput"], figures["lag"]
    return [
        f"{relay} relay (OrderStore=postgres, PostgresRelay={relay}, real PostgreSQL): "
        f"{throughput['events']} events of {throughput['orders']} orders",
        f"  PutEvents calls per event {throughput['put_events_calls_per_event']:.4f}, "
        f"SQL statements per event {throughput['sql_statements_per_event']:.3f}, "
        f"{throughput['events_per_second']:.0f} events/s in process",
        f"  database CPU: {throughput['database_cpu_ms_per_event']:.3f} ms per event published, "
        f"{throughput['database_write_cpu_ms_per_order']:.2f} ms per order written",
        f"  publish lag (write → bus, {lag['offered_rate_per_s']:.0f} orders/s for {lag['seconds']:.0f} s): "
        f"p50 {lag['p50_ms']:.0f} ms, p99 {lag['p99_ms']:.0f} ms",
    ]


def _render_stack(results: dict[str, Any]) -> list[str]:
    single = results["single_order"]
    lat = results["latency"]
    after_start = results.get("single_order_after_start") or single
    lines = [
        "local stack (a report, no target: it times moto and DynamoDB Local, not AWS)",
        f"one warm order at a time: POST->CONFIRMED median {single['median_ms']:.0f} ms, "
        f"p90 {single['p90_ms']:.0f} ms ({single['orders']} orders, after the latency runs; right after "
        f"start-up: median {after_start['median_ms']:.0f} ms, p90 {after_start['p90_ms']:.0f} ms)",
        f"latency at {lat['offered_rate_per_s']:.0f} orders/s offered for {lat['seconds']:.0f} s "
        f"(achieved {lat['achieved_rate_per_s']:.1f}/s)",
    ]
    for name in ("post_to_confirmed", "post_to_notification"):
        figures = lat.get(name) or {}
        if figures:
            lines.append(
                f"  {name:<24} p50 {figures['p50_ms']:>7.0f} ms  p95 {figures['p95_ms']:>7.0f} ms  "
                f"p99 {figures['p99_ms']:>7.0f} ms"
            )
    scale_out = results.get("latency_scale_out", {}).get("post_to_confirmed")
    if scale_out:
        seconds = results["latency_scale_out"]["seconds"]
        lines.append(
            f"  before it, scaling out ({seconds:.0f} s from one warm environment per function): "
            f"POST->CONFIRMED p50 {scale_out['p50_ms']:.0f} ms  p95 {scale_out['p95_ms']:.0f} ms  "
            f"p99 {scale_out['p99_ms']:.0f} ms"
        )
    lines.append(
        f"  dominant hop: {lat['dominant_hop']}  (medians: "
        + ", ".join(f"{hop} {ms:.0f} ms" for hop, ms in lat["median_hop_ms"].items())
        + ")"
    )
    return lines


def _render_capacity(ramp: dict[str, Any]) -> list[str]:
    lines = [
        f"saga capacity {ramp['orders_per_s']:.0f} orders/s (a report, no target; steps of "
        f"{ramp['step_seconds']:.0f} s, drain {ramp['drain_seconds']:.0f} s)"
    ]
    for step in ramp["steps"]:
        lines.append(
            f"  {step['offered_rate_per_s']:>4.0f}/s {'kept up ' if step['kept_up'] else 'BEHIND  '}"
            f"p50 {step['confirmed_p50_ms'] or 0:>6.0f} ms  p99 {step['confirmed_p99_ms'] or 0:>6.0f} ms  "
            f"CPU {step['cpu_ms_per_order_total']:>5.0f} ms/order  load {step['load_average_before']:.1f}"
        )
    steps = ramp["steps"]
    if steps:
        shown = [steps[0], steps[-1]] if len(steps) > 1 else steps
        lines.append(
            "  CPU ms per order by process  " + "".join(f"{s['offered_rate_per_s']:>8.0f}/s" for s in shown)
        )
        for name in sorted({n for s in shown for n in s["cpu_ms_per_order"]}):
            lines.append(
                f"    {name:<32}" + "".join(f"{s['cpu_ms_per_order'].get(name, 0.0):>10.1f}" for s in shown)
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
