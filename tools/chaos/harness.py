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

from botocore.exceptions import BotoCoreError

from operations.recovery import FailedStreamBatch
from shop.adapters import keys
from shop.domain.inventory import EVENT_SOURCE as INVENTORY_SOURCE
from shop.domain.notifications import NOTIFIABLE
from shop.domain.orders import EVENT_SOURCE as ORDERS_SOURCE
from tools.chaos import poison, timeline
from tools.chaos.bus import BusCapture, DuplicateRoute, Duplicator, NotificationCapture, queue_depth
from tools.chaos.check import (
    DEATH_ERRORS,
    DEATH_KINDS,
    ORDERS_SIDE,
    PARKED,
    PENDING,
    PUBLISHED,
    Check,
    DynamoOrderStore,
    Evidence,
    OperationsEvidence,
    OrderStore,
    OutboxRecord,
    capture_lag,
    collect,
    evaluate,
    parked_key,
    parked_poison,
    quantiles,
    read_dlq,
    stream_range_keys,
)
from tools.chaos.driver import Answer, Driver, OrderOutcome, OrderScript, scripts, stock_for
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
    MIGRATION,
    NOTIFIER,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    OPERATION_FAULT_KINDS,
    RELAY,
    RELAY_CALL_ERROR,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_LOST_RESPONSE,
    RELAY_THROTTLE,
    SLOT_KINDS,
    FaultSpec,
    FunctionPlan,
    Plan,
    not_applicable,
)
from tools.chaos.postgres_store import PostgresOrderStore
from tools.chaos.progress import Counts, ProgressLine
from tools.chaos.publishers import PUBLISHER, DatabaseRestart, PublisherPool, RestartGate
from tools.chaos.relay_operations import MIGRATION_FUNCTION, RelayOperations
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
DYNAMODB, POSTGRES = "dynamodb", "postgres"
ORDER_STORES = (DYNAMODB, POSTGRES)
POLLING, LOGICAL = "polling", "logical"  # the template's PostgresRelay (postgres_relays(): all it allows)
# 503s counted as the restart's up to this long after the database is back (connections it broke are
# found broken at their next use).
_AFTER_RESTART_SECONDS = 10.0
# The drain gives up once outbox events are missing from the bus and none reached it for this long.
STALL_SECONDS = 300.0
_MISSING = "outbox events not on the bus yet"
_NEXT_SECONDS = 10.0  # a poison row's neighbours: the events of other orders written this soon after it


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
    # The template's OrderStore: "dynamodb", or "postgres" (the module docstring says what changes).
    order_store: str = DYNAMODB
    # postgres: the template's PostgresRelay, "polling" or "logical" (the module docstring).
    postgres_relay: str = POLLING
    # postgres: the database is restarted once, when this share of the orders has been sent (None: never),
    # and stays down this long between its stop and its start.
    restart_at: float | None = 0.55
    database_down_seconds: float = 5.0
    # postgres: publishers at once (the schedule's one and direct invocations) in each half of the drive,
    # then while draining.
    publishers_at_once: tuple[int, int] = (2, 4)
    drain_publishers: int = 2
    # postgres: MaxEventBytes of the run. The oversize poison row is one byte over it; at this size it
    # still fits one poison queue message, so it is parked whole (a row over the queue's 256 KiB would be
    # parked without its item).
    max_event_bytes: int = 32_768
    # postgres: the relay's operations mid-drive (tools/chaos/relay_operations.py): None, with the logical
    # relay only. At these shares of the orders sent: the operator's replays of everything written so far
    # (the order database holds about 2 events per order: at 70 % and 97 % of 2,000 orders over 6,000
    # events replayed in all; a replay comes after the switches due before it), and a deploy switching to
    # the other relay, then one switching back (the first meets the first replay's set draining: it waits
    # until half of it is out, and hands the rest back). None: not done.
    relay_operations: bool | None = None
    replays_at: tuple[float, ...] = (0.7, 0.97)
    switches_at: tuple[float, float] | None = (0.72, 0.8)
    # And a poison row pending at each switch's handover (written by the migration function's hooks:
    # to logical in the handover's transaction, to polling while the slot still holds it).
    poison_at_handover: bool = True

    def __post_init__(self) -> None:
        if self.order_store not in ORDER_STORES:
            raise ValueError(f"order_store must be one of {ORDER_STORES}, not {self.order_store!r}")
        if self.postgres_relay != POLLING and not self.postgres:
            raise ValueError(
                f"postgres_relay {self.postgres_relay!r} needs order_store {POSTGRES!r}: "
                "PostgresRelay chooses how the PostgreSQL outbox reaches the bus"
            )

    @property
    def postgres(self) -> bool:
        return self.order_store == POSTGRES

    @property
    def logical(self) -> bool:
        """The PostgreSQL outbox read from a replication slot (PostgresRelay=logical)."""
        return self.postgres and self.postgres_relay == LOGICAL

    @property
    def operations(self) -> bool:
        """The relay operations run (postgres only; by default with the logical relay)."""
        wanted = self.relay_operations if self.relay_operations is not None else self.logical
        return self.postgres and wanted and bool(self.replays_at or self.switches_at)

    @property
    def drain_timeout(self) -> float:
        if self.drain_timeout_seconds is not None:
            return self.drain_timeout_seconds
        # The relay operations put thousands more events on the bus late in the drive (the replay): the
        # local pipeline (one moto process) works them off in the drain.
        return max(240.0, self.orders * 0.6) * (2 if self.operations else 1)


