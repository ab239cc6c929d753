"""The outbox items of the DynamoDB outbox tables (the orders' and the inventory's), found through their
OutboxByTime index (replay and redrive: operations/recovery.py): every item written in a window, or the
items of given event ids.

There is no index by event id (docs/performance.md, "Write cost"): an event's shard of OutboxByTime is
known from its id (keys.outbox_time_shard), and the index's KEYS_ONLY entries hold the table key, whose
sort key ends with the event id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shop.adapters import aws
from shop.adapters.dynamodb import keys

_IDS_PER_QUERY = 50


def keys_written_between(
    table: str, start: datetime, end: datetime, time_shards: int
) -> list[dict[str, Any]]:
    """The table keys of every outbox item written between start and end: each hour's bucket of each
    shard, every page."""
    low, high = keys.outbox_time_bounds(start, end)
    item_keys: list[dict[str, Any]] = []
    paginator = aws.dynamodb().get_paginator("query")
    for bucket in keys.outbox_buckets(start, end, time_shards):
        for page in paginator.paginate(
            TableName=table,
            IndexName=keys.OUTBOX_TIME_INDEX,
            KeyConditionExpression="#b = :b AND #t BETWEEN :low AND :high",
            ExpressionAttributeNames={"#b": keys.OUTBOX_BUCKET, "#t": keys.OUTBOX_TIME},
            ExpressionAttributeValues={":b": {"S": bucket}, ":low": {"S": low}, ":high": {"S": high}},
        ):
            item_keys.extend({keys.PK: i[keys.PK], keys.SK: i[keys.SK]} for i in page.get("Items", []))
    return item_keys


def find_outbox_items(
    table: str, event_ids: Sequence[str], oldest: datetime, newest: datetime, time_shards: int
) -> dict[str, dict[str, Any]]:
    """The key of the outbox item of each of these events found in `table`, written between oldest
    and newest. There is no index by event id (docs/performance.md, "Write cost"): an event's shard
    of OutboxByTime is known from its id (keys.outbox_time_shard), and the index's KEYS_ONLY entries
    hold the table key, whose sort key ends with the event id. So each shard's hourly buckets are
    queried newest first, every page read (a filtered page may be empty and still not the last),
    filtered on the sort key, until every id of that shard is found or the window is exhausted."""
    by_shard: dict[int, list[str]] = defaultdict(list)
    for event_id in dict.fromkeys(event_ids):
        by_shard[keys.outbox_time_shard(event_id, time_shards)].append(event_id)
    low, high = keys.outbox_time_bounds(oldest, newest)
    found: dict[str, dict[str, Any]] = {}
    paginator = aws.dynamodb().get_paginator("query")
    for shard, ids in sorted(by_shard.items()):
        for bucket in keys.outbox_shard_buckets(shard, oldest, newest):
            pending = [event_id for event_id in ids if event_id not in found]
            if not pending:
                break
            for start in range(0, len(pending), _IDS_PER_QUERY):
                chunk = pending[start : start + _IDS_PER_QUERY]
                suffixes = {f":e{n}": {"S": keys.outbox_sort_key_suffix(e)} for n, e in enumerate(chunk)}
                for page in paginator.paginate(
                    TableName=table,
                    IndexName=keys.OUTBOX_TIME_INDEX,
                    KeyConditionExpression="#b = :b AND #t BETWEEN :low AND :high",
                    # contains() finds the suffix anywhere; the exact id is checked below
                    FilterExpression=" OR ".join(f"contains(#sk, {name})" for name in suffixes),
                    ExpressionAttributeNames={
                        "#b": keys.OUTBOX_BUCKET,
                        "#t": keys.OUTBOX_TIME,
                        "#sk": keys.SK,
                    },
                    ExpressionAttributeValues={
                        ":b": {"S": bucket},
                        ":low": {"S": low},
                        ":high": {"S": high},
                        **suffixes,
                    },
                    ScanIndexForward=False,
                ):
                    for entry in page.get("Items", []):
                        entry_id = keys.outbox_event_id(entry[keys.SK]["S"])
                        if entry_id is not None and entry_id in chunk and entry_id not in found:
                            found[entry_id] = {keys.PK: entry[keys.PK], keys.SK: entry[keys.SK]}
                    if all(wanted in found for wanted in chunk):
                        break  # the first hit ends the search for an id
    return found


@dataclass
class EventSearch:
    """Where replay by event id looked (its tables, the hours between oldest and newest) and what it found
    there: each event's table and the key of its outbox item."""

    tables: tuple[str, ...]
    oldest: datetime
    newest: datetime
    found: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)


def find_in_tables(
    tables: Sequence[str], event_ids: Sequence[str], oldest: datetime, newest: datetime, time_shards: int
) -> EventSearch:
    """Each event's outbox item in the first of `tables` that holds one (find_outbox_items), written
    between oldest and newest; a table is asked only for the events the tables before it lacked."""
    search = EventSearch(tuple(tables), oldest, newest)
    for table in search.tables:
        pending = [event_id for event_id in dict.fromkeys(event_ids) if event_id not in search.found]
        if not pending:
            break
        for event_id, key in find_outbox_items(table, pending, oldest, newest, time_shards).items():
            search.found[event_id] = (table, key)
    return search
