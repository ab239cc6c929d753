"""The full-batch recovery scenario (`python -m tools.chaos full-batch`): one poison at position 3 of a
full relay batch of 100 (recovery_scenarios.py's docstring says what is expected)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shop.adapters.dynamodb import keys
from tools.chaos.bus import BusCapture
from tools.chaos.check_dead_letters import canonical_item
from tools.chaos.isolation import parked_messages, probe_items, write_items
from tools.chaos.recovery_scenarios import (
    POLL_SECONDS,
    RELAY,
    Scenario,
    wait,
)
from tools.local.pollers.event_sources import read_event_sources
from tools.local.services.emulators import LocalServices

FULL_BATCH_WINDOW_SECONDS = 5


# --- a. poison at position 3 of a full batch of 100 ---------------------------------------------------
class FullBatchPoison(Scenario):
    name = "full-batch"

    def __init__(self, out_dir: Path, services: LocalServices | None = None, *, poison_at: int = 2) -> None:
        super().__init__(
            out_dir,
            services,
            parameters={"RelayBatchingWindowSeconds": str(FULL_BATCH_WINDOW_SECONDS)},
            functions=frozenset({RELAY}),
        )
        self.poison_at = poison_at  # index: position 3
        source = next(s for s in read_event_sources(self.template).streams if s.table == "OrdersTable")
        self.batch_size = source.batch_size
        self.timeout = 60.0

    def _run(self, bus: BusCapture) -> None:
        outcome, stack = self.outcome, self.stack
        batch = probe_items(self.batch_size, self.poison_at, self.template)
        assert batch.poison_key is not None
        since = time.time()
        began = time.monotonic()
        write_items(stack, "OrdersTable", batch.items, one_by_one=True)
        written = time.monotonic() - began
        done = wait(
            lambda: batch.valid_ids <= bus.seen() and self._depth(self.poison_queue) >= 1, self.timeout
        )
        outcome.figures["seconds_to_write_the_100"] = round(written, 2)
        outcome.figures["seconds_to_publish_and_park"] = round(time.monotonic() - began, 2)
        time.sleep(2 * POLL_SECONDS)  # a retry, had there been one, would show by now
        invocations = [i for i in stack.activity.invocations(RELAY) if i.at >= since]
        holding = [i for i in invocations if any(self._key(r) == batch.poison_key for r in i.records)]
        events = bus.snapshot()
        published = {i: events[i].deliveries for i in batch.valid_ids if i in events}
        parked = parked_messages(stack, self.poison_queue, batch.poison_key)
        relay_dlq = self._depth("RelayDeadLetterQueue")
        outcome.figures.update(
            relay_batch_size=self.batch_size,
            relay_invocations=len(invocations),
            records_per_invocation=[len(i.records) for i in invocations],
            invocations_holding_the_poison=len(holding),
            published_distinct=len(published),
            puts_on_the_bus=sum(published.values()),
            other_events_on_the_bus=len(set(events) - batch.valid_ids),
            poison_queue_messages=self._depth(self.poison_queue),
            relay_dlq_messages=relay_dlq,
            relay_responses=[i.result.payload for i in invocations],
        )
        outcome.check("everything published and parked within 60 s", done)
        if not outcome.check(
            "the relay received the 100 records as one batch, the poison at position 3",
            len(holding) == 1
            and len(holding[0].records) == self.batch_size
            and self._key(holding[0].records[self.poison_at]) == batch.poison_key,
            f"batches {[len(i.records) for i in invocations]}",
        ):
            return
        invocation = holding[0]
        record = invocation.records[self.poison_at]
        outcome.check(
            "the relay answered without batchItemFailures (nothing to retry or bisect)",
            invocation.result.ok
            and invocation.result.payload == {"batchItemFailures": []}
            and all(i.result.ok and not i.failed_ids for i in invocations),
            f"responses {[i.result.payload for i in invocations]}, errors "
            f"{[i.result.error for i in invocations if i.result.error]}",
        )
        outcome.check(
            f"{self.batch_size - 1} published on the bus, each once, nothing else",
            len(published) == self.batch_size - 1
            and set(published.values()) == {1}
            and set(events) == batch.valid_ids,
            f"{len(published)} published, {sum(published.values())} puts, "
            f"{len(set(events) - batch.valid_ids)} other events",
        )
        in_table = stack.clients.dynamodb().get_item(
            TableName=self.template.physical_name("OrdersTable"),
            Key={keys.PK: {"S": batch.poison_key[0]}, keys.SK: {"S": batch.poison_key[1]}},
            ConsistentRead=True,
        )
        message = parked[0] if len(parked) == 1 else {}
        written_item = batch.items[self.poison_at]
        outcome.check(
            "1 in the poison queue: the full item, equal to the table's byte for byte",
            len(parked) == 1
            and self._depth(self.poison_queue) == 1
            and message.get("eventId") == batch.poison_event_id
            and message.get("sequenceNumber") == record["dynamodb"]["SequenceNumber"]
            and message.get("streamArn") == stack.stream_arn("OrdersTable")
            and canonical_item(message.get("item")) == canonical_item(in_table.get("Item"))
            and canonical_item(message.get("item")) == canonical_item(written_item),
            f"{len(parked)} message(s) for the poison: {json.dumps(message)[:300]}",
        )
        outcome.check("nothing in the relay DLQ", relay_dlq == 0, f"{relay_dlq} message(s)")

    @staticmethod
    def _key(record: dict[str, Any]) -> tuple[str, str]:
        item = record["dynamodb"]["Keys"]
        return (str(item[keys.PK]["S"]), str(item[keys.SK]["S"]))
