"""What the local API answers for a function's result, as API Gateway does: "If the Lambda API rejects the
invocation request, API Gateway returns a 500 error code. If the function runs but returns an error, or
returns a response in the wrong format, API Gateway returns a 502" with {"message": "Internal server
error"} (https://docs.aws.amazon.com/lambda/latest/dg/services-apigateway-errors.html)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tools.local.console.activity import ActivityLog
from tools.local.gateway.server import ApiServer, RouteTable, http_answer
from tools.local.pollers.event_sources import ApiRoute
from tools.local.runtime.functions import SYNC_PAYLOAD_LIMIT, InvocationResult


def answer(payload: Any) -> tuple[int, bytes]:
    found = http_answer(InvocationResult("req-1", payload=payload))
    return found.status, found.body


def test_a_proxy_response_is_served_as_written() -> None:
    ok = {"statusCode": 201, "headers": {"Location": "/orders/o-1"}, "body": '{"orderId": "o-1"}'}
    encoded = {"statusCode": 200, "isBase64Encoded": True, "body": base64.b64encode(b"\x00\x01").decode()}

    assert answer(ok) == (201, b'{"orderId": "o-1"}')
    assert answer(encoded) == (200, b"\x00\x01")
    assert answer({"statusCode": 204}) == (204, b"")


@pytest.mark.parametrize(
    "payload",
    [
        {"statusCode": 200, "body": {"a": 1}},  # was served as Python's repr, 200
        {"statusCode": 200, "body": 42},
        {"statusCode": 200, "headers": ["Content-Type"], "body": ""},  # was: no HTTP answer at all
        {"statusCode": 200, "multiValueHeaders": {"X": "not a list"}, "body": ""},
        {"statusCode": 200, "isBase64Encoded": True, "body": "not base64!"},  # was: no HTTP answer at all
        {"statusCode": "200", "body": ""},
        {"statusCode": True, "body": ""},
        {"body": "no status"},
        "a string",
        None,
        {"statusCode": 200, "body": "x" * SYNC_PAYLOAD_LIMIT},  # over Lambda's 6 MB response payload
    ],
)
def test_a_response_in_the_wrong_format_is_a_502_internal_server_error(payload: Any) -> None:
    assert answer(payload) == (502, json.dumps({"message": "Internal server error"}).encode())


class CountingFunction:
    def __init__(self) -> None:
        self.invocations = 0

    def invoke(self, event: dict[str, Any]) -> InvocationResult:
        self.invocations += 1
        return InvocationResult("req-1", payload={"statusCode": 200, "body": "ran"})


@pytest.mark.parametrize(("size", "status"), [(1_000_000, 200), (SYNC_PAYLOAD_LIMIT, 500)])
def test_a_request_over_lambdas_6_mb_never_reaches_the_function_and_is_a_500(size: int, status: int) -> None:
    route = ApiRoute(function="Api", name="Create", api="ServerlessRestApi", path="/orders", method="POST")
    function = CountingFunction()
    server = ApiServer(RouteTable([route], {}), {"Api": function}, {}, ActivityLog(), 0)  # type: ignore[dict-item]
    try:
        found = server.handle(
            "POST", "/orders", [("Content-Type", "application/json")], b"x" * size, "127.0.0.1"
        )
    finally:
        server.stop()

    assert found.status == status
    assert function.invocations == (1 if status == 200 else 0)
