"""The faults of the relays (role `relay`: the stream relay, and with OrderStore=postgres the publisher),
on PutEvents: a throttle, an internal error, a lost response, entries failed once or persistently, a
crash after the call, or a crash the migration function armed (Arms). With PostgresRelay=logical, on
the slot (shop.runtime.logical_relay's advance_slot: a crash after an advance, before COMMIT) and on the
replay sets (shop.adapters.postgres.replays' activate and mark_done: a crash after an activation, before
the slot passes a set's message, after a chunk of a set)."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ReadTimeoutError

from tools.chaos.injection import ApiCall, ChaosCrash, InjectorBase, client_error
from tools.chaos.plan import (
    RELAY_CALL_ERROR,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_KINDS,
    RELAY_LOST_RESPONSE,
    RELAY_THROTTLE,
    SET_KINDS,
    SLOT_KINDS,
)

# PostgresRelay=logical: the module whose `advance_slot` (and `peek_changes`) the relay's round calls.
LOGICAL_RELAY_MODULE = "shop.runtime.logical_relay"
_REPLICATION_MODULE = "shop.adapters.postgres.replication"
# The replay sets the logical relay drains (activate, mark_done: called through the module, so wrapped there).
REPLAYS_MODULE = "shop.adapters.postgres.replays"
# The publisher tries an entry at most 6 times per invocation; failing it that often makes it checkpoint.
_PERSISTENT_FAILURES = 6
_MAX_FAILED_ENTRIES = 3


def _envelope_id(detail: Any) -> str:
    """The CloudEvent id of a PutEvents entry's Detail (the envelope itself)."""
    try:
        envelope = json.loads(detail)
    except (TypeError, ValueError):
        return f"undecodable:{hash(detail)}"
    event_id = envelope.get("id") if isinstance(envelope, dict) else None
    return event_id if isinstance(event_id, str) else f"undecodable:{hash(detail)}"


def _set_kinds(
    cursor: Any, *, replay_ids: list[int] | None = None, positions: list[int] | None = None
) -> list[str]:
    """The kinds (replay, handover, spill) of the sets with these ids, or naming these rows."""
    if replay_ids is not None:
        cursor.execute("SELECT DISTINCT kind FROM outbox_replay WHERE replay_id = ANY(%s)", (replay_ids,))
    else:
        cursor.execute(
            "SELECT DISTINCT s.kind FROM outbox_replay_rows AS r JOIN outbox_replay AS s"
            " ON s.replay_id = r.replay_id WHERE r.position = ANY(%s)",
            (positions,),
        )
    return sorted(str(kind) for (kind,) in cursor.fetchall())


