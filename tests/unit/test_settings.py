"""shop.runtime.config.Settings: what a function reads from its environment, and how a missing or
misnamed setting fails."""

from __future__ import annotations

from functools import cache

import pytest

from shop.runtime.config import ConfigurationError, Settings


def test_a_required_setting_left_unset_names_its_environment_variable():
    settings = Settings.from_env({"EVENT_BUS_NAME": "orders-dev"})
    assert settings.require("event_bus_name") == "orders-dev"
    with pytest.raises(
        ConfigurationError, match=r"orders_table_name \(ORDERS_TABLE_NAME\) is not configured"
    ):
        settings.require("orders_table_name")


@pytest.mark.parametrize("name", ["count", "index", "orders_table"])
def test_a_name_that_is_no_setting_is_refused_even_where_a_tuple_has_that_attribute(name: str):
    with pytest.raises(AttributeError, match=f"no setting '{name}'"):
        Settings.from_env({}).require(name)


def test_settings_read_from_the_same_environment_are_one_cache_key_and_others_are_not():
    built: list[Settings] = []

    @cache
    def service(settings: Settings) -> int:
        built.append(settings)
        return len(built)

    assert service(Settings.from_env({"STAGE": "dev"})) == service(Settings.from_env({"STAGE": "dev"})) == 1
    assert service(Settings.from_env({"STAGE": "prod"})) == 2


def test_settings_cannot_be_changed_once_read():
    settings = Settings.from_env({})
    with pytest.raises(AttributeError):
        settings.stage = "prod"  # type: ignore[misc]
