"""Recovering a lost outbox slot (PostgresRelay=logical): `python -m operations recover-slot` invokes the
maintenance function with {"recoverSlot": {...}} (the database is in a private VPC) and prints what this
returns. shop.adapters.postgres.slot_recovery says what "lost" is and holds the SQL.

The gap: every outbox row whose commit may have been in the lost slot's unread WAL. Its start:
- `since` given by the operator (used as given, even later than the database's own bound: the report
  names both);
- else a recovery already under way (it stopped before it handed the gap over): its start;
- else the database's bound, less a margin: `outbox_slot.delivered_before` (every row committed before
  it was delivered; the maintenance function records it each minute) - 1 h (a row's created_at precedes
  its commit; no writer's transaction lasts an hour);
- else the republish window: every row written in the last OutboxTtlDays.
The gap's rows are the rows created since then (rows a replay, a redrive or a switch handed to the relay
are in replay sets, in the table: the sets whose activating message was lost are activated). Consumers
drop what they already had by event id, so erring on the side of republishing costs duplicates, never a
lost event. Rows created before the republish window's horizon are left out unless includeExpired
(consumers may no longer remember them); parked rows are left to redrive-poison.

A dry run unless `execute`: it says what it would do. Executed, the steps are each committed before the
next, and the report names each step done (`done`) and the one that failed (`failed`); a run that stops
anywhere may be repeated (it goes on from the recorded recovery):
1. record the recovery (outbox_slot.recovery_since): from here the maintenance metric ReplicationSlotLost
   stays 1 until the gap is handed over;
2. keep the relay off the slot (its advisory lock, for the session);
3. drop the invalidated slot; create the publication if missing; create the slot;
4. hand the gap to the relay as an activated replay set (slot_recovery.hand_over_gap), advance the new
   slot past what it decoded before (all of it is in the set), let the relay go;
5. wait, up to the invocation's end, until the relay has drained the set (every gap row on the bus or
   parked); the recovery record is then cleared, and the report names the gap rows the relay parked on
   the way (parkedOnTheWay). The maintenance function clears a drained recovery too, but only one with
   nothing to report (no gap row left out or parked on the way): another stays for the next run.
A run that finds the gap handed over already reports on that recovery the same way: what its hand-over
left out (recorded with it), then what was parked on the way once the set is drained.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from shop.adapters.postgres.connection import Database, limit_lock_wait, limit_statement_time, wait_for_locks
from shop.adapters.postgres.replication import (
    advance_slot,
    lock_slot_for_session,
    slot_name,
    unlock_slot_for_session,
)
from shop.adapters.postgres.slot_recovery import (
    HandedOver,
    SlotState,
    begin_recovery,
    count_gap,
    create_publication_if_missing,
    create_slot,
    drop_slot,
    finish_recovery_if_drained,
    hand_over_gap,
    parked_on_the_way,
    read_slot_state,
    start_gap_set,
)
from shop.domain.envelope import format_time, parse_time
from shop.domain.envelope import now as utc_now
from shop.domain.errors import ServiceBusy
from shop.domain.serialization import camel_fields
from shop.runtime.config import Settings

COMMIT_MARGIN = timedelta(hours=1)
POLL_SECONDS = 0.5
RESERVE_SECONDS = 5.0
LOCK_WAIT_SECONDS = 10  # for the relay's round to end, and for writers to let go of the outbox
MAX_IDS_LISTED = 100


class SlotRecoveryRequestError(ValueError):
    """The request is malformed: nothing was changed."""


@dataclass
class SlotRecoveryReport:
    slot: str
    dry_run: bool
    state: str  # before the run
    since: str | None = None
    since_source: str | None = None
    computed_since: str | None = None  # the database's own start, when the operator gave another
    gap_rows: int = 0  # to republish (not parked; inside the republish window unless includeExpired)
    expired: int = 0  # left out: created before the republish window's horizon
    expired_ids: list[str] = field(default_factory=list)  # the first MAX_IDS_LISTED
    parked_in_gap: int = 0  # left to redrive-poison
    parked_on_the_way: list[str] = field(default_factory=list)  # gap rows the relay parked (the first 100)
    replay_id: int | None = None  # the replay set the gap was handed to
    sets_activated: list[int] = field(default_factory=list)  # sets whose messages were never read
    done: list[str] = field(default_factory=list)  # each step, once committed
    republished: bool = False  # the relay drained the gap's set: every gap row on the bus, or parked
    failed: str | None = None  # the step that failed, and why
    messages: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Nothing to recover, or recovered and the whole gap on the bus: nothing left out, nothing of it
        parked on the way."""
        return (
            not self.dry_run
            and self.failed is None
            and self.republished
            and not self.expired
            and not self.parked_on_the_way
        )

    def to_dict(self) -> dict[str, Any]:
        return {**camel_fields(self), "complete": self.complete}


