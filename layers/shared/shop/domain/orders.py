"""Orders: the aggregate, its state machine, its events, and the application service the API calls."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from shop.domain.envelope import CloudEvent, ensure_publishable, format_time, now
from shop.domain.errors import (
    ConcurrentModification,
    IdempotencyKeyReused,
    IllegalTransition,
    OrderNotFound,
    RequestInProgress,
)

# Re-exported: defined apart so that the readers of order events need not import this module.
from shop.domain.event_names import ORDER_CANCELLED as ORDER_CANCELLED
from shop.domain.event_names import ORDER_CONFIRMED as ORDER_CONFIRMED
from shop.domain.event_names import ORDER_CREATED as ORDER_CREATED
from shop.domain.event_names import ORDER_REJECTED as ORDER_REJECTED
from shop.domain.principals import ANONYMOUS_CALLER

if TYPE_CHECKING:  # the event data declarations are for type checking and docs; 1.7 ms to import
    from shop.domain.event_types import OrderData, OrderItemData, OrderRejectionData

EVENT_SOURCE = "shop.orders"
# The inventory reserves all lines in one transaction (100 actions at most): one action per SKU
# plus the reservation and its outbox item leaves room for 98 lines.
MAX_LINES = 98
_CANCEL_ATTEMPTS = 3


class OrderStatus(StrEnum):
    PENDING = "PENDING"
    CONFIRMED = "CONFIRMED"
    REJECTED = "REJECTED"
    CANCELLED = "CANCELLED"


# Which status an order may move to from which; anything else is an illegal transition.
_TRANSITIONS: dict[OrderStatus, frozenset[OrderStatus]] = {
    OrderStatus.PENDING: frozenset({OrderStatus.CONFIRMED, OrderStatus.REJECTED, OrderStatus.CANCELLED}),
    OrderStatus.CONFIRMED: frozenset({OrderStatus.CANCELLED}),
    OrderStatus.REJECTED: frozenset(),
    OrderStatus.CANCELLED: frozenset(),
}
_EVENT_FOR_STATUS = {
    OrderStatus.CANCELLED: ORDER_CANCELLED,
    OrderStatus.CONFIRMED: ORDER_CONFIRMED,
    OrderStatus.REJECTED: ORDER_REJECTED,
}


class OrderLine(NamedTuple):
    """One line of an order: a SKU, how many, at what unit price."""

    sku: str
    quantity: int
    unit_price: int  # minor units of the order currency (cents for USD); never a float

    @property
    def line_total(self) -> int:
        return self.quantity * self.unit_price

    def to_dict(self) -> OrderItemData:
        return {
            "sku": self.sku,
            "quantity": self.quantity,
            "unitPrice": self.unit_price,
            "lineTotal": self.line_total,
        }


class RejectionReason(StrEnum):
    INSUFFICIENT_STOCK = "INSUFFICIENT_STOCK"  # the SKU is stocked, with less than the order asks
    UNKNOWN_SKU = "UNKNOWN_SKU"  # the inventory has no stock of the SKU at all


class RejectedLine(NamedTuple):
    """A SKU the inventory could not reserve for an order, and why."""

    sku: str
    quantity: int  # what the order asked of this SKU, its lines together (as the inventory reserves)
    reason: RejectionReason


class OrderRejection(NamedTuple):
    """Why the inventory refused an order: each SKU it could not reserve, and why."""

    reason: RejectionReason
    lines: tuple[RejectedLine, ...]

    @classmethod
    def of(cls, lines: tuple[RejectedLine, ...]) -> OrderRejection:
        """The order's reason is UNKNOWN_SKU when any line names a SKU the inventory does not know (the order
        can never be filled as placed), else INSUFFICIENT_STOCK (it might be, with more stock)."""
        unknown = any(line.reason is RejectionReason.UNKNOWN_SKU for line in lines)
        return cls(RejectionReason.UNKNOWN_SKU if unknown else RejectionReason.INSUFFICIENT_STOCK, lines)

    def to_dict(self) -> OrderRejectionData:
        return {
            "reason": str(self.reason),
            "lines": [
                {"sku": line.sku, "quantity": line.quantity, "reason": str(line.reason)}
                for line in self.lines
            ],
        }


class Order(NamedTuple):
    """The order aggregate: its lines, its status and the version of its last change."""

    order_id: str
    customer_id: str
    currency: str
    lines: tuple[OrderLine, ...]
    status: OrderStatus
    version: int
    created_at: str
    updated_at: str
    rejection: OrderRejection | None = None  # a REJECTED order's reason (none if rejected before it was kept)

    @property
    def total_amount(self) -> int:
        return sum(line.line_total for line in self.lines)

    def transition_to(
        self, status: OrderStatus, at: datetime, rejection: OrderRejection | None = None
    ) -> Order:
        if status not in _TRANSITIONS[self.status]:
            raise IllegalTransition(
                f"an order in status {self.status} cannot become {status}",
                {"orderId": self.order_id, "status": str(self.status), "requested": str(status)},
            )
        if rejection is not None and status is not OrderStatus.REJECTED:
            raise ValueError(f"only a rejected order has a rejection, not one becoming {status}")
        changed = self._replace(status=status, version=self.version + 1, updated_at=format_time(at))
        return changed if rejection is None else changed._replace(rejection=rejection)

    def to_dict(self) -> dict[str, Any]:
        """The public representation: the API response body and the data of order events."""
        data: OrderData = {
            "orderId": self.order_id,
            "customerId": self.customer_id,
            "currency": self.currency,
            "items": [line.to_dict() for line in self.lines],
            "totalAmount": self.total_amount,
            "status": str(self.status),
            "version": self.version,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
        if self.rejection is not None:
            data["rejection"] = self.rejection.to_dict()
        return dict(data)

    def event(self, event_type: str, correlation_id: str, causation_id: str | None = None) -> CloudEvent:
        return CloudEvent.new(
            source=EVENT_SOURCE,
            type=event_type,
            subject=self.order_id,
            sequence=self.version,
            data=self.to_dict(),
            correlation_id=correlation_id,
            causation_id=causation_id,
            time=datetime.fromisoformat(self.updated_at.replace("Z", "+00:00")),
        )


class PlaceOrder(NamedTuple):
    """A validated request to place an order."""

    customer_id: str
    currency: str
    lines: tuple[OrderLine, ...]

    def fingerprint(self) -> str:
        """Stable digest of the request, to tell a retry from a different request with the same key."""
        canonical = json.dumps(
            {
                "customerId": self.customer_id,
                "currency": self.currency,
                "items": [[line.sku, line.quantity, line.unit_price] for line in self.lines],
            },
            separators=(",", ":"),
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


class RequestRecord(NamedTuple):
    """What the API remembers of a request made with an Idempotency-Key (scoped to its caller)."""

    caller: str
    idempotency_key: str
    fingerprint: str
    order_id: str
    response: dict[str, Any]


class PlacedOrder(NamedTuple):
    """What placing an order answers: the order's representation, and whether it was a replay."""

    order: dict[str, Any]
    replayed: bool


