"""The PostgreSQL order store's two functions, invoked in-process like the others: the polling publisher
puts the database's pending events on the bus (moto) and marks them; maintenance reports the outbox's
health. Not in template.yaml yet (issue 21), so their environment is written here, as the template will
give it."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from shop.adapters.postgres import replication
from shop.adapters.postgres.connection import ConnectionSettings, PasswordUnavailable
from shop.adapters.postgres.schema import MIGRATIONS
from shop.runtime.polling_publisher import RESERVE_SECONDS
from tests.conftest import reset_process_state
from tests.support import LambdaContext, clear_module_caches, load_handler_module
from tests.support.output import logged_with, metric_values
from tests.support.postgres import connect, place_orders
from tests.unit.conftest import order_store_environment
from tools.template import ROOT, FunctionSpec, Template


def handler_module(name: str, directory: str, timeout: int = 60) -> ModuleType:
    spec = FunctionSpec(name, ROOT / "functions" / directory, "app.lambda_handler", timeout, {}, {})
    module = load_handler_module(spec)
    clear_module_caches(module)
    return module


def handler(name: str, directory: str) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    return handler_module(name, directory).lambda_handler  # type: ignore[no-any-return]


@pytest.fixture
def order_store_env(
    order_database: ConnectionSettings, template: Template, monkeypatch: pytest.MonkeyPatch, aws: None
) -> None:
    for name, value in order_store_environment(order_database, template).items():
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


# --- the migration custom resource (OrderDatabaseSchema) ----------------------------------------------
Migrate = Callable[..., dict[str, Any]]
MIGRATION_TIMEOUT_SECONDS = 300  # the function's Timeout in the template


def relay_state(settings: ConnectionSettings) -> tuple[str, bool]:
    with connect(settings) as connection:
        found = connection.execute("SELECT mode FROM outbox_relay").fetchone()
        assert found is not None
        return found[0], replication.slot_exists(connection, replication.slot_name(settings.dbname))


@pytest.fixture
def migrate(
    order_store_env: None, order_database: ConnectionSettings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Migrate]:
    """migrate(request_type, properties, old=None): CloudFormation's request to the migration function,
    whose environment says polling; returns its answer (PUT to the presigned URL, captured here). The
    relay is polling again afterwards."""
    monkeypatch.setenv("POSTGRES_RELAY", "polling")  # what a version published before a switch holds
    reset_process_state()
    module = handler_module(
        "OrderDatabaseMigrationFunction", "order_database_migration", MIGRATION_TIMEOUT_SECONDS
    )
    answers: list[dict[str, Any]] = []

    def request(method: str, url: str, body: bytes, **_: Any) -> SimpleNamespace:
        answers.append(json.loads(body))
        return SimpleNamespace(status=200)

    monkeypatch.setattr(
        module, "urllib3", SimpleNamespace(PoolManager=lambda: SimpleNamespace(request=request))
    )

    def _migrate(
        request_type: str,
        properties: dict[str, Any],
        old: dict[str, Any] | None = None,
        context: LambdaContext | None = None,
        physical_id: str = "order-database-schema",
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "RequestType": request_type,
            "ResponseURL": "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/r",
            "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/shop/1",
            "RequestId": f"request-{len(answers)}",
            "LogicalResourceId": "OrderDatabaseSchema",
            "ResourceType": "Custom::OrderDatabaseSchema",
            "ResourceProperties": {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:m:live"}
            | properties,
        }
        if request_type != "Create":
            event["PhysicalResourceId"] = physical_id
        if old is not None:
            event["OldResourceProperties"] = old
        module.lambda_handler(event, context or LambdaContext(timeout_seconds=MIGRATION_TIMEOUT_SECONDS))
        return answers[-1]

    yield _migrate
    with connect(order_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'polling'")
        replication.drop_publication_and_slot(connection, replication.slot_name(order_database.dbname))


def test_the_migration_switches_to_the_relay_cloudformation_sends_not_the_one_in_its_environment(
    migrate, order_database
):
    # PostgresRelay polling -> logical: the version behind the alias still says polling.
    switched = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"})
    on_logical = relay_state(order_database)
    # A rollback sends the previous properties back: the relay follows them.
    rolled_back = migrate("Update", {"RelayMode": "polling"}, old={"RelayMode": "logical"})

    assert (switched["Status"], switched["Data"]["Relay"]) == ("SUCCESS", "logical"), switched
    assert on_logical == ("logical", True)
    assert (rolled_back["Status"], rolled_back["Data"]["Relay"]) == ("SUCCESS", "polling"), rolled_back
    assert relay_state(order_database) == ("polling", False)


@pytest.mark.parametrize(
    ("request_type", "properties", "reason"),
    [
        ("Create", {}, "ResourceProperties.RelayMode is missing"),
        ("Update", {"FunctionVersion": "2"}, "ResourceProperties.RelayMode is missing"),
        (
            "Update",
            {"RelayMode": "wal"},
            "ResourceProperties.RelayMode is 'wal', not one of polling, logical",
        ),
    ],
)
def test_the_migration_refuses_a_request_without_a_valid_relay_mode_and_changes_nothing(
    migrate, order_database, request_type, properties, reason
):
    answer = migrate(request_type, properties, old=None if request_type == "Create" else {})

    assert answer["Status"] == "FAILED"
    assert reason in answer["Reason"]
    assert relay_state(order_database) == ("polling", False)


def test_a_rollback_to_the_template_before_the_relay_mode_property_follows_the_environment(
    migrate, order_database
):
    """The previous template had no RelayMode: its rollback must not fail (the stack would be left in
    UPDATE_ROLLBACK_FAILED); the relay is then what that template meant, the function's environment."""
    migrate("Update", {"RelayMode": "logical"}, old={})

    answer = migrate("Update", {"FunctionVersion": "1"}, old={"RelayMode": "logical"})

    assert (answer["Status"], answer["Data"]["Relay"]) == ("SUCCESS", "polling"), answer
    assert relay_state(order_database) == ("polling", False)