def _request(request: Any, now: datetime) -> tuple[bool, datetime | None, bool]:
    if not isinstance(request, dict):
        raise SlotRecoveryRequestError("recoverSlot takes an object: {execute, since, includeExpired}")
    since = request.get("since")
    if since is not None:
        if not isinstance(since, str):
            raise SlotRecoveryRequestError("since must be an RFC 3339 timestamp")
        try:
            since = parse_time(since)
        except ValueError as exc:
            raise SlotRecoveryRequestError(str(exc)) from exc
        if since > now:
            raise SlotRecoveryRequestError(f"since {format_time(since)} is in the future")
    return request.get("execute") is True, since, request.get("includeExpired") is True


def gap_start(state: SlotState, ttl_days: int, now: datetime) -> tuple[datetime, str]:
    """Where the gap starts when the operator says nothing, and why there."""
    if state.recovery_since is not None and not state.recovery_drained:  # a drained one is over
        return state.recovery_since, "the recovery under way"
    if state.delivered_before is not None:
        return state.delivered_before - COMMIT_MARGIN, (
            f"the last delivered position the database recorded ({format_time(state.delivered_before)}) "
            f"less {COMMIT_MARGIN}"
        )
    return now - timedelta(days=ttl_days), (
        "the republish window (no delivered position recorded for this slot): every row written in the "
        f"last {ttl_days} days"
    )


def recover_slot(
    database: Database,
    settings: Settings,
    request: dict[str, Any],
    seconds_left: Callable[[], float],
    *,
    now: Callable[[], datetime] = utc_now,
    sleep: Callable[[float], None] = time.sleep,
) -> SlotRecoveryReport:
    moment = now()
    execute, asked_since, include_expired = _request(request, moment)
    slot = slot_name(settings.database_name)
    with database.transaction() as cursor:
        state = read_slot_state(cursor, slot)
    report = SlotRecoveryReport(slot=slot, dry_run=not execute, state=state.describe())
    if state.relay_mode != "logical":
        report.messages.append(
            f"the outbox's relay mode is {state.relay_mode}: no slot is read, nothing to do"
        )
        report.republished = True
        return report
    if settings.postgres_relay != "logical":
        report.failed = (
            "the database's relay mode is logical but this function runs PostgresRelay="
            f"{settings.postgres_relay}: a relay switch is under way or failed; finish the deploy first"
        )
        return report
    if not state.needs_recovery:
        if state.handed_over is not None:
            recovery = state.handed_over
            report.since, report.since_source = format_time(recovery.since), "the recovery under way"
            report.messages.append("recovered already: the gap was handed to the relay")
            report.replay_id, report.expired = recovery.replay_id, recovery.expired
            if recovery.expired:
                report.messages.append(
                    f"{recovery.expired} rows of the gap were created before the republish window and left "
                    "out by the hand-over (its report listed them); to republish them anyway: python -m "
                    f"operations replay --from {report.since} --to "
                    f"{format_time(recovery.at - timedelta(days=settings.outbox_ttl_days))} --include-expired"
                )
            if execute:
                report.republished = _wait_until_drained(
                    database, slot, recovery, seconds_left, sleep, report
                )
        else:
            report.messages.append("the slot is healthy: nothing to recover")
            report.republished = True
        return report

    computed, source = gap_start(state, settings.outbox_ttl_days, moment)
    since = computed
    if asked_since is not None:
        since, source = asked_since, "given by the operator"
        report.computed_since = format_time(computed)
    report.since, report.since_source = format_time(since), source
    horizon = None if include_expired else moment - timedelta(days=settings.outbox_ttl_days)
    with database.transaction() as cursor:
        counts = count_gap(cursor, since, horizon or since)
    report.expired = counts.expired if horizon else 0
    report.gap_rows = counts.rows - report.expired
    report.parked_in_gap = counts.parked
    if counts.parked:
        report.messages.append(
            f"{counts.parked} parked rows in the gap are not republished: redrive-poison is their way back"
        )
    if not execute:
        report.messages.append(
            "dry run: nothing changed. Executed, it would "
            + "; ".join(_plan(state))
            + f"; then hand the {report.gap_rows} rows written since {report.since} to the relay"
            + (f" ({report.expired} created before the republish window left out)" if report.expired else "")
        )
        return report
    _execute(database, slot, state, since, horizon, report, seconds_left, sleep)
    return report


