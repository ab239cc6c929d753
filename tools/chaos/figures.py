"""A chaos run's report (report.py renders and saves it): the checks' verdicts with the run's figures,
the faults injected, what only the PostgreSQL order store shows, and the timeline its chart draws."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from shop.domain.orders import EVENT_SOURCE as ORDERS_SOURCE
from tools.chaos import poison, timeline
from tools.chaos.bus import Duplicator
from tools.chaos.check_dead_letters import parked_key, parked_poison
from tools.chaos.driver import Answer, OrderOutcome
from tools.chaos.evidence import (
    Check,
    Evidence,
    capture_lag,
    quantiles,
)
from tools.chaos.fault_plan import roles
from tools.chaos.plan import (
    API_STALE_CANCEL,
    CONSUMER_CONFLICT,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    not_applicable,
)
from tools.chaos.publishers import PUBLISHER
from tools.chaos.run_state import RunState
from tools.chaos.snapshot import (
    PARKED,
    PENDING,
    PUBLISHED,
    OutboxRecord,
)

# 503s counted as the restart's up to this long after the database is back (connections it broke are
# found broken at their next use).
_AFTER_RESTART_SECONDS = 10.0
_NEXT_SECONDS = 10.0  # a poison row's neighbours: the events of other orders written this soon after it


class Figures(RunState):
    def _hot_sku_figures(self, injected: list[dict[str, Any]]) -> dict[str, Any]:
        """How hard the hot item was hit: conflicts per event (each would have been a failed receive)."""
        per_event = Counter(
            entry["event_ids"][0]
            for entry in injected
            if entry["kind"] == CONSUMER_CONFLICT and entry["event_ids"]
        )
        return {
            "conflicts": sum(per_event.values()),
            "events_conflicted": len(per_event),
            "most_conflicts_on_one_event": max(per_event.values(), default=0),
            "events_conflicted_at_least_max_receive_count": sum(
                1 for n in per_event.values() if n >= self.plan.max_receive_count
            ),
            "max_receive_count": self.plan.max_receive_count,
        }

    def _report(
        self, evidence: Evidence, checks: list[Check], duplicator: Duplicator, outcomes: list[OrderOutcome]
    ) -> dict[str, Any]:
        by_name = {check.name: check for check in checks}
        injected = [entry for entry in evidence.ledger if entry["kind"] != OBSERVED_PUBLISH_RESPONSE_LOST]
        faults: Counter[str] = Counter(entry["kind"] for entry in injected)
        by_function: dict[str, Counter[str]] = {}
        for entry in injected:
            by_function.setdefault(entry["function"], Counter())[entry["kind"]] += 1
        snapshot = evidence.snapshot
        tables = Counter(r.table for r in snapshot.outbox if r.live)
        deliveries = sum(c.deliveries for c in evidence.bus.values())
        repeats_by_source: Counter[str] = Counter()
        for captured in evidence.bus.values():
            repeats_by_source[str(captured.detail.get("source"))] += captured.deliveries - 1
        effects = by_name["effects_once"].figures
        notes = by_name["one_notification_per_event"].figures
        passed = self.drained and all(check.ok for check in checks)
        if self.with_epilogue:
            passed = passed and self.epilogue_report is not None and bool(self.epilogue_report["passed"])
        return {
            "passed": passed,
            "drained": self.drained,
            **({"stalled": True} if self.stalled else {}),
            "seed": self.config.seed,
            "order_store": self.config.order_store,
            **({"postgres_relay": self.config.postgres_relay} if self.config.postgres else {}),
            "orders_requested": self.config.orders,
            "relay_parallelization_factor": int(self.template.parameter_values["RelayParallelizationFactor"]),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {
                "cores": os.cpu_count(),
                "load_average": os.getloadavg(),
                "python": sys.version.split()[0],
            },
            "timings": {k: round(v, 1) for k, v in self.timings.items()},
            "orders": {"total": len(snapshot.orders), **by_name["states_consistent"].figures["statuses"]},
            "events": {
                "outbox": len(snapshot.decodable()),
                "outbox_orders_table": tables["OrdersTable"],
                "outbox_inventory_table": tables["InventoryTable"],
                "bus_distinct": len(evidence.bus),
                "bus_deliveries": deliveries,
                "bus_repeats": deliveries - len(evidence.bus),
                "bus_repeats_by_source": dict(sorted(repeats_by_source.items())),
                "duplicates_delivered_to_consumers": duplicator.sent,
            },
            "faults": dict(sorted(faults.items())),
            "faults_not_applicable": {
                f: list(kinds)
                for f, kinds in not_applicable(self.config.postgres, self.config.postgres_relay).items()
            },
            **({"hot_sku": self._hot_sku_figures(injected)} if self.config.hot_sku else {}),
            "faults_by_function": {f: dict(sorted(c.items())) for f, c in sorted(by_function.items())},
            "function_errors": {f"{f} {t}": n for (f, t), n in sorted(self.function_errors.items())},
            "uninjected_deaths": {
                f: n for f in sorted(roles(self.config)) if (n := evidence.uninjected_deaths(f))
            },
            "client": dict(sorted(self.client_counters.items())),
            "summary": {
                "lost": by_name["no_lost_events"].figures["lost"],
                "pending_rows": by_name["no_lost_events"].figures["pending_rows"],
                "phantom": by_name["no_phantom_events"].figures["phantom"],
                "published_out_of_order": by_name["published_in_order"].figures["out_of_order"],
                "duplicate_effects": effects["duplicate_effects"] + notes["unexplained_duplicates"],
                "stock_mismatches": effects["stock_mismatches"],
                "stale_cancels_that_raced_a_change": sum(
                    1 for e in evidence.ledger if e["kind"] == API_STALE_CANCEL and e.get("raced")
                ),
                "notification_window_duplicates": notes["window_duplicates"],
                "notification_window_crashes_injected": notes["window_crashes_injected"],
                "notification_repeats_after_uninjected_deaths": notes["repeats_after_uninjected_deaths"],
                "lost_publish_responses_observed": notes["lost_publish_responses"],
                "poison_injected": by_name["dead_letters_exact"].figures["poison_outbox_items"],
                "relay_poison_queue": by_name["dead_letters_exact"].figures["poison_parked_whole"],
                "relay_poison_queue_messages": by_name["dead_letters_exact"].figures["poison_queue_messages"],
                "relay_poison_queue_parked_again": by_name["dead_letters_exact"].figures[
                    "poison_parked_again_after_rollback"
                ],
                "relay_dlq": by_name["dead_letters_exact"].figures["relay_dlq_messages"],
                "consumer_dlqs": by_name["dead_letters_exact"].figures["consumer_dlq_messages"],
            },
            "invariants": {check.name: check.to_dict() for check in checks},
            **({"postgres": self._postgres_figures(evidence, outcomes)} if self.config.postgres else {}),
            **({"relay_operations": self.operations.figures(evidence)} if self.operations else {}),
            **({"epilogue": self.epilogue_report} if self.with_epilogue else {}),
            "plan": json.loads(self.plan.to_json()),
            "run_dir": str(self.run_dir),
            "timeline": self._timeline(evidence, outcomes),
        }

    def _timeline(self, evidence: Evidence, outcomes: list[OrderOutcome]) -> dict[str, Any]:
        """When things happened (tools/chaos/timeline.py): what the run's chart draws."""
        began = self.moments.get("began", time.time())
        return timeline.build(
            began,
            phases={name: t for name, t in self.moments.items() if name != "began"},
            sent=self.sent_at,
            settled=timeline.settled_at(evidence.bus).values(),
            ledger=evidence.ledger,
            outages=evidence.database_outages,
            breaks=timeline.rule_breaks(outcomes),
        )

    def _postgres_figures(self, evidence: Evidence, outcomes: list[OrderOutcome]) -> dict[str, Any]:
        """What only the PostgreSQL order store shows: its rows' states and publish lag, the publishers,
        the restart and what the client saw of it, and each poison row's fate."""
        snapshot = evidence.snapshot
        rows = [r for r in snapshot.outbox if r.state is not None]
        states = Counter(str(r.state) for r in rows)
        lags = sorted(lag for r in rows if (lag := self._publish_lag(r, evidence)) is not None)
        captured = sorted(lag for r in rows if (lag := capture_lag(r, evidence)) is not None)

        def crashed(kind: str) -> set[str]:
            return {
                event_id
                for entry in evidence.ledger
                if entry["kind"] == kind and entry["function"] == PUBLISHER
                for event_id in entry.get("event_ids", [])
            }

        def put_again(ids: set[str]) -> int:
            return sum(1 for i in ids if i in evidence.bus and evidence.bus[i].deliveries > 1)

        answers = [a for o in outcomes for a in o.create_answers + o.cancel_answers]
        republished = {
            "order_events_put_more_than_once": sum(
                1
                for c in evidence.bus.values()
                if c.detail.get("source") == ORDERS_SOURCE and c.deliveries > 1
            ),
            # Logical: between PutEvents and the slot advance (the round's end).
            "after_a_crash_between_put_events_and_commit": put_again(crashed(RELAY_CRASH_AFTER_PUT)),
        }
        if self.operations is not None:
            republished["after_a_crash_around_a_switch_step"] = put_again(crashed(RELAY_CRASH_AROUND_SWITCH))
            republished["after_a_crash_after_a_replay_set_chunk"] = put_again(
                crashed(RELAY_CRASH_AFTER_SET_CHUNK)
            )
        if self.config.logical:
            # The events an advance confirmed before its process died: never read again (a repeat of
            # one came from a failure before that advance, e.g. a lost PutEvents answer).
            after_advance = crashed(RELAY_CRASH_AFTER_ADVANCE)
            republished["confirmed_by_an_advance_then_crash"] = len(after_advance)
            republished["of_them_put_more_than_once"] = put_again(after_advance)
        return {
            "outbox_rows": {state: states[state] for state in (PUBLISHED, PARKED, PENDING)},
            "slot_rows": snapshot.slot_rows,
            "publish_lag_seconds": quantiles(lags),
            # Polling: from the row's created_at to its published_at. Logical (no row marked): to the
            # event's first arrival in the harness's capture queue (EventBridge -> SQS -> the harness).
            "publish_lag_to": "first seen by the bus capture" if self.config.logical else "marked published",
            # Either relay: from created_at to the first arrival in the capture queue (comparable).
            "bus_capture_lag_seconds": quantiles(captured),
            "republished": republished,
            "inbox_rows": len(snapshot.inbox),
            "publishers": self.publishers.report() if self.publishers else {},
            "database_restart": self._restart_figures(answers),
            "poison_rows": self._poison_row_figures(evidence),
        }

    def _restart_figures(self, answers: list[Answer]) -> dict[str, Any]:
        if self.restart is None:
            return {}
        figures = self.restart.report()
        unavailable = [a for a in answers if a.status == 503]
        figures["answers_503"] = len(unavailable)
        if self.restart.window is not None:
            began, ended = self.restart.window
            figures["answers_503_during_outage"] = sum(1 for a in unavailable if began <= a.at <= ended)
            figures["answers_503_within_10s_after"] = sum(
                1 for a in unavailable if ended < a.at <= ended + _AFTER_RESTART_SECONDS
            )
            figures["answers_during_outage"] = sum(1 for a in answers if began <= a.at <= ended)
        return figures

    def _poison_row_figures(self, evidence: Evidence) -> list[dict[str, Any]]:
        """Each poison row: parked (how often), and the later events of other orders: published, and the
        longest publish lag of those written in the 10 s after it (held back, it would be long)."""
        records = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
        times: Counter[tuple[str, str]] = Counter()
        for body in evidence.relay_poison_queue:
            message = parked_poison(body)
            key = parked_key(message) if message is not None else None
            if key is not None:
                times[key] += 1
        rows = [r for r in evidence.snapshot.outbox if r.state is not None and r.live]
        figures = []
        for item in self.poison_items:
            if item.table != poison.POSTGRES_OUTBOX:
                continue
            record = records.get((item.pk, item.sk))
            position = record.position if record and record.position is not None else 0
            written = record.created_at if record and record.created_at is not None else 0.0
            later = [r for r in rows if r.pk != item.pk and (r.position or 0) > position]
            soon = [
                lag
                for r in later
                if r.created_at is not None
                and r.created_at <= written + _NEXT_SECONDS
                and (lag := self._publish_lag(r, evidence)) is not None
            ]
            figures.append(
                {
                    "variant": item.variant,
                    "real_order": item.real_order,
                    "state": record.state if record else None,
                    "parked_times": times[(item.pk, item.sk)],
                    "later_events_of_other_orders": len(later),
                    "of_them_published": sum(1 for r in later if r.state == PUBLISHED),
                    "publish_lag_max_of_those_written_10s_after": round(max(soon), 3) if soon else None,
                }
            )
        return figures

    def _publish_lag(self, record: OutboxRecord, evidence: Evidence) -> float | None:
        """A published row's lag (see publish_lag_to in _postgres_figures); None for any other."""
        if record.state != PUBLISHED or record.created_at is None:
            return None
        if not self.config.logical:
            return record.marked_at - record.created_at if record.marked_at is not None else None
        return capture_lag(record, evidence)