# Each attempt: P(5 conflicts in a row) = 0.6**5 = 8 %, so without in-process retries about one message
# in twelve would use up its 5 receives and be dead-lettered, its order left PENDING.
HOT_SKU_CONFLICT_PROBABILITY = 0.6


def postgres_relays(template: Template | None = None) -> tuple[str, ...]:
    """What the template's PostgresRelay allows (AllowedValues)."""
    data = (template or Template.load()).data
    return tuple(str(value) for value in data["Parameters"]["PostgresRelay"]["AllowedValues"])


def _cap(orders: int, per: int, most: int) -> int:
    return max(1, min(most, orders // per))


def roles(config: ChaosConfig) -> dict[str, str]:
    """The functions faults are injected in, by role: with postgres, the polling publisher is a relay;
    with the relay operations, the migration function arms the publisher's crashes at a switch's steps."""
    found = {**ROLES, PUBLISHER: RELAY} if config.postgres else dict(ROLES)
    if config.operations:
        found[MIGRATION_FUNCTION] = MIGRATION
    return found


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
            # The logical relay's only (_applicable): per advance past outbox rows, as a crash after
            # PutEvents is per call.
            RELAY_CRASH_AFTER_ADVANCE: spec(0.01, _cap(n, 100, 20)),
            # With the relay operations only (_applicable): per activation of replay sets, per advance
            # past an activated set's message, per chunk of a set drained; and the crashes the migration
            # function arms at a switch's steps (never drawn: each arm is one).
            RELAY_CRASH_AFTER_SET_ACTIVATION: spec(0.5, _cap(n, 500, 3)),
            RELAY_CRASH_BEFORE_PASSING_SET: spec(0.5, _cap(n, 500, 3)),
            RELAY_CRASH_AFTER_SET_CHUNK: spec(0.1, _cap(n, 200, 10)),
            RELAY_CRASH_AROUND_SWITCH: spec(0.0, 1_000, ensure=False),
        },
        CONSUMER: consumer,
        NOTIFIER: notifier,
        MIGRATION: {},
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
            name: FunctionPlan(
                role, float(template.function(name).timeout), _applicable(config, name, faults[role])
            )
            for name, role in roles(config).items()
        },
    )


def _applicable(config: ChaosConfig, function: str, faults: dict[str, FaultSpec]) -> dict[str, FaultSpec]:
    """The function's faults whose hook the order store and its relay have (plan.not_applicable names
    the ones left out; the slot's kinds are never the stream relay's)."""
    missing = set(not_applicable(config.postgres, config.postgres_relay).get(function, ()))
    if function != PUBLISHER or not config.logical:
        missing |= set(SLOT_KINDS)
    if function != PUBLISHER or not config.operations:
        missing |= set(OPERATION_FAULT_KINDS)
    return {kind: spec for kind, spec in faults.items() if kind not in missing}


