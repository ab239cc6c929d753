"""The pictures of a chaos run, without a stack: its live line (tools/chaos/progress.py) on a terminal and
in a log, and its chart (tools/chaos/timeline.py, tools/chaos/chart.py) from a small made-up run. Here,
not in tests/unit: the product's unit tests import no chaos tooling (tests/unit/test_architecture.py).
tests/integration/test_chaos.py's small run writes a real one."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tools.chaos import chart, timeline
from tools.chaos.bus import CapturedEvent
from tools.chaos.driver import Answer, OrderOutcome, OrderScript
from tools.chaos.progress import Counts, ProgressLine, bar, plain_line, terminal_line
from tools.chaos.report import save

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def counts(**changes: Any) -> Counts:
    values: dict[str, Any] = {
        "phase": "drive",
        "orders": 200,
        "sent": 120,
        "settled": 95,
        "faults": 23,
        "rule_breaks": 0,
        "uninjected_deaths": 0,
        "elapsed": 42.4,
    }
    return Counts(**{**values, **changes})


# --- the live line ------------------------------------------------------------------------------------
def test_the_bar_fills_settled_then_sent_of_the_runs_orders():
    assert bar(counts(sent=0, settled=0), width=10) == "[..........]"
    assert bar(counts(sent=100, settled=50), width=10) == "[##===.....]"
    assert bar(counts(sent=200, settled=199), width=10) == "[#########=]"  # full only when all are
    assert bar(counts(sent=200, settled=200), width=10) == "[##########]"
    # Never past the end, whatever the counts say (an order sent twice on purpose is one order).
    assert bar(counts(sent=250, settled=210), width=10) == "[##########]"


def test_on_a_terminal_the_line_says_what_is_counted_live_and_never_wraps():
    line = terminal_line(counts(rule_breaks=2, uninjected_deaths=1), columns=200)

    assert line == (
        "drive [#########===........] sent 120/200, settled 95/200, live rule breaks 2 | "
        "deaths not injected 1 | faults 23 | 42 s | invariants: after the drain"
    )
    assert "\n" not in line
    assert "\r" not in line
    # On 80 columns: a shorter bar, and of the rest what fits (a wrapped line could not be redrawn).
    narrow = terminal_line(counts(), columns=80)
    assert narrow == "drive [####==....] sent 120/200, settled 95/200, live rule breaks 0 | faults 23"
    assert len(narrow) < 80
    assert len(terminal_line(counts(), columns=30)) == 29


def test_in_a_log_the_line_is_plain_stamped_and_names_what_only_the_check_knows():
    line = plain_line(counts(phase="drain", sent=200, settled=180), clock="12:00:00")

    assert line == (
        "[chaos 12:00:00] progress (drain, 42 s): 200/200 orders sent, 180 settled (end event on the bus); "
        "23 faults injected; rule breaks seen live 0 (the invariants are checked after the drain)"
    )
    assert "deaths not injected" in plain_line(counts(uninjected_deaths=3))


def test_on_a_terminal_the_line_is_redrawn_in_place_and_messages_go_above_it(
    monkeypatch: pytest.MonkeyPatch,
):
    stream = io.StringIO()
    monkeypatch.setenv("COLUMNS", "200")
    line = ProgressLine(lambda: counts(), stream, terminal=True, redraw_seconds=60)

    line.start()
    line.say("[chaos 12:00:01] restarting the order database")
    line.stop()

    out = stream.getvalue()
    # Drawn, cleared for the message, redrawn, drawn once more at the end and left on its own line.
    assert out.count("\r\x1b[K") == 4
    assert "\r\x1b[K[chaos 12:00:01] restarting the order database\n\r\x1b[Kdrive [" in out
    assert out.endswith("invariants: after the drain\n")
    assert out.count("\n") == 2


def test_in_a_log_lines_are_plain_and_few():
    stream = io.StringIO()
    line = ProgressLine(lambda: counts(), stream, terminal=False, plain_seconds=60)

    line.start()
    line.draw()  # a phase change (the first is the drive's)
    line.say("[chaos 12:00:01] drained")
    line.draw()
    line.stop()

    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert "\x1b" not in stream.getvalue()
    # One per phase change, one at the end: none for the message, nothing between (10 s apart at most).
    assert [text.split("]")[1][:9] for text in lines] == [" progress", " drained", " progress", " progress"]


def test_a_line_that_cannot_be_sampled_says_so_and_the_run_goes_on():
    stream = io.StringIO()

    def broken() -> Counts:
        raise KeyError("capture")

    ProgressLine(broken, stream, terminal=False).draw()

    assert stream.getvalue() == "progress: could not sample the run: KeyError('capture')\n"


def test_a_terminal_is_a_tty_that_is_not_dumb(monkeypatch: pytest.MonkeyPatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm-256color")
    assert ProgressLine(lambda: counts(), Tty()).terminal
    assert not ProgressLine(lambda: counts(), io.StringIO()).terminal
    monkeypatch.setenv("TERM", "dumb")
    assert not ProgressLine(lambda: counts(), Tty()).terminal


# --- the chart ----------------------------------------------------------------------------------------
BEGAN = 1_000.0


def _order_event(order: str, kind: str, at: float, source: str = "shop.orders") -> CapturedEvent:
    detail = {"id": f"{order}-{kind}", "source": source, "type": kind, "subject": order, "sequence": 1}
    return CapturedEvent(detail, 1, first_at=at)


def _outcome(index: int, answers: list[Answer], cancel: str | None = None) -> OrderOutcome:
    script = OrderScript(index, f"key-{index}", {}, double_send=False, cancel=cancel, cancel_delay=0.0)
    return OrderOutcome(script, create_answers=answers)


def made_up_run(*, passed: bool = True) -> dict[str, Any]:
    """Three orders, on PostgreSQL: two settled (one confirmed then cancelled), one still pending; a few
    faults, a database outage, a 500 the client saw."""
    bus = {
        c.detail["id"]: c
        for c in (
            _order_event("o-1", "OrderCreated", BEGAN + 2.0),
            _order_event("o-1", "OrderConfirmed", BEGAN + 5.0),
            _order_event("o-1", "OrderCancelled", BEGAN + 9.0),  # settled at its confirmation
            _order_event("o-2", "OrderRejected", BEGAN + 7.5),
            _order_event("o-3", "InventoryReserved", BEGAN + 6.0, source="shop.inventory"),
        )
    }
    ledger = [
        {"at": BEGAN + 3.0, "kind": "relay.throttle", "function": "OutboxPublisherFunction"},
        {"at": BEGAN + 1.0, "kind": "api.throttle", "function": "OrdersApiFunction"},
        {"at": BEGAN + 4.0, "kind": "relay.throttle", "function": "OutboxPublisherFunction"},
        {"at": BEGAN + 6.5, "kind": "database.restart", "function": "OrderDatabase"},
        {"at": BEGAN + 6.6, "kind": "observed.publish_response_lost", "function": "NotificationFunction"},
        {"at": BEGAN + 8.0, "kind": "bus.duplicate", "function": "InventoryFunction"},
    ]
    outcomes = [
        _outcome(0, [Answer(201, {"orderId": "o-1"}, at=BEGAN + 1.5)]),
        _outcome(1, [Answer(500, {}, problem="unexpected 500: None", at=BEGAN + 4.5)]),
    ]
    report: dict[str, Any] = {
        "passed": passed,
        "drained": passed,
        "seed": 7,
        "orders_requested": 3,
        "order_store": "postgres",
        "postgres_relay": "polling",
        "invariants": {
            "no_lost_events": {"ok": True, "violations": 0},
            "states_consistent": {"ok": passed, "violations": 0 if passed else 1},
        },
    }
    report["timeline"] = timeline.build(
        BEGAN,
        phases={
            "drive_began": BEGAN + 0.5,
            "drive_ended": BEGAN + 6.0,
            "drain_ended": BEGAN + 10.0,
            "checked": BEGAN + 11.0,
        },
        sent=[BEGAN + 0.5, BEGAN + 1.0, BEGAN + 1.5],
        settled=timeline.settled_at(bus).values(),
        ledger=ledger,
        outages=[(BEGAN + 4.0, BEGAN + 6.25)],
        breaks=timeline.rule_breaks(outcomes),
    )
    return report


def test_an_order_settles_when_its_first_end_event_reaches_the_bus():
    run = made_up_run()["timeline"]

    assert run["sent"] == [0.5, 1.0, 1.5]
    assert run["settled"] == [5.0, 7.5]  # o-1 confirmed (its cancel later is no second settling), o-2


def test_the_timeline_keeps_every_injected_fault_by_kind_and_the_outage_in_seconds_since_the_stack_was_up():
    run = made_up_run()["timeline"]

    assert run["faults"] == {
        "api.throttle": [1.0],
        "bus.duplicate": [8.0],
        "database.restart": [6.5],
        "relay.throttle": [3.0, 4.0],
    }  # an observed lost Publish answer is no injected fault
    assert run["outages"] == [[4.0, 6.25]]
    assert run["phases"] == {"drive_began": 0.5, "drive_ended": 6.0, "drain_ended": 10.0, "checked": 11.0}
    assert run["rule_breaks"] == [
        [4.5, "order #1: no 201 within the retry budget"],
        [4.5, "order #1: unexpected 500: None"],
    ]
    json.dumps(run)  # it goes into the report's JSON as it is


def test_the_chart_draws_steps_fault_rows_by_family_the_outage_phases_and_breaks():
    drawn = chart.series(made_up_run())

    assert drawn.title == "make chaos: seed 7, 3 orders, order store postgres (polling relay): PASS"
    assert drawn.orders == 3
    assert drawn.end == 11.0
    # Cumulative steps from (0, 0), carried to the chart's right end.
    assert drawn.sent == ([0.0, 0.5, 1.0, 1.5, 11.0], [0, 1, 2, 3, 3])
    assert drawn.settled == ([0.0, 5.0, 7.5, 11.0], [0, 1, 2, 2])
    # One row per kind, grouped by family (API, relay, ..., bus, database), each naming its count.
    assert [(label, times) for label, _, times in drawn.faults] == [
        ("api.throttle (1)", [1.0]),
        ("relay.throttle (2)", [3.0, 4.0]),
        ("bus.duplicate (1)", [8.0]),
        ("database.restart (1)", [6.5]),
    ]
    assert drawn.faults[0][1] == chart.FAMILIES["api"]
    assert drawn.outages == [(4.0, 6.25)]
    assert drawn.phases == [(0.5, "drive"), (6.0, "drain"), (10.0, "check"), (11.0, "")]
    assert [x for x, _ in drawn.breaks] == [4.5, 4.5]
    assert drawn.failed_checks == []
    assert drawn.checked_at == 11.0


def test_a_failed_run_names_its_failed_invariants_at_the_check_and_an_undrained_one_says_so():
    drawn = chart.series(made_up_run(passed=False))

    assert drawn.title.endswith(": FAIL")
    assert drawn.failed_checks == ["states_consistent (1)"]
    assert (10.0, chart.NOT_DRAINED) in drawn.phases


def test_an_epilogue_after_the_checks_gets_its_own_phase():
    report = made_up_run()
    report["timeline"]["phases"]["epilogue_ended"] = 14.0

    drawn = chart.series(report)

    assert drawn.phases[-2:] == [(11.0, chart.EPILOGUE), (14.0, "done")]
    assert drawn.end == 14.0


def test_the_chart_is_a_png_and_the_report_names_it_beside_its_json(tmp_path: Path):
    report = made_up_run(passed=False)

    written = chart.write(report, tmp_path / "direct.png")
    save(report, tmp_path / "named" / "hot-sku.json")

    assert written.read_bytes()[:8] == PNG_MAGIC
    png = tmp_path / "named" / "hot-sku.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.stat().st_size > 10_000
    assert json.loads((tmp_path / "named" / "hot-sku.json").read_text())["chart"] == str(png)


def test_a_report_without_a_timeline_gets_no_chart(tmp_path: Path):
    save({"passed": True, "scenario": "full-batch"}, tmp_path / "full-batch.json")

    assert sorted(p.name for p in tmp_path.iterdir()) == ["full-batch.json"]
    assert "chart" not in json.loads((tmp_path / "full-batch.json").read_text())


def test_a_chart_that_cannot_be_drawn_leaves_the_json_written_and_says_why(tmp_path: Path):
    report = made_up_run()
    del report["orders_requested"]

    save(report, tmp_path / "latest.json")

    written = json.loads((tmp_path / "latest.json").read_text())
    assert written["chart"] is None
    assert "orders_requested" in written["chart_error"]
    assert not (tmp_path / "latest.png").exists()
