"""The API's request validation (functions/orders_api/validation.py: jsonschema-rs on the JSON Schemas
exported from the contract) against the contract itself, the pydantic model in schemas.py: the exported
schemas are the model's, and on every edge value of the contract's rules in every place of an order and
on a thousand bodies hypothesis generates, most of them nearly valid, the validator gives the model's
verdict and names the fields the model names."""

from __future__ import annotations

import copy
import functools
import importlib
import json
import re
import string
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from tests.support import json_body, load_event, load_handler_module
from tools.template import Template

FUNCTION = "OrdersApiFunction"
NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"
# Generated bodies: hypothesis draws one in milliseconds, where random.Random took microseconds, so a
# thousand keep this file's time near what 4,000 hand-rolled ones took. Every rule's edges are tried in
# every place besides, exhaustively (test_every_edge_value_in_every_place_gets_the_contracts_verdict).
CASES = 1000


@pytest.fixture(scope="module")
def modules() -> tuple[ModuleType, ModuleType]:
    spec = Template.load().function(FUNCTION)
    for directory in (*spec.layer_dirs, spec.code_uri):
        if str(directory) not in sys.path:
            sys.path.insert(0, str(directory))  # as Lambda puts the CodeUri and the layer on the path
    return importlib.import_module("schemas"), importlib.import_module("validation")


def test_the_schemas_the_handler_validates_with_are_the_contracts(modules):
    schemas, _ = modules
    spec = Template.load().function(FUNCTION)
    committed = json.loads((spec.code_uri / "request_schemas.json").read_text())

    assert committed == schemas.request_schemas(), (
        "run `make docs` and commit functions/orders_api/request_schemas.json"
    )


def pydantic_fields(schemas: ModuleType, body: Any) -> list[dict[str, str]]:
    """What Powertools' validation (enable_validation) reported for a body: a missing body is a missing
    field; otherwise the model's errors, their location without the leading "body"."""
    if body is None:
        return [{"field": "body", "message": "Field required"}]
    try:
        TypeAdapter(schemas.CreateOrderRequest).validate_python(body, from_attributes=True)
    except ValidationError as error:
        return [
            {"field": ".".join(str(part) for part in e["loc"]) or "body", "message": e["msg"]}
            for e in error.errors()
        ]
    return []


ODD_VALUES: list[Any] = [
    *("", " ", "USD\n", "usd", "US", "USDX", "EU R", "é", "ÉUR", "\ud800", "-x", ".x", "x" * 64, "x" * 65),
    *("c" * 128, "c" * 129, "a b", "a/b", "0", "10"),
    *(0, -1, 1, 2, 10_000, 10_001, 100_000_000, 100_000_001, 2**70, -(2**70)),
    *(1.0, 1.5, -0.0, float("nan"), float("inf"), True, False, None),
    *([], [1], ["x"], {}, {"a": 1}, {"sku": "A"}),
]
BODY_FIELD = st.sampled_from(["customerId", "currency", "items"])
LINE_FIELD = st.sampled_from(["sku", "quantity", "unitPrice"])
TEXT = st.text(st.characters(exclude_categories=()), max_size=8)  # lone surrogates too: JSON may escape one
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXT, inner, max_size=2),
    max_leaves=3,
)
ODD = st.sampled_from(ODD_VALUES).map(copy.deepcopy) | ANY_JSON  # half of them ODD_VALUES
NOT_A_LIST_OF_LINES = ODD.filter(lambda value: not (isinstance(value, list) and value))
BODY_EXTRA = st.sampled_from(["coupon", "items ", "Currency", "extra"]) | TEXT
LINE_EXTRA = st.sampled_from(["lineTotal", "SKU", "x"]) | TEXT
SKU_CHARS = string.ascii_letters + string.digits + "._-"


def identifier(edges: list[str], rest: str, max_size: int) -> st.SearchStrategy[str]:
    """A valid identifier: an edge case, or a letter or digit then up to max_size - 1 of `rest`."""
    alphanumeric = st.sampled_from(string.ascii_letters + string.digits)
    drawn = st.tuples(alphanumeric, st.text(rest, max_size=max_size - 1)).map("".join)
    return st.sampled_from(edges) | drawn


