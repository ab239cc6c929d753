"""A small chaos run (tools/chaos/, `make chaos`) through the local stack: every fault kind is injected, the
pipeline drains, and every invariant holds. `make chaos` runs the same harness at full size."""

from __future__ import annotations

from pathlib import Path

from botocore.client import BaseClient

from tools.chaos import faults
from tools.chaos.harness import ChaosConfig, run
from tools.chaos.plan import HARNESS_KINDS, PLAN_ENV, WORKER_KINDS
from tools.chaos.report import render
from tools.local.services.emulators import LocalServices


def test_without_a_plan_nothing_is_wrapped():
    before = vars(BaseClient)["_make_api_call"]

    assert faults.install({}) is None
    assert faults.install({PLAN_ENV: "", "AWS_LAMBDA_FUNCTION_NAME": "chaos-OrdersApiFunction"}) is None
    assert vars(BaseClient)["_make_api_call"] is before


def test_a_small_chaos_run_loses_nothing_and_applies_every_effect_once(
    local_services: LocalServices, tmp_path: Path
):
    # Three receives instead of five: the malformed messages reach their DLQs sooner (the run stays short).
    config = ChaosConfig(orders=40, seed=11, out_dir=tmp_path, quiet=True, max_receive_count=3)

    report = run(config, services=local_services)

    failed = {name: check["examples"] for name, check in report["invariants"].items() if not check["ok"]}
    assert report["drained"], render(report)
    assert not failed, render(report)
    assert report["passed"]
    # The run exercised what it claims: every kind of fault happened, and the effects were observed.
    assert set(WORKER_KINDS + HARNESS_KINDS) <= set(report["faults"]), report["faults"]
    summary = report["summary"]
    assert summary["notification_window_duplicates"] == summary["notification_window_crashes_injected"] >= 1
    # Poison is parked whole in the relay poison queue, each item once; the relay DLQ (batches older than
    # RelayMaximumRecordAgeSeconds) stays empty.
    assert (
        summary["relay_poison_queue"] == report["faults"]["poison.outbox_item"] == summary["poison_injected"]
    )
    assert summary["relay_poison_queue_messages"] == report["faults"]["poison.outbox_item"]
    assert summary["relay_dlq"] == 0
    assert sum(summary["consumer_dlqs"].values()) == report["faults"]["poison.malformed_message"]
    assert report["events"]["bus_repeats"] >= 1  # the relay's crash after PutEvents re-sent its batch
    assert report["orders"].get("REJECTED", 0) >= 1
    assert report["orders"].get("CANCELLED", 0) >= 1
