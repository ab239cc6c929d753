"""The invariants, checked against the stores, the bus capture, the topic capture and the queues.

collect() reads the state of the stack (tables scanned in full, consistently); evaluate() turns it,
with the ledger and what the client saw, into named checks. Each check lists a count and examples.

The order store is read through an OrderStore: DynamoOrderStore (the OrdersTable, the default) or
tools/chaos/postgres_store.PostgresOrderStore (OrderStore=postgres: orders, request keys, the outbox
rows with their publishing state and the inbox, in PostgreSQL). Inventory is always the InventoryTable.
One set of checks reads both: a record's `table` is its side of the saga (ORDERS_SIDE, INVENTORY_SIDE),
whichever store keeps it; what only PostgreSQL records (a row published, parked or still pending; the
inbox) is checked where it is there.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from boto3.dynamodb.types import TypeDeserializer

from operations.recovery import FailedStreamBatch
from shop.adapters import keys
from shop.adapters.outbox_items import ENVELOPE
from shop.adapters.poison_queue import POISON_KIND
from shop.domain.inventory import INVENTORY_REJECTED, INVENTORY_RELEASED, INVENTORY_RESERVED
from shop.domain.notifications import NOTIFIABLE
from shop.domain.orders import ORDER_CANCELLED, ORDER_CONFIRMED, ORDER_CREATED, ORDER_REJECTED
from tools.chaos.bus import CapturedEvent
from tools.chaos.driver import OrderOutcome
from tools.chaos.plan import (
    CONSUMER_TIMEOUT,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_PUBLISH,
    CRASH_AFTER_WRITE,
    CRASH_BEFORE_WRITE,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
)
from tools.chaos.poison import POSTGRES_OUTBOX, MalformedMessage, PoisonItem
from tools.local.gateway.server import local_caller_arn
from tools.local.stack import LocalStack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

_EXAMPLES = 5
_CLOCK_SLACK_SECONDS = 0.5  # between the ledger's clock and the poison message's parkedAt
NOTIFIER = "NotificationFunction"
PUBLISHER = "OutboxPublisherFunction"  # OrderStore=postgres: the polling publisher
# Faults that end the environment: the runtime reports them as Runtime.ExitError or Sandbox.Timedout.
# The relay's kinds that kill its process before its round's COMMIT: the round is rolled back.
ROLLBACK_KINDS = frozenset(
    {
        RELAY_CRASH_AFTER_PUT,
        RELAY_CRASH_AFTER_ADVANCE,
        RELAY_CRASH_AROUND_SWITCH,
        RELAY_CRASH_AFTER_SET_ACTIVATION,
        RELAY_CRASH_AFTER_SET_CHUNK,
    }
)
DEATH_KINDS = frozenset(
    {CRASH_BEFORE_WRITE, CRASH_AFTER_WRITE, CRASH_AFTER_COMPLETE, CRASH_AFTER_PUBLISH, CONSUMER_TIMEOUT}
    | ROLLBACK_KINDS
    | {RELAY_CRASH_BEFORE_PASSING_SET}
)
DEATH_ERRORS = frozenset({"Runtime.ExitError", "Sandbox.Timedout"})
_DESERIALIZER = TypeDeserializer()
# The sides of the saga, named after their DynamoDB tables (logical ids); the order side is read from
# PostgreSQL when the order store is there.
ORDERS_SIDE, INVENTORY_SIDE = "OrdersTable", "InventoryTable"
# What the PostgreSQL outbox records of a row (OutboxRecord.state). With PostgresRelay=logical the slot
# is the bookmark: a row it still holds is PENDING, one it has moved past PUBLISHED (postgres_store.py).
PUBLISHED, PARKED, PENDING = "published", "parked", "pending"

# Every legal history of an order (outbox event types in sequence order) and the status it ends in.
ORDER_HISTORIES: dict[tuple[str, ...], str] = {
    (ORDER_CREATED,): "PENDING",
    (ORDER_CREATED, ORDER_CONFIRMED): "CONFIRMED",
    (ORDER_CREATED, ORDER_REJECTED): "REJECTED",
    (ORDER_CREATED, ORDER_CANCELLED): "CANCELLED",
    (ORDER_CREATED, ORDER_CONFIRMED, ORDER_CANCELLED): "CANCELLED",
}
# Every legal history of a reservation, by its final status.
RESERVATION_HISTORIES: dict[str, set[tuple[str, ...]]] = {
    "RESERVED": {(INVENTORY_RESERVED,)},
    "REJECTED": {(INVENTORY_REJECTED,)},
    "RELEASED": {(INVENTORY_RESERVED, INVENTORY_RELEASED)},
    "CANCELLED": {(), (INVENTORY_REJECTED,)},  # cancelled before anything was reserved
}
# Which reservation statuses each final order status is consistent with.
CONSISTENT: dict[str, set[str]] = {
    "CONFIRMED": {"RESERVED"},
    "REJECTED": {"REJECTED"},
    "CANCELLED": {"RELEASED", "CANCELLED"},
}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def scan(dynamodb: DynamoDBClient, table: str) -> list[dict[str, Any]]:
    """Every item of a table, in attribute-value form (consistent reads)."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**kwargs)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass(frozen=True)