def test_a_delete_needs_no_relay_mode_and_drops_the_slot(migrate, order_database):
    migrate("Create", {"RelayMode": "logical"})

    answer = migrate("Delete", {})

    assert answer["Status"] == "SUCCESS", answer
    assert relay_state(order_database)[1] is False


# The custom resource always answers, before its deadline: one test per way it can go.
@pytest.fixture
def migration_module(migrate: Migrate) -> Any:
    import sys

    return sys.modules["fn_OrderDatabaseMigrationFunction"]


def test_the_migration_answers_failed_at_once_when_too_little_time_is_left(
    migrate, migration_module, order_database
):
    context = LambdaContext(timeout_seconds=migration_module.ANSWER_SECONDS + 2)
    started = time.monotonic()

    answer = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"}, context=context)

    assert answer["Status"] == "FAILED"
    assert "too little to migrate or switch anything" in answer["Reason"]
    assert time.monotonic() - started < 2
    assert relay_state(order_database) == ("polling", False)


def test_the_migration_answers_failed_with_the_reason_when_the_outbox_lock_is_not_granted(
    migrate, migration_module, order_database, database, monkeypatch
):
    """A transaction holds the outbox (a publisher round, a long write): the switch waits LOCK_WAIT_SECONDS
    at most (writers queue behind it meanwhile), then answers FAILED, the relay unchanged."""
    place_orders(database, 1)
    monkeypatch.setattr(migration_module, "LOCK_WAIT_SECONDS", 0.3)
    with connect(order_database) as holder, holder.transaction():
        holder.execute("LOCK TABLE outbox IN ROW SHARE MODE")
        started = time.monotonic()
        answer = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"})
        waited = time.monotonic() - started

    assert answer["Status"] == "FAILED"
    assert "LockNotAvailable" in answer["Reason"]
    assert "deploy again" in answer["Reason"]
    assert waited < 5
    assert relay_state(order_database)[0] == "polling"


