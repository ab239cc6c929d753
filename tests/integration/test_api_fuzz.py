"""The API's OpenAPI document (tools/docs/openapi.json) and a schemathesis run against the local stack's API.

`make fuzz` sends 1,000 generated requests; this sends fewer, with a fixed seed.
"""

from __future__ import annotations

from typing import Any

import requests

from tools.chaos.fuzz import fuzz
from tools.docs import openapi
from tools.local.pollers.event_sources import read_event_sources
from tools.local.stack import LocalStack
from tools.template import Template

FUZZ_REQUESTS = 150


def _operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def test_the_committed_document_is_what_the_resolver_generates():
    assert openapi.committed() == openapi.generate(), "run `make docs` and commit tools/docs/openapi.json"


def test_the_document_has_exactly_the_routes_of_the_template():
    routes = {
        (route.method, route.path)
        for route in read_event_sources(Template.load()).routes
        if route.function == openapi.FUNCTION
    }

    assert routes
    assert _operations(openapi.committed()) == routes


def test_every_documented_error_answer_is_the_error_body():
    document = openapi.committed()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                schema = response["content"]["application/json"]["schema"]
                expected = "ErrorBody" if status.startswith(("4", "5")) else "Order"
                assert schema == {"$ref": f"#/components/schemas/{expected}"}, (method, path, status)


def test_fuzzing_the_api_finds_no_5xx_and_only_documented_answers(local_stack: LocalStack):
    result = fuzz(local_stack.api_url, FUZZ_REQUESTS, seed=3)

    assert result.requests >= FUZZ_REQUESTS
    assert not result.failures, "\n".join(result.failures[:10])
    assert result.by_status[201] > 0  # some generated orders were valid and accepted


def test_a_body_that_is_not_utf8_is_refused_as_malformed_json(local_stack: LocalStack):
    response = requests.post(
        f"{local_stack.api_url}/orders",
        data=b"\xfc\xdd not UTF-8",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "MALFORMED_JSON"