VALID_LINE = st.fixed_dictionaries(
    {
        "sku": identifier(["A", "sku-1", "a.b_c-d", "x" * 64, "9"], SKU_CHARS, 64),
        "quantity": st.sampled_from([1, 2, 9_999, 10_000]) | st.integers(1, 10_000),
        "unitPrice": st.sampled_from([0, 1, 1999, 100_000_000]) | st.integers(0, 100_000_000),
    }
)


@functools.cache
def repeated(values: st.SearchStrategy[Any], lengths: tuple[int, ...]) -> st.SearchStrategy[list[Any]]:
    """Lists of one of the lengths, of copies of one value (a long list is about its length; drawing each
    of 98 values would make a body dozens of times dearer to draw)."""
    return st.tuples(values, st.sampled_from(lengths)).map(
        lambda drawn: [copy.deepcopy(drawn[0]) for _ in range(drawn[1])]
    )


@functools.cache
def valid_body(max_lines: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "customerId": identifier(
                ["c", "customer-1", "c" * 128, "a.b_c:d@e-f", "0"], SKU_CHARS + ":@", 128
            ),
            "currency": st.sampled_from(["USD", "EUR", "JPY"])
            | st.text(string.ascii_uppercase, min_size=3, max_size=3),
            "items": repeated(VALID_LINE, (1, 2, 3, max_lines)),
        }
    )


def mutate(draw: st.DrawFn, body: dict[str, Any], max_lines: int) -> Any:
    lines = body["items"]
    line_objects = [line for line in lines if isinstance(line, dict)] or [{}]
    line = line_objects[draw(st.integers(0, len(line_objects) - 1))]
    kind = draw(st.integers(0, 10))
    if kind == 0:
        body[draw(BODY_FIELD)] = draw(ODD)
    elif kind == 1:
        line[draw(LINE_FIELD)] = draw(ODD)
    elif kind == 2:
        body.pop(draw(BODY_FIELD), None)
    elif kind == 3:
        line.pop(draw(LINE_FIELD), None)
    elif kind == 4:
        body[draw(BODY_EXTRA)] = draw(ODD)
    elif kind == 5:
        line[draw(LINE_EXTRA)] = draw(ODD)
    elif kind == 6:
        lines[draw(st.integers(0, len(lines) - 1))] = draw(ODD)
    elif kind == 7:
        body["items"] = draw(repeated(VALID_LINE, (0, max_lines, max_lines + 1, max_lines + 5)))
    elif kind == 8:
        body["items"] = lines + draw(repeated(ODD, (1, max(0, max_lines - len(lines)))))
    elif kind == 9:
        return draw(NOT_A_LIST_OF_LINES)
    else:
        body = dict(reversed(list(body.items())))  # key order must not change the order of the report
    return body


@st.composite
def bodies(draw: st.DrawFn, max_lines: int) -> Any:
    """A valid body (its fields at or near their bounds) after 0 to 3 mutations: most are nearly valid."""
    body: Any = draw(valid_body(max_lines))
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        if not isinstance(body, dict) or not isinstance(body.get("items"), list) or not body["items"]:
            break
        body = mutate(draw, body, max_lines)
    return body


def has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def within(field: str, parents: set[str]) -> bool:
    return any(field == parent or field.startswith(f"{parent}.") for parent in parents)


def assert_same_fields(named: set[str], expected: set[str], body: Any) -> None:
    """The fields the validator names are the contract's, with two differences that only add detail or
    take it away inside a field the contract names too:
    - a list past its maximum: pydantic reports the length alone, JSON Schema also the items' faults;
    - a lone surrogate (validation.py): the validator names the fields holding one and nothing else."""
    assert all(within(field, expected) for field in named), body
    if has_lone_surrogate(body):
        assert named, body
    else:
        assert expected <= named, body


