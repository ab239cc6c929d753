"""boto3's Lambda client as the operator's commands use it (`python -m operations replay`, `recover-slot`,
`redrive-poison`, ...): one invoke of the order store's maintenance function, its answer chosen by the test.
tests/unit/conftest.py's `lambda_stub` fixture installs it."""

from __future__ import annotations

import io
import json
from typing import Any

import boto3
import pytest


class LambdaStub:
    """Records each invoke (function name, decoded payload) and answers `answer`, as a function error
    (FunctionError: Unhandled) if `function_error`."""

    def __init__(self, answer: dict[str, Any], function_error: bool = False) -> None:
        self.answer, self.function_error = answer, function_error
        self.requests: list[tuple[str, Any]] = []

    def invoke(self, FunctionName: str, Payload: bytes) -> dict[str, Any]:
        self.requests.append((FunctionName, json.loads(Payload)))
        response: dict[str, Any] = {"Payload": io.BytesIO(json.dumps(self.answer).encode())}
        if self.function_error:
            response["FunctionError"] = "Unhandled"
        return response


def install_lambda_stub(
    monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], function_error: bool = False
) -> LambdaStub:
    """boto3.client("lambda") returns a LambdaStub answering `answer`; every other client is the real one,
    so the command still reaches moto for what else it calls."""
    stub = LambdaStub(answer, function_error)
    real_client = boto3.client
    monkeypatch.setattr(
        boto3, "client", lambda name, *a, **k: stub if name == "lambda" else real_client(name, *a, **k)
    )
    return stub
