"""What only the PostgreSQL order store adds: the inbox beside the order-status consumer's effect, and
a database that is down answering as busy (nothing partial written)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

import shop.adapters.aws
import shop.runtime.wiring.order_database
from shop.adapters.postgres.connection import (
    CONNECT_TIMEOUT_SECONDS,
    KEEPALIVES_COUNT,
    KEEPALIVES_IDLE_SECONDS,
    KEEPALIVES_INTERVAL_SECONDS,
    TCP_USER_TIMEOUT_MS,
    ConnectionSettings,
    Database,
    PasswordUnavailable,
    open_connection,
)
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
from shop.runtime.wiring.order_database import connection_settings
from tests.support import header, json_body, load_event
from tests.support.postgres import connect
from tests.unit.conftest import postgres_environment
from tools.template import Template

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


@pytest.mark.parametrize("failing", ["first", "afresh"])
def test_a_password_that_cannot_be_fetched_is_service_busy(password_role: ConnectionSettings, failing: str):
    """Every function connects through Database: a fetch that fails (PasswordUnavailable: throttled, timed
    out, unreachable), for the first connect or for the fresh value a refused password asks for, is the
    database unavailable (the API's 503, a consumer's retried message, the publisher's next round)."""
    asked: list[bool] = []

    def password(refresh: bool) -> str:
        asked.append(refresh)
        if refresh or failing == "first":
            raise PasswordUnavailable("ThrottlingException: Rate exceeded")
        return "before-rotation"  # refused: the database has the rotated one

    database = Database(replace(password_role, password=password))
    with pytest.raises(ServiceBusy), database.transaction():
        pass
    assert asked == ([False] if failing == "first" else [False, True])


KEEPALIVE_PARAMETERS = {
    "keepalives_idle": KEEPALIVES_IDLE_SECONDS,
    "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
    "keepalives_count": KEEPALIVES_COUNT,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
}


def test_a_connection_is_made_with_keepalives_and_a_tcp_user_timeout_that_end_a_silent_one_in_time(
    order_database: ConnectionSettings, template: Template
):
    """A network path gone silent never delivers the server's statement timeout: the kernel's keepalives and
    user timeout close the connection (ServiceBusy) in time for the API to answer its 503."""
    with open_connection(order_database) as connection:
        given = connection.info.get_parameters()

    assert {name: given.get(name) for name in ("keepalives", *KEEPALIVE_PARAMETERS)} == {
        "keepalives": "1",
        **{name: str(value) for name, value in KEEPALIVE_PARAMETERS.items()},
    }
    silent_for = max(
        KEEPALIVES_IDLE_SECONDS + KEEPALIVES_INTERVAL_SECONDS * KEEPALIVES_COUNT, TCP_USER_TIMEOUT_MS / 1000
    )
    assert silent_for + shop.adapters.aws.ANSWER_SECONDS < template.function("OrdersApiFunction").timeout


# --- the password from Secrets Manager: fetched in time, and a failed fetch is the database unavailable ---
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:order-db-AbCdEf"


@pytest.fixture
def secret_environment(aws: None, order_database: ConnectionSettings) -> dict[str, str]:
    """The functions' variables for OrderStore=postgres with the password in a secret, as deployed (moto
    holds the secret; the local server does not check the password), and no connection open yet."""
    boto3.client("secretsmanager").create_secret(
        Name=SECRET_ARN, SecretString=json.dumps({"username": order_database.user, "password": "unused"})
    )
    shop.runtime.wiring.order_database.order_database.cache_clear()
    return {**postgres_environment(order_database), "DATABASE_SECRET_ARN": SECRET_ARN}


def throttled_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """GetSecretValue answers ThrottlingException (after the SDK's own retries)."""
    client = boto3.client("secretsmanager")
    stubber = Stubber(client)
    stubber.add_client_error("get_secret_value", "ThrottlingException", "Rate exceeded", 400)
    stubber.activate()
    monkeypatch.setattr(shop.adapters.aws, "secrets_manager", lambda: client)


def unreachable_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK gave up reaching Secrets Manager (its endpoint refused or timed out every attempt)."""
    client = boto3.client("secretsmanager")

    def gave_up(**kwargs: Any) -> Any:
        raise EndpointConnectionError(endpoint_url="https://secretsmanager.us-east-1.amazonaws.com")

    monkeypatch.setattr(client, "get_secret_value", gave_up)
    monkeypatch.setattr(shop.adapters.aws, "secrets_manager", lambda: client)


SECRETS_FAILURES = {"throttled": throttled_secrets, "unreachable": unreachable_secrets}


@pytest.mark.parametrize("failure", list(SECRETS_FAILURES))
def test_a_password_that_cannot_be_fetched_is_a_503_with_retry_after_and_nothing_is_written(
    api, secret_environment, order_database, monkeypatch, failure
):
    SECRETS_FAILURES[failure](monkeypatch)

    response = api(load_event("api_create_order.json"), secret_environment)

    assert response["statusCode"] == 503
    assert header(response, "Retry-After") == "1"
    assert json_body(response)["error"]["code"] == "SERVICE_BUSY"
    assert rows(order_database, "SELECT count(*) FROM orders") == [(0,)]


def test_the_password_is_fetched_through_the_adapters_secrets_manager_client(
    api, secret_environment, monkeypatch
):
    """Through shop.adapters.aws.secrets_manager (its timeouts, below), not Powertools' default client: a
    stub on that client answers the fetch."""
    client = boto3.client("secretsmanager")
    stubber = Stubber(client)
    secret = json.dumps({"username": "u", "password": "from-the-adapters-client"})
    stubber.add_response("get_secret_value", {"SecretString": secret}, {"SecretId": SECRET_ARN})
    stubber.activate()
    monkeypatch.setattr(shop.adapters.aws, "secrets_manager", lambda: client)
    password = connection_settings(Settings.from_env(secret_environment)).password

    assert password(False) == "from-the-adapters-client"
    stubber.assert_no_pending_responses()


def test_fetching_the_password_then_connecting_leaves_the_api_time_to_answer(template: Template, aws: None):
    """The API's Lambda timeout (10 s) holds the fetch, every attempt of it (the client's own timeouts and
    retries), and the connect after it, with time to answer 503 (a longer wait: API Gateway's 502)."""
    config: Any = shop.adapters.aws.secrets_manager().meta.config  # botocore sets its attributes at run time
    fetch = shop.adapters.aws.longest_call_seconds(
        config.retries["total_max_attempts"], config.connect_timeout, config.read_timeout
    )

    assert (
        fetch + CONNECT_TIMEOUT_SECONDS + shop.adapters.aws.ANSWER_SECONDS
        <= template.function("OrdersApiFunction").timeout
    )