class RelayFaults(InjectorBase):
    def _relay(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        entries: list[dict[str, Any]] = list(params["Entries"])
        ids = [_envelope_id(entry.get("Detail")) for entry in entries]
        if RELAY_CRASH_AROUND_SWITCH in self.spec.faults:
            arm = self.arms.take(incarnation=self.incarnation, pid=os.getpid())
            if arm is not None:
                return self._armed_crash(arm, original, client, operation, params, ids)
        repeat = [position for position, event_id in enumerate(ids) if self._persistent.get(event_id, 0) > 0]
        if repeat:
            for position in repeat:
                self._persistent[ids[position]] -= 1
            return self._fail_entries(original, client, operation, params, set(repeat))
        kind = self._pick(RELAY_KINDS)
        if kind is None:
            return original(client, operation, params)
        if kind in {RELAY_ENTRY_FAILURES, RELAY_ENTRY_FAILURES_PERSISTENT}:
            limit = 1 if kind == RELAY_ENTRY_FAILURES_PERSISTENT else min(_MAX_FAILED_ENTRIES, len(entries))
            positions = set(self.rng.sample(range(len(entries)), self.rng.randint(1, limit)))
            chosen = [ids[p] for p in sorted(positions)]
            if not self._claim(kind, chosen):
                return original(client, operation, params)
            self._record(kind, operation, event_ids=chosen, entries_in_call=len(entries))
            if kind == RELAY_ENTRY_FAILURES_PERSISTENT:
                self._persistent[chosen[0]] = _PERSISTENT_FAILURES - 1
            return self._fail_entries(original, client, operation, params, positions)
        if not self._claim(kind, ids):
            return original(client, operation, params)
        if kind == RELAY_THROTTLE:
            self._record(kind, operation, event_ids=ids)
            raise client_error("ThrottlingException", "rate exceeded", operation)
        if kind == RELAY_CALL_ERROR:
            self._record(kind, operation, event_ids=ids)
            raise client_error("InternalException", "internal error", operation, status=500)
        result = original(client, operation, params)
        self._record(kind, operation, event_ids=ids, failed_entry_count=result.get("FailedEntryCount", 0))
        if kind == RELAY_LOST_RESPONSE:
            # the SDK client's endpoint, or the awscrt transport's (it has no `meta`)
            raise ReadTimeoutError(
                endpoint_url=getattr(client, "endpoint_url", None) or client.meta.endpoint_url
            )
        raise ChaosCrash(f"chaos: {self.function} dies after PutEvents succeeded")

    def _armed_crash(
        self,
        arm: dict[str, Any],
        original: ApiCall,
        client: BaseClient,
        operation: str,
        params: dict[str, Any],
        ids: list[str],
    ) -> Any:
        """A crash the migration function armed at a switch's step: the call goes through, the round's
        locks are held `hold_seconds` (the step waits for them), then the process dies before COMMIT."""
        try:
            result = original(client, operation, params)
        except BaseException:
            self.arms.give_back(int(arm["arm"]))  # nothing went out: the next call takes it
            raise
        hold = float(arm.get("hold_seconds") or 0.0)
        self.state.tally(RELAY_CRASH_AROUND_SWITCH, 1_000_000)
        self._record(
            RELAY_CRASH_AROUND_SWITCH,
            operation,
            event_ids=ids,
            failed_entry_count=result.get("FailedEntryCount", 0),
            switch=arm.get("switch"),
            point=arm.get("point"),
            arm=arm["arm"],
            armed_at=arm["armed_at"],
            hold_seconds=hold,
        )
        time.sleep(hold)
        raise ChaosCrash(
            f"chaos: {self.function} dies after PutEvents, {arm.get('point')} ({arm.get('switch')})"
        )

    @staticmethod
    def _fail_entries(
        original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any], failing: set[int]
    ) -> Any:
        """Send only the other entries; answer the failing ones with InternalFailure, in request order."""
        entries = params["Entries"]
        kept = [entry for position, entry in enumerate(entries) if position not in failing]
        response: dict[str, Any] = (
            original(client, operation, {**params, "Entries": kept})
            if kept
            else {"FailedEntryCount": 0, "Entries": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        )
        real = iter(response["Entries"])
        merged = [
            {"ErrorCode": "InternalFailure", "ErrorMessage": "chaos: injected entry failure"}
            if position in failing
            else next(real)
            for position in range(len(entries))
        ]
        failed = int(response.get("FailedEntryCount", 0)) + len(failing)
        return {**response, "FailedEntryCount": failed, "Entries": merged}

    # --- the logical relay's slot -----------------------------------------------------------------
    def wrap_slot(self, module: ModuleType) -> None:
        """Wrap the logical relay module's `peek_changes` (to know which rows a round read) and its
        `advance_slot` (the real advance first, then perhaps a crash before the COMMIT)."""
        real_peek: Callable[..., Any] = module.peek_changes
        real_advance: Callable[..., bool] = module.advance_slot
        replication = sys.modules[_REPLICATION_MODULE]  # the copy of `shop` the function runs
        injector = self

        @functools.wraps(real_peek)
        def peek_changes(cursor: Any, slot: str, max_changes: int, **options: Any) -> Any:
            changes = real_peek(cursor, slot, max_changes, **options)  # options: the read's window
            injector._slot_read = list(changes.transactions)
            injector._activated = None  # a new round
            return changes

        @functools.wraps(real_advance)
        def advance_slot(cursor: Any, slot: str, lsn: int) -> bool:
            injector._before_advance(lsn)
            before = int(replication.confirmed_lsn(cursor, slot))
            moved = real_advance(cursor, slot, lsn)
            if moved:
                injector._after_advance(before, lsn)
            return moved

        setattr(module, "peek_changes", peek_changes)  # noqa: B010 - the seam, on purpose
        setattr(module, "advance_slot", advance_slot)  # noqa: B010 - the seam, on purpose
        if any(kind in self.spec.faults for kind in SET_KINDS):
            self.wrap_sets(sys.modules[REPLAYS_MODULE])

    def wrap_sets(self, module: ModuleType) -> None:
        """Wrap the replay sets' `activate` (the round activates the sets whose messages it read) and
        `mark_done` (a chunk of them went out): the real call first, then perhaps a crash before COMMIT."""
        real_activate: Callable[..., None] = module.activate
        real_done: Callable[..., list[int]] = module.mark_done
        injector = self

        @functools.wraps(real_activate)
        def activate(cursor: Any, replay_ids: list[int]) -> None:
            kinds = _set_kinds(cursor, replay_ids=replay_ids) if replay_ids else []
            real_activate(cursor, replay_ids)
            if replay_ids:
                injector._after_activation(list(replay_ids), kinds)

        @functools.wraps(real_done)
        def mark_done(cursor: Any, positions: list[int]) -> list[int]:
            kinds = _set_kinds(cursor, positions=positions) if positions else []
            finished = real_done(cursor, positions)
            if positions:
                injector._after_set_chunk(cursor, list(positions), kinds)
            return finished

        setattr(module, "activate", activate)  # noqa: B010 - the seam, on purpose
        setattr(module, "mark_done", mark_done)  # noqa: B010 - the seam, on purpose

    def _set_fault(self, kind: str) -> bool:
        """Whether to inject `kind` now (the first opportunity, then its probability, up to its cap)."""
        picked = self._pick((kind,))
        if picked is None or not self.state.tally(kind, self.spec.faults[kind].cap):
            return False
        self._satisfied.add(kind)
        return True

    def _after_activation(self, replay_ids: list[int], kinds: list[str]) -> None:
        """Sets activated in the round's transaction: die before its COMMIT? If not, remember where their
        messages are: the advance past them comes after the COMMIT."""
        messages = [t.end_lsn for t in self._slot_read if set(getattr(t, "replay_ids", ())) & set(replay_ids)]
        if self._set_fault(RELAY_CRASH_AFTER_SET_ACTIVATION):
            self._record(RELAY_CRASH_AFTER_SET_ACTIVATION, "activate", replay_ids=replay_ids, set_kinds=kinds)
            raise ChaosCrash(f"chaos: {self.function} dies after activating a replay set, before COMMIT")
        if messages:
            self._activated = (min(messages), replay_ids, kinds)

    def _before_advance(self, lsn: int) -> None:
        """The slot is about to pass a message whose set this round activated (committed by now): die
        before it does?"""
        activated, self._activated = self._activated, None
        if activated is None or lsn < activated[0]:
            self._activated = activated  # not past it yet (the advance before the COMMIT)
            return
        if self._set_fault(RELAY_CRASH_BEFORE_PASSING_SET):
            _, replay_ids, kinds = activated
            self._record(
                RELAY_CRASH_BEFORE_PASSING_SET,
                "advance_slot",
                replay_ids=replay_ids,
                set_kinds=kinds,
                message_lsn=f"{activated[0] >> 32:X}/{activated[0] & 0xFFFFFFFF:X}",
            )
            raise ChaosCrash(f"chaos: {self.function} dies after a set's activation committed")

    def _after_set_chunk(self, cursor: Any, positions: list[int], kinds: list[str]) -> None:
        """Rows of the replay sets on the bus (or parked) and taken out of their sets: die before COMMIT?"""
        if not self._set_fault(RELAY_CRASH_AFTER_SET_CHUNK):
            return
        cursor.execute("SELECT event_id FROM outbox WHERE position = ANY(%s) ORDER BY position", (positions,))
        ids = [str(event_id) for (event_id,) in cursor.fetchall()]
        self._record(RELAY_CRASH_AFTER_SET_CHUNK, "mark_done", event_ids=ids, set_kinds=kinds)
        raise ChaosCrash(f"chaos: {self.function} dies after a chunk of a replay set, before COMMIT")

    def _after_advance(self, before: int, lsn: int) -> None:
        """The slot now stands past the rows of the transactions it just confirmed: die before COMMIT?"""
        rows = [row for t in self._slot_read if before < t.end_lsn <= lsn for row in t.rows]
        ids = [str(row.event_id) for row in rows]
        if not ids:
            return  # past WAL without outbox rows: no event's delivery rests on this advance
        kind = self._pick(SLOT_KINDS)
        if kind is None or not self._claim(kind, ids):
            return
        self._record(
            kind,
            "advance_slot",
            event_ids=ids,
            positions=[int(row.position) for row in rows],
            confirmed_lsn=f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}",  # as pg_lsn prints it
        )
        raise ChaosCrash(f"chaos: {self.function} dies after its slot advance, before COMMIT")
