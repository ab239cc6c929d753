"""DynamoDB access for inventory: stock per SKU, reservations, and their outbox items, transactionally."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from shop.adapters import aws
from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_writes import OutboxSettings, outbox_put
from shop.adapters.dynamodb.transactions import (
    CONDITION_FAILED,
    SecondsLeft,
    busy_when_unavailable,
    cancellation_codes,
    cancellation_reasons,
    only_conditions_failed,
    transact_write_items,
    unbounded,
)
from shop.domain.envelope import CloudEvent
from shop.domain.inventory import InsufficientStock, Reservation, ReservationChanged, ReservationStatus
from shop.domain.tracing import TraceHeaderSource, no_trace_header


def _reservation_attributes(reservation: Reservation) -> dict[str, Any]:
    return {
        "entityType": {"S": "Reservation"},
        "orderId": {"S": reservation.order_id},
        "status": {"S": str(reservation.status)},
        "lines": {
            "L": [{"M": {"sku": {"S": sku}, "quantity": {"N": str(qty)}}} for sku, qty in reservation.lines]
        },
        "orderSequence": {"N": str(reservation.order_sequence)},
        "version": {"N": str(reservation.version)},
        "updatedAt": {"S": reservation.updated_at},
    }


def _reservation_from_item(item: dict[str, Any]) -> Reservation:
    return Reservation(
        order_id=item["orderId"]["S"],
        status=ReservationStatus(item["status"]["S"]),
        lines=tuple((line["M"]["sku"]["S"], int(line["M"]["quantity"]["N"])) for line in item["lines"]["L"]),
        order_sequence=int(item["orderSequence"]["N"]),
        version=int(item["version"]["N"]),
        updated_at=item["updatedAt"]["S"],
    )


class DynamoInventoryRepository:
    def __init__(
        self,
        settings: OutboxSettings,
        *,
        trace_header: TraceHeaderSource = no_trace_header,
        seconds_left: SecondsLeft = unbounded,
    ) -> None:
        self._settings = settings
        self._table = settings.require("inventory_table_name")
        self._trace_header = trace_header
        self._seconds_left = seconds_left

    def _outbox_put(self, order_id: str, event: CloudEvent) -> dict[str, Any]:
        partition = keys.reservation_partition(order_id)
        return outbox_put(self._table, event, partition, self._settings, self._trace_header())

    def _put_new(self, reservation: Reservation) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self._table,
                "Item": {
                    **keys.reservation_key(reservation.order_id),
                    **_reservation_attributes(reservation),
                },
                "ConditionExpression": keys.KEY_NOT_TAKEN,
            }
        }

    def _guarded_update(self, current: Reservation, changed: Reservation) -> dict[str, Any]:
        """Replace a reservation only if it is still the version we read (safe under redelivery)."""
        return {
            "Put": {
                "TableName": self._table,
                "Item": {**keys.reservation_key(changed.order_id), **_reservation_attributes(changed)},
                "ConditionExpression": "orderSequence = :seen AND #status = :status",
                "ExpressionAttributeNames": {"#status": "status"},
                "ExpressionAttributeValues": {
                    ":seen": {"N": str(current.order_sequence)},
                    ":status": {"S": str(current.status)},
                },
            }
        }

    def _stock_change(self, sku: str, delta: int) -> dict[str, Any]:
        if delta < 0:
            return {
                "Update": {
                    "TableName": self._table,
                    "Key": keys.stock_key(sku),
                    "UpdateExpression": "SET available = available - :q",
                    # A SKU without a stock item fails it too: no `available` to compare.
                    "ConditionExpression": "available >= :q",
                    "ExpressionAttributeValues": {":q": {"N": str(-delta)}},
                    # The stock item, if any, comes back with a failed condition: none means an unknown
                    # SKU, told apart from a short one in the same request (no read, no race).
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
        return {
            "Update": {
                "TableName": self._table,
                "Key": keys.stock_key(sku),
                "UpdateExpression": "SET available = available + :q",
                "ExpressionAttributeValues": {":q": {"N": str(delta)}},
            }
        }

    def _transact(self, actions: list[dict[str, Any]], reservation_index: int) -> None:
        """Run a transaction; raise ReservationChanged when the reservation item failed its own condition
        (another delivery wrote it), and the ClientError of any other failure: a cancellation for
        another reason (a validation error, a size limit) is no sign the reservation changed, and taken
        for one the message would be acknowledged with nothing done (a release left undone for good).

        Transactional (2 units per KB per item) because the reservation, the stock it takes or gives
        back and its outbox event must commit together: a crash in between would take stock without
        an event, or announce a reservation that holds no stock.
        """
        try:
            transact_write_items(actions, seconds_left=self._seconds_left)
        except ClientError as exc:
            codes = cancellation_codes(exc)
            if codes and codes[reservation_index] == CONDITION_FAILED:
                raise ReservationChanged(str(actions[reservation_index])) from exc
            raise

    # --- InventoryRepository ------------------------------------------------------------------------
    def get_reservation(self, order_id: str) -> Reservation | None:
        with busy_when_unavailable():
            item = (
                aws.dynamodb()
                .get_item(TableName=self._table, Key=keys.reservation_key(order_id), ConsistentRead=True)
                .get("Item")
            )
        return _reservation_from_item(item) if item else None

    def reserve(self, reservation: Reservation, event: CloudEvent) -> None:
        stock = [self._stock_change(sku, -qty) for sku, qty in reservation.lines]
        actions = [self._put_new(reservation), self._outbox_put(reservation.order_id, event), *stock]
        try:
            self._transact(actions, reservation_index=0)
        except ClientError as exc:
            # Short only when failed stock conditions are the whole answer: with any other reason the
            # rejection could name SKUs that are not short, or none (which the order side refuses).
            codes = cancellation_codes(exc)
            if CONDITION_FAILED not in codes[2:] or not only_conditions_failed(codes):
                raise
            failed = [
                (sku, "Item" in reason)
                for (sku, _), reason in zip(reservation.lines, cancellation_reasons(exc)[2:], strict=True)
                if reason.get("Code") == CONDITION_FAILED
            ]
            raise InsufficientStock(
                [sku for sku, _ in failed], [sku for sku, stocked in failed if not stocked]
            ) from exc

    def record_new(self, reservation: Reservation, event: CloudEvent | None) -> None:
        actions = [self._put_new(reservation)]
        if event is not None:
            actions.append(self._outbox_put(reservation.order_id, event))
        self._transact(actions, reservation_index=0)

    def release(self, current: Reservation, released: Reservation, event: CloudEvent) -> None:
        stock = [self._stock_change(sku, qty) for sku, qty in current.lines]
        actions = [
            self._guarded_update(current, released),
            self._outbox_put(released.order_id, event),
            *stock,
        ]
        self._transact(actions, reservation_index=0)

    def update_status(self, current: Reservation, changed: Reservation) -> None:
        self._transact([self._guarded_update(current, changed)], reservation_index=0)

    # --- operations -----------------------------------------------------------------------------
    def set_stock(self, sku: str, available: int) -> None:
        """Seed or correct the stock of a SKU (operators and the local stack)."""
        aws.dynamodb().put_item(
            TableName=self._table,
            Item={
                **keys.stock_key(sku),
                "entityType": {"S": "Stock"},
                "sku": {"S": sku},
                "available": {"N": str(available)},
            },
        )

    def available(self, sku: str) -> int | None:
        item = (
            aws.dynamodb()
            .get_item(TableName=self._table, Key=keys.stock_key(sku), ConsistentRead=True)
            .get("Item")
        )
        return int(item["available"]["N"]) if item else None
