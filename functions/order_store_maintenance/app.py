"""Order store maintenance (OrderStore=postgres): retention deletes and the outbox's health metrics,
started by EventBridge Scheduler (shop.runtime.order_store_maintenance); and the operator's commands
that need the database, which is out of the operator's reach in a private VPC (operations/admin.py
invokes this function and prints the report):
- {"replay": {...}}: `python -m operations replay` (shop.runtime.order_store_replay);
- {"redriveParked": {...}}, {"discardParked": {...}}: `redrive-poison`, `discard-poison`
  (shop.runtime.order_store_poison);
- {"recoverSlot": {...}}: `recover-slot` (shop.runtime.order_store_slot_recovery)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from shop.runtime import invocation
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.order_store_maintenance import maintain_order_store
from shop.runtime.order_store_poison import ParkedRequestError, discard_parked_rows, redrive_parked_rows
from shop.runtime.order_store_replay import ReplayRequestError, replay_order_store
from shop.runtime.order_store_slot_recovery import SlotRecoveryRequestError, recover_slot
from shop.runtime.wiring.order_database import order_database


def _answer(
    run: Callable[[], dict[str, Any]], refusal: type[ValueError], code: str, done: str
) -> dict[str, Any]:
    """Run an operator command: its report, logged as `done`; or, when it refuses the request, `code`."""
    try:
        report = run()
    except refusal as exc:
        return _refused(code, exc)
    logger.info(done, extra=report)
    return report


def _refused(code: str, exc: ValueError) -> dict[str, Any]:
    logger.warning("request refused", extra={"code": code, "error": str(exc)})
    return {"error": {"code": code, "message": str(exc)}}


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.begin(context)
    settings = get_settings()
    if "replay" in event:
        return _answer(
            lambda: replay_order_store(
                order_database(settings), settings, event["replay"], invocation.seconds_left
            ).to_dict(),
            ReplayRequestError,
            "INVALID_REPLAY_REQUEST",
            "order store replay",
        )
    if "redriveParked" in event or "discardParked" in event:
        try:
            if "redriveParked" in event:
                parked = redrive_parked_rows(
                    order_database(settings), settings, event["redriveParked"], invocation.seconds_left
                ).to_dict()
            else:
                parked = discard_parked_rows(order_database(settings), event["discardParked"]).to_dict()
        except ParkedRequestError as exc:
            return _refused("INVALID_PARKED_REQUEST", exc)
        logger.info("parked outbox rows", extra={"request": sorted(event), **parked})
        return parked
    if "recoverSlot" in event:
        return _answer(
            lambda: recover_slot(
                order_database(settings), settings, event["recoverSlot"], invocation.seconds_left
            ).to_dict(),
            SlotRecoveryRequestError,
            "INVALID_RECOVER_SLOT_REQUEST",
            "replication slot recovery",
        )
    report = maintain_order_store(order_database(settings), settings, invocation.seconds_left)
    logger.info("order store maintained", extra=asdict(report))
    return asdict(report)
