"""OrderStore=postgres on the local stack, beyond the saga (tests/integration/test_saga.py runs it on both
stores): the deploy-time migration through its custom resource, the outbox rows the scheduled publisher
marks, the events of one order on the bus in their order, and the same bytes on the bus as the
DynamoDB store publishes."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

import shop.adapters.aws
from operations import admin
from operations import local_stack as operations_local
from tools.local.stack import LocalStack
from tools.local.stack_state import state_file, write_state

SECONDS = 30.0  # a bound on waiting, not a speed target


def _place_unstocked(stack: LocalStack) -> str:
    sku = f"SKU-PG-{uuid.uuid4().hex[:8]}"  # no stock: the saga rejects it, then nothing to cancel
    response = requests.post(
        f"{stack.api_url}/orders",
        json={
            "customerId": "c-pg",
            "currency": "USD",
            "items": [{"sku": sku, "quantity": 1, "unitPrice": 5}],
        },
        headers={"Idempotency-Key": str(uuid.uuid4())},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    order_id: str = response.json()["orderId"]
    return order_id


def _delivered(stack: LocalStack, order_id: str) -> list[dict[str, Any]]:
    """The CloudEvents of this order that reached a consumer queue, in delivery order."""
    return [
        json.loads(record["body"])["detail"]
        for invocation in stack.activity.invocations()
        if invocation.trigger == "sqs"
        for record in invocation.records
        if json.loads(record["body"]).get("detail", {}).get("subject") == order_id
    ]


def test_the_schema_is_migrated_by_its_custom_resource_at_start(postgres_stack: LocalStack) -> None:
    applied = postgres_stack.report.custom_resources["OrderDatabaseSchema"]["Applied"].split(",")
    # The migration function answered CloudFormation with the ids of what it applied, every one.
    from shop.adapters.postgres.schema import MIGRATIONS

    assert applied == sorted(path.stem for path in MIGRATIONS.glob("*.sql"))
    assert postgres_stack.report.custom_resources["OrderDatabaseSchema"]["Relay"] == "polling"
    with postgres_stack.order_database.connect() as connection:
        tables = {
            row[0]
            for row in connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert {"orders", "order_lines", "request_keys", "outbox", "inbox", "outbox_relay"} <= tables


def test_each_outbox_row_is_published_once_and_marked(postgres_stack: LocalStack) -> None:
    order_id = _place_unstocked(postgres_stack)

    def rejected() -> list[dict[str, Any]] | None:
        events = _delivered(postgres_stack, order_id)
        return events if any(e["type"].endswith("OrderRejected") for e in events) else None

    postgres_stack.wait_for(rejected, SECONDS, f"order {order_id} rejected")
    with postgres_stack.order_database.connect() as connection:
        rows = connection.execute(
            "SELECT sequence, event_type, published_at IS NOT NULL, parked_at IS NULL, attempts "
            "FROM outbox WHERE aggregate_id = %s ORDER BY sequence",
            (order_id,),
        ).fetchall()
        inbox = connection.execute(
            "SELECT consumer FROM inbox WHERE event_id IN "
            "(SELECT event_id FROM outbox WHERE aggregate_id = %s)",
            (order_id,),
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(1, "OrderCreated"), (2, "OrderRejected")]
    assert all(published and not_parked for _, _, published, not_parked, _ in rows)
    assert inbox == []  # the inbox holds the consumer's causes (inventory events), not the order's own
    # The order's events reached the bus in their sequence, each once per rule that routes it.
    delivered = [
        (e["sequence"], e["type"])
        for e in _delivered(postgres_stack, order_id)
        if e["source"] == "shop.orders"
    ]
    assert sorted(set(delivered)) == [(1, "OrderCreated"), (2, "OrderRejected")]


def test_the_order_status_consumer_records_its_cause_in_the_inbox(postgres_stack: LocalStack) -> None:
    order_id = _place_unstocked(postgres_stack)

    def causes() -> list[str] | None:
        found = [
            json.loads(record["body"])["detail"]["id"]
            for invocation in postgres_stack.activity.invocations()
            if invocation.function == "OrderStatusFunction" and invocation.result.ok
            for record in invocation.records
            if order_id in record["body"]
        ]
        return found or None

    (cause,) = set(postgres_stack.wait_for(causes, SECONDS, f"the inventory outcome of {order_id} handled"))
    with postgres_stack.order_database.connect() as connection:
        recorded = connection.execute("SELECT consumer FROM inbox WHERE event_id = %s", (cause,)).fetchall()
    assert recorded == [("order-status",)]


def test_the_logical_relay_publishes_from_the_slot_the_migration_created(logical_stack: LocalStack) -> None:
    """PostgresRelay=logical: the migration's custom resource created the publication and the slot; an
    order's events reach the consumers in sequence; the slot moves past them; no row is marked."""
    from shop.adapters.postgres.replication import PUBLICATION, slot_name

    assert logical_stack.report.custom_resources["OrderDatabaseSchema"]["Relay"] == "logical"
    order_id = _place_unstocked(logical_stack)

    def rejected() -> list[dict[str, Any]] | None:
        events = _delivered(logical_stack, order_id)
        return events if any(e["type"].endswith("OrderRejected") for e in events) else None

    logical_stack.wait_for(rejected, SECONDS, f"order {order_id} rejected")
    delivered = [
        (e["sequence"], e["type"])
        for e in _delivered(logical_stack, order_id)
        if e["source"] == "shop.orders"
    ]
    assert sorted(set(delivered)) == [(1, "OrderCreated"), (2, "OrderRejected")]
    assert delivered.index((1, "OrderCreated")) < delivered.index((2, "OrderRejected"))
    database = logical_stack.order_database
    with database.connect() as connection:
        slot = slot_name(database.name)
        assert connection.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)
        ).fetchone()
        held = connection.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
            " 'publication_names', %s) WHERE get_byte(data, 0) = ascii('I')",
            (slot, PUBLICATION),
        ).fetchone()
        marked = connection.execute(
            "SELECT count(*) FROM outbox WHERE aggregate_id = %s AND published_at IS NOT NULL", (order_id,)
        ).fetchone()
    assert held == (0,)  # every insert confirmed: the slot holds nothing of this order any more
    assert marked == (0,)  # the slot is the bookmark: rows are not updated


