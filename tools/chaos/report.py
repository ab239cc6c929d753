"""The table a person reads after `make chaos` (the same figures are in .chaos/latest.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tools.chaos import chart


def _row(label: str, value: Any) -> str:
    return f"  {label:<44} {value}"


def _epilogue(epilogue: dict[str, Any] | None) -> list[str]:
    """What ran after the checks (e.g. the replay scenario): its figures and checks."""
    if not epilogue:
        return []
    lines = [f"after the run: {epilogue.get('name', 'epilogue')}"]
    lines += [_row(name, value) for name, value in epilogue.get("figures", {}).items()]
    for name, ok in epilogue.get("checks", {}).items():
        lines.append(f"  [{'ok  ' if ok else 'FAIL'}] {name}")
    lines += [f"           {problem}" for problem in epilogue.get("problems", [])[:10]]
    return lines


def _postgres(report: dict[str, Any]) -> list[str]:
    """OrderStore=postgres: the rows, the publishers, the restart, the poison rows; what was not injected."""
    figures = report.get("postgres")
    if not figures:
        return []
    rows, lag, again = figures["outbox_rows"], figures["publish_lag_seconds"], figures["republished"]
    publishers, restart = figures["publishers"], figures["database_restart"]
    logical = report.get("postgres_relay") == "logical"
    lines = [
        f"order store: postgres, relay {report.get('postgres_relay', 'polling')}",
        _row(
            "outbox rows behind the slot / parked / in the slot"
            if logical
            else "outbox rows published / parked / pending",
            f"{rows['published']} / {rows['parked']} / {rows['pending']}"
            + (f" (slot holds {figures.get('slot_rows')} rows)" if logical else ""),
        ),
        _row(
            f"publish lag p50 / p99 / max (s), to {figures.get('publish_lag_to', 'marked published')}",
            f"{lag.get('p50')} / {lag.get('p99')} / {lag.get('max')}",
        ),
        *(
            [
                _row(
                    "lag to the bus capture p50 / p99 / max (s)",
                    f"{capture.get('p50')} / {capture.get('p99')} / {capture.get('max')}",
                )
            ]
            if (capture := figures.get("bus_capture_lag_seconds")) and not logical
            else []
        ),
        _row(
            "order events put twice or more (after a crash before "
            + ("the advance)" if logical else "COMMIT)"),
            f"{again['order_events_put_more_than_once']} "
            f"({again['after_a_crash_between_put_events_and_commit']})",
        ),
    ]
    if "confirmed_by_an_advance_then_crash" in again:
        lines.append(
            _row(
                "events an advance confirmed before a crash: put again",
                f"{again['of_them_put_more_than_once']} of {again['confirmed_by_an_advance_then_crash']}",
            )
        )
    lines.append(_row("inbox rows (order-status consumer)", figures["inbox_rows"]))
    for phase in publishers.get("phases", []):
        readers = phase.get("slot_readers_peak")
        lines.append(
            _row(
                f"publishers at once, {phase['phase']}",
                f"target {phase['target']}: peak {phase['peak']}, {phase['seconds_at_target_or_more']} of "
                f"{phase['seconds']} s at the target or more"
                + (f"; reading the slot at once: peak {readers}" if readers is not None else ""),
            )
        )
    slot = publishers.get("slot")
    if slot:
        lines.append(
            _row(
                "slot's lock: sessions that held it; samples held",
                f"{slot['sessions_that_read_it']}; {slot['samples_with_a_reader']} of {slot['samples']} "
                f"(peak {slot['readers_at_once_peak']} at once)",
            )
        )
    if publishers:
        lines.append(
            _row(
                "publishers: seconds at each count; direct invocations",
                f"{publishers['seconds_at']}; {publishers['direct_invocations_started']} started, "
                f"{publishers['direct_invocations_ended']} ended before the checks "
                f"(errors {publishers['direct_invocation_errors'] or 'none'})",
            )
        )
    if restart:
        lines.append(
            _row(
                "database restart: at order / outage (s)",
                f"{(restart['at_order'] or 0) + 1} / {restart['outage_seconds']} "
                f"(down {restart['down_seconds']} s)",
            )
        )
        lines.append(
            _row(
                "503 answers: in the outage / 10 s after / all",
                f"{restart.get('answers_503_during_outage')} of "
                f"{restart.get('answers_during_outage')} answers / "
                f"{restart.get('answers_503_within_10s_after')} / {restart['answers_503']}",
            )
        )
    for row in figures["poison_rows"]:
        owner = "a real order" if row["real_order"] else "a made-up order"
        lines.append(
            _row(
                f"poison row ({row['variant']}, {owner})",
                f"{row['state']}, parked {row['parked_times']}x; later events of other orders "
                f"{row['later_events_of_other_orders']}, published {row['of_them_published']} "
                "(publish lag of those written in the next 10 s: max "
                f"{row['publish_lag_max_of_those_written_10s_after']} s)",
            )
        )
    for function, kinds in report.get("faults_not_applicable", {}).items():
        lines.append(_row(f"not injected in {function}", ", ".join(kinds)))
    return lines


def _operations(report: dict[str, Any]) -> list[str]:
    """The relay operations (tools/chaos/relay_operations.py): the replays, each switch, the crashes."""
    figures = report.get("relay_operations")
    if not figures:
        return []
    lines = ["relay operations"]
    for replay in figures["replays"]:
        lag = replay["order_events_written_until_then"]
        lags = " / ".join(str(lag["bus_capture_lag_seconds"].get(q)) for q in ("p50", "p99", "max"))
        lines += [
            _row(
                f"{replay['label']} at order {replay['at_order']}: events replayed",
                f"{replay['replayed']} (left out parked {replay['left_out_parked']}; pending "
                f"{replay['left_out_pending']}" + (f"; {replay['error']}" if replay["error"] else "") + ")",
            ),
            _row(
                "  answered (s); its set: rows at most, empty after (s)",
                f"{replay['answered_seconds']} ({replay['still_pending_when_it_answered']} still pending); "
                f"{replay['set_rows_peak']}, {replay['set_empty_seconds']}",
            ),
            _row("  every replayed event on the bus again after (s)", replay["all_back_on_the_bus_seconds"]),
            _row(
                "  order events written meanwhile: lag p50/p99/max",
                f"{lag['events']}: {lags} s",
            ),
        ]
    for switch in figures["switches"]:
        handed = switch["rows_handed_over"]
        met = switch["replay_set_rows_at_start"]
        lines.append(
            _row(
                f"switch {switch['label']} at order {switch['due_at_order'] + 1}",
                f"{switch['status'] or 'no answer'} in {switch['seconds']} s"
                + (
                    f" at deploy {switch['attempts']} ({len(switch['failed'])} FAILED, rolled back)"
                    if switch["failed"]
                    else ""
                )
                + (f", {handed} rows handed over" if handed is not None else "")
                + (f" (a replay set held {met} rows)" if met else ""),
            )
        )
    for point, fates in figures["crashes_around_switch_steps"].items():
        lines.append(
            _row(f"  publisher crash {point}", ", ".join(f"{n} {fate}" for fate, n in fates.items()))
        )
    for kind, by_set in figures["crashes_around_replay_sets"].items():
        lines.append(_row(f"  {kind}", ", ".join(f"{n} ({k})" for k, n in by_set.items()) or "0"))
    for error in figures["errors"]:
        lines.append(_row("harness error", error))
    return lines


def render(report: dict[str, Any]) -> str:
    summary = report["summary"]
    timings = report["timings"]
    events = report["events"]
    lines = [
        f"chaos run: seed {report['seed']}, {report['orders_requested']} orders, "
        f"order store {report.get('order_store', 'dynamodb')}"
        + (f" ({report['postgres_relay']} relay)" if "postgres_relay" in report else "")
        + ", relay parallelization "
        f"{report.get('relay_parallelization_factor', 1)} ({report['machine']['cores']} cores, "
        f"load {report['machine']['load_average'][0]:.1f})",
        "",
        "orders",
        *(_row(status, count) for status, count in report["orders"].items()),
        "events",
        _row(
            "outbox events (orders table / inventory table)",
            f"{events['outbox']} ({events['outbox_orders_table']} / {events['outbox_inventory_table']})",
        ),
        _row("distinct events on the bus", events["bus_distinct"]),
        _row(
            "puts on the bus (repeats from relay retries)",
            f"{events['bus_deliveries']} ({events['bus_repeats']})",
        ),
        _row("repeats by source", events.get("bus_repeats_by_source", {})),
        _row("late duplicate deliveries to consumers", events["duplicates_delivered_to_consumers"]),
        "faults injected",
        *(_row(kind, count) for kind, count in report["faults"].items()),
        _row(
            "(stale cancels that raced an order change)",
            report["summary"]["stale_cancels_that_raced_a_change"],
        ),
        "client",
        *(_row(name, count) for name, count in report["client"].items()),
        "invariants",
        _row("lost events", summary["lost"]),
        _row(
            "outbox rows left in the replication slot"
            if report.get("postgres_relay") == "logical"
            else "outbox rows left pending (PostgreSQL)",
            summary.get("pending_rows", 0),
        ),
        _row("phantom events", summary["phantom"]),
        _row(
            "aggregates whose events reached the bus out of order", summary.get("published_out_of_order", 0)
        ),
        _row("duplicate effects", summary["duplicate_effects"]),
        _row("stock mismatches", summary["stock_mismatches"]),
        _row(
            "notification repeats in the documented window",
            f"{summary['notification_window_duplicates']} "
            f"(crashes injected there: {summary['notification_window_crashes_injected']})",
        ),
        _row(
            "repeats after deaths or lost answers nobody injected",
            f"{summary['notification_repeats_after_uninjected_deaths']} "
            f"(uninjected deaths: {report['uninjected_deaths'] or 'none'}; "
            f"lost Publish answers: {summary.get('lost_publish_responses_observed', 0)})",
        ),
        _row(
            "relay poison queue: parked whole (injected)",
            f"{summary['relay_poison_queue']} ({summary['poison_injected']}); "
            f"messages {summary['relay_poison_queue_messages']}, "
            f"{summary['relay_poison_queue_parked_again']} of them parked again "
            "(a rolled-back round, a relay that died)",
        ),
        _row("relay DLQ (must stay empty)", summary["relay_dlq"]),
        _row("consumer DLQs", summary["consumer_dlqs"]),
        *_postgres(report),
        *_operations(report),
    ]
    for name, check in report["invariants"].items():
        mark = "ok  " if check["ok"] else "FAIL"
        lines.append(f"  [{mark}] {name}: {check['description']}")
        for example in check["examples"]:
            lines.append(f"           {example}")
        if check["violations"] > len(check["examples"]):
            lines.append(f"           ... {check['violations'] - len(check['examples'])} more")
    lines += [
        "time",
        _row(
            "start-up / drive / drain / total (s)",
            f"{timings.get('startup_seconds')} / {timings.get('drive_seconds')} / "
            f"{timings.get('drain_seconds')} / {timings.get('total_seconds')}",
        ),
        *([_row("after the run (s)", timings["epilogue_seconds"])] if "epilogue_seconds" in timings else []),
        _row("drained within the bound", report["drained"]),
        *([_row("chart (timeline of the run)", report["chart"])] if report.get("chart") else []),
        *(
            [_row("chart (timeline of the run)", f"not drawn: {error}")]
            if (error := report.get("chart_error"))
            else []
        ),
        *_epilogue(report.get("epilogue")),
        "",
        f"result: {'PASS' if report['passed'] else 'FAIL'}   (run directory {report['run_dir']})",
    ]
    return "\n".join(lines)


def save(report: dict[str, Any], path: Path) -> None:
    """The report as JSON at `path` and, when it has a timeline, its chart beside it (chart.png_beside),
    named in the report ("chart"). A chart that cannot be drawn is named as such (report["chart_error"]),
    and the JSON is written all the same: a run's figures outlive a plotting failure."""
    if "timeline" in report:
        png = chart.png_beside(path)
        try:
            report["chart"] = str(chart.write(report, png))
        except Exception as exc:  # noqa: BLE001 - the run's JSON is written whatever matplotlib does
            report["chart"] = None
            report["chart_error"] = repr(exc)
            print(f"warning: the chart of the run was not drawn: {exc!r}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