def test_the_migration_answers_failed_when_a_statement_runs_past_its_time(
    migrate, migration_module, order_database, monkeypatch
):
    """Every statement runs under a statement_timeout no longer than the function's time left (less what
    the answer needs): one that runs longer (here the handover's last statement, made to sleep by a
    trigger) is cancelled, its transaction rolled back, and FAILED is answered before the deadline."""
    monkeypatch.setattr(migration_module, "ANSWER_SECONDS", 0.5)
    monkeypatch.setattr(migration_module, "MIN_WORK_SECONDS", 0.1)
    with connect(order_database) as connection:
        connection.execute(
            "CREATE FUNCTION slow_switch() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(5); RETURN NEW; END $$"
        )
        connection.execute(
            "CREATE TRIGGER slow_switch BEFORE UPDATE ON outbox_relay"
            " FOR EACH ROW EXECUTE FUNCTION slow_switch()"
        )
    try:
        context = LambdaContext(timeout_seconds=2.5)
        started = time.monotonic()
        answer = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"}, context=context)
        took = time.monotonic() - started
    finally:
        with connect(order_database) as connection:
            connection.execute("DROP TRIGGER slow_switch ON outbox_relay")
            connection.execute("DROP FUNCTION slow_switch()")

    assert answer["Status"] == "FAILED"
    assert "ran past the time the function had left" in answer["Reason"]
    assert took < 2.5
    assert relay_state(order_database)[0] == "polling"


def test_the_migration_fetches_a_password_it_could_not_get_again_rather_than_fail_the_deploy(
    migrate, migration_module, order_database, monkeypatch
):
    """The secret's client gives up within 5 s (the order API's budget): a deploy, with minutes, tries
    again; a FAILED answer would roll the deploy back for a hiccup of Secrets Manager."""
    fetched: list[bool] = []
    made: Callable[[Any], ConnectionSettings] = migration_module.connection_settings

    def flaky(settings: Any) -> ConnectionSettings:
        def password(refresh: bool) -> str | None:
            fetched.append(refresh)
            if len(fetched) <= 2:
                raise PasswordUnavailable("Secrets Manager: ThrottlingException")
            return None  # the embedded server trusts its socket

        return dataclasses.replace(made(settings), password=password)

    monkeypatch.setattr(migration_module, "connection_settings", flaky)
    monkeypatch.setattr(migration_module, "PASSWORD_RETRY_SECONDS", 0.01)

    answer = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"})

    assert answer["Status"] == "SUCCESS"
    assert len(fetched) >= 3
    assert relay_state(order_database) == ("logical", True)


def test_the_migration_answers_failed_when_the_password_stays_out_of_reach_within_its_time(
    migrate, migration_module, order_database, monkeypatch
):
    made: Callable[[Any], ConnectionSettings] = migration_module.connection_settings

    def unreachable(settings: Any) -> ConnectionSettings:
        def password(refresh: bool) -> str | None:
            raise PasswordUnavailable("Secrets Manager: connect timeout")

        return dataclasses.replace(made(settings), password=password)

    monkeypatch.setattr(migration_module, "connection_settings", unreachable)
    monkeypatch.setattr(migration_module, "PASSWORD_RETRY_SECONDS", 0.2)
    monkeypatch.setattr(migration_module, "ANSWER_SECONDS", 0.5)
    monkeypatch.setattr(migration_module, "MIN_WORK_SECONDS", 0.5)
    started = time.monotonic()

    answer = migrate(
        "Update",
        {"RelayMode": "logical"},
        old={"RelayMode": "polling"},
        context=LambdaContext(timeout_seconds=2),
    )

    assert answer["Status"] == "FAILED"
    assert "PasswordUnavailable" in answer["Reason"]
    assert time.monotonic() - started < 2
    assert relay_state(order_database) == ("polling", False)


def test_the_migration_answers_failed_when_its_settings_are_missing(migrate, order_database, monkeypatch):
    monkeypatch.delenv("DATABASE_HOST")
    reset_process_state()

    answer = migrate("Update", {"RelayMode": "logical"}, old={"RelayMode": "polling"})

    assert answer["Status"] == "FAILED"
    assert "DATABASE_HOST" in answer["Reason"]
    assert relay_state(order_database) == ("polling", False)


def test_a_create_that_cannot_reach_the_database_fails_with_an_id_whose_delete_succeeds_at_once(
    migrate, order_database, monkeypatch
):
    """CloudFormation rolls a failed Create back with a Delete of the FAILED answer's physical id: a Delete
    that connected would fail too on the same unreachable database (ROLLBACK_FAILED, then DELETE_FAILED
    at `sam delete`). Nothing was created, the id says so, and its Delete connects to nothing."""
    monkeypatch.setenv("DATABASE_HOST", "127.0.0.1")
    monkeypatch.setenv("DATABASE_PORT", "1")  # nothing listens there
    reset_process_state()

    create = migrate("Create", {"RelayMode": "logical"})
    delete = migrate("Delete", {"RelayMode": "logical"}, physical_id=create["PhysicalResourceId"])

    assert create["Status"] == "FAILED"
    assert "OperationalError" in create["Reason"], create  # the connection refused
    assert create["PhysicalResourceId"] == "order-database-schema-not-created"
    assert delete["Status"] == "SUCCESS", delete
    assert delete["PhysicalResourceId"] == "order-database-schema-not-created"


