"""Poison-pill isolation, measured: one bad record among N on the stream, one bad message among N on a queue.

Stream: N outbox items are written straight into the orders table, once all valid (the baseline) and
once with an undecodable one in the middle. The relay must publish the N-1 others, park the poison whole
in its poison queue (the message's item equal to the table's, byte for byte), leave its dead-letter queue
empty and not hold the shard: the poison is delivered once, in a batch that reports no
batchItemFailures, and never retried. Measured: the extra time the whole run took, the invocations that
held the poison and how long the shard waited on it (from the end of its first invocation to the end of
its last: 0 when it was parked at once).
Queue: N messages are sent straight to the notification queue, once all valid and once with a malformed
one in the middle. The consumer must notify the N-1 others in about the baseline's time (the poison does
not block the queue), and SQS must move the poison to the dead-letter queue after maxReceiveCount
receives.

The probe events have a type no consumer rule matches (stream) or are notifications of orders that do
not exist (queue): nothing else reacts to them. Only the relay and the notification consumer run.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import ENVELOPE, outbox_item
from shop.domain.envelope import CloudEvent
from shop.domain.orders import ORDER_CONFIRMED
from shop.runtime.config import EVENTBRIDGE_MAX_ENTRY_BYTES
from tools.chaos.bus import BusCapture, NotificationCapture, queue_depth
from tools.chaos.check_dead_letters import canonical_item, parked_key, parked_poison
from tools.chaos.config import ChaosConfig
from tools.chaos.snapshot import read_dlq
from tools.chaos.topology import chaos_template, relay_poison_queue
from tools.local.console.activity import Invocation
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template

PROBE_SOURCE = "chaos.isolation"
PROBE_TYPE = "IsolationProbe"
_BATCH_WRITE = 25
_SEND_BATCH = 10
_POLL_SECONDS = 0.5
_WARM_UP = 50


@dataclass
class Phase:
    name: str
    sent: int
    processed: int = 0
    seconds: float = 0.0  # first write/send to the last of the valid ones processed
    dead_lettered_after: float | None = None  # first write/send to the poison in the DLQ
    poison_invocations: int = 0  # invocations whose batch held the poison
    invocations: int = 0  # of the function, in this phase
    # Stream: the poison queue holds exactly the poison, whole, and the relay DLQ nothing. Queue: the
    # DLQ holds exactly the poison. None: no poison in this phase.
    dlq_exact: bool | None = None
    # Stream: from the end of the first invocation that held the poison to the end of the last one,
    # how long the shard waited on it (0: parked at once). Queue: from the start of the first
    # invocation that held it to the end of the last one, how long the poison kept coming back.
    poison_held_seconds: float | None = None
    relay_dlq_messages: int | None = None  # stream: new messages in the relay DLQ (must be 0)
    batch_item_failures: int | None = None  # stream: records the relay reported failed in this phase

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _span(invocations: list[Invocation]) -> float | None:
    if not invocations:
        return None
    started = min(i.at - i.result.duration_ms / 1000 for i in invocations)
    return max(i.at for i in invocations) - started


def _retried_for(invocations: list[Invocation]) -> float | None:
    """How long a record was retried: from the end of its first invocation to the end of its last."""
    if not invocations:
        return None
    return max(i.at for i in invocations) - min(i.at for i in invocations)


@dataclass
class ProbeBatch:
    """Outbox items of probe events (no consumer rule matches them), one of them poison if asked."""

    items: list[dict[str, Any]]
    valid_ids: set[str]
    poison_key: tuple[str, str] | None = None
    poison_event_id: str | None = None


def probe_items(count: int, poison_at: int | None, template: Template) -> ProbeBatch:
    """`count` outbox items of probe events; the one at index `poison_at` has an undecodable envelope."""
    run = uuid.uuid4().hex[:8]
    ttl_days = int(template.parameter_values.get("OutboxTtlDays", "16"))
    batch = ProbeBatch([], set())
    for index in range(count):
        event = CloudEvent.new(
            source=PROBE_SOURCE,
            type=PROBE_TYPE,
            subject=f"iso-{run}-{index}",
            sequence=1,
            data={"index": index},
            correlation_id=f"iso-{run}",
        )
        item = outbox_item(
            event,
            keys.order_partition(event.subject),
            ttl_days=ttl_days,
            time_shards=8,
            max_event_bytes=EVENTBRIDGE_MAX_ENTRY_BYTES,
        )
        if index == poison_at:
            item[ENVELOPE] = {"S": "{chaos: not JSON"}
            batch.poison_key = (item[keys.PK]["S"], item[keys.SK]["S"])
            batch.poison_event_id = event.id
        else:
            batch.valid_ids.add(event.id)
        batch.items.append(item)
    return batch


def write_items(
    stack: LocalStack, table: str, items: list[dict[str, Any]], *, one_by_one: bool = False
) -> None:
    """Write items to a table of the stack: BatchWriteItem (25 a call), or PutItem in order."""
    dynamodb = stack.clients.dynamodb()
    name = stack.template.physical_name(table)
    if one_by_one:  # one stream record after the other, in this order
        for item in items:
            dynamodb.put_item(TableName=name, Item=item)
        return
    for start in range(0, len(items), _BATCH_WRITE):
        requests: list[Any] = [{"PutRequest": {"Item": i}} for i in items[start : start + _BATCH_WRITE]]
        for _ in range(10):
            left = dynamodb.batch_write_item(RequestItems={name: requests}).get("UnprocessedItems", {})
            requests = list(left.get(name, []))
            if not requests:
                break


def parked_messages(stack: LocalStack, poison_queue: str, key: tuple[str, str]) -> list[dict[str, Any]]:
    """The poison queue messages that park the outbox item with this key."""
    messages = [parked_poison(body) for body in read_dlq(stack, poison_queue)]
    return [m for m in messages if m is not None and parked_key(m) == key]


def parked_whole(stack: LocalStack, message: dict[str, Any], key: tuple[str, str]) -> bool:
    """The parked message holds the item exactly as the orders table holds it, byte for byte."""
    in_table = (
        stack.clients.dynamodb()
        .get_item(
            TableName=stack.template.physical_name("OrdersTable"),
            Key={keys.PK: {"S": key[0]}, keys.SK: {"S": key[1]}},
            ConsistentRead=True,
        )
        .get("Item")
    )
    return in_table is not None and canonical_item(message.get("item")) == canonical_item(in_table)


def _wait(condition: Any, timeout: float, what: str) -> float:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(_POLL_SECONDS)
    return time.monotonic() - began


class Isolation:
    def __init__(self, records: int, out_dir: Path, services: LocalServices | None = None) -> None:
        self.records = records
        config = ChaosConfig(stack_name="isolation", out_dir=out_dir)
        self.template = chaos_template(config)
        options = StackOptions(
            api_port=0,
            data_dir=out_dir / "isolation-stack",
            seed_file=None,
            only_functions=frozenset({"OutboxRelayFunction", "NotificationFunction"}),
        )
        self.stack = LocalStack(self.template, options, services=services)
        self.poison_queue = relay_poison_queue(self.template)
        self.timeout = max(300.0, records * 0.5)

    def run(self) -> dict[str, Any]:
        self.stack.start()
        try:
            bus = BusCapture(self.stack, self.template.physical_name("EventBus"), "isolation")
            notifications = NotificationCapture(self.stack, "NotificationTopic")
            bus.start()
            notifications.start()
            try:
                # A small unmeasured round first: cold starts and JIT warm-up are not the poison's cost.
                self._stream(bus, poisoned=False, records=_WARM_UP)
                stream = [self._stream(bus, poisoned=False), self._stream(bus, poisoned=True)]
                self._queue(notifications, poisoned=False, records=_WARM_UP)
                queue = [
                    self._queue(notifications, poisoned=False),
                    self._queue(notifications, poisoned=True),
                ]
            finally:
                bus.stop()
                notifications.stop()
            return self._report(stream, queue, bus.errors + notifications.errors)
        finally:
            self.stack.stop()

    # --- the stream -----------------------------------------------------------------------------
    def _stream(self, bus: BusCapture, *, poisoned: bool, records: int | None = None) -> Phase:
        count = records or self.records
        phase = Phase("stream, one poison" if poisoned else "stream, baseline", count)
        batch = probe_items(count, count // 2 if poisoned else None, self.template)
        valid_ids, poison_key = batch.valid_ids, batch.poison_key
        phase.sent = len(batch.items)
        sqs = self.stack.clients.sqs()
        relay_dlq = self.stack.queue_url("RelayDeadLetterQueue")
        poison_queue = self.stack.queue_url(self.poison_queue)
        dlq_before = queue_depth(sqs, relay_dlq)
        parked_before = queue_depth(sqs, poison_queue)
        since = time.time()
        began = time.monotonic()
        write_items(self.stack, "OrdersTable", batch.items)
        phase.seconds = _wait(lambda: valid_ids <= bus.seen(), self.timeout, f"{phase.name}: published")
        phase.processed = len(valid_ids & bus.seen())
        if poison_key is not None:
            _wait(lambda: queue_depth(sqs, poison_queue) > parked_before, self.timeout, "poison parked")
            phase.dead_lettered_after = time.monotonic() - began
            parked = parked_messages(self.stack, self.poison_queue, poison_key)
            phase.relay_dlq_messages = queue_depth(sqs, relay_dlq) - dlq_before
            phase.dlq_exact = (
                len(parked) == 1
                and parked[0].get("eventId") == batch.poison_event_id
                and parked_whole(self.stack, parked[0], poison_key)
                and queue_depth(sqs, poison_queue) - parked_before == 1
                and phase.relay_dlq_messages == 0
            )
            sequence = str(parked[0].get("sequenceNumber")) if parked else ""
            held = [
                invocation
                for invocation in self._invocations("OutboxRelayFunction", since)
                if any(r["dynamodb"]["SequenceNumber"] == sequence for r in invocation.records)
            ]
            phase.poison_invocations = len(held)
            phase.poison_held_seconds = _retried_for(held)
        invocations = self._invocations("OutboxRelayFunction", since)
        phase.invocations = len(invocations)
        phase.batch_item_failures = sum(len(i.failed_ids) for i in invocations)
        return phase

    def _invocations(self, function: str, since: float) -> list[Invocation]:
        return [i for i in self.stack.activity.invocations(function) if i.at >= since]

    # --- the queue ------------------------------------------------------------------------------
    def _queue(
        self, notifications: NotificationCapture, *, poisoned: bool, records: int | None = None
    ) -> Phase:
        count = records or self.records
        phase = Phase("queue, one malformed" if poisoned else "queue, baseline", count)
        run = uuid.uuid4().hex[:8]
        bodies, valid_ids, marker = [], set(), None
        for index in range(count):
            if poisoned and index == count // 2:
                marker = f"chaos-malformed-{run}"
                bodies.append(f"{marker}: not JSON {{")
                continue
            event = CloudEvent.new(
                source="shop.orders",
                type=ORDER_CONFIRMED,
                subject=f"o-iso-{run}-{index}",
                sequence=2,
                data={"customerId": "c-iso", "status": "CONFIRMED"},
                correlation_id=f"iso-{run}",
            )
            valid_ids.add(event.id)
            bodies.append(json.dumps({"version": "0", "id": str(uuid.uuid4()), "detail": event.to_dict()}))
        sqs = self.stack.clients.sqs()
        queue = self.stack.queue_url("NotificationQueue")
        dlq = self.stack.queue_url("NotificationDeadLetterQueue")
        dlq_before = queue_depth(sqs, dlq)
        since = time.time()
        began = time.monotonic()
        for start in range(0, len(bodies), _SEND_BATCH):
            chunk = bodies[start : start + _SEND_BATCH]
            sqs.send_message_batch(
                QueueUrl=queue, Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)]
            )

        def done() -> bool:
            return valid_ids <= set(notifications.by_event_id())

        phase.seconds = _wait(done, self.timeout, f"{phase.name}: notified")
        phase.processed = len(valid_ids & set(notifications.by_event_id()))
        if marker is not None:
            _wait(lambda: queue_depth(sqs, dlq) > dlq_before, self.timeout, "malformed message in the DLQ")
            phase.dead_lettered_after = time.monotonic() - began
            in_dlq = [b for b in read_dlq(self.stack, "NotificationDeadLetterQueue") if b.startswith(marker)]
            phase.dlq_exact = len(in_dlq) == 1
            held = [
                invocation
                for invocation in self._invocations("NotificationFunction", since)
                if any(r["body"].startswith(marker) for r in invocation.records)
            ]
            phase.poison_invocations = len(held)
            phase.poison_held_seconds = _span(held)
        phase.invocations = len(self._invocations("NotificationFunction", since))
        return phase

    # --- report ---------------------------------------------------------------------------------
    def _report(self, stream: list[Phase], queue: list[Phase], errors: list[str]) -> dict[str, Any]:
        relay = next(s for s in self.stack.sources.streams if s.function == "OutboxRelayFunction")
        consumer = next(q for q in self.stack.sources.queues if q.function == "NotificationFunction")
        receives = int(self.template.parameter_values["ConsumerMaxReceiveCount"])
        visibility = self.template.properties(consumer.queue)["VisibilityTimeout"]
        base_stream, poisoned_stream = stream
        base_queue, poisoned_queue = queue
        checks = {
            "stream: every valid record published": poisoned_stream.processed == self.records - 1,
            "stream: the poison parked once, whole; the relay DLQ empty": poisoned_stream.dlq_exact is True,
            "stream: the poison delivered once, no batchItemFailures (the shard not held)": (
                poisoned_stream.poison_invocations == 1
                and poisoned_stream.batch_item_failures == 0
                and poisoned_stream.poison_held_seconds == 0
            ),
            "queue: every valid message processed": poisoned_queue.processed == self.records - 1,
            "queue: the poison is in the DLQ": poisoned_queue.dlq_exact is True,
            "queue: the poison was received maxReceiveCount times": poisoned_queue.poison_invocations
            == receives,
            "harness: no capture error": not errors,
        }
        return {
            "passed": all(checks.values()),
            "records": self.records,
            "checks": checks,
            "stream": {
                "baseline": base_stream.to_dict(),
                "with_poison": poisoned_stream.to_dict(),
                "extra_seconds_for_the_poison": round(poisoned_stream.seconds - base_stream.seconds, 2),
                "shard_held_seconds": poisoned_stream.poison_held_seconds,
                "relay_settings": {
                    "batch_size": relay.batch_size,
                    "maximum_retry_attempts": relay.maximum_retry_attempts,
                    "bisect_on_error": relay.bisect_on_error,
                },
            },
            "queue": {
                "baseline": base_queue.to_dict(),
                "with_poison": poisoned_queue.to_dict(),
                "extra_seconds_for_the_poison": round(poisoned_queue.seconds - base_queue.seconds, 2),
                "max_receive_count": receives,
                "visibility_timeout_seconds": visibility,
            },
            "errors": errors,
        }


def render(report: dict[str, Any]) -> str:
    lines = [f"poison-pill isolation: {report['records']} records / messages per phase", ""]
    for part in ("stream", "queue"):
        data = report[part]
        where = "parked in the poison queue" if part == "stream" else "in the DLQ"
        for phase in ("baseline", "with_poison"):
            p = data[phase]
            dlq = f", poison {where} after {p['dead_lettered_after']} s" if p["dead_lettered_after"] else ""
            lines.append(
                f"  {p['name']:<22} {p['processed']}/{p['sent']} processed in {p['seconds']} s"
                f"{dlq}, invocations on the poison {p['poison_invocations']}"
            )
        lines.append(f"  {part}: extra time for the poison {data['extra_seconds_for_the_poison']} s")
        if part == "stream":
            poisoned = data["with_poison"]
            lines.append(
                f"  stream: shard held by the poison {data['shard_held_seconds']} s; batchItemFailures "
                f"{poisoned['batch_item_failures']}; new relay DLQ messages {poisoned['relay_dlq_messages']}"
            )
    lines.append("")
    for name, ok in report["checks"].items():
        lines.append(f"  [{'ok  ' if ok else 'FAIL'}] {name}")
    lines.append(f"\nresult: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)
