"""The chart of a chaos run (matplotlib, no display), written next to its JSON report (.chaos/latest.png,
.chaos/<name>.png beside .chaos/<name>.json), from the report's timeline (tools/chaos/timeline.py):

- above, orders sent and orders settled (their end event on the bus), cumulative, against the run's
  orders; the client's rule breaks as red crosses at their time, the failed invariants at the check;
- below, every injected fault as a tick on its kind's row (the row says how many);
- on both, the order database's outage shaded (ORDER_STORE=postgres restarts it mid-drive) and the
  phase boundaries (drive, drain, check) as vertical lines.

`series` is what is drawn, as data (the tests read it); `write` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Families of fault kinds (the part of the kind before its dot), top to bottom, each with its colour.
FAMILIES = {
    "api": "#4c72b0",
    "relay": "#dd8452",
    "consumer": "#55a868",
    "notification": "#8172b3",
    "bus": "#937860",
    "poison": "#c44e52",
    "database": "#222222",
    "operation": "#17becf",  # the relay operations (tools/chaos/relay_operations.py)
}
_OTHER = "#7f7f7f"
SENT_COLOUR, SETTLED_COLOUR, BREAK_COLOUR = "#4c72b0", "#2ca02c", "#d62728"
# Each moment of the timeline's phases, and what begins there ("": a line without a label).
PHASE_LABELS = {
    "drive_began": "drive",
    "drive_ended": "drain",
    "drain_ended": "check",
    "checked": "",  # the checks take seconds: the verdict is written there instead
    "epilogue_ended": "done",
}
EPILOGUE = "after the run"  # at "checked", when an epilogue ran (the replay scenario)
NOT_DRAINED = "check (not drained)"


@dataclass
class Series:
    """What the chart draws, in seconds since the stack was up."""

    title: str
    orders: int
    end: float  # the x axis' right end
    sent: tuple[list[float], list[int]]  # step points (x, cumulative count), from (0, 0)
    settled: tuple[list[float], list[int]]
    faults: list[tuple[str, str, list[float]]]  # (row label, colour, times), top row first
    outages: list[tuple[float, float]]
    phases: list[tuple[float, str]]  # (x, what begins there)
    breaks: list[tuple[float, str]]  # the client's rule breaks, at their time
    failed_checks: list[str] = field(default_factory=list)  # "name (n)", marked at the check
    checked_at: float | None = None


def _steps(times: list[float]) -> tuple[list[float], list[int]]:
    ordered = sorted(times)
    return [0.0, *ordered], list(range(len(ordered) + 1))


def _family(kind: str) -> str:
    return kind.split(".", 1)[0]


def _phase_label(moment: str, report: dict[str, Any]) -> str:
    if moment == "drain_ended" and not report.get("drained", True):
        return NOT_DRAINED
    if moment == "checked" and "epilogue_ended" in report["timeline"].get("phases", {}):
        return EPILOGUE
    return PHASE_LABELS.get(moment, moment)


def title(report: dict[str, Any]) -> str:
    store = str(report.get("order_store", "dynamodb"))
    if "postgres_relay" in report:
        store += f" ({report['postgres_relay']} relay)"
    verdict = "PASS" if report.get("passed") else "FAIL"
    return (
        f"make chaos: seed {report['seed']}, {report['orders_requested']} orders, order store {store}: "
        f"{verdict}"
    )


def series(report: dict[str, Any]) -> Series:
    """The chart's data from a report that has a timeline."""
    timeline = report["timeline"]
    phases = timeline.get("phases", {})
    faults: list[tuple[str, str, list[float]]] = []
    families = list(FAMILIES)
    for kind, times in sorted(
        timeline.get("faults", {}).items(),
        key=lambda item: (
            families.index(_family(item[0])) if _family(item[0]) in FAMILIES else len(families),
            item[0],
        ),
    ):
        faults.append((f"{kind} ({len(times)})", FAMILIES.get(_family(kind), _OTHER), sorted(times)))
    everything = [
        *timeline.get("sent", []),
        *timeline.get("settled", []),
        *phases.values(),
        *(t for _, _, times in faults for t in times),
        *(end for _, end in timeline.get("outages", [])),
    ]
    end = max(everything, default=1.0)
    sent, settled = _steps(timeline.get("sent", [])), _steps(timeline.get("settled", []))
    failed = [
        f"{name} ({check.get('violations', 0)})"
        for name, check in report.get("invariants", {}).items()
        if not check.get("ok", True)
    ]
    return Series(
        title=title(report),
        orders=int(report["orders_requested"]),
        end=end,
        sent=(sent[0] + [end], sent[1] + [sent[1][-1]]),
        settled=(settled[0] + [end], settled[1] + [settled[1][-1]]),
        faults=faults,
        outages=[(float(start), float(stop)) for start, stop in timeline.get("outages", [])],
        phases=sorted((float(x), _phase_label(name, report)) for name, x in phases.items()),
        breaks=[(float(x), str(what)) for x, what in timeline.get("rule_breaks", [])],
        failed_checks=failed,
        checked_at=phases.get("checked"),
    )


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt

    return plt


