"""The local API's caller identity (gateway/server.py): each request carries an IAM identity named by its
x-local-caller header (docs/local-stack.md), and the order API keeps those callers' Idempotency-Keys apart
as it does any two IAM principals' (tests/unit/test_idempotency_key_scope.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support import header, json_body, load_event
from tools.local.gateway.server import DEFAULT_LOCAL_CALLER, RouteTable, local_caller_arn, proxy_event
from tools.local.pollers.event_sources import read_event_sources
from tools.template import ACCOUNT, Template

API = "OrdersApiFunction"


def local_event(template: Template, extra_headers: list[tuple[str, str]]) -> dict[str, Any]:
    """POST /orders through the local API's event builder, with the template's route."""
    routes = [r for r in read_event_sources(template).routes if r.function == API]
    table = RouteTable(routes, {route.api: "dev" for route in routes})
    found = table.match("POST", "/dev/orders")
    assert found is not None
    route, parameters, resource_path = found
    body = load_event("api_create_order.json")["body"]
    return proxy_event(
        method="POST",
        raw_path="/dev/orders",
        resource_path=resource_path,
        route=route,
        path_parameters=parameters,
        query="",
        header_pairs=[
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "local-key-1"),
            *extra_headers,
        ],
        body=body.encode(),
        source_ip="127.0.0.1",
        api_id="local-api",
    )


def test_the_local_api_gives_each_request_an_iam_identity_named_by_x_local_caller(
    template: Template, api: Callable[..., dict[str, Any]]
) -> None:
    default = local_event(template, [])
    carol = local_event(template, [("x-local-caller", "carol")])

    assert default["requestContext"]["identity"]["userArn"] == local_caller_arn(DEFAULT_LOCAL_CALLER)
    assert local_caller_arn(DEFAULT_LOCAL_CALLER) == f"arn:aws:iam::{ACCOUNT}:user/local-user"
    assert carol["requestContext"]["identity"]["userArn"] == f"arn:aws:iam::{ACCOUNT}:user/carol"
    assert carol["requestContext"]["identity"]["accountId"] == ACCOUNT
    # And the order API keeps their keys apart: same key and body, two orders; a retry replays.
    first_default = api(default)
    first_carol = api(carol)
    carol_again = api(local_event(template, [("X-Local-Caller", "carol")]))
    assert first_default["statusCode"] == first_carol["statusCode"] == 201
    assert json_body(first_default)["orderId"] != json_body(first_carol)["orderId"]
    assert header(carol_again, "Idempotent-Replayed") == "true"
    assert json_body(carol_again)["orderId"] == json_body(first_carol)["orderId"]