def assert_same_verdict(schemas: ModuleType, validation: ModuleType, body: Any) -> list[dict[str, str]]:
    """The validator refuses `body` if and only if the contract does, naming the contract's fields, and
    makes of an accepted body the order the model reads in it. Returns the contract's errors."""
    expected = pydantic_fields(schemas, body)
    problems = validation.request_problems(copy.deepcopy(body))
    assert bool(problems) == bool(expected), json.dumps(body)[:2000]
    assert_same_fields({p["field"] for p in problems}, {e["field"] for e in expected}, body)
    if expected:
        with pytest.raises(validation.InvalidRequest):
            validation.place_order_command(body)
    else:
        model = schemas.CreateOrderRequest.model_validate(body)
        command = validation.place_order_command(body)
        assert (command.customer_id, command.currency) == (model.customerId, model.currency)
        assert [(x.sku, x.quantity, x.unit_price) for x in command.lines] == [
            (i.sku, i.quantity, i.unitPrice) for i in model.items
        ]
    return expected


def test_the_validator_refuses_and_accepts_exactly_what_the_contract_does(modules):
    schemas, validation = modules
    accepted: list[bool] = []

    # derandomize: seeded from this test's code, so the same bodies run after run (hypothesis also mixes in
    # constants it reads in the project's source); database=None: no failing bodies kept between runs.
    @settings(max_examples=CASES, derandomize=True, deadline=None, database=None)
    @given(bodies(schemas.MAX_LINES))
    def same_verdict(body: Any) -> None:
        accepted.append(not assert_same_verdict(schemas, validation, body))

    same_verdict()
    # Both verdicts, in good proportion: otherwise the comparison proves little.
    assert len(accepted) >= 0.9 * CASES
    assert 0.1 * len(accepted) < sum(accepted) < 0.6 * len(accepted)


def valid_order() -> dict[str, Any]:
    return {"customerId": "c-1", "currency": "USD", "items": [{"sku": "A", "quantity": 2, "unitPrice": 0}]}


Place = tuple[str | int, ...]
PLACES: list[Place] = [
    *[(), ("customerId",), ("currency",), ("items",), ("items", 0)],
    *[("items", 0, "sku"), ("items", 0, "quantity"), ("items", 0, "unitPrice")],
]
RULES = {
    "Field required",
    "Extra inputs are not permitted",
    "Input should be a valid string",
    "Input should be a valid integer",
    "Input should be a valid list",
    NOT_AN_OBJECT,
    "String should have at least",
    "String should have at most",
    "String should match pattern",
    "Input should be greater than",
    "Input should be greater than or equal to",
    "Input should be less than or equal to",
    "Input should be a valid string, unable to parse raw data as a unicode string",
    "List should have at least",
    "List should have at most",
}


def changed(path: Place, value: Any = None, *, remove: bool = False) -> Any:
    """A valid order with `value` at `path` (the whole body at ()), or without the field there."""
    if not path:
        return copy.deepcopy(value)
    body = valid_order()
    parent: Any = body
    for step in path[:-1]:
        parent = parent[step]
    if remove:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(value)
    return body


def test_every_edge_value_in_every_place_gets_the_contracts_verdict(modules):
    """Each odd value in each place of a valid order, each field missing, unknown fields, the longest list
    and one longer: the same verdicts, and between them every rule of the contract."""
    schemas, validation = modules
    line = valid_order()["items"][0]
    cases = [
        *(changed(path, value) for path in PLACES for value in ODD_VALUES),
        *(changed(path, remove=True) for path in PLACES if path and isinstance(path[-1], str)),
        changed(("coupon",), 1),
        changed(("items", 0, "lineTotal"), 1),
        *(changed(("items",), [line] * n) for n in (schemas.MAX_LINES, schemas.MAX_LINES + 1)),
    ]
    seen: set[str] = set()
    for body in cases:
        expected = assert_same_verdict(schemas, validation, body)
        seen.update(re.sub(r" \d.*| '.*", "", f["message"]) for f in expected)  # the rule, not its bound
    assert seen >= RULES, seen  # every rule of the contract compared


