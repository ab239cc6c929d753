"""The state a DynamoDB stream event source mapping keeps per shard: its lanes and their pending records.

A shard has one lane, or N at ParallelizationFactor N > 1 (stream_records.item_lane picks an item's
lane). Each lane is one in-order sequence of batches: its shard iterator and read position, the records
read and not yet finished, the sizes planned while a failing batch is bisected, the retries and throttles
of the batch at its head and the last failure (what an OnFailure document describes). Only the poller's
thread (stream_poller.py) changes a lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.local.runtime.functions import InvocationResult


@dataclass
class Pending:
    record: dict[str, Any]
    sequence_number: str
    created_at: float  # ApproximateCreationDateTime (DynamoDB Local rounds it down to the minute)
    arrived_at: float  # when it arrived in the stream (arrival_time): the basis of its age
    seen_monotonic: float


@dataclass(frozen=True)
class Failure:
    """The last failed invocation of the batch at a lane's head: the OnFailure document describes it."""

    result: InvocationResult
    function_error: bool


@dataclass
class Lane:
    """One in-order sequence of batches over a shard: a shard iterator, a checkpoint and a batch loop.

    At ParallelizationFactor 1 a shard's only lane takes every record; at N > 1 lane `index` takes the
    records whose item_lane is `index` and skips the others (their lanes deliver them).
    """

    shard_id: str
    index: int = 0
    iterator: str | None = None
    closed: bool = False
    pending: list[Pending] = field(default_factory=list)
    # Sizes of the next batches while a failing batch is being bisected.
    planned: list[int] = field(default_factory=list)
    attempts: int = 0  # retries of the batch at the head: failed invocations, bisection excluded
    throttles: int = 0  # invocations of the batch at the head throttled in a row (never counted as retries)
    last_failure: Failure | None = None
    retry_at: float = 0.0
    next_fetch_at: float = 0.0
    last_sequence: str | None = None
    skipping: bool = False  # reading up to the current end without invoking (StartingPosition LATEST)
    in_flight: bool = False  # its batch is being invoked in a thread of its own (ParallelizationFactor > 1)

    @property
    def finished(self) -> bool:
        return self.closed and not self.pending


@dataclass
class Shard:
    shard_id: str
    parent_id: str | None
    lanes: list[Lane]

    @property
    def finished(self) -> bool:
        return all(lane.finished for lane in self.lanes)
