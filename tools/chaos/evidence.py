"""What the invariants are checked against, and what a check answers.

Evidence is everything a run gathered once drained (tools/chaos/gathering.py): the stores' Snapshot
(tools/chaos/snapshot.py), the bus and topic captures, the ledger, what the client saw, the queues; a
Check is one named invariant with its violations and figures. Also the fault kinds that end a
function's environment, and the figures' helpers (capture_lag, quantiles).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tools.chaos.bus import CapturedEvent
from tools.chaos.driver import OrderOutcome
from tools.chaos.plan import (
    CONSUMER_DEATH_KINDS,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    RELAY_DEATH_KINDS,
    RELAY_ROLLBACK_KINDS,
)
from tools.chaos.poison import MalformedMessage, PoisonItem
from tools.chaos.snapshot import PUBLISHED, OutboxRecord, Snapshot

_EXAMPLES = 5
# Faults that end the environment (the runtime reports them as Runtime.ExitError or Sandbox.Timedout),
# and the relay's among them that kill its process before its round's COMMIT (the round is rolled back):
# plan.py groups them.
ROLLBACK_KINDS = frozenset(RELAY_ROLLBACK_KINDS)
DEATH_KINDS = frozenset(CONSUMER_DEATH_KINDS + RELAY_DEATH_KINDS)
DEATH_ERRORS = frozenset({"Runtime.ExitError", "Sandbox.Timedout"})


@dataclass
class Check:
    name: str
    description: str
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "description": self.description,
            "violations": len(self.violations),
            "examples": self.violations[:_EXAMPLES],
            **self.figures,
        }


@dataclass
class SwitchOutcome:
    """A relay switch as a deploy ran it: the migration function's answer to its Update."""

    label: str
    relay_to: str
    status: str | None  # the last deploy's answer's Status, None when none came
    reason: str
    relay_from: str = ""
    # Each deploy answered FAILED before it: its reason, the relay after it (must be relay_from: "nothing
    # of that step was changed") and the rollback's answer (CloudFormation's Update back).
    failed: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReplayOutcome:
    """A replay by window of the order database as an operator ran it: what it put out again, and what
    its answer named instead (parked, pending, expired, missing: shop.adapters.postgres.outbox)."""

    label: str
    began: float  # epoch seconds: the request was sent
    window: tuple[float, float]  # epoch seconds
    error: str | None  # the request failed or was refused
    replayed: list[str]  # event ids
    named: dict[str, list[str]]  # reason -> event ids


@dataclass
class OperationsEvidence:
    switches: list[SwitchOutcome]
    replays: list[ReplayOutcome]
    final_mode: str | None  # outbox_relay.mode after the drain
    expected_mode: str  # the run's relay: where the switches come back to
    errors: list[str] = field(default_factory=list)  # the harness's, running them


@dataclass
class Evidence:
    snapshot: Snapshot
    bus: dict[str, CapturedEvent]
    foreign_bus_messages: list[str]
    notifications: Counter[str]
    unreadable_notifications: list[str]
    ledger: list[dict[str, Any]]
    outcomes: list[OrderOutcome]
    initial_stock: dict[str, int]
    poison_items: list[PoisonItem]
    malformed: list[MalformedMessage]
    # The relay's last resort (batches older than RelayMaximumRecordAgeSeconds): empty in a chaos run.
    relay_dlq: list[str]
    relay_dlq_keys: list[list[tuple[str, str]]]
    consumer_dlqs: dict[str, list[str]]  # queue logical id -> bodies
    harness_errors: list[str]
    # Invocations that ended with the environment dying (crash or timeout), by function: injected or not.
    deaths: dict[str, int] = field(default_factory=dict)
    # Where the relay parks poison records whole, and each injected poison item as the table holds it
    # now (None: not in the table).
    relay_poison_queue: list[str] = field(default_factory=list)
    poison_table_items: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)
    # Sources whose aggregates' events must first reach the bus in sequence order: the PostgreSQL
    # publisher's promise with several publishers at once, the stream relay's with ParallelizationFactor 1.
    in_order_sources: frozenset[str] = frozenset()
    # When the order database was down (epoch seconds, from its stop to its start again): a round of the
    # publisher open then was rolled back, like one whose process died between PutEvents and COMMIT.
    database_outages: list[tuple[float, float]] = field(default_factory=list)
    # OrderStore=postgres with the relay operations (tools/chaos/relay_operations.py): what they did.
    operations: OperationsEvidence | None = None

    def lost_publish_responses(self) -> int:
        """Publish attempts of the notifier that ended without an answer (observed, not injected)."""
        return sum(1 for entry in self.ledger if entry["kind"] == OBSERVED_PUBLISH_RESPONSE_LOST)

    def uninjected_deaths(self, function: str) -> int:
        injected = sum(
            1 for entry in self.ledger if entry["function"] == function and entry["kind"] in DEATH_KINDS
        )
        return max(0, self.deaths.get(function, 0) - injected)


def capture_lag(record: OutboxRecord, evidence: Evidence) -> float | None:
    """From a published row's created_at to its event's first arrival in the harness's bus capture."""
    if record.state != PUBLISHED or record.created_at is None:
        return None
    captured = evidence.bus.get(str((record.envelope or {}).get("id")))
    return captured.first_at - record.created_at if captured is not None else None


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}
