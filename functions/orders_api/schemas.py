"""HTTP contract of the order API as pydantic and Powertools types: strict bodies (no coercion, no unknown
fields) and the routes' typed parameters. The one place these rules are declared.

Not imported by the handler (its cold start would pay for pydantic), and the layer does not ship pydantic:
this module runs in the development environment, where `make docs` generates from it
the OpenAPI document (tools/docs/openapi.py, from `declare_routes`) and the JSON Schemas the handler
validates requests with (request_schemas.json beside this file, from `request_schemas`; validation.py).
tests/unit/test_request_validation.py checks that file against this module and the handler's verdicts
against `CreateOrderRequest` on every edge of its rules and on a thousand generated bodies.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from shop.domain.orders import MAX_LINES

MIN_LINES = 1
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)

Sku = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
CustomerId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
Currency = Annotated[str, Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code")]


class OrderLineRequest(BaseModel):
    model_config = _STRICT

    sku: Sku
    quantity: Annotated[int, Field(gt=0, le=10_000)]
    unitPrice: Annotated[int, Field(ge=0, le=100_000_000, description="minor units (cents), an integer")]


class CreateOrderRequest(BaseModel):
    model_config = _STRICT

    customerId: CustomerId
    currency: Currency
    items: Annotated[list[OrderLineRequest], Field(min_length=MIN_LINES, max_length=MAX_LINES)]


OrderId = Annotated[str, Path(min_length=1, max_length=64)]


def declare_routes(resolver: APIGatewayRestResolver) -> None:
    """The handler's routes (same methods, paths and function names) with their typed parameters."""

    @resolver.post("/orders")
    def create_order(body: Annotated[CreateOrderRequest, Body()]) -> None: ...

    @resolver.get("/orders/<orderId>")
    def get_order(orderId: OrderId) -> None: ...

    @resolver.post("/orders/<orderId>/cancel")
    def cancel_order(orderId: OrderId) -> None: ...


def request_schemas() -> dict[str, Any]:
    """The JSON Schemas (draft 2020-12) of what the handler validates: the create-order body and the
    orderId path parameter. JSON Schema cannot say "strict": validation.py adds pydantic's strict integers."""
    return {
        "body": CreateOrderRequest.model_json_schema(),
        "orderId": TypeAdapter(OrderId).json_schema(),
    }
