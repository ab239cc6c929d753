"""Orders on PostgreSQL: one SQL transaction per change writes the order and its outbox row (and the
request key, and the inbox row of the event that caused the change)."""

from __future__ import annotations

from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import insert_outbox_row
from shop.domain.envelope import CloudEvent, format_time, parse_time
from shop.domain.orders import (
    Order,
    OrderLine,
    OrderRejection,
    OrderStatus,
    RejectedLine,
    RejectionReason,
    RequestKeyTaken,
    RequestRecord,
    VersionConflict,
)
from shop.domain.tracing import TraceHeaderSource, no_trace_header

# A key whose record expired no longer binds: the new request takes it over.
_TAKE_REQUEST_KEY = """
INSERT INTO request_keys (caller, idempotency_key, fingerprint, order_id, response, expires_at)
VALUES (%s, %s, %s, %s, %s, clock_timestamp() + make_interval(hours => %s))
ON CONFLICT (caller, idempotency_key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint, order_id = EXCLUDED.order_id,
        response = EXCLUDED.response, expires_at = EXCLUDED.expires_at
    WHERE request_keys.expires_at < clock_timestamp()
"""


def _rejection_column(rejection: OrderRejection | None) -> Jsonb | None:
    return None if rejection is None else Jsonb(rejection.to_dict())


def _rejection_from_column(stored: dict[str, Any] | None) -> OrderRejection | None:
    if stored is None:
        return None  # not rejected, or rejected before the reason was kept
    return OrderRejection(
        reason=RejectionReason(stored["reason"]),
        lines=tuple(
            RejectedLine(line["sku"], int(line["quantity"]), RejectionReason(line["reason"]))
            for line in stored["lines"]
        ),
    )


_INSERT_ORDER = """
INSERT INTO orders (order_id, customer_id, currency, status, version, total_amount, created_at, updated_at,
                    rejection)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
# A seed (sample data) never replaces an order.
_INSERT_ORDER_UNLESS_TAKEN = """
INSERT INTO orders (order_id, customer_id, currency, status, version, total_amount, created_at, updated_at,
                    rejection)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (order_id) DO NOTHING
"""


class OrderDatabaseSettings(Protocol):
    @property
    def max_event_bytes(self) -> int: ...
    @property
    def request_key_ttl_hours(self) -> int: ...


class PostgresOrderRepository:
    """shop.domain.orders.OrderRepository on PostgreSQL.

    `inbox_consumer`: the consumer whose effects this repository writes (the order-status consumer);
    a transition caused by an event records (consumer, cause's event id) in the inbox in the same
    transaction, and a cause already in the inbox writes nothing (VersionConflict: the order has moved
    past the version the cause was applied to).
    """

    def __init__(
        self,
        database: Database,
        settings: OrderDatabaseSettings,
        *,
        trace_header: TraceHeaderSource = no_trace_header,
        inbox_consumer: str | None = None,
    ) -> None:
        self._database = database
        self._settings = settings
        self._trace_header = trace_header
        self._inbox_consumer = inbox_consumer

    def _outbox_insert(self, cursor: psycopg.Cursor[Any], event: CloudEvent) -> None:
        insert_outbox_row(
            cursor, event, max_event_bytes=self._settings.max_event_bytes, trace_header=self._trace_header()
        )

    @staticmethod
    def _insert_order(cursor: psycopg.Cursor[Any], order: Order, *, unless_taken: bool = False) -> bool:
        """Insert the order and its lines; with `unless_taken`, nothing when an order has its id (False)."""
        cursor.execute(
            _INSERT_ORDER_UNLESS_TAKEN if unless_taken else _INSERT_ORDER,
            (
                order.order_id,
                order.customer_id,
                order.currency,
                str(order.status),
                order.version,
                order.total_amount,
                parse_time(order.created_at),
                parse_time(order.updated_at),
                _rejection_column(order.rejection),
            ),
        )
        if cursor.rowcount == 0:
            return False
        cursor.executemany(
            "INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price)"
            " VALUES (%s, %s, %s, %s, %s)",
            [
                (order.order_id, number, line.sku, line.quantity, line.unit_price)
                for number, line in enumerate(order.lines, start=1)
            ],
        )
        return True

    def create(self, order: Order, event: CloudEvent, request: RequestRecord | None) -> None:
        with self._database.transaction() as cursor:
            self._insert_order(cursor, order)
            self._outbox_insert(cursor, event)
            if request is not None:
                cursor.execute(
                    _TAKE_REQUEST_KEY,
                    (
                        request.caller,
                        request.idempotency_key,
                        request.fingerprint,
                        request.order_id,
                        Jsonb(request.response),
                        self._settings.request_key_ttl_hours,
                    ),
                )
                if cursor.rowcount == 0:
                    # Raised inside the block: the transaction rolls back, nothing of this order stays.
                    raise RequestKeyTaken(request.idempotency_key)

    def get(self, order_id: str) -> Order | None:
        with self._database.transaction() as cursor:
            cursor.execute(
                "SELECT customer_id, currency, status, version, created_at, updated_at, rejection"
                " FROM orders WHERE order_id = %s",
                (order_id,),
            )
            found = cursor.fetchone()
            if found is None:
                return None
            cursor.execute(
                "SELECT sku, quantity, unit_price FROM order_lines WHERE order_id = %s ORDER BY line_no",
                (order_id,),
            )
            lines = tuple(OrderLine(sku, quantity, unit_price) for sku, quantity, unit_price in cursor)
        customer_id, currency, status, version, created_at, updated_at, rejection = found
        return Order(
            order_id=order_id,
            customer_id=customer_id,
            currency=currency,
            lines=lines,
            status=OrderStatus(status),
            version=version,
            created_at=format_time(created_at),
            updated_at=format_time(updated_at),
            rejection=_rejection_from_column(rejection),
        )

    def get_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        with self._database.transaction() as cursor:
            cursor.execute(
                "SELECT fingerprint, order_id, response FROM request_keys"
                " WHERE caller = %s AND idempotency_key = %s AND expires_at >= clock_timestamp()",
                (caller, idempotency_key),
            )
            found = cursor.fetchone()
        if found is None:
            return None
        fingerprint, order_id, response = found
        return RequestRecord(caller, idempotency_key, fingerprint, order_id, response)

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        with self._database.transaction() as cursor:
            if self._inbox_consumer is not None and event.causationid is not None:
                cursor.execute(
                    "INSERT INTO inbox (consumer, event_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    (self._inbox_consumer, event.causationid),
                )
                if cursor.rowcount == 0:
                    raise VersionConflict(order.order_id)  # its cause was applied already
            cursor.execute(
                # A transition without a rejection keeps the stored one, as the DynamoDB update does.
                "UPDATE orders SET status = %s, version = %s, updated_at = %s,"
                " rejection = COALESCE(%s, rejection) WHERE order_id = %s AND version = %s",
                (
                    str(order.status),
                    order.version,
                    parse_time(order.updated_at),
                    _rejection_column(order.rejection),
                    order.order_id,
                    expected_version,
                ),
            )
            if cursor.rowcount == 0:
                raise VersionConflict(order.order_id)
            self._outbox_insert(cursor, event)

    # --- operations -----------------------------------------------------------------------------
    def seed(self, order: Order) -> bool:
        """Write `order` as it stands, with no event and no request key, unless an order has its id: what
        a sample event refers to, for the local stack's `make invoke`. True if it was written."""
        with self._database.transaction() as cursor:
            return self._insert_order(cursor, order, unless_taken=True)
