"""Order store maintenance (OrderStore=postgres): retention deletes and the outbox's health metrics,
started by EventBridge Scheduler (shop.runtime.order_store_maintenance); and the operator's commands
that need the database, which is out of the operator's reach in a private VPC (operations/admin.py
invokes this function and prints the report):
- {"replay": {...}}: `python -m operations replay` (shop.runtime.order_store_replay);
- {"redriveParked": {...}}, {"discardParked": {...}}: `redrive-poison`, `discard-poison`
  (shop.runtime.order_store_poison);
- {"recoverSlot": {...}}: `recover-slot` (shop.runtime.order_store_slot_recovery)."""

from __future__ import annotations

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
        try:
            replay = replay_order_store(
                order_database(settings), settings, event["replay"], invocation.seconds_left
            )
        except ReplayRequestError as exc:
            return _refused("INVALID_REPLAY_REQUEST", exc)
        logger.info("order store replay", extra=replay.to_dict())
        return replay.to_dict()
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
        try:
            recovery = recover_slot(
                order_database(settings), settings, event["recoverSlot"], invocation.seconds_left
            )
        except SlotRecoveryRequestError as exc:
            return _refused("INVALID_RECOVER_SLOT_REQUEST", exc)
        logger.info("replication slot recovery", extra=recovery.to_dict())
        return recovery.to_dict()
    report = maintain_order_store(order_database(settings), settings, invocation.seconds_left)
    logger.info("order store maintained", extra=asdict(report))
    return asdict(report)