def test_the_delete_of_a_created_schema_still_connects_and_fails_when_the_database_is_out_of_reach(
    migrate, order_database, monkeypatch
):
    monkeypatch.setenv("DATABASE_HOST", "127.0.0.1")
    monkeypatch.setenv("DATABASE_PORT", "1")
    reset_process_state()

    delete = migrate("Delete", {"RelayMode": "polling"})

    assert delete["Status"] == "FAILED"
    assert delete["PhysicalResourceId"] == "order-database-schema"


def test_a_create_that_failed_after_reaching_the_database_keeps_the_id_whose_delete_drops_the_slot(
    migrate, migration_module, order_database, database, monkeypatch
):
    """A switch to logical creates the slot before it waits for the outbox: a Create failing there has
    changed the database, so its rollback's Delete must connect and drop the slot (it holds WAL)."""
    place_orders(database, 1)
    monkeypatch.setattr(migration_module, "LOCK_WAIT_SECONDS", 0.3)
    with connect(order_database) as holder, holder.transaction():
        holder.execute("LOCK TABLE outbox IN ROW SHARE MODE")
        create = migrate("Create", {"RelayMode": "logical"})
    left = relay_state(order_database)

    delete = migrate("Delete", {"RelayMode": "logical"}, physical_id=create["PhysicalResourceId"])

    assert create["Status"] == "FAILED"
    assert create["PhysicalResourceId"] == "order-database-schema"
    assert left == ("polling", True)  # the slot the failed Create left
    assert delete["Status"] == "SUCCESS", delete
    assert relay_state(order_database) == ("polling", False)


def response_event() -> dict[str, Any]:
    return {
        "RequestType": "Update",
        "ResponseURL": "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/r",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/shop/1",
        "RequestId": "request-1",
        "LogicalResourceId": "OrderDatabaseSchema",
        "PhysicalResourceId": "order-database-schema",
    }


def test_a_long_non_ascii_reason_is_cut_to_fit_cloudformations_4096_bytes(migration_module, monkeypatch):
    """CloudFormation takes a response body of 4,096 bytes at most and reports only "Response object is
    too long" past them; JSON escapes each non-ASCII character to 6 bytes (a German server message)."""
    bodies: list[bytes] = []

    def request(method: str, url: str, body: bytes, **_: Any) -> SimpleNamespace:
        bodies.append(body)
        return SimpleNamespace(status=200)

    monkeypatch.setattr(
        migration_module, "urllib3", SimpleNamespace(PoolManager=lambda: SimpleNamespace(request=request))
    )
    reason = "CheckViolation: neue Zeile für Relation „outbox“ verletzt Check-Constraint „länge“ 🙂 " * 60
    short = "CheckViolation: neue Zeile für Relation „outbox“"

    migration_module.answer(response_event(), "FAILED", reason, {})
    migration_module.answer(response_event(), "FAILED", short, {})

    long_body, short_body = bodies
    assert 4096 - 12 < len(long_body) <= 4096  # as much of the reason as fits
    sent = json.loads(long_body)["Reason"]
    assert sent.endswith(" [cut]")
    assert reason.startswith(sent.removesuffix(" [cut]"))
    assert json.loads(short_body)["Reason"] == short


@pytest.mark.parametrize("refused", ["status", "error"])
def test_an_answer_that_does_not_reach_cloudformation_is_logged_not_raised(
    migration_module, monkeypatch, caplog, refused
):
    """An error would make Lambda run the request again (its asynchronous retries, when configured): a
    late run of an old request could undo what came after it. The stack waits for its ServiceTimeout."""
    from urllib3.exceptions import MaxRetryError

    def request(method: str, url: str, body: bytes, **_: Any) -> SimpleNamespace:
        if refused == "error":
            raise MaxRetryError(None, url, "connect timeout")  # type: ignore[arg-type]
        return SimpleNamespace(status=403)

    monkeypatch.setattr(
        migration_module, "urllib3", SimpleNamespace(PoolManager=lambda: SimpleNamespace(request=request))
    )

    migration_module.answer(response_event(), "SUCCESS", "applied 0 migration(s)", {})

    message = {
        "status": "CloudFormation refused the answer: the stack waits for the resource's ServiceTimeout",
        "error": "the answer did not reach CloudFormation: the stack waits for the resource's ServiceTimeout",
    }[refused]
    [logged] = logged_with(caplog, message)
    assert logged["request_id"] == "request-1"
    assert logged["levelname"] == "ERROR"
    if refused == "status":
        assert logged["status"] == 403


