"""`make local ORDER_STORE=postgres`: the environment chooses the template's OrderStore parameter."""

from __future__ import annotations

import pytest

from tools.local.parameters import chosen_template


def test_the_order_store_defaults_to_the_templates_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORDER_STORE", raising=False)
    template = chosen_template()
    assert template.parameter_values["OrderStore"] == "dynamodb"
    assert not template.is_created("OrderDatabase")


def test_order_store_postgres_creates_the_order_database_and_its_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORDER_STORE", "postgres")
    template = chosen_template()
    assert template.is_created("OrderDatabase")
    assert template.is_created("OutboxPublisherFunction")


def test_an_unknown_order_store_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDER_STORE", "mysql")
    with pytest.raises(SystemExit, match="ORDER_STORE must be one of dynamodb, postgres"):
        chosen_template()
