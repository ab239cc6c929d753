"""The redrive recovery scenarios (recovery_scenarios.py's docstring says what each expects):
stale-redrive, a relay DLQ batch older than the outbox TTL; rejected-redrive, redrive-poison while the
bus still refuses the record (tools/chaos/refusals.py)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tools.chaos import refusals
from tools.chaos.bus import BusCapture, queue_depth
from tools.chaos.check_dead_letters import parked_poison
from tools.chaos.isolation import probe_items, write_items
from tools.chaos.recovery_scenarios import (
    POLL_SECONDS,
    RELAY,
    Scenario,
    iso,
    outbox_ttl_days,
    run_admin,
    wait,
)
from tools.chaos.snapshot import read_dlq
from tools.local.operator_commands import CommandRun
from tools.local.services.emulators import LocalServices
from tools.template import REGION

REFUSALS_MODULE = Path(refusals.__file__)


def failure_message(
    stream_arn: str, shard_id: str, start: str, end: str, arrival: datetime, size: int
) -> dict[str, Any]:
    """The body Lambda sends to a stream mapping's OnFailure queue (as the local stream poller does)."""
    return {
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": f"arn:aws:lambda:{REGION}:000000000000:function:{RELAY}",
            "condition": "RecordAgeExceeded",
            "approximateInvokeCount": 1,
        },
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"},
        "version": "1.0",
        "timestamp": iso(arrival + timedelta(hours=23)),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": start,
            "endSequenceNumber": end,
            "approximateArrivalOfFirstRecord": iso(arrival),
            "approximateArrivalOfLastRecord": iso(arrival + timedelta(seconds=30)),
            "batchSize": size,
            "streamArn": stream_arn,
        },
    }


# --- b. a stale relay DLQ message whose range the stream no longer serves -------------------------------
class StaleRedrive(Scenario):
    name = "stale-redrive"
    control_records = 5

    def __init__(self, out_dir: Path, services: LocalServices | None = None) -> None:
        # No function and no poller: the operator command alone works on the stack's resources.
        super().__init__(out_dir, services, serve=False)
        self.ttl_days = outbox_ttl_days(self.template)

    def _run(self, bus: BusCapture) -> None:
        outcome, stack = self.outcome, self.stack
        sqs = stack.clients.sqs()
        dlq_url = stack.queue_url("RelayDeadLetterQueue")
        stream_arn = stack.stream_arn("OrdersTable")
        # Outbox items the stream and the table hold now: none of them is the stale batch's.
        recent = probe_items(self.control_records, None, self.template)
        write_items(stack, "OrdersTable", recent.items)
        shards = stack.clients.streams().describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
        trimmed = f"shardId-00000000000000000001-{uuid.uuid4().hex[:8]}"  # a shard the stream no longer has
        now = datetime.now(UTC)
        arrival = now - timedelta(days=self.ttl_days + 1)
        stale = failure_message(
            stream_arn, trimmed, "000000000000000000001", "000000000000000000100", arrival, 100
        )
        stale_id = sqs.send_message(QueueUrl=dlq_url, MessageBody=json.dumps(stale))["MessageId"]

        result = run_admin(stack, "redrive", "--queue-url", dlq_url, "--max-messages", "10")
        reports = {r.get("messageId"): r for r in result.reports()}
        report = reports.get(stale_id, {})
        missing = " ".join(str(m) for m in report.get("missing", []))
        time.sleep(2 * POLL_SECONDS)  # anything it put on the bus would be captured by now
        outcome.figures.update(
            outbox_ttl_days=self.ttl_days,
            batch_arrived=iso(arrival),
            shards_the_stream_has=[s["ShardId"] for s in shards],
            trimmed_shard=trimmed,
            exit_code=result.exit_code,
            report=report,
            stderr=result.stderr.strip()[-400:],
            relay_dlq_messages_after=queue_depth(sqs, dlq_url),
        )
        outcome.check("the command exits 1", result.exit_code == 1, f"exit {result.exit_code}")
        outcome.check(
            "its report is incomplete and names the outbox TTL",
            report.get("complete") is False
            and "TTL" in missing
            and f"{self.ttl_days} days" in missing
            and report.get("published") == 0,
            f"report {json.dumps(report)[:400]}; stdout {result.stdout[-400:]}",
        )
        outcome.check(
            "it says on stderr that the message was kept",
            "kept" in result.stderr and dlq_url in result.stderr,
            result.stderr[-300:],
        )
        outcome.check(
            "the message is still in the relay DLQ",
            queue_depth(sqs, dlq_url) == 1 and (result.summary() or {}).get("kept") == 1,
            f"depth {queue_depth(sqs, dlq_url)}, summary {result.summary()}",
        )
        outcome.check(
            "nothing put on the bus, nothing parked",
            not bus.seen() and self._depth(self.poison_queue) == 0,
            f"{len(bus.seen())} events on the bus, {self._depth(self.poison_queue)} parked",
        )
        # The kept message is visible again: an operator would now decide its fate. Out of the way of
        # the control run, which must then be the only message and end with exit 0.
        for message in sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10).get("Messages", []):
            sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=message["ReceiptHandle"])
        self._control(bus, dlq_url, stream_arn, trimmed, recent.valid_ids)

    def _control(self, bus: BusCapture, dlq_url: str, stream_arn: str, trimmed: str, ids: set[str]) -> None:
        """The same trimmed shard, arrived now: redriven from the table's time index, and deleted."""
        outcome, stack = self.outcome, self.stack
        message = failure_message(
            stream_arn,
            trimmed,
            "000000000000000000001",
            "000000000000000000100",
            datetime.now(UTC) - timedelta(seconds=30),
            len(ids),
        )
        sqs = stack.clients.sqs()
        sqs.send_message(QueueUrl=dlq_url, MessageBody=json.dumps(message))
        result = run_admin(stack, "redrive", "--queue-url", dlq_url, "--max-messages", "10")
        republished = wait(lambda: ids <= bus.seen(), 30.0)
        outcome.figures.update(
            control_exit_code=result.exit_code,
            control_reports=result.reports(),
            relay_dlq_messages_after_control=queue_depth(sqs, dlq_url),
        )
        outcome.check(
            "control: a batch inside the TTL is redriven from the table, deleted, exit 0",
            result.exit_code == 0
            and republished
            and queue_depth(sqs, dlq_url) == 0
            and (result.summary() or {}).get("redriven") == 1,
            f"exit {result.exit_code}, on the bus {republished}, summary {result.summary()}, "
            f"stderr {result.stderr[-300:]}",
        )


