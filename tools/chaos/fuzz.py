"""API fuzzing: schemathesis generates requests from openapi.json and sends them to the local stack.

Half the examples of each operation fit the document (positive), half do not (negative). Every answer
is checked by the project's rules, not only schemathesis's: no 5xx at all (no fault is injected here,
so not even 503), every 4xx carries {"error": {"code", "message", "details"}}, and the answer is what
the document says (documented status, content type, headers and body schema; invalid data refused).
API Gateway's own 403 for a path that matches no route (e.g. an empty path parameter) is counted
apart: the function never sees those requests. Positive examples are not required to be accepted:
schemathesis sends integral floats (9.0) for integer fields, which JSON Schema counts as integers and
the API refuses on purpose (422, "floats are refused").

`make fuzz` (python -m tools.chaos fuzz, REQUESTS=1000) starts its own local stack; the test suite runs a
smaller number against the session's stack.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tools.docs import openapi
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import ROOT

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
_GATEWAY_NOT_FOUND = {"message": "Missing Authentication Token"}
_EXAMPLES = 10


@dataclass
class FuzzResult:
    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    not_routed: int = 0  # API Gateway's 403 for a path no route matches
    failures: list[str] = field(default_factory=list)

    def fail(self, label: str, message: str) -> None:
        self.failures.append(f"{label}: {message[:400]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": not self.failures and self.requests > 0,
            "requests": self.requests,
            "by_status": dict(sorted(self.by_status.items())),
            "by_operation": dict(sorted(self.by_operation.items())),
            "not_routed_gateway_403": self.not_routed,
            "failures": len(self.failures),
            "examples": self.failures[:_EXAMPLES],
        }


def _error_body_problem(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != {"code", "message", "details"}:
        return f"not the error body: {str(body)[:200]}"
    if not (isinstance(error["code"], str) and isinstance(error["message"], str)):
        return f"malformed error body: {str(body)[:200]}"
    if not isinstance(error["details"], dict):
        return f"details is not an object: {str(body)[:200]}"
    return None


def fuzz(api_url: str, total_requests: int, seed: int) -> FuzzResult:
    """Send about `total_requests` generated requests (at least that many when the document allows)."""
    document = openapi.committed()
    schema = schemathesis.openapi.from_dict(document)
    operations = []
    for loaded in schema.get_all_operations():
        if isinstance(loaded, Err):
            raise loaded.err()
        operations.append(loaded.ok())
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    per_run = max(1, math.ceil(total_requests / (len(operations) * len(modes))))
    result = FuzzResult()
    session = requests.Session()
    for operation in operations:
        for mode in modes:
            label = f"{operation.method.upper()} {operation.path} ({mode.value})"
            _run(operation, mode, per_run, seed, api_url, session, result, label)
    return result


def _run(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    seed: int,
    api_url: str,
    session: requests.Session,
    result: FuzzResult,
    label: str,
) -> None:
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.seed(seed)
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        try:
            response = case.call(base_url=api_url, session=session, timeout=30)
        except requests.RequestException as exc:
            result.fail(label, f"no answer: {exc!r}")
            return
        result.requests += 1
        result.by_status[response.status_code] += 1
        result.by_operation[label] += 1
        try:
            body = response.json()
        except ValueError:
            body = response.text[:200]
        if response.status_code == 403 and body == _GATEWAY_NOT_FOUND:
            result.not_routed += 1
            return
        if response.status_code >= 500:
            result.fail(label, f"{response.status_code} for {case.method} {case.formatted_path}: {body}")
        elif response.status_code >= 400 and (problem := _error_body_problem(body)) is not None:
            result.fail(label, f"{response.status_code} {problem}")
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, FailureGroup) as exc:
            result.fail(label, f"{response.status_code}: {str(exc).strip().splitlines()[0]}")

    send()


def run_against_local_stack(
    total_requests: int, seed: int, services: LocalServices | None = None
) -> dict[str, Any]:
    """Start the local stack (template.yaml as `make local` runs it), fuzz its API, stop it."""
    options = StackOptions(api_port=0, data_dir=ROOT / ".chaos" / "fuzz-stack")
    stack = LocalStack(options=options, services=services)
    stack.start()
    try:
        result = fuzz(stack.api_url, total_requests, seed)
    finally:
        stack.stop()
    return {"seed": seed, "requested": total_requests, **result.to_dict()}


def render(report: dict[str, Any]) -> str:
    lines = [
        f"API fuzzing (schemathesis, seed {report['seed']}): {report['requests']} requests",
        f"  by status: {report['by_status']}",
        f"  API Gateway 403 (no route matched): {report['not_routed_gateway_403']}",
    ]
    lines += [f"  {operation}: {count}" for operation, count in report["by_operation"].items()]
    lines += [f"  FAIL {example}" for example in report["examples"]]
    lines.append(f"result: {'PASS' if report['passed'] else 'FAIL'} ({report['failures']} failures)")
    return "\n".join(lines)
