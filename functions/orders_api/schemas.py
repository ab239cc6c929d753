"""HTTP contract of the order API: request bodies, validated strictly (no coercion, no unknown fields)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from shop.domain.orders import MAX_LINES, OrderLine, PlaceOrder

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
    items: Annotated[list[OrderLineRequest], Field(min_length=1, max_length=MAX_LINES)]

    def to_command(self) -> PlaceOrder:
        return PlaceOrder(
            customer_id=self.customerId,
            currency=self.currency,
            lines=tuple(OrderLine(i.sku, i.quantity, i.unitPrice) for i in self.items),
        )
