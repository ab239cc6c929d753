"""Inventory: reserve every line of an order or none, release on cancel, emit the outcome as events.

Ordering rule (per order): the reservation item records the sequence of the last order event it
applied. An order event whose sequence is not above it is a duplicate or stale and changes nothing.
An OrderCancelled that arrives before its OrderCreated records a cancelled reservation (a tombstone),
so the late OrderCreated is stale and reserves nothing: no waiting, no stock held for a dead order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from shop.domain.envelope import CloudEvent, format_time, now
from shop.domain.errors import InvalidEnvelope

# Re-exported: defined apart so that the readers of inventory events need not import this module.
from shop.domain.event_names import INVENTORY_REJECTED as INVENTORY_REJECTED
from shop.domain.event_names import INVENTORY_RELEASED as INVENTORY_RELEASED
from shop.domain.event_names import INVENTORY_RESERVED as INVENTORY_RESERVED
from shop.domain.event_names import ORDER_CANCELLED, ORDER_CREATED

if TYPE_CHECKING:  # the event data declarations are for type checking and docs; 1.7 ms to import
    from shop.domain.event_types import Rejection, ReservationData

EVENT_SOURCE = "shop.inventory"


class ReservationStatus(StrEnum):
    RESERVED = "RESERVED"
    REJECTED = "REJECTED"
    RELEASED = "RELEASED"
    CANCELLED = "CANCELLED"  # cancelled before anything was reserved


class Reservation(NamedTuple):
    """The inventory's reservation for one order: what it holds, and the last order event applied."""

    order_id: str
    status: ReservationStatus
    lines: tuple[tuple[str, int], ...]  # (sku, quantity), one entry per SKU
    order_sequence: int  # sequence of the last order event applied
    version: int  # sequence of this reservation's own events
    updated_at: str

    def event(self, event_type: str, cause: CloudEvent, extra: Rejection | None = None) -> CloudEvent:
        data: ReservationData = {
            "orderId": self.order_id,
            "orderSequence": self.order_sequence,
            "status": str(self.status),
            "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in self.lines],
        }
        return CloudEvent.new(
            source=EVENT_SOURCE,
            type=event_type,
            subject=self.order_id,
            sequence=self.version,
            data={**data, **(extra or {})},
            correlation_id=cause.correlationid,
            causation_id=cause.id,
        )


class InsufficientStock(Exception):
    """`skus`: every SKU short of stock, in line order; `unknown_skus`: those of them with no stock at all."""

    def __init__(self, skus: list[str], unknown_skus: list[str] | None = None) -> None:
        super().__init__(", ".join(skus))
        self.skus = skus
        self.unknown_skus = unknown_skus or []


class ReservationChanged(Exception):
    """The reservation item was written by someone else meanwhile (a duplicate delivery)."""


class InventoryRepository(Protocol):
    """Every write is all or nothing. A new reservation is refused (ReservationChanged) when the order
    has one already; a change is refused (ReservationChanged) unless the stored reservation still has
    the order sequence and status of `current`."""

    def get_reservation(self, order_id: str) -> Reservation | None: ...

    def reserve(self, reservation: Reservation, event: CloudEvent) -> None:
        """Take every line's quantity from stock, record the reservation and its event; raise
        InsufficientStock naming every short SKU (in line order) when any SKU lacks the quantity, and
        which of them the inventory has no stock of at all."""

    def record_new(self, reservation: Reservation, event: CloudEvent | None) -> None:
        """Record a reservation that holds no stock (rejected, or a cancel's tombstone) and its event."""

    def release(self, current: Reservation, released: Reservation, event: CloudEvent) -> None:
        """Give `current`'s lines back to stock and store `released` with its event."""

    def update_status(self, current: Reservation, changed: Reservation) -> None:
        """Store `changed` (no stock moves, no event)."""


