"""OrderStore=postgres: the relay's operations mid-drive, as a deploy and an operator run them.

- A relay switch (PostgresRelay changed by a deploy, tools/chaos/deploy.py): the migration function
  (OrderDatabaseMigrationFunction) gets CloudFormation's Update of OrderDatabaseSchema with the new
  RelayMode and runs `switch_relay` with its own arguments and timeouts; once it answered SUCCESS the
  functions that read POSTGRES_RELAY (publisher, maintenance) get the new value (`redeploy`), and
  meanwhile a publisher of the old configuration publishes nothing (RelayModeMismatch). A deploy
  answered FAILED is rolled back (an Update back, answered "already ...") and deployed again, up to
  DEPLOY_ATTEMPTS times: each failed one must have left the relay as it was.
  At each step of a switch the migration function's hooks (tools/chaos/faults_migration.py, role migration)
  arm a crash of the publisher: its next PutEvents goes through, then the process dies before COMMIT (or
  the slot advance); before a step that waits for the rounds in progress (creating the slot, locking the
  outbox or the slot) the armed round holds its locks HOLD_SECONDS and the switch goes on once a
  publisher took the arm, so the step waits on a round that dies. The hooks also write a poison row
  pending at each handover (`poison_at_handover`).
- A replay by window (`python -m operations replay --from --to` for the order database: the request it
  sends the maintenance function, OrderStoreMaintenanceFunction): everything written since the run
  began. On the logical relay it is a replay set drained across rounds while the orders keep coming. A
  replay answered "retry shortly" (a connection the database restart broke) is run again, as an
  operator would.
A switch away from the run's relay that is due while a replay's set drains waits until half of the set
is out, then hands the rest back (to polling: the set's rows pending again). The database restart and
the operations never run at once (publishers.RestartGate). Each operation is a line of the ledger
(operation.relay_switch, operation.replay); the report gives each one's figures and each armed crash's
fate, and check_operations.py's relay_operations holds them to what they claim.
"""

from __future__ import annotations

import functools
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from tools.chaos import poison
from tools.chaos.bus import BusCapture
from tools.chaos.deploy import redeploy, update_request
from tools.chaos.evidence import (
    Evidence,
    OperationsEvidence,
    ReplayOutcome,
    SwitchOutcome,
    capture_lag,
    quantiles,
)
from tools.chaos.faults_migration import clear_switch, write_switch
from tools.chaos.injection import Arms
from tools.chaos.ledger import Ledger
from tools.chaos.plan import (
    OPERATION_RELAY_SWITCH,
    OPERATION_REPLAY,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
)
from tools.chaos.poison import PoisonItem
from tools.chaos.postgres_store import PostgresOrderStore, poison_row, poison_row_details
from tools.chaos.publishers import RestartGate
from tools.chaos.snapshot import ORDERS_SIDE
from tools.local.services.custom_resources import ResponseServer
from tools.local.stack import LocalStack

MIGRATION_FUNCTION = "OrderDatabaseMigrationFunction"
MAINTENANCE_FUNCTION = "OrderStoreMaintenanceFunction"
PUBLISHER = "OutboxPublisherFunction"
RELAY_VARIABLE = "POSTGRES_RELAY"
# The functions whose behaviour follows PostgresRelay (the others only carry it in their environment).
FOLLOW_THE_RELAY = (PUBLISHER, MAINTENANCE_FUNCTION)
HOLD_SECONDS = 2.0  # an armed round holds its locks this long before it dies (lock waits allow 10 s)
ARM_WAIT_SECONDS = 10.0  # a step waits this long for a publisher to take its arm, then goes on without
ANSWER_WAIT_SECONDS = 5.0  # for the answer's PUT after the function returned
DEPLOY_ATTEMPTS = 5  # a switch answered FAILED is rolled back and deployed again, up to this many times
DEPLOY_AGAIN_SECONDS = 15.0
MIN_RELAY_SECONDS = 3.0  # a switch starts at least this long after the one before ended
REPLAY_HALF_WAIT_SECONDS = 120.0  # a switch waits at most this long for half of a replay set to go out
SWITCH_WAIT_SECONDS = 600.0  # a replay waits at most this long for the switches due before it
REPLAY_ATTEMPTS = 3  # the operator runs the replay again when it answers "retry shortly" (ServiceBusy)
RETRY_SHORTLY = "ServiceBusy"  # the error type of the product's "the order database is unavailable"
REPLAY_WINDOW_SLACK_SECONDS = 60.0  # the window starts this long before the run began
REPLAY_BUS_WAIT_SECONDS = 900.0  # for every replayed event to be on the bus again
_POLL_SECONDS = 0.5
_AROUND_SETS = (RELAY_CRASH_AFTER_SET_ACTIVATION, RELAY_CRASH_BEFORE_PASSING_SET, RELAY_CRASH_AFTER_SET_CHUNK)

