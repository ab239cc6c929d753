"""The run's timeline (report["timeline"]): when things happened, in seconds since the stack was up.

What the chart of a run draws (tools/chaos/chart.py), from what the harness already keeps: when it sent
each order, when each order's end event first reached its bus capture (settled), every injected fault of
the ledger by kind, the order database's outage, the phase boundaries, and the rule breaks the client saw
with their time. The failed invariants have no time of their own: the checks read the stores once,
after the drain, and the chart marks them there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shop.domain.orders import EVENT_SOURCE as ORDERS_SOURCE
from shop.domain.orders import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_REJECTED
from tools.chaos.bus import CapturedEvent
from tools.chaos.driver import OrderOutcome
from tools.chaos.plan import OBSERVED_PUBLISH_RESPONSE_LOST

# An order's saga has reached its end state once its order has one of these; the event on the bus is
# what the harness sees of it without reading the store (a confirmed order cancelled later was settled
# at its confirmation).
ORDER_END_EVENTS = frozenset({ORDER_CONFIRMED, ORDER_REJECTED, ORDER_CANCELLED})


def settled_at(bus: Mapping[str, CapturedEvent]) -> dict[str, float]:
    """Each order whose end event reached the bus, and when the first of them did (epoch seconds)."""
    settled: dict[str, float] = {}
    for captured in bus.values():
        detail = captured.detail
        if detail.get("source") != ORDERS_SOURCE or detail.get("type") not in ORDER_END_EVENTS:
            continue
        subject = str(detail.get("subject"))
        if subject not in settled or captured.first_at < settled[subject]:
            settled[subject] = captured.first_at
    return settled


def injected(entries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ledger's injected faults (an observed lost Publish answer is the machine's, not ours)."""
    return [entry for entry in entries if entry.get("kind") != OBSERVED_PUBLISH_RESPONSE_LOST]


def rule_breaks(outcomes: Iterable[OrderOutcome]) -> list[tuple[float, str]]:
    """What the client saw break a rule, when (epoch seconds): an answer against the API contract, an
    order never created within the retry budget, a cancel never answered."""
    breaks: list[tuple[float, str]] = []
    for outcome in outcomes:
        index = outcome.script.index
        answers = outcome.create_answers + outcome.cancel_answers
        breaks += [(a.at, f"order #{index}: {a.problem}") for a in answers if a.problem]
        if outcome.create_answers and not outcome.created:
            breaks.append((outcome.create_answers[-1].at, f"order #{index}: no 201 within the retry budget"))
        final = outcome.cancel_final
        if outcome.script.cancel and outcome.created and (final is None or final.status not in {200, 409}):
            at = final.at if final is not None else outcome.create_answers[-1].at
            breaks.append((at, f"order #{index}: its cancel got no final answer"))
    return sorted(breaks)


def build(
    began: float,
    *,
    phases: Mapping[str, float],
    sent: Iterable[float],
    settled: Iterable[float],
    ledger: Iterable[Mapping[str, Any]],
    outages: Iterable[tuple[float, float]] = (),
    breaks: Iterable[tuple[float, str]] = (),
) -> dict[str, Any]:
    """The timeline from epoch seconds, each made relative to `began` (when the stack was up)."""

    def at(epoch: float) -> float:
        return round(epoch - began, 2)

    faults: dict[str, list[float]] = {}
    for entry in injected(ledger):
        faults.setdefault(str(entry["kind"]), []).append(at(float(entry["at"])))
    return {
        "began_at": began,
        "phases": {name: at(epoch) for name, epoch in phases.items()},
        "sent": sorted(at(t) for t in sent),
        "settled": sorted(at(t) for t in settled),
        "faults": {kind: sorted(times) for kind, times in sorted(faults.items())},
        "outages": [[at(start), at(end)] for start, end in outages],
        "rule_breaks": [[at(t), what] for t, what in sorted(breaks)],
    }
