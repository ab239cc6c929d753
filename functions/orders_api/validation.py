"""The order API's request checks: the contract's JSON Schemas, validated by jsonschema-rs.

The contract is the pydantic model in schemas.py; `make docs` exports its JSON Schemas
to request_schemas.json, which is compiled here once per cold start (about 3 ms of CPU with the import,
where pydantic cost the API 60 ms: docs/performance.md, Cold start). tests/unit/test_request_validation.py
checks the file against the model and this module's verdicts against the model's on generated bodies.

Messages are jsonschema-rs's, with the caller's value masked ("the value is longer than 64 characters"),
so a 422 never echoes a large or hostile input. Two guards keep pydantic's strictness where JSON Schema and
the library differ from it (both tested):
- integers: to JSON Schema 1.0 is an integer (and jsonschema-rs accepts 1.0 and -0.0); to the contract
  (pydantic strict) no float is, so every `"type": "integer"` also gets the custom keyword below.
  Booleans jsonschema-rs already refuses where an integer is due, as pydantic does.
- lone surrogates: JSON may escape one ("\\ud800"), json.loads keeps it and jsonschema-rs cannot take a
  string that is not Unicode (UnicodeEncodeError); such a body is refused naming the fields that hold one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs

from shop.domain.orders import OrderLine, PlaceOrder

Fields = list[dict[str, str]]  # [{"field": "items.0.quantity", "message": "..."}], the 422's details.fields
Location = tuple[str | int, ...]

MASK = "the value"
_STRICT_INTEGER = "x-strictInteger"  # a custom keyword of the compiled schemas, not of the contract's file


class InvalidRequest(Exception):
    def __init__(self, fields: Fields) -> None:
        super().__init__(f"{len(fields)} invalid field(s)")
        self.fields = fields


class _StrictInteger:
    """jsonschema-rs keyword: an integral float (1.0, -0.0, 1e3) is not an integer (pydantic strict)."""

    def __init__(self, parent_schema: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        pass

    def validate(self, instance: Any) -> None:
        if isinstance(instance, float) and instance.is_integer():  # other floats fail "type" already
            raise ValueError(f'{MASK} is not of type "integer"')


def _with_strict_integers(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_with_strict_integers(part) for part in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _with_strict_integers(part) for key, part in schema.items()}
    if schema.get("type") == "integer":
        strict[_STRICT_INTEGER] = True
    return strict


def _compile(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator(
        _with_strict_integers(schema), mask=MASK, keywords={_STRICT_INTEGER: _StrictInteger}
    )


_SCHEMAS = json.loads(Path(__file__).with_name("request_schemas.json").read_text())
_BODY = _compile(_SCHEMAS["body"])
_ORDER_ID = _compile(_SCHEMAS["orderId"])


def _field(location: Location, message: str) -> dict[str, str]:
    return {"field": ".".join(str(part) for part in location) or "body", "message": message}


def _lone_surrogates(value: Any, location: Location) -> Iterator[Location]:
    """Where a string (or an object's key) that is not Unicode text sits in a parsed JSON value."""
    if isinstance(value, str):
        if not value.isascii() and not _is_unicode(value):
            yield location
    elif isinstance(value, dict):
        for key, item in value.items():
            if _is_unicode(key):
                yield from _lone_surrogates(item, (*location, key))
            else:
                yield (*location, key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _lone_surrogates(item, (*location, index))


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _problems(validator: jsonschema_rs.Validator, value: Any, root: Location = ()) -> Fields:
    try:
        errors = list(validator.iter_errors(value))
    except UnicodeEncodeError:
        message = "the value is not Unicode text (a lone surrogate)"
        return [_field(location, message) for location in _lone_surrogates(value, root)]
    fields: Fields = []
    for error in errors:
        location, kind = (*root, *error.instance_path), error.kind
        # "required" and "additionalProperties" fail on the object: name the field itself, as pydantic does
        if isinstance(kind, jsonschema_rs.ValidationErrorKind.Required):
            fields.append(_field((*location, kind.property), error.message))
        elif isinstance(kind, jsonschema_rs.ValidationErrorKind.AdditionalProperties):
            fields.extend(_field((*location, name), error.message) for name in kind.unexpected)
        else:
            fields.append(_field(location, error.message))
    return fields


def request_problems(body: Any) -> Fields:
    """What is wrong with a create-order body (parsed JSON; None when there was none), [] when nothing."""
    return _problems(_BODY, body)


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
    problems = _problems(_ORDER_ID, order_id, ("orderId",))
    if problems:
        raise InvalidRequest(problems)
