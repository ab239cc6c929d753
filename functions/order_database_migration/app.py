"""Order database migration (OrderStore=postgres): the CloudFormation custom resource OrderDatabaseSchema.

On Create and Update it applies the schema's migrations not applied yet (shop.adapters.postgres.schema,
yoyo), then makes PostgresRelay the outbox's relay (shop.adapters.postgres.relay_mode: the logical
relay's publication and slot created, or dropped, with the rows' publishing state handed over). On
Delete it drops the slot, which would otherwise hold WAL for ever, and keeps the data (the cluster's own
deletion policy decides its fate).
CloudFormation waits for the answer PUT to the request's presigned URL: every path answers, failures
included, or the stack would wait an hour for a timeout.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from aws_lambda_powertools.utilities.typing import LambdaContext

from shop.adapters.postgres.connection import open_connection
from shop.adapters.postgres.relay_mode import drop_relay_slot, switch_relay
from shop.adapters.postgres.replication import slot_name
from shop.adapters.postgres.schema import apply_migrations
from shop.runtime.config import get_settings
from shop.runtime.observability import logger
from shop.runtime.wiring.order_database import connection_settings

PHYSICAL_ID = "order-database-schema"


def answer(event: dict[str, Any], status: str, reason: str, data: dict[str, str]) -> None:
    """The custom resource response (CloudFormation's documented fields), PUT to its presigned S3 URL."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:3000],
            "PhysicalResourceId": event.get("PhysicalResourceId", PHYSICAL_ID),
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
            "Data": data,
        }
    ).encode()
    # urllib3 comes with botocore; CloudFormation's presigned URL takes an empty content type.
    response = urllib3.PoolManager().request(
        "PUT", event["ResponseURL"], body=body, headers={"Content-Type": ""}, timeout=30.0, retries=3
    )
    if response.status >= 300:
        raise RuntimeError(f"CloudFormation refused the response: HTTP {response.status}")


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> None:
    request_type = event["RequestType"]
    settings = get_settings()
    slot = slot_name(settings.database_name)
    try:
        applied: list[str] = []
        database = connection_settings(settings)
        if request_type in ("Create", "Update"):
            applied = apply_migrations(database)
            with open_connection(database) as connection:
                relay = switch_relay(connection, settings.postgres_relay, slot)
        else:
            with open_connection(database) as connection:
                relay = "slot dropped" if drop_relay_slot(connection, slot) else "no slot"
        logger.info(
            "order database schema", extra={"request_type": request_type, "applied": applied, "relay": relay}
        )
        answer(
            event,
            "SUCCESS",
            f"applied {len(applied)} migration(s); relay: {relay}",
            {"Applied": ",".join(applied), "Relay": settings.postgres_relay},
        )
    except Exception as exc:  # noqa: BLE001 (any failure must still answer CloudFormation, with its reason)
        logger.exception("order database migration failed")
        answer(event, "FAILED", f"{type(exc).__name__}: {exc}", {})
