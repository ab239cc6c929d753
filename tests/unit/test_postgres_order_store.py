"""What only the PostgreSQL order store adds: the inbox beside the order-status consumer's effect, and
a database that is down answering as busy (nothing partial written)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.envelope import parse_time
from shop.domain.errors import ServiceBusy
from shop.domain.orders import (
    ORDER_CONFIRMED,
    OrderLine,
    OrderService,
    OrderStatus,
    PlaceOrder,
    VersionConflict,
)
from shop.runtime.config import Settings
from tests.support.postgres import connect

SETTINGS = Settings.from_env({})
COMMAND = PlaceOrder("c-1", "USD", (OrderLine("SKU-A", 1, 500),))


def rows(settings: ConnectionSettings, sql: str) -> list[tuple[object, ...]]:
    with connect(settings) as connection:
        return connection.execute(sql).fetchall()


def test_the_cause_of_a_status_change_is_recorded_in_the_inbox_in_the_same_transaction(
    order_database: ConnectionSettings, database: Database
):
    repository = PostgresOrderRepository(database, SETTINGS, inbox_consumer="order-status")
    service = OrderService(repository, SETTINGS)
    order_id = service.place_order(COMMAND, idempotency_key=None, correlation_id="c").order["orderId"]
    cause = service.get_order(order_id).event("InventoryReserved", "c")

    assert service.apply_inventory_outcome(order_id, OrderStatus.CONFIRMED, cause) == "confirmed"

    assert rows(order_database, "SELECT consumer, event_id FROM inbox") == [("order-status", cause.id)]


def test_a_cause_already_in_the_inbox_writes_nothing_even_at_the_expected_version(
    order_database: ConnectionSettings, database: Database
):
    """The redelivery that Powertools' idempotency no longer remembers (its record expired) and that
    finds the order still at the version it was applied to (a restored backup, a hand-reset status):
    the inbox alone refuses it, and the whole transaction (status, outbox row) is rolled back."""
    repository = PostgresOrderRepository(database, SETTINGS, inbox_consumer="order-status")
    service = OrderService(repository, SETTINGS)
    order_id = service.place_order(COMMAND, idempotency_key=None, correlation_id="c").order["orderId"]
    pending = service.get_order(order_id)
    cause = pending.event("InventoryReserved", "c")
    with connect(order_database) as connection:
        connection.execute("INSERT INTO inbox (consumer, event_id) VALUES ('order-status', %s)", (cause.id,))
    confirmed = pending.transition_to(OrderStatus.CONFIRMED, parse_time(pending.updated_at))

    with pytest.raises(VersionConflict):
        repository.save_transition(
            confirmed, pending.version, confirmed.event(ORDER_CONFIRMED, "c", cause.id)
        )

    assert service.get_order(order_id) == pending
    assert rows(order_database, "SELECT sequence FROM outbox") == [(1,)]


def test_without_an_inbox_consumer_nothing_is_recorded(
    order_database: ConnectionSettings, database: Database
):
    service = OrderService(PostgresOrderRepository(database, SETTINGS), SETTINGS)
    order_id = service.place_order(COMMAND, idempotency_key=None, correlation_id="c").order["orderId"]
    service.cancel_order(order_id, correlation_id="c")

    assert rows(order_database, "SELECT count(*) FROM inbox") == [(0,)]


def test_a_database_that_is_down_is_service_busy_and_nothing_is_written(
    order_database: ConnectionSettings, database: Database, tmp_path
):
    down = Database(replace(order_database, host=str(tmp_path)))  # no server listens there
    service = OrderService(PostgresOrderRepository(down, SETTINGS), SETTINGS)

    with pytest.raises(ServiceBusy):
        service.place_order(COMMAND, idempotency_key="k-1", correlation_id="c")

    assert rows(order_database, "SELECT count(*) FROM orders") == [(0,)]


def test_a_connection_broken_mid_transaction_is_service_busy_and_the_next_call_reconnects(
    order_database: ConnectionSettings, database: Database
):
    service = OrderService(PostgresOrderRepository(database, SETTINGS), SETTINGS)
    first = service.place_order(COMMAND, idempotency_key=None, correlation_id="c").order["orderId"]
    with connect(order_database) as admin:  # the server ends every other session (a failover does)
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'serverless-outbox' AND pid <> pg_backend_pid()"
        )

    with pytest.raises(ServiceBusy):
        service.get_order(first)
    assert service.get_order(first).order_id == first


@pytest.fixture
def password_role(postgres_server: ConnectionSettings) -> Iterator[ConnectionSettings]:
    """A role `app` whose password the server checks (scram-sha-256 on the socket); its settings."""
    with connect(postgres_server) as admin:
        (hba_file,) = admin.execute("SHOW hba_file").fetchone()  # type: ignore[misc]
        admin.execute("DROP ROLE IF EXISTS app")
        admin.execute("CREATE ROLE app LOGIN PASSWORD 'rotated'")
        original = Path(hba_file).read_text()
        Path(hba_file).write_text("local all app scram-sha-256\n" + original)
        admin.execute("SELECT pg_reload_conf()")
    try:
        yield replace(postgres_server, user="app")
    finally:
        with connect(postgres_server) as admin:
            Path(hba_file).write_text(original)
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("DROP ROLE app")


def test_a_password_the_database_refuses_is_fetched_again_once(password_role: ConnectionSettings):
    asked: list[bool] = []

    def password(refresh: bool) -> str:
        asked.append(refresh)
        return "rotated" if refresh else "before-rotation"  # the cache still holds the old secret

    database = Database(replace(password_role, password=password))
    try:
        with database.transaction() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == ("app",)
    finally:
        database.close()
    assert asked == [False, True]


def test_a_database_that_is_down_is_asked_once_not_twice(tmp_path):
    asked: list[bool] = []

    def password(refresh: bool) -> str:
        asked.append(refresh)
        return "secret"

    down = Database(ConnectionSettings(str(tmp_path), 5432, "postgres", "app", password))

    with pytest.raises(ServiceBusy), down.transaction():
        pass
    assert asked == [False]
