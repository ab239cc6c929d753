"""The stream relay's side of the relays at AWS latency (tools/bench/relay_latency.py): the orders table on
DynamoDB Local, its stream read as the relay's event source mapping reads it, and the relay function's
handler invoked on the records batch after batch.

The mapping is the template's (OutboxRelayFunction's on OrdersTable, read through tools.template by the
local stack's own reader, tools/local/pollers/event_sources.py): its BatchSize (the RelayBatchSize
parameter's default) and its FilterCriteria. Records are read with GetRecords from every shard from
TRIM_HORIZON, parents before children, and shaped as Lambda delivers them by the local stack's poller code
(tools/local/pollers/stream_records.py: the JSON GetRecords returned, `eventSourceARN`, `awsRegion`).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import boto3

from shop.adapters import aws
from tools.local.pollers.event_sources import StreamSource, read_event_sources
from tools.local.pollers.patterns import matches
from tools.local.pollers.stream_records import RawRecordsReader, lambda_stream_record
from tools.local.runtime.context import LambdaContext
from tools.template import Template

RELAY_FUNCTION = "OutboxRelayFunction"
OUTBOX_TABLE = "OrdersTable"
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The functions' output discarded while the block runs: Powertools' metrics print to the current
    sys.stdout, its logger writes to the one the process started with (file descriptor 1), so both go."""
    sys.stdout.flush()
    saved = os.dup(1)
    discard = os.open(os.devnull, os.O_WRONLY)
    os.dup2(discard, 1)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            # An invocation whose metrics an earlier flush took (as the test suite's configuration says).
            warnings.filterwarnings("ignore", "No application metrics to publish")
            yield
    finally:
        sys.stdout.flush()  # anything buffered for file descriptor 1 meanwhile: discarded too
        os.dup2(saved, 1)
        os.close(saved)
        os.close(discard)


def relay_mapping(template: Template) -> StreamSource:
    """The relay's event source mapping on the orders table, as the template declares it."""
    for source in read_event_sources(template).streams:
        if source.function == RELAY_FUNCTION and source.table == OUTBOX_TABLE:
            return source
    raise LookupError(f"{RELAY_FUNCTION} has no stream mapping on {OUTBOX_TABLE} in the template")


def parents_first(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's shards with each parent before its children (a child's records come after its parent's)."""
    by_id = {shard["ShardId"]: shard for shard in shards}
    ordered: list[dict[str, Any]] = []
    seen: set[str] = set()

    def visit(shard: dict[str, Any]) -> None:
        if shard["ShardId"] in seen:
            return
        seen.add(shard["ShardId"])
        parent = by_id.get(shard.get("ParentShardId", ""))
        if parent is not None:
            visit(parent)
        ordered.append(shard)

    for shard in shards:
        visit(shard)
    return ordered


class StreamRelay:
    """The orders table with its stream, and the relay's handler invoked as one shard's mapping does."""

    def __init__(self, template: Template) -> None:
        self.template = template
        self.table = template.physical_name(OUTBOX_TABLE)
        self.mapping = relay_mapping(template)
        self.batch_size = self.mapping.batch_size
        self.timeout_seconds = template.function(RELAY_FUNCTION).timeout

    def create_table(self) -> None:
        """The orders table as the template declares it (its stream included), created afresh."""
        dynamodb = aws.dynamodb()
        with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
            dynamodb.delete_table(TableName=self.table)
            dynamodb.get_waiter("table_not_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1})
        dynamodb.create_table(**self.template.create_table_kwargs(OUTBOX_TABLE))
        dynamodb.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1})

    def outbox_records(self) -> list[dict[str, Any]]:
        """Every record of the table's stream that the mapping's filter lets through, in stream order, as
        Lambda delivers them."""
        arn = aws.dynamodb().describe_table(TableName=self.table)["Table"]["LatestStreamArn"]
        streams = boto3.client("dynamodbstreams")  # AWS_ENDPOINT_URL_DYNAMODB_STREAMS: DynamoDB Local
        reader = RawRecordsReader(streams)
        shards: list[dict[str, Any]] = []
        params: dict[str, Any] = {"StreamArn": arn}
        while True:
            description = reader.describe_stream(params)
            shards += description.get("Shards", [])
            if not description.get("LastEvaluatedShardId"):
                break
            params["ExclusiveStartShardId"] = description["LastEvaluatedShardId"]
        records = []
        for shard in parents_first(shards):
            iterator: str | None = streams.get_shard_iterator(
                StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            while iterator:
                raw, iterator = reader.get_records(iterator)
                if not raw:  # DynamoDB Local returns what a shard holds; an empty read is its end
                    break
                records += [lambda_stream_record(record, arn) for record in raw]
        reader.close()
        filters = self.mapping.filters
        return [r for r in records if not filters or any(matches(pattern, r) for pattern in filters)]

    def invoke(self, handler: Handler, records: list[dict[str, Any]]) -> tuple[float, float, int]:
        """The records in batches of the mapping's size, one invocation after another (one shard, one
        batch at a time); every batch must succeed whole. Returns (handler seconds summed, the process's
        CPU seconds during the handler summed, invocations)."""
        seconds = cpu_seconds = 0.0
        invocations = 0
        for start in range(0, len(records), self.batch_size):
            event = {"Records": records[start : start + self.batch_size]}
            context = LambdaContext(
                function_name=self.template.physical_name(RELAY_FUNCTION),
                timeout_seconds=self.timeout_seconds,
            )
            with quiet():
                cpu_began = time.process_time()
                began = time.perf_counter()
                response = handler(event, context)
                seconds += time.perf_counter() - began
                cpu_seconds += time.process_time() - cpu_began
            invocations += 1
            if response != {"batchItemFailures": []}:
                raise AssertionError(f"the bus takes every entry, yet the relay answered {response}")
        return seconds, cpu_seconds, invocations
