"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Powertools reads these when shop.observability is first imported, which may be at collection.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "ServerlessOutboxTest")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "tests")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

import shop.aws
import shop.config
import shop.observability
from local.template import Template
from tests.support import LambdaContext, clear_module_caches, load_handler_module

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
    shop.config.get_settings.cache_clear()
    shop.aws.reset_clients()
    shop.observability.metrics.clear_metrics()


Handler = Callable[..., Any]


@pytest.fixture
def invoke(
    template: Template, monkeypatch: pytest.MonkeyPatch, fake_credentials: None
) -> Iterator[Callable[..., Any]]:
    """invoke(logical_id, event) runs a function's handler with the environment the template gives it."""
    loaded: set[str] = set()

    def _invoke(logical_id: str, event: dict[str, Any], env: dict[str, str] | None = None) -> Any:
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
        context = LambdaContext(function_name=logical_id, timeout_seconds=spec.timeout)
        return getattr(module, handler_name)(event, context)

    yield _invoke
    reset_process_state()
