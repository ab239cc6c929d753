"""Gathering a chaos run's evidence once drained (evidence.Evidence): the stores read in full, the bus and
topic captures, the dead-letter and poison queues, the ledger, what the client saw, the deaths."""

from __future__ import annotations

import json

from operations.recovery import FailedStreamBatch
from shop.adapters.dynamodb import keys
from shop.domain.inventory import EVENT_SOURCE as INVENTORY_SOURCE
from shop.domain.orders import EVENT_SOURCE as ORDERS_SOURCE
from tools.chaos import poison
from tools.chaos.bus import BusCapture, Duplicator, NotificationCapture
from tools.chaos.driver import OrderOutcome
from tools.chaos.evidence import (
    Evidence,
    OperationsEvidence,
)
from tools.chaos.run_state import RunState
from tools.chaos.snapshot import (
    collect,
    read_dlq,
    stream_range_keys,
)
from tools.chaos.topology import Live, Topology


class Gathering(RunState):
    def _evidence(
        self,
        topology: Topology,
        capture: BusCapture,
        notifications: NotificationCapture,
        duplicator: Duplicator,
        outcomes: list[OrderOutcome],
    ) -> Evidence:
        stack = self.stack
        relay_dlq = read_dlq(stack, topology.relay_dlq)
        streams = stack.clients.streams()
        relay_keys = []
        for body in relay_dlq:
            try:
                relay_keys.append(
                    stream_range_keys(streams, FailedStreamBatch.from_message(json.loads(body)))
                )
            except (ValueError, KeyError) as exc:
                relay_keys.append([])
                self.say(f"unreadable relay DLQ message: {exc}")
        consumer_dlqs = {queue: read_dlq(stack, dlq) for queue, dlq in topology.consumer_dlqs.items()}
        dynamodb = stack.clients.dynamodb()
        snapshot = collect(stack, self.store)
        rows = {(r.pk, r.sk): r.item for r in snapshot.outbox if r.item is not None}
        poison_table_items = {
            (p.pk, p.sk): rows.get((p.pk, p.sk))
            if p.table == poison.POSTGRES_OUTBOX
            else dynamodb.get_item(
                TableName=stack.template.physical_name(p.table),
                Key={keys.PK: {"S": p.pk}, keys.SK: {"S": p.sk}},
                ConsistentRead=True,
            ).get("Item")
            for p in self.poison_items
        }
        return Evidence(
            snapshot=snapshot,
            bus=capture.snapshot(),
            foreign_bus_messages=list(capture.foreign),
            notifications=notifications.by_event_id(),
            unreadable_notifications=list(notifications.unreadable),
            ledger=self.ledger.entries(),
            outcomes=outcomes,
            initial_stock=dict(self.stock.initial),
            poison_items=list(self.poison_items),
            malformed=list(self.malformed),
            relay_dlq=relay_dlq,
            relay_dlq_keys=relay_keys,
            consumer_dlqs=consumer_dlqs,
            relay_poison_queue=read_dlq(stack, topology.relay_poison_queue),
            poison_table_items=poison_table_items,
            harness_errors=capture.errors
            + notifications.errors
            + duplicator.errors
            + (self.restart.errors if self.restart else []),
            deaths=self._deaths(),
            in_order_sources=self._in_order_sources(),
            database_outages=[self.restart.window] if self.restart and self.restart.window else [],
            operations=self._operations_evidence(),
        )

    def _operations_evidence(self) -> OperationsEvidence | None:
        if self.operations is None or self.postgres is None:
            return None
        return self.operations.evidence(self.postgres.when_available(self.postgres.relay_mode))

    def _in_order_sources(self) -> frozenset[str]:
        """Whose events must first reach the bus in each aggregate's order: the polling publisher's always
        (its claims are per order); the stream relay's when one batch at a time reads each shard."""
        one_batch_per_shard = int(self.template.parameter_values["RelayParallelizationFactor"]) == 1
        publisher = {ORDERS_SOURCE} if self.config.postgres else set()
        relay = {INVENTORY_SOURCE} if self.config.postgres else {ORDERS_SOURCE, INVENTORY_SOURCE}
        return frozenset(publisher | (relay if one_batch_per_shard else set()))

    def evidence(self, live: Live) -> Evidence:
        """The evidence as it stands now (an epilogue checks the invariants again after its work)."""
        return self._evidence(live.topology, live.capture, live.notifications, live.duplicator, live.outcomes)
