"""The fault plan: what the harness hands every function worker (CHAOS_PLAN, JSON) and reads back.

A plan names, per function (logical id), the fault kinds to inject with a probability per opportunity,
a cap (so the pipeline always converges) and whether the first opportunity must inject (so a small run
still covers every kind). Decisions are drawn from random.Random(seed|function|incarnation).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

PLAN_ENV = "CHAOS_PLAN"

# Roles of the functions, by what their calls look like (MIGRATION: the order database's migration
# function, which arms the publisher's crashes at a relay switch's steps).
API, RELAY, CONSUMER, NOTIFIER, MIGRATION = "api", "relay", "consumer", "notifier", "migration"

# Fault kinds injected inside the function workers (tools/chaos/faults.py), by the call they hook.
API_THROTTLE = "api.throttle"
API_CONFLICT = "api.transaction_conflict"
API_TIMEOUT_AFTER_COMMIT = "api.timeout_after_commit"
API_STALE_CANCEL = "api.stale_cancel"
RELAY_THROTTLE = "relay.throttle"
RELAY_CALL_ERROR = "relay.call_error"
RELAY_LOST_RESPONSE = "relay.lost_response"
RELAY_ENTRY_FAILURES = "relay.entry_failures"
RELAY_ENTRY_FAILURES_PERSISTENT = "relay.entry_failures_persistent"
RELAY_CRASH_AFTER_PUT = "relay.crash_after_put"
# PostgresRelay=logical only: the slot advanced, then the process dies before that transaction's COMMIT
# (hooked on shop.runtime.logical_relay.advance_slot, not on an AWS call).
RELAY_CRASH_AFTER_ADVANCE = "relay.crash_after_advance"
# PostgresRelay=logical, with the relay operations (tools/chaos/relay_operations.py): the replay sets
# (shop.adapters.postgres.replays: a replay, a handover from the polling publisher) as the relay's round
# drains them, hooked on that module's activate and mark_done and on the relay's advance_slot:
# - the round activated a set (its message read, everything committed before it out), then the process
#   dies before the round's COMMIT: the activation is undone, the message read again;
# - the activation committed, then the process dies before the slot passes the set's message (the second,
#   short transaction): the message is read again, the set found active already;
# - a chunk of a set put on the bus and taken out of the set, then the process dies before COMMIT: the
#   chunk stays in the set and is put again.
RELAY_CRASH_AFTER_SET_ACTIVATION = "relay.crash_after_set_activation"
RELAY_CRASH_BEFORE_PASSING_SET = "relay.crash_before_passing_set_message"
RELAY_CRASH_AFTER_SET_CHUNK = "relay.crash_after_set_chunk"
# Armed by the migration function at the steps of a relay switch (before the slot's creation, before and
# after the handover, after the slot is dropped): the publisher's next PutEvents goes through, then the
# process dies before its COMMIT (or slot advance); armed before a step that waits for the rounds in
# progress (creating the slot, locking the outbox or the slot), it holds its locks a while first, so the
# step waits on the round that dies.
RELAY_CRASH_AROUND_SWITCH = "relay.crash_around_switch"
CRASH_BEFORE_WRITE = "consumer.crash_before_write"
CRASH_AFTER_WRITE = "consumer.crash_after_write"
CRASH_AFTER_COMPLETE = "consumer.crash_after_complete"
CONSUMER_TIMEOUT = "consumer.timeout"
# The hot-SKU scenario only: a consumer's business transaction cancelled for TransactionConflict, as AWS
# cancels transactions that overlap on one item. DynamoDB Local never does (it serialises them: 800
# concurrent transactions on one item, 8 threads, 0 conflicts), so the contention is injected.
CONSUMER_CONFLICT = "consumer.transaction_conflict"
CRASH_AFTER_PUBLISH = "notification.crash_after_publish"
# Not injected: observed. A Publish whose response was lost (the SDK retries it, or the message is
# retried) may have reached the topic: the same window as CRASH_AFTER_PUBLISH, opened by the machine.
OBSERVED_PUBLISH_RESPONSE_LOST = "observed.publish_response_lost"
# Injected by the harness (parent process).
BUS_DUPLICATE = "bus.duplicate"
POISON_OUTBOX_ITEM = "poison.outbox_item"
POISON_MESSAGE = "poison.malformed_message"
# OrderStore=postgres: the order database stopped mid-drive and started again on the same data.
DATABASE_RESTART = "database.restart"
# OrderStore=postgres, the relay operations mid-drive (tools/chaos/relay_operations.py): a relay switch
# as a deploy runs it (the migration function's Update, then the functions' new configuration), and a
# replay by window as an operator runs it (`python -m operations replay`: the order database through its
# maintenance function, the inventory table by the command itself).
OPERATION_RELAY_SWITCH = "operation.relay_switch"
OPERATION_REPLAY = "operation.replay"

# The kinds each hook picks among (tools/chaos/faults.py), and every kind a worker can inject.
API_KINDS = (API_THROTTLE, API_CONFLICT, API_TIMEOUT_AFTER_COMMIT)
RELAY_KINDS = (
    RELAY_THROTTLE,
    RELAY_CALL_ERROR,
    RELAY_LOST_RESPONSE,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_CRASH_AFTER_PUT,
)
# The kinds hooked on the logical relay's replication slot (only OutboxPublisherFunction with
# PostgresRelay=logical has one; the stream relay never does).
SLOT_KINDS = (RELAY_CRASH_AFTER_ADVANCE,)
# The kinds hooked on the logical relay's replay sets, and the armed one: in a run with relay operations.
SET_KINDS = (RELAY_CRASH_AFTER_SET_ACTIVATION, RELAY_CRASH_BEFORE_PASSING_SET, RELAY_CRASH_AFTER_SET_CHUNK)
OPERATION_FAULT_KINDS = (*SET_KINDS, RELAY_CRASH_AROUND_SWITCH)
# The kinds that end the function's environment (the runtime reports Runtime.ExitError or
# Sandbox.Timedout): the consumers' and the notifier's crashes and timeout, and the relay's crashes. All
# of the relay's but one kill its process before its round's COMMIT, so the round is rolled back; the one
# strikes after the activation's COMMIT, before the slot passes the set's message.
CONSUMER_DEATH_KINDS = (
    CRASH_BEFORE_WRITE,
    CRASH_AFTER_WRITE,
    CRASH_AFTER_COMPLETE,
    CONSUMER_TIMEOUT,
    CRASH_AFTER_PUBLISH,
)
RELAY_ROLLBACK_KINDS = (
    RELAY_CRASH_AFTER_PUT,
    *SLOT_KINDS,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
)
RELAY_DEATH_KINDS = (*RELAY_ROLLBACK_KINDS, RELAY_CRASH_BEFORE_PASSING_SET)
WORKER_KINDS = (*API_KINDS, API_STALE_CANCEL, *RELAY_KINDS, *CONSUMER_DEATH_KINDS)
HARNESS_KINDS = (BUS_DUPLICATE, POISON_OUTBOX_ITEM, POISON_MESSAGE)
POSTGRES_HARNESS_KINDS = (DATABASE_RESTART,)
OPERATION_KINDS = (OPERATION_RELAY_SWITCH, OPERATION_REPLAY)
# OrderStore=postgres: the kinds whose hook is not there. The API's faults hook its DynamoDB transaction
# (TransactWriteItems), and the consumers' business-write faults the consumer's; on this store the API
# and the order-status consumer write PostgreSQL. The order-status consumer keeps the fault after its
# (DynamoDB) idempotency record completed; inventory and notifications are unchanged.
POSTGRES_NOT_APPLICABLE = {
    "OrdersApiFunction": (*API_KINDS, API_STALE_CANCEL),
    "OrderStatusFunction": (CRASH_BEFORE_WRITE, CONSUMER_TIMEOUT, CRASH_AFTER_WRITE),
}
# PostgresRelay=polling: the publisher reads no slot, so nothing hooks its advance.
POLLING_NOT_APPLICABLE = {"OutboxPublisherFunction": SLOT_KINDS}


def not_applicable(postgres: bool, postgres_relay: str) -> dict[str, tuple[str, ...]]:
    """The kinds, by function, that the run's order store and relay give no hook (the report names them)."""
    if not postgres:
        return {}
    if postgres_relay == "logical":
        return dict(POSTGRES_NOT_APPLICABLE)
    return {**POSTGRES_NOT_APPLICABLE, **POLLING_NOT_APPLICABLE}


