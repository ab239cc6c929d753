"""Parked rows of the PostgreSQL outbox, redriven or discarded by an operator (the database is in a private
VPC: `python -m operations redrive-poison | discard-poison` invoke the maintenance function with
{"redriveParked": ...} or {"discardParked": ...}, and print what this returns).

Redrive works from the row, whatever its poison message holds (a record too large for the poison queue
carries only its key), under either relay:
- polling: the parked mark is cleared (redriven_at recorded), so the row is pending again and the polling
  publisher sends it, in its order's sequence; this waits until it is published or parked again;
- logical: the relay reads the slot, not the table, so clearing the mark alone would send nothing; the
  mark is cleared and the row is named in a replay (shop.runtime.order_store_replay: a replay set the
  relay drains from the table), and this waits until the set is drained.
A row the relay parks again (still poison) is in the poison queue again, in a new message. Honesty rules as
replay's: each event id is reported `republished`, `parkedAgain`, `pending` (not on the bus when the
invocation ended: the publisher will send it; run again to see it), `discarded` (an operator decided it
is never published: not redriven), or `missing` (not in the outbox).

Discard records who decided, when and why, on rows that are parked; the row stays (parked, as evidence)
for the republish window after the decision, then retention deletes it. A dry run unless `execute`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.outbox import relay_mode
from shop.adapters.postgres.parked import ParkedRowState, discard, mark_redriven, parked_row_states, unpark
from shop.domain.serialization import camel_fields
from shop.runtime.config import Settings
from shop.runtime.order_store_replay import replay_order_store

POLL_SECONDS = 0.5
RESERVE_SECONDS = 5.0
MAX_EVENT_IDS = 100


class ParkedRequestError(ValueError):
    """The request names no valid selection: nothing was changed."""


def _event_ids(request: Any) -> list[str]:
    event_ids = request.get("eventIds") if isinstance(request, dict) else None
    if (
        not isinstance(event_ids, list)
        or not event_ids
        or not all(isinstance(e, str) and e for e in event_ids)
    ):
        raise ParkedRequestError("eventIds must be a non-empty list of event ids")
    if len(event_ids) > MAX_EVENT_IDS:
        raise ParkedRequestError(f"at most {MAX_EVENT_IDS} event ids per request")
    return list(dict.fromkeys(event_ids))


@dataclass
class ParkedRedriveReport:
    relay: str
    republished: list[str] = field(default_factory=list)
    parked_again: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every named row is on the bus again."""
        return not (self.parked_again or self.pending or self.discarded or self.missing)

    def to_dict(self) -> dict[str, Any]:
        return {**camel_fields(self), "complete": self.complete}


