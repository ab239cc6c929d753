"""Fixtures the tools' tests borrow from the product's tests, for the tests that drive product code:
template.yaml read once (`template`), moto with the template's tables (`aws`), a handler invoked with
the template's environment (`invoke`) and the order API (`api`). Defined in tests/conftest.py and
tests/unit/conftest.py; imported here, pytest finds them for every test under tools/.
"""

from tests.conftest import fake_credentials, invoke, template
from tests.unit.conftest import api, aws

__all__ = ["api", "aws", "fake_credentials", "invoke", "template"]