_HANDED = (
    re.compile(r"(\d+) pending rows handed to the logical relay"),
    re.compile(r"(\d+) rows the slot or a replay still held left pending"),
)
# The replay sets (kind replay) recorded after a given one: whether the relay activated each, its rows.
_REPLAY_SETS = """
SELECT s.replay_id, s.activated_at IS NOT NULL, count(r.position)
FROM outbox_replay AS s LEFT JOIN outbox_replay_rows AS r ON r.replay_id = s.replay_id
WHERE s.kind = 'replay' AND s.replay_id > %s
GROUP BY s.replay_id
"""
_LAST_SET = "SELECT coalesce(max(replay_id), 0) FROM outbox_replay"


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _rounded(seconds: float | None) -> float | None:
    return round(seconds, 1) if seconds is not None else None


@dataclass
class SwitchRecord:
    label: str
    relay_from: str
    relay_to: str
    due_at_order: int
    began: float = 0.0  # epoch seconds: the first Update sent
    ended: float = 0.0  # the last answer received and the functions redeployed
    waited_for_replay_seconds: float = 0.0
    replay_set_rows_at_start: int | None = None  # rows a draining replay set still named when it began
    status: str | None = None  # the last deploy's answer's Status (None: no answer)
    reason: str = ""  # its Reason, or the function's error
    rows_handed_over: int | None = None  # from the answer's reason
    environments_retired: dict[str, int] = field(default_factory=dict)
    mode_after: str | None = None
    slot_after: bool | None = None
    poison_rows_at_handover: list[str] = field(default_factory=list)  # event ids written, every deploy's
    attempts: int = 0  # deploys
    failed: list[dict[str, Any]] = field(default_factory=list)  # each failed deploy: reason, mode after
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def to_dict(self) -> dict[str, Any]:
        figures = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "done"}
        figures["seconds"] = round(self.ended - self.began, 2) if self.ended else None
        figures["began"], figures["ended"] = (_iso(t) if t else None for t in (self.began, self.ended))
        figures["waited_for_replay_seconds"] = round(self.waited_for_replay_seconds, 1)
        return figures


@dataclass
class ReplayRecord:
    label: str
    due_at_order: int
    began: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)
    sets_before: int = 0  # the last replay set's id before it: its own sets come after
    answer: dict[str, Any] = field(default_factory=dict)  # the maintenance function's
    error: str | None = None
    answered_seconds: float | None = None
    attempts: int = 0
    retried_after: list[str] = field(default_factory=list)
    # Its replay sets as the relay drained them (sampled): rows at the largest, when the relay activated
    # them, when they named no row (drained, or handed back by a switch), when every event it replayed
    # was on the bus again.
    set_rows_peak: int = 0
    set_activated_at: float | None = None
    set_empty_at: float | None = None
    back_on_bus_seconds: float | None = None
    answered: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def replayed(self) -> list[str]:
        return [str(event_id) for event_id in self.answer.get("reset", [])]

    def since_began(self, moment: float | None) -> float | None:
        return _rounded(moment - self.began) if moment is not None else None


