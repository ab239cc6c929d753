"""Key design of every table. The only module that builds PK/SK and index key strings.

OrdersTable (one item collection per order):
    order            PK=ORDER#<orderId>          SK=ORDER
    its outbox items PK=ORDER#<orderId>          SK=OUTBOX#<sequence:012d>#<eventId>
    request key      PK=REQUEST#<callerScope>#<idempotencyKey>  SK=REQUEST   (API Idempotency-Key records)
                     callerScope = first 32 hex digits of sha256(caller): a key is scoped to its caller
                     (the IAM principal), so two callers never share a record; hashing keeps ARNs out
                     of keys and bounds the length (8 + 32 + 1 + at most 255 characters)

InventoryTable:
    stock of a SKU   PK=SKU#<sku>                SK=STOCK
    reservation      PK=RESERVATION#<orderId>    SK=RESERVATION
    its outbox items PK=RESERVATION#<orderId>    SK=OUTBOX#<sequence:012d>#<eventId>

Outbox items of any table also carry the sparse time index used by replay:
    outboxBucket = <yyyymmddHH>#<shard>   (write-sharded hourly bucket, no hot partition;
                   shard = crc32(eventId) % shards, so an event's shard is known from its id alone)
    outboxTime   = <RFC 3339 time, milliseconds, Z>   (index sort keys need not be unique: no id suffix,
                   37 bytes fewer per outbox item; items written with the former `#<eventId>` suffix
                   still fall inside outbox_time_bounds)

An outbox item's event id is the end of its sort key (outbox_event_id), its aggregate (the order) the
end of its partition key (outbox_aggregate_id). Replay of one event finds it in OutboxByTime, whose
KEYS_ONLY entries hold the table key too: the hourly buckets of the id's one shard, newest first, each
read for the sort key that ends with `#<eventId>` (outbox_time_shard, outbox_shard_buckets,
outbox_sort_key_suffix). There is no index by event id: it cost 2 write units per outbox item inside a
transaction (docs/performance.md, "Write cost").
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

Key = dict[str, dict[str, str]]

PK = "PK"
SK = "SK"
OUTBOX_SK_PREFIX = "OUTBOX#"
OUTBOX_TIME_INDEX = "OutboxByTime"
OUTBOX_BUCKET = "outboxBucket"
OUTBOX_TIME = "outboxTime"

# A Put's condition that no item holds its key yet (DynamoDB evaluates it against the item with that key).
KEY_NOT_TAKEN = f"attribute_not_exists({PK})"

_ORDER = "ORDER#"
_REQUEST = "REQUEST#"
_SKU = "SKU#"
_RESERVATION = "RESERVATION#"


def _key(pk: str, sk: str) -> Key:
    return {PK: {"S": pk}, SK: {"S": sk}}


# --- OrdersTable -------------------------------------------------------------------------------------
def order_partition(order_id: str) -> str:
    return f"{_ORDER}{order_id}"


def order_key(order_id: str) -> Key:
    return _key(order_partition(order_id), "ORDER")


def caller_scope(caller: str) -> str:
    """Fixed-length digest of a caller identity (an IAM principal ARN), as used in request keys."""
    return hashlib.sha256(caller.encode()).hexdigest()[:32]


def request_key(caller: str, idempotency_key: str) -> Key:
    # The scope has a fixed length and ends at the first '#': no two (caller, key) pairs share a PK.
    return _key(f"{_REQUEST}{caller_scope(caller)}#{idempotency_key}", "REQUEST")


# --- InventoryTable ----------------------------------------------------------------------------------
def stock_key(sku: str) -> Key:
    return _key(f"{_SKU}{sku}", "STOCK")


def reservation_partition(order_id: str) -> str:
    return f"{_RESERVATION}{order_id}"


def reservation_key(order_id: str) -> Key:
    return _key(reservation_partition(order_id), "RESERVATION")


# --- Outbox items (any table) ------------------------------------------------------------------------
def outbox_key(partition: str, sequence: int, event_id: str) -> Key:
    # Zero-padded so that an aggregate's outbox items sort by sequence within its collection.
    return _key(partition, f"{OUTBOX_SK_PREFIX}{sequence:012d}#{event_id}")


def item_key(item: dict[str, Any]) -> dict[str, Any]:
    """The key of an item (attribute-value form), as GetItem takes it."""
    return {name: item.get(name) for name in (PK, SK)}


def is_outbox_sort_key(sort_key: str) -> bool:
    return sort_key.startswith(OUTBOX_SK_PREFIX)


def outbox_event_id(sort_key: str) -> str | None:
    """The event id an outbox item's sort key ends with (OUTBOX#<sequence>#<eventId>); None when the
    sort key is not one an outbox writer builds."""
    prefix, _, rest = sort_key.partition(OUTBOX_SK_PREFIX)
    sequence, separator, event_id = rest.partition("#")
    if prefix or not separator or not sequence.isdigit() or not event_id:
        return None
    return event_id


def outbox_aggregate_id(partition: str) -> str | None:
    """The order an outbox item's partition key names (ORDER#<orderId> or RESERVATION#<orderId>), which
    is its events' subject; None for any other partition."""
    for prefix in (_ORDER, _RESERVATION):
        if partition.startswith(prefix) and len(partition) > len(prefix):
            return partition.removeprefix(prefix)
    return None


def outbox_sort_key_suffix(event_id: str) -> str:
    """What the sort key of the outbox item of `event_id` ends with (it starts with its sequence)."""
    return f"#{event_id}"


def _hour(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%d%H")


def outbox_time_shard(event_id: str, shards: int) -> int:
    """The OutboxByTime shard of an event's outbox item: a function of its id alone."""
    return zlib.crc32(event_id.encode()) % shards


def outbox_time_attributes(occurred_at: datetime, event_id: str, shards: int) -> dict[str, dict[str, str]]:
    shard = outbox_time_shard(event_id, shards)
    stamp = occurred_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {
        OUTBOX_BUCKET: {"S": f"{_hour(occurred_at)}#{shard}"},
        OUTBOX_TIME: {"S": stamp},
    }


def outbox_time_bounds(start: datetime, end: datetime) -> tuple[str, str]:
    """outboxTime range covering [start, end] (an older item's `#<eventId>` suffix sorts below the
    upper bound's \uffff, so both forms of outboxTime are found)."""
    fmt = "%Y-%m-%dT%H:%M:%S.%f"
    return (
        start.astimezone(UTC).strftime(fmt)[:-3] + "Z",
        end.astimezone(UTC).strftime(fmt)[:-3] + "Z\uffff",
    )


def outbox_buckets(start: datetime, end: datetime, shards: int) -> Iterator[str]:
    """Every bucket that can hold an outbox item written between start and end."""
    hour = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    while hour <= end:
        for shard in range(shards):
            yield f"{_hour(hour)}#{shard}"
        hour += timedelta(hours=1)


def outbox_shard_buckets(shard: int, oldest: datetime, newest: datetime) -> Iterator[str]:
    """The buckets of one shard that can hold an outbox item written between oldest and newest, one an
    hour, newest hour first: where the item of an event whose shard is `shard` (outbox_time_shard) can be
    (an event replayed by id is most often a recent one)."""
    first = oldest.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    hour = newest.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    while hour >= first:
        yield f"{_hour(hour)}#{shard}"
        hour -= timedelta(hours=1)
