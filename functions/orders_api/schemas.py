"""HTTP contract of the order API as pydantic and Powertools types: strict bodies (no coercion, no unknown
fields) and the routes' typed parameters.

Not imported by the handler (its cold start would pay for pydantic), and the layer does not ship pydantic:
this module runs in the development environment, where the OpenAPI document (tools/chaos/openapi.py) is
generated from `declare_routes` and the hot-path validator (validation.py), which shares these rules'
bounds and patterns, is tested against `CreateOrderRequest` (tests/unit/test_request_validation.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.params import Body, Path
from pydantic import BaseModel, ConfigDict, Field
from validation import CURRENCY, CUSTOMER_ID, MIN_LINES, ORDER_ID, QUANTITY, SKU, UNIT_PRICE, TextRule

from shop.domain.orders import MAX_LINES


def _text(rule: TextRule, description: str | None = None) -> Any:
    return Field(
        min_length=rule.min_length, max_length=rule.max_length, pattern=rule.pattern, description=description
    )


_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)

Sku = Annotated[str, _text(SKU)]
CustomerId = Annotated[str, _text(CUSTOMER_ID)]
Currency = Annotated[str, _text(CURRENCY, "ISO 4217 code")]


class OrderLineRequest(BaseModel):
    model_config = _STRICT

    sku: Sku
    quantity: Annotated[int, Field(gt=QUANTITY.gt, le=QUANTITY.le)]
    unitPrice: Annotated[
        int, Field(ge=UNIT_PRICE.ge, le=UNIT_PRICE.le, description="minor units (cents), an integer")
    ]


class CreateOrderRequest(BaseModel):
    model_config = _STRICT

    customerId: CustomerId
    currency: Currency
    items: Annotated[list[OrderLineRequest], Field(min_length=MIN_LINES, max_length=MAX_LINES)]


OrderId = Annotated[str, Path(min_length=ORDER_ID.min_length, max_length=ORDER_ID.max_length)]


def declare_routes(resolver: APIGatewayRestResolver) -> None:
    """The handler's routes (same methods, paths and function names) with their typed parameters."""

    @resolver.post("/orders")
    def create_order(body: Annotated[CreateOrderRequest, Body()]) -> None: ...

    @resolver.get("/orders/<orderId>")
    def get_order(orderId: OrderId) -> None: ...

    @resolver.post("/orders/<orderId>/cancel")
    def cancel_order(orderId: OrderId) -> None: ...