class OutboxRecord:
    table: str  # the side (ORDERS_SIDE, INVENTORY_SIDE), whichever store keeps it
    pk: str
    sk: str
    envelope: dict[str, Any] | None  # None: undecodable
    # What the store records of its publishing: PUBLISHED, PARKED or PENDING (the PostgreSQL outbox); None
    # where it records nothing (a DynamoDB outbox item is published off the table's stream).
    state: str | None = None
    position: int | None = None  # the PostgreSQL row's position (commit order, roughly)
    created_at: float | None = None  # epoch seconds, when the store records it
    marked_at: float | None = None  # when it was marked published or parked
    item: dict[str, Any] | None = field(default=None, compare=False)  # the row as it is parked

    @property
    def live(self) -> bool:
        """An event of a committed change, to be published: decodable and not parked as poison."""
        return self.envelope is not None and self.state != PARKED


def postgres_row_key(aggregate_id: str, sequence: int, event_id: str) -> tuple[str, str]:
    """The (pk, sk) a PostgreSQL outbox row goes by in the checks (unique, as (aggregate, sequence) is)."""
    return aggregate_id, f"{sequence:012d}#{event_id}"


@dataclass
class Snapshot:
    order_store: str = "dynamodb"
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    request_orders: dict[str, list[str]] = field(default_factory=dict)  # request key PK -> order ids
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)
    stock: dict[str, int] = field(default_factory=dict)
    outbox: list[OutboxRecord] = field(default_factory=list)
    other_items: int = 0
    inbox: list[tuple[str, str]] = field(default_factory=list)  # (consumer, event id): PostgreSQL only
    # PostgresRelay=logical: the outbox rows the replication slot still holds (None: no slot is read).
    slot_rows: int | None = None

    def decodable(self) -> dict[str, OutboxRecord]:
        """The events to be published, by id: decodable, and not parked (parked rows are poison, which
        the dead-letter check holds to what was injected)."""
        return {str(r.envelope["id"]): r for r in self.outbox if r.envelope is not None and r.live}

    def history(self, table: str) -> dict[str, list[dict[str, Any]]]:
        """Outbox envelopes per aggregate (subject) of one side, in sequence order."""
        by_aggregate: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.outbox:
            if record.table == table and record.envelope is not None and record.live:
                by_aggregate[str(record.envelope["subject"])].append(record.envelope)
        for envelopes in by_aggregate.values():
            envelopes.sort(key=lambda e: int(e["sequence"]))
        return by_aggregate


def _envelope_of(item: dict[str, Any]) -> dict[str, Any] | None:
    return envelope_of(item.get(ENVELOPE, {}).get("S"))


def envelope_of(raw: object) -> dict[str, Any] | None:
    """A stored envelope, decoded; None when it is not one of this system's CloudEvents."""
    try:
        envelope = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    required = ("id", "type", "subject", "sequence")
    if not isinstance(envelope, dict) or any(name not in envelope for name in required):
        return None
    return envelope


class OrderStore(Protocol):
    """Where the orders are, as the checks read them: the orders (orderId, status, version, lines),
    their request keys (named as keys.request_key names them) and the order side's outbox."""

    name: str

    def read(self, snapshot: Snapshot) -> None:
        """Add the order store's orders, request keys and outbox records (and inbox) to `snapshot`."""
        ...


def _scan_into(snapshot: Snapshot, stack: LocalStack, table: str) -> None:
    for raw in scan(stack.clients.dynamodb(), stack.template.physical_name(table)):
        sort_key = raw[keys.SK]["S"]
        if keys.is_outbox_sort_key(sort_key):
            snapshot.outbox.append(OutboxRecord(table, raw[keys.PK]["S"], sort_key, _envelope_of(raw)))
            continue
        item = _plain({name: _DESERIALIZER.deserialize(value) for name, value in raw.items()})
        kind = item.get("entityType")
        if kind == "Order":
            snapshot.orders[item["orderId"]] = item
        elif kind == "RequestKey":
            snapshot.request_orders.setdefault(item[keys.PK], []).append(item["orderId"])
        elif kind == "Reservation":
            snapshot.reservations[item["orderId"]] = item
        elif kind == "Stock":
            snapshot.stock[item["sku"]] = int(item["available"])
        else:
            snapshot.other_items += 1


class DynamoOrderStore:
    """OrderStore for OrderStore=dynamodb: the OrdersTable, scanned in full."""

    name = "dynamodb"

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack

    def read(self, snapshot: Snapshot) -> None:
        _scan_into(snapshot, self._stack, ORDERS_SIDE)


def collect(stack: LocalStack, order_store: OrderStore | None = None) -> Snapshot:
    """The order store (the OrdersTable unless told) and the InventoryTable, read in full."""
    store = order_store or DynamoOrderStore(stack)
    snapshot = Snapshot(order_store=store.name)
    store.read(snapshot)
    _scan_into(snapshot, stack, INVENTORY_SIDE)
    return snapshot


# --- dead-letter queues -----------------------------------------------------------------------------
def read_dlq(stack: LocalStack, queue: str) -> list[str]:
    """Bodies of every message in a dead-letter queue; they are made visible again afterwards."""
    sqs = stack.clients.sqs()
    url = stack.queue_url(queue)
    bodies: dict[str, str] = {}
    handles: list[str] = []
    for _ in range(1000):  # bounded: 10,000 messages
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300, WaitTimeSeconds=0
        ).get("Messages", [])
        if not messages:
            break
        bodies.update({m["MessageId"]: m["Body"] for m in messages})
        handles.extend(m["ReceiptHandle"] for m in messages)
    for handle in handles:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    return list(bodies.values())


