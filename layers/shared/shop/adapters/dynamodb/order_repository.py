"""DynamoDB access for orders: one transaction per change writes the order and its outbox item."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from botocore.exceptions import ClientError

from shop.adapters import aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_writes import OutboxSettings, outbox_put
from shop.adapters.dynamodb.transactions import (
    SecondsLeft,
    busy_when_unavailable,
    cancellation_codes,
    error_code,
    transact_write_items,
    unbounded,
)
from shop.domain.envelope import CloudEvent
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


def _rejection_attribute(rejection: OrderRejection) -> dict[str, Any]:
    lines = [
        {
            "M": {
                "sku": {"S": line.sku},
                "quantity": {"N": str(line.quantity)},
                "reason": {"S": str(line.reason)},
            }
        }
        for line in rejection.lines
    ]
    return {"M": {"reason": {"S": str(rejection.reason)}, "lines": {"L": lines}}}


def _rejection_from_attribute(attribute: dict[str, Any]) -> OrderRejection:
    stored = attribute["M"]
    return OrderRejection(
        reason=RejectionReason(stored["reason"]["S"]),
        lines=tuple(
            RejectedLine(
                sku=line["M"]["sku"]["S"],
                quantity=int(line["M"]["quantity"]["N"]),
                reason=RejectionReason(line["M"]["reason"]["S"]),
            )
            for line in stored["lines"]["L"]
        ),
    )


def _order_attributes(order: Order) -> dict[str, Any]:
    attributes = {
        "entityType": {"S": "Order"},
        "orderId": {"S": order.order_id},
        "customerId": {"S": order.customer_id},
        "currency": {"S": order.currency},
        "lines": {
            "L": [
                {
                    "M": {
                        "sku": {"S": line.sku},
                        "quantity": {"N": str(line.quantity)},
                        "unitPrice": {"N": str(line.unit_price)},
                    }
                }
                for line in order.lines
            ]
        },
        "totalAmount": {"N": str(order.total_amount)},
        "status": {"S": str(order.status)},
        "version": {"N": str(order.version)},
        "createdAt": {"S": order.created_at},
        "updatedAt": {"S": order.updated_at},
    }
    if order.rejection is not None:
        attributes["rejection"] = _rejection_attribute(order.rejection)
    return attributes


def _order_from_item(item: dict[str, Any]) -> Order:
    return Order(
        order_id=item["orderId"]["S"],
        customer_id=item["customerId"]["S"],
        currency=item["currency"]["S"],
        lines=tuple(
            OrderLine(
                sku=line["M"]["sku"]["S"],
                quantity=int(line["M"]["quantity"]["N"]),
                unit_price=int(line["M"]["unitPrice"]["N"]),
            )
            for line in item["lines"]["L"]
        ),
        status=OrderStatus(item["status"]["S"]),
        version=int(item["version"]["N"]),
        created_at=item["createdAt"]["S"],
        updated_at=item["updatedAt"]["S"],
        # Orders rejected before the reason was kept have none.
        rejection=_rejection_from_attribute(item["rejection"]) if "rejection" in item else None,
    )


class OrderTableSettings(OutboxSettings, Protocol):
    @property
    def request_key_ttl_hours(self) -> int: ...


class DynamoOrderRepository:
    def __init__(
        self,
        settings: OrderTableSettings,
        *,
        trace_header: TraceHeaderSource = no_trace_header,
        seconds_left: SecondsLeft = unbounded,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._table = settings.require("orders_table_name")
        self._trace_header = trace_header
        self._seconds_left = seconds_left
        self._clock = clock

    def _now(self) -> int:
        """Now in whole epoch seconds, as expiresAt holds it. A request record has expired once
        expiresAt < _now(), for the create's condition and for get_request alike: a key the create
        finds taken is read back, never found expired by a fraction of the same second (which made the
        domain answer a false 409 REQUEST_IN_PROGRESS)."""
        return int(self._clock())

    def _outbox_put(self, order: Order, event: CloudEvent) -> dict[str, Any]:
        partition = keys.order_partition(order.order_id)
        return outbox_put(self._table, event, partition, self._settings, self._trace_header())

    def create(self, order: Order, event: CloudEvent, request: RequestRecord | None) -> None:
        actions: list[dict[str, Any]] = [
            {
                "Put": {
                    "TableName": self._table,
                    "Item": {**keys.order_key(order.order_id), **_order_attributes(order)},
                    "ConditionExpression": keys.KEY_NOT_TAKEN,
                }
            },
            self._outbox_put(order, event),
        ]
        if request is not None:
            now = self._now()
            expires = now + self._settings.request_key_ttl_hours * 3600
            actions.append(
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": {
                            **keys.request_key(request.caller, request.idempotency_key),
                            "entityType": {"S": "RequestKey"},
                            "fingerprint": {"S": request.fingerprint},
                            "orderId": {"S": request.order_id},
                            "response": {"S": json.dumps(request.response, separators=(",", ":"))},
                            "expiresAt": {"N": str(expires)},
                        },
                        # An expired record (TTL deletion is lazy) no longer binds the key.
                        "ConditionExpression": f"{keys.KEY_NOT_TAKEN} OR expiresAt < :now",
                        "ExpressionAttributeValues": {":now": {"N": str(now)}},
                    }
                }
            )
        # A transaction (2 units per KB per item): the order, its event and its key commit together, or
        # nothing does (no phantom event, one order per key). Costs: docs/performance.md.
        try:
            transact_write_items(actions, seconds_left=self._seconds_left)
        except ClientError as exc:
            codes = cancellation_codes(exc)
            if request is not None and len(codes) == 3 and codes[2] == "ConditionalCheckFailed":
                raise RequestKeyTaken(request.idempotency_key) from exc
            raise

    def get(self, order_id: str) -> Order | None:
        with busy_when_unavailable():
            response = aws.dynamodb().get_item(
                TableName=self._table, Key=keys.order_key(order_id), ConsistentRead=True
            )
        item = response.get("Item")
        return _order_from_item(item) if item else None

    def get_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        with busy_when_unavailable():
            response = aws.dynamodb().get_item(
                TableName=self._table, Key=keys.request_key(caller, idempotency_key), ConsistentRead=True
            )
        item = response.get("Item")
        if not item or int(item["expiresAt"]["N"]) < self._now():
            return None  # TTL deletion is lazy: an expired record no longer binds the key
        return RequestRecord(
            caller=caller,
            idempotency_key=idempotency_key,
            fingerprint=item["fingerprint"]["S"],
            order_id=item["orderId"]["S"],
            response=json.loads(item["response"]["S"]),
        )

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        assignments = "SET #status = :status, #version = :version, updatedAt = :updated"
        values = {
            ":status": {"S": str(order.status)},
            ":version": {"N": str(order.version)},
            ":updated": {"S": order.updated_at},
            ":expected": {"N": str(expected_version)},
        }
        if order.rejection is not None:
            assignments += ", rejection = :rejection"
            values[":rejection"] = _rejection_attribute(order.rejection)
        update = {
            "Update": {
                "TableName": self._table,
                "Key": keys.order_key(order.order_id),
                "UpdateExpression": assignments,
                "ConditionExpression": "#version = :expected",
                "ExpressionAttributeNames": {"#status": "status", "#version": "version"},
                "ExpressionAttributeValues": values,
            }
        }
        # A transaction: the version-checked transition and its event commit together, or neither does.
        try:
            transact_write_items([update, self._outbox_put(order, event)], seconds_left=self._seconds_left)
        except ClientError as exc:
            codes = cancellation_codes(exc)
            if (
                error_code(exc) == "TransactionCanceledException"
                and codes
                and codes[0] == ("ConditionalCheckFailed")
            ):
                raise VersionConflict(order.order_id) from exc
            raise

    # --- operations -----------------------------------------------------------------------------
    def seed(self, order: Order) -> bool:
        """Write `order` as it stands, with no event and no request key, unless an order has its id: what
        a sample event refers to, for the local stack's `make invoke` (as set_stock seeds stock). True
        if it was written."""
        try:
            aws.dynamodb().put_item(
                TableName=self._table,
                Item={**keys.order_key(order.order_id), **_order_attributes(order)},
                ConditionExpression=keys.KEY_NOT_TAKEN,
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True
