"""The recovery scenarios run after or as a chaos run (recovery_scenarios.py's docstring says what each
expects): replay, a 2-day replay of both tables as the run's epilogue (nothing may happen twice); and
hot-sku, a chaos run on one hot SKU whose transactions conflict."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.chaos.bus import queue_depth
from tools.chaos.check import evaluate
from tools.chaos.config import ChaosConfig
from tools.chaos.harness import Run
from tools.chaos.harness import run as run_chaos
from tools.chaos.recovery_scenarios import (
    Outcome,
    iso,
    run_admin,
    wait,
)
from tools.chaos.snapshot import collect
from tools.chaos.topology import Live
from tools.local.services.emulators import LocalServices


# --- c. a replay of the last 2 days after a chaos run ---------------------------------------------------
@dataclass
class _State:
    """What a replay must not change."""

    orders: dict[str, dict[str, Any]]
    reservations: dict[str, dict[str, Any]]
    stock: dict[str, int]
    request_orders: dict[str, list[str]]
    outbox: set[tuple[str, str, str]]
    other_items: int
    notifications: Counter[str]
    dead_letters: dict[str, int]


class ReplayWindow:
    """The epilogue of a chaos run: replay both tables' last `days` days; nothing may happen twice."""

    name = "replay"

    def __init__(self, days: float = 2.0) -> None:
        self.days = days
        self.outcome = Outcome(self.name)

    def __call__(self, run: Run, live: Live) -> dict[str, Any]:
        outcome, stack = self.outcome, run.stack
        base_ok = all(check.ok for check in live.checks)
        before = self._state(run, live)
        decodable = collect(stack).decodable()
        expected = {
            table: {i for i, r in decodable.items() if r.table == table}
            for table in ("OrdersTable", "InventoryTable")
        }
        bus_before = {i: c.deliveries for i, c in live.capture.snapshot().items()}
        ledger_before = len(run.ledger.entries())
        errors_before = sum(run.function_errors.values())
        since = time.time()
        end = datetime.now(UTC)
        start = end - timedelta(days=self.days)
        outcome.figures["window"] = f"{iso(start)} .. {iso(end)}"
        for table, ids in expected.items():
            result = run_admin(
                stack,
                "replay",
                "--table",
                stack.template.physical_name(table),
                "--from",
                iso(start),
                "--to",
                iso(end),
            )
            report = next(iter(result.reports()), {})
            outcome.figures[f"replay {table}: exit / found / published / seconds"] = (
                f"{result.exit_code} / {report.get('found')} / {report.get('published')} / "
                f"{result.seconds:.1f}"
            )
            outcome.check(
                f"replay of {table}: exit 0, complete, every outbox event of the window republished",
                result.exit_code == 0
                and report.get("complete") is True
                and report.get("published") == len(ids)
                and report.get("found") == len(ids),
                f"exit {result.exit_code}, {len(ids)} expected, report {json.dumps(report)[:300]}, "
                f"stderr {result.stderr[-300:]}",
            )
        every = set().union(*expected.values())

        def replayed() -> bool:
            events = live.capture.snapshot()
            return all(i in events and events[i].deliveries > bus_before.get(i, 0) for i in every)

        timeout = max(180.0, 0.2 * len(every))
        began = time.monotonic()
        on_bus = wait(replayed, timeout)
        drained = on_bus and self._drain(run, live, timeout)
        outcome.figures["events replayed"] = len(every)
        outcome.figures["seconds until drained again"] = round(time.monotonic() - began, 1)
        outcome.check("every replayed event on the bus again", on_bus)
        outcome.check("the pipeline drained after the replay", drained)
        after = self._state(run, live)
        consumers = sorted(set(live.topology.consumer_queues.values()))
        outcome.figures["consumer invocations during the replay"] = {
            f: sum(1 for i in stack.activity.invocations(f) if i.at >= since) for f in consumers
        }
        during = Counter(str(e["kind"]) for e in run.ledger.entries()[ledger_before:])
        outcome.figures["faults injected during the replay"] = dict(sorted(during.items()))
        outcome.figures["function errors during the replay"] = (
            sum(run.function_errors.values()) - errors_before
        )
        self._compare(before, after)
        evidence = run.evidence(live)
        still = [check for check in evaluate(evidence) if not check.ok]
        outcome.check(
            "every invariant of the run still holds",
            not still,
            "; ".join(f"{c.name}: {c.violations[:2]}" for c in still),
        )
        outcome.check("the chaos run itself passed its checks", base_ok)
        return outcome.to_dict()

    @staticmethod
    def _state(run: Run, live: Live) -> _State:
        stack = run.stack
        snapshot = collect(stack)
        queues = [
            *live.topology.consumer_dlqs.values(),
            live.topology.relay_dlq,
            live.topology.relay_poison_queue,
        ]
        return _State(
            orders=snapshot.orders,
            reservations=snapshot.reservations,
            stock=snapshot.stock,
            request_orders=snapshot.request_orders,
            outbox={(r.table, r.pk, r.sk) for r in snapshot.outbox},
            other_items=snapshot.other_items,
            notifications=live.notifications.by_event_id(),
            dead_letters={q: queue_depth(stack.clients.sqs(), stack.queue_url(q)) for q in queues},
        )

    def _drain(self, run: Run, live: Live, timeout: float) -> bool:
        """Nothing in the consumer queues, the duplicator or the capture queues, twice in a row."""
        sqs = run.stack.clients.sqs()
        urls = [run.stack.queue_url(q) for q in live.topology.consumer_queues]
        urls += [*live.duplicator.delay_queue_urls, *live.capture.queue_urls, *live.notifications.queue_urls]
        stable = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            idle = not live.duplicator.held() and all(queue_depth(sqs, url) == 0 for url in urls)
            stable = stable + 1 if idle else 0
            if stable >= 3:
                return True
            time.sleep(1.0)
        return False

    def _compare(self, before: _State, after: _State) -> None:
        check = self.outcome.check

        def changed(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
            return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))

        orders = changed(before.orders, after.orders)
        reservations = changed(before.reservations, after.reservations)
        stock = changed(before.stock, after.stock)
        check("orders unchanged, item for item (versions included)", not orders, f"{orders[:5]}")
        check("reservations unchanged, item for item", not reservations, f"{reservations[:5]}")
        check(
            "stock unchanged",
            not stock,
            ", ".join(f"{s}: {before.stock.get(s)} -> {after.stock.get(s)}" for s in stock[:5]),
        )
        differ = sorted(after.outbox ^ before.outbox)
        check(
            "no new outbox item, no other item",
            before.outbox == after.outbox
            and before.other_items == after.other_items
            and before.request_orders == after.request_orders,
            f"{len(differ)} outbox items differ: {differ[:3]}",
        )
        repeated = after.notifications - before.notifications
        check(
            "no notification repeated (SNS publishes per eventId)",
            not repeated,
            f"{sum(repeated.values())} new publishes, e.g. {list(repeated.items())[:5]}",
        )
        dead = {
            q: (before.dead_letters[q], n)
            for q, n in after.dead_letters.items()
            if n != before.dead_letters[q]
        }
        check("no new dead letter, nothing parked", not dead, f"{dead}")
        self.outcome.figures["orders / reservations / outbox items compared"] = (
            f"{len(after.orders)} / {len(after.reservations)} / {len(after.outbox)}"
        )
        self.outcome.figures["notifications before / after"] = (
            f"{sum(before.notifications.values())} / {sum(after.notifications.values())}"
        )


def replay_after_chaos(config: ChaosConfig, services: LocalServices | None = None) -> dict[str, Any]:
    """A chaos run, then the 2-day replay of both tables as its epilogue; the run's report with it."""
    return Run(config, services, ReplayWindow()).execute()


# --- d. many orders on one SKU at once ----------------------------------------------------------------
def hot_sku(config: ChaosConfig, services: LocalServices | None = None) -> dict[str, Any]:
    """A chaos run on one hot SKU (see the module docstring); its report, with the hot item's figures."""
    report = run_chaos(replace(config, hot_sku=True, stack_name="hotsku"), services)
    figures = report.get("hot_sku", {})
    tested = figures.get("events_conflicted_at_least_max_receive_count", 0) > 0
    report["invariants"]["hot_sku_exercised"] = {
        "ok": tested,
        "description": "some event met at least maxReceiveCount conflicts (else the run proved nothing)",
        "violations": 0 if tested else 1,
        "examples": [] if tested else [json.dumps(figures)],
        **figures,
    }
    report["passed"] = bool(report["passed"]) and tested
    return report