class RelayOperations:
    """The switches and replays of one run, each in a thread of its own, due at an order's index."""

    def __init__(
        self,
        stack: LocalStack,
        store: PostgresOrderStore,
        capture: BusCapture,
        ledger: Ledger,
        state_dir: Path,
        relay: str,
        say: Callable[[str], None],
        poison_items: list[PoisonItem],
        *,
        poison_at_handover_bytes: int | None = None,
        gate: RestartGate | None = None,
    ) -> None:
        self._stack = stack
        self._store = store
        self._capture = capture
        self._ledger = ledger
        self._state_dir = state_dir
        self.relay = relay  # the run's relay: where the switches come back to
        self._say = say
        # The run's injected poison: a handover's poison row joins it once it is written.
        self._poison_items = poison_items
        self._poison_at_handover_bytes = poison_at_handover_bytes  # its size bound; None: none written
        self._gate = gate or RestartGate()
        self._switching = threading.Lock()  # one deploy at a time, as CloudFormation runs them
        self._threads: list[threading.Thread] = []
        self._answers = ResponseServer("chaos-cfn-answers")
        self.switches: list[SwitchRecord] = []
        self.replays: list[ReplayRecord] = []
        self.errors: list[str] = []
        self.began = time.time()

    # --- scheduling ------------------------------------------------------------------------------
    def schedule(
        self,
        orders: int,
        at: dict[int, list[Callable[[], None]]],
        switches_at: tuple[float, float] | None,
        replays_at: tuple[float, ...],
    ) -> None:
        """The replays, and a switch away from the run's relay and one back, at their shares of the
        orders sent (`at`: the drive's actions by order index)."""

        def index(share: float) -> int:
            return min(orders - 1, int(share * orders))

        for due in (index(share) for share in replays_at):
            at.setdefault(due, []).append(functools.partial(self.replay_at, due))
        if switches_at is not None:
            other = "polling" if self.relay == "logical" else "logical"
            away, back = (index(share) for share in switches_at)
            at.setdefault(away, []).append(lambda: self.switch_at(away, other))
            at.setdefault(back, []).append(lambda: self.switch_at(back, self.relay))

    def _start(self, name: str, work: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - reported with the run (its check), not raised here
                self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=guarded, name=f"chaos-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def switch_at(self, index: int, relay_to: str) -> None:
        """A deploy switching to `relay_to`, now (in a thread; after the switch before it)."""
        relay_from = "polling" if relay_to == "logical" else "logical"
        record = SwitchRecord(f"to {relay_to} #{len(self.switches) + 1}", relay_from, relay_to, index)
        self.switches.append(record)
        self._start(f"switch-{len(self.switches)}", lambda: self._switch(record))

    def replay_at(self, index: int) -> None:
        """The operator's replay of everything written since the run began, now (in a thread)."""
        record = ReplayRecord(f"replay #{len(self.replays) + 1}", index)
        self.replays.append(record)
        self._start(record.label.replace(" #", "-"), lambda: self._replay(record))

    def busy(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._answers.close()

    # --- the switch ------------------------------------------------------------------------------
    def _switch(self, record: SwitchRecord) -> None:
        try:
            self._deploy_switch(record)
        finally:
            record.done.set()

    def _deploy_switch(self, record: SwitchRecord) -> None:
        with self._switching:
            began_waiting = time.monotonic()
            if record.relay_from == self.relay:  # away from the run's relay: meet a draining replay
                record.replay_set_rows_at_start = self._wait_for_half_of_a_replay()
            record.waited_for_replay_seconds = time.monotonic() - began_waiting
            previous = [s for s in self.switches if s.ended and s is not record]
            if previous:
                time.sleep(max(0.0, previous[-1].ended + MIN_RELAY_SECONDS - time.time()))
            record.began = time.time()
            for attempt in range(1, DEPLOY_ATTEMPTS + 1):
                record.attempts = attempt
                if self._deploy(record) == "SUCCESS":
                    break
                # CloudFormation rolls the stack back (an Update with the properties before: the relay it
                # has), and the operator deploys again a while later.
                rollback = self._update(record, record.relay_to, record.relay_from, arm=False)
                record.failed.append(
                    {
                        "reason": record.reason,
                        "mode_after": self._store.when_available(self._relay_state)[0],
                        "rollback": rollback["Status"],
                        "rollback_reason": rollback["Reason"],
                    }
                )
                if attempt < DEPLOY_ATTEMPTS:
                    time.sleep(DEPLOY_AGAIN_SECONDS)
            if record.status == "SUCCESS":
                for function in FOLLOW_THE_RELAY:
                    runtime = self._stack.functions.get(function)
                    if runtime is not None:
                        record.environments_retired[function] = redeploy(
                            runtime, {RELAY_VARIABLE: record.relay_to}
                        )
            record.ended = time.time()
            record.mode_after, record.slot_after = self._store.when_available(self._relay_state)
            self._say(
                f"relay switch {record.label}: {record.status or 'no answer'} after {record.attempts} "
                f"deploy(s), {record.ended - record.began:.1f} s ({record.reason})"
            )

    def _deploy(self, record: SwitchRecord) -> str | None:
        """One deploy of the switch: its Update, with the crashes and the poison row armed; its Status."""
        self._say(f"relay switch {record.label}: the migration function's Update, deploy {record.attempts}")
        item, row = None, None
        if self._poison_at_handover_bytes is not None:
            item, values = poison_row(poison.INVALID_ENVELOPE, self._poison_at_handover_bytes)
            row = {"values": values, "details": poison_row_details(item, values)}
        answer = self._update(record, record.relay_from, record.relay_to, arm=True, poison_row=row)
        record.status, record.reason = answer["Status"], answer["Reason"]
        for pattern in _HANDED:
            if found := pattern.search(record.reason):
                record.rows_handed_over = int(found.group(1))
        if item is not None and self._store.when_available(
            lambda c: _count(c, "SELECT count(*) FROM outbox WHERE event_id = %s", item.event_id)
        ):
            # Written (a failed switch to logical rolled it back with its handover): injected poison.
            record.poison_rows_at_handover.append(item.event_id)
            self._poison_items.append(item)
        return record.status

    def _update(
        self,
        record: SwitchRecord,
        relay_from: str,
        relay_to: str,
        *,
        arm: bool,
        poison_row: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """CloudFormation's Update of OrderDatabaseSchema from `relay_from` to `relay_to`, sent to the
        migration function: its answer's Status (None: no answer came) and Reason. With `arm`, the
        switch's steps arm the publisher's crashes and write the poison row (faults_migration.py)."""
        if arm:
            write_switch(
                self._state_dir,
                switch=record.label,
                to=relay_to,
                function=PUBLISHER,
                hold_seconds=HOLD_SECONDS,
                arm_wait_seconds=ARM_WAIT_SECONDS,
                poison_row=poison_row,
            )
        request_id = str(uuid.uuid4())
        event = update_request(
            self._stack.template, relay_from, relay_to, self._answers.url(request_id), request_id
        )
        self._ledger.append(
            OPERATION_RELAY_SWITCH,
            MIGRATION_FUNCTION,
            "Update",
            switch=record.label,
            relay_from=relay_from,
            relay_to=relay_to,
            at_order=record.due_at_order,
            deploy=record.attempts,
            rollback=not arm,
        )
        try:
            with self._gate.operation():
                result = self._stack.invoke(MIGRATION_FUNCTION, event)
        finally:
            clear_switch(self._state_dir)
        answer = self._answers.response(request_id, ANSWER_WAIT_SECONDS)
        if answer is None:
            error = f"{result.error.error_type}: {result.error.message}" if result.error else "none"
            return {"Status": None, "Reason": f"no answer (the function's error: {error})"[:500]}
        return {"Status": answer.get("Status"), "Reason": str(answer.get("Reason", ""))}

    def _relay_state(self, connection: psycopg.Connection) -> tuple[str | None, bool]:
        found = connection.execute("SELECT mode FROM outbox_relay").fetchone()
        slot = connection.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self._store.slot,)
        ).fetchone()
        return (str(found[0]) if found else None), slot is not None

    def _wait_for_half_of_a_replay(self) -> int | None:
        """When a replay's set drains now: wait until half of it is out (REPLAY_HALF_WAIT_SECONDS at
        most); the rows its sets still name then (None: no replay set drains)."""
        draining = [r for r in self.replays if r.set_empty_at is None]
        if not draining:
            return None
        record = draining[-1]
        deadline = time.monotonic() + REPLAY_HALF_WAIT_SECONDS
        while True:
            remaining = self._set_rows(record)
            if remaining is None and record.answered.is_set():
                return None  # no set recorded: the polling publisher replays by its marks
            if remaining is not None and remaining * 2 <= record.set_rows_peak:
                return remaining
            if time.monotonic() > deadline:
                return remaining
            time.sleep(_POLL_SECONDS)

    def _set_rows(self, record: ReplayRecord) -> int | None:
        """Rows `record`'s replay sets still name (None: none recorded yet); samples its figures."""
        later = [r.sets_before for r in self.replays if r.began > record.began and r.sets_before]
        try:
            sets = self._store.when_available(
                lambda c: c.execute(_REPLAY_SETS, (record.sets_before,)).fetchall()
            )
        except psycopg.Error:
            return None
        sets = [each for each in sets if not later or each[0] <= min(later)]
        if not sets and not record.set_rows_peak:
            return None
        remaining = sum(int(rows) for _, _, rows in sets)
        record.set_rows_peak = max(record.set_rows_peak, remaining)
        if record.set_activated_at is None and any(active for _, active, _ in sets):
            record.set_activated_at = time.time()
        if remaining == 0 and record.set_empty_at is None:
            record.set_empty_at = time.time()
        return remaining

    # --- the replay ------------------------------------------------------------------------------
    def _replay(self, record: ReplayRecord) -> None:
        # After the switches due before it (one waits for half of an earlier replay's set, and the
        # operator does not replay while a deploy is under way).
        deadline = time.monotonic() + SWITCH_WAIT_SECONDS
        for switch in [s for s in self.switches if s.due_at_order < record.due_at_order]:
            switch.done.wait(max(0.0, deadline - time.monotonic()))
        record.began = time.time()
        record.window = (self.began - REPLAY_WINDOW_SLACK_SECONDS, record.began)
        start, end = (_iso(moment) for moment in record.window)
        record.sets_before = self._store.when_available(lambda c: _count(c, _LAST_SET, None))
        self._ledger.append(
            OPERATION_REPLAY,
            MAINTENANCE_FUNCTION,
            "replay",
            window=[start, end],
            at_order=record.due_at_order,
        )
        self._say(f"{record.label} of {start} .. {end}: the order database, through its maintenance function")
        sampler = threading.Thread(
            target=self._sample_sets, args=(record,), name="chaos-replay-sets", daemon=True
        )
        sampler.start()
        try:
            for attempt in range(1, REPLAY_ATTEMPTS + 1):
                record.attempts = attempt
                with self._gate.operation():
                    result = self._stack.invoke(MAINTENANCE_FUNCTION, {"replay": {"from": start, "to": end}})
                error = result.error
                if error is None or error.error_type != RETRY_SHORTLY or attempt == REPLAY_ATTEMPTS:
                    break
                # "the order database is unavailable; retry shortly": the operator runs it again (a set
                # recorded before the error is drained too: its rows go out twice).
                record.retried_after.append(f"{error.error_type}: {error.message}"[:300])
                time.sleep(1.0)
        finally:
            record.answered_seconds = time.time() - record.began
            record.answered.set()
        if result.error is not None:
            record.error = f"{result.error.error_type}: {result.error.message}"[:500]
        elif isinstance(result.payload, dict):
            record.answer = result.payload
            if refused := record.answer.get("error"):
                record.error = f"refused: {refused}"
        self._say(
            f"{record.label} answered in {record.answered_seconds:.1f} s: {len(record.replayed)} events "
            f"replayed, {len(record.answer.get('stillPending', []))} still pending then"
        )
        deadline = time.monotonic() + REPLAY_BUS_WAIT_SECONDS
        while record.replayed and time.monotonic() < deadline:
            # A poison row it replayed (not parked yet when it read it) is parked, never put.
            ids = set(record.replayed) - {item.event_id for item in self._poison_items}
            events = self._capture.snapshot()
            if all(i in events and events[i].last_at >= record.began for i in ids):
                record.back_on_bus_seconds = time.time() - record.began
                break
            time.sleep(1.0)
        sampler.join(REPLAY_BUS_WAIT_SECONDS)

    def _sample_sets(self, record: ReplayRecord) -> None:
        deadline = time.monotonic() + REPLAY_BUS_WAIT_SECONDS
        while time.monotonic() < deadline:
            remaining = self._set_rows(record)
            if record.answered.is_set() and not remaining:
                return
            time.sleep(_POLL_SECONDS)

    # --- evidence and figures --------------------------------------------------------------------
    def evidence(self, mode: str | None) -> OperationsEvidence:
        """What the checks hold the operations to (check_operations.py, relay_operations); `mode`: the
        outbox's relay after the drain."""
        return OperationsEvidence(
            switches=[
                SwitchOutcome(s.label, s.relay_to, s.status, s.reason, s.relay_from, s.failed)
                for s in self.switches
            ],
            replays=[
                ReplayOutcome(
                    r.label,
                    r.began,
                    r.window,
                    r.error,
                    r.replayed,
                    {reason: [str(i) for i in r.answer.get(reason, [])] for reason in _NAMED},
                )
                for r in self.replays
            ],
            final_mode=mode,
            expected_mode=self.relay,
            errors=list(self.errors),
        )

    def figures(self, evidence: Evidence) -> dict[str, Any]:
        """The report's: each switch and replay, and the publisher's crashes around them."""
        arms: dict[str, Counter[str]] = {}
        for arm in Arms(self._state_dir, PUBLISHER).all():
            fate = "crashed" if arm["taken_at"] else "withdrawn" if arm["withdrawn"] else "never taken"
            arms.setdefault(f"{arm.get('switch')}: {arm.get('point')}", Counter())[fate] += 1
        around_sets: dict[str, Counter[str]] = {kind: Counter() for kind in _AROUND_SETS}
        for entry in evidence.ledger:
            if entry["kind"] in around_sets:
                for set_kind in entry.get("set_kinds") or ["unknown"]:
                    around_sets[entry["kind"]][str(set_kind)] += 1
        return {
            "switches": [switch.to_dict() for switch in self.switches],
            "switches_done": sum(1 for s in self.switches if s.status == "SUCCESS"),
            "crashes_around_switch_steps": {point: dict(fates) for point, fates in arms.items()},
            "crashes_around_switch_steps_in_the_ledger": sum(
                1 for entry in evidence.ledger if entry["kind"] == RELAY_CRASH_AROUND_SWITCH
            ),
            "crashes_around_replay_sets": {kind: dict(by_set) for kind, by_set in around_sets.items()},
            "replays": [self._replay_figures(record, evidence) for record in self.replays],
            "replayed_events": sum(len(record.replayed) for record in self.replays),
            "errors": list(self.errors),
        }

    def _replay_figures(self, record: ReplayRecord, evidence: Evidence) -> dict[str, Any]:
        answer = record.answer
        # The order events written from the replay until its events were all on the bus again: the
        # replay's set must not hold them back.
        until = record.began + (record.back_on_bus_seconds or 0.0)
        during = [
            lag
            for r in evidence.snapshot.outbox
            if r.table == ORDERS_SIDE
            and r.created_at is not None
            and record.began <= r.created_at <= until
            and (lag := capture_lag(r, evidence)) is not None
        ]
        return {
            "label": record.label,
            "at_order": record.due_at_order + 1,
            "window": [_iso(moment) for moment in record.window],
            "replayed": len(record.replayed),
            **{f"left_out_{reason}": len(answer.get(reason, [])) for reason in _NAMED},
            "still_pending_when_it_answered": len(answer.get("stillPending", [])),
            "complete": answer.get("complete"),
            "answered_seconds": _rounded(record.answered_seconds),
            "attempts": record.attempts,
            "retried_after": record.retried_after,
            "error": record.error,
            "set_rows_peak": record.set_rows_peak,
            "set_activated_seconds": record.since_began(record.set_activated_at),
            "set_empty_seconds": record.since_began(record.set_empty_at),
            "all_back_on_the_bus_seconds": _rounded(record.back_on_bus_seconds),
            "order_events_written_until_then": {
                "events": len(during),
                "bus_capture_lag_seconds": quantiles(during),
            },
        }


# What a replay's answer names beside the events it replayed (shop.adapters.postgres.outbox.ReplaySelection):
# pending rows go out anyway (the polling publisher's), the others are left out.
_NAMED = ("parked", "pending", "expired", "missing")


def _count(connection: psycopg.Connection, sql: str, value: Any) -> int:
    found = connection.execute(sql, (value,) if value is not None else None).fetchone()
    return int(found[0]) if found else 0