def write(report: dict[str, Any], path: Path) -> Path:
    """Draw the report's timeline into `path` (a PNG); returns it."""
    data = series(report)
    plt = _pyplot()
    rows = max(1, len(data.faults))
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(13, 6.0 + 0.2 * rows),
        height_ratios=(5.0, max(1.0, 0.2 * rows)),
        layout="constrained",
    )
    for axis in (top, bottom):
        for index, (start, stop) in enumerate(data.outages):
            axis.axvspan(
                start,
                stop,
                color="#d62728",
                alpha=0.15,
                label="order database down (restart)" if axis is top and index == 0 else None,
            )
        for x, _ in data.phases:
            axis.axvline(x, color="#555555", linestyle=":", linewidth=1)
    top.step(*data.sent, where="post", color=SENT_COLOUR, label=f"orders sent ({data.sent[1][-1]})")
    top.step(
        *data.settled,
        where="post",
        color=SETTLED_COLOUR,
        label=f"orders settled: end event on the bus ({data.settled[1][-1]})",
    )
    top.axhline(data.orders, color="#999999", linestyle="--", linewidth=1, label=f"ORDERS = {data.orders}")
    # The phases on an axis of their own above the chart: their names never sit on the lines.
    phases = top.secondary_xaxis("top")
    phases.set_xticks([x for x, _ in data.phases], [label for _, label in data.phases])
    phases.tick_params(labelsize=8, colors="#555555")
    if data.breaks:
        top.plot(
            [x for x, _ in data.breaks],
            [data.orders * 1.03] * len(data.breaks),
            linestyle="none",
            marker="X",
            markersize=9,
            color=BREAK_COLOUR,
            label=f"rule breaks the client saw ({len(data.breaks)})",
        )
    if data.failed_checks and data.checked_at is not None:
        top.plot(
            [data.checked_at],
            [data.orders * 1.03],
            linestyle="none",
            marker="X",
            markersize=12,
            color=BREAK_COLOUR,
        )
        top.annotate(
            "failed: " + ", ".join(data.failed_checks),
            (data.checked_at, data.orders * 1.03),
            xytext=(-10, -18),
            textcoords="offset points",
            ha="right",
            fontsize=8,
            color=BREAK_COLOUR,
        )
    elif data.checked_at is not None:
        top.annotate(
            "every invariant held",
            (data.checked_at, data.orders),
            xytext=(-6, -14),
            textcoords="offset points",
            ha="right",
            fontsize=8,
            color=SETTLED_COLOUR,
        )
    top.set_ylim(0, data.orders * 1.12)
    top.set_ylabel("orders (cumulative)")
    top.grid(axis="y", alpha=0.3)
    top.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)  # beside: never on the lines
    top.set_title(data.title, fontsize=11)
    for row, (_, colour, times) in enumerate(data.faults):
        bottom.plot(
            times, [row] * len(times), linestyle="none", marker="|", markersize=9, mew=1.5, color=colour
        )
    bottom.set_yticks(range(len(data.faults)), [label for label, _, _ in data.faults], fontsize=7)
    bottom.set_ylim(rows - 0.5, -0.5)  # the first kind on top
    bottom.set_ylabel("faults injected")
    bottom.set_xlabel("seconds since the stack was up")
    bottom.set_xlim(0, data.end * 1.01)
    bottom.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def png_beside(json_path: Path) -> Path:
    """Where a report's chart goes: beside its JSON, with the same name."""
    return json_path.with_suffix(".png")