def stream_range_keys(streams: DynamoDBStreamsClient, batch: FailedStreamBatch) -> list[tuple[str, str]]:
    """Keys of the outbox INSERT records in a failed batch's sequence range, read back from the stream."""
    iterator: str | None = streams.get_shard_iterator(
        StreamArn=batch.stream_arn,
        ShardId=batch.shard_id,
        ShardIteratorType="AT_SEQUENCE_NUMBER",
        SequenceNumber=batch.start_sequence_number,
    )["ShardIterator"]
    end = int(batch.end_sequence_number)
    found: list[tuple[str, str]] = []
    for _ in range(1000):
        if iterator is None:
            break
        page = streams.get_records(ShardIterator=iterator, Limit=1000)
        records = page.get("Records", [])
        for record in records:
            data = record["dynamodb"]
            if int(data["SequenceNumber"]) > end:
                return found
            image = data.get("NewImage") or {}
            sort_key = str(image.get(keys.SK, {}).get("S", ""))
            if record.get("eventName") == "INSERT" and keys.is_outbox_sort_key(sort_key):
                found.append((str(image[keys.PK]["S"]), sort_key))
        if not records:
            break
        iterator = page.get("NextShardIterator")
    return found


# --- the checks -------------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    description: str
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "description": self.description,
            "violations": len(self.violations),
            "examples": self.violations[:_EXAMPLES],
            **self.figures,
        }


@dataclass
class SwitchOutcome:
    """A relay switch as a deploy ran it: the migration function's answer to its Update."""

    label: str
    relay_to: str
    status: str | None  # the last deploy's answer's Status, None when none came
    reason: str
    relay_from: str = ""
    # Each deploy answered FAILED before it: its reason, the relay after it (must be relay_from: "nothing
    # of that step was changed") and the rollback's answer (CloudFormation's Update back).
    failed: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReplayOutcome:
    """A replay by window of the order database as an operator ran it: what it put out again, and what
    its answer named instead (parked, pending, expired, missing: shop.adapters.postgres.outbox)."""

    label: str
    began: float  # epoch seconds: the request was sent
    window: tuple[float, float]  # epoch seconds
    error: str | None  # the request failed or was refused
    replayed: list[str]  # event ids
    named: dict[str, list[str]]  # reason -> event ids


@dataclass
class OperationsEvidence:
    switches: list[SwitchOutcome]
    replays: list[ReplayOutcome]
    final_mode: str | None  # outbox_relay.mode after the drain
    expected_mode: str  # the run's relay: where the switches come back to
    errors: list[str] = field(default_factory=list)  # the harness's, running them


@dataclass
class Evidence:
    snapshot: Snapshot
    bus: dict[str, CapturedEvent]
    foreign_bus_messages: list[str]
    notifications: Counter[str]
    unreadable_notifications: list[str]
    ledger: list[dict[str, Any]]
    outcomes: list[OrderOutcome]
    initial_stock: dict[str, int]
    poison_items: list[PoisonItem]
    malformed: list[MalformedMessage]
    # The relay's last resort (batches older than RelayMaximumRecordAgeSeconds): empty in a chaos run.
    relay_dlq: list[str]
    relay_dlq_keys: list[list[tuple[str, str]]]
    consumer_dlqs: dict[str, list[str]]  # queue logical id -> bodies
    harness_errors: list[str]
    # Invocations that ended with the environment dying (crash or timeout), by function: injected or not.
    deaths: dict[str, int] = field(default_factory=dict)
    # Where the relay parks poison records whole, and each injected poison item as the table holds it
    # now (None: not in the table).
    relay_poison_queue: list[str] = field(default_factory=list)
    poison_table_items: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)
    # Sources whose aggregates' events must first reach the bus in sequence order: the PostgreSQL
    # publisher's promise with several publishers at once, the stream relay's with ParallelizationFactor 1.
    in_order_sources: frozenset[str] = frozenset()
    # When the order database was down (epoch seconds, from its stop to its start again): a round of the
    # publisher open then was rolled back, like one whose process died between PutEvents and COMMIT.
    database_outages: list[tuple[float, float]] = field(default_factory=list)
    # OrderStore=postgres with the relay operations (tools/chaos/relay_operations.py): what they did.
    operations: OperationsEvidence | None = None

    def lost_publish_responses(self) -> int:
        """Publish attempts of the notifier that ended without an answer (observed, not injected)."""
        return sum(1 for entry in self.ledger if entry["kind"] == OBSERVED_PUBLISH_RESPONSE_LOST)

    def uninjected_deaths(self, function: str) -> int:
        injected = sum(
            1 for entry in self.ledger if entry["function"] == function and entry["kind"] in DEATH_KINDS
        )
        return max(0, self.deaths.get(function, 0) - injected)


def evaluate(evidence: Evidence) -> list[Check]:
    checks = [
        _lost(evidence),
        _phantom(evidence),
        _published_in_order(evidence),
        _orders_created_once(evidence),
        _order_histories(evidence),
        _effects_once(evidence),
        _notifications(evidence),
        _states_consistent(evidence),
        _dead_letters(evidence),
        _api_contract(evidence),
    ]
    if evidence.operations is not None:
        checks.append(_relay_operations(evidence, evidence.operations))
    harness = Check("harness", "the harness itself saw no error (capture, duplicates)")
    for error in evidence.harness_errors:
        harness.fail(error)
    checks.append(harness)
    return checks


