"""Fixtures the tools' tests borrow from the product's tests, for the tests that drive product code:
template.yaml read once (`template`), moto with the template's tables (`aws`), a handler invoked with
the template's environment (`invoke`), the order API (`api`) and a migrated PostgreSQL
(`postgres_server`). Defined in tests/conftest.py and tests/unit/conftest.py; imported here, pytest
finds them for every test under tools/.
"""

from tests.conftest import fake_credentials, invoke, postgres_server, template
from tests.unit.conftest import api, aws

__all__ = ["api", "aws", "fake_credentials", "invoke", "postgres_server", "template"]
