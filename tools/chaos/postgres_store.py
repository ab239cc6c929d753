"""The order store's evidence in PostgreSQL (OrderStore=postgres), and the harness's hands on it.

PostgresOrderStore reads what the checks need (tools/chaos/snapshot.py, OrderStore) from the stack's
order database: orders and their lines, request keys, outbox rows with their publishing state and the inbox;
and it writes poison rows straight into the outbox table (tools/chaos/poison.py builds them), as a bad
deploy or a hand-made fix could. Inventory stays on DynamoDB (snapshot.collect).

A row's publishing state is what its relay's bookmark says (the relay that owns the outbox when it is
read, outbox_relay.mode: a run's relay switches change it): with the polling publisher its marks
(published_at, parked_at); with the logical relay, which marks nothing published, its parked mark, the
replication slot and the replay sets: a row the slot still holds (peeked under the relay's lock, as the
maintenance function peeks it) or a set still names is pending, any other is published (delivered).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from shop.adapters.dynamodb import keys
from shop.adapters.postgres import replays, replication
from shop.adapters.postgres.outbox import relay_mode
from tools.chaos import poison
from tools.chaos.faults_migration import INSERT_POISON_ROW
from tools.chaos.ledger import Ledger
from tools.chaos.plan import POISON_OUTBOX_ITEM
from tools.chaos.poison import PoisonItem
from tools.chaos.snapshot import ORDERS_SIDE, OutboxRecord, Snapshot, envelope_of, postgres_row_key
from tools.local.stack import ORDER_DATABASE, LocalStack

T = TypeVar("T")
CONNECT_TIMEOUT_SECONDS = 3
# A write of the harness waits this long for the database to come back (it may be restarting).
UNAVAILABLE_WAIT_SECONDS = 60.0
_RETRY_PAUSE_SECONDS = 0.5
# A poison row of a real order takes a sequence no event of the order will ever reach.
REAL_ORDER_POISON_SEQUENCE = 1_000_000
# PostgresRelay=logical: the evidence waits this long for a relay's round to release the slot's lock.
SLOT_LOCK_WAIT_MS = 10_000
SLOT_PEEK_CHANGES = 1_000_000  # everything the slot holds (a drained run holds nothing)

_OUTBOX = """
SELECT position, event_id, aggregate_id, sequence, envelope::text, trace_header, created_at, attempts,
       published_at, parked_at
FROM outbox ORDER BY position
"""


# PostgresRelay=logical: the sessions of the functions holding the slot's advisory lock (one reader at a
# time; the lock is the only advisory lock the product takes, two keys: objsubid 2).
_SLOT_LOCK_HOLDERS = """
SELECT l.pid
FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.objid = hashtext(%s)::oid
  AND a.application_name = %s
