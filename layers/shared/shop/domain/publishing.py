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

    def count_failure(self, code: str, count: int = 1) -> None:
        self.failures_by_code[code] = self.failures_by_code.get(code, 0) + count

    def merge(self, chunk: PublishResult) -> None:
        """Count in what one chunk's calls did (its first_unpublished is the caller's to decide)."""
        self.calls += chunk.calls
        for code, count in chunk.failures_by_code.items():
            self.count_failure(code, count)
        self.accepted_positions.extend(chunk.accepted_positions)
        self.rejected.update(chunk.rejected)


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


class ChunkSchedule:
    """Which PutEvents chunks may be in flight together, and where publishing stands when they are done.

    A chunk waits for the last earlier chunk holding each of its aggregates to be settled (every entry of
    it on the bus, or refused and put away): an aggregate's events are never in flight twice, so a later
    event is never accepted while an earlier one can still fail. Chunks of other aggregates go
    concurrently. Once a chunk failed, no chunk after it is sent; chunks before it still are, when what
    they wait for settled, so the checkpoint gets as far as it can. Chunks are handed out in order.
    """

    def __init__(self, entries: Sequence[OutboxEntry], chunks: Sequence[range]) -> None:
        self._chunks = chunks
        last_of: dict[str, int] = {}
        self._waits_for: list[frozenset[int]] = []
        for index, chunk in enumerate(chunks):
            aggregates = {entries[position].aggregate for position in chunk}
            self._waits_for.append(frozenset(last_of[a] for a in aggregates if a in last_of))
            for aggregate in aggregates:
                last_of[aggregate] = index
        self._unsent = list(range(len(chunks)))
        self._settled: set[int] = set()
        self._failed_at: dict[int, int] = {}  # chunk -> position of its first entry not on the bus

    def ready(self, limit: int) -> list[int]:
        """Up to `limit` chunks that may be sent now, in order; each is taken as sent."""
        stop = min(self._failed_at, default=len(self._chunks))
        ready = [index for index in self._unsent if index < stop and self._waits_for[index] <= self._settled][
            : max(limit, 0)
        ]
        self._unsent = [index for index in self._unsent if index not in ready]
        return ready

    def settle(self, index: int, failed_at: int | None = None) -> None:
        """A sent chunk is done: every entry on the bus or put away, or the first that is not."""
        if failed_at is None:
            self._settled.add(index)
        else:
            self._failed_at[index] = failed_at

    def after_failure(self, index: int) -> bool:
        """Whether a chunk lies after one that failed (it was in flight when the failure was known)."""
        return any(failed < index for failed in self._failed_at)

    def first_unpublished(self) -> int | None:
        """Once nothing is in flight: the position publishing got to, None when every chunk settled."""
        stops = [self._chunks[index].start for index in self._unsent] + list(self._failed_at.values())
        return min(stops, default=None)


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
