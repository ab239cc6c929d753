"""Replay for the PostgreSQL order store: make published outbox rows pending again, so the polling
publisher republishes them in per-order sequence, then wait until it has. With the logical relay (the
relay that owns the outbox now, outbox_relay.mode), name the rows in a replay set with its message in the
log (shop.adapters.postgres.replays): the relay activates the set where the message sits, once
everything committed before it is out, and drains it a chunk a round, whatever its size, while later
events keep flowing; replay waits until the set names no row (each on the bus, or parked: a row parked
on the way is named, and the replay is not complete).

The database lives in a private VPC, out of an operator's reach: `python -m operations replay` invokes
the maintenance function with {"replay": {...}} and prints what this returns. The same honesty rules as
the DynamoDB store's replay (operations/recovery.py): events past the republish window are left alone
unless includeExpired (consumers may no longer remember them), parked poison is named (redrive-poison
is its way back), ids not in the outbox are named, and `complete` is true only when every selected
event is on the bus again: one selected while still pending (never published yet) is waited for like
the others, and one the relay parks on the way (it no longer fits MaxEventBytes, say) is named.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shop.adapters.postgres import replays
from shop.adapters.postgres.connection import Database, limit_statement_time_to
from shop.adapters.postgres.outbox import (
    ReplaySelection,
    parked_events_among,
    relay_mode_for_replay,
    reset_for_replay,
    unpublished_among,
)
from shop.adapters.postgres.replication import emit_replay
from shop.domain.envelope import now as utc_now
from shop.domain.envelope import parse_time
from shop.domain.serialization import camel_fields
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
    parked_on_the_way: list[str] = field(default_factory=list)  # selected, then parked by the relay
    messages: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        s = self.selection
        return not (s.expired or s.parked or s.missing or self.still_pending or self.parked_on_the_way)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.selection),
            **camel_fields(self, omit={"selection"}),
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
    replay_id = None
    with database.transaction() as cursor:
        # One transaction selects and resets the whole window: it may take the invocation's time, not the
        # session's 5 s (half a million rows take about 7 s; cut at 5 s, every retry failed the same way).
        limit_statement_time_to(cursor, seconds_left() - RESERVE_SECONDS)
        # The relay that owns the outbox now (not this function's configuration: a switch may be under
        # way), read with the outbox locked against a switch until this commits.
        logical = relay_mode_for_replay(cursor) == "logical"
        selection, positions = reset_for_replay(cursor, horizon=horizon, logical_relay=logical, **chosen)
        if logical:
            replay_id = emit_replay(cursor, positions)
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
    # What must reach the bus: the rows made pending again, and those selected while still pending.
    selected = [*selection.reset, *selection.pending]
    waiting, parked = list(selected), []
    if replay_id is not None:
        waiting = _wait_for_set(database, replay_id, waiting, seconds_left, sleep)
        with database.transaction() as cursor:
            # A row leaves the set once on the bus, or once parked.
            parked = parked_events_among(cursor, [e for e in selected if e not in waiting])
    while waiting and seconds_left() > RESERVE_SECONDS:
        with database.transaction() as cursor:
            waiting, parked_now = unpublished_among(cursor, waiting)
        parked += parked_now
        if waiting:
            sleep(POLL_SECONDS)
    report.republished = len(selected) - len(waiting) - len(parked)
    report.still_pending = waiting
    report.parked_on_the_way = parked
    if waiting:
        report.messages.append(
            f"{len(waiting)} events are pending again but not yet republished when this invocation ended: "
            "the publisher will send them; check the OutboxPendingAge alarm"
        )
    if parked:
        report.messages.append(
            f"{len(parked)} events were parked by the relay on the way, not published: fix them, then "
            "redrive-poison"
        )
    return report


def _wait_for_set(
    database: Database,
    replay_id: int,
    waiting: list[str],
    seconds_left: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[str]:
    """The logical relay drains the replay set across its rounds, each row leaving the set once it is on
    the bus (or parked): the events still pending are the set's. A set handed back to the polling
    publisher by a switch meanwhile is gone: its rows are pending rows again, which the caller waits for
    as with the polling publisher."""
    while True:
        with database.transaction() as cursor:
            progress = replays.progress(cursor, replay_id)
        if not progress.exists:
            return waiting
        pending = set(progress.pending_event_ids)
        waiting = [event_id for event_id in waiting if event_id in pending]
        if not waiting or seconds_left() <= RESERVE_SECONDS:
            return waiting
        sleep(POLL_SECONDS)
