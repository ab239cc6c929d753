"""When a stream mapping reads its shard (pollers/stream_poller.py): every poll interval, and at once only
after an invocation of a function that may write its table (a read after any other finds nothing new)."""

from __future__ import annotations

import time
from typing import Any, cast

import boto3
import pytest

from tools.local.console.activity import ActivityLog, Invocation
from tools.local.pollers.destinations import FailureDestinations
from tools.local.pollers.event_sources import StreamSource
from tools.local.pollers.stream_lanes import Lane, Shard
from tools.local.pollers.stream_poller import POLL_INTERVAL_SECONDS, StreamPoller
from tools.local.runtime.functions import FunctionRuntime, InvocationResult
from tools.local.services.emulators import FAKE_CREDENTIALS

NOT_DUE = float("inf")


class Reads:
    """GetRecords answers: `count` records each time."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.calls = 0

    def get_records(self, iterator: str) -> tuple[list[dict[str, Any]], str | None]:
        self.calls += 1
        records = [
            {
                "eventName": "INSERT",
                "dynamodb": {"Keys": {"PK": {"S": f"k{i}"}}, "SequenceNumber": f"{i:021d}"},
            }
            for i in range(self.count)
        ]
        return records, iterator

    def close(self) -> None:
        pass


@pytest.fixture
def activity() -> ActivityLog:
    return ActivityLog()


@pytest.fixture
def lane() -> Lane:
    return Lane(shard_id="shardId-1", iterator="iterator", next_fetch_at=NOT_DUE)


@pytest.fixture
def poller(activity: ActivityLog, lane: Lane) -> StreamPoller:
    streams = boto3.client(
        "dynamodbstreams",
        endpoint_url="http://127.0.0.1:9",  # never called: reads go through the poller's reader
        region_name="us-east-1",
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    poller = StreamPoller(
        StreamSource(function="Relay", name="Outbox", table="Table"),
        cast(FunctionRuntime, None),  # nothing is invoked here
        "arn:aws:dynamodb:ddblocal:000000000000:table/t/stream/x",
        streams,
        cast(FailureDestinations, None),
        activity,
        woken_by=frozenset({"Writer"}),
    )
    poller._shards[lane.shard_id] = Shard(lane.shard_id, None, [lane])
    return poller


def ended(function: str) -> Invocation:
    return Invocation(function, "direct", "invoke", {}, InvocationResult(request_id="r"))


def test_an_invocation_of_a_function_that_cannot_write_the_table_starts_no_read(
    poller: StreamPoller, activity: ActivityLog, lane: Lane
) -> None:
    activity.add(ended("Reader"))

    poller._idle()  # the poll interval passes: nothing woke it

    assert lane.next_fetch_at == NOT_DUE


def test_an_invocation_of_a_writer_makes_a_read_due_at_once(
    poller: StreamPoller, activity: ActivityLog, lane: Lane
) -> None:
    activity.add(ended("Writer"))
    began = time.monotonic()

    poller._idle()

    assert lane.next_fetch_at == 0.0
    assert time.monotonic() - began < POLL_INTERVAL_SECONDS


def test_a_batch_of_its_own_that_returned_is_settled_without_a_read(poller: StreamPoller, lane: Lane) -> None:
    poller._returned.put((lane, [], None))
    poller._wake.set()  # as the batch's thread does
    began = time.monotonic()

    poller._idle()

    assert time.monotonic() - began < POLL_INTERVAL_SECONDS  # woken, to settle it
    assert lane.next_fetch_at == NOT_DUE
    assert poller._settle_returned()


@pytest.mark.parametrize(("returned", "again_at_once"), [(0, False), (3, False), (1000, True)])
def test_a_read_is_repeated_at_once_only_when_it_stopped_at_the_record_limit(
    poller: StreamPoller, lane: Lane, returned: int, again_at_once: bool
) -> None:
    poller._reader = cast(Any, Reads(returned))
    before = time.monotonic()

    poller._fetch(lane)

    assert len(lane.pending) == returned
    if again_at_once:
        assert lane.next_fetch_at <= time.monotonic()
    else:
        assert lane.next_fetch_at >= before + POLL_INTERVAL_SECONDS