def chaos_template(config: ChaosConfig) -> Template:
    data = copy.deepcopy(Template.load().data)
    parameters = {}
    if config.max_receive_count is not None:
        parameters["ConsumerMaxReceiveCount"] = str(config.max_receive_count)
    if config.parallelization_factor is not None:
        parameters["RelayParallelizationFactor"] = str(config.parallelization_factor)
    if config.postgres:
        allowed = data["Parameters"]["PostgresRelay"]["AllowedValues"]
        if config.postgres_relay not in allowed:
            raise ValueError(f"postgres_relay must be one of {allowed}, not {config.postgres_relay!r}")
        parameters["OrderStore"] = POSTGRES
        parameters["PostgresRelay"] = config.postgres_relay
        parameters["MaxEventBytes"] = str(config.max_event_bytes)
    template = Template(data, parameters=parameters, stack_name=config.stack_name)
    for source in read_event_sources(template).queues:
        timeout = template.function(source.function).timeout
        # The template's own data (it keeps an expanded copy of what it was given), read anew by its views.
        template.data["Resources"][source.queue]["Properties"]["VisibilityTimeout"] = (
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
        self.stalled = False  # the drain gave up: events missing from the bus, none arriving (STALL_SECONDS)
        # Set once the stack runs: where the orders are, and (postgres) the extra publishers and the restart.
        self.store: OrderStore | None = None
        self.postgres: PostgresOrderStore | None = None
        self.publishers: PublisherPool | None = None
        self.restart: DatabaseRestart | None = None
        self.operations: RelayOperations | None = None
        self._gate = RestartGate()  # the database's restart and the relay operations: never at once
        # The live line (not with `quiet`) and the timeline: when the run's phases began (epoch seconds),
        # when each order was sent, and what the line samples (the parts, once they run).
        self.progress: ProgressLine | None = None
        self.phase = "start"
        self.moments: dict[str, float] = {}
        self.sent_at: list[float] = []
        self.driver: Driver | None = None
        self._parts: tuple[BusCapture, NotificationCapture, Duplicator] | None = None
        self._ledger_lock = threading.Lock()  # the line is drawn from its thread and at phase changes
        self._ledger_offset = 0
        self._ledger_faults = 0
        self._ledger_deaths: Counter[str] = Counter()

    def _on_activity(self, entry: object) -> None:
        if isinstance(entry, Invocation) and entry.result.error is not None:
            with self._errors_lock:
                self.function_errors[(entry.function, entry.result.error.error_type)] += 1

    def say(self, message: str) -> None:
        if self.config.quiet:
            return
        line = f"[chaos {time.strftime('%H:%M:%S')}] {message}"
        if self.progress is not None:
            self.progress.say(line)  # clears the live line first, redraws it after
        else:
            print(line, flush=True)

    # --- the live line --------------------------------------------------------------------------
    def _enter(self, phase: str, moment: str) -> None:
        """A phase begins: its moment on the timeline, and a line at once (a log gets one per phase)."""
        self.phase = phase
        self.moments[moment] = time.time()
        if self.progress is not None:
            self.progress.draw()

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

    def _poison_row(self, variant: str, real_order: bool = False) -> None:
        """postgres: a poison row in the outbox, of a made-up aggregate or of the latest real order."""
        assert self.postgres is not None
        order_id = self.postgres.latest_order() if real_order else None
        if real_order and order_id is None:
            return
        self.poison_items.append(
            self.postgres.write_poison_row(self.ledger, variant, self.config.max_event_bytes, order_id)
        )

    def _drive(self) -> list[OrderOutcome]:
        plan = scripts(self.config.orders, self.config.seed, self.stock)
        driver = self.driver = Driver(
            self.stack.api_url, self.config.client_timeout_seconds, self.config.workers
        )
        at: dict[int, list[Callable[[], None]]] = {}
        if self.config.inject_poison:
            at.setdefault(len(plan) // 3, []).append(
                lambda: self._poison_table("InventoryTable", poison.NO_ENVELOPE)
            )
            if self.config.postgres:
                at[len(plan) // 3].append(lambda: self._poison_row(poison.OVERSIZE))
                at.setdefault(2 * len(plan) // 3, []).append(
                    lambda: self._poison_row(poison.INVALID_ENVELOPE, real_order=True)
                )
            else:
                at.setdefault(2 * len(plan) // 3, []).append(
                    lambda: self._poison_table("OrdersTable", poison.INVALID_ENVELOPE)
                )
        publishers = self.publishers
        if publishers is not None:
            second = self.config.publishers_at_once[1]
            at.setdefault(len(plan) // 2, []).append(
                lambda: publishers.set_target("drive, second half", second)
            )
        if self.operations is not None:
            self.operations.schedule(len(plan), at, self.config.switches_at, self.config.replays_at)
        restart = self.restart
        if restart is not None and self.config.restart_at is not None:
            index = min(len(plan) - 1, int(self.config.restart_at * len(plan)))
            at.setdefault(index, []).insert(0, lambda: self._restart_database(restart, index))
        started = time.monotonic()
        last = [started]
        self._enter("drive", "drive_began")
        if publishers is not None:
            publishers.start("drive, first half", self.config.publishers_at_once[0])

        def progress(index: int, _: OrderScript) -> None:
            self.sent_at.append(time.time())
            for action in at.get(index, []):
                action()
            if time.monotonic() - last[0] >= _PROGRESS_SECONDS:
                last[0] = time.monotonic()  # the live line counts the orders; this, the client's answers
                self.say(f"driving: client so far {dict(driver.counts())}")

        outcomes = driver.run(plan, progress, rate=self.config.rate)
        if restart is not None:
            restart.join()  # the drive may end during the outage: the restart is part of it
        self.timings["drive_seconds"] = time.monotonic() - started
        self.client_counters = dict(driver.counters)
        self.say(f"driven in {self.timings['drive_seconds']:.1f} s: {self.client_counters}")
        return outcomes

    def _restart_database(self, restart: DatabaseRestart, index: int) -> None:
        self.say(f"restarting the order database (down {restart.down_seconds:g} s) at order {index + 1}")
        restart.start(index)

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
        # Events of the outbox missing from the bus while no new event reached it for STALL_SECONDS: the
        # pipeline is stuck (a relay failing every round), not slow; waiting the bound out shows nothing more.
        progress: tuple[int, float] = (len(capture.seen()), time.monotonic())
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                reasons = self._not_drained(sqs, topology, capture, notifications, duplicator)
            except BotoCoreError as exc:  # moto answering too slowly for once: look again
                reasons = [f"the local services did not answer: {exc}"]
            stable = stable + 1 if not reasons else 0
            if stable >= _STABLE_POLLS:
                self.say("drained")
                return True
            if reasons and time.monotonic() - last_report >= _PROGRESS_SECONDS:
                last_report = time.monotonic()
                self.say("draining: " + "; ".join(reasons))
            seen = len(capture.seen())
            if seen != progress[0] or not any(_MISSING in reason for reason in reasons):
                progress = (seen, time.monotonic())
            elif time.monotonic() - progress[1] >= STALL_SECONDS:
                self.stalled = True
                self.say(f"not drained: no new event on the bus for {STALL_SECONDS:.0f} s while {_MISSING}")
                return False
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
        backlog = capture.backlog(sqs) + notifications.backlog(sqs)
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
        if self.restart is not None and not self.restart.done:
            reasons.append("the order database is restarting")
        if self.operations is not None and self.operations.busy():
            reasons.append("relay operations under way")
        if reasons:
            return reasons  # the table scan below is the expensive part
        snapshot = collect(self.stack, self.store)
        pending = sum(1 for o in snapshot.orders.values() if o["status"] == "PENDING")
        if pending:
            reasons.append(f"{pending} orders PENDING")
        rows = sum(1 for r in snapshot.outbox if r.state == PENDING)
        if snapshot.slot_rows:  # logical: the slot is the bookmark (a parked row in it counts too)
            reasons.append(f"{snapshot.slot_rows} outbox rows in the replication slot")
        elif rows:
            reasons.append(f"{rows} outbox rows pending")
        seen = capture.seen()
        outbox = snapshot.decodable()
        unseen = [i for i in outbox if i not in seen]
        if unseen:
            reasons.append(f"{len(unseen)} {_MISSING}")
        published = notifications.by_event_id()
        silent = [
            i
            for i, r in outbox.items()
            if r.table == ORDERS_SIDE and (r.envelope or {}).get("type") in NOTIFIABLE and i not in published
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

    def _deaths(self) -> dict[str, int]:
        with self._errors_lock:
            errors = dict(self.function_errors)
        deaths: Counter[str] = Counter()
        for (function, error_type), count in errors.items():
            if error_type in DEATH_ERRORS:
                deaths[function] += count
        return dict(deaths)

    def _report(
        self, evidence: Evidence, checks: list[Check], duplicator: Duplicator, outcomes: list[OrderOutcome]
    ) -> dict[str, Any]:
        by_name = {check.name: check for check in checks}
        injected = [entry for entry in evidence.ledger if entry["kind"] != OBSERVED_PUBLISH_RESPONSE_LOST]
        faults: Counter[str] = Counter(entry["kind"] for entry in injected)
        by_function: dict[str, Counter[str]] = {}
        for entry in injected:
            by_function.setdefault(entry["function"], Counter())[entry["kind"]] += 1
        snapshot = evidence.snapshot
        tables = Counter(r.table for r in snapshot.outbox if r.live)
        deliveries = sum(c.deliveries for c in evidence.bus.values())
        repeats_by_source: Counter[str] = Counter()
        for captured in evidence.bus.values():
            repeats_by_source[str(captured.detail.get("source"))] += captured.deliveries - 1
        effects = by_name["effects_once"].figures
        notes = by_name["one_notification_per_event"].figures
        passed = self.drained and all(check.ok for check in checks)
        if self.epilogue is not None:
            passed = passed and self.epilogue_report is not None and bool(self.epilogue_report["passed"])
        return {
            "passed": passed,
            "drained": self.drained,
            **({"stalled": True} if self.stalled else {}),
            "seed": self.config.seed,
            "order_store": self.config.order_store,
            **({"postgres_relay": self.config.postgres_relay} if self.config.postgres else {}),
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
                "bus_repeats_by_source": dict(sorted(repeats_by_source.items())),
                "duplicates_delivered_to_consumers": duplicator.sent,
            },
            "faults": dict(sorted(faults.items())),
            "faults_not_applicable": {
                f: list(kinds)
                for f, kinds in not_applicable(self.config.postgres, self.config.postgres_relay).items()
            },
            **({"hot_sku": self._hot_sku_figures(injected)} if self.config.hot_sku else {}),
            "faults_by_function": {f: dict(sorted(c.items())) for f, c in sorted(by_function.items())},
            "function_errors": {f"{f} {t}": n for (f, t), n in sorted(self.function_errors.items())},
            "uninjected_deaths": {
                f: n for f in sorted(roles(self.config)) if (n := evidence.uninjected_deaths(f))
            },
            "client": dict(sorted(self.client_counters.items())),
            "summary": {
                "lost": by_name["no_lost_events"].figures["lost"],
                "pending_rows": by_name["no_lost_events"].figures["pending_rows"],
                "phantom": by_name["no_phantom_events"].figures["phantom"],
                "published_out_of_order": by_name["published_in_order"].figures["out_of_order"],
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
            **({"postgres": self._postgres_figures(evidence, outcomes)} if self.config.postgres else {}),
            **({"relay_operations": self.operations.figures(evidence)} if self.operations else {}),
            **({"epilogue": self.epilogue_report} if self.epilogue is not None else {}),
            "plan": json.loads(self.plan.to_json()),
            "run_dir": str(self.run_dir),
            "timeline": self._timeline(evidence, outcomes),
        }

    def _timeline(self, evidence: Evidence, outcomes: list[OrderOutcome]) -> dict[str, Any]:
        """When things happened (tools/chaos/timeline.py): what the run's chart draws."""
        began = self.moments.get("began", time.time())
        return timeline.build(
            began,
            phases={name: t for name, t in self.moments.items() if name != "began"},
            sent=self.sent_at,
            settled=timeline.settled_at(evidence.bus).values(),
            ledger=evidence.ledger,
            outages=evidence.database_outages,
            breaks=timeline.rule_breaks(outcomes),
        )

    def _postgres_figures(self, evidence: Evidence, outcomes: list[OrderOutcome]) -> dict[str, Any]:
        """What only the PostgreSQL order store shows: its rows' states and publish lag, the publishers,
        the restart and what the client saw of it, and each poison row's fate."""
        snapshot = evidence.snapshot
        rows = [r for r in snapshot.outbox if r.state is not None]
        states = Counter(str(r.state) for r in rows)
        lags = sorted(lag for r in rows if (lag := self._publish_lag(r, evidence)) is not None)
        captured = sorted(lag for r in rows if (lag := capture_lag(r, evidence)) is not None)

        def crashed(kind: str) -> set[str]:
            return {
                event_id
                for entry in evidence.ledger
                if entry["kind"] == kind and entry["function"] == PUBLISHER
                for event_id in entry.get("event_ids", [])
            }

        def put_again(ids: set[str]) -> int:
            return sum(1 for i in ids if i in evidence.bus and evidence.bus[i].deliveries > 1)

        answers = [a for o in outcomes for a in o.create_answers + o.cancel_answers]
        republished = {
            "order_events_put_more_than_once": sum(
                1
                for c in evidence.bus.values()
                if c.detail.get("source") == ORDERS_SOURCE and c.deliveries > 1
            ),
            # Logical: between PutEvents and the slot advance (the round's end).
            "after_a_crash_between_put_events_and_commit": put_again(crashed(RELAY_CRASH_AFTER_PUT)),
        }
        if self.operations is not None:
            republished["after_a_crash_around_a_switch_step"] = put_again(crashed(RELAY_CRASH_AROUND_SWITCH))
            republished["after_a_crash_after_a_replay_set_chunk"] = put_again(
                crashed(RELAY_CRASH_AFTER_SET_CHUNK)
            )
        if self.config.logical:
            # The events an advance confirmed before its process died: never read again (a repeat of
            # one came from a failure before that advance, e.g. a lost PutEvents answer).
            after_advance = crashed(RELAY_CRASH_AFTER_ADVANCE)
            republished["confirmed_by_an_advance_then_crash"] = len(after_advance)
            republished["of_them_put_more_than_once"] = put_again(after_advance)
        return {
            "outbox_rows": {state: states[state] for state in (PUBLISHED, PARKED, PENDING)},
            "slot_rows": snapshot.slot_rows,
            "publish_lag_seconds": quantiles(lags),
            # Polling: from the row's created_at to its published_at. Logical (no row marked): to the
            # event's first arrival in the harness's capture queue (EventBridge -> SQS -> the harness).
            "publish_lag_to": "first seen by the bus capture" if self.config.logical else "marked published",
            # Either relay: from created_at to the first arrival in the capture queue (comparable).
            "bus_capture_lag_seconds": quantiles(captured),
            "republished": republished,
            "inbox_rows": len(snapshot.inbox),
            "publishers": self.publishers.report() if self.publishers else {},
            "database_restart": self._restart_figures(answers),
            "poison_rows": self._poison_row_figures(evidence),
        }

    def _restart_figures(self, answers: list[Answer]) -> dict[str, Any]:
        if self.restart is None:
            return {}
        figures = self.restart.report()
        unavailable = [a for a in answers if a.status == 503]
        figures["answers_503"] = len(unavailable)
        if self.restart.window is not None:
            began, ended = self.restart.window
            figures["answers_503_during_outage"] = sum(1 for a in unavailable if began <= a.at <= ended)
            figures["answers_503_within_10s_after"] = sum(
                1 for a in unavailable if ended < a.at <= ended + _AFTER_RESTART_SECONDS
            )
            figures["answers_during_outage"] = sum(1 for a in answers if began <= a.at <= ended)
        return figures

    def _poison_row_figures(self, evidence: Evidence) -> list[dict[str, Any]]:
        """Each poison row: parked (how often), and the later events of other orders: published, and the
        longest publish lag of those written in the 10 s after it (held back, it would be long)."""
        records = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
        times: Counter[tuple[str, str]] = Counter()
        for body in evidence.relay_poison_queue:
            message = parked_poison(body)
            key = parked_key(message) if message is not None else None
            if key is not None:
                times[key] += 1
        rows = [r for r in evidence.snapshot.outbox if r.state is not None and r.live]
        figures = []
        for item in self.poison_items:
            if item.table != poison.POSTGRES_OUTBOX:
                continue
            record = records.get((item.pk, item.sk))
            position = record.position if record and record.position is not None else 0
            written = record.created_at if record and record.created_at is not None else 0.0
            later = [r for r in rows if r.pk != item.pk and (r.position or 0) > position]
            soon = [
                lag
                for r in later
                if r.created_at is not None
                and r.created_at <= written + _NEXT_SECONDS
                and (lag := self._publish_lag(r, evidence)) is not None
            ]
            figures.append(
                {
                    "variant": item.variant,
                    "real_order": item.real_order,
                    "state": record.state if record else None,
                    "parked_times": times[(item.pk, item.sk)],
                    "later_events_of_other_orders": len(later),
                    "of_them_published": sum(1 for r in later if r.state == PUBLISHED),
                    "publish_lag_max_of_those_written_10s_after": round(max(soon), 3) if soon else None,
                }
            )
        return figures

    def _publish_lag(self, record: OutboxRecord, evidence: Evidence) -> float | None:
        """A published row's lag (see publish_lag_to in _postgres_figures); None for any other."""
        if record.state != PUBLISHED or record.created_at is None:
            return None
        if not self.config.logical:
            return record.marked_at - record.created_at if record.marked_at is not None else None
        return capture_lag(record, evidence)


def run(
    config: ChaosConfig, services: LocalServices | None = None, epilogue: Epilogue | None = None
) -> dict[str, Any]:
    return Run(config, services, epilogue).execute()
