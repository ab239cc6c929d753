"""The order API's request rules, checked on the hot path without pydantic.

Why not pydantic at run time: importing it with Powertools' OpenAPI validation cost the API about 60 ms of
CPU on every cold start, more than all its other imports together (docs/performance.md, Cold start). The
contract stays a pydantic model in schemas.py, from which the OpenAPI document is generated; this module
must accept and refuse exactly what that model does, with pydantic's messages, in pydantic's order:
tests/unit/test_request_validation.py holds the two together on thousands of generated bodies.
"""

from __future__ import annotations

import re
from typing import Any

from shop.domain.orders import MAX_LINES, OrderLine, PlaceOrder

Fields = list[dict[str, str]]  # [{"field": "items.0.quantity", "message": "..."}], the 422's details.fields
Path = tuple[str | int, ...]


class InvalidRequest(Exception):
    def __init__(self, fields: Fields) -> None:
        super().__init__(f"{len(fields)} invalid field(s)")
        self.fields = fields


_NOT_UNICODE = "Input should be a valid string, unable to parse raw data as a unicode string"
_NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"


def _plural(bound: int, noun: str) -> str:
    return f"{bound} {noun}" if bound == 1 else f"{bound} {noun}s"


def _list_length(bound_kind: str, bound: int, length: int) -> str:
    return f"List should have {bound_kind} {_plural(bound, 'item')} after validation, not {length}"


def _report(fields: Fields, path: Path, message: str) -> None:
    fields.append({"field": ".".join(str(part) for part in path) or "body", "message": message})


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Plain classes, not dataclasses: generating a dataclass's methods costs about 0.5 ms of cold start each.
class TextRule:
    __slots__ = ("_regex", "max_length", "min_length", "pattern")

    def __init__(
        self, min_length: int | None = None, max_length: int | None = None, pattern: str | None = None
    ) -> None:
        self.min_length, self.max_length, self.pattern = min_length, max_length, pattern
        # pydantic matches patterns with Rust's regex, where `$` is the end of the text; in Python's `re` it
        # also matches before a final newline ("USD\n"), hence `\Z`.
        self._regex = re.compile(pattern.removesuffix("$") + r"\Z") if pattern is not None else None

    def check(self, value: Any, path: Path, fields: Fields) -> None:
        if not isinstance(value, str):
            _report(fields, path, "Input should be a valid string")
        elif not _is_unicode(value):  # JSON can carry a lone surrogate ("\\ud800"); pydantic refuses it
            _report(
                fields, path, "Input should be a valid string, unable to parse raw data as a unicode string"
            )
        elif self.min_length is not None and len(value) < self.min_length:
            _report(fields, path, f"String should have at least {_plural(self.min_length, 'character')}")
        elif self.max_length is not None and len(value) > self.max_length:
            _report(fields, path, f"String should have at most {_plural(self.max_length, 'character')}")
        elif self._regex is not None and not self._regex.match(value):
            _report(fields, path, f"String should match pattern '{self.pattern}'")


class IntegerRule:
    __slots__ = ("ge", "gt", "le")

    def __init__(self, gt: int | None = None, ge: int | None = None, le: int | None = None) -> None:
        self.gt, self.ge, self.le = gt, ge, le

    def check(self, value: Any, path: Path, fields: Fields) -> None:
        if type(value) is not int:  # strict: neither a bool nor 2.0 nor "2"
            _report(fields, path, "Input should be a valid integer")
        elif self.gt is not None and not value > self.gt:
            _report(fields, path, f"Input should be greater than {self.gt}")
        elif self.ge is not None and not value >= self.ge:
            _report(fields, path, f"Input should be greater than or equal to {self.ge}")
        elif self.le is not None and not value <= self.le:
            _report(fields, path, f"Input should be less than or equal to {self.le}")


class ObjectRule:
    """An object with exactly these fields, all required (pydantic: strict, extra="forbid")."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Rule]) -> None:
        self.fields = fields

    def check(self, value: Any, path: Path, fields: Fields) -> None:
        if not isinstance(value, dict):
            _report(fields, path, _NOT_AN_OBJECT)
            return
        # pydantic's order: the declared fields as declared, then each unknown key as given
        for name, rule in self.fields.items():
            if name in value:
                rule.check(value[name], (*path, name), fields)
            else:
                _report(fields, (*path, name), "Field required")
        for name in value:
            if name not in self.fields:
                _report(fields, (*path, name), "Extra inputs are not permitted")


class ListRule:
    __slots__ = ("item", "max_items", "min_items")

    def __init__(self, item: ObjectRule, min_items: int, max_items: int) -> None:
        self.item, self.min_items, self.max_items = item, min_items, max_items

    def check(self, value: Any, path: Path, fields: Fields) -> None:
        if not isinstance(value, list):
            _report(fields, path, "Input should be a valid list")
        elif len(value) > self.max_items:  # pydantic reports the length alone, not the items' own faults
            _report(
                fields,
                path,
                _list_length("at most", self.max_items, len(value)),
            )
        else:
            for index, item in enumerate(value):
                self.item.check(item, (*path, index), fields)
            if len(value) < self.min_items:
                _report(
                    fields,
                    path,
                    _list_length("at least", self.min_items, len(value)),
                )


Rule = TextRule | IntegerRule | ObjectRule | ListRule

SKU = TextRule(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
CUSTOMER_ID = TextRule(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
CURRENCY = TextRule(pattern=r"^[A-Z]{3}$")
QUANTITY = IntegerRule(gt=0, le=10_000)
UNIT_PRICE = IntegerRule(ge=0, le=100_000_000)
ORDER_ID = TextRule(min_length=1, max_length=64)
MIN_LINES = 1

ORDER_LINE = ObjectRule({"sku": SKU, "quantity": QUANTITY, "unitPrice": UNIT_PRICE})
CREATE_ORDER = ObjectRule(
    {"customerId": CUSTOMER_ID, "currency": CURRENCY, "items": ListRule(ORDER_LINE, MIN_LINES, MAX_LINES)}
)


def request_problems(body: Any) -> Fields:
    """What is wrong with a create-order body (parsed JSON; None when there was none), [] when nothing."""
    fields: Fields = []
    if body is None:
        _report(fields, ("body",), "Field required")
    else:
        CREATE_ORDER.check(body, (), fields)
    return fields


def place_order_command(body: Any) -> PlaceOrder:
    """The domain command of a valid create-order body; InvalidRequest naming every fault otherwise."""
    problems = request_problems(body)
    if problems:
        raise InvalidRequest(problems)
    return PlaceOrder(
        customer_id=body["customerId"],
        currency=body["currency"],
        lines=tuple(OrderLine(line["sku"], line["quantity"], line["unitPrice"]) for line in body["items"]),
    )


def check_order_id(order_id: str) -> None:
    fields: Fields = []
    ORDER_ID.check(order_id, ("orderId",), fields)
    if fields:
        raise InvalidRequest(fields)
