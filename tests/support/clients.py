"""The product's DynamoDB client with its TransactWriteItems routed through a test's function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import shop.adapters.aws

Transact = Callable[[Any, dict[str, Any]], Any]  # (the real client, the call's keyword arguments)


def intercept_transactions(monkeypatch: pytest.MonkeyPatch, transact: Transact) -> None:
    """Every client the product builds is the real one, but TransactWriteItems goes through `transact`
    (which may fail before or after calling the real client)."""
    real_client = shop.adapters.aws.dynamodb

    class Intercepted:
        def __init__(self) -> None:
            self.client = real_client()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def transact_write_items(self, **kwargs: Any) -> Any:
            return transact(self.client, kwargs)

    monkeypatch.setattr(shop.adapters.aws, "dynamodb", Intercepted)
