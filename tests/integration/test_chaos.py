"""A small chaos run (tools/chaos/, `make chaos`) through the local stack, on each order store: every fault
kind is injected, the pipeline drains, and every invariant holds. `make chaos` (ORDER_STORE=postgres for
the PostgreSQL store) runs the same harness at full size. First, the harness's own logic, without a stack."""

from __future__ import annotations

import copy
import importlib
import json
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from botocore.client import BaseClient

from shop.adapters.postgres import replication
from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.replication import DecodedTransaction, SlotChanges
from shop.domain.errors import InvalidEnvelope
from shop.domain.outbox import outbox_entry
from tools.chaos import faults, faults_migration, faults_relay, injection, poison
from tools.chaos.bus import CapturedEvent, capture_patterns
from tools.chaos.check import evaluate
from tools.chaos.check_dead_letters import comparable_item, parked_key
from tools.chaos.config import ChaosConfig
from tools.chaos.driver import Driver
from tools.chaos.evidence import Check, Evidence, OperationsEvidence, ReplayOutcome, SwitchOutcome
from tools.chaos.fault_plan import fault_plan, roles
from tools.chaos.harness import Run, run
from tools.chaos.plan import (
    API_KINDS,
    API_STALE_CANCEL,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_WRITE,
    HARNESS_KINDS,
    MIGRATION,
    OPERATION_FAULT_KINDS,
    OPERATION_KINDS,
    PLAN_ENV,
    POSTGRES_HARNESS_KINDS,
    POSTGRES_NOT_APPLICABLE,
    RELAY,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_BEFORE_PASSING_SET,
    RELAY_KINDS,
    SLOT_KINDS,
    WORKER_KINDS,
    FaultSpec,
    FunctionPlan,
    Plan,
    not_applicable,
)
from tools.chaos.publishers import PUBLISHER, RestartGate
from tools.chaos.relay_operations import MIGRATION_FUNCTION
from tools.chaos.report import render, save
from tools.chaos.snapshot import (
    INVENTORY_SIDE,
    ORDERS_SIDE,
    PARKED,
    PENDING,
    PUBLISHED,
    OutboxRecord,
    Snapshot,
    postgres_row_key,
)
from tools.chaos.topology import chaos_template
from tools.local.pollers.event_sources import read_event_sources
from tools.local.services.emulators import LocalServices
from tools.local.services.order_database import EmbeddedPostgres

ORDERS_SOURCE, INVENTORY_SOURCE = "shop.orders", "shop.inventory"


# --- the harness's logic, without a stack --------------------------------------------------------------
def test_without_a_plan_nothing_is_wrapped():
    before = vars(BaseClient)["_make_api_call"]

    assert faults.install({}) is None
    assert faults.install({PLAN_ENV: "", "AWS_LAMBDA_FUNCTION_NAME": "chaos-OrdersApiFunction"}) is None
    assert vars(BaseClient)["_make_api_call"] is before


def _event(
    event_id: str, subject: str, sequence: int, source: str = ORDERS_SOURCE, **more: Any
) -> dict[str, Any]:
    return {
        "id": event_id,
        "source": source,
        "type": "OrderCreated",
        "subject": subject,
        "sequence": sequence,
        **more,
    }


def _evidence(
    outbox: list[OutboxRecord],
    bus: dict[str, CapturedEvent] | None = None,
    *,
    order_store: str = "postgres",
    **fields: Any,
) -> Evidence:
    snapshot = Snapshot(order_store=order_store, outbox=outbox)
    if bus is None:
        bus = {str(r.envelope["id"]): CapturedEvent(r.envelope, 1) for r in outbox if r.live and r.envelope}
    defaults: dict[str, Any] = {
        "snapshot": snapshot,
        "bus": bus,
        "foreign_bus_messages": [],
        "notifications": Counter(),
        "unreadable_notifications": [],
        "ledger": [],
        "outcomes": [],
        "initial_stock": {},
        "poison_items": [],
        "malformed": [],
        "relay_dlq": [],
        "relay_dlq_keys": [],
        "consumer_dlqs": {},
        "harness_errors": [],
    }
    return Evidence(**{**defaults, **fields})


def _check(evidence: Evidence, name: str) -> Check:
    return next(check for check in evaluate(evidence) if check.name == name)


def _row(envelope: dict[str, Any], state: str = PUBLISHED, position: int = 1) -> OutboxRecord:
    pk, sk = postgres_row_key(envelope["subject"], envelope["sequence"], envelope["id"])
    return OutboxRecord(ORDERS_SIDE, pk, sk, envelope, state=state, position=position)


def test_an_order_whose_event_first_reached_the_bus_before_an_earlier_one_is_out_of_order():
    first, second = _event("e1", "o-1", 1), _event("e2", "o-1", 2)
    other = _event("e3", "o-2", 1)
    outbox = [_row(first), _row(second, position=2), _row(other, position=3)]
    # Put again after a crash (1, 2, 1, 2): the first arrivals are in order, the repeats do not count.
    in_order = {
        "e1": CapturedEvent(first, 2, first_arrival=0),
        "e2": CapturedEvent(second, 2, first_arrival=1),
    }
    in_order["e3"] = CapturedEvent(other, 1, first_arrival=2)
    swapped = {**in_order, "e1": CapturedEvent(first, 1, first_arrival=5)}

    kept = _check(
        _evidence(outbox, in_order, in_order_sources=frozenset({ORDERS_SOURCE})), "published_in_order"
    )
    broken = _check(
        _evidence(outbox, swapped, in_order_sources=frozenset({ORDERS_SOURCE})), "published_in_order"
    )
    not_promised = _check(_evidence(outbox, swapped, in_order_sources=frozenset()), "published_in_order")

    assert kept.ok
    assert kept.figures["aggregates"] == 2
    assert not broken.ok
    assert "o-1" in broken.violations[0]
    assert broken.figures["out_of_order"] == 1
    assert not_promised.ok
    assert not_promised.figures["events"] == 0


