"""One chaos run: start the local stack with the fault plan, drive it, poison it, drain it, check it.

The stack is template.yaml as `make local` runs it, with two differences, both on the time scale:
the consumer queues' visibility timeout is the consumer timeout + 5 s instead of 60 s (still longer
than the function timeout, as Lambda requires, so an IN_PROGRESS record left by a dead consumer has
expired when its message comes back), and the stack name is "chaos".

Poison outbox items are parked by the relay in its poison queue: the drain waits for them there, and
the relay dead-letter queue (batches older than RelayMaximumRecordAgeSeconds) must stay empty. An
epilogue (Run(..., epilogue=...)) runs after the checks with the stack still up: the replay scenario of
tools/chaos/recovery_scenarios.py is one.

With `order_store="postgres"` (ORDER_STORE=postgres) the template runs with OrderStore=postgres: the
orders, their outbox and the inbox are in the embedded PostgreSQL, published by OutboxPublisherFunction
(started every minute by the schedule); inventory stays on DynamoDB with the stream relay. Then also:
- the publisher gets the relay's PutEvents faults (a crash after PutEvents is one between PutEvents and
  COMMIT: its rows stay pending and are published again), and 2, then 4 publishers run at once during
  the drive (tools/chaos/publishers.py: direct invocations beside the schedule's);
- the database is restarted mid-drive (down `database_down_seconds`): the API answers 503 with
  Retry-After, which the client retries;
- poison rows go into the outbox table (a fake order's, and a real order's past its last sequence);
- the evidence of the orders is read from PostgreSQL (tools/chaos/postgres_store.py), and every row
  must end published, or parked when it is poison.
The faults that hook DynamoDB writes the API and the order-status consumer no longer make are not
injected, and the report says which (plan.POSTGRES_NOT_APPLICABLE).

With `postgres_relay="logical"` (POSTGRES_RELAY=logical) the template runs with PostgresRelay=logical: the
same publisher reads the outbox's inserts from a replication slot and marks no row published. Then:
- its crash after PutEvents is one before the slot advance (the slot decodes the round again), and it
  also crashes after an advance, before that transaction's COMMIT (relay.crash_after_advance, hooked on
  shop.runtime.logical_relay.advance_slot); with polling that kind is named as not applicable;
- of the 2 or 4 invocations at once, one reads the slot at a time (its advisory lock): the report says
  how many invocations ran and how many sessions held the slot's lock at once (pg_locks, sampled);
- a row's bookmark is the slot: the drain waits until the slot holds no outbox row, and every row must
  end behind the slot (delivered) or parked when it is poison (tools/chaos/postgres_store.py);
- the relay's operations run mid-drive (tools/chaos/relay_operations.py; ChaosConfig.relay_operations,
  replays_at, switches_at): operator's replays of everything written so far, a deploy switching the
  relay to polling and one switching back, with the publisher dying around each step of a switch, around
  a replay set's activation and after a chunk of a set; the checks add relay_operations.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.chaos import poison, timeline
from tools.chaos.bus import BusCapture, Duplicator, NotificationCapture
from tools.chaos.check import evaluate
from tools.chaos.config import ChaosConfig
from tools.chaos.drain import Drain
from tools.chaos.drive import Drive
from tools.chaos.evidence import (
    DEATH_KINDS,
)
from tools.chaos.figures import Figures
from tools.chaos.gathering import Gathering
from tools.chaos.postgres_store import PostgresOrderStore
from tools.chaos.progress import Counts, ProgressLine
from tools.chaos.publishers import DatabaseRestart, PublisherPool
from tools.chaos.relay_operations import RelayOperations
from tools.chaos.snapshot import (
    DynamoOrderStore,
)
from tools.chaos.topology import Live, Topology
from tools.local.services.emulators import LocalServices

# Runs after the checks, with the stack and the captures still up; returns a report with "passed".
Epilogue = Callable[["Run", Live], dict[str, Any]]


class Run(Drive, Drain, Gathering, Figures):
    """One chaos run: start, drive, drain, gather, check, (epilogue,) report."""

    def __init__(
        self,
        config: ChaosConfig,
        services: LocalServices | None = None,
        epilogue: Epilogue | None = None,
    ) -> None:
        super().__init__(config, services, with_epilogue=epilogue is not None)
        self.epilogue = epilogue
        self.epilogue_report: dict[str, Any] | None = None

    # --- the live line --------------------------------------------------------------------------
    def live_counts(self) -> Counts:
        """What the live line shows: counted from what the harness holds, never by reading the stack."""
        with self._ledger_lock:
            entries, self._ledger_offset = self.ledger.read_from(self._ledger_offset)
            for entry in timeline.injected(entries):
                self._ledger_faults += 1
                if entry["kind"] in DEATH_KINDS:
                    self._ledger_deaths[str(entry["function"])] += 1
            faults, injected_deaths = self._ledger_faults, Counter(self._ledger_deaths)
        counters = self.driver.counts() if self.driver is not None else Counter()
        settled = breaks = 0
        if self._parts is not None:
            capture, notifications, duplicator = self._parts
            settled = len(timeline.settled_at(capture.snapshot()))
            harness_errors = capture.errors + notifications.errors + duplicator.errors
            breaks = len(capture.foreign) + len(notifications.unreadable) + len(harness_errors)
        breaks += counters["contract_breaks"] + counters["gave_up"]
        deaths = self._deaths()
        return Counts(
            phase=self.phase,
            orders=self.config.orders,
            sent=len(self.sent_at),
            settled=settled,
            faults=faults,
            rule_breaks=breaks,
            uninjected_deaths=sum(max(0, n - injected_deaths[f]) for f, n in deaths.items()),
            elapsed=time.time() - self.moments.get("began", time.time()),
        )

    # --- the run --------------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        began = time.monotonic()
        store = self.config.order_store
        if self.config.postgres:
            store += f", relay {self.config.postgres_relay}"
        self.say(
            f"seed {self.config.seed}, {self.config.orders} orders, orders on {store}; "
            f"run directory {self.run_dir}"
        )
        self.stack.start()
        try:
            if self.stack.report.init_errors:
                raise RuntimeError(f"functions failed to start: {self.stack.report.init_errors}")
            self.timings["startup_seconds"] = time.monotonic() - began
            return self._execute(began)
        finally:
            self.stack.stop()

    def _execute(self, began: float) -> dict[str, Any]:
        stack = self.stack
        self.moments["began"] = time.time()
        if self.config.postgres:
            self.store = self.postgres = PostgresOrderStore(stack, logical=self.config.logical)
            holders = self.postgres.slot_lock_holders if self.config.logical else None
            self.publishers = PublisherPool(stack, slot_holders=holders)
            if self.config.restart_at is not None:
                self.restart = DatabaseRestart(
                    stack.services.order_database,
                    self.ledger,
                    self.config.database_down_seconds,
                    gate=self._gate,
                )
        else:
            self.store = DynamoOrderStore(stack)
        topology = Topology.of(stack)
        bus_name = stack.template.physical_name("EventBus")
        capture = BusCapture(stack, bus_name, self.config.stack_name)
        notifications = NotificationCapture(stack, "NotificationTopic")
        duplicator = Duplicator(
            stack,
            topology.routes,
            prefix=self.config.stack_name,
            seed=self.config.seed,
            ledger=self.ledger,
            id_prefixes=self.config.duplicate_id_prefixes,
            delay_seconds=(1.0, 6.0),
        )
        for part in (capture, notifications, duplicator):
            part.start()
        self._parts = (capture, notifications, duplicator)
        if self.config.operations:
            assert self.postgres is not None
            self.operations = RelayOperations(
                stack,
                self.postgres,
                capture,
                self.ledger,
                Path(self.plan.state_dir),
                self.config.postgres_relay,
                self.say,
                self.poison_items,
                poison_at_handover_bytes=self.config.max_event_bytes
                if self.config.poison_at_handover
                else None,
                gate=self._gate,
            )
        if not self.config.quiet:
            self.progress = ProgressLine(self.live_counts)
            self.progress.start()
        try:
            if self.config.inject_poison:
                self._poison_queues(topology)
                if self.config.postgres:
                    self._poison_row(poison.INVALID_ENVELOPE)
                else:
                    self._poison_table("OrdersTable", poison.NOT_JSON)
            outcomes = self._drive()
            drive_end = time.monotonic()
            self._enter("drain", "drive_ended")
            if self.publishers is not None:
                self.publishers.set_target("drain", self.config.drain_publishers)
            self.drained = self._drain(topology, capture, notifications, duplicator)
            self.timings["drain_seconds"] = time.monotonic() - drive_end
            self._enter("check", "drain_ended")
            if self.publishers is not None:
                self.publishers.stop()
            evidence = self._evidence(topology, capture, notifications, duplicator, outcomes)
            checks = evaluate(evidence)
            self.moments["checked"] = time.time()
            if self.epilogue is not None and self.drained:
                self._enter("after", "checked")
                began_epilogue = time.monotonic()
                live = Live(topology, capture, notifications, duplicator, outcomes, checks)
                self.epilogue_report = self.epilogue(self, live)
                self.timings["epilogue_seconds"] = time.monotonic() - began_epilogue
                self.moments["epilogue_ended"] = time.time()
        finally:
            if self.progress is not None:
                self.progress.stop()
                self.progress = None
            if self.publishers is not None:
                self.publishers.stop()
            if self.restart is not None:
                self.restart.join()
            if self.operations is not None:
                self.operations.join(timeout=60.0)
                self.operations.close()
            if self.postgres is not None:
                self.postgres.close()
            for part in (duplicator, notifications, capture):
                part.stop()
        self.timings["total_seconds"] = time.monotonic() - began
        return self._report(evidence, checks, duplicator, outcomes)


def run(
    config: ChaosConfig, services: LocalServices | None = None, epilogue: Epilogue | None = None
) -> dict[str, Any]:
    return Run(config, services, epilogue).execute()
