"""The table a person reads after `make chaos` (the same figures are in .chaos/latest.json)."""

from __future__ import annotations

from typing import Any


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


def render(report: dict[str, Any]) -> str:
    summary = report["summary"]
    timings = report["timings"]
    events = report["events"]
    lines = [
        f"chaos run: seed {report['seed']}, {report['orders_requested']} orders, relay parallelization "
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
        _row("phantom events", summary["phantom"]),
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
            f"messages {summary['relay_poison_queue_messages']}",
        ),
        _row("relay DLQ (must stay empty)", summary["relay_dlq"]),
        _row("consumer DLQs", summary["consumer_dlqs"]),
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
        *_epilogue(report.get("epilogue")),
        "",
        f"result: {'PASS' if report['passed'] else 'FAIL'}   (run directory {report['run_dir']})",
    ]
    return "\n".join(lines)