def _poison_keys(evidence: Evidence) -> set[tuple[str, str]]:
    return {(p.pk, p.sk) for p in evidence.poison_items}


def _lost(evidence: Evidence) -> Check:
    check = Check("no_lost_events", "every outbox event of a committed change reached the bus at least once")
    outbox = evidence.snapshot.decodable()
    for event_id, record in outbox.items():
        if event_id not in evidence.bus:
            envelope = record.envelope or {}
            check.fail(f"{envelope.get('type')} {event_id} of {envelope.get('subject')} never on the bus")
    check.figures["lost"] = len(check.violations)
    check.figures["outbox_events"] = len(outbox)
    # Where the store records publishing (PostgreSQL), every event ends marked published or, with the
    # logical relay, behind the replication slot (its bookmark).
    slot = evidence.snapshot.slot_rows is not None
    where = "in the replication slot (never delivered)" if slot else "in the outbox (never marked published)"
    pending = [r for r in outbox.values() if r.state == PENDING]
    for record in pending:
        envelope = record.envelope or {}
        check.fail(
            f"{envelope.get('type')} {envelope.get('id')} of {envelope.get('subject')} "
            f"is still pending {where}"
        )
    check.figures["pending_rows"] = len(pending)
    if slot:
        held = evidence.snapshot.slot_rows or 0
        if held > len(pending):
            check.fail(
                f"the replication slot still holds {held} outbox rows ({len(pending)} of them pending)"
            )
        check.figures["slot_rows"] = held
    return check


def _published_in_order(evidence: Evidence) -> Check:
    check = Check(
        "published_in_order",
        "each aggregate's events first reached the bus in sequence order "
        f"({', '.join(sorted(evidence.in_order_sources)) or 'no source promises it in this run'})",
    )
    arrivals: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for captured in evidence.bus.values():
        detail = captured.detail
        source, sequence = detail.get("source"), detail.get("sequence")
        if source in evidence.in_order_sources and isinstance(sequence, int):
            arrivals[(str(source), str(detail.get("subject")))].append((captured.first_arrival, sequence))
    for (source, subject), seen in sorted(arrivals.items()):
        sequences = [sequence for _, sequence in sorted(seen)]
        if sequences != sorted(sequences):
            check.fail(f"{source} {subject}: events first on the bus in the order {sequences}")
    check.figures["aggregates"] = len(arrivals)
    check.figures["events"] = sum(len(seen) for seen in arrivals.values())
    check.figures["out_of_order"] = len(check.violations)
    return check


def _phantom(evidence: Evidence) -> Check:
    check = Check(
        "no_phantom_events", "every event on the bus is an outbox item of a committed change, as written"
    )
    outbox = evidence.snapshot.decodable()
    for event_id, captured in evidence.bus.items():
        record = outbox.get(event_id)
        if record is None:
            check.fail(f"{captured.detail.get('type')} {event_id} on the bus has no outbox item")
        elif captured.detail != record.envelope:
            check.fail(f"{event_id} on the bus differs from its outbox item")
    for body in evidence.foreign_bus_messages:
        check.fail(f"not a CloudEvent of this system on the bus: {body[:120]}")
    undecodable = {(r.pk, r.sk) for r in evidence.snapshot.outbox if r.envelope is None}
    for pk, sk in sorted(undecodable - _poison_keys(evidence)):
        check.fail(f"undecodable outbox item that was not injected: {pk} {sk}")
    check.figures["phantom"] = len(check.violations)
    check.figures["bus_deliveries"] = sum(c.deliveries for c in evidence.bus.values())
    check.figures["bus_distinct_events"] = len(evidence.bus)
    return check


def _orders_created_once(evidence: Evidence) -> Check:
    check = Check(
        "orders_created_once",
        "one order per Idempotency-Key, whatever the retries; every 201 for a key names that order",
    )
    snapshot = evidence.snapshot
    keyed: dict[str, str] = {}
    for request_pk, order_ids in snapshot.request_orders.items():
        if len(order_ids) != 1:
            check.fail(f"request key {request_pk} has {len(order_ids)} records")
        keyed[request_pk] = order_ids[0]
    referenced = Counter(keyed.values())
    for order_id in snapshot.orders:
        if referenced[order_id] != 1:
            check.fail(f"order {order_id} is named by {referenced[order_id]} Idempotency-Key records")
    replays = 0
    for outcome in evidence.outcomes:
        # The driver sends no X-Local-Caller: every request is the local API's default caller.
        request_pk = keys.request_key(local_caller_arn(), outcome.script.key)[keys.PK]["S"]
        committed = keyed.get(request_pk)
        if outcome.order_ids and {committed} != outcome.order_ids:
            check.fail(
                f"key {outcome.script.key}: answers name {sorted(outcome.order_ids)}, table has {committed}"
            )
        if committed is not None and committed not in snapshot.orders:
            check.fail(f"key {outcome.script.key}: its order {committed} does not exist")
        replays += sum(1 for a in outcome.create_answers if a.status == 201 and a.replayed)
    check.figures["orders"] = len(snapshot.orders)
    check.figures["idempotent_replays"] = replays
    return check