def test_a_row_left_pending_or_parked_without_being_poison_fails_and_a_parked_row_is_no_event():
    published = _event("e1", "o-1", 1)
    pending = _event("e2", "o-1", 2)
    parked = _event("e3", "o-2", 1)
    outbox = [_row(published), _row(pending, PENDING, 2), _row(parked, PARKED, 3)]
    evidence = _evidence(outbox, {"e1": CapturedEvent(published, 1), "e2": CapturedEvent(pending, 1)})

    lost = _check(evidence, "no_lost_events")
    dead_letters = _check(evidence, "dead_letters_exact")

    # On the bus, not marked: still pending (the publisher's COMMIT never came).
    assert lost.figures == {"lost": 0, "outbox_events": 2, "pending_rows": 1}
    assert any("still pending" in v for v in lost.violations)
    assert "e3" not in evidence.snapshot.decodable()  # parked: to be in the poison queue, not on the bus
    assert any("it is no injected poison" in v for v in dead_letters.violations)


def _parked_message(item: dict[str, Any], at: float) -> str:
    parked_at = datetime.fromtimestamp(at, UTC).isoformat()
    return json.dumps(
        {"kind": "outbox-poison", "eventId": item["eventId"], "parkedAt": parked_at, "item": item}
    )


def test_a_poison_row_parked_again_is_explained_only_by_a_rollback_between_the_two_parks():
    created = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    item = {
        "store": "postgres",
        "position": 7,
        "eventId": "p-1",
        "aggregateId": "chaos-poison-1",
        "sequence": 1,
        "envelope": '{"specversion": "1.0", "id": "p-1", "type": "OrderCreated"}',
        "traceHeader": None,
        "createdAt": created.isoformat(),
        "attempts": 0,
    }
    key = postgres_row_key("chaos-poison-1", 1, "p-1")
    row = OutboxRecord(ORDERS_SIDE, *key, None, state=PARKED, position=7, item=comparable_item(item))
    injected = poison.PoisonItem(poison.POSTGRES_OUTBOX, *key, "p-1", poison.INVALID_ENVELOPE)
    parks = [_parked_message(item, 1000.0), _parked_message(item, 1003.0)]

    def dead_letters(**fields: Any) -> Check:
        evidence = _evidence(
            [row],
            poison_items=[injected],
            relay_poison_queue=parks,
            poison_table_items={key: row.item},
            **fields,
        )
        return _check(evidence, "dead_letters_exact")

    crash = {"at": 1001.5, "kind": RELAY_CRASH_AFTER_PUT, "function": PUBLISHER, "event_ids": []}
    assert parked_key(json.loads(parks[0])) == key
    assert dead_letters(ledger=[crash]).figures["poison_parked_again_after_rollback"] == 1
    assert dead_letters(ledger=[crash]).ok
    assert dead_letters(database_outages=[(1002.0, 1002.8)]).ok
    # The stream relay dying after a PutEvents call redelivers its batch, which parks its poison again.
    assert dead_letters(ledger=[{**crash, "function": "OutboxRelayFunction"}]).ok
    late_crash = {**crash, "at": 1010.0}  # after both parks: explains neither
    assert any("parked 2 times" in v for v in dead_letters(ledger=[late_crash]).violations)


def test_the_inbox_holds_exactly_the_causes_of_the_order_changes():
    reserved = _event("i1", "o-1", 1, source=INVENTORY_SOURCE)
    confirmed = _event("e2", "o-1", 2, causationid="i1")
    rejected_cause = _event("i2", "o-2", 1, source=INVENTORY_SOURCE)
    outbox = [
        _row(_event("e1", "o-1", 1)),
        _row(confirmed, position=3),
        OutboxRecord(INVENTORY_SIDE, "R#o-1", "OUTBOX#1", reserved),
        OutboxRecord(INVENTORY_SIDE, "R#o-2", "OUTBOX#1", rejected_cause),
    ]

    def effects(inbox: list[tuple[str, str]]) -> Check:
        evidence = _evidence(outbox)
        evidence.snapshot.inbox.extend(inbox)
        return _check(evidence, "effects_once")

    assert effects([("order-status", "i1")]).figures["inbox_rows"] == 1
    assert effects([("order-status", "i1")]).ok
    assert any("without its inbox row" in v for v in effects([]).violations)
    assert any(
        "changed no order" in v for v in effects([("order-status", "i1"), ("order-status", "i2")]).violations
    )


@pytest.mark.parametrize("variant", [poison.INVALID_ENVELOPE, poison.OVERSIZE])
def test_a_poison_row_is_json_the_publisher_refuses(variant: str):
    limit = 4096

    envelope = poison.postgres_envelope(variant, "p-1", "chaos-poison-1", 1, limit)

    assert isinstance(json.loads(envelope), dict)  # the column is json
    with pytest.raises(InvalidEnvelope) as refused:
        outbox_entry(envelope, limit)
    if variant == poison.OVERSIZE:
        assert refused.value.details["eventBytes"] == limit + 1
        outbox_entry(envelope, limit + 1)  # a byte more of room, and it is a publishable event