def stock_line(line: object, event: CloudEvent) -> tuple[str, int]:
    """A line's SKU and quantity as the contract states them (docs/asyncapi.yaml: a SKU string, an integer
    quantity of at least 1), else InvalidEnvelope. No coercion: int() would take -3 (a reservation that
    adds stock), 2.9 or "2" (2), True (1); an empty SKU names no stock item."""
    sku = line.get("sku") if isinstance(line, dict) else None
    quantity = line.get("quantity") if isinstance(line, dict) else None
    # bool is an int subclass: True is no quantity.
    if not isinstance(sku, str) or not sku or type(quantity) is not int or quantity < 1:
        raise InvalidEnvelope(
            "line without a SKU string and an integer quantity of at least 1",
            {"eventId": event.id, "sku": repr(sku)[:100], "quantity": repr(quantity)[:100]},
        )
    return sku, quantity


def order_lines(event: CloudEvent) -> tuple[tuple[str, int], ...]:
    """The order's quantities per SKU (an order may list a SKU on several lines)."""
    try:
        items = event.data["items"]
    except (KeyError, TypeError) as exc:
        raise InvalidEnvelope("order event without valid items", {"eventId": event.id}) from exc
    if not isinstance(items, list) or not items:
        raise InvalidEnvelope("order event without valid items", {"eventId": event.id})
    totals: Counter[str] = Counter()
    for item in items:
        sku, quantity = stock_line(item, event)
        totals[sku] += quantity
    return tuple(sorted(totals.items()))


class InventoryService:
    def __init__(self, repository: InventoryRepository, clock: Callable[[], datetime] = now) -> None:
        self._repository = repository
        self._clock = clock

    def apply(self, event: CloudEvent) -> str:
        """Apply one order event; returns what happened (for logs and tests)."""
        if event.type == ORDER_CREATED:
            return self._reserve(event)
        if event.type == ORDER_CANCELLED:
            return self._release(event)
        raise InvalidEnvelope("inventory does not handle this event type", {"type": event.type})

    def _reserve(self, event: CloudEvent) -> str:
        # No read first: the reservation is written only if none exists, and any that exists (an earlier
        # delivery's, or a cancel's tombstone) decided this order already, so the conditional write alone
        # gives "stale" exactly when a read would have. One DynamoDB request less per order.
        reservation = Reservation(
            order_id=event.subject,
            status=ReservationStatus.RESERVED,
            lines=order_lines(event),
            order_sequence=event.sequence,
            version=1,
            updated_at=format_time(self._clock()),
        )
        try:
            self._repository.reserve(reservation, reservation.event(INVENTORY_RESERVED, event))
        except InsufficientStock as short:
            rejected = reservation._replace(status=ReservationStatus.REJECTED)
            extra: Rejection = {
                "reason": "INSUFFICIENT_STOCK",
                "shortSkus": short.skus,
                "unknownSkus": short.unknown_skus,
            }
            try:
                self._repository.record_new(rejected, rejected.event(INVENTORY_REJECTED, event, extra))
            except ReservationChanged:
                return "stale"
            return "rejected"
        except ReservationChanged:
            return "stale"  # a concurrent or earlier delivery already decided this order
        return "reserved"

    def _release(self, event: CloudEvent) -> str:
        current = self._repository.get_reservation(event.subject)
        at = format_time(self._clock())
        if current is None:
            tombstone = Reservation(event.subject, ReservationStatus.CANCELLED, (), event.sequence, 1, at)
            try:
                self._repository.record_new(tombstone, None)
            except ReservationChanged:
                return self._release(event)  # the create landed meanwhile: release what it reserved
            return "cancelled-before-reservation"
        if current.order_sequence >= event.sequence:
            return "stale"
        if current.status is ReservationStatus.RESERVED:
            released = current._replace(
                status=ReservationStatus.RELEASED,
                order_sequence=event.sequence,
                version=current.version + 1,
                updated_at=at,
            )
            try:
                self._repository.release(current, released, released.event(INVENTORY_RELEASED, event))
            except ReservationChanged:
                return "stale"
            return "released"
        if current.status is not ReservationStatus.REJECTED:
            return "stale"
        changed = current._replace(
            status=ReservationStatus.CANCELLED, order_sequence=event.sequence, updated_at=at
        )
        try:
            self._repository.update_status(current, changed)
        except ReservationChanged:
            return "stale"
        return "cancelled-after-rejection"