def _order_histories(evidence: Evidence) -> Check:
    check = Check(
        "one_transition_per_event",
        "order version = number of its outbox items (sequences 1..version), a legal history, its status",
    )
    histories = evidence.snapshot.history("OrdersTable")
    for order_id, order in evidence.snapshot.orders.items():
        envelopes = histories.get(order_id, [])
        sequences = [int(e["sequence"]) for e in envelopes]
        types = tuple(str(e["type"]) for e in envelopes)
        if sequences != list(range(1, int(order["version"]) + 1)):
            check.fail(
                f"order {order_id} version {order['version']} has outbox sequences {sequences} {types}"
            )
        elif ORDER_HISTORIES.get(types) != order["status"]:
            check.fail(f"order {order_id} is {order['status']} with history {types}")
    orphans = set(histories) - set(evidence.snapshot.orders)
    for order_id in sorted(orphans):
        check.fail(f"outbox items of order {order_id}, which does not exist")
    return check


def _effects_once(evidence: Evidence) -> Check:
    check = Check(
        "effects_once",
        "each event caused at most one change; stock taken = sum of RESERVED reservations, never below 0",
    )
    snapshot = evidence.snapshot
    causes = Counter(
        str(r.envelope["causationid"])
        for r in snapshot.outbox
        if r.envelope is not None and r.envelope.get("causationid")
    )
    for cause, count in causes.items():
        if count > 1:
            check.fail(f"event {cause} caused {count} changes")
    histories = snapshot.history("InventoryTable")
    for order_id, reservation in snapshot.reservations.items():
        envelopes = histories.get(order_id, [])
        types = tuple(str(e["type"]) for e in envelopes)
        sequences = [int(e["sequence"]) for e in envelopes]
        if types not in RESERVATION_HISTORIES.get(str(reservation["status"]), set()):
            check.fail(f"reservation {order_id} is {reservation['status']} with history {types}")
        elif sequences != list(range(1, len(envelopes) + 1)):
            check.fail(f"reservation {order_id} has outbox sequences {sequences}")
    reserved: Counter[str] = Counter()
    for reservation in snapshot.reservations.values():
        if reservation["status"] == "RESERVED":
            for line in reservation["lines"]:
                reserved[str(line["sku"])] += int(line["quantity"])
    duplicates = len(check.violations)
    for sku, initial in sorted(evidence.initial_stock.items()):
        remaining = snapshot.stock.get(sku)
        if remaining is None or initial - remaining != reserved[sku]:
            check.fail(f"{sku}: initial {initial} - remaining {remaining} != reserved {reserved[sku]}")
        elif remaining < 0:
            check.fail(f"{sku}: stock below zero ({remaining})")
    duplicates += _inbox(evidence, check)
    check.figures["duplicate_effects"] = duplicates
    check.figures["stock_mismatches"] = len(check.violations) - duplicates
    check.figures["reserved_units"] = sum(reserved.values())
    return check


def _inbox(evidence: Evidence, check: Check) -> int:
    """PostgreSQL: the inbox holds exactly the causes of the order changes it recorded, each once (its
    row is written in the transaction of the change). Returns the violations found."""
    snapshot = evidence.snapshot
    if snapshot.order_store != "postgres":
        return 0
    before = len(check.violations)
    inventory_events = {i for i, r in snapshot.decodable().items() if r.table == INVENTORY_SIDE}
    caused = Counter(
        str(r.envelope["causationid"])
        for r in snapshot.decodable().values()
        if r.table == ORDERS_SIDE
        and r.envelope is not None
        and r.envelope.get("causationid") in inventory_events
    )
    recorded = Counter(event_id for _, event_id in snapshot.inbox)
    for event_id in sorted(set(recorded) - set(caused)):
        check.fail(f"the inbox records event {event_id}, which changed no order")
    for event_id in sorted(set(caused) - set(recorded)):
        check.fail(f"event {event_id} changed an order without its inbox row")
    for event_id, count in sorted(recorded.items()):
        if count > 1:
            check.fail(f"the inbox records event {event_id} {count} times")
    check.figures["inbox_rows"] = sum(recorded.values())
    return len(check.violations) - before


def _notifications(evidence: Evidence) -> Check:
    check = Check(
        "one_notification_per_event",
        "one notification per notifiable event, plus exactly one per crash injected in the publish window",
    )
    window = Counter(
        event_id
        for entry in evidence.ledger
        if entry["kind"] == CRASH_AFTER_PUBLISH
        for event_id in entry.get("event_ids", [])
    )
    notifiable = {
        event_id
        for event_id, record in evidence.snapshot.decodable().items()
        if record.table == "OrdersTable" and (record.envelope or {}).get("type") in NOTIFIABLE
    }
    window_duplicates = excess = missing = 0
    excess_events: list[str] = []
    for event_id in notifiable:
        count = evidence.notifications.get(event_id, 0)
        expected = 1 + window[event_id]
        if count == 0:
            missing += 1
            check.fail(f"event {event_id}: no notification")
        elif count > expected:
            excess += count - expected
            excess_events.append(
                f"event {event_id}: {count} notifications, {expected} explained by injection"
            )
        elif count < expected:
            check.fail(f"event {event_id}: {count} notifications after {window[event_id]} window crash(es)")
        window_duplicates += min(count, expected) - 1 if count else 0
    # An environment that died on its own (a timeout under load) in the same window, or a Publish whose
    # answer was lost (the SDK retries it), repeats at most one notification: such repeats are explained
    # by what was observed, and reported; any more fail.
    deaths = evidence.uninjected_deaths(NOTIFIER)
    lost_answers = evidence.lost_publish_responses()
    natural = deaths + lost_answers
    unexplained = max(0, excess - natural)
    if unexplained:
        for line in excess_events:
            check.fail(
                f"{line} ({deaths} uninjected death(s) of {NOTIFIER}, "
                f"{lost_answers} lost Publish answer(s) observed)"
            )
    for event_id, count in evidence.notifications.items():
        if event_id not in notifiable:
            check.fail(
                f"{count} notification(s) for {event_id}, not a notifiable event of a committed change"
            )
    for body in evidence.unreadable_notifications:
        check.fail(f"unreadable notification: {body[:120]}")
    check.figures.update(
        notifiable_events=len(notifiable),
        notifications=sum(evidence.notifications.values()),
        window_duplicates=window_duplicates,
        window_crashes_injected=sum(window.values()),
        repeats_after_uninjected_deaths=excess - unexplained,
        uninjected_notifier_deaths=deaths,
        lost_publish_responses=lost_answers,
        unexplained_duplicates=unexplained,
        missing=missing,
    )
    return check


