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
  as tools/chaos/check_effects.py counts them), no new dead letter; every invariant of the run still holds.
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


The scenarios: full-batch in recovery_full_batch.py; stale-redrive and rejected-redrive in
recovery_redrive.py; replay and hot-sku, after a chaos run, in recovery_after_chaos.py. Here: what they
share (a stack of its own per scenario, the outcome and its rendering, the operator command run for
real against the local stack: tools/local/operator_commands.py).
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shop.domain.serialization import camel_fields
from tools.chaos.bus import BusCapture, queue_depth
from tools.chaos.topology import relay_poison_queue
from tools.local.operator_commands import CommandRun, command_environment, run_command
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template

RELAY = "OutboxRelayFunction"
POLL_SECONDS = 0.5
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
        return {"name": self.name, "passed": self.passed, **camel_fields(self, omit={"name"})}


def render(report: dict[str, Any]) -> str:
    lines = [f"scenario {report['name']}", ""]
    lines += [f"  {name:<52} {value}" for name, value in report["figures"].items()]
    lines.append("")
    for name, ok in report["checks"].items():
        lines.append(f"  [{'ok  ' if ok else 'FAIL'}] {name}")
    lines += [f"           {problem}" for problem in report["problems"]]
    lines.append(f"\nresult: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)


def wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def run_admin(
    stack: LocalStack, *arguments: str, module: str = "operations", env: dict[str, str] | None = None
) -> CommandRun:
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
    return run_command(argv, {**command_environment(stack), **(env or {})}, _ADMIN_TIMEOUT_SECONDS)


def outbox_ttl_days(template: Template) -> int:
    return int(template.function(RELAY).environment["OUTBOX_TTL_DAYS"])


class Scenario:
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
