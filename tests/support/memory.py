"""In-memory repositories: the domain's repository Protocols over dicts, for tests without moto.

Each write applies the conditions the DynamoDB repository's transaction applies, all or nothing, and
raises the same domain exceptions. tests/unit/test_repository_contract.py runs one contract against
these and the DynamoDB ones (on moto), so they cannot drift apart unnoticed. Test doubles: they do
not ship in the Lambda layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shop.domain.envelope import CloudEvent
from shop.domain.inventory import InsufficientStock, Reservation, ReservationChanged
from shop.domain.orders import Order, RequestKeyTaken, RequestRecord, VersionConflict
from shop.domain.outbox import ensure_publishable

EVENTBRIDGE_MAX_ENTRY_BYTES = 262_144  # the default of MAX_EVENT_BYTES (shop.runtime.config)


class ItemExists(Exception):
    """A new item's key is taken (DynamoDB cancels the transaction: attribute_not_exists(PK) failed)."""


class Outbox:
    """Outbox events per aggregate id; an event is written once (the item key holds sequence and id)."""

    def __init__(self, max_event_bytes: int) -> None:
        self._max_event_bytes = max_event_bytes
        self._events: dict[str, list[CloudEvent]] = {}

    def check_size(self, event: CloudEvent) -> None:
        """What the DynamoDB writer checks before its transaction: the event fits the bus."""
        ensure_publishable(event, self._max_event_bytes)

    def check_new(self, aggregate_id: str, event: CloudEvent) -> None:
        """The transaction's condition on the outbox item: its key is not taken."""
        if any((e.sequence, e.id) == (event.sequence, event.id) for e in self.events(aggregate_id)):
            raise ItemExists(f"outbox item {aggregate_id}/{event.sequence}/{event.id}")

    def add(self, aggregate_id: str, event: CloudEvent) -> None:
        self._events.setdefault(aggregate_id, []).append(event)

    def events(self, aggregate_id: str) -> list[CloudEvent]:
        """The aggregate's outbox events in sequence order (the order of their sort keys)."""
        return sorted(self._events.get(aggregate_id, []), key=lambda e: (e.sequence, e.id))


@dataclass(frozen=True, slots=True)
class _StoredRequest:
    record: RequestRecord
    expires_at: int  # epoch seconds, as the request key item's expiresAt


