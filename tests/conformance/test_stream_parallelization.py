"""ParallelizationFactor on a DynamoDB stream mapping, as AWS documents it.

AWS Lambda developer guide, "Using AWS Lambda with Amazon DynamoDB"
(https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html), on concurrent batches per shard: with a
ParallelizationFactor, Lambda processes up to that many batches (at most 10) from each shard at once,
and still processes each item's records (partition and sort key) in order; records of different items
may be processed out of order. At the default factor of 1, a shard is processed one batch at a time,
in stream order.

The probe mapping ProbeStreamFunction.ParallelStream (tests/integration/probe/fragment.yaml) reads
ProbeParallelTable (partition and sort key) with ParallelizationFactor 2 and BatchSize 2;
ProbeStreamFunction.Stream reads ProbeTable with the default factor 1. Each DynamoDB Local table stream
used here has one shard.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from tools.local.console.activity import Invocation
from tools.local.pollers.stream_records import item_lane
from tools.local.stack import LocalStack

WITH_DDB = "https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html"
FUNCTION = "ProbeStreamFunction"
STREAM_SECONDS = 30
# An invocation's span is measured by the poller (wall clock at its end, monotonic duration): allow
# for the two clocks drifting apart within a test.
CLOCK_SLACK_SECONDS = 0.01

Key = tuple[str, ...]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def items_across_lanes(partition: str, per_lane: int, lanes: int = 2) -> list[Key]:
    """Items of one partition, `per_lane` in each lane of the local emulation.

    AWS does not document how it spreads a shard's items over its concurrent batches; the local
    emulation hashes the item key (local.pollers.stream_records.item_lane), and the items are chosen so that
    every concurrent batch has some.
    """
    chosen: dict[int, list[Key]] = {lane: [] for lane in range(lanes)}
    for n in itertools.count():
        sort_key = f"item-{n}"
        lane = item_lane({"dynamodb": {"Keys": {"PK": {"S": partition}, "SK": {"S": sort_key}}}}, lanes)
        if len(chosen[lane]) < per_lane:
            chosen[lane].append((partition, sort_key))
        if all(len(keys) == per_lane for keys in chosen.values()):
            return [key for keys in chosen.values() for key in keys]
    raise AssertionError("unreachable")


def item(key: Key, version: int, action: str = "ok", seconds: float = 0.0) -> dict[str, Any]:
    attributes: dict[str, Any] = {"PK": {"S": key[0]}, "version": {"N": str(version)}}
    if len(key) > 1:
        attributes["SK"] = {"S": key[1]}
    attributes.update(action={"S": action}, kind={"S": "probe"}, seconds={"N": str(seconds)})
    return attributes


def record_key(record: dict[str, Any]) -> Key:
    keys = record["dynamodb"]["Keys"]
    return tuple(keys[name]["S"] for name in ("PK", "SK") if name in keys)


def deliveries(stack: LocalStack, table: str, keys: set[Key]) -> list[tuple[Invocation, dict[str, Any]]]:
    """(invocation, record) for every delivered record of these items, in the order they were delivered."""
    return [
        (invocation, record)
        for invocation in stack.activity.invocations(FUNCTION)
        if invocation.source == table
        for record in invocation.records
        if record_key(record) in keys
    ]


def invocations_of(pairs: list[tuple[Invocation, dict[str, Any]]]) -> list[Invocation]:
    """The distinct invocations of (invocation, record) pairs, in delivery order."""
    seen: dict[int, Invocation] = {}
    for invocation, _ in pairs:
        seen.setdefault(id(invocation), invocation)
    return list(seen.values())


def span(invocation: Invocation) -> tuple[float, float]:
    """When the invocation ran: from its start to its end (wall clock)."""
    return invocation.at - invocation.result.duration_ms / 1000, invocation.at


def overlap(first: Invocation, second: Invocation) -> bool:
    (start_a, end_a), (start_b, end_b) = span(first), span(second)
    return start_a < end_b - CLOCK_SLACK_SECONDS and start_b < end_a - CLOCK_SLACK_SECONDS


def most_at_once(invocations: list[Invocation]) -> int:
    """The most of these invocations that were running at one moment."""
    starts = [span(invocation)[0] for invocation in invocations]
    return max(sum(1 for other in invocations if span(other)[0] <= t < span(other)[1]) for t in starts)


def version(record: dict[str, Any]) -> int:
    return int(record["dynamodb"]["NewImage"]["version"]["N"])


def versions(pairs: list[tuple[Invocation, dict[str, Any]]]) -> list[int]:
    return [version(record) for _, record in pairs]


def sequence_numbers(pairs: list[tuple[Invocation, dict[str, Any]]]) -> list[int]:
    return [int(record["dynamodb"]["SequenceNumber"]) for _, record in pairs]


def write_together(stack: LocalStack, table: str, items: list[dict[str, Any]]) -> None:
    """One transaction, so the records are read from the stream in one GetRecords call."""
    name = stack.template.physical_name(table)
    stack.clients.dynamodb().transact_write_items(
        TransactItems=[{"Put": {"TableName": name, "Item": attributes}} for attributes in items]
    )


def write_one_by_one(stack: LocalStack, table: str, items: list[dict[str, Any]]) -> None:
    """One write each, in this order: the order of their records in the stream."""
    name = stack.template.physical_name(table)
    for attributes in items:
        stack.clients.dynamodb().put_item(TableName=name, Item=attributes)


def wait_for_versions(stack: LocalStack, table: str, keys: set[Key], last: int) -> None:
    def every_item_done() -> bool:
        done = {record_key(r) for _, r in deliveries(stack, table, keys) if version(r) == last}
        return done == keys

    stack.wait_for(every_item_done, STREAM_SECONDS, f"version {last} of {len(keys)} item(s) delivered")


# --- ParallelizationFactor 2 -------------------------------------------------------------------------
def test_at_factor_2_two_batches_of_one_shard_run_at_the_same_time(probe_stack: LocalStack) -> None:
    """Two batches of one shard are processed concurrently, and never more than the factor.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html): Lambda can process up to 10
    batches in each shard simultaneously; ParallelizationFactor is the number of concurrent batches
    per shard. Here 2, with items of one partition: the items are different, so their batches may run
    at the same time.
    """
    keys = items_across_lanes(unique("concurrent"), per_lane=2)
    # Each batch (2 records) takes about 1 s, so batches running one after the other could not overlap.
    write_together(probe_stack, "ProbeParallelTable", [item(key, 1, "sleep", 0.5) for key in keys])

    wait_for_versions(probe_stack, "ProbeParallelTable", set(keys), last=1)

    invocations = invocations_of(deliveries(probe_stack, "ProbeParallelTable", set(keys)))
    assert len(invocations) >= 2
    assert any(overlap(a, b) for a, b in itertools.combinations(invocations, 2)), [
        span(i) for i in invocations
    ]
    assert most_at_once(invocations) == 2, "at most ParallelizationFactor batches of a shard at once"


def test_at_factor_2_each_items_records_arrive_in_stream_order(probe_stack: LocalStack) -> None:
    """Every item's records are delivered in stream order, one batch at a time, while batches run at once.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html): with more concurrent batches per
    shard, Lambda still ensures in-order processing at the item level (partition and sort key). Four
    items of one partition, four versions each, written one after the other in a varying order; batches
    of 2 records. The first versions are slow to process, so a later version handled by another batch
    running at the same time would overtake them.
    """
    keys = items_across_lanes(unique("ordered"), per_lane=2)
    writes = []
    for number in range(1, 5):
        rotated = keys[number % len(keys) :] + keys[: number % len(keys)]
        writes += [item(key, number, "sleep", 0.4) if number == 1 else item(key, number) for key in rotated]
    write_one_by_one(probe_stack, "ProbeParallelTable", writes)

    wait_for_versions(probe_stack, "ProbeParallelTable", set(keys), last=4)

    everything = deliveries(probe_stack, "ProbeParallelTable", set(keys))
    for key in keys:
        own = [(invocation, record) for invocation, record in everything if record_key(record) == key]
        assert versions(own) == [1, 2, 3, 4], f"{key}: its records in the order they were written"
        numbers = sequence_numbers(own)
        assert numbers == sorted(numbers), f"{key}: its records in stream order"
        batches = invocations_of(own)
        assert not any(overlap(a, b) for a, b in itertools.combinations(batches, 2)), (
            f"{key}: one batch of its records at a time"
        )
    batches = invocations_of(everything)
    assert any(overlap(a, b) for a, b in itertools.combinations(batches, 2)), (
        "batches of different items of the partition ran at the same time"
    )


# --- ParallelizationFactor 1 (the default) -----------------------------------------------------------
def test_at_factor_1_a_shards_records_arrive_in_stream_order_one_batch_at_a_time(
    probe_stack: LocalStack,
) -> None:
    """The shard's records are delivered strictly in stream order, across items, one batch at a time.

    AWS (https://docs.aws.amazon.com/lambda/latest/dg/with-ddb.html): concurrent batches per shard
    come from raising the parallelization factor, whose default is 1
    (https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-params.html): one batch of a shard at a
    time, the shard processed in order. ProbeTable's mapping (BatchSize 10): twelve records of four
    items, so at least two batches, each taking a while.
    """
    run = unique("serial")
    keys = [(f"{run}-{n}",) for n in range(4)]
    writes = [item(key, version, "sleep", 0.05) for version in range(1, 4) for key in keys]
    write_one_by_one(probe_stack, "ProbeTable", writes)

    wait_for_versions(probe_stack, "ProbeTable", set(keys), last=3)

    everything = deliveries(probe_stack, "ProbeTable", set(keys))
    assert [(record_key(record), version(record)) for _, record in everything] == [
        (key, number) for number in range(1, 4) for key in keys
    ], "every record, once, in the order written"
    numbers = sequence_numbers(everything)
    assert numbers == sorted(numbers), "the shard's records in stream order"
    batches = invocations_of(everything)
    assert len(batches) >= 2
    for earlier, later in itertools.pairwise(batches):
        assert span(earlier)[1] <= span(later)[0] + CLOCK_SLACK_SECONDS, "one batch of the shard at a time"
    assert not any(overlap(a, b) for a, b in itertools.combinations(batches, 2))
