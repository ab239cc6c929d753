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
    # The entry whose failure stopped publishing (at or after first_unpublished: an entry before it may be
    # unsent, its chunk waiting on the failed one's).
    first_failed: int | None = None
    # Chunks were left unsent: too little of the invocation was left for their calls to be answered. With
    # no failure, first_unpublished is where the time ran out, and nothing failed there.
    out_of_time: bool = False
    calls: int = 0
    failures_by_code: dict[str, int] = field(default_factory=dict)
    accepted_positions: list[int] = field(default_factory=list)
    rejected: dict[int, tuple[str, str]] = field(default_factory=dict)  # position -> (code, message)

    @property
    def published(self) -> int:
        """How many entries are on the bus."""
        return len(self.accepted_positions)

    @property
    def failed_position(self) -> int | None:
        """The entry to record the failure on: the one that failed, or, from a publisher that does not say,
        the checkpoint."""
        return self.first_unpublished if self.first_failed is None else self.first_failed

    def count_failure(self, code: str, count: int = 1) -> None:
        self.failures_by_code[code] = self.failures_by_code.get(code, 0) + count

    def merge(self, chunk: PublishResult) -> None:
        """Count in what one chunk's calls did (its first_unpublished is the caller's to decide)."""
        self.calls += chunk.calls
        for code, count in chunk.failures_by_code.items():
            self.count_failure(code, count)
        self.accepted_positions.extend(chunk.accepted_positions)
        self.rejected.update(chunk.rejected)


# Called with (position, error code, message) for an entry the bus refused for what it is, once its call
# answered and unless an entry before it failed; True when the caller has put the entry away (parked
# it), False to stop publishing there (the entry becomes a failure: first_failed, at or after
# first_unpublished).
OnRejected = Callable[[int, str, str], bool]


class OutboxPublisher(Protocol):
    def publish_in_order(
        self,
        entries: Sequence[OutboxEntry],
        remaining_seconds: Callable[[], float] = ...,
        on_rejected: OnRejected | None = None,
        invocation_seconds_left: Callable[[], float] | None = None,
    ) -> PublishResult:
        """Publish each aggregate's entries in input order; stop at the first failure that remains
        (its position is the result's first_failed; first_unpublished, at or before it, is where
        publishing stands: every entry before it is on the bus or put away); report entries refused
        for what they are in `rejected`, and hand each to `on_rejected` (when given) unless an entry
        before it failed. `remaining_seconds`: the caller's time for publishing (retries within it);
        `invocation_seconds_left` (default: the same): no call is begun that could be answered after
        it, and entries left unsent for that are where publishing stands (`out_of_time`)."""


# Earlier chunks an entry may still join: enough to fill every chunk a batch leaves short, few enough
# that packing stays linear whatever the entries' sizes.
OPEN_CHUNKS = 16


def ordered_chunks(entries: Sequence[OutboxEntry], max_request_bytes: int) -> list[tuple[int, ...]]:
    """Split positions into PutEvents-sized chunks (positions rising in each) that never hold two events of
    one aggregate, each aggregate's events in chunks of rising index: what a relay may have in flight at
    once, with few short calls (in the bench's rounds and batches, none but a round's last).

    Entries are placed rank by rank (every aggregate's first entry, then every aggregate's second...,
    the busiest aggregates first in each: interleave_orders), each in the first chunk with room after
    the one holding its aggregate's previous entry (among the last OPEN_CHUNKS): an aggregate's entries
    close together in a stream batch do not cut calls short. The placing order is not the sending
    order: a chunk's entries go in input order, and where publishing stands is a position in `entries`
    (ChunkSchedule)."""
    placing = interleave_orders(
        range(len(entries)), lambda position: entries[position].aggregate, busiest_first=True
    )
    chunks: list[list[int]] = []
    sizes: list[int] = []
    last_of: dict[str, int] = {}
    first_open = 0  # chunks before it hold ten entries
    for position in placing:
        entry = entries[position]
        index = max(first_open, len(chunks) - OPEN_CHUNKS, last_of.get(entry.aggregate, -1) + 1)
        while index < len(chunks) and (
            len(chunks[index]) == MAX_ENTRIES_PER_CALL or sizes[index] + entry.size > max_request_bytes
        ):
            index += 1
        if index == len(chunks):
            chunks.append([])
            sizes.append(0)
        chunks[index].append(position)
        sizes[index] += entry.size
        last_of[entry.aggregate] = index
        while first_open < len(chunks) and len(chunks[first_open]) == MAX_ENTRIES_PER_CALL:
            first_open += 1
    return [tuple(sorted(chunk)) for chunk in chunks]


