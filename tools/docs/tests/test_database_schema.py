"""docs/order-database.sql is what the migrations make of an empty database (tools/docs/database_schema)."""

from __future__ import annotations

import difflib

from shop.adapters.postgres.connection import ConnectionSettings
from tools.docs.database_schema import SCHEMA_FILE, dump_schema


def test_a_database_migrated_from_zero_has_the_declared_schema(postgres_server: ConnectionSettings) -> None:
    migrated = dump_schema(postgres_server)  # the session's server, migrated from zero when it started
    declared = SCHEMA_FILE.read_text()
    diff = "".join(
        difflib.unified_diff(declared.splitlines(True), migrated.splitlines(True), "declared", "migrated")
    )
    assert not diff, f"{SCHEMA_FILE.name} is not what the migrations produce (run `make docs`):\n{diff}"
