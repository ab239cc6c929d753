"""Order API: create, read and cancel orders. Thin: validate, call shop.domain.orders, shape the response."""

from __future__ import annotations

import base64
import binascii
import json
import re
from functools import cache
from typing import Any

# First: shop.runtime lets Powertools' event_handler load only the modules used (runtime.lean_imports).
import shop.runtime  # noqa: F401  isort: skip
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from validation import InvalidRequest, check_order_id, place_order_command

from shop.domain.errors import (
    ConcurrentModification,
    DomainError,
    EventTooLarge,
    IdempotencyKeyReused,
    IllegalTransition,
    OrderNotFound,
    RequestInProgress,
    ServiceBusy,
)
from shop.domain.orders import OrderService
from shop.domain.principals import idempotency_caller
from shop.runtime import invocation
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.wiring import orders as wiring

# Requests are validated by validation.py, not by Powertools' pydantic validation (enable_validation): the
# same rules and messages without pydantic's import on every cold start (schemas.py is the contract).
app = APIGatewayRestResolver()

# The one place where domain errors become HTTP statuses.
_STATUS_FOR_ERROR: dict[type[DomainError], int] = {
    OrderNotFound: 404,
    IllegalTransition: 409,
    ConcurrentModification: 409,
    RequestInProgress: 409,
    IdempotencyKeyReused: 422,
    EventTooLarge: 413,
    ServiceBusy: 503,
}
_RETRY_AFTER_SECONDS = "1"
_HEADER_TOKEN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@cache
def order_service() -> OrderService:
    return wiring.order_service(get_settings())


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> Response[Any]:
    headers = {"Retry-After": _RETRY_AFTER_SECONDS} if status == 503 else None
    return Response(status, content_types.APPLICATION_JSON, error_body(code, message, details), headers)


