"""One chaos run: start the local stack with the fault plan, drive it, poison it, drain it, check it.

The stack is template.yaml as `make local` runs it, with two differences, both on the time scale:
the consumer queues' visibility timeout is the consumer timeout + 5 s instead of 60 s (still longer
than the function timeout, as Lambda requires, so an IN_PROGRESS record left by a dead consumer has
expired when its message comes back), and the stack name is "chaos".

Poison outbox items are parked by the relay in its poison queue: the drain waits for them there, and
the relay dead-letter queue (batches older than RelayMaximumRecordAgeSeconds) must stay empty. An
epilogue (Run(..., epilogue=...)) runs after the checks with the stack still up: the replay scenario of
tools/chaos/recovery_scenarios.py is one.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from operations.recovery import FailedStreamBatch
from shop.adapters import keys
from shop.domain.notifications import NOTIFIABLE
from tools.chaos import poison
from tools.chaos.bus import BusCapture, DuplicateRoute, Duplicator, NotificationCapture, queue_depth
from tools.chaos.check import DEATH_ERRORS, Check, Evidence, collect, evaluate, read_dlq, stream_range_keys
from tools.chaos.driver import Driver, OrderOutcome, OrderScript, scripts, stock_for
from tools.chaos.ledger import Ledger
from tools.chaos.plan import (
    API,
    API_CONFLICT,
    API_STALE_CANCEL,
    API_THROTTLE,
    API_TIMEOUT_AFTER_COMMIT,
    CONSUMER,
    CONSUMER_CONFLICT,
    CONSUMER_TIMEOUT,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_PUBLISH,
    CRASH_AFTER_WRITE,
    CRASH_BEFORE_WRITE,
    NOTIFIER,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    RELAY,
    RELAY_CALL_ERROR,
    RELAY_CRASH_AFTER_PUT,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_LOST_RESPONSE,
    RELAY_THROTTLE,
    FaultSpec,
    FunctionPlan,
    Plan,
)
from tools.local.console.activity import Invocation
from tools.local.pollers.event_sources import read_event_sources
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import ROOT, Template

FAULTS_MODULE = Path(__file__).with_name("faults.py")
DEFAULT_OUT_DIR = ROOT / ".chaos"
POISON_QUEUE_VARIABLE = "RELAY_POISON_QUEUE_URL"
ROLES = {
    "OrdersApiFunction": API,
    "OutboxRelayFunction": RELAY,
    "InventoryFunction": CONSUMER,
    "OrderStatusFunction": CONSUMER,
    "NotificationFunction": NOTIFIER,
}
_VISIBILITY_MARGIN_SECONDS = 5
_PROGRESS_SECONDS = 10.0
_STABLE_POLLS = 2


@dataclass
class ChaosConfig:
    orders: int = 200
    seed: int = 7
    workers: int = 6
    # Orders created per second at most. Faster than the local pipeline drains (one moto process for
    # EventBridge, SQS and SNS; about 6 orders/s with faults on 2 idle cores, docs/performance.md), queues
    # back up and drain slowly.
    rate: float | None = 4.0
    client_timeout_seconds: float = 3.0
    drain_timeout_seconds: float | None = None  # None: from the number of orders
    # Poison on purpose (outbox items the relay cannot decode, malformed consumer messages). Off, a
    # drain no longer waits maxReceiveCount visibility timeouts for the malformed messages' DLQs.
    inject_poison: bool = True
    max_receive_count: int | None = None  # None: the template's ConsumerMaxReceiveCount
    # The relay's batches per shard at once (None: the template's). Above 1, AWS keeps order per item
    # only: one order's events may be published out of order, and the invariants must still hold.
    parallelization_factor: int | None = None
    # Every order on one SKU, and each consumer's business transaction cancelled for TransactionConflict
    # at HOT_SKU_CONFLICT_PROBABILITY per attempt (make chaos-scenarios: hot-sku).
    hot_sku: bool = False
    duplicate_id_prefixes: int = 1  # of 16 hex digits: the share of each consumer's events sent twice
    out_dir: Path = DEFAULT_OUT_DIR
    stack_name: str = "chaos"
    quiet: bool = False

    @property
    def drain_timeout(self) -> float:
        if self.drain_timeout_seconds is not None:
            return self.drain_timeout_seconds
        return max(240.0, self.orders * 0.6)


# Each attempt: P(5 conflicts in a row) = 0.6**5 = 8 %, so without in-process retries about one message
# in twelve would use up its 5 receives and be dead-lettered, its order left PENDING.
HOT_SKU_CONFLICT_PROBABILITY = 0.6


def _cap(orders: int, per: int, most: int) -> int:
    return max(1, min(most, orders // per))


def fault_plan(config: ChaosConfig, template: Template, ledger: Path, state: Path) -> Plan:
    """Probabilities per opportunity and caps, sized to the run (small runs still see every kind once)."""
    n = config.orders
    spec = FaultSpec
    consumer = {
        CRASH_BEFORE_WRITE: spec(0.01, _cap(n, 100, 20)),
        CONSUMER_TIMEOUT: spec(0.003, _cap(n, 300, 4)),
        CRASH_AFTER_WRITE: spec(0.01, _cap(n, 100, 20)),
        CRASH_AFTER_COMPLETE: spec(0.01, _cap(n, 100, 20)),
    }
    if config.hot_sku:
        # Far more conflicts than maxReceiveCount per message would be allowed as failed receives.
        consumer[CONSUMER_CONFLICT] = spec(HOT_SKU_CONFLICT_PROBABILITY, 100 * n)
    notifier = {**consumer, CRASH_AFTER_PUBLISH: spec(0.01, _cap(n, 100, 20))}
    notifier.pop(CONSUMER_CONFLICT, None)  # SNS Publish is no transaction
    del notifier[CRASH_AFTER_WRITE]
    faults: dict[str, dict[str, FaultSpec]] = {
        API: {
            API_THROTTLE: spec(0.03, _cap(n, 30, 100)),
            API_CONFLICT: spec(0.03, _cap(n, 30, 100)),
            API_TIMEOUT_AFTER_COMMIT: spec(0.01, _cap(n, 100, 25)),
            # Only cancels of PENDING orders are candidates: most of them are held.
            API_STALE_CANCEL: spec(0.5, _cap(n, 25, 40)),
        },
        RELAY: {
            RELAY_THROTTLE: spec(0.02, _cap(n, 50, 50)),
            RELAY_CALL_ERROR: spec(0.01, _cap(n, 100, 30)),
            RELAY_LOST_RESPONSE: spec(0.01, _cap(n, 100, 30)),
            RELAY_ENTRY_FAILURES: spec(0.03, _cap(n, 50, 50)),
            RELAY_ENTRY_FAILURES_PERSISTENT: spec(0.01, _cap(n, 100, 20)),
            RELAY_CRASH_AFTER_PUT: spec(0.01, _cap(n, 100, 20)),
        },
        CONSUMER: consumer,
        NOTIFIER: notifier,
    }
    receives = config.max_receive_count or int(template.parameter_values["ConsumerMaxReceiveCount"])
    return Plan(
        seed=config.seed,
        stack_name=template.stack_name,
        ledger=str(ledger),
        state_dir=str(state),
        max_receive_count=receives,
        client_timeout_seconds=config.client_timeout_seconds,
        idempotency_table=template.physical_name("IdempotencyTable"),
        business_tables=(template.physical_name("OrdersTable"), template.physical_name("InventoryTable")),
        functions={
            name: FunctionPlan(role, float(template.function(name).timeout), faults[role])
            for name, role in ROLES.items()
        },
    )


def chaos_template(config: ChaosConfig) -> Template:
    data = copy.deepcopy(Template.load().data)
    parameters = {}
    if config.max_receive_count is not None:
        parameters["ConsumerMaxReceiveCount"] = str(config.max_receive_count)
    if config.parallelization_factor is not None:
        parameters["RelayParallelizationFactor"] = str(config.parallelization_factor)
    template = Template(data, parameters=parameters, stack_name=config.stack_name)
    for source in read_event_sources(template).queues:
        timeout = template.function(source.function).timeout
        data["Resources"][source.queue]["Properties"]["VisibilityTimeout"] = (
            timeout + _VISIBILITY_MARGIN_SECONDS
        )
    return template


@dataclass
class Topology:
    """Where things are, read from the template: consumer queues and their DLQs, the relay's queues."""

    consumer_queues: dict[str, str] = field(default_factory=dict)  # queue -> function
    consumer_dlqs: dict[str, str] = field(default_factory=dict)  # queue -> its dead-letter queue
    relay_dlq: str = ""  # the mappings' OnFailure: batches that aged out (must stay empty here)
    relay_poison_queue: str = ""  # where the relay parks poison records whole
    routes: list[DuplicateRoute] = field(default_factory=list)

    @classmethod
    def of(cls, stack: LocalStack) -> Topology:
        template = stack.template
        topology = cls()
        for source in stack.sources.queues:
            topology.consumer_queues[source.queue] = source.function
            redrive = template.properties(source.queue).get("RedrivePolicy") or {}
            dlq = template.logical_id_for_arn(str(redrive.get("deadLetterTargetArn", "")))
            if dlq is not None:
                topology.consumer_dlqs[source.queue] = dlq
        relay_dlqs = {s.on_failure_arn for s in stack.sources.streams if s.on_failure_arn}
        if len(relay_dlqs) != 1:
            raise RuntimeError(f"expected one OnFailure destination for the relay, found {relay_dlqs}")
        topology.relay_dlq = template.logical_id_for_arn(relay_dlqs.pop()) or ""
        topology.relay_poison_queue = relay_poison_queue(template)
        for rule in template.of_type("AWS::Events::Rule"):
            for target in template.properties(rule).get("Targets", []):
                queue = template.logical_id_for_arn(str(target.get("Arn", "")))
                if queue in topology.consumer_queues:
                    topology.routes.append(DuplicateRoute(rule, queue, topology.consumer_queues[queue]))
        return topology