# --- d. redrive-poison while EventBridge still refuses the record ----------------------------------------
class RejectedRedrive(Scenario):
    """The bus refuses one event (tools.chaos.refusals: moto refuses nothing the relay sends). The relay
    parks it and publishes its neighbours; `redrive-poison` run before the cause is fixed must keep the
    message, exit 1 and put nothing on the bus; run after, it republishes the event once and deletes it."""

    name = "rejected-redrive"
    records = 3

    def __init__(self, out_dir: Path, services: LocalServices | None = None) -> None:
        self.refusals = out_dir / "rejected-redrive-refusals.txt"
        super().__init__(
            out_dir,
            services,
            functions=frozenset({RELAY}),
            function_environment={
                "LOCAL_WORKER_PRELOAD": str(REFUSALS_MODULE),
                refusals.REFUSALS_ENV: str(self.refusals),
            },
        )
        self.timeout = 60.0

    def _redrive_poison(self) -> CommandRun:
        return run_admin(
            self.stack,
            "redrive-poison",
            "--max-messages",
            "10",
            module="tools.chaos.refusals",
            env={refusals.REFUSALS_ENV: str(self.refusals)},
        )

    def _run(self, bus: BusCapture) -> None:
        outcome, stack = self.outcome, self.stack
        batch = probe_items(self.records, None, self.template)
        refused = sorted(batch.valid_ids)[0]
        others = batch.valid_ids - {refused}
        self.refusals.write_text(refused + "\n")
        write_items(stack, "OrdersTable", batch.items, one_by_one=True)
        settled = wait(lambda: others <= bus.seen() and self._depth(self.poison_queue) >= 1, self.timeout)
        parked = [m for m in (parked_poison(b) for b in read_dlq(stack, self.poison_queue)) if m is not None]
        outcome.check("the relay published the others and parked the refused one", settled)
        outcome.check(
            "parked: the refused event, with the bus's reason",
            [m.get("eventId") for m in parked] == [refused]
            and parked[0].get("reason") == "EventBridge rejected the entry: MalformedDetail",
            json.dumps(parked)[:300],
        )

        still = self._redrive_poison()
        [report] = still.reports() or [{}]
        time.sleep(2 * POLL_SECONDS)  # anything it put on the bus would be captured by now
        outcome.figures.update(
            refused_event=refused,
            before_fix_exit_code=still.exit_code,
            before_fix_report=report,
            poison_queue_after_first_run=self._depth(self.poison_queue),
        )
        outcome.check("before the fix: exit 1", still.exit_code == 1, f"exit {still.exit_code}")
        outcome.check(
            "before the fix: nothing counted published, the refusal named",
            report.get("published") == 0
            and report.get("unpublished") == [refused]
            and "still rejects" in " ".join(report.get("missing", [])),
            json.dumps(report)[:400],
        )
        outcome.check(
            "before the fix: the message kept, once, and the event not on the bus",
            self._depth(self.poison_queue) == 1 and refused not in bus.seen(),
            f"{self._depth(self.poison_queue)} parked, on the bus {refused in bus.seen()}",
        )

        self.refusals.write_text("")  # the cause is fixed
        fixed = self._redrive_poison()
        on_bus = wait(lambda: refused in bus.seen(), 30.0)
        events = bus.snapshot()
        outcome.figures.update(
            after_fix_exit_code=fixed.exit_code,
            after_fix_reports=fixed.reports(),
            deliveries_of_the_refused_event=events[refused].deliveries if refused in events else 0,
        )
        outcome.check(
            "after the fix: exit 0, the event on the bus once, the message deleted",
            fixed.exit_code == 0
            and on_bus
            and events[refused].deliveries == 1
            and self._depth(self.poison_queue) == 0,
            f"exit {fixed.exit_code}, stderr {fixed.stderr[-300:]}",
        )
