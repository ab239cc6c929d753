"""Order API: create, read and cancel orders. Thin: validate, call shop.domain.orders, shape the response.
What every request goes through (correlation id, body checks, error bodies) is in boundary.py."""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, Any

# First: shop.runtime lets Powertools' event_handler load only the modules used (runtime.lean_imports).
import shop.runtime  # noqa: F401  isort: skip
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.metrics import MetricUnit
from boundary import MIDDLEWARES, Refused, error_response
from validation import check_order_id, place_order_command

from shop.domain.orders import OrderService
from shop.domain.principals import idempotency_caller
from shop.runtime import invocation
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.wiring import orders as wiring

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

app = APIGatewayRestResolver()
app.use(middlewares=MIDDLEWARES)
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@cache
def order_service() -> OrderService:
    return wiring.order_service(get_settings())


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


def _idempotency_key() -> str | None:
    key = app.current_event.headers.get("Idempotency-Key")
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        message = "Idempotency-Key must be 1-255 printable ASCII characters without spaces"
        raise Refused(400, "INVALID_HEADER", message)
    return key


def _json_body() -> Any:
    try:
        return app.current_event.json_body
    except (ValueError, RecursionError):
        # ValueError: malformed JSON, or an integer literal past Python's digit limit; RecursionError:
        # nesting past the interpreter's limit. Each is the body's fault: 400, never 500.
        raise Refused(400, "MALFORMED_JSON", "the request body is not valid JSON") from None


@app.post("/orders")
def create_order() -> Response[Any]:
    placed = order_service().place_order(
        place_order_command(_json_body()),
        idempotency_key=_idempotency_key(),
        correlation_id=app.context["correlation_id"],
        caller=caller_of(app.current_event.raw_event),
    )
    order_id = placed.order["orderId"]
    # requestContext.path carries the stage prefix the client used (e.g. /dev/orders).
    base = app.current_event.request_context.path or app.current_event.path
    headers = {"Location": f"{base.rstrip('/')}/{order_id}"}
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


@app.not_found
def _route_not_found(exc: Exception) -> Response[Any]:
    return error_response(Refused(404, "ROUTE_NOT_FOUND", "no such route"))


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.begin(context)  # the order store's retries stop short of this invocation's timeout
    return app.resolve(event, context)
