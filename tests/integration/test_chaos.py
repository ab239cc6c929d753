"""A small chaos run (tools/chaos/, `make chaos`) through the local stack, on each order store: every fault
kind is injected, the pipeline drains, and every invariant holds. `make chaos` (ORDER_STORE=postgres for
the PostgreSQL store) runs the same harness at full size. First, the harness's own logic, without a stack."""

from __future__ import annotations

import copy
import importlib
import json
import sys
import types
from collections import Counter
from collections.abc import Iterator
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
from tools.chaos import faults, poison
from tools.chaos.bus import CapturedEvent
from tools.chaos.check import (
    INVENTORY_SIDE,
    ORDERS_SIDE,
    PARKED,
    PENDING,
    PUBLISHED,
    Check,
    Evidence,
    OutboxRecord,
    Snapshot,
    comparable_item,
    evaluate,
    parked_key,
    postgres_row_key,
)
from tools.chaos.driver import Driver
from tools.chaos.harness import ChaosConfig, Run, chaos_template, fault_plan, roles, run
from tools.chaos.plan import (
    API_KINDS,
    API_STALE_CANCEL,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_WRITE,
    HARNESS_KINDS,
    PLAN_ENV,
    POSTGRES_HARNESS_KINDS,
    POSTGRES_NOT_APPLICABLE,
    RELAY,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_KINDS,
    SLOT_KINDS,
    WORKER_KINDS,
    FaultSpec,
    FunctionPlan,
    Plan,
    not_applicable,
)
from tools.chaos.publishers import PUBLISHER
from tools.chaos.report import render, save
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
    assert set(plans["logical"][PUBLISHER].faults) == {*RELAY_KINDS, RELAY_CRASH_AFTER_ADVANCE}
    assert plans["logical"][PUBLISHER].faults[RELAY_CRASH_AFTER_ADVANCE].ensure  # at least once a run
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


