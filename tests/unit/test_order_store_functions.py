"""The PostgreSQL order store's two functions, invoked in-process like the others: the polling publisher
puts the database's pending events on the bus (moto) and marks them; maintenance reports the outbox's
health. Not in template.yaml yet (issue 21), so their environment is written here, as the template will
give it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shop.adapters.postgres.connection import ConnectionSettings
from shop.runtime.polling_publisher import RESERVE_SECONDS
from tests.conftest import reset_process_state
from tests.support import LambdaContext, clear_module_caches, load_handler_module
from tests.support.output import metric_values
from tests.support.postgres import connect, place_orders
from tools.template import ROOT, FunctionSpec, Template


def handler(name: str, directory: str) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    spec = FunctionSpec(name, ROOT / "functions" / directory, "app.lambda_handler", 60, {}, {}, [])
    module = load_handler_module(spec)
    clear_module_caches(module)
    return module.lambda_handler  # type: ignore[no-any-return]


@pytest.fixture
def order_store_env(
    order_database: ConnectionSettings, template: Template, monkeypatch: pytest.MonkeyPatch, aws: None
) -> None:
    environment = {
        "ORDER_STORE": "postgres",
        "DATABASE_HOST": order_database.host,
        "DATABASE_PORT": str(order_database.port),
        "DATABASE_NAME": order_database.dbname,
        "DATABASE_USER": order_database.user,
        "EVENT_BUS_NAME": template.physical_name("EventBus"),
        "RELAY_POISON_QUEUE_URL": template.function("OutboxRelayFunction").environment[
            "RELAY_POISON_QUEUE_URL"
        ],
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    reset_process_state()


def pending_count(settings: ConnectionSettings) -> int:
    with connect(settings) as connection:
        (count,) = connection.execute(  # type: ignore[misc]
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL"
        ).fetchone()
    return int(count)


def test_the_publisher_function_polls_until_its_last_seconds_and_puts_pending_events_on_the_bus(
    order_store_env, order_database, database, bus, poison_queue
):
    orders = place_orders(database, 3)

    totals = handler("OutboxPublisherFunction", "outbox_publisher")(
        {},
        LambdaContext(timeout_seconds=RESERVE_SECONDS + 0.7),  # a few rounds, then its reserve
    )

    assert totals["published"] == 3
    assert totals["rounds"] >= 2  # it kept polling after the events went out
    assert sorted(event["detail"]["subject"] for event in bus()) == sorted(orders)
    assert pending_count(order_database) == 0


def test_the_maintenance_function_reports_the_outboxs_health_as_metrics(
    order_store_env, order_database, database, capsys
):
    place_orders(database, 2)

    report = handler("OrderStoreMaintenanceFunction", "order_store_maintenance")({}, LambdaContext())

    assert report["health"]["pending"] == 2
    assert metric_values(capsys.readouterr().out, "OutboxPending") == [2]


def test_the_maintenance_function_replays_when_asked_and_refuses_a_malformed_request(
    order_store_env, order_database, database
):
    place_orders(database, 1)
    maintenance = handler("OrderStoreMaintenanceFunction", "order_store_maintenance")

    report = maintenance({"replay": {"eventIds": ["no-such-event"]}}, LambdaContext())
    refused = maintenance({"replay": {"from": "2026-11-01T00:00:00Z"}}, LambdaContext())

    assert (report["missing"], report["complete"]) == (["no-such-event"], False)
    assert "health" not in report  # a replay request runs no maintenance
    assert refused["error"]["code"] == "INVALID_REPLAY_REQUEST"