def seeded_rng(*parts: object) -> random.Random:
    """A generator for reproducible fault decisions (not for anything secret)."""
    return random.Random("|".join(str(p) for p in parts))  # noqa: S311 - reproducibility, not security


@dataclass(frozen=True)
class FaultSpec:
    probability: float  # per opportunity
    cap: int  # at most this many in the whole run (all incarnations of the function)
    ensure: bool = True  # inject at the first eligible opportunity, whatever the draw


@dataclass(frozen=True)
class FunctionPlan:
    role: str
    timeout_seconds: float
    faults: dict[str, FaultSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    seed: int
    stack_name: str
    ledger: str  # JSON lines, one per injected fault (workers and harness append)
    state_dir: str  # per-function counters and faulted ids, shared by the incarnations of a function
    max_receive_count: int  # of the consumer queues: a crash never pushes a message to its last receive
    client_timeout_seconds: float  # of the harness's HTTP client
    idempotency_table: str
    business_tables: tuple[str, ...]
    functions: dict[str, FunctionPlan] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw: dict[str, Any] = json.loads(text)
        functions = {
            name: FunctionPlan(
                role=str(spec["role"]),
                timeout_seconds=float(spec["timeout_seconds"]),
                faults={kind: FaultSpec(**fault) for kind, fault in spec["faults"].items()},
            )
            for name, spec in raw["functions"].items()
        }
        return cls(
            seed=int(raw["seed"]),
            stack_name=str(raw["stack_name"]),
            ledger=str(raw["ledger"]),
            state_dir=str(raw["state_dir"]),
            max_receive_count=int(raw["max_receive_count"]),
            client_timeout_seconds=float(raw["client_timeout_seconds"]),
            idempotency_table=str(raw["idempotency_table"]),
            business_tables=tuple(raw["business_tables"]),
            functions=functions,
        )