def test_the_logical_relay_dies_after_a_slot_advance_past_outbox_rows_once_the_slot_has_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The hook on the logical relay module's advance_slot: the real advance first; a crash only when it
    moved the slot past outbox rows (the first such advance: `ensure`), each recorded, up to the cap."""
    spec = FunctionPlan(RELAY, 70.0, {RELAY_CRASH_AFTER_ADVANCE: FaultSpec(0.0, 1)})
    plan = Plan(
        seed=1,
        stack_name="chaos",
        ledger=str(tmp_path / "ledger.jsonl"),
        state_dir=str(tmp_path / "state"),
        max_receive_count=5,
        client_timeout_seconds=3.0,
        idempotency_table="idempotency",
        business_tables=(),
        functions={PUBLISHER: spec},
    )
    injector = faults.Injector(plan, PUBLISHER, spec)
    slot = {"confirmed": 100}
    reads: list[SlotChanges] = []

    def advance_slot(cursor: object, name: str, lsn: int) -> bool:
        moved = lsn > slot["confirmed"]
        slot["confirmed"] = max(slot["confirmed"], lsn)
        return moved

    module = types.ModuleType("logical_relay_stand_in")
    module.peek_changes = lambda cursor, name, limit: reads.pop(0)  # type: ignore[attr-defined]
    module.advance_slot = advance_slot  # type: ignore[attr-defined]
    monkeypatch.setattr(replication, "confirmed_lsn", lambda cursor, name: slot["confirmed"])
    injector.wrap_slot(module)

    reads.append(_slot_changes((200, []), read_to=300))  # WAL without outbox rows
    module.peek_changes(None, "s", 500)
    assert module.advance_slot(None, "s", 300) is True
    reads.append(_slot_changes((400, ["e1", "e2"]), (450, ["e3"]), read_to=500))
    module.peek_changes(None, "s", 500)
    assert module.advance_slot(None, "s", 300) is False  # not moved: no crash either
    with pytest.raises(faults.ChaosCrash):
        module.advance_slot(None, "s", 400)  # past e1 and e2 (not e3)
    assert slot["confirmed"] == 400  # the advance happened before the crash
    assert module.advance_slot(None, "s", 500) is True  # the cap (1) is reached

    (entry,) = injector.ledger.entries()
    assert entry["kind"] == RELAY_CRASH_AFTER_ADVANCE
    assert entry["event_ids"] == ["e1", "e2"]
    assert entry["confirmed_lsn"] == "0/190"


def test_after_import_runs_on_a_module_once_it_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "chaos_after_import_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "chaos_after_import_probe", raising=False)
    seen: list[int] = []

    faults.after_import("chaos_after_import_probe", lambda module: seen.append(module.VALUE))
    assert seen == []
    importlib.import_module("chaos_after_import_probe")  # the import the hook waits for

    assert seen == [1]
    faults.after_import("chaos_after_import_probe", lambda module: seen.append(module.VALUE + 1))
    assert seen == [1, 2]  # imported already: at once
    assert not any(isinstance(f, faults._AfterImport) for f in sys.meta_path)


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
    # Poison is parked whole in the relay poison queue, each item once; the relay DLQ (batches older than
    # RelayMaximumRecordAgeSeconds) stays empty.
    assert (
        summary["relay_poison_queue"] == report["faults"]["poison.outbox_item"] == summary["poison_injected"]
    )
    assert summary["relay_poison_queue_messages"] == report["faults"]["poison.outbox_item"]
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
    logical = relay == "logical"

    report = run(config, services=services_with_own_database)

    failed = {name: check["examples"] for name, check in report["invariants"].items() if not check["ok"]}
    assert report["drained"], render(report)
    assert not failed, render(report)
    assert report["passed"]
    # Every fault with a hook on this store happened; the others are named, not pretended.
    expected = (set(WORKER_KINDS) - {*API_KINDS, API_STALE_CANCEL}) | set(
        HARNESS_KINDS + POSTGRES_HARNESS_KINDS
    )
    slot_kinds = set(SLOT_KINDS) if logical else set()
    assert expected | slot_kinds <= set(report["faults"]), report["faults"]
    assert report["postgres_relay"] == relay
    assert report["faults_not_applicable"] == {f: list(k) for f, k in not_applicable(True, relay).items()}
    assert set(report["faults_by_function"][PUBLISHER]) >= set(RELAY_KINDS) | slot_kinds
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
    assert report["invariants"]["published_in_order"]["aggregates"] >= 40
    # The database was down mid-drive: the API answered 503 with Retry-After, the client retried.
    restart = figures["database_restart"]
    assert restart["outage_seconds"] >= config.database_down_seconds
    assert restart["answers_503_during_outage"] >= 1
    # Poison rows (a made-up order's, invalid and oversize; a real order's) are parked whole, marked
    # parked, and held no later event of another order back.
    rows = figures["poison_rows"]
    assert [(r["variant"], r["real_order"]) for r in rows] == [
        (poison.INVALID_ENVELOPE, False),
        (poison.OVERSIZE, False),
        (poison.INVALID_ENVELOPE, True),
    ]
    assert all(
        r["state"] == PARKED and r["of_them_published"] == r["later_events_of_other_orders"] for r in rows
    )
    summary = report["summary"]
    assert summary["relay_poison_queue"] == summary["poison_injected"] == len(rows) + 1  # + inventory's
    assert summary["lost"] == summary["phantom"] == summary["duplicate_effects"] == 0


def test_a_fault_whose_call_failed_on_its_own_is_given_back_to_be_injected_later(tmp_path: Path) -> None:
    """A claim is only an injection once it happened: released, its kind's one slot is free again."""
    state = faults.FunctionState(tmp_path, "OrdersApiFunction")
    assert state.claim("api.timeout_after_commit", ["key-1"], cap=1)
    assert not state.claim("api.timeout_after_commit", ["key-2"], cap=1)  # the one slot is taken

    state.release("api.timeout_after_commit", ["key-1"])

    assert state.counts()["api.timeout_after_commit"] == 0
    assert state.claim("api.timeout_after_commit", ["key-1"], cap=1)  # the id may be faulted again
