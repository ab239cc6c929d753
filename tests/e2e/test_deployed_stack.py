"""The saga on a deployed stack. Needs STACK_NAME and AWS credentials; skipped otherwise."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

STACK_NAME = os.environ.get("STACK_NAME")


def _credentials() -> Any:
    return boto3.session.Session().get_credentials()


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not STACK_NAME, reason="set STACK_NAME to the deployed stack to run the e2e tests"),
    pytest.mark.skipif(_credentials() is None, reason="no AWS credentials in the environment"),
]


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    stack = boto3.client("cloudformation").describe_stacks(StackName=str(STACK_NAME))["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}


def call(
    method: str, url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> Any:
    """A SigV4-signed request (the API's default auth is AWS_IAM)."""
    data = json.dumps(body) if body is not None else None
    request = AWSRequest(
        method=method, url=url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    SigV4Auth(_credentials(), "execute-api", boto3.session.Session().region_name or "us-east-1").add_auth(
        request
    )
    return requests.request(method, url, data=data, headers=dict(request.headers), timeout=30)


def test_an_order_is_confirmed_end_to_end(outputs: dict[str, str]):
    api = outputs["ApiUrl"]
    body = {
        "customerId": "c-e2e",
        "currency": "USD",
        "items": [{"sku": "SKU-RED-MUG", "quantity": 1, "unitPrice": 100}],
    }
    created = call("POST", f"{api}/orders", body, {"Idempotency-Key": str(uuid.uuid4())})
    assert created.status_code == 201, created.text
    order_id = created.json()["orderId"]
    deadline = time.monotonic() + 60
    status = "PENDING"
    while status == "PENDING" and time.monotonic() < deadline:
        time.sleep(1)
        status = call("GET", f"{api}/orders/{order_id}").json()["status"]
    assert status == "CONFIRMED"
