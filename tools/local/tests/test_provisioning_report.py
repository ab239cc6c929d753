"""The local stack's start-up summary accounts for every resource the template creates: provisioned,
emulated (by type, or one by one: the order database's nested application, a custom resource), or not
emulated with the reason; never "unknown" for what the stack does stand in for."""

from __future__ import annotations

import pytest

from tools.local.parameters import chosen_template
from tools.local.services.provisioning import other_resources
from tools.local.stack import stood_in_for

UNKNOWN = "resource type unknown to the local stack"


@pytest.mark.parametrize("order_store", ["dynamodb", "postgres"])
def test_no_resource_the_template_creates_is_unknown_to_the_local_stack(order_store: str) -> None:
    template = chosen_template({"ORDER_STORE": order_store})

    _, not_emulated = other_resources(template, stood_in_for(template))

    assert [line.logical_id for line in not_emulated if line.detail == UNKNOWN] == []


def test_the_order_database_and_its_schema_are_reported_emulated_with_how() -> None:
    template = chosen_template({"ORDER_STORE": "postgres"})

    emulated, _ = other_resources(template, stood_in_for(template))

    how = {line.logical_id: line.detail for line in emulated}
    assert (
        how["OrderDatabase"]
        == "a database of the embedded PostgreSQL server, its outputs as the nested stack's"
    )
    assert how["OrderDatabaseSchema"] == (
        "OrderDatabaseMigrationFunction gets its Create request at start-up, as from CloudFormation"
    )
