"""Recovery scenarios against the local stack, each with a pass/fail expectation.

- full-batch (`python -m tools.chaos full-batch`): 100 outbox items written to the orders table so that the
  relay receives them as ONE batch (the mapping's RelayBatchSize, 100), an undecodable one at position
  3. Expected: the 99 others on the bus, each once; the poison in the relay poison queue, its message's
  item equal to the table's item byte for byte; nothing in the relay DLQ; the relay invoked once for the
  batch, with no batchItemFailures. The local poller invokes with whatever it has read when its batching
  window (the template's RelayBatchingWindowSeconds, 0) ends, and 100 PutItems take longer than one
  poll: this stack's window is 5 s, so the 100 records are gathered into one batch as Lambda would
  gather records that are already in the stream.
- stale-redrive (`python -m tools.chaos stale-redrive`): a relay DLQ message in the shape Lambda's OnFailure
  sends, whose batch arrived before the outbox TTL horizon (now - OutboxTtlDays - 1 day), for a shard
  the stream no longer has (trimmed: GetShardIterator answers ResourceNotFoundException). The real
  operator command (`python -m operations redrive` with --queue-url/--bus/--poison-queue-url against
  the local endpoints) must exit 1, name the TTL in its report, and leave the message in the queue;
  nothing is put on the bus. A control message for the same trimmed shard that arrived now is redriven
  from the table and deleted (exit 0): the refusal is the TTL's, not the trimmed shard's.
- replay (`python -m tools.chaos replay`): a chaos run (faults on, ORDERS orders) drains and passes its
  checks;
  then `python -m operations replay --from <now - 2 days> --to <now>` runs for the orders table and
  the inventory table, and the pipeline drains again. Expected: every replayed event on the bus again,
  and nothing repeated: stock, orders, reservations and request keys unchanged item for item, no new
  outbox item, no new notification (SNS publishes counted per eventId from the topic's capture queue,
  as tools/chaos/check.py counts them), no new dead letter; every invariant of the run still holds.
- rejected-redrive (`python -m tools.chaos rejected-redrive`): the bus refuses one of 3 outbox events
  (tools/chaos/refusals.py, MalformedDetail); the relay parks it and publishes the 2 others. The real
  `redrive-poison` command run while the bus still refuses it must exit 1, count nothing published, name
  the refusal and keep the message; after the refusal is lifted, the same command republishes the event
  once, deletes the message and exits 0.

- hot-sku (`python -m tools.chaos hot-sku`): a chaos run (faults on, ORDERS orders) where every order asks
  for the same SKU, so every reservation writes one stock item, and each attempt of a consumer's business
  transaction is cancelled for TransactionConflict with probability 0.6, as AWS cancels transactions that
  overlap on a hot item (DynamoDB Local serialises them and never does). Expected: every invariant of the
  run (no valid message dead-lettered, no order left PENDING, stock = reservations), and the run must
  have hit some event with at least maxReceiveCount conflicts (each one a failed receive before the
  consumers retried conflicts in-process), or it proved nothing.

Each scenario returns a report: name, passed, checks (name -> bool), figures, problems (what failed).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shop.adapters import keys
from tools.chaos import refusals
from tools.chaos.bus import BusCapture, queue_depth
from tools.chaos.check import canonical_item, collect, evaluate, parked_poison, read_dlq
from tools.chaos.harness import ChaosConfig, Live, Run, relay_poison_queue
from tools.chaos.harness import run as run_chaos
from tools.chaos.isolation import parked_messages, probe_items, write_items
from tools.local.pollers.event_sources import read_event_sources
from tools.local.services.emulators import FAKE_CREDENTIALS, LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import REGION, ROOT, Template

RELAY = "OutboxRelayFunction"
REFUSALS_MODULE = Path(refusals.__file__)
FULL_BATCH_WINDOW_SECONDS = 5
_POLL_SECONDS = 0.5
_ADMIN_TIMEOUT_SECONDS = 600.0


@dataclass
class Outcome:
    """A scenario's result: named checks, figures, and what failed, in words."""

    name: str
    checks: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, problem: str = "") -> bool:
        self.checks[name] = ok
        if not ok:
            self.problems.append(f"{name}: {problem}" if problem else name)
        return ok

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "checks": self.checks,
            "figures": self.figures,
            "problems": self.problems,
        }