def test_with_postgres_the_publisher_is_a_relay_and_faults_without_their_hook_are_left_out(tmp_path: Path):
    config = ChaosConfig(orders=40, order_store="postgres")
    template = chaos_template(config)

    plan = fault_plan(config, template, tmp_path / "ledger", tmp_path / "state")

    assert template.parameter_values["OrderStore"] == "postgres"
    assert roles(config)[PUBLISHER] == RELAY
    assert PUBLISHER not in roles(ChaosConfig())
    assert set(plan.functions[PUBLISHER].faults) == set(RELAY_KINDS)
    assert plan.functions["OrdersApiFunction"].faults == {}
    assert set(plan.functions["OrderStatusFunction"].faults) == {CRASH_AFTER_COMPLETE}
    dynamodb = fault_plan(
        ChaosConfig(orders=40), chaos_template(ChaosConfig()), tmp_path / "l", tmp_path / "s"
    )
    assert CRASH_AFTER_WRITE in dynamodb.functions["OrderStatusFunction"].faults
    assert all(RELAY_CRASH_AFTER_ADVANCE not in f.faults for f in dynamodb.functions.values())  # no slot
    with pytest.raises(ValueError, match="order_store"):
        ChaosConfig(order_store="mysql")


def test_the_chaos_stack_s_consumer_queues_hide_a_message_only_a_little_longer_than_its_consumer_runs():
    """The stack as the run starts it (its template's views, as the local stack provisions the queues):
    a malformed message reaches its DLQ after maxReceiveCount x (the consumer's timeout + 5 s), not the
    template's 60 s each, so the drain's bound holds it."""
    template = chaos_template(ChaosConfig(orders=40))
    queues = read_event_sources(template).queues

    assert queues
    for source in queues:
        timeout = template.function(source.function).timeout
        assert template.properties(source.queue)["VisibilityTimeout"] == timeout + 5 < 60


def test_the_crash_after_a_slot_advance_is_planned_for_the_logical_relay_only(tmp_path: Path):
    logical = ChaosConfig(orders=40, order_store="postgres", postgres_relay="logical")
    polling = ChaosConfig(orders=40, order_store="postgres")
    templates = {
        relay: chaos_template(config) for relay, config in (("logical", logical), ("polling", polling))
    }
    plans = {
        relay: fault_plan(config, templates[relay], tmp_path / "ledger", tmp_path / "state").functions
        for relay, config in (("logical", logical), ("polling", polling))
    }

    assert templates["logical"].parameter_values["PostgresRelay"] == "logical"
    assert templates["polling"].parameter_values["PostgresRelay"] == "polling"
    # With the logical relay the run has its relay operations (a replay, a switch each way) by default:
    # the crashes around replay sets and switch steps, and the migration function arming the latter.
    assert set(plans["logical"][PUBLISHER].faults) == {
        *RELAY_KINDS,
        RELAY_CRASH_AFTER_ADVANCE,
        *OPERATION_FAULT_KINDS,
    }
    assert plans["logical"][PUBLISHER].faults[RELAY_CRASH_AFTER_ADVANCE].ensure  # at least once a run
    assert plans["logical"][MIGRATION_FUNCTION].role == MIGRATION
    assert MIGRATION_FUNCTION not in plans["polling"]
    without = ChaosConfig(orders=40, order_store="postgres", postgres_relay="logical", relay_operations=False)
    assert not without.operations
    assert MIGRATION_FUNCTION not in roles(without)
    # The stream relay (inventory's outbox) has no slot, whatever the order store's relay.
    assert set(plans["logical"]["OutboxRelayFunction"].faults) == set(RELAY_KINDS)
    assert set(plans["polling"][PUBLISHER].faults) == set(RELAY_KINDS)
    # Polling names it as not applicable, as the DynamoDB hooks are named on postgres.
    assert not_applicable(True, "polling") == {**POSTGRES_NOT_APPLICABLE, PUBLISHER: SLOT_KINDS}
    assert not_applicable(True, "logical") == POSTGRES_NOT_APPLICABLE
    assert not_applicable(False, "polling") == {}
    with pytest.raises(ValueError, match="needs order_store 'postgres'"):
        ChaosConfig(postgres_relay="logical")
    with pytest.raises(ValueError, match="postgres_relay must be one of"):
        chaos_template(ChaosConfig(order_store="postgres", postgres_relay="wal2json"))


def _slot_changes(*transactions: tuple[int, list[str]], read_to: int) -> SlotChanges:
    moment = datetime(2026, 11, 25, tzinfo=UTC)
    decoded = [
        DecodedTransaction(
            end,
            moment,
            [OutboxRow(n, event_id, "o-1", n, "{}", None, moment, 0) for n, event_id in enumerate(ids, 1)],
        )
        for end, ids in transactions
    ]
    return SlotChanges(decoded, read_to)


def _plan(tmp_path: Path, function: str, spec: FunctionPlan) -> Plan:
    return Plan(
        seed=1,
        stack_name="chaos",
        ledger=str(tmp_path / "ledger.jsonl"),
        state_dir=str(tmp_path / "state"),
        max_receive_count=5,
        client_timeout_seconds=3.0,
        idempotency_table="idempotency",
        business_tables=(),
        functions={function: spec},
    )


def _relay_injector(tmp_path: Path, kinds: set[str]) -> faults.Injector:
    """The fault injector of a publisher running the logical relay, each kind armed once, at once."""
    spec = FunctionPlan(RELAY, 70.0, {kind: FaultSpec(0.0, 1) for kind in kinds})
    return faults.Injector(_plan(tmp_path, PUBLISHER, spec), PUBLISHER, spec)