# --- the schema's migrations (yoyo), run again after a run that died --------------------------------------
@pytest.fixture
def fresh_database(postgres_server: ConnectionSettings) -> Iterator[ConnectionSettings]:
    """A database of its own, empty (no migration applied), dropped afterwards."""
    import uuid

    from psycopg import sql

    fresh = dataclasses.replace(postgres_server, dbname=f"fresh_{uuid.uuid4().hex[:12]}")
    name = sql.Identifier(fresh.dbname)
    with connect(postgres_server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    yield fresh
    with connect(postgres_server) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))


def test_a_migration_applied_but_not_recorded_by_a_run_that_died_is_applied_again_by_the_next(
    fresh_database, monkeypatch
):
    """yoyo commits a migration, then records it in a transaction of its own: a run that dies in between
    leaves it applied but unrecorded, and the next run applies it again. Every migration is safe to run
    again (IF NOT EXISTS), or that run, and every one after it, would fail (DuplicateColumn...)."""
    from yoyo.backends.base import DatabaseBackend

    from shop.adapters.postgres.schema import apply_migrations

    record = DatabaseBackend.mark_one

    def dies_before_recording(self: Any, migration: Any, *args: Any, **kwargs: Any) -> Any:
        if migration.id.startswith("0007"):
            raise RuntimeError("the run died between the migration's commit and its record")
        return record(self, migration, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(DatabaseBackend, "mark_one", dies_before_recording)
        with pytest.raises(RuntimeError, match="died"):
            apply_migrations(fresh_database)

    assert apply_migrations(fresh_database) == ["0007.outbox-pending-since"]
    # Every migration run again on the schema it made, its data kept (the relay's mode a deploy switched).
    with connect(fresh_database) as connection:
        connection.execute("UPDATE outbox_relay SET mode = 'logical'")
        connection.execute("DELETE FROM _yoyo_migration")
    assert len(apply_migrations(fresh_database)) == len(list(MIGRATIONS.glob("*.sql")))
    with connect(fresh_database) as connection:
        assert connection.execute("SELECT mode FROM outbox_relay").fetchall() == [("logical",)]


DYING_RUN = """
import sys
from pathlib import Path
from shop.adapters.postgres import schema
from shop.adapters.postgres.connection import ConnectionSettings
host, port, dbname, user, migrations = sys.argv[1:]
schema.MIGRATIONS = Path(migrations)
schema.apply_migrations(ConnectionSettings(host, int(port), dbname, user, lambda refresh: None))
"""


def test_a_migration_run_that_dies_mid_migration_leaves_nothing_that_stops_the_next(fresh_database, tmp_path):
    """A run killed while it migrates (a Lambda timeout or crash: SIGKILL, no `finally`) leaves yoyo's lock
    row behind; before, every later run waited for it and failed (LockTimeout: "run yoyo break-lock"),
    the deploy's rollback included. The migration lock died with the run's session: the next run takes
    it, deletes the dead run's row, and migrates."""
    import os
    import signal
    import subprocess
    import sys

    from shop.adapters.postgres.schema import apply_migrations

    apply_migrations(fresh_database)
    for path in MIGRATIONS.glob("*.sql"):
        shutil.copy(path, tmp_path)
    (tmp_path / "0099.slow.sql").write_text("SELECT pg_sleep(30);\n")
    s = fresh_database
    child = subprocess.Popen(
        [sys.executable, "-c", DYING_RUN, s.host, str(s.port), s.dbname, s.user, str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "layers" / "shared"), str(ROOT)])),
    )
    try:
        with connect(fresh_database) as connection:
            deadline = time.monotonic() + 20
            while not connection.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND query LIKE 'SELECT pg_sleep(30)%%'",
                (s.dbname,),
            ).fetchone():
                assert time.monotonic() < deadline, "the run never reached its slow migration"
                time.sleep(0.05)
            assert connection.execute("SELECT count(*) FROM yoyo_lock").fetchone() == (1,)
        child.send_signal(signal.SIGKILL)
        child.wait()

        started = time.monotonic()
        assert apply_migrations(fresh_database, lock_wait_seconds=1.0) == []
        took = time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    with connect(fresh_database) as connection:
        assert connection.execute("SELECT count(*) FROM yoyo_lock").fetchone() == (0,)
    assert took < 1.0