def render(report: dict[str, Any]) -> str:
    lines = [f"scenario {report['name']}", ""]
    lines += [f"  {name:<52} {value}" for name, value in report["figures"].items()]
    lines.append("")
    for name, ok in report["checks"].items():
        lines.append(f"  [{'ok  ' if ok else 'FAIL'}] {name}")
    lines += [f"           {problem}" for problem in report["problems"]]
    lines.append(f"\nresult: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)


def _wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_SECONDS)
    return True


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the operator command, run for real against the local stack ---------------------------------------
@dataclass
class AdminRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def _objects(self) -> list[dict[str, Any]]:
        found = []
        for line in self.stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
        return found

    def reports(self) -> list[dict[str, Any]]:
        """The recovery reports it printed (its Powertools log lines carry "level")."""
        return [o for o in self._objects() if "missing" in o and "complete" in o and "level" not in o]

    def summary(self) -> dict[str, Any] | None:
        """The closing {"redriven", "kept"} line of redrive commands."""
        return next((o for o in self._objects() if "redriven" in o and "level" not in o), None)


def admin_environment(stack: LocalStack) -> dict[str, str]:
    """The command's environment: local endpoints, fake credentials, the stack's outbox settings."""
    relay = stack.template.function(RELAY).environment
    return {
        **os.environ,
        **FAKE_CREDENTIALS,
        **stack.endpoints.environment(),
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        # The operator's ~/.aws files must not redirect the command away from the local stack.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "POWERTOOLS_TRACE_DISABLED": "true",
        "OUTBOX_TTL_DAYS": relay["OUTBOX_TTL_DAYS"],
        "MAX_EVENT_BYTES": relay["MAX_EVENT_BYTES"],
    }


def run_admin(
    stack: LocalStack, *arguments: str, module: str = "operations", env: dict[str, str] | None = None
) -> AdminRun:
    """`python -m operations` with the stack's bus and poison queue given explicitly (no --stack-name);
    `module` may be a wrapper that runs it (tools.chaos.refusals), with `env` added."""
    argv = [
        sys.executable,
        "-m",
        module,
        "--bus",
        stack.template.physical_name("EventBus"),
        "--poison-queue-url",
        stack.queue_url(relay_poison_queue(stack.template)),
        *arguments,
    ]
    began = time.monotonic()
    completed = subprocess.run(  # noqa: S603 - our own script, with our own interpreter
        argv,
        cwd=ROOT,
        env={**admin_environment(stack), **(env or {})},
        capture_output=True,
        text=True,
        timeout=_ADMIN_TIMEOUT_SECONDS,
        check=False,
    )
    return AdminRun(argv, completed.returncode, completed.stdout, completed.stderr, time.monotonic() - began)


def outbox_ttl_days(template: Template) -> int:
    return int(template.function(RELAY).environment["OUTBOX_TTL_DAYS"])


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
        "timestamp": _iso(arrival + timedelta(hours=23)),
        "DDBStreamBatchInfo": {
            "shardId": shard_id,
            "startSequenceNumber": start,
            "endSequenceNumber": end,
            "approximateArrivalOfFirstRecord": _iso(arrival),
            "approximateArrivalOfLastRecord": _iso(arrival + timedelta(seconds=30)),
            "batchSize": size,
            "streamArn": stream_arn,
        },
    }


class _Scenario:
    """A stack of its own (the template as `make local` runs it, another stack name) for one scenario."""

    name = ""

    def __init__(
        self,
        out_dir: Path,
        services: LocalServices | None,
        *,
        parameters: dict[str, str] | None = None,
        functions: frozenset[str] = frozenset(),
        serve: bool = True,
        function_environment: dict[str, str] | None = None,
    ) -> None:
        stack_name = self.name.replace("-", "")
        self.template = Template(
            copy.deepcopy(Template.load().data), parameters=parameters or {}, stack_name=stack_name
        )
        options = StackOptions(
            api_port=0,
            data_dir=out_dir / f"{stack_name}-stack",
            seed_file=None,
            only_functions=functions,
            serve=serve,
            function_environment=function_environment or {},
        )
        self.stack = LocalStack(self.template, options, services=services)
        self.outcome = Outcome(self.name)
        self.poison_queue = relay_poison_queue(self.template)

    def run(self) -> dict[str, Any]:
        self.stack.start()
        try:
            if self.stack.report.init_errors:
                raise RuntimeError(f"functions failed to start: {self.stack.report.init_errors}")
            bus = BusCapture(self.stack, self.template.physical_name("EventBus"), self.name)
            bus.start()
            try:
                self._run(bus)
            finally:
                bus.stop()
            self.outcome.check("harness: no capture error", not bus.errors, "; ".join(bus.errors[:3]))
            return self.outcome.to_dict()
        finally:
            self.stack.stop()

    def _run(self, bus: BusCapture) -> None:
        raise NotImplementedError

    def _depth(self, queue: str) -> int:
        return queue_depth(self.stack.clients.sqs(), self.stack.queue_url(queue))