def _plan(state: SlotState) -> list[str]:
    steps = ["record the recovery"]
    if state.exists and state.problem is not None:
        steps.append(f"drop slot {state.slot} ({state.problem})")
    if not state.exists or state.problem is not None:
        steps.append(f"create slot {state.slot} (and the publication, if missing)")
    return steps


def _execute(
    database: Database,
    slot: str,
    state: SlotState,
    since: datetime,
    horizon: datetime | None,
    report: SlotRecoveryReport,
    seconds_left: Callable[[], float],
    sleep: Callable[[float], None],
) -> None:
    step = "record the recovery"
    locked = False
    try:
        with database.transaction() as cursor:
            since = begin_recovery(cursor, slot, since)
        report.since = format_time(since)
        report.done.append(f"recorded the recovery of {slot}, republishing from {report.since}")
        step = "keep the relay off the slot"
        with database.transaction() as cursor:
            wait_for_locks(cursor, LOCK_WAIT_SECONDS * 1000)
            lock_slot_for_session(cursor, slot)
        locked = True
        report.done.append("holding the relay's lock")
        if state.exists and state.problem is not None:
            step = f"drop slot {slot}"
            with database.transaction() as cursor:
                drop_slot(cursor, slot)
            report.done.append(f"dropped slot {slot} ({state.problem})")
        step = "create the publication"
        with database.transaction() as cursor:
            if create_publication_if_missing(cursor):
                report.done.append("created the publication (it was missing)")
        step = f"create slot {slot}"
        with database.transaction() as cursor:
            if read_slot_state(cursor, slot).exists:
                report.done.append(f"slot {slot} exists already (created by an earlier run)")
            else:
                limit_statement_time(cursor, _milliseconds_for(seconds_left))
                create_slot(cursor, slot)
                report.done.append(f"created slot {slot}")
        step = "hand the gap to the relay"
        with database.transaction() as cursor:
            limit_lock_wait(cursor, LOCK_WAIT_SECONDS * 1000)
            limit_statement_time(cursor, _milliseconds_for(seconds_left))
            gap_set = start_gap_set(cursor, since=since, horizon=horizon)
            handover = hand_over_gap(
                cursor,
                slot,
                gap_set,
                since=since,
                horizon=horizon,
                listed=MAX_IDS_LISTED,
                commit_margin_seconds=COMMIT_MARGIN.total_seconds(),
            )
        report.gap_rows = handover.replayed
        report.expired = handover.expired
        report.expired_ids = handover.expired_ids
        report.replay_id = handover.replay_id
        report.sets_activated = handover.sets_activated
        report.done.append(
            f"handed {handover.replayed} rows to the relay as replay set {handover.replay_id}"
            f" ({handover.decoded_before} of them decoded by the new slot already)"
            + (f"; activated the unread sets {handover.sets_activated}" if handover.sets_activated else "")
        )
        step = "advance the new slot past what it decoded before the hand-over"
        with database.transaction() as cursor:
            advance_slot(cursor, slot, handover.advance_to)
        report.done.append("advanced the new slot past what it decoded before the hand-over")
    except (ServiceBusy, psycopg.Error) as exc:
        report.failed = f"{step}: {str(exc.__cause__ or exc)[:500]}"
        report.messages.append(
            "stopped before the recovery was complete; `done` lists what was. Run the command again: it goes "
            "on from the recorded recovery (ReplicationSlotLost stays 1 until the gap is handed over)"
        )
        return
    finally:
        if locked:
            _unlock(database, slot)
    if report.expired and horizon is not None:
        report.messages.append(
            f"{report.expired} rows of the gap were created before the republish window (OutboxTtlDays): "
            "consumers may no longer remember them, so they were left out (expiredIds lists the first); to "
            f"republish them anyway: python -m operations replay --from {report.since} --to "
            f"{format_time(horizon)} --include-expired"
        )
    report.republished = _wait_until_drained(database, slot, handover.recovery, seconds_left, sleep, report)