class RequestKeyTaken(Exception):
    """The caller's Idempotency-Key already has a record (raised by the repository)."""


class VersionConflict(Exception):
    """The order's version is not the expected one (raised by the repository)."""


class OrderRepository(Protocol):
    def create(self, order: Order, event: CloudEvent, request: RequestRecord | None) -> None:
        """Write the order, its event and the request record (if any) atomically, or nothing: raise
        RequestKeyTaken when the caller's Idempotency-Key already has an unexpired record."""

    def get(self, order_id: str) -> Order | None: ...

    def get_request(self, caller: str, idempotency_key: str) -> RequestRecord | None:
        """The caller's unexpired record of this Idempotency-Key, if any."""

    def save_transition(self, order: Order, expected_version: int, event: CloudEvent) -> None:
        """Write the changed order and its event atomically, only if the stored version is still
        `expected_version`; otherwise write nothing and raise VersionConflict."""


class OrderSettings(Protocol):
    """The settings values the order service needs (runtime.config.Settings is one)."""

    @property
    def max_event_bytes(self) -> int: ...


def new_order_id() -> str:
    return f"o-{uuid.uuid4().hex}"


def _largest_rejected(order: Order, correlation_id: str) -> CloudEvent:
    """The largest OrderRejected `order` can have: every SKU refused, its quantities together, with the
    longer reason, caused by an event (a UUID), and the trace its writer adds."""
    asked: dict[str, int] = {}
    for line in order.lines:
        asked[line.sku] = asked.get(line.sku, 0) + line.quantity
    longest = RejectionReason.INSUFFICIENT_STOCK
    rejection = OrderRejection(longest, tuple(RejectedLine(sku, n, longest) for sku, n in asked.items()))
    at = datetime.fromisoformat(order.updated_at.replace("Z", "+00:00"))
    rejected = order.transition_to(OrderStatus.REJECTED, at, rejection)
    return rejected.event(ORDER_REJECTED, correlation_id, str(uuid.UUID(int=0))).with_room_for_a_trace()


