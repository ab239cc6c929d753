"""Poison-pill isolation, measured: one bad record among N on the stream, one bad message among N on a queue.

Stream: N outbox items are written straight into the orders table, once all valid (the baseline) and
once with an undecodable one in the middle. The relay must publish the N-1 others, put exactly the
poison's range in its dead-letter queue, and hold the shard no longer than its retry budget (bisection
plus MaximumRetryAttempts), measured as the extra time the whole batch took and the invocations spent
on the poison.
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

from chaos.bus import BusCapture, NotificationCapture, queue_depth
from chaos.check import read_dlq, stream_range_keys
from chaos.harness import ChaosConfig, chaos_template
from local.activity import Invocation
from local.services import LocalServices
from local.stack import LocalStack, StackOptions
from shop import keys
from shop.config import EVENTBRIDGE_MAX_ENTRY_BYTES
from shop.envelope import CloudEvent
from shop.orders import ORDER_CONFIRMED
from shop.outbox import ENVELOPE, outbox_item
from shop.recovery import FailedStreamBatch

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
    dlq_exact: bool | None = None  # the DLQ holds exactly the poison (None: no poison in this phase)
    # From the start of the first invocation that held the poison to the end of the last one: for the
    # stream, how long the shard waited on it; for the queue, how long the poison kept coming back.
    poison_held_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _span(invocations: list[Invocation]) -> float | None:
    if not invocations:
        return None
    started = min(i.at - i.result.duration_ms / 1000 for i in invocations)
    return max(i.at for i in invocations) - started


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
        run = uuid.uuid4().hex[:8]
        items, valid_ids, poison_key = [], set(), None
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
                ttl_days=7,
                time_shards=8,
                max_event_bytes=EVENTBRIDGE_MAX_ENTRY_BYTES,
            )
            if poisoned and index == count // 2:
                item[ENVELOPE] = {"S": "{chaos: not JSON"}
                poison_key = (item[keys.PK]["S"], item[keys.SK]["S"])
            else:
                valid_ids.add(event.id)
            items.append(item)
        phase.sent = len(items)
        relay_dlq = self.stack.queue_url("RelayDeadLetterQueue")
        sqs = self.stack.clients.sqs()
        dlq_before = queue_depth(sqs, relay_dlq)
        since = time.time()
        began = time.monotonic()
        self._write(items)
        phase.seconds = _wait(lambda: valid_ids <= bus.seen(), self.timeout, f"{phase.name}: published")
        phase.processed = len(valid_ids & bus.seen())
        if poison_key is not None:
            _wait(lambda: queue_depth(sqs, relay_dlq) > dlq_before, self.timeout, "poison in the relay DLQ")
            phase.dead_lettered_after = time.monotonic() - began
            bodies = read_dlq(self.stack, "RelayDeadLetterQueue")
            batch = FailedStreamBatch.from_message(json.loads(bodies[-1]))
            covered = stream_range_keys(self.stack.clients.streams(), batch)
            phase.dlq_exact = covered == [poison_key]
            held = [
                invocation
                for invocation in self._invocations("OutboxRelayFunction", since)
                if any(
                    r["dynamodb"]["SequenceNumber"] == batch.start_sequence_number for r in invocation.records
                )
            ]
            phase.poison_invocations = len(held)
            phase.poison_held_seconds = _span(held)
        phase.invocations = len(self._invocations("OutboxRelayFunction", since))
        return phase

    def _invocations(self, function: str, since: float) -> list[Invocation]:
        return [i for i in self.stack.activity.invocations(function) if i.at >= since]

    def _write(self, items: list[dict[str, Any]]) -> None:
        dynamodb = self.stack.clients.dynamodb()
        table = self.template.physical_name("OrdersTable")
        for start in range(0, len(items), _BATCH_WRITE):
            requests: list[Any] = [{"PutRequest": {"Item": i}} for i in items[start : start + _BATCH_WRITE]]
            for _ in range(10):
                left = dynamodb.batch_write_item(RequestItems={table: requests}).get("UnprocessedItems", {})
                requests = list(left.get(table, []))
                if not requests:
                    break

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
        # The batch, its bisection down to the poison, then 1 + MaximumRetryAttempts invocations of it alone.
        bisections = max(1, (relay.batch_size - 1).bit_length())
        stream_budget = 1 + bisections + 1 + relay.maximum_retry_attempts
        base_stream, poisoned_stream = stream
        base_queue, poisoned_queue = queue
        checks = {
            "stream: every valid record published": poisoned_stream.processed == self.records - 1,
            "stream: the relay DLQ range is exactly the poison": poisoned_stream.dlq_exact is True,
            "stream: invocations on the poison within the retry budget": 0
            < poisoned_stream.poison_invocations
            <= stream_budget,
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
                "retry_budget_invocations": stream_budget,
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
        for phase in ("baseline", "with_poison"):
            p = data[phase]
            dlq = (
                f", poison in the DLQ after {p['dead_lettered_after']} s" if p["dead_lettered_after"] else ""
            )
            lines.append(
                f"  {p['name']:<22} {p['processed']}/{p['sent']} processed in {p['seconds']} s"
                f"{dlq}, invocations on the poison {p['poison_invocations']}"
            )
        lines.append(f"  {part}: extra time for the poison {data['extra_seconds_for_the_poison']} s")
    lines.append("")
    for name, ok in report["checks"].items():
        lines.append(f"  [{'ok  ' if ok else 'FAIL'}] {name}")
    lines.append(f"\nresult: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)