@pytest.mark.parametrize("value", [1.0, -0.0, 0.0, 2.0, 1e3, True, False, "2", None, 2.5, float("nan")])
@pytest.mark.parametrize("field", ["quantity", "unitPrice"])
def test_an_integer_field_takes_integers_only_not_floats_or_booleans(modules, field, value):
    """JSON Schema (and jsonschema-rs alone) takes 1.0 and -0.0 for integers, pydantic strict does not."""
    schemas, validation = modules
    body = valid_order()
    body["items"][0][field] = value

    named = {p["field"] for p in validation.request_problems(body)}

    assert named == {f"items.0.{field}"}
    assert {f["field"] for f in pydantic_fields(schemas, body)} == named


@pytest.mark.parametrize(
    ("field", "value"),
    [("currency", "USD\n"), ("currency", "\ud800"), ("customerId", "c\udfff"), ("customerId", "c\n")],
    ids=["newline-before-end", "lone-surrogate", "trailing-lone-surrogate", "trailing-newline"],
)
def test_patterns_match_the_whole_text_and_only_unicode_text(modules, field, value):
    schemas, validation = modules
    body = {**valid_order(), field: value}

    assert [p["field"] for p in validation.request_problems(body)] == [field]
    assert [f["field"] for f in pydantic_fields(schemas, body)] == [field]


def test_messages_never_echo_the_callers_value(modules):
    _, validation = modules
    secret = "s3cr3t" * 30
    body = {**valid_order(), "customerId": secret, "currency": secret, "coupon": 1}
    body["items"][0]["quantity"] = secret

    problems = validation.request_problems(body)

    assert {p["field"] for p in problems} == {"customerId", "currency", "items.0.quantity", "coupon"}
    assert secret not in json.dumps(problems)


@pytest.mark.parametrize("order_id", ["o" * n for n in (0, 1, 63, 64, 65, 200)] + ["\ud800", "é" * 64])
def test_the_order_id_rule_is_the_contracts(modules, order_id):
    schemas, validation = modules
    try:
        TypeAdapter(schemas.OrderId).validate_python(order_id)
        expected = None
    except ValidationError as error:
        expected = ["orderId" for _ in error.errors()]
    try:
        validation.check_order_id(order_id)
        got = None
    except validation.InvalidRequest as refused:
        got = [f["field"] for f in refused.fields]
    assert got == expected


def test_the_contract_declares_exactly_the_handlers_routes(modules):
    from aws_lambda_powertools.event_handler import APIGatewayRestResolver

    schemas, _ = modules
    handler = load_handler_module(Template.load().function(FUNCTION))
    declared = APIGatewayRestResolver(enable_validation=True)
    schemas.declare_routes(declared)

    def routes(resolver: Any) -> set[tuple[str, str, str]]:
        return {
            (r.method, r.path, r.func.__name__) for r in resolver._static_routes + resolver._dynamic_routes
        }

    assert routes(declared) == routes(handler.app)


def test_the_handler_does_not_import_pydantic():
    code = (
        "import sys; sys.path[:0] = {paths!r}; import app; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    spec = Template.load().function(FUNCTION)
    paths = [str(spec.code_uri), *map(str, spec.layer_dirs)]
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code.format(paths=paths)],
        capture_output=True,
        text=True,
        check=True,
        env={**spec.environment, "AWS_REGION": "us-east-1", "POWERTOOLS_TRACE_DISABLED": "true"},
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ("null", [{"field": "body", "message": 'the value is not of type "object"'}]),
        (
            # Powertools' validation took a JSON array's first element as the body; a list is not an order
            json.dumps(
                [
                    {
                        "customerId": "c",
                        "currency": "USD",
                        "items": [{"sku": "A", "quantity": 1, "unitPrice": 1}],
                    }
                ]
            ),
            [{"field": "body", "message": 'the value is not of type "object"'}],
        ),
    ],
    ids=["json-null", "json-array"],
)
def test_a_body_that_is_not_an_order_object_is_a_422(api: Callable[..., dict[str, Any]], body, fields):
    event = load_event("api_create_order.json")
    event["body"] = body

    response = api(event)

    assert response["statusCode"] == 422
    assert json_body(response)["error"]["details"]["fields"] == fields
