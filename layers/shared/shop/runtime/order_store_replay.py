"""Replay for the PostgreSQL order store: make published outbox rows pending again, so the polling
publisher republishes them in per-order sequence, then wait until it has. With the logical relay, name
the rows in a replay message written to the log (pg_logical_emit_message): the relay publishes them
where the message sits, in commit order, and replay waits until the slot has moved past it.

The database lives in a private VPC, out of an operator's reach: `python -m operations replay` invokes
the maintenance function with {"replay": {...}} and prints what this returns. The same honesty rules as
the DynamoDB store's replay (operations/recovery.py): events past the republish window are left alone
unless includeExpired (consumers may no longer remember them), parked poison is named (redrive-poison
is its way back), ids not in the outbox are named, and `complete` is true only when every selected
event is on the bus again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import ReplaySelection, reset_for_replay
from shop.adapters.postgres.replication import confirmed_lsn, emit_replay, flush_lsn, slot_name
from shop.domain.envelope import now as utc_now
from shop.domain.envelope import parse_time
from shop.runtime.config import Settings

POLL_SECONDS = 0.5
RESERVE_SECONDS = 5.0


class ReplayRequestError(ValueError):
    """The request names no valid selection: nothing was changed."""


@dataclass
class ReplayReport:
    selection: ReplaySelection
    republished: int = 0
    still_pending: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        s = self.selection
        return not (s.expired or s.parked or s.missing or self.still_pending)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.selection),
            "republished": self.republished,
            "stillPending": self.still_pending,
            "messages": self.messages,
            "complete": self.complete,
        }


def _selection(request: dict[str, Any]) -> dict[str, Any]:
    event_ids, start, end = request.get("eventIds"), request.get("from"), request.get("to")
    if event_ids is not None:
        if start is not None or end is not None:
            raise ReplayRequestError("give eventIds, or from and to, not both")
        if not isinstance(event_ids, list) or not event_ids or not all(isinstance(e, str) for e in event_ids):
            raise ReplayRequestError("eventIds must be a non-empty list of strings")
        return {"event_ids": event_ids}
    if not isinstance(start, str) or not isinstance(end, str):
        raise ReplayRequestError("give eventIds, or both from and to (RFC 3339 timestamps)")
    try:
        window = (parse_time(start), parse_time(end))
    except ValueError as exc:
        raise ReplayRequestError(str(exc)) from exc
    if window[0] > window[1]:
        raise ReplayRequestError(f"from {start} is after to {end}")
    return {"window": window}


def replay_order_store(
    database: Database,
    settings: Settings,
    request: dict[str, Any],
    seconds_left: Callable[[], float],
    *,
    now: Callable[[], datetime] = utc_now,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayReport:
    chosen = _selection(request)
    include_expired = request.get("includeExpired") is True
    horizon = None if include_expired else now() - timedelta(days=settings.outbox_ttl_days)
    logical = settings.postgres_relay == "logical"
    with database.transaction() as cursor:
        selection, positions = reset_for_replay(cursor, horizon=horizon, logical_relay=logical, **chosen)
        if logical:
            emit_replay(cursor, positions)
    report = ReplayReport(selection)
    if selection.expired:
        report.messages.append(
            f"{len(selection.expired)} events are older than the republish window (OutboxTtlDays): "
            "consumers may no longer remember them; replay them with includeExpired to republish anyway"
        )
    if selection.parked:
        report.messages.append(
            f"{len(selection.parked)} events are parked poison: fix them, then redrive-poison"
        )
    if selection.missing:
        report.messages.append(f"{len(selection.missing)} event ids are not in the outbox")
    waiting = list(selection.reset)
    if logical:
        waiting = _wait_for_slot(database, slot_name(settings.database_name), waiting, seconds_left, sleep)
    while waiting and not logical and seconds_left() > RESERVE_SECONDS:
        with database.transaction() as cursor:
            cursor.execute(
                "SELECT event_id FROM outbox WHERE event_id = ANY(%s) AND published_at IS NULL", (waiting,)
            )
            waiting = [event_id for (event_id,) in cursor.fetchall()]
        if waiting:
            sleep(POLL_SECONDS)
    report.republished = len(selection.reset) - len(waiting)
    report.still_pending = waiting
    if waiting:
        report.messages.append(
            f"{len(waiting)} events are pending again but not yet republished when this invocation ended: "
            "the publisher will send them; check the OutboxPendingAge alarm"
        )
    return report


def _wait_for_slot(
    database: Database,
    slot: str,
    waiting: list[str],
    seconds_left: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[str]:
    """The replay message committed before the log's flush position read now: once the slot has been
    confirmed past it, the relay has put every named row on the bus (or parked it)."""
    if not waiting:
        return waiting
    with database.transaction() as cursor:
        target = flush_lsn(cursor)
    while seconds_left() > RESERVE_SECONDS:
        with database.transaction() as cursor:
            if confirmed_lsn(cursor, slot) >= target:
                return []
        sleep(POLL_SECONDS)
    return waiting
