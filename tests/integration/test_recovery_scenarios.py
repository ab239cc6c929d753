"""The recovery scenarios (tools/chaos/recovery_*.py), small, through the local stack:
`python -m tools.chaos full-batch | stale-redrive | rejected-redrive | replay` run the same code at full
size."""

from __future__ import annotations

from pathlib import Path

from tools.chaos.config import ChaosConfig
from tools.chaos.recovery_after_chaos import replay_after_chaos
from tools.chaos.recovery_full_batch import FullBatchPoison
from tools.chaos.recovery_redrive import RejectedRedrive, StaleRedrive
from tools.chaos.recovery_scenarios import render
from tools.chaos.report import render as render_run
from tools.local.services.emulators import LocalServices


def test_one_poison_at_position_3_of_a_full_batch_of_100_is_parked_whole_and_the_99_published(
    local_services: LocalServices, tmp_path: Path
):
    report = FullBatchPoison(tmp_path, local_services).run()

    assert report["passed"], render(report)
    figures = report["figures"]
    assert figures["records_per_invocation"] == [100]  # one batch, one invocation: nothing retried
    assert figures["relay_responses"] == [{"batchItemFailures": []}]
    assert (figures["published_distinct"], figures["puts_on_the_bus"]) == (99, 99)
    assert (figures["poison_queue_messages"], figures["relay_dlq_messages"]) == (1, 0)


def test_a_redrive_of_a_batch_older_than_the_outbox_ttl_exits_1_names_the_ttl_and_keeps_the_message(
    local_services: LocalServices, tmp_path: Path
):
    report = StaleRedrive(tmp_path, local_services).run()

    assert report["passed"], render(report)
    figures = report["figures"]
    assert figures["exit_code"] == 1
    assert "outbox TTL horizon" in figures["report"]["missing"][0]
    assert figures["relay_dlq_messages_after"] == 1
    assert figures["control_exit_code"] == 0  # inside the TTL, the same trimmed shard is redriven


def test_redrive_poison_while_the_bus_still_refuses_the_record_keeps_it_and_after_the_fix_republishes_it(
    local_services: LocalServices, tmp_path: Path
):
    report = RejectedRedrive(tmp_path, local_services).run()

    assert report["passed"], render(report)
    figures = report["figures"]
    assert (figures["before_fix_exit_code"], figures["after_fix_exit_code"]) == (1, 0)
    assert figures["before_fix_report"]["published"] == 0
    assert figures["deliveries_of_the_refused_event"] == 1


def test_a_2_day_replay_of_both_tables_after_a_chaos_run_repeats_no_effect_and_no_notification(
    local_services: LocalServices, tmp_path: Path
):
    # No poison on purpose: the drain would wait maxReceiveCount visibility timeouts for the malformed
    # messages; test_chaos.py covers them. Every fault kind is still injected.
    config = ChaosConfig(
        orders=10,
        seed=5,
        out_dir=tmp_path,
        quiet=True,
        max_receive_count=3,
        inject_poison=False,
        stack_name="chaosreplay",
    )

    report = replay_after_chaos(config, services=local_services)

    assert report["passed"], render_run(report)
    epilogue = report["epilogue"]
    assert epilogue["passed"], epilogue["problems"]
    notes = epilogue["figures"]["notifications before / after"].split(" / ")
    assert notes[0] == notes[1] != "0"
    assert epilogue["figures"]["events replayed"] == report["events"]["outbox"]