def test_two_migration_runs_at_once_take_turns_and_the_second_fails_saying_why_when_the_first_is_slow(
    fresh_database,
):
    """The migration lock serializes runs: a run finding it held waits `lock_wait_seconds`, then fails
    (LockNotAvailable, which the migration function explains) naming the server process that holds it,
    having applied nothing."""
    import psycopg

    from shop.adapters.postgres.schema import MIGRATION_LOCK, apply_migrations

    with connect(fresh_database) as other_run:
        other_run.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
        holder = other_run.info.backend_pid
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable, match=f"server process {holder}"):
            apply_migrations(fresh_database, lock_wait_seconds=0.5)
        waited = time.monotonic() - started
        other_run.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATION_LOCK)
        assert len(apply_migrations(fresh_database)) == len(list(MIGRATIONS.glob("*.sql")))

    assert 0.5 <= waited < 2


def test_a_migration_of_several_slow_statements_is_cancelled_at_the_runs_deadline(
    fresh_database, monkeypatch, tmp_path
):
    """The deadline is the run's, not each statement's: three statements of 1.5 s under a 2 s budget, each
    within a statement_timeout of the time left when the run started, took 4.6 s and were never
    cancelled, past the function's own deadline (no answer to CloudFormation). Now the statement running
    at the deadline is cancelled, its migration rolled back and unrecorded, and the run raises in time."""
    import psycopg

    from shop.adapters.postgres import schema

    schema.apply_migrations(fresh_database)
    for path in MIGRATIONS.glob("*.sql"):
        shutil.copy(path, tmp_path)
    (tmp_path / "0099.slow.sql").write_text("SELECT pg_sleep(1.5);\n" * 3)
    monkeypatch.setattr(schema, "MIGRATIONS", tmp_path)
    budget = 2.0
    started = time.monotonic()

    with pytest.raises(psycopg.errors.QueryCanceled, match=r"ran past its 2\.0 s"):
        schema.apply_migrations(fresh_database, seconds_left=lambda: budget - (time.monotonic() - started))
    took = time.monotonic() - started

    assert took < budget + 0.5
    with connect(fresh_database) as connection:
        assert connection.execute(
            "SELECT count(*) FROM _yoyo_migration WHERE migration_id = '0099.slow'"
        ).fetchone() == (0,)
        assert connection.execute("SELECT count(*) FROM yoyo_lock").fetchone() == (0,)


def test_the_migrations_connections_have_the_keepalives_and_tcp_user_timeout_of_the_functions(
    fresh_database, monkeypatch
):
    """A network path gone silent never delivers a cancellation: the kernel ends the connection in seconds
    (shop.adapters.postgres.connection), and the run fails in time instead of waiting past its deadline."""
    import psycopg

    from shop.adapters.postgres import connection as limits
    from shop.adapters.postgres.schema import apply_migrations

    given: list[dict[str, str]] = []
    connect_for_real = psycopg.connect

    def recording(*args: Any, **kwargs: Any) -> psycopg.Connection:
        opened = connect_for_real(*args, **kwargs)
        given.append(opened.info.get_parameters())
        return opened

    monkeypatch.setattr(psycopg, "connect", recording)
    apply_migrations(fresh_database, seconds_left=lambda: 60.0)

    assert given  # yoyo's connection, and one per migration
    expected = {
        "keepalives": "1",
        "keepalives_idle": str(limits.KEEPALIVES_IDLE_SECONDS),
        "keepalives_interval": str(limits.KEEPALIVES_INTERVAL_SECONDS),
        "keepalives_count": str(limits.KEEPALIVES_COUNT),
        "tcp_user_timeout": str(limits.TCP_USER_TIMEOUT_MS),
    }
    for parameters in given:
        assert {name: parameters.get(name) for name in expected} == expected
