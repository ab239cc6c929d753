"""Publishing outbox entries in order: the chunking rule, the result the relay checkpoints from, and
the publisher interface (adapters.eventbridge implements it with PutEvents and says what it guarantees).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shop.domain.outbox import OutboxEntry

MAX_ENTRIES_PER_CALL = 10  # PutEvents takes at most 10 entries per call


@dataclass
class PublishResult:
    """What happened to a sequence of entries handed to publish_in_order().

    Only `accepted_positions` are on the bus. An entry in `rejected` was refused by the bus for what it
    is: it is never published, whatever its position (callers must not count it as done)."""

    first_unpublished: int | None = None  # position of the checkpoint, None when nothing is pending
    calls: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    accepted_positions: list[int] = field(default_factory=list)
    rejected: dict[int, tuple[str, str]] = field(default_factory=dict)  # position -> (code, message)

    @property
    def published(self) -> int:
        """How many entries are on the bus."""
        return len(self.accepted_positions)

    def count_failure(self, code: str) -> None:
        self.failures_by_code[code] = self.failures_by_code.get(code, 0) + 1


# Called with (position, error code, message) for an entry the bus refused for what it is, once the
# entries before it are on the bus; True when the caller has put the entry away (parked it), False to
# stop publishing there (the position becomes first_unpublished).
OnRejected = Callable[[int, str, str], bool]


class OutboxPublisher(Protocol):
    def publish_in_order(
        self,
        entries: Sequence[OutboxEntry],
        remaining_seconds: Callable[[], float] = ...,
        on_rejected: OnRejected | None = None,
    ) -> PublishResult:
        """Publish in input order; stop at the first failure that remains (its position is the
        result's first_unpublished); report entries refused for what they are in `rejected`, and
        hand each to `on_rejected` (when given) before anything after its PutEvents call is sent."""


def ordered_chunks(entries: Sequence[OutboxEntry], max_request_bytes: int) -> list[range]:
    """Split positions into PutEvents-sized chunks that never repeat an aggregate."""
    chunks: list[range] = []
    start, size, aggregates = 0, 0, set[str]()
    for position, entry in enumerate(entries):
        full = (
            position - start == MAX_ENTRIES_PER_CALL
            or size + entry.size > max_request_bytes
            or entry.aggregate in aggregates
        )
        if full and position > start:
            chunks.append(range(start, position))
            start, size, aggregates = position, 0, set()
        size += entry.size
        aggregates.add(entry.aggregate)
    if start < len(entries):
        chunks.append(range(start, len(entries)))
    return chunks


def interleave_orders[Event](events: Sequence[Event], order_of: Callable[[Event], Hashable]) -> list[Event]:
    """Events regrouped so one PutEvents call carries up to ten orders: every order's first event, then
    every order's second... Each order's events, and each rank's orders, keep the order given."""
    nth: dict[Hashable, int] = {}
    ranked = []
    for index, event in enumerate(events):
        order = order_of(event)
        nth[order] = nth.get(order, -1) + 1
        ranked.append(((nth[order], index), event))
    return [event for _, event in sorted(ranked, key=lambda pair: pair[0])]