class OrderService:
    def __init__(
        self,
        repository: OrderRepository,
        settings: OrderSettings,
        clock: Callable[[], datetime] = now,
        new_id: Callable[[], str] = new_order_id,
    ) -> None:
        self._repository = repository
        self._max_event_bytes = settings.max_event_bytes
        self._clock = clock
        self._new_id = new_id

    def place_order(
        self,
        command: PlaceOrder,
        *,
        idempotency_key: str | None,
        correlation_id: str,
        caller: str = ANONYMOUS_CALLER,
    ) -> PlacedOrder:
        """Create an order; an Idempotency-Key binds it for its caller only (another caller's key is
        another key), so a replay or a refusal only ever concerns the caller's own request."""
        at = format_time(self._clock())
        order = Order(
            order_id=self._new_id(),
            customer_id=command.customer_id,
            currency=command.currency,
            lines=command.lines,
            status=OrderStatus.PENDING,
            version=1,
            created_at=at,
            updated_at=at,
        )
        event = order.event(ORDER_CREATED, correlation_id)
        ensure_publishable(event.with_room_for_a_trace(), self._max_event_bytes)
        # Its OrderRejected is larger (a cause, the rejection): refused now rather than left unpublishable.
        ensure_publishable(_largest_rejected(order, correlation_id), self._max_event_bytes)
        request = None
        if idempotency_key is not None:
            request = RequestRecord(
                caller=caller,
                idempotency_key=idempotency_key,
                fingerprint=command.fingerprint(),
                order_id=order.order_id,
                response=order.to_dict(),
            )
        try:
            self._repository.create(order, event, request)
        except RequestKeyTaken:
            assert idempotency_key is not None  # only a request record can be taken
            return self._replay(caller, idempotency_key, command)
        return PlacedOrder(order.to_dict(), replayed=False)

    def _replay(self, caller: str, idempotency_key: str, command: PlaceOrder) -> PlacedOrder:
        previous = self._repository.get_request(caller, idempotency_key)
        if previous is None:
            # The key's transaction is committing concurrently (or just expired): the client retries.
            raise RequestInProgress("a request with this Idempotency-Key is in progress; retry shortly")
        if previous.fingerprint != command.fingerprint():
            raise IdempotencyKeyReused(
                "this Idempotency-Key was already used with a different request body",
                {"orderId": previous.order_id},
            )
        return PlacedOrder(previous.response, replayed=True)

    def get_order(self, order_id: str) -> Order:
        order = self._repository.get(order_id)
        if order is None:
            raise OrderNotFound("no order with this id", {"orderId": order_id})
        return order

    def cancel_order(self, order_id: str, *, correlation_id: str) -> Order:
        """Cancel an order; cancelling a cancelled order is a no-op that returns it (no new event)."""
        for _ in range(_CANCEL_ATTEMPTS):
            current = self.get_order(order_id)
            if current.status is OrderStatus.CANCELLED:
                return current
            cancelled = current.transition_to(OrderStatus.CANCELLED, self._clock())
            event = cancelled.event(ORDER_CANCELLED, correlation_id)
            try:
                self._repository.save_transition(cancelled, current.version, event)
            except VersionConflict:
                continue  # changed under us (e.g. confirmed meanwhile): re-read and decide again
            return cancelled
        raise ConcurrentModification("the order kept changing while it was being cancelled; retry")

    def apply_inventory_outcome(
        self,
        order_id: str,
        status: OrderStatus,
        cause: CloudEvent,
        rejection: OrderRejection | None = None,
    ) -> str:
        """Confirm or reject a PENDING order from the inventory's answer, with its event, atomically; a
        rejection is stored with the order (and carried by its OrderRejected).

        Only a PENDING order moves: an order that was cancelled meanwhile stays cancelled (the
        inventory releases the stock on OrderCancelled), and a repeat of an applied answer finds the
        order decided already. The version condition makes the write safe on its own.
        """
        for _ in range(_CANCEL_ATTEMPTS):
            current = self.get_order(order_id)
            if current.status is not OrderStatus.PENDING:
                return f"ignored:{current.status}"
            changed = current.transition_to(status, self._clock(), rejection)
            event = changed.event(_EVENT_FOR_STATUS[status], cause.correlationid, cause.id)
            try:
                self._repository.save_transition(changed, current.version, event)
            except VersionConflict:
                continue
            return str(status).lower()
        raise ConcurrentModification("the order kept changing while applying the inventory outcome")
