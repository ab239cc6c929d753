"""What every request of the order API goes through, as Powertools middlewares (app.use): its correlation
id, the acceptance of its body, and one answer for every failure, the error body of docs/api.md."""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from validation import InvalidRequest

from shop.domain import errors
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, tracer

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.middlewares import NextMiddleware

# The one place where domain errors become HTTP statuses.
_STATUS_FOR_ERROR: dict[type[errors.DomainError], int] = {
    errors.OrderNotFound: 404,
    errors.IllegalTransition: 409,
    errors.ConcurrentModification: 409,
    errors.RequestInProgress: 409,
    errors.IdempotencyKeyReused: 422,
    errors.EventTooLarge: 413,
    errors.ServiceBusy: 503,
}
_HEADER_TOKEN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class Refused(Exception):
    """A request refused by the API itself, before the domain: status, stable code, message, details."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(code)
        self.status, self.code, self.message, self.details = status, code, message, details or {}


def error_response(exc: Exception) -> Response[Any]:
    """Every failure's answer: {"error": {code, message, details}}, never internals."""
    if isinstance(exc, InvalidRequest):
        exc = Refused(422, "VALIDATION_FAILED", "the request is invalid", exc.details)
    if isinstance(exc, Refused | errors.DomainError):
        status = exc.status if isinstance(exc, Refused) else _STATUS_FOR_ERROR.get(type(exc), 400)
        code, message, details = exc.code, exc.message, exc.details
        logger.info("request refused", extra={"error_code": code, "status": status})
    else:  # API boundary: log the failure with its stack, answer without internals
        logger.exception("unexpected error")
        status, code, message, details = 500, "INTERNAL_ERROR", "the request could not be completed", {}
    headers = {"Retry-After": "1"} if status == 503 else None
    body = {"error": {"code": code, "message": message, "details": details}}
    return Response(status, content_types.APPLICATION_JSON, body, headers)


def correlated(app: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response[Any]:
    """Outermost middleware: the caller's X-Correlation-Id when well-formed, else API Gateway's request id,
    on every log line, in the trace and on every response. Failures become their response here, inside
    the chain, so that every answer (404s and errors too) leaves through this one place."""
    given = app.current_event.headers.get("X-Correlation-Id")
    correlation_id = (
        given if given and _HEADER_TOKEN.match(given) else app.current_event.request_context.request_id
    )
    logger.set_correlation_id(correlation_id)
    tracer.put_annotation("correlation_id", correlation_id)
    app.append_context(correlation_id=correlation_id)
    try:
        response = next_middleware(app)
    except Exception as exc:  # noqa: BLE001  every failure is answered by error_response
        response = error_response(exc)
    response.headers["X-Correlation-Id"] = correlation_id
    return response


def acceptable_body(app: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response[Any]:
    """Size and media type are checked before parsing, so a huge or non-JSON body is never decoded."""
    event = app.current_event
    if not event.body:
        return next_middleware(app)
    try:
        raw = base64.b64decode(event.body, validate=True) if event.is_base64_encoded else event.body.encode()
    except (binascii.Error, UnicodeEncodeError):
        raise Refused(400, "MALFORMED_JSON", "the request body is not valid JSON") from None
    if len(raw) > (limit := get_settings().max_event_bytes):
        sizes = {"limitBytes": limit, "bodyBytes": len(raw)}
        raise Refused(413, "BODY_TOO_LARGE", "the request body is too large", sizes)
    media_type = (event.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if media_type != content_types.APPLICATION_JSON:
        found = {"contentType": media_type}
        raise Refused(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as application/json", found)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # JSON text is UTF-8 (RFC 8259); anything else cannot be parsed
        raise Refused(400, "MALFORMED_JSON", "the request body is not valid UTF-8 JSON") from None
    return next_middleware(app)


MIDDLEWARES = [correlated, acceptable_body]  # in this order: correlated is the outermost