class InMemoryOrderRepository:
    """shop.domain.orders.OrderRepository, as DynamoOrderRepository behaves."""

    def __init__(
        self,
        *,
        max_event_bytes: int = EVENTBRIDGE_MAX_ENTRY_BYTES,
        request_key_ttl_hours: int = 24,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.orders: dict[str, Order] = {}
        self.outbox = Outbox(max_event_bytes)
        self._requests: dict[tuple[str, str], _StoredRequest] = {}
        self._request_ttl_seconds = request_key_ttl_hours * 3600
        self._clock = clock

    def _live_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        stored = self._requests.get((caller, idempotency_key))
        # TTL deletion is lazy: an expired record no longer binds the key, as in DynamoDB (whole seconds).
        if stored is None or stored.expires_at < int(self._clock()):
            return None
        return stored.record

    def create(self, order: Order, event: CloudEvent, request: RequestRecord | None) -> None:
        self.outbox.check_size(event)
        if request is not None and self._live_request(request.caller, request.idempotency_key):
            raise RequestKeyTaken(request.idempotency_key)
        if order.order_id in self.orders:
            raise ItemExists(f"order {order.order_id}")
        self.outbox.check_new(order.order_id, event)
        self.orders[order.order_id] = order
        self.outbox.add(order.order_id, event)
        if request is not None:
            expires_at = int(self._clock()) + self._request_ttl_seconds
            self._requests[(request.caller, request.idempotency_key)] = _StoredRequest(request, expires_at)

    def get(self, order_id: str) -> Order | None:
        return self.orders.get(order_id)

    def get_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        return self._live_request(caller, idempotency_key)

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        self.outbox.check_size(event)
        current = self.orders.get(order.order_id)
        if current is None or current.version != expected_version:
            raise VersionConflict(order.order_id)
        self.outbox.check_new(order.order_id, event)
        # The DynamoDB update sets these attributes only (the rejection when there is one); the rest of the
        # item stays as stored.
        self.orders[order.order_id] = Order(
            order_id=current.order_id,
            customer_id=current.customer_id,
            currency=current.currency,
            lines=current.lines,
            status=order.status,
            version=order.version,
            created_at=current.created_at,
            updated_at=order.updated_at,
            rejection=order.rejection if order.rejection is not None else current.rejection,
        )
        self.outbox.add(order.order_id, event)

    def seed(self, order: Order) -> bool:
        if order.order_id in self.orders:
            return False
        self.orders[order.order_id] = order
        return True

    def expire_request(self, caller: str, idempotency_key: str) -> None:
        """What time does to a request record: its expiry passes."""
        stored = self._requests[(caller, idempotency_key)]
        self._requests[(caller, idempotency_key)] = _StoredRequest(stored.record, int(self._clock()) - 60)


class InMemoryInventoryRepository:
    """shop.domain.inventory.InventoryRepository, as DynamoInventoryRepository behaves."""

    def __init__(self, *, max_event_bytes: int = EVENTBRIDGE_MAX_ENTRY_BYTES) -> None:
        self.stock: dict[str, int] = {}
        self.reservations: dict[str, Reservation] = {}
        self.outbox = Outbox(max_event_bytes)

    def _check_new(self, reservation: Reservation) -> None:
        if reservation.order_id in self.reservations:
            raise ReservationChanged(reservation.order_id)

    def _check_unchanged(self, current: Reservation) -> None:
        # The DynamoDB condition: orderSequence and status are still the ones read.
        stored = self.reservations.get(current.order_id)
        seen = (current.order_sequence, current.status)
        if stored is None or (stored.order_sequence, stored.status) != seen:
            raise ReservationChanged(current.order_id)

    def get_reservation(self, order_id: str) -> Reservation | None:
        return self.reservations.get(order_id)

    def reserve(self, reservation: Reservation, event: CloudEvent) -> None:
        self.outbox.check_size(event)
        self._check_new(reservation)
        self.outbox.check_new(reservation.order_id, event)
        # A SKU without a stock item fails `available >= :q` like one without enough stock; the failed
        # condition returns no item for it (ALL_OLD), so it is named unknown too.
        short = [sku for sku, quantity in reservation.lines if self.stock.get(sku, -1) < quantity]
        if short:
            raise InsufficientStock(short, [sku for sku in short if sku not in self.stock])
        for sku, quantity in reservation.lines:
            self.stock[sku] -= quantity
        self.reservations[reservation.order_id] = reservation
        self.outbox.add(reservation.order_id, event)

    def record_new(self, reservation: Reservation, event: CloudEvent | None) -> None:
        if event is not None:
            self.outbox.check_size(event)
        self._check_new(reservation)
        if event is not None:
            self.outbox.check_new(reservation.order_id, event)
        self.reservations[reservation.order_id] = reservation
        if event is not None:
            self.outbox.add(reservation.order_id, event)

    def release(self, current: Reservation, released: Reservation, event: CloudEvent) -> None:
        self.outbox.check_size(event)
        self._check_unchanged(current)
        self.outbox.check_new(released.order_id, event)
        for sku, quantity in current.lines:
            self.stock[sku] += quantity
        self.reservations[released.order_id] = released
        self.outbox.add(released.order_id, event)

    def update_status(self, current: Reservation, changed: Reservation) -> None:
        self._check_unchanged(current)
        self.reservations[changed.order_id] = changed

    def set_stock(self, sku: str, available: int) -> None:
        self.stock[sku] = available

    def available(self, sku: str) -> int | None:
        return self.stock.get(sku)