def redrive_parked_rows(
    database: Database,
    settings: Settings,
    request: dict[str, Any],
    seconds_left: Callable[[], float],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> ParkedRedriveReport:
    event_ids = _event_ids(request)
    with database.transaction() as cursor:
        # The relay that owns the outbox now (outbox_relay), not this function's configuration.
        mode = relay_mode(cursor)
        logical = mode == "logical"
        rows = parked_row_states(cursor, event_ids, for_update=True)
        report = ParkedRedriveReport(relay=mode)
        report.missing = [event_id for event_id in event_ids if event_id not in rows]
        report.discarded = [row.event_id for row in rows.values() if row.discarded_at is not None]
        live = [row for row in rows.values() if row.discarded_at is None]
        unpark(cursor, [row.position for row in live if row.parked_at is not None])
        if logical:  # not parked (redriven before, or its mark rolled back): replayed all the same
            mark_redriven(cursor, [row.position for row in live if row.parked_at is None])
    for row in rows.values():
        if row.discarded_at is not None:
            report.messages.append(
                f"event {row.event_id} was discarded by {row.discarded_by} at {row.discarded_at.isoformat()}"
                f" ({row.discard_reason}): not redriven"
            )
    if report.missing:
        report.messages.append(
            f"{len(report.missing)} event ids are not in the outbox (unknown, or discarded and past the "
            "republish window)"
        )
    waiting = [row.event_id for row in live]
    if logical and waiting:
        # The relay reads the slot, not the table: the rows go to it as a replay set. Never published
        # (parked), so past no consumer's memory: includeExpired.
        replay = replay_order_store(
            database, settings, {"eventIds": waiting, "includeExpired": True}, seconds_left
        )
        report.missing.extend(
            event_id for event_id in replay.selection.missing if event_id not in report.missing
        )
        still = set(replay.still_pending) | set(replay.selection.parked)
        waiting = [event_id for event_id in waiting if event_id in still]
        _sort(report, _states(database, [row.event_id for row in live]), pending=set(waiting))
        return report
    while waiting:
        states = _states(database, waiting)
        waiting = [
            event_id
            for event_id in waiting
            if event_id in states
            and states[event_id].published_at is None
            and not states[event_id].parked_again
        ]
        if not waiting or seconds_left() <= RESERVE_SECONDS:
            break
        sleep(POLL_SECONDS)
    _sort(report, _states(database, [row.event_id for row in live]), pending=set(waiting))
    return report


def _states(database: Database, event_ids: list[str]) -> dict[str, ParkedRowState]:
    with database.transaction() as cursor:
        return parked_row_states(cursor, event_ids)


def _sort(report: ParkedRedriveReport, states: dict[str, ParkedRowState], *, pending: set[str]) -> None:
    for event_id, state in states.items():
        if state.parked_again:
            report.parked_again.append(event_id)
        elif event_id in pending:
            report.pending.append(event_id)
        else:
            report.republished.append(event_id)
    if report.parked_again:
        report.messages.append(
            f"{len(report.parked_again)} events were parked again (still poison): a new message in the "
            "relay poison queue holds each, with the reason"
        )
    if report.pending:
        report.messages.append(
            f"{len(report.pending)} events are pending again but were not on the bus when this invocation "
            "ended: the publisher will send them; run the command again to see them republished"
        )


@dataclass
class DiscardReport:
    dry_run: bool
    by: str
    reason: str
    discarded: list[str] = field(default_factory=list)  # done now (or, in a dry run, what would be)
    already_discarded: list[str] = field(default_factory=list)
    not_parked: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every named event is discarded (in a dry run: would be), or was already."""
        return not (self.not_parked or self.missing)

    def to_dict(self) -> dict[str, Any]:
        return {**camel_fields(self), "complete": self.complete}


def discard_parked_rows(database: Database, request: dict[str, Any]) -> DiscardReport:
    event_ids = _event_ids(request)
    by, reason = request.get("by"), request.get("reason")
    if not isinstance(by, str) or not by.strip():
        raise ParkedRequestError("by (who discards) must be given")
    if not isinstance(reason, str) or not reason.strip():
        raise ParkedRequestError("reason (why these events are never to be published) must be given")
    report = DiscardReport(dry_run=request.get("execute") is not True, by=by.strip(), reason=reason.strip())
    with database.transaction() as cursor:
        rows = parked_row_states(cursor, event_ids, for_update=True)
        report.missing = [event_id for event_id in event_ids if event_id not in rows]
        chosen = []
        for row in rows.values():
            if row.discarded_at is not None:
                report.already_discarded.append(row.event_id)
                report.messages.append(
                    f"event {row.event_id} was already discarded by {row.discarded_by} at "
                    f"{row.discarded_at.isoformat()} ({row.discard_reason})"
                )
            elif row.parked_at is None:
                report.not_parked.append(row.event_id)
            else:
                chosen.append(row)
        report.discarded = [row.event_id for row in chosen]
        if not report.dry_run:
            discard(cursor, [row.position for row in chosen], by=report.by, reason=report.reason)
    if report.not_parked:
        report.messages.append(
            f"{len(report.not_parked)} events are not parked (pending, published, or redriven): only a "
            "parked event can be discarded"
        )
    if report.missing:
        report.messages.append(f"{len(report.missing)} event ids are not in the outbox")
    if report.dry_run:
        report.messages.append(
            f"dry run: nothing changed; {len(report.discarded)} parked events would be discarded (execute "
            "to discard them: they are then never published, and retention deletes them after the "
            "republish window)"
        )
    return report
