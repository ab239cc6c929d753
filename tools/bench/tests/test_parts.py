"""Which parts `make bench` runs (tools/bench/__main__.py): the local stack's capacity ramp is a report
of its own (`make bench-capacity`), not a default part, and no target reads it nor the stack's latency."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench.__main__ import TARGETS, _render_capacity, parts_to_run


def test_the_capacity_ramp_is_not_a_default_part() -> None:
    assert parts_to_run({}) == {"stack", "relay", "relay_latency", "cold_start"}


def test_the_capacity_ramp_runs_when_asked_for() -> None:
    assert parts_to_run({"BENCH_PARTS": "capacity"}) == {"capacity"}
    assert parts_to_run({"BENCH_PARTS": "stack,capacity"}) == {"stack", "capacity"}


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown part"):
        parts_to_run({"BENCH_PARTS": "stack,capcity"})


def test_no_target_reads_the_local_stack() -> None:
    # Every target is decided on AWS-side figures alone: the local stack's latency and capacity are
    # reports (they time the emulator), so results without them still decide every target.
    aws_side_only = {
        "relay": {"ours": {"put_events_calls_per_event": 0.1}, "speedup_events_per_second": 6},
        "write_cost": {"wcu_per_confirmed_order": 30},
        "cost_per_million_orders": {"ours": {"total": 29.0}},
        "cold_start": {
            "subjects": {
                "import boto3": {},
                "F": {"ratio_to_boto3_with_pyc": 1.2, "meets_target": True},
                "F [postgres]": {"ratio_to_boto3_with_pyc": 1.3, "meets_target": True},
            }
        },
        "relays_at_aws_latency": {
            relay: [
                {
                    "putevents_ms": 50,
                    "events_per_s": 3000,
                    "calls_per_event": 0.1,
                    "out_of_order": 0,
                    "events": 4400,
                    "calls": 440,
                }
            ]
            for relay in ("stream", "polling", "logical")
        },
    }
    assert all(check(aws_side_only) for check in TARGETS.values())


def test_the_capacity_report_renders_its_steps() -> None:
    step = {
        "offered_rate_per_s": 10.0,
        "kept_up": True,
        "confirmed_p50_ms": 80.0,
        "confirmed_p99_ms": 200.0,
        "cpu_ms_per_order_total": 70.0,
        "cpu_ms_per_order": {"moto server": 20.0},
        "load_average_before": 1.0,
    }
    ramp = {"orders_per_s": 10.0, "step_seconds": 20.0, "drain_seconds": 5.0, "steps": [step]}

    text = "\n".join(_render_capacity(ramp))

    assert "saga capacity 10 orders/s (a report, no target" in text
    assert "moto server" in text


def test_each_cold_start_target_reads_its_own_functions_verdicts() -> None:
    default = TARGETS["cold start <= 1.2x import boto3, default store (with .pyc)"]
    postgres = TARGETS["cold start <= 1.3x import boto3, PostgreSQL variants (with .pyc)"]

    def results(**met: bool) -> dict[str, Any]:
        subjects = {name.replace("_pg", " [postgres]"): {"meets_target": m} for name, m in met.items()}
        return {"cold_start": {"subjects": {"import boto3": {"meets_target": True}, **subjects}}}

    assert default(results(Api=True, Publisher_pg=False)) is True
    assert postgres(results(Api=True, Publisher_pg=False)) is False
    assert default(results(Api=False, Publisher_pg=True)) is False
    assert postgres(results(Api=False, Publisher_pg=True)) is True