"""
_FUNCTIONS_APPLICATION_NAME = "serverless-outbox"  # shop.adapters.postgres.connection.open_connection


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def row_item(
    position: int,
    event_id: str,
    aggregate_id: str,
    sequence: int,
    envelope: str,
    trace_header: str | None,
    created_at: datetime,
) -> dict[str, Any]:
    """An outbox row as the publisher parks it (shop.adapters.postgres.outbox.OutboxRow.as_item), but for
    `attempts`, which parking itself counts; `createdAt` as epoch seconds (time zones aside)."""
    return {
        "store": "postgres",
        "position": position,
        "eventId": event_id,
        "aggregateId": aggregate_id,
        "sequence": sequence,
        "envelope": envelope,
        "traceHeader": trace_header,
        "createdAt": created_at.timestamp(),
    }


class PostgresOrderStore:
    """snapshot.OrderStore for OrderStore=postgres: the stack's order database."""

    name = "postgres"

    def __init__(self, stack: LocalStack, *, logical: bool = False) -> None:
        self._outputs = dict(stack.template.application_outputs[ORDER_DATABASE])
        self.logical = logical  # PostgresRelay=logical: the slot is the bookmark
        self._probe: psycopg.Connection | None = None

    @property
    def slot(self) -> str:
        return replication.slot_name(self._outputs["DatabaseName"])

    def connect(self) -> psycopg.Connection:
        outputs = self._outputs
        return psycopg.connect(
            host=outputs["Endpoint"],
            port=int(outputs["Port"]),
            dbname=outputs["DatabaseName"],
            user=outputs["MasterUsername"],
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
        )

    def when_available(self, work: Callable[[psycopg.Connection], T]) -> T:
        """Run `work` on a fresh connection, retried while the database is unavailable (restarting)."""
        deadline = time.monotonic() + UNAVAILABLE_WAIT_SECONDS
        while True:
            try:
                with self.connect() as connection:
                    return work(connection)
            except psycopg.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_RETRY_PAUSE_SECONDS)

    # --- the evidence -----------------------------------------------------------------------------
    def read(self, snapshot: Snapshot) -> None:
        def attempt(connection: psycopg.Connection) -> Snapshot:
            fresh = Snapshot(order_store=snapshot.order_store)  # an attempt that failed half-way adds nothing
            self._read(connection, fresh)
            return fresh

        found = self.when_available(attempt)
        snapshot.orders.update(found.orders)
        for request_pk, order_ids in found.request_orders.items():
            snapshot.request_orders.setdefault(request_pk, []).extend(order_ids)
        snapshot.outbox.extend(found.outbox)
        snapshot.inbox.extend(found.inbox)
        snapshot.slot_rows = found.slot_rows

    def slot_positions(self, connection: psycopg.Connection) -> list[int]:
        """The outbox rows the logical relay still holds (positions, a row once per time it would be
        delivered): what its slot holds, peeked, never consumed, under the relay's lock (a slot serves one
        session at a time), and what its replay sets still name (replays, a handover, spilled transactions:
        shop.adapters.postgres.replays, drained beside the slot)."""
        with connection.transaction(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {SLOT_LOCK_WAIT_MS}")
            replication.lock_slot(cursor, self.slot)
            changes = replication.peek_changes(cursor, self.slot, SLOT_PEEK_CHANGES)
            in_sets = replays.pending_positions(cursor)
        return (
            [row.position for t in changes.transactions for row in t.rows]
            + [position for t in changes.transactions for position in t.replayed]
            + in_sets
        )

    def relay_mode(self, connection: psycopg.Connection) -> str:
        """The relay that owns the outbox now (outbox_relay.mode: a relay switch changes it mid-run), whose
        bookmark says what is published."""
        with connection.cursor() as cursor:
            return relay_mode(cursor)

    def _read(self, connection: psycopg.Connection, snapshot: Snapshot) -> None:
        lines: dict[str, list[dict[str, Any]]] = {}
        for order_id, sku, quantity, unit_price in connection.execute(
            "SELECT order_id, sku, quantity, unit_price FROM order_lines ORDER BY order_id, line_no"
        ):
            lines.setdefault(order_id, []).append({"sku": sku, "quantity": quantity, "unitPrice": unit_price})
        for order_id, customer_id, status, version in connection.execute(
            "SELECT order_id, customer_id, status, version FROM orders"
        ):
            snapshot.orders[order_id] = {
                "orderId": order_id,
                "customerId": customer_id,
                "status": status,
                "version": version,
                "lines": lines.get(order_id, []),
            }
        for caller, idempotency_key, order_id in connection.execute(
            "SELECT caller, idempotency_key, order_id FROM request_keys"
        ):
            # Named as the DynamoDB store names a request key, so one check reads both stores.
            request_pk = keys.request_key(caller, idempotency_key)[keys.PK]["S"]
            snapshot.request_orders.setdefault(request_pk, []).append(order_id)
        outbox = connection.execute(_OUTBOX).fetchall()
        in_slot: set[int] = set()
        logical = self.relay_mode(connection) == "logical"
        if logical:  # read after the rows: a row the slot delivered meanwhile counts as delivered
            held = self.slot_positions(connection)
            snapshot.slot_rows = len(held)
            in_slot = set(held)
        for row in outbox:
            position, event_id, aggregate_id, sequence, envelope, trace_header, created_at = row[:7]
            published_at, parked_at = row[8], row[9]
            pk, sk = postgres_row_key(aggregate_id, sequence, event_id)
            if logical:  # published_at is the polling publisher's (rows handed over to the slot)
                state = "parked" if parked_at else "pending" if position in in_slot else "published"
                published_at = None
            else:
                state = "published" if published_at else "parked" if parked_at else "pending"
            snapshot.outbox.append(
                OutboxRecord(
                    ORDERS_SIDE,
                    pk,
                    sk,
                    envelope_of(envelope),
                    state=state,
                    position=position,
                    created_at=_epoch(created_at),
                    marked_at=_epoch(published_at or parked_at),
                    item=row_item(
                        position, event_id, aggregate_id, sequence, envelope, trace_header, created_at
                    ),
                )
            )
        snapshot.inbox.extend(
            (consumer, event_id)
            for consumer, event_id in connection.execute("SELECT consumer, event_id FROM inbox")
        )

    # --- who reads the slot -------------------------------------------------------------------------
    def slot_lock_holders(self) -> list[int] | None:
        """The functions' sessions holding the slot's lock now (None: the database did not answer). On
        a connection of its own, kept between calls (a sampler asks four times a second)."""
        try:
            if self._probe is None or self._probe.closed:
                self._probe = self.connect()
            found = self._probe.execute(_SLOT_LOCK_HOLDERS, (self.slot, _FUNCTIONS_APPLICATION_NAME))
            return [int(pid) for (pid,) in found.fetchall()]
        except psycopg.Error:
            if self._probe is not None:
                self._probe.close()
            self._probe = None
            return None

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    # --- the harness's writes ---------------------------------------------------------------------
    def latest_order(self) -> str | None:
        """The order created last (a real order to write a poison row for)."""

        def latest(connection: psycopg.Connection) -> str | None:
            found = connection.execute(
                "SELECT order_id FROM orders ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
            return str(found[0]) if found else None

        return self.when_available(latest)

    def write_poison_row(
        self, ledger: Ledger, variant: str, max_event_bytes: int, order_id: str | None = None
    ) -> PoisonItem:
        """A poison row in the outbox: of an aggregate that does not exist (sequence 1), or of the real
        order `order_id` far past any sequence it will reach (so it takes no event's place)."""
        item, row = poison_row(variant, max_event_bytes, order_id)

        def insert(connection: psycopg.Connection) -> None:
            # A retry after a lost answer finds the row there.
            with contextlib.suppress(psycopg.errors.UniqueViolation):
                connection.execute(INSERT_POISON_ROW, row)

        self.when_available(insert)
        ledger.append(
            POISON_OUTBOX_ITEM, "OutboxPublisherFunction", "INSERT", **poison_row_details(item, row)
        )
        return item


def poison_row(
    variant: str, max_event_bytes: int, order_id: str | None = None
) -> tuple[PoisonItem, dict[str, Any]]:
    """A poison row to write (faults_migration.INSERT_POISON_ROW, its values by name): of an aggregate that
    does not exist (sequence 1), or of the real order `order_id` far past any sequence it will reach (so
    it takes no event's place)."""
    event_id = str(uuid.uuid4())
    aggregate = order_id or f"chaos-poison-{uuid.uuid4().hex[:12]}"
    sequence = REAL_ORDER_POISON_SEQUENCE if order_id else 1
    envelope = poison.postgres_envelope(variant, event_id, aggregate, sequence, max_event_bytes)
    pk, sk = postgres_row_key(aggregate, sequence, event_id)
    item = PoisonItem(poison.POSTGRES_OUTBOX, pk, sk, event_id, variant, real_order=order_id is not None)
    return item, {"event_id": event_id, "aggregate_id": aggregate, "sequence": sequence, "envelope": envelope}


def poison_row_details(item: PoisonItem, row: dict[str, Any]) -> dict[str, Any]:
    """The ledger entry's details of a poison row written."""
    return {
        "table": poison.POSTGRES_OUTBOX,
        "event_ids": [item.event_id],
        "variant": item.variant,
        "real_order": item.real_order,
        "envelope_bytes": len(str(row["envelope"]).encode()),
    }
