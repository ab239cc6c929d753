"""The order API's request checks: the contract's JSON Schemas, validated by jsonschema-rs.

The contract is the pydantic model in schemas.py; `make docs` exports its JSON Schemas
to request_schemas.json, which is compiled here once per cold start (about 3 ms of CPU with the import,
where pydantic cost the API 60 ms: docs/performance.md, Cold start). tests/unit/test_request_validation.py
checks the file against the model and this module's verdicts against the model's on generated bodies.

Messages are jsonschema-rs's, with the caller's value masked ("the value is longer than 64 characters"),
so a 422 never echoes a large or hostile input; a key the caller made up is named, cut at NAME_CHARS, and
a 422 names at most MAX_FIELDS fields. Two guards keep pydantic's strictness where JSON Schema and
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

from shop.domain.orders import MAX_LINES, OrderLine, PlaceOrder

Fields = list[dict[str, str]]  # [{"field": "items.0.quantity", "message": "..."}], the 422's details.fields
Location = tuple[str | int, ...]

MASK = "the value"
# A 422 stays small whatever the body: at most this many fields are named (details.fieldsOmitted counts the
# rest), and a name the caller made up (an unknown key) is shown up to NAME_CHARS characters.
MAX_FIELDS = 100
NAME_CHARS = 64
# No valid body nests more than 3 levels. jsonschema-rs gives up at 255 (ValueError "Recursion limit
# reached") where Python's json parser does not, so a deeper value is refused here, before validation.
MAX_NESTING = 32
_STRICT_INTEGER = "x-strictInteger"  # a custom keyword of the compiled schemas, not of the contract's file


class InvalidRequest(Exception):
    def __init__(self, fields: Fields) -> None:
        super().__init__(f"{len(fields)} invalid field(s)")
        self.fields = fields[:MAX_FIELDS]
        self.omitted = len(fields) - len(self.fields)

    @property
    def details(self) -> dict[str, Any]:
        """The 422's details: the fields named, and how many more were wrong when not all are."""
        return {"fields": self.fields, **({"fieldsOmitted": self.omitted} if self.omitted else {})}


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


def _shown(part: str | int) -> str:
    text = str(part)
    return text if len(text) <= NAME_CHARS else f"{text[:NAME_CHARS]}…"


def _field(location: Location, message: str) -> dict[str, str]:
    return {"field": ".".join(_shown(part) for part in location) or "body", "message": message}


def _nested_too_deeply(value: Any, root: Location) -> Location | None:
    """Where a value nested deeper than MAX_NESTING sits: the top-level field that holds it (iterative: the
    value may be nested deeper than the interpreter's recursion limit)."""
    pending: list[tuple[Any, int, Location]] = [(value, 0, root)]
    while pending:
        node, depth, location = pending.pop()
        if depth > MAX_NESTING:
            return location
        children = (
            node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        )
        for key, child in children:
            pending.append((child, depth + 1, location if depth else (*location, key)))
    return None


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
    deep = _nested_too_deeply(value, root)
    if deep is not None:
        return [_field(deep, f"the value is nested more than {MAX_NESTING} levels deep")]
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
            # One error lists every unknown key: each field gets a message naming its own key only.
            fields.extend(
                _field(
                    (*location, name),
                    f"Additional properties are not allowed ('{_shown(name)}' was unexpected)",
                )
                for name in kind.unexpected
            )
        else:
            fields.append(_field(location, error.message))
    return fields


def request_problems(body: Any) -> Fields:
    """What is wrong with a create-order body (parsed JSON; None when there was none), [] when nothing.

    Lines past MAX_LINES + 1 are not validated one by one: the list is too long already (its maxItems
    fault is named), and jsonschema-rs lists every error at once (90,000 for 30,000 empty lines, half a
    second of CPU).
    """
    items = body.get("items") if isinstance(body, dict) else None
    if isinstance(items, list) and len(items) > MAX_LINES + 1:
        body = {**body, "items": items[: MAX_LINES + 1]}
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