def _header(event: dict[str, Any], name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name.lower():
            return str(value)
    return None


def correlation_id_of(event: dict[str, Any]) -> str:
    """The caller's X-Correlation-Id when well-formed, else API Gateway's request id."""
    given = _header(event, "X-Correlation-Id")
    if given and _HEADER_TOKEN.match(given):
        return given
    return str((event.get("requestContext") or {}).get("requestId") or "unknown")


def caller_of(event: dict[str, Any]) -> str:
    """Whose Idempotency-Key namespace a request uses: the principal API Gateway authenticated (AWS_IAM
    auth), stable across a role's sessions (shop.domain.principals). Without authorization
    (ApiAuthType=NONE) there is no principal, and every caller shares one anonymous namespace."""
    identity = (event.get("requestContext") or {}).get("identity") or {}

    def field(name: str) -> str | None:
        value = identity.get(name)
        return value if isinstance(value, str) and value else None

    return idempotency_caller(
        user_arn=field("userArn"),
        caller=field("caller"),
        account_id=field("accountId"),
        cognito_identity_id=field("cognitoIdentityId"),
    )


def reject_unacceptable_body(event: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """Size and media type are checked before parsing, so a huge or non-JSON body is never decoded."""
    body = event.get("body")
    if not body:
        return None
    try:
        raw = base64.b64decode(body, validate=True) if event.get("isBase64Encoded") else body.encode()
    except (binascii.Error, UnicodeEncodeError):
        return 400, error_body("MALFORMED_JSON", "the request body is not valid JSON")
    limit = get_settings().max_event_bytes
    if len(raw) > limit:
        return 413, error_body(
            "BODY_TOO_LARGE", "the request body is too large", {"limitBytes": limit, "bodyBytes": len(raw)}
        )
    media_type = (_header(event, "Content-Type") or "").split(";")[0].strip().lower()
    if media_type != content_types.APPLICATION_JSON:
        return 415, error_body(
            "UNSUPPORTED_MEDIA_TYPE", "send the body as application/json", {"contentType": media_type}
        )
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # JSON text is UTF-8 (RFC 8259); anything else cannot be parsed
        return 400, error_body("MALFORMED_JSON", "the request body is not valid UTF-8 JSON")
    return None


def _location(order_id: str) -> str:
    # requestContext.path carries the stage prefix the client used (e.g. /dev/orders).
    base = app.current_event.request_context.path or app.current_event.path
    return f"{base.rstrip('/')}/{order_id}"


def _idempotency_key() -> str | None:
    key = app.current_event.headers.get("idempotency-key") or _header(
        app.current_event.raw_event, "Idempotency-Key"
    )
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.match(key):
        raise _BadHeader("Idempotency-Key must be 1-255 printable ASCII characters without spaces")
    return key


class _BadHeader(Exception):
    pass


class _MalformedJson(Exception):
    pass


def _json_body() -> Any:
    try:
        return app.current_event.json_body
    except (ValueError, RecursionError) as exc:
        # ValueError: malformed JSON, or an integer literal past Python's digit limit; RecursionError:
        # nesting past the interpreter's limit. Each is the body's fault: 400, never 500.
        raise _MalformedJson from exc


@app.post("/orders")
def create_order() -> Response[Any]:
    placed = order_service().place_order(
        place_order_command(_json_body()),
        idempotency_key=_idempotency_key(),
        correlation_id=app.context["correlation_id"],
        caller=caller_of(app.current_event.raw_event),
    )
    order_id = placed.order["orderId"]
    headers = {"Location": _location(order_id)}
    if placed.replayed:
        headers["Idempotent-Replayed"] = "true"
        logger.info("idempotent replay", extra={"order_id": order_id})
    else:
        metrics.add_metric(name="OrdersCreated", unit=MetricUnit.Count, value=1)
        logger.info("order created", extra={"order_id": order_id})
    return Response(201, content_types.APPLICATION_JSON, placed.order, headers)


@app.get("/orders/<orderId>")
def get_order(orderId: str) -> dict[str, Any]:
    check_order_id(orderId)
    return order_service().get_order(orderId).to_dict()


@app.post("/orders/<orderId>/cancel")
def cancel_order(orderId: str) -> dict[str, Any]:
    check_order_id(orderId)
    order = order_service().cancel_order(orderId, correlation_id=app.context["correlation_id"])
    metrics.add_metric(name="OrdersCancelled", unit=MetricUnit.Count, value=1)
    logger.info("order cancel requested", extra={"order_id": orderId, "version": order.version})
    return order.to_dict()


@app.exception_handler(InvalidRequest)
def _invalid_request(exc: InvalidRequest) -> Response[Any]:
    return _error(422, "VALIDATION_FAILED", "the request is invalid", {"fields": exc.fields})


@app.exception_handler(_MalformedJson)
def _malformed_json(exc: _MalformedJson) -> Response[Any]:
    return _error(400, "MALFORMED_JSON", "the request body is not valid JSON")


@app.exception_handler(_BadHeader)
def _bad_header(exc: _BadHeader) -> Response[Any]:
    return _error(400, "INVALID_HEADER", str(exc))


@app.exception_handler(DomainError)
def _domain_error(exc: DomainError) -> Response[Any]:
    status = _STATUS_FOR_ERROR.get(type(exc), 400)
    logger.info("request refused", extra={"error_code": exc.code, "status": status})
    return _error(status, exc.code, exc.message, exc.details)


@app.not_found
def _route_not_found(exc: Exception) -> Response[Any]:
    return _error(404, "ROUTE_NOT_FOUND", "no such route")


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Response[Any]:
    # API boundary: log the failure with its stack, answer without internals.
    logger.exception("unexpected error")
    return _error(500, "INTERNAL_ERROR", "the request could not be completed")


def _with_correlation_header(response: dict[str, Any], correlation_id: str) -> dict[str, Any]:
    if "multiValueHeaders" in response:
        response["multiValueHeaders"]["X-Correlation-Id"] = [correlation_id]
    else:
        response.setdefault("headers", {})["X-Correlation-Id"] = correlation_id
    return response


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.begin(context)  # the order store's retries stop short of this invocation's timeout
    correlation_id = correlation_id_of(event)
    logger.set_correlation_id(correlation_id)
    tracer.put_annotation("correlation_id", correlation_id)
    rejection = reject_unacceptable_body(event)
    if rejection is not None:
        status, body = rejection
        logger.info("request refused", extra={"error_code": body["error"]["code"], "status": status})
        response = {
            "statusCode": status,
            "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "body": json.dumps(body),
            "isBase64Encoded": False,
        }
        return _with_correlation_header(response, correlation_id)
    app.append_context(correlation_id=correlation_id)
    return _with_correlation_header(app.resolve(event, context), correlation_id)