def test_an_operator_command_invokes_the_maintenance_function_through_the_local_lambda_api(
    postgres_stack: LocalStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m operations --local discard-poison` (a dry run) reaches the database through the stack's
    Lambda Invoke API, as on AWS (tests/conformance/test_lambda_invoke_api.py), and STS on moto names the
    caller: the function answers for an event id the outbox does not hold."""
    port = 3103
    monkeypatch.setattr(operations_local, "STATE_ROOT", tmp_path)
    write_state(postgres_stack, state_file(port, tmp_path))
    for name in json.loads(state_file(port, tmp_path).read_text())["operator_environment"]:
        monkeypatch.setenv(name, os.environ.get(name, ""))  # so the command's changes are undone
    monkeypatch.setenv("PORT", str(port))
    event_id = f"absent-{uuid.uuid4()}"
    shop.adapters.aws.reset_clients()
    try:
        exit_code = admin.main(["--local", "discard-poison", event_id, "--reason", "conformance"])
    finally:
        shop.adapters.aws.reset_clients()

    printed = capsys.readouterr()
    report = json.loads(printed.out.strip().splitlines()[-1])
    function = postgres_stack.template.physical_name("OrderStoreMaintenanceFunction")
    assert (report["store"], report["function"], report["missing"]) == ("postgres", function, [event_id])
    assert report["dryRun"] is True, printed
    assert report["by"].startswith("arn:aws:"), "the caller STS on moto names"
    assert (report["complete"], exit_code) == (False, 1)  # nothing to discard: the command says so
    invoked = postgres_stack.activity.invocations("OrderStoreMaintenanceFunction")[-1]
    assert (invoked.trigger, invoked.result.ok) == ("direct", True)
