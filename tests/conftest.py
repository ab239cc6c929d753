"""Fixtures shared by every test layer.

The local stack's fixtures are here too, so the layers that use it (tests/integration,
tests/conformance) share one of each per session:
- `local_services`: DynamoDB Local and moto server, shared by every stack of the session.
- `local_stack`: template.yaml exactly as `make local` runs it (seeded, API on a free port).
- `probe_stack`: template.yaml plus the test-only resources of integration/probe/fragment.yaml (stack
  name "probe", only the probe functions started), for the event source semantics.
Each fixture stops what it started and asserts that none of its processes is left. They import the
local stack (tests/local_stacks.py) only when a test asks for them: the unit layer, which loads this file
too, never imports the local stack; of tools.local only the PostgreSQL server's start
(services/embedded_postgres.py, for `postgres_server`; tests/unit/test_architecture.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

# Powertools reads these when shop.runtime.observability is first imported, which may be at collection.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "ServerlessOutboxTest")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "tests")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

import shop.adapters.aws
import shop.runtime.config
import shop.runtime.observability
from tests.support import LambdaContext, clear_module_caches, load_handler_module
from tools.template import Template

if TYPE_CHECKING:
    from shop.adapters.postgres.connection import ConnectionSettings, Database
    from tools.local.services.emulators import LocalServices
    from tools.local.stack import LocalStack

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def template() -> Template:
    return Template.load()


@pytest.fixture
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "ServerlessOutboxTest")
    monkeypatch.setenv("POWERTOOLS_DEV", "false")


def reset_process_state() -> None:
    shop.runtime.config.get_settings.cache_clear()
    shop.adapters.aws.reset_clients()
    shop.runtime.observability.metrics.clear_metrics()


Handler = Callable[..., Any]


@pytest.fixture
def invoke(
    template: Template, monkeypatch: pytest.MonkeyPatch, fake_credentials: None
) -> Iterator[Callable[..., Any]]:
    """invoke(logical_id, event) runs a function's handler with the environment the template gives it,
    and a Lambda context with the template's timeout unless given one (`context`)."""
    loaded: set[str] = set()

    def _invoke(
        logical_id: str,
        event: dict[str, Any],
        env: dict[str, str] | None = None,
        context: LambdaContext | None = None,
    ) -> Any:
        spec = template.function(logical_id)
        for name, value in {**spec.environment, **(env or {})}.items():
            monkeypatch.setenv(name, value)
        if env:
            reset_process_state()
            clear_module_caches(load_handler_module(spec))
        module = load_handler_module(spec)
        if logical_id not in loaded:
            clear_module_caches(module)
            reset_process_state()
            loaded.add(logical_id)
        handler_name = spec.handler.rsplit(".", 1)[1]
        context = context or LambdaContext(function_name=logical_id, timeout_seconds=spec.timeout)
        return getattr(module, handler_name)(event, context)

    yield _invoke
    reset_process_state()


# --- the order database (a real PostgreSQL: tools/local/services/embedded_postgres.py) -------------------
@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectionSettings]:
    """One PostgreSQL server for the session, migrated from zero (the migrations a deployment applies)."""
    from shop.adapters.postgres.schema import apply_migrations
    from tools.local.services.embedded_postgres import embedded_server

    with embedded_server(tmp_path_factory.mktemp("postgres")) as settings:
        apply_migrations(settings)
        yield settings


@pytest.fixture
def order_database(postgres_server: ConnectionSettings) -> ConnectionSettings:
    """The session's order database with every table empty."""
    from tests.support.postgres import empty_tables

    empty_tables(postgres_server)
    return postgres_server


@pytest.fixture
def database(order_database: ConnectionSettings) -> Iterator[Database]:
    """The product's connection to the emptied order database, closed after the test."""
    from shop.adapters.postgres.connection import Database

    connection = Database(order_database)
    yield connection
    connection.close()


# --- the local stack (tests/local_stacks.py, imported only when a test asks for it) --------------------
@pytest.fixture(scope="session")
def local_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    from tests import local_stacks

    yield from local_stacks.services_session(tmp_path_factory.mktemp("local-services"))


@pytest.fixture(scope="session")
def local_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    from tests import local_stacks

    yield from local_stacks.stack_session(local_services, tmp_path_factory.mktemp("local-stack"))


@pytest.fixture(scope="session")
def postgres_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    from tests import local_stacks

    yield from local_stacks.postgres_stack_session(local_services, tmp_path_factory.mktemp("postgres-stack"))


@pytest.fixture(scope="session")
def logical_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    from tests import local_stacks

    yield from local_stacks.logical_stack_session(local_services, tmp_path_factory.mktemp("logical-stack"))


SAGA_STACKS = {"dynamodb": "local_stack", "postgres": "postgres_stack", "postgres-logical": "logical_stack"}


@pytest.fixture(params=list(SAGA_STACKS))
def saga_stack(request: pytest.FixtureRequest) -> LocalStack:
    """The local stack of each order store and relay (the saga's tests run on all three)."""
    stack: LocalStack = request.getfixturevalue(SAGA_STACKS[request.param])
    return stack


@pytest.fixture(scope="session")
def probe_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    from tests import local_stacks

    yield from local_stacks.probe_stack_session(local_services, tmp_path_factory.mktemp("probe-stack"))