class ChunkSchedule:
    """Which PutEvents chunks may be in flight together, and where publishing stands when they are done.

    A chunk waits for the last earlier chunk holding each of its aggregates to be settled (every entry of
    it on the bus, or refused and put away): an aggregate's events are never in flight twice, so a later
    event is never accepted while an earlier one can still fail. Chunks of other aggregates go
    concurrently. Once an entry failed, no chunk holding an entry after it is sent (nothing more goes
    past the checkpoint); chunks wholly before it still are, when what they wait for settled, so the
    checkpoint gets as far as it can. Chunks are handed out in order.
    """

    def __init__(self, entries: Sequence[OutboxEntry], chunks: Sequence[Sequence[int]]) -> None:
        self._firsts = [chunk[0] for chunk in chunks]
        self._lasts = [chunk[-1] for chunk in chunks]
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
        stop = self.first_failure()
        ready: list[int] = []
        unsent: list[int] = []
        for index in self._unsent:
            if (
                len(ready) < limit
                and (stop is None or self._lasts[index] < stop)
                and self._waits_for[index] <= self._settled
            ):
                ready.append(index)
            else:
                unsent.append(index)
        self._unsent = unsent
        return ready

    def holds_unsent(self) -> bool:
        """Whether chunks are still unsent (waiting, or past a failure)."""
        return bool(self._unsent)

    def settle(self, index: int, failed_at: int | None = None) -> None:
        """A sent chunk is done: every entry on the bus or put away, or the first that is not."""
        if failed_at is None:
            self._settled.add(index)
        else:
            self._failed_at[index] = failed_at

    def past_a_failure(self, position: int) -> bool:
        """Whether an entry lies after one that failed (its chunk was in flight when the failure was
        known): it is not where publishing stands, and comes again."""
        stop = self.first_failure()
        return stop is not None and stop < position

    def first_failure(self) -> int | None:
        """The position of the first entry that failed, None while none did."""
        return min(self._failed_at.values(), default=None)

    def first_unpublished(self) -> int | None:
        """Once nothing is in flight: the position publishing got to, None when every chunk settled."""
        stops = [self._firsts[index] for index in self._unsent] + list(self._failed_at.values())
        return min(stops, default=None)


def whole_calls[Event](events: Sequence[Event]) -> Sequence[Event]:
    """The events that fill whole PutEvents calls (a multiple of ten, the rest left for later), or all of
    them when they fill none: what a relay publishes of a round when more is ready, so the round does
    not end on a short call that the next round's events would have filled. Events are in publishing
    order, so an event left out is its order's last in the round: nothing of its order overtakes it."""
    whole = len(events) - len(events) % MAX_ENTRIES_PER_CALL
    return events[:whole] if whole else events


def interleave_orders[Event](
    events: Sequence[Event], order_of: Callable[[Event], Hashable], *, busiest_first: bool = False
) -> list[Event]:
    """Events regrouped so one PutEvents call carries up to ten orders: every order's first event, then
    every order's second... Each order's events, and each rank's orders, keep the order given; with
    `busiest_first`, a rank's orders with more events come first, so an order's next event is a rank's
    length after its previous one, not beside it at the end of a short rank (where it costs a call of
    its own)."""
    total: dict[Hashable, int] = {}
    if busiest_first:
        for event in events:
            order = order_of(event)
            total[order] = total.get(order, 0) + 1
    nth: dict[Hashable, int] = {}
    ranked = []
    for index, event in enumerate(events):
        order = order_of(event)
        nth[order] = nth.get(order, -1) + 1
        ranked.append(((nth[order], -total.get(order, 0), index), event))
    return [event for _, event in sorted(ranked, key=lambda pair: pair[0])]
