"""Publishing with PutEvents calls in flight at once: which chunks may overlap (domain.publishing
ChunkSchedule), and the publisher against a bus that takes its time and fails some entries, checked for
what the relays checkpoint from: an order's events never in flight twice nor out of sequence, and the
first unpublished position exact."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

import shop.adapters.aws
from shop.adapters.eventbridge import EventPublisher
from shop.domain.outbox import OutboxEntry
from shop.domain.publishing import ChunkSchedule, PublishResult, ordered_chunks
from tests.support.outbox_entries import order_entry


def interleaved(orders: int, events_per_order: int) -> list[OutboxEntry]:
    """Every order's first event, then every order's second... (the relays' publishing order)."""
    return [order_entry(f"o{o:03d}", s) for s in range(1, events_per_order + 1) for o in range(orders)]


class SlowBus:
    """PutEvents answered after `latency`, from any thread: records what was in flight together."""

    def __init__(self, latency: float, fail: Iterable[str] = (), throttle: float = 0.0) -> None:
        self.latency = latency
        self.fail = set(fail)
        self.throttle = throttle
        self._random = random.Random(11)
        self._lock = threading.Lock()
        self._in_flight: list[set[str]] = []
        self.most_in_flight = 0
        self.overlapping_orders: list[str] = []
        self.accepted: list[tuple[str, int]] = []
        self.calls = 0

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        details = [json.loads(e["Detail"]) for e in Entries]
        orders = {d["subject"] for d in details}
        with self._lock:
            self.calls += 1
            for other in self._in_flight:
                self.overlapping_orders.extend(orders & other)
            self._in_flight.append(orders)
            self.most_in_flight = max(self.most_in_flight, len(self._in_flight))
        time.sleep(self.latency)
        results = []
        with self._lock:
            self._in_flight.remove(orders)
            for detail in details:
                if detail["id"] in self.fail:
                    results.append({"ErrorCode": "AccessDeniedException", "ErrorMessage": "injected"})
                elif self._random.random() < self.throttle:
                    results.append({"ErrorCode": "ThrottlingException", "ErrorMessage": "injected"})
                else:
                    self.accepted.append((detail["subject"], detail["sequence"]))
                    results.append({"EventId": detail["id"]})
        return {"FailedEntryCount": sum("ErrorCode" in r for r in results), "Entries": results}

    def sequences(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for order, sequence in self.accepted:
            out.setdefault(order, []).append(sequence)
        return out


class AnsweredLater:
    """A SlowBus reached as the AWS Common Runtime's transport is: each call begun and answered later from
    a thread not the publisher's (EventPublisher's PutEventsCalls, with no worker threads of its own)."""

    def __init__(self, bus: SlowBus) -> None:
        self.bus = bus

    def begin(self, entries: list[dict[str, Any]], answer: Callable[[Any], None]) -> None:
        threading.Thread(target=lambda: answer(self.bus.put_events(Entries=entries)), daemon=True).start()

    def expire_overdue(self) -> float | None:
        return None


@pytest.fixture(params=["worker threads", "answered later"])
def slow_bus(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> list[SlowBus]:
    """The bus each test appends, reached through an SDK client's blocking calls (the publisher's worker
    threads) or as calls answered later (its callbacks)."""
    buses: list[SlowBus] = []
    if request.param == "worker threads":
        monkeypatch.setattr(shop.adapters.aws, "events", lambda: buses[-1])
    else:
        monkeypatch.setattr(shop.adapters.aws, "events", lambda: AnsweredLater(buses[-1]))
    return buses


def publisher(in_flight: int) -> EventPublisher:
    return EventPublisher("orders-bus", 262_144, max_in_flight=in_flight, sleep=lambda _: None)


# --- which chunks may be in flight together -----------------------------------------------------------
def test_a_chunk_waits_for_the_chunk_with_its_orders_earlier_event_and_others_go_at_once():
    entries = [order_entry("a", 1), order_entry("b", 1), order_entry("c", 1), order_entry("a", 2)]
    schedule = ChunkSchedule(entries, [range(0, 1), range(1, 2), range(2, 3), range(3, 4)])

    assert schedule.ready(10) == [0, 1, 2]  # a's second event waits for its first
    schedule.settle(1)
    assert schedule.ready(10) == []
    schedule.settle(0)
    assert schedule.ready(10) == [3]


def test_after_a_failure_nothing_later_is_sent_but_earlier_chunks_still_are_and_the_checkpoint_is_exact():
    entries = [
        order_entry("a", 1),
        order_entry("b", 1),
        order_entry("a", 2),
        order_entry("c", 1),
        order_entry("d", 1),
    ]
    schedule = ChunkSchedule(entries, [range(n, n + 1) for n in range(5)])
    assert schedule.ready(10) == [0, 1, 3, 4]

    schedule.settle(3, failed_at=3)  # c's event failed while a's first was still in flight
    schedule.settle(0)
    assert schedule.ready(10) == [2]  # before the failure: still sent once a's first settled
    assert schedule.past_a_failure(4)
    assert not schedule.past_a_failure(2)
    assert schedule.first_failure() == 3
    for index in (1, 2, 4):
        schedule.settle(index)
    assert schedule.first_unpublished() == 3


def test_a_chunk_waiting_on_a_failed_chunk_is_never_sent_and_holds_the_checkpoint():
    entries = [order_entry("a", 1), order_entry("b", 1), order_entry("a", 2)]
    schedule = ChunkSchedule(entries, [range(0, 1), range(1, 2), range(2, 3)])
    assert schedule.ready(1) == [0]
    schedule.settle(0, failed_at=0)
    assert schedule.ready(10) == []  # b's chunk lies after the failure, a's second waits on it
    assert schedule.first_unpublished() == 0


def test_after_a_failure_no_chunk_holding_an_entry_past_it_is_sent():
    """Packed chunks need not be runs: one starting before the failure may hold entries after it. It is
    not sent, so nothing more goes past the checkpoint (what it holds before the failure waits too)."""
    entries = [order_entry("a", 1), order_entry("b", 1), order_entry("c", 1), order_entry("d", 1)]
    schedule = ChunkSchedule(entries, [(1,), (0, 3), (2,)])
    assert schedule.ready(1) == [0]
    schedule.settle(0, failed_at=1)
    assert schedule.ready(10) == []
    assert schedule.first_unpublished() == 0


# --- the publisher, calls in flight ---------------------------------------------------------------------
def test_chunks_of_different_orders_overlap_and_one_orders_events_never_do(slow_bus):
    slow_bus.append(SlowBus(latency=0.02))
    entries = interleaved(orders=40, events_per_order=5)

    result = publisher(8).publish_in_order(entries)

    bus = slow_bus[-1]
    assert result.first_unpublished is None
    assert result.calls == bus.calls == len(ordered_chunks(entries, 262_144)) == 20
    assert bus.most_in_flight > 1
    assert bus.overlapping_orders == []
    assert all(sequences == [1, 2, 3, 4, 5] for sequences in bus.sequences().values())


def test_a_chunk_there_is_no_time_left_for_is_left_unsent_and_the_checkpoint_is_its_first_entry(slow_bus):
    """a's second event waits for the call holding its first, which takes 1.5 s of a 9 s invocation: then
    a call (7 s at worst, and a second to answer) could outlast the invocation, so it is not begun. It was
    begun whatever the time left, and the relay ran past Lambda's timeout (a review's measurement)."""
    slow_bus.append(SlowBus(latency=0.0))
    entries = [order_entry("a", 1), order_entry("b", 1), order_entry("a", 2), order_entry("c", 1)]
    assert ordered_chunks(entries, 262_144) == [(0, 1, 3), (2,)]

    result = publisher(8).publish_in_order(entries, lambda: 9.0 - 1.5 * slow_bus[-1].calls)

    assert slow_bus[-1].calls == 1
    assert sorted(result.accepted_positions) == [0, 1, 3]
    assert (result.first_unpublished, result.first_failed, result.out_of_time) == (2, None, True)
    assert result.failures_by_code == {}  # nothing failed: the rest waits for the next invocation


def assert_prefixes_and_an_exact_checkpoint(
    bus: SlowBus, entries: list[OutboxEntry], stuck: OutboxEntry, result: PublishResult
) -> int:
    """No order in two calls at once; every order's events on the bus are its first ones, in sequence, and
    never past the stuck event; everything before the checkpoint is on the bus, the entry at it is not.
    Returns the checkpoint."""
    assert bus.overlapping_orders == []
    for order, sequences in bus.sequences().items():
        assert sequences == list(range(1, len(sequences) + 1)), order
    assert max(bus.sequences().get(stuck.aggregate, [0])) < stuck.sequence
    checkpoint = result.first_unpublished
    assert checkpoint is not None
    on_bus = set(bus.accepted)
    assert all((e.aggregate, e.sequence) in on_bus for e in entries[:checkpoint])
    assert (entries[checkpoint].aggregate, entries[checkpoint].sequence) not in on_bus
    return checkpoint


@pytest.mark.parametrize("seed", range(5))
def test_failures_inside_overlapping_chunks_leave_each_order_a_prefix_and_the_checkpoint_at_the_first_gap(
    slow_bus, seed
):
    rng = random.Random(seed)
    entries = interleaved(orders=30, events_per_order=4)
    stuck = rng.choice(entries[30:])  # some order's later event fails for good
    slow_bus.append(SlowBus(latency=0.005, fail={stuck.event_id}, throttle=0.15))

    result = publisher(6).publish_in_order(entries)

    checkpoint = assert_prefixes_and_an_exact_checkpoint(slow_bus[-1], entries, stuck, result)
    assert checkpoint <= entries.index(stuck)


def stream_shaped(orders: int, events_per_order: int, gap: int) -> list[OutboxEntry]:
    """A stream batch's shape: order n's k-th event `gap` records after its previous one, so that entries
    cannot go in position order into full calls and chunks are packed (ordered_chunks)."""
    timed = [(o + gap * (s - 1), o, s) for o in range(orders) for s in range(1, events_per_order + 1)]
    return [order_entry(f"o{o:03d}", s) for _, o, s in sorted(timed)]


@pytest.mark.parametrize("seed", range(5))
def test_failures_inside_packed_chunks_keep_the_checkpoint_exact_and_name_the_entry_that_failed(
    slow_bus, seed
):
    rng = random.Random(seed)
    entries = stream_shaped(orders=30, events_per_order=3, gap=4)
    chunks = ordered_chunks(entries, 262_144)
    assert [len(chunk) for chunk in chunks] == [10] * 9  # 90 entries, every call full
    assert any(list(chunk) != list(range(chunk[0], chunk[0] + len(chunk))) for chunk in chunks)  # packed
    stuck = rng.choice(entries[10:])
    slow_bus.append(SlowBus(latency=0.005, fail={stuck.event_id}))  # it alone fails

    result = publisher(4).publish_in_order(entries)

    checkpoint = assert_prefixes_and_an_exact_checkpoint(slow_bus[-1], entries, stuck, result)
    assert result.first_failed == entries.index(stuck)  # the entry recorded as failed is the one that did
    assert checkpoint <= result.first_failed


class RejectingBus:
    """PutEvents refusing some entries for what they are (MalformedDetail) and failing others for good
    (AccessDeniedException); a call holding a refused entry answers once the failing call has."""

    def __init__(self, refused: str, failing: str) -> None:
        self.refused, self.failing = refused, failing
        self.failed = threading.Event()
        self.accepted: list[str] = []

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [json.loads(e["Detail"])["id"] for e in Entries]
        if self.refused in ids:
            self.failed.wait(5)
            time.sleep(0.2)  # the publisher has taken the failure in
        results = []
        for event_id in ids:
            if event_id == self.failing:
                results.append({"ErrorCode": "AccessDeniedException", "ErrorMessage": "injected"})
            elif event_id == self.refused:
                results.append({"ErrorCode": "MalformedDetail", "ErrorMessage": "injected"})
            else:
                self.accepted.append(event_id)
                results.append({"EventId": event_id})
        if self.failing in ids:
            self.failed.set()
        return {"FailedEntryCount": sum("ErrorCode" in r for r in results), "Entries": results}


def test_an_entry_refused_past_a_failure_holds_its_orders_later_events_back(slow_bus):
    """e's first event is refused after a's failed: it lies past the checkpoint, so it is not parked now,
    and e's second event (packed into a call that starts before the failure) must not reach the bus
    while e's first is neither on the bus nor parked."""
    names = "bcdaeeca"  # positions: 3 is a's first (fails), 4 e's first (refused), 5 e's second
    seen: dict[str, int] = {}
    entries = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        entries.append(order_entry(name, seen[name])._replace(size=100))
    assert ordered_chunks(entries, 200) == [(1, 3), (0, 4), (2, 5), (6, 7)]
    bus = RejectingBus(refused=entries[4].event_id, failing=entries[3].event_id)
    slow_bus.append(bus)
    parked: list[int] = []

    def park(position: int, code: str, message: str) -> bool:
        parked.append(position)
        return True

    result = EventPublisher("orders-bus", 200, max_in_flight=8, sleep=lambda _: None).publish_in_order(
        entries, lambda: 60.0, park
    )

    assert entries[5].event_id not in bus.accepted
    assert parked == []  # past the checkpoint: it comes again
    assert result.first_unpublished == 2
    assert result.first_failed == 3
