"""Order store maintenance (OrderStore=postgres): retention deletes and the outbox's health metrics,
started by EventBridge Scheduler (shop.runtime.order_store_maintenance); and replay, when an operator
invokes it with {"replay": {...}} (`python -m operations replay`: the database is out of the operator's
reach, in a private VPC; shop.runtime.order_store_replay)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from shop.runtime import invocation
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.order_store_maintenance import maintain_order_store
from shop.runtime.order_store_replay import ReplayRequestError, replay_order_store
from shop.runtime.wiring.order_database import order_database


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.begin(context)
    settings = get_settings()
    if "replay" in event:
        try:
            replay = replay_order_store(
                order_database(settings), settings, event["replay"], invocation.seconds_left
            )
        except ReplayRequestError as exc:
            logger.warning("replay refused", extra={"error": str(exc)})
            return {"error": {"code": "INVALID_REPLAY_REQUEST", "message": str(exc)}}
        logger.info("order store replay", extra=replay.to_dict())
        return replay.to_dict()
    report = maintain_order_store(order_database(settings), settings, invocation.seconds_left)
    logger.info("order store maintained", extra=asdict(report))
    return asdict(report)