def _lines(items: list[dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for line in items:
        totals[str(line["sku"])] += int(line["quantity"])
    return dict(totals)


def _states_consistent(evidence: Evidence) -> Check:
    check = Check(
        "states_consistent",
        "no order PENDING; every order's reservation agrees with its status; clients saw what happened",
    )
    snapshot = evidence.snapshot
    statuses: Counter[str] = Counter()
    for order_id, order in snapshot.orders.items():
        status = str(order["status"])
        statuses[status] += 1
        reservation = snapshot.reservations.get(order_id)
        if status == "PENDING":
            check.fail(f"order {order_id} still PENDING")
            continue
        if reservation is None:
            check.fail(f"order {order_id} ({status}) has no reservation")
            continue
        if reservation["status"] not in CONSISTENT[status]:
            check.fail(f"order {order_id} is {status}, its reservation {reservation['status']}")
        if status == "CONFIRMED" and _lines(order["lines"]) != _lines(reservation["lines"]):
            check.fail(f"order {order_id}: reserved lines differ from ordered lines")
        if status == "CANCELLED" and int(reservation["orderSequence"]) != int(order["version"]):
            check.fail(f"order {order_id}: reservation saw order event {reservation['orderSequence']}")
    for order_id in sorted(set(snapshot.reservations) - set(snapshot.orders)):
        check.fail(f"reservation {order_id} without an order")
    for outcome in evidence.outcomes:
        final = outcome.cancel_final
        if final is None or not outcome.order_ids:
            continue
        order = snapshot.orders.get(sorted(outcome.order_ids)[0], {})
        if final.status == 200 and order.get("status") != "CANCELLED":
            check.fail(f"cancel of {order.get('orderId')} answered 200, order is {order.get('status')}")
        if final.error_code == "ILLEGAL_TRANSITION" and order.get("status") != "REJECTED":
            check.fail(f"cancel of {order.get('orderId')} refused, order is {order.get('status')}")
    check.figures["statuses"] = dict(sorted(statuses.items()))
    return check


def canonical_item(item: dict[str, Any] | None) -> str:
    """An item in attribute-value form as canonical JSON: equal text, equal bytes attribute for attribute."""
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parked_poison(body: str) -> dict[str, Any] | None:
    """A relay poison queue message, decoded; None when it is not one."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("kind") != POISON_KIND:
        return None
    return message


def parked_key(message: dict[str, Any]) -> tuple[str, str] | None:
    """The outbox item key a parked poison message names (from its item, or its key when omitted); a
    PostgreSQL row (item["store"] == "postgres") by postgres_row_key."""
    item = message.get("item") or message.get("key")
    if not isinstance(item, dict):
        return None
    if item.get("store") == "postgres":
        aggregate, sequence, event_id = item.get("aggregateId"), item.get("sequence"), item.get("eventId")
        if isinstance(aggregate, str) and isinstance(sequence, int) and isinstance(event_id, str):
            return postgres_row_key(aggregate, sequence, event_id)
        return None
    pk, sk = (item.get(keys.PK) or {}).get("S"), (item.get(keys.SK) or {}).get("S")
    return (pk, sk) if isinstance(pk, str) and isinstance(sk, str) else None


def comparable_item(item: dict[str, Any]) -> dict[str, Any]:
    """A parked item as the table holds it: a PostgreSQL row without `attempts` (parking counts one
    more in the row) and its `createdAt` as epoch seconds (the sessions' time zones aside)."""
    if item.get("store") != "postgres":
        return item
    out = {name: value for name, value in item.items() if name != "attempts"}
    created = out.get("createdAt")
    if isinstance(created, str):
        with contextlib.suppress(ValueError):
            out["createdAt"] = datetime.fromisoformat(created).timestamp()
    return out


def _epoch_of(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _rollbacks(evidence: Evidence) -> list[tuple[float, float]]:
    """When work that had parked poison was undone on purpose: a publisher's or the stream relay's
    process killed after a PutEvents call (injected: the round rolls back, the stream batch is
    delivered again), the logical relay's killed after a slot advance (its round rolls back, and the
    slot stops before a row parked in it), or the database down."""
    crashes = [  # an armed crash holds its round's locks `hold_seconds` first
        (float(entry["at"]), float(entry["at"]) + float(entry.get("hold_seconds") or 0.0))
        for entry in evidence.ledger
        if entry["kind"] in ROLLBACK_KINDS
    ]
    return crashes + list(evidence.database_outages)


def _dead_letters(evidence: Evidence) -> Check:
    check = Check(
        "dead_letters_exact",
        "the poison queue holds each injected poison item once, whole (once more per rolled-back round "
        "or crashed relay invocation that had parked it), a row marked parked; the relay DLQ nothing; "
        "each consumer DLQ exactly its malformed messages",
    )
    poison = {(p.pk, p.sk): p for p in evidence.poison_items}
    parked: Counter[tuple[str, str]] = Counter()
    parked_times: dict[tuple[str, str], list[float]] = defaultdict(list)
    whole: set[tuple[str, str]] = set()  # parked with its item, equal to the table's, byte for byte
    for body in evidence.relay_poison_queue:
        message = parked_poison(body)
        key = parked_key(message) if message is not None else None
        if message is None or key is None:
            check.fail(f"poison queue message that is not a parked outbox record: {body[:200]}")
            continue
        parked[key] += 1
        when = _epoch_of(message.get("parkedAt"))
        if when is not None:
            parked_times[key].append(when)
        injected = poison.get(key)
        if injected is None:
            check.fail(f"poison queue holds a record that was not injected: {key[0]} {key[1]}")
            continue
        if message.get("eventId") != injected.event_id:
            check.fail(
                f"poison {key[0]} {key[1]} parked as event {message.get('eventId')}, not {injected.event_id}"
            )
            continue
        if "item" not in message:
            check.fail(f"poison {key[0]} {key[1]} parked without its item: {message.get('itemOmitted')}")
            continue
        in_table = evidence.poison_table_items.get(key)
        if in_table is None:
            check.fail(f"poison {key[0]} {key[1]} is no longer in {injected.table}")
        elif canonical_item(comparable_item(message["item"])) != canonical_item(in_table):
            check.fail(f"poison {key[0]} {key[1]}: the parked item differs from the item in {injected.table}")
        else:
            whole.add(key)
    again = _parked_again(evidence, poison, parked, parked_times, check)
    for pk, sk in sorted(set(poison) - set(parked)):
        check.fail(f"poison outbox item {pk} {sk} is not in the poison queue")
    _rows_parked(evidence, poison, check)
    for body, batch_keys in zip(evidence.relay_dlq, evidence.relay_dlq_keys, strict=True):
        covers = f"covering {len(batch_keys)} outbox record(s), e.g. {sorted(batch_keys)[:3]}"
        check.fail(f"the relay DLQ must stay empty; it holds a batch {covers}: {body[:160]}")
    expected: dict[str, set[str]] = defaultdict(set)
    for malformed in evidence.malformed:
        expected[malformed.queue].add(malformed.body)
    for queue in sorted(set(expected) | set(evidence.consumer_dlqs)):
        found = Counter(evidence.consumer_dlqs.get(queue, []))
        for body, count in found.items():
            if body not in expected[queue]:
                check.fail(f"{queue} DLQ holds a message that was not injected: {body[:160]}")
            elif count > 1:
                check.fail(f"{queue} DLQ holds a malformed message {count} times")
        for body in expected[queue] - set(found):
            check.fail(f"{queue} DLQ lacks the malformed message {body[:80]}")
    check.figures["poison_queue_messages"] = len(evidence.relay_poison_queue)
    # Injected poison items parked exactly once (or again after a rolled-back round), whole and equal
    # to the table's item.
    check.figures["poison_parked_whole"] = sum(1 for k in whole if parked[k] == 1 or k in again)
    check.figures["poison_parked_again_after_rollback"] = sum(parked[k] - 1 for k in again)
    check.figures["poison_outbox_items"] = len(poison)
    check.figures["relay_dlq_messages"] = len(evidence.relay_dlq)
    check.figures["consumer_dlq_messages"] = {q: len(b) for q, b in sorted(evidence.consumer_dlqs.items())}
    check.figures["malformed_messages"] = len(evidence.malformed)
    return check


def _parked_again(
    evidence: Evidence,
    poison: dict[tuple[str, str], PoisonItem],
    parked: Counter[tuple[str, str]],
    parked_times: dict[tuple[str, str], list[float]],
    check: Check,
) -> set[tuple[str, str]]:
    """Poison parked more than once: a PostgreSQL row is parked inside the publisher's round, so a round
    rolled back after parking it (its process killed between PutEvents and COMMIT, the database down)
    leaves it pending and the next round parks it again; a stream record parked by a relay invocation
    that then dies is delivered again with its batch and parked again. Each repeat must follow such a
    rollback; returns the records whose repeats all do, and fails the others."""
    rollbacks = _rollbacks(evidence)
    explained: set[tuple[str, str]] = set()
    for key, count in sorted(parked.items()):
        if count <= 1 or key not in poison:
            continue
        times = sorted(parked_times.get(key, []))
        rolled_back = len(times) == count and all(
            any(
                start - _CLOCK_SLACK_SECONDS <= later and earlier <= end + _CLOCK_SLACK_SECONDS
                for start, end in rollbacks
            )
            for earlier, later in itertools.pairwise(times)
        )
        if rolled_back:
            explained.add(key)
        else:
            check.fail(f"poison {key[0]} {key[1]} parked {count} times")
    return explained


def _rows_parked(evidence: Evidence, poison: dict[tuple[str, str], PoisonItem], check: Check) -> None:
    """PostgreSQL: each poison row ends marked parked (never published), and no other row is parked."""
    records = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
    for key, injected in sorted(poison.items()):
        if injected.table != POSTGRES_OUTBOX:
            continue
        record = records.get(key)
        if record is None:
            check.fail(f"poison row {key[0]} {key[1]} is no longer in the outbox")
        elif record.state != PARKED:
            check.fail(f"poison row {key[0]} {key[1]} is {record.state}, not parked")
    for key, record in sorted(records.items()):
        if record.state == PARKED and key not in poison:
            check.fail(f"row {key[0]} {key[1]} was parked, and it is no injected poison")


def _relay_operations(evidence: Evidence, operations: OperationsEvidence) -> Check:
    """The relay operations did what they say: each switch answered SUCCESS (a deploy answered FAILED
    before it changed nothing and was rolled back) and the outbox ends with the run's relay; each event
    a replay put out again reached the bus after the replay began (the bus's time of its last arrival in
    the capture queue), a poison row among them was parked; whatever its answer left out is injected
    poison, and each poison row in its window is named."""
    check = Check(
        "relay_operations",
        "each relay switch answered SUCCESS, the outbox ends on the run's relay; every event a replay "
        "selected on the bus again after it began; what it left out is the injected poison, named",
    )
    for switch in operations.switches:
        if switch.status != "SUCCESS":
            check.fail(
                f"relay switch {switch.label}: {switch.status or 'no answer'} at its last deploy "
                f"({len(switch.failed)} failed): {switch.reason[:300]}"
            )
        for failure in switch.failed:
            left, rollback = failure.get("mode_after"), failure.get("rollback")
            if left != switch.relay_from or rollback != "SUCCESS":
                check.fail(
                    f"relay switch {switch.label}: a failed deploy left the relay {left} "
                    f"(rollback {rollback}: {str(failure.get('rollback_reason'))[:200]})"
                )
    if operations.final_mode != operations.expected_mode:
        check.fail(f"the outbox ends on the {operations.final_mode} relay, not {operations.expected_mode}")
    for error in operations.errors:
        check.fail(f"running the operations: {error[:300]}")
    rows = {(r.pk, r.sk): r for r in evidence.snapshot.outbox}
    poison = {
        item.event_id: rows.get((item.pk, item.sk))
        for item in evidence.poison_items
        if item.table == POSTGRES_OUTBOX
    }
    again = 0
    for replay in operations.replays:
        if replay.error:
            check.fail(f"{replay.label}: {replay.error[:300]}")
            continue
        for event_id in replay.replayed:
            if event_id in poison:  # replayed before the relay parked it: parked now, never put
                if (record := poison[event_id]) is None or record.state != PARKED:
                    check.fail(f"{replay.label}: the poison row {event_id} it replayed is not parked")
                continue
            # On the bus after the replay began (once, for a row it named before the relay had put it out).
            captured = evidence.bus.get(event_id)
            if captured is None or captured.last_at < replay.began:
                seen = (
                    f"{captured.deliveries} time(s), last at {captured.last_at:.1f}" if captured else "never"
                )
                check.fail(f"{replay.label}: {event_id} on the bus {seen}")
            else:
                again += 1
        for reason in ("parked", "expired", "missing"):
            for event_id in replay.named.get(reason, []):
                if event_id not in poison:
                    check.fail(f"{replay.label} left out {event_id} ({reason}), which is no poison")
        named = set(replay.replayed).union(*replay.named.values())
        low, high = replay.window
        for event_id, record in sorted(poison.items()):
            created = record.created_at if record is not None else None
            if created is not None and low <= created <= high and event_id not in named:
                check.fail(f"{replay.label} did not name the poison row {event_id} in its window")
    check.figures["switches"] = len(operations.switches)
    check.figures["switches_answered_success"] = sum(1 for s in operations.switches if s.status == "SUCCESS")
    check.figures["deploys_failed_and_rolled_back"] = sum(len(s.failed) for s in operations.switches)
    check.figures["final_mode"] = operations.final_mode
    check.figures["replayed_events"] = sum(len(r.replayed) for r in operations.replays)
    check.figures["replayed_events_on_the_bus_again"] = again
    return check


def capture_lag(record: OutboxRecord, evidence: Evidence) -> float | None:
    """From a published row's created_at to its event's first arrival in the harness's bus capture."""
    if record.state != PUBLISHED or record.created_at is None:
        return None
    captured = evidence.bus.get(str((record.envelope or {}).get("id")))
    return captured.first_at - record.created_at if captured is not None else None


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}


def _api_contract(evidence: Evidence) -> Check:
    check = Check(
        "api_contract",
        "every request answered within the retry budget; no 5xx but 503; every 4xx with the error body",
    )
    for outcome in evidence.outcomes:
        for answer in outcome.create_answers + outcome.cancel_answers:
            if answer.problem:
                check.fail(f"order #{outcome.script.index}: {answer.problem}")
        if not outcome.created:
            check.fail(f"order #{outcome.script.index} never got a 201 within the retry budget")
        final = outcome.cancel_final
        if outcome.script.cancel and outcome.created and (final is None or final.status not in {200, 409}):
            check.fail(f"cancel of order #{outcome.script.index} never got a final answer")
        if final is not None and final.status == 409 and final.error_code != "ILLEGAL_TRANSITION":
            check.fail(f"cancel of order #{outcome.script.index} ended with {final.error_code}")
    return check