class _Slot:
    """A replication slot in memory behind a stand-in of the logical relay module (`relay`): its
    peek_changes hands out the reads queued; its advance_slot moves the confirmed position forward (noted
    in `calls`) and says whether it moved; replication.confirmed_lsn reads that position."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.confirmed = 100
        self.reads: list[SlotChanges] = []
        self.calls: list[str] = []
        self.relay = types.ModuleType("logical_relay_stand_in")
        self.relay.peek_changes = lambda cursor, name, limit: self.reads.pop(0)  # type: ignore[attr-defined]
        self.relay.advance_slot = self._advance  # type: ignore[attr-defined]
        monkeypatch.setattr(replication, "confirmed_lsn", lambda cursor, name: self.confirmed)

    def _advance(self, cursor: object, name: str, lsn: int) -> bool:
        self.calls.append(f"advance {lsn}")
        moved = lsn > self.confirmed
        self.confirmed = max(self.confirmed, lsn)
        return moved


def test_the_logical_relay_dies_after_a_slot_advance_past_outbox_rows_once_the_slot_has_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The hook on the logical relay module's advance_slot: the real advance first; a crash only when it
    moved the slot past outbox rows (the first such advance: `ensure`), each recorded, up to the cap."""
    injector = _relay_injector(tmp_path, {RELAY_CRASH_AFTER_ADVANCE})
    slot = _Slot(monkeypatch)
    module = slot.relay
    injector.wrap_slot(module)

    slot.reads.append(_slot_changes((200, []), read_to=300))  # WAL without outbox rows
    module.peek_changes(None, "s", 500)
    assert module.advance_slot(None, "s", 300) is True
    slot.reads.append(_slot_changes((400, ["e1", "e2"]), (450, ["e3"]), read_to=500))
    module.peek_changes(None, "s", 500)
    assert module.advance_slot(None, "s", 300) is False  # not moved: no crash either
    with pytest.raises(injection.ChaosCrash):
        module.advance_slot(None, "s", 400)  # past e1 and e2 (not e3)
    assert slot.confirmed == 400  # the advance happened before the crash
    assert module.advance_slot(None, "s", 500) is True  # the cap (1) is reached

    (entry,) = injector.ledger.entries()
    assert entry["kind"] == RELAY_CRASH_AFTER_ADVANCE
    assert entry["event_ids"] == ["e1", "e2"]
    assert entry["confirmed_lsn"] == "0/190"


def test_the_migration_function_arms_a_publisher_crash_at_each_step_of_a_switch(tmp_path: Path):
    """At each step of a switch the harness asked for (faults_migration.SWITCH_FILE), a crash of the
    publisher is armed; before a step that waits for the rounds in progress the switch goes on only once a
    publisher took it (withdrawn after the wait when none did). Without a request (the stack's Create)
    nothing."""
    spec = FunctionPlan(MIGRATION, 300.0, {})
    injector = faults.Injector(_plan(tmp_path, MIGRATION_FUNCTION, spec), MIGRATION_FUNCTION, spec)
    steps: list[str] = []
    module = types.ModuleType("relay_mode_stand_in")

    def switch_relay(connection: object, mode: str, slot: str, **options: Any) -> str:
        if mode == "logical":
            module._prepare_slot(connection, slot, None)
            module._to_logical(connection, slot)
        else:
            steps.append("handover")
            module._drop_slot(connection, slot, None)
        return f"switched to {mode}"

    def _prepare_slot(connection: object, slot: str, bounds: object) -> None:
        steps.append("slot created")

    def _to_logical(cursor: object, slot: str) -> str:
        steps.append("handover")
        return "handed over"

    def _drop_slot(connection: object, slot: str, bounds: object) -> bool:
        steps.append("slot dropped")
        return True

    module.switch_relay = switch_relay  # type: ignore[attr-defined]
    module._prepare_slot = _prepare_slot  # type: ignore[attr-defined]
    module._to_logical = _to_logical  # type: ignore[attr-defined]
    module._drop_slot = _drop_slot  # type: ignore[attr-defined]
    injector.wrap_switch(module)
    state = tmp_path / "state"
    arms = injection.Arms(state, PUBLISHER)

    assert module.switch_relay(None, "logical", "s") == "switched to logical"
    assert arms.all() == []  # nobody asked: the stack's own Create

    steps.clear()
    taken: list[tuple[str, list[str]]] = []
    stop = threading.Event()

    def publisher() -> None:  # a publisher publishing all the while: each PutEvents takes an arm
        while not stop.is_set():
            arm = arms.take(pid=1)
            if arm is not None:
                taken.append((str(arm["point"]), list(steps)))
            time.sleep(0.01)

    faults_migration.write_switch(
        state,
        switch="to logical #1",
        to="logical",
        function=PUBLISHER,
        hold_seconds=2.0,
        arm_wait_seconds=5.0,
    )
    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    module.switch_relay(None, "logical", "s")
    deadline = time.monotonic() + 5
    while len(taken) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join()

    # Each crash before a waiting step was taken before that step ran: the step waits on its round.
    assert taken[:2] == [
        (faults_migration.SWITCH_POINTS["logical"][0], []),
        (faults_migration.SWITCH_POINTS["logical"][1], ["slot created"]),
    ]
    assert taken[2][0] == faults_migration.SWITCH_POINTS["logical"][2]
    assert [arm["hold_seconds"] for arm in arms.all()] == [2.0, 2.0, 0.0]

    # Nobody publishing: the arm before the handover is withdrawn after its wait; the others stay armed
    # for the next PutEvents (a publisher of the new configuration).
    faults_migration.write_switch(
        state,
        switch="to polling #2",
        to="polling",
        function=PUBLISHER,
        hold_seconds=2.0,
        arm_wait_seconds=0.2,
    )
    began = time.monotonic()
    module.switch_relay(None, "polling", "s")
    assert time.monotonic() - began < 2.0
    assert [(a["point"], a["withdrawn"], a["taken_at"]) for a in arms.all()[3:]] == [
        (point, point == faults_migration.SWITCH_POINTS["polling"][0], None)
        for point in faults_migration.SWITCH_POINTS["polling"]
    ]
    faults_migration.clear_switch(state)
    assert arms.take(pid=2)["point"] == faults_migration.SWITCH_POINTS["polling"][1]  # type: ignore[index]
    module.switch_relay(None, "polling", "s")
    assert len(arms.all()) == 6  # the request is cleared: nothing more armed

    # A poison row pending at the handover, when asked: to logical written in the handover's transaction
    # (before the rows are handed over), to polling before the handover (the slot then holds it).
    class Executor:
        def __init__(self) -> None:
            self.rows: list[tuple[str, list[str]]] = []

        def execute(self, sql: str, values: dict[str, Any]) -> None:
            self.rows.append((str(values["event_id"]), list(steps)))

    for mode in ("logical", "polling"):
        steps.clear()
        executor = Executor()
        row = {"values": {"event_id": f"p-{mode}"}, "details": {"event_ids": [f"p-{mode}"]}}
        faults_migration.write_switch(
            state, switch=mode, to=mode, function=PUBLISHER, arm_wait_seconds=0.0, poison_row=row
        )
        module.switch_relay(executor, mode, "s")
        before_handover = ["slot created"] if mode == "logical" else []
        assert executor.rows == [(f"p-{mode}", before_handover)]
    faults_migration.clear_switch(state)
    poison_rows = [e for e in injector.ledger.entries() if e["kind"] == "poison.outbox_item"]
    assert [e["event_ids"] for e in poison_rows] == [["p-logical"], ["p-polling"]]


