"""Unit layer: AWS is moto in-process, and no test may open a socket."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from pytest_socket import disable_socket, enable_socket

from local.template import Template
from tests.conftest import reset_process_state

# The X-Ray SDK opens its (unconnected) UDP emitter socket at import: import it before sockets close.
import aws_xray_sdk.core  # noqa: F401  isort: skip


def pytest_runtest_setup() -> None:
    disable_socket(allow_unix_socket=True)


def pytest_runtest_teardown() -> None:
    enable_socket()


@pytest.fixture
def aws(fake_credentials: None, template: Template) -> Iterator[None]:
    """moto with every table of template.yaml created from its definition."""
    with mock_aws():
        reset_process_state()
        client = boto3.client("dynamodb")
        for logical_id in template.of_type("AWS::DynamoDB::Table"):
            client.create_table(**template.create_table_kwargs(logical_id))
        yield
        reset_process_state()
