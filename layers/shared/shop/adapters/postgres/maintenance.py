"""Keeping the order database small, and saying how its outbox is doing.

Rows leave in bounded batches (one short transaction each, so maintenance never holds locks the
writers or the publisher wait on for long):
- outbox rows published or parked longer ago than the republish window (OutboxTtlDays: as long as
  the DynamoDB outbox items live, so replay works the same on both stores);
- inbox rows older than the consumers' redelivery window (the same window as Powertools' idempotency
  records: runtime.config.Settings.idempotency_expires_after_seconds);
- request keys past their expiry.
Pending rows are never deleted, however old.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

_DELETE_OUTBOX = """
DELETE FROM outbox WHERE position IN (
    SELECT position FROM outbox
    WHERE coalesce(published_at, parked_at) < clock_timestamp() - make_interval(secs => %s)
    LIMIT %s)
"""
_DELETE_INBOX = """
DELETE FROM inbox WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM inbox
    WHERE processed_at < clock_timestamp() - make_interval(secs => %s)
    LIMIT %s)
"""
_DELETE_REQUEST_KEYS = """
DELETE FROM request_keys WHERE (caller, idempotency_key) IN (
    SELECT caller, idempotency_key FROM request_keys WHERE expires_at < clock_timestamp() LIMIT %s)
"""
# Each part reads an index or the catalogue, never the whole table: the outbox holds weeks of rows.
_HEALTH = """
SELECT
    (SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL),
    (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)
        FROM outbox WHERE published_at IS NULL AND parked_at IS NULL),
    (SELECT count(*) FROM outbox WHERE parked_at IS NOT NULL),
    (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'outbox'::regclass)
"""


@dataclass(frozen=True, slots=True)
class OutboxHealth:
    pending: int
    oldest_pending_seconds: float
    parked: int
    rows: int  # the planner's estimate (pg_class.reltuples), refreshed by autovacuum


def delete_published_outbox_rows(cursor: psycopg.Cursor[Any], older_than_seconds: int, limit: int) -> int:
    cursor.execute(_DELETE_OUTBOX, (older_than_seconds, limit))
    return cursor.rowcount


def delete_inbox_rows(cursor: psycopg.Cursor[Any], older_than_seconds: int, limit: int) -> int:
    cursor.execute(_DELETE_INBOX, (older_than_seconds, limit))
    return cursor.rowcount


def delete_expired_request_keys(cursor: psycopg.Cursor[Any], limit: int) -> int:
    cursor.execute(_DELETE_REQUEST_KEYS, (limit,))
    return cursor.rowcount


def outbox_health(cursor: psycopg.Cursor[Any]) -> OutboxHealth:
    cursor.execute(_HEALTH)
    found = cursor.fetchone()
    assert found is not None  # an aggregate query always answers one row
    pending, oldest, parked, rows = found
    return OutboxHealth(int(pending), float(oldest), int(parked), int(rows))
