"""Lambda's Invoke API for the stack's functions, on the local API's port: what `sam local start-lambda`
serves, so an SDK client given the endpoint invokes a function of the stack (`python -m operations --local`
gets it as AWS_ENDPOINT_URL_LAMBDA from the stack's state file: tools/local/stack_state.py).

AWS Lambda API reference, "Invoke" (https://docs.aws.amazon.com/lambda/latest/api/API_Invoke.html):
`POST /2015-03-31/functions/FunctionName/invocations`, the payload as the body, the invocation type in
`X-Amz-Invocation-Type` and a version or alias in `?Qualifier=`. FunctionName is the function's name, its
ARN or a partial ARN (`123456789012:function:my-function`), any of them with a version or alias appended.
RequestResponse (the default) answers 200 with the function's response as the body; "The status code in
the API response doesn't reflect function errors": a function error is a 200 too, with
`X-Amz-Function-Error` and the error object as the body. DryRun answers 204 without running the function.
Errors (a rest-json service: botocore reads the code from `x-amzn-ErrorType`, and the message from the
body's `message` or `Message`): ResourceNotFoundException (404), InvalidRequestContentException (400, a
body that is not JSON), RequestTooLargeException (413, over the 6 MB of a synchronous invocation),
TooManyRequestsException (429, beyond the function's reserved concurrency).

Not served, refused with InvalidParameterValueException (400), which the SDK raises saying why: the Event
type (asynchronous invocation: Lambda's event queue, its retries and destinations are not emulated) and
`LogType: Tail` (the function's log is in the stack's log files and on the console, with LOGS=1). The
functions have no versions or aliases here: a qualifier other than $LATEST names no function.

Each invocation runs through the function's FunctionRuntime, as the API's routes do (its timeout,
environment and log), and is recorded in the activity log as a direct invocation.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tools.local.console.activity import ActivityLog, invoke_directly
from tools.local.gateway.server import LAMBDA_API_PREFIX, HttpAnswer, json_answer
from tools.local.runtime.context import function_arn
from tools.local.runtime.functions import FunctionRuntime, InvocationResult
from tools.template import ACCOUNT, REGION

_INVOCATIONS = re.compile(rf"{LAMBDA_API_PREFIX}/functions/(?P<name>[^/]+)/invocations/?")
# "For synchronous invocations, the maximum payload size is 6 MB" (6,291,456 bytes).
MAX_REQUEST_BYTES = 6 * 1024 * 1024
LATEST = "$LATEST"
SOURCE = "Invoke API"  # an invocation's source in the activity log
_TYPES = ("RequestResponse", "Event", "DryRun")
# The function's own errors are "Unhandled"; these the local stack reports as Lambda's service errors.
_SERVICE_ERRORS = ("Local.Stopped", "Local.LaunchFailed")


def parse_function_name(function_name: str) -> tuple[str, str | None] | None:
    """(name, qualifier) of a FunctionName in any of its formats; None for one naming another region or
    account (no function of this stack)."""
    parts = function_name.split(":")
    if parts[0] == "arn":
        if len(parts) not in (7, 8) or parts[1:3] != ["aws", "lambda"] or parts[5] != "function":
            return None
        if (parts[3], parts[4]) != (REGION, ACCOUNT):
            return None
        return parts[6], parts[7] if len(parts) == 8 else None
    if len(parts) in (3, 4) and parts[1] == "function":  # a partial ARN
        return (parts[2], parts[3] if len(parts) == 4 else None) if parts[0] == ACCOUNT else None
    if len(parts) in (1, 2):
        return parts[0], parts[1] if len(parts) == 2 else None
    return None


def _error(status: int, code: str, message: str, kind: str = "User", **extra: str) -> HttpAnswer:
    document = {"Type": kind, "Message": message, **extra}
    return json_answer(status, document, code, [("x-amzn-RequestId", str(uuid.uuid4()))])


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key.lower() == name.lower()), None)


class LambdaApi:
    """Serves LAMBDA_API_PREFIX for the functions of a stack (by logical id), as tools.local.gateway.server
    hands it the requests under that prefix."""

    def __init__(self, functions: Mapping[str, FunctionRuntime], activity: ActivityLog) -> None:
        self._functions = functions  # the stack's own dict: read at each request
        self._activity = activity

    def _function(self, name: str) -> FunctionRuntime | None:
        return next((f for f in self._functions.values() if f.physical_name == name), None)

    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> HttpAnswer:
        parts = urlsplit(target)
        found = _INVOCATIONS.fullmatch(parts.path)
        if method != "POST" or found is None:
            message = (
                f"the local stack serves Lambda's Invoke API only (POST {LAMBDA_API_PREFIX}/functions/"
                f"{{FunctionName}}/invocations), not {method} {parts.path}"
            )
            return _error(HTTPStatus.NOT_FOUND, "UnknownOperationException", message)
        function_name = unquote(found["name"])
        qualifiers = parse_qs(parts.query).get("Qualifier")
        parsed = parse_function_name(function_name)
        name, qualifier = parsed if parsed is not None else (function_name, None)
        qualifier = qualifiers[-1] if qualifiers else qualifier
        function = self._function(name) if parsed is not None and qualifier in (None, LATEST) else None
        if function is None:
            missing = function_arn(name, qualifier) if parsed is not None else function_name
            return _error(HTTPStatus.NOT_FOUND, "ResourceNotFoundException", f"Function not found: {missing}")
        invocation_type = _header(headers, "X-Amz-Invocation-Type") or "RequestResponse"
        refused = self._refused(invocation_type, _header(headers, "X-Amz-Log-Type") or "None")
        if refused is not None:
            return _error(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException", refused)
        if len(body) > MAX_REQUEST_BYTES:
            message = (
                f"Request must be smaller than {MAX_REQUEST_BYTES} bytes for the InvokeFunction operation"
            )
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeException", message)
        try:
            event = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            message = f"Could not parse request body into json: {exc}"
            return _error(HTTPStatus.BAD_REQUEST, "InvalidRequestContentException", message)
        if invocation_type == "DryRun":
            return HttpAnswer(HTTPStatus.NO_CONTENT, [("x-amzn-RequestId", str(uuid.uuid4()))], b"")
        return invoke_answer(invoke_directly(function, self._activity, event, SOURCE, throttle=True))

    @staticmethod
    def _refused(invocation_type: str, log_type: str) -> str | None:
        if invocation_type not in _TYPES:
            return f"InvocationType must be one of {', '.join(_TYPES)}, got {invocation_type!r}"
        if invocation_type == "Event":
            return (
                "the local stack does not serve InvocationType Event (asynchronous invocation: Lambda's "
                "event queue, retries and destinations are not emulated); invoke with RequestResponse"
            )
        if log_type == "Tail":
            return (
                "the local stack does not serve LogType Tail: the function's log is in the stack's log "
                "files (and on its console with LOGS=1)"
            )
        if log_type != "None":
            return f"LogType must be None or Tail, got {log_type!r}"
        return None


def invoke_answer(result: InvocationResult) -> HttpAnswer:
    """Lambda's answer to a RequestResponse invocation that ran (or was throttled)."""
    if result.throttled:
        assert result.error is not None
        return _error(
            HTTPStatus.TOO_MANY_REQUESTS,
            "TooManyRequestsException",
            result.error.message,
            Reason="ReservedFunctionConcurrentInvocationLimitExceeded",
        )
    if result.error is not None and result.error.error_type in _SERVICE_ERRORS:
        return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "ServiceException", result.error.message, "Service")
    headers = [
        ("Content-Type", "application/json"),
        ("x-amzn-RequestId", result.request_id),
        ("X-Amz-Executed-Version", LATEST),
    ]
    document: Any = result.payload
    if result.error is not None:
        headers.append(("X-Amz-Function-Error", "Unhandled"))
        document = result.error.to_payload()
    return HttpAnswer(HTTPStatus.OK, headers, json.dumps(document).encode())