class _Cursor:
    """Answers the hooks' reads: the kinds of the sets, the event ids of rows."""

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        if "kind" in sql:
            self._rows = [("replay",)]
        else:
            self._rows = [(f"e{position}",) for position in params[0]]

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


def test_the_logical_relay_dies_around_a_replay_sets_activation_and_after_a_chunk_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The hooks on the replay sets: a crash right after a round activated a set (before its COMMIT); a
    crash when, the activation committed, the slot is about to pass the set's message (not before: the
    advance inside the round stops short of it); a crash after a chunk of a set went out."""
    kinds = {RELAY_CRASH_AFTER_SET_ACTIVATION, RELAY_CRASH_BEFORE_PASSING_SET, RELAY_CRASH_AFTER_SET_CHUNK}
    injector = _relay_injector(tmp_path, kinds)
    slot = _Slot(monkeypatch)
    calls, relay = slot.calls, slot.relay
    sets = types.ModuleType("replays_stand_in")
    sets.activate = lambda cursor, ids: calls.append(f"activate {ids}")  # type: ignore[attr-defined]

    def mark_done(cursor: object, positions: list[int]) -> list[int]:
        calls.append(f"done {positions}")
        return []

    sets.mark_done = mark_done  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, faults_relay.REPLAYS_MODULE, sets)
    injector.wrap_slot(relay)
    moment = datetime(2026, 11, 25, tzinfo=UTC)
    message = DecodedTransaction(300, moment, [], replay_ids=[7])
    cursor = _Cursor()

    def round_reading_the_message() -> None:
        slot.reads.append(SlotChanges([DecodedTransaction(200, moment), message], read_to_lsn=400))
        relay.peek_changes(cursor, "s", 500)

    round_reading_the_message()
    with pytest.raises(injection.ChaosCrash):
        sets.activate(cursor, [7])  # activated in the round, never committed
    round_reading_the_message()
    sets.activate(cursor, [7])  # activated again (its one crash is spent)
    assert relay.advance_slot(cursor, "s", 200) is True  # before the COMMIT: short of the message
    with pytest.raises(injection.ChaosCrash):
        relay.advance_slot(cursor, "s", 400)  # after the COMMIT: past it, and the process dies first
    assert calls == ["activate [7]", "activate [7]", "advance 200"]
    assert slot.confirmed == 200  # the message is read again, its set found activated
    sets.mark_done(cursor, [])  # nothing drained: no opportunity
    with pytest.raises(injection.ChaosCrash):
        sets.mark_done(cursor, [11, 12])
    assert sets.mark_done(cursor, [13]) == []  # the cap (1) is reached

    entries = {entry["kind"]: entry for entry in injector.ledger.entries()}
    assert set(entries) == kinds
    assert entries[RELAY_CRASH_AFTER_SET_ACTIVATION]["replay_ids"] == [7]
    assert entries[RELAY_CRASH_AFTER_SET_ACTIVATION]["set_kinds"] == ["replay"]
    assert entries[RELAY_CRASH_BEFORE_PASSING_SET]["message_lsn"] == "0/12C"
    assert entries[RELAY_CRASH_AFTER_SET_CHUNK]["event_ids"] == ["e11", "e12"]


def test_the_database_restart_waits_for_the_relay_operations_under_way_and_they_for_it():
    gate = RestartGate()
    order: list[str] = []

    def restart() -> None:
        with gate.restart():
            order.append("restart")

    def operation(name: str) -> None:
        with gate.operation():
            order.append(name)

    with gate.operation():  # a switch under way
        restarting = threading.Thread(target=restart)
        restarting.start()
        time.sleep(0.1)
        later = threading.Thread(target=operation, args=("replay",))  # comes while the restart is due
        later.start()
        time.sleep(0.1)
        order.append("switch done")
    restarting.join(2)
    later.join(2)

    assert order == ["switch done", "restart", "replay"]


def test_the_relay_operations_check_holds_each_replayed_event_to_a_later_arrival_and_each_switch_to_success():
    replayed = _event("e1", "o-1", 1)
    before = _event("e2", "o-2", 1)
    bus = {
        # Named by the replay before the relay had put it out: its one arrival after the replay is enough.
        "e1": CapturedEvent(replayed, 1, first_at=25.0, last_at=25.0),
        "e2": CapturedEvent(before, 2, first_at=10.0, last_at=12.0),  # put twice, both before the replay
    }
    # Injected poison: p-1 parked before the replay (in its window), p-2 pending when the replay read it
    # (it replayed it: parked since), p-3 written after its window.
    poison_rows = [
        replace(_row(_event(event_id, f"chaos-poison-{event_id}", 1), PARKED, position), created_at=created)
        for event_id, position, created in (("p-1", 3, 5.0), ("p-2", 4, 15.0), ("p-3", 5, 30.0))
    ]
    injected = [
        poison.PoisonItem(poison.POSTGRES_OUTBOX, r.pk, r.sk, str(r.envelope["id"]), poison.INVALID_ENVELOPE)
        for r in poison_rows
        if r.envelope
    ]
    outbox = [_row(replayed), _row(before, position=2), *poison_rows]

    def replay(replayed: list[str], **named: list[str]) -> ReplayOutcome:
        return ReplayOutcome("replay #1", 20.0, (0.0, 20.0), None, replayed, named)

    def operations(outbox: list[OutboxRecord] = outbox, **changes: Any) -> Check:
        fields: dict[str, Any] = {
            "switches": [SwitchOutcome("to polling #1", "polling", "SUCCESS", "switched")],
            "replays": [replay(["e1", "p-2"], parked=["p-1"])],
            "final_mode": "logical",
            "expected_mode": "logical",
        }
        evidence = _evidence(
            outbox, bus, poison_items=injected, operations=OperationsEvidence(**{**fields, **changes})
        )
        return _check(evidence, "relay_operations")

    assert operations().ok, operations().violations
    assert operations().figures["replayed_events_on_the_bus_again"] == 1
    late = operations(replays=[replay(["e1", "e2", "p-2"], parked=["p-1"])])
    assert late.violations == ["replay #1: e2 on the bus 2 time(s), last at 12.0"]
    pending = [*outbox[:3], replace(outbox[3], state=PENDING), outbox[4]]
    assert any("the poison row p-2 it replayed is not parked" in v for v in operations(pending).violations)
    unnamed = operations(replays=[replay(["e1"], parked=["p-1"])])
    assert unnamed.violations == ["replay #1 did not name the poison row p-2 in its window"]
    under_polling = operations(replays=[replay(["e1"], parked=["p-1"], pending=["p-2"])])
    assert under_polling.ok  # a pending row is the polling publisher's anyway
    not_poison = operations(replays=[replay(["e1", "p-2"], parked=["p-1"], missing=["x"])])
    assert not_poison.violations == ["replay #1 left out x (missing), which is no poison"]
    failed = operations(switches=[SwitchOutcome("to logical #2", "logical", "FAILED", "LockNotAvailable")])
    assert any("to logical #2: FAILED at its last deploy" in v for v in failed.violations)
    # A deploy that failed (rolled back, deployed again) passes when it changed nothing and the last one
    # succeeded; one that left the relay half-switched does not.
    rolled_back = {"mode_after": "polling", "rollback": "SUCCESS", "rollback_reason": "already polling"}
    again = SwitchOutcome("to logical #2", "logical", "SUCCESS", "switched", "polling", [rolled_back])
    assert operations(switches=[again]).ok
    assert operations(switches=[again]).figures["deploys_failed_and_rolled_back"] == 1
    half = replace(again, failed=[{**rolled_back, "mode_after": "logical"}])
    assert any("a failed deploy left the relay logical" in v for v in operations(switches=[half]).violations)
    assert not operations(final_mode="polling").ok


def test_the_bus_capture_rules_take_every_event_once_and_each_orders_events_into_one_queue():
    """The capture is split over queues (each short: moto's queue operations slow down with their length);
    together its rules must still match every event exactly once, and an order's events one queue only
    (first arrivals are ranked per queue, in put order). Matched as moto's EventBridge matches them."""
    from moto.events.models import EventPattern

    queues = [[EventPattern.load(json.dumps(p)) for p in rules] for rules in capture_patterns()]

    def queue_of(detail: dict[str, Any]) -> list[int]:
        event: Any = {"source": ORDERS_SOURCE, "detail-type": "OrderCreated", "detail": detail}
        return [number for number, rules in enumerate(queues) for rule in rules if rule.matches_event(event)]

    orders = [f"o-{digit}{'7' * 31}" for digit in "0123456789abcdef"]
    assert [queue_of({"id": "e", "subject": order}) for order in orders] == [[n // 4] for n in range(16)]
    for other in ({"id": "e", "subject": "SKU-1"}, {"id": "e"}, {"subject": "o-"}, {}):
        assert queue_of(other) == [len(queues) - 1]  # the rest, a foreign event among them: once
    assert len(queues) >= 3


def test_after_import_runs_on_a_module_once_it_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "chaos_after_import_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "chaos_after_import_probe", raising=False)
    seen: list[int] = []

    injection.after_import("chaos_after_import_probe", lambda module: seen.append(module.VALUE))
    assert seen == []
    importlib.import_module("chaos_after_import_probe")  # the import the hook waits for

    assert seen == [1]
    injection.after_import("chaos_after_import_probe", lambda module: seen.append(module.VALUE + 1))
    assert seen == [1, 2]  # imported already: at once
    assert not any(isinstance(f, injection._AfterImport) for f in sys.meta_path)


def test_a_503_without_retry_after_breaks_the_api_contract():
    def answer(headers: dict[str, str]) -> Any:
        response = requests.Response()
        response.status_code = 503
        response.headers.update(headers)
        response._content = json.dumps(
            {"error": {"code": "SERVICE_BUSY", "message": "retry", "details": {}}}
        ).encode()
        return Driver("http://unused", 1.0, 1)._read(response)

    assert answer({"Retry-After": "1"}).problem is None
    assert answer({}).problem == "503 without Retry-After"


# --- small runs through the local stack ---------------------------------------------------------------
def test_a_small_chaos_run_loses_nothing_and_applies_every_effect_once(
    local_services: LocalServices, tmp_path: Path
):
    # Three receives instead of five: the malformed messages reach their DLQs sooner (the run stays short).
    config = ChaosConfig(orders=40, seed=11, out_dir=tmp_path, quiet=True, max_receive_count=3)
    chaos = Run(config, local_services)

    report = chaos.execute()

    failed = {name: check["examples"] for name, check in report["invariants"].items() if not check["ok"]}
    assert report["drained"], render(report)
    assert not failed, render(report)
    assert report["passed"]
    # The run exercised what it claims: every kind of fault happened, and the effects were observed.
    assert set(WORKER_KINDS + HARNESS_KINDS) <= set(report["faults"]), report["faults"]
    summary = report["summary"]
    assert summary["notification_window_duplicates"] == summary["notification_window_crashes_injected"] >= 1
    # Poison is parked whole in the relay poison queue, each item once, or again only after a relay
    # invocation that parked it died (its batch is delivered again: dead_letters_exact explains each repeat
    # by a crash between the two parks); the relay DLQ (batches older than RelayMaximumRecordAgeSeconds)
    # stays empty.
    assert (
        summary["relay_poison_queue"] == report["faults"]["poison.outbox_item"] == summary["poison_injected"]
    )
    assert (
        summary["relay_poison_queue_messages"]
        == report["faults"]["poison.outbox_item"] + summary["relay_poison_queue_parked_again"]
    )
    assert summary["relay_dlq"] == 0
    assert sum(summary["consumer_dlqs"].values()) == report["faults"]["poison.malformed_message"]
    assert report["events"]["bus_repeats"] >= 1  # the relay's crash after PutEvents re-sent its batch
    assert report["orders"].get("REJECTED", 0) >= 1
    assert report["orders"].get("CANCELLED", 0) >= 1
    # Its timeline: every order sent and settled (its end event on the bus), every fault at its time; the
    # chart of it is written beside the JSON, and the report names it (no second run).
    line = report["timeline"]
    assert len(line["sent"]) == len(line["settled"]) == 40
    assert {kind: len(times) for kind, times in line["faults"].items()} == report["faults"]
    phases = line["phases"]
    assert 0 < phases["drive_began"] < phases["drive_ended"] < phases["drain_ended"] <= phases["checked"]
    # What its live line would show now (quiet: none was drawn): the same counts.
    live = chaos.live_counts()
    assert (live.sent, live.settled, live.orders) == (40, 40, 40)
    assert live.faults == sum(report["faults"].values())
    assert live.rule_breaks == 0
    save(report, tmp_path / "latest.json")
    png = tmp_path / "latest.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    assert json.loads((tmp_path / "latest.json").read_text())["chart"] == str(png)
    assert any(
        row.split() == ["chart", "(timeline", "of", "the", "run)", str(png)]
        for row in render(report).splitlines()
    )


@pytest.fixture
def services_with_own_database(local_services: LocalServices, tmp_path: Path) -> Iterator[LocalServices]:
    """The session's DynamoDB Local and moto server, with a PostgreSQL of the test's own: the run restarts
    it, which the session's other stacks on the shared one must not see."""
    services = copy.copy(local_services)
    services.order_database = EmbeddedPostgres(tmp_path / "postgres")
    yield services
    services.order_database.stop()


@pytest.mark.parametrize("relay", ["polling", "logical"])
def test_a_small_chaos_run_on_postgres_survives_publisher_crashes_4_publishers_a_restart_and_poison_rows(
    services_with_own_database: LocalServices, tmp_path: Path, relay: str
):
    """Each PostgresRelay: the polling publisher (rows marked published), and the logical relay (a
    replication slot; it also dies after a slot advance, before COMMIT, and the slot must end empty)."""
    logical = relay == "logical"
    config = ChaosConfig(
        orders=40,
        seed=11,
        out_dir=tmp_path,
        quiet=True,
        max_receive_count=3,
        order_store="postgres",
        postgres_relay=relay,
        stack_name="chaospg" if relay == "polling" else "chaospgl",
    )
    if logical:
        # The relay operations within a drive of 40 s, so that publishers have events to put around each
        # switch's steps (a crash armed there is taken by the next PutEvents): the database restarted first
        # (an operation waits for a restart, and a restart for the operations under way), then a replay of
        # what the first 40 % of the orders wrote, a switch to polling once half of it is out, and back at
        # 70 %.
        config = replace(config, restart_at=0.1, replays_at=(0.4,), switches_at=(0.45, 0.7), rate=1.0)

    report = run(config, services=services_with_own_database)

    failed = {name: check["examples"] for name, check in report["invariants"].items() if not check["ok"]}
    assert report["drained"], render(report)
    assert not failed, render(report)
    assert report["passed"]
    # Every fault with a hook on this store happened; the others are named, not pretended.
    expected = (set(WORKER_KINDS) - {*API_KINDS, API_STALE_CANCEL}) | set(
        HARNESS_KINDS + POSTGRES_HARNESS_KINDS
    )
    slot_kinds = set(SLOT_KINDS) | set(OPERATION_FAULT_KINDS) | set(OPERATION_KINDS) if logical else set()
    assert expected | slot_kinds <= set(report["faults"]), report["faults"]
    assert report["postgres_relay"] == relay
    assert report["faults_not_applicable"] == {f: list(k) for f, k in not_applicable(True, relay).items()}
    assert set(report["faults_by_function"][PUBLISHER]) >= set(RELAY_KINDS) | (
        slot_kinds - set(OPERATION_KINDS)
    )
    figures = report["postgres"]
    # The publisher died between PutEvents and COMMIT (logical: and the slot advance): its rows stayed
    # pending (in the slot) and were put again.
    assert figures["republished"]["after_a_crash_between_put_events_and_commit"] >= 1
    assert figures["outbox_rows"]["pending"] == 0
    # 2, then 4 publishers at once; each order's events still reached the bus in sequence.
    first, second = figures["publishers"]["phases"][:2]
    assert (first["target"], second["target"]) == (2, 4)
    assert first["peak"] >= 2
    assert second["peak"] >= 4
    if logical:
        # Nothing is marked published: the slot is the bookmark, and it ends holding no outbox row.
        assert figures["slot_rows"] == 0
        assert figures["outbox_rows"]["published"] >= 40
        # The invocations at once wait their turn on the slot's lock: one reads it at a time.
        slot = figures["publishers"]["slot"]
        assert slot["readers_at_once_peak"] == 1
        assert slot["sessions_that_read_it"] >= 2
        assert figures["republished"]["confirmed_by_an_advance_then_crash"] >= 1
        # The relay's operations mid-drive (tools/chaos/relay_operations.py): the operator's replay of what
        # was written so far, a deploy switching to polling while its set drained, and one switching back;
        # each switch answered SUCCESS and the functions got the new relay; the publisher died around each
        # switch (armed at its steps) and around the replay sets (activation, its COMMIT, a chunk); every
        # replayed event reached the bus again, each consumer dropped it (0 duplicate effects, above).
        operations = report["relay_operations"]
        switches = operations["switches"]
        assert [(s["relay_to"], s["status"]) for s in switches] == [
            ("polling", "SUCCESS"),
            ("logical", "SUCCESS"),
        ]
        assert all(s["environments_retired"][PUBLISHER] >= 1 for s in switches)
        assert [s["rows_handed_over"] >= 1 for s in switches] == [True, True]
        for switch in switches:
            fates = [
                f
                for point, f in operations["crashes_around_switch_steps"].items()
                if point.startswith(switch["label"])
            ]
            assert len(fates) == 3
            assert sum(f.get("crashed", 0) for f in fates) >= 1, operations["crashes_around_switch_steps"]
        assert all(operations["crashes_around_replay_sets"].values())
        (replay,) = operations["replays"]
        checked = report["invariants"]["relay_operations"]
        assert replay["replayed"] == checked["replayed_events"] >= 5
        assert replay["set_rows_peak"] >= 1  # drained as a replay set
        assert checked["replayed_events_on_the_bus_again"] >= 5
        assert replay["all_back_on_the_bus_seconds"] is not None
        assert checked["switches_answered_success"] == 2
        assert checked["final_mode"] == "logical"
    assert report["invariants"]["published_in_order"]["aggregates"] >= 40
    # The database was down mid-drive: the API answered 503 with Retry-After, the client retried.
    restart = figures["database_restart"]
    assert restart["outage_seconds"] >= config.database_down_seconds
    assert restart["answers_503_during_outage"] >= 1
    # Poison rows (a made-up order's, invalid and oversize; a real order's) are parked whole, marked
    # parked, and held no later event of another order back.
    rows = figures["poison_rows"]
    # Logical: and one pending at each switch's handover (a made-up order's).
    at_handovers = 2 if logical else 0
    assert Counter((r["variant"], r["real_order"]) for r in rows) == Counter(
        {
            (poison.INVALID_ENVELOPE, False): 1 + at_handovers,
            (poison.OVERSIZE, False): 1,
            (poison.INVALID_ENVELOPE, True): 1,
        }
    )
    assert all(
        r["state"] == PARKED and r["of_them_published"] == r["later_events_of_other_orders"] for r in rows
    )
    summary = report["summary"]
    assert summary["relay_poison_queue"] == summary["poison_injected"] == len(rows) + 1  # + inventory's
    assert summary["lost"] == summary["phantom"] == summary["duplicate_effects"] == 0


def test_a_fault_whose_call_failed_on_its_own_is_given_back_to_be_injected_later(tmp_path: Path) -> None:
    """A claim is only an injection once it happened: released, its kind's one slot is free again."""
    state = injection.FunctionState(tmp_path, "OrdersApiFunction")
    assert state.claim("api.timeout_after_commit", ["key-1"], cap=1)
    assert not state.claim("api.timeout_after_commit", ["key-2"], cap=1)  # the one slot is taken

    state.release("api.timeout_after_commit", ["key-1"])

    assert state.counts()["api.timeout_after_commit"] == 0
    assert state.claim("api.timeout_after_commit", ["key-1"], cap=1)  # the id may be faulted again