def relay_poison_queue(template: Template) -> str:
    """The queue the relay parks poison in: the one its RELAY_POISON_QUEUE_URL refers to."""
    relays = {s.function for s in read_event_sources(template).streams}
    urls = {str(template.function(f).environment.get(POISON_QUEUE_VARIABLE, "")) for f in relays}
    found = [
        queue for queue in template.of_type("AWS::SQS::Queue") if template.resolve({"Ref": queue}) in urls
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one poison queue ({POISON_QUEUE_VARIABLE}) of the relay, found {found}")
    return found[0]


@dataclass
class Live:
    """What an epilogue gets: the running stack's parts, after the run was drained and checked."""

    topology: Topology
    capture: BusCapture
    notifications: NotificationCapture
    duplicator: Duplicator
    outcomes: list[OrderOutcome]
    checks: list[Check]


# Runs after the checks, with the stack and the captures still up; returns a report with "passed".
Epilogue = Callable[["Run", Live], dict[str, Any]]


class Run:
    def __init__(
        self,
        config: ChaosConfig,
        services: LocalServices | None = None,
        epilogue: Epilogue | None = None,
    ) -> None:
        self.config = config
        self.epilogue = epilogue
        self.epilogue_report: dict[str, Any] | None = None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_dir = config.out_dir / "runs" / f"{stamp}-seed{config.seed}-n{config.orders}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.run_dir / "ledger.jsonl")
        self.template = chaos_template(config)
        self.plan = fault_plan(config, self.template, self.ledger.path, self.run_dir / "state")
        self.stock = stock_for(config.orders, hot_sku=config.hot_sku)
        seed_file = self.run_dir / "seed.json"
        seed_file.write_text(
            json.dumps({"stock": [{"sku": s, "available": n} for s, n in self.stock.initial.items()]})
        )
        options = StackOptions(
            api_port=0,
            data_dir=self.run_dir / "stack",
            seed_file=seed_file,
            function_environment={
                "LOCAL_WORKER_PRELOAD": str(FAULTS_MODULE),
                "CHAOS_PLAN": self.plan.to_json(),
            },
        )
        self.stack = LocalStack(self.template, options, services=services)
        # Function errors as the runtime saw them (injected or not), for the report and the checks.
        self.function_errors: Counter[tuple[str, str]] = Counter()
        self._errors_lock = threading.Lock()
        self.stack.activity.subscribe(self._on_activity)
        self.poison_items: list[poison.PoisonItem] = []
        self.malformed: list[poison.MalformedMessage] = []
        self.timings: dict[str, float] = {}
        self.client_counters: dict[str, int] = {}
        self.drained = False

    def _on_activity(self, entry: object) -> None:
        if isinstance(entry, Invocation) and entry.result.error is not None:
            with self._errors_lock:
                self.function_errors[(entry.function, entry.result.error.error_type)] += 1

    def say(self, message: str) -> None:
        if not self.config.quiet:
            print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)

    # --- the run --------------------------------------------------------------------------------
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

    def execute(self) -> dict[str, Any]:
        began = time.monotonic()
        self.say(f"seed {self.config.seed}, {self.config.orders} orders; run directory {self.run_dir}")
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
        try:
            if self.config.inject_poison:
                self._poison_queues(topology)
                self._poison_table("OrdersTable", poison.NOT_JSON)
            outcomes = self._drive()
            drive_end = time.monotonic()
            self.drained = self._drain(topology, capture, notifications, duplicator)
            self.timings["drain_seconds"] = time.monotonic() - drive_end
            evidence = self._evidence(topology, capture, notifications, duplicator, outcomes)
            checks = evaluate(evidence)
            if self.epilogue is not None and self.drained:
                began_epilogue = time.monotonic()
                live = Live(topology, capture, notifications, duplicator, outcomes, checks)
                self.epilogue_report = self.epilogue(self, live)
                self.timings["epilogue_seconds"] = time.monotonic() - began_epilogue
        finally:
            for part in (duplicator, notifications, capture):
                part.stop()
        self.timings["total_seconds"] = time.monotonic() - began
        return self._report(evidence, checks, duplicator)

    def _poison_queues(self, topology: Topology) -> None:
        for queue, function in sorted(topology.consumer_queues.items()):
            for variant in (poison.NOT_JSON, poison.NOT_A_CLOUDEVENT):
                self.malformed.append(
                    poison.send_malformed_message(self.stack, self.ledger, queue, function, variant)
                )

    def _poison_table(self, table: str, variant: str) -> None:
        item = poison.write_poison_item(
            self.stack.clients.dynamodb(), self.stack, self.ledger, table, variant
        )
        self.poison_items.append(item)

    def _drive(self) -> list[OrderOutcome]:
        plan = scripts(self.config.orders, self.config.seed, self.stock)
        driver = Driver(self.stack.api_url, self.config.client_timeout_seconds, self.config.workers)
        thirds = (
            {
                len(plan) // 3: ("InventoryTable", poison.NO_ENVELOPE),
                2 * len(plan) // 3: ("OrdersTable", poison.INVALID_ENVELOPE),
            }
            if self.config.inject_poison
            else {}
        )
        started = time.monotonic()
        last = [started]

        def progress(index: int, _: OrderScript) -> None:
            if index in thirds:
                self._poison_table(*thirds[index])
            if time.monotonic() - last[0] >= _PROGRESS_SECONDS:
                last[0] = time.monotonic()
                self.say(f"driving: {index + 1}/{len(plan)} orders sent, {dict(driver.counters)}")

        outcomes = driver.run(plan, progress, rate=self.config.rate)
        self.timings["drive_seconds"] = time.monotonic() - started
        self.client_counters = dict(driver.counters)
        self.say(f"driven in {self.timings['drive_seconds']:.1f} s: {self.client_counters}")
        return outcomes

    # --- draining -------------------------------------------------------------------------------
    def _drain(
        self,
        topology: Topology,
        capture: BusCapture,
        notifications: NotificationCapture,
        duplicator: Duplicator,
    ) -> bool:
        """Wait (bounded) until nothing is in flight and everything that must happen has happened."""
        sqs = self.stack.clients.sqs()
        deadline = time.monotonic() + self.config.drain_timeout
        stable = 0
        last_report = 0.0
        while time.monotonic() < deadline:
            began = time.monotonic()
            reasons = self._not_drained(sqs, topology, capture, notifications, duplicator)
            stable = stable + 1 if not reasons else 0
            if stable >= _STABLE_POLLS:
                self.say("drained")
                return True
            if reasons and time.monotonic() - last_report >= _PROGRESS_SECONDS:
                last_report = time.monotonic()
                self.say("draining: " + "; ".join(reasons))
            time.sleep(max(1.0, 2 * (time.monotonic() - began)))
        self.say(f"not drained within {self.config.drain_timeout:.0f} s: checking what is there")
        return False

    def _not_drained(
        self,
        sqs: Any,
        topology: Topology,
        capture: BusCapture,
        notifications: NotificationCapture,
        duplicator: Duplicator,
    ) -> list[str]:
        reasons = []
        in_queues = {q: queue_depth(sqs, self.stack.queue_url(q)) for q in topology.consumer_queues}
        in_queues.update(
            {url.rsplit("/", 1)[-1]: queue_depth(sqs, url) for url in duplicator.delay_queue_urls}
        )
        busy = {q: n for q, n in in_queues.items() if n}
        if busy or duplicator.held():
            reasons.append(f"in queues {busy}, held duplicates {duplicator.held()}")
        backlog = queue_depth(sqs, capture.queue_url) + queue_depth(sqs, notifications.queue_url)
        if backlog:
            reasons.append(f"{backlog} captured messages not read yet")
        # Poison is parked by the relay in its poison queue; the relay DLQ is not waited for (it must
        # stay empty: nothing in a run is older than RelayMaximumRecordAgeSeconds).
        parked = queue_depth(sqs, self.stack.queue_url(topology.relay_poison_queue))
        if parked < len(self.poison_items):
            reasons.append(f"poison queue {parked}/{len(self.poison_items)}")
        expected = Counter(m.queue for m in self.malformed)
        for queue, count in expected.items():
            found = queue_depth(sqs, self.stack.queue_url(topology.consumer_dlqs[queue]))
            if found < count:
                reasons.append(f"{topology.consumer_dlqs[queue]} {found}/{count}")
        if reasons:
            return reasons  # the table scan below is the expensive part
        snapshot = collect(self.stack)
        pending = sum(1 for o in snapshot.orders.values() if o["status"] == "PENDING")
        if pending:
            reasons.append(f"{pending} orders PENDING")
        seen = capture.seen()
        outbox = snapshot.decodable()
        unseen = [i for i in outbox if i not in seen]
        if unseen:
            reasons.append(f"{len(unseen)} outbox events not on the bus yet")
        published = notifications.by_event_id()
        silent = [
            i
            for i, r in outbox.items()
            if r.table == "OrdersTable"
            and (r.envelope or {}).get("type") in NOTIFIABLE
            and i not in published
        ]
        if silent:
            reasons.append(f"{len(silent)} notifications not published yet")
        return reasons

    # --- evidence and report --------------------------------------------------------------------
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
        poison_table_items = {
            (p.pk, p.sk): dynamodb.get_item(
                TableName=stack.template.physical_name(p.table),
                Key={keys.PK: {"S": p.pk}, keys.SK: {"S": p.sk}},
                ConsistentRead=True,
            ).get("Item")
            for p in self.poison_items
        }
        return Evidence(
            snapshot=collect(stack),
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
            harness_errors=capture.errors + notifications.errors + duplicator.errors,
            deaths=self._deaths(),
        )

    def evidence(self, live: Live) -> Evidence:
        """The evidence as it stands now (an epilogue checks the invariants again after its work)."""
        return self._evidence(live.topology, live.capture, live.notifications, live.duplicator, live.outcomes)

    def _deaths(self) -> dict[str, int]:
        with self._errors_lock:
            errors = dict(self.function_errors)
        deaths: Counter[str] = Counter()
        for (function, error_type), count in errors.items():
            if error_type in DEATH_ERRORS:
                deaths[function] += count
        return dict(deaths)

    def _report(self, evidence: Evidence, checks: list[Check], duplicator: Duplicator) -> dict[str, Any]:
        by_name = {check.name: check for check in checks}
        injected = [entry for entry in evidence.ledger if entry["kind"] != OBSERVED_PUBLISH_RESPONSE_LOST]
        faults: Counter[str] = Counter(entry["kind"] for entry in injected)
        by_function: dict[str, Counter[str]] = {}
        for entry in injected:
            by_function.setdefault(entry["function"], Counter())[entry["kind"]] += 1
        snapshot = evidence.snapshot
        tables = Counter(r.table for r in snapshot.outbox if r.envelope is not None)
        deliveries = sum(c.deliveries for c in evidence.bus.values())
        effects = by_name["effects_once"].figures
        notes = by_name["one_notification_per_event"].figures
        passed = self.drained and all(check.ok for check in checks)
        if self.epilogue is not None:
            passed = passed and self.epilogue_report is not None and bool(self.epilogue_report["passed"])
        return {
            "passed": passed,
            "drained": self.drained,
            "seed": self.config.seed,
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
                "duplicates_delivered_to_consumers": duplicator.sent,
            },
            "faults": dict(sorted(faults.items())),
            **({"hot_sku": self._hot_sku_figures(injected)} if self.config.hot_sku else {}),
            "faults_by_function": {f: dict(sorted(c.items())) for f, c in sorted(by_function.items())},
            "function_errors": {f"{f} {t}": n for (f, t), n in sorted(self.function_errors.items())},
            "uninjected_deaths": {f: n for f in sorted(ROLES) if (n := evidence.uninjected_deaths(f))},
            "client": dict(sorted(self.client_counters.items())),
            "summary": {
                "lost": by_name["no_lost_events"].figures["lost"],
                "phantom": by_name["no_phantom_events"].figures["phantom"],
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
                "relay_dlq": by_name["dead_letters_exact"].figures["relay_dlq_messages"],
                "consumer_dlqs": by_name["dead_letters_exact"].figures["consumer_dlq_messages"],
            },
            "invariants": {check.name: check.to_dict() for check in checks},
            **({"epilogue": self.epilogue_report} if self.epilogue is not None else {}),
            "plan": json.loads(self.plan.to_json()),
            "run_dir": str(self.run_dir),
        }


def run(
    config: ChaosConfig, services: LocalServices | None = None, epilogue: Epilogue | None = None
) -> dict[str, Any]:
    return Run(config, services, epilogue).execute()