# --- a. poison at position 3 of a full batch of 100 ---------------------------------------------------
class FullBatchPoison(_Scenario):
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
        done = _wait(
            lambda: batch.valid_ids <= bus.seen() and self._depth(self.poison_queue) >= 1, self.timeout
        )
        outcome.figures["seconds_to_write_the_100"] = round(written, 2)
        outcome.figures["seconds_to_publish_and_park"] = round(time.monotonic() - began, 2)
        time.sleep(2 * _POLL_SECONDS)  # a retry, had there been one, would show by now
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


# --- b. a stale relay DLQ message whose range the stream no longer serves -------------------------------
class StaleRedrive(_Scenario):
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
        time.sleep(2 * _POLL_SECONDS)  # anything it put on the bus would be captured by now
        outcome.figures.update(
            outbox_ttl_days=self.ttl_days,
            batch_arrived=_iso(arrival),
            shards_the_stream_has=[s["ShardId"] for s in shards],
            trimmed_shard=trimmed,
            exit_code=result.returncode,
            report=report,
            stderr=result.stderr.strip()[-400:],
            relay_dlq_messages_after=queue_depth(sqs, dlq_url),
        )
        outcome.check("the command exits 1", result.returncode == 1, f"exit {result.returncode}")
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
        republished = _wait(lambda: ids <= bus.seen(), 30.0)
        outcome.figures.update(
            control_exit_code=result.returncode,
            control_reports=result.reports(),
            relay_dlq_messages_after_control=queue_depth(sqs, dlq_url),
        )
        outcome.check(
            "control: a batch inside the TTL is redriven from the table, deleted, exit 0",
            result.returncode == 0
            and republished
            and queue_depth(sqs, dlq_url) == 0
            and (result.summary() or {}).get("redriven") == 1,
            f"exit {result.returncode}, on the bus {republished}, summary {result.summary()}, "
            f"stderr {result.stderr[-300:]}",
        )


# --- d. redrive-poison while EventBridge still refuses the record ----------------------------------------
class RejectedRedrive(_Scenario):
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

    def _redrive_poison(self) -> AdminRun:
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
        settled = _wait(lambda: others <= bus.seen() and self._depth(self.poison_queue) >= 1, self.timeout)
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
        time.sleep(2 * _POLL_SECONDS)  # anything it put on the bus would be captured by now
        outcome.figures.update(
            refused_event=refused,
            before_fix_exit_code=still.returncode,
            before_fix_report=report,
            poison_queue_after_first_run=self._depth(self.poison_queue),
        )
        outcome.check("before the fix: exit 1", still.returncode == 1, f"exit {still.returncode}")
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
        on_bus = _wait(lambda: refused in bus.seen(), 30.0)
        events = bus.snapshot()
        outcome.figures.update(
            after_fix_exit_code=fixed.returncode,
            after_fix_reports=fixed.reports(),
            deliveries_of_the_refused_event=events[refused].deliveries if refused in events else 0,
        )
        outcome.check(
            "after the fix: exit 0, the event on the bus once, the message deleted",
            fixed.returncode == 0
            and on_bus
            and events[refused].deliveries == 1
            and self._depth(self.poison_queue) == 0,
            f"exit {fixed.returncode}, stderr {fixed.stderr[-300:]}",
        )


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
        outcome.figures["window"] = f"{_iso(start)} .. {_iso(end)}"
        for table, ids in expected.items():
            result = run_admin(
                stack,
                "replay",
                "--table",
                stack.template.physical_name(table),
                "--from",
                _iso(start),
                "--to",
                _iso(end),
            )
            report = next(iter(result.reports()), {})
            outcome.figures[f"replay {table}: exit / found / published / seconds"] = (
                f"{result.returncode} / {report.get('found')} / {report.get('published')} / "
                f"{result.seconds:.1f}"
            )
            outcome.check(
                f"replay of {table}: exit 0, complete, every outbox event of the window republished",
                result.returncode == 0
                and report.get("complete") is True
                and report.get("published") == len(ids)
                and report.get("found") == len(ids),
                f"exit {result.returncode}, {len(ids)} expected, report {json.dumps(report)[:300]}, "
                f"stderr {result.stderr[-300:]}",
            )
        every = set().union(*expected.values())

        def replayed() -> bool:
            events = live.capture.snapshot()
            return all(i in events and events[i].deliveries > bus_before.get(i, 0) for i in every)

        timeout = max(180.0, 0.2 * len(every))
        began = time.monotonic()
        on_bus = _wait(replayed, timeout)
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