def _milliseconds_for(seconds_left: Callable[[], float]) -> int:
    return int(max(seconds_left() - RESERVE_SECONDS, 1.0) * 1000)


def _unlock(database: Database, slot: str) -> None:
    try:
        with database.transaction() as cursor:
            unlock_slot_for_session(cursor, slot)
    except ServiceBusy:
        database.close()  # a closed connection lets go of its session locks


def _wait_until_drained(
    database: Database,
    slot: str,
    recovery: HandedOver,
    seconds_left: Callable[[], float],
    sleep: Callable[[float], None],
    report: SlotRecoveryReport,
) -> bool:
    """Wait for the recovery that handed its gap over as set `recovery.replay_id` to be over: cleared by
    this run once the set is drained, or by the maintenance function (it clears a drained recovery that
    left nothing out, and had nothing parked on the way); then name the gap's rows the relay parked on the
    way. A record naming another set, or none, is another run's recovery: a second recover-slot run
    records the recovery again (begin_recovery) and hands the gap over anew, and this run has no say on
    that set."""
    while True:
        with database.transaction() as cursor:
            current = read_slot_state(cursor, slot)
            if current.recovery_since is None or (
                current.recovery_replay_id == recovery.replay_id and finish_recovery_if_drained(cursor, slot)
            ):
                parked = parked_on_the_way(cursor, recovery)
                break
        if current.recovery_replay_id != recovery.replay_id:
            report.messages.append(
                "another recover-slot run recorded the recovery again meanwhile (the record no longer names "
                f"replay set {recovery.replay_id}): its report says how it ends; run the command again to "
                "see it finished"
            )
            return False
        if seconds_left() <= RESERVE_SECONDS:
            report.messages.append(
                "the relay had not published the whole gap when this invocation ended: it goes on by itself "
                "(OutboxOldestPendingAge); run the command again to see it finished"
            )
            return False
        sleep(POLL_SECONDS)
    report.done.append("the relay drained the gap's set: every row of it is on the bus or parked")
    report.parked_on_the_way = parked[:MAX_IDS_LISTED]
    if parked:
        report.messages.append(
            f"{len(parked)} rows of the gap were parked by the relay on the way, not published "
            "(parkedOnTheWay lists the first): fix them, then redrive-poison"
        )
    return True
