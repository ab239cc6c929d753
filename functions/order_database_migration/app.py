"""Order database migration (OrderStore=postgres): the CloudFormation custom resource OrderDatabaseSchema.

On Create and Update it applies the schema's migrations not applied yet (shop.adapters.postgres.schema,
yoyo), then makes the resource's `RelayMode` property (the template's PostgresRelay) the outbox's relay
(shop.adapters.postgres.relay_mode: the logical relay's publication and slot created, or dropped, with
the rows' publishing state handed over). On Delete it drops the slot, which would otherwise hold WAL for
ever, and keeps the data (the cluster's own deletion policy decides its fate).

The relay mode comes from the request, not from this function's environment: CloudFormation sends an
Update when, and because, the resource's properties changed, and sends them; the environment is that of
the version behind the alias `live`, which a parameter change alone may leave in place (SAM names the
version from the function's properties as written, with their parameter references unresolved), and
a rollback sends the previous properties back, which the environment would not follow.
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
from shop.runtime.config import POSTGRES_RELAYS, get_settings
from shop.runtime.observability import logger
from shop.runtime.wiring.order_database import connection_settings

PHYSICAL_ID = "order-database-schema"
RELAY_MODE = "RelayMode"  # OrderDatabaseSchema's property: !Ref PostgresRelay


class InvalidRequest(ValueError):
    """The request does not say what to do: answered FAILED, nothing changed."""


def relay_mode(event: dict[str, Any], environment_mode: str) -> str:
    """The relay the request asks for: its RelayMode property.

    The one request without it that is answered: a rollback to the template from before the property
    (an Update whose OldResourceProperties, the failed update's, have it), for which the relay was the
    function's environment, as that template meant it; a FAILED answer would leave the stack in
    UPDATE_ROLLBACK_FAILED."""
    properties = event.get("ResourceProperties") or {}
    if RELAY_MODE not in properties:
        old = event.get("OldResourceProperties") or {}
        if event["RequestType"] == "Update" and RELAY_MODE in old:
            logger.warning(
                "rollback to a template without RelayMode: the function's environment decides",
                extra={"relay": environment_mode},
            )
            return environment_mode
        raise InvalidRequest(
            f"ResourceProperties.{RELAY_MODE} is missing: the custom resource must carry the relay mode "
            f"(RelayMode: !Ref PostgresRelay), one of {', '.join(POSTGRES_RELAYS)}"
        )
    mode = properties[RELAY_MODE]
    if mode not in POSTGRES_RELAYS:
        raise InvalidRequest(
            f"ResourceProperties.{RELAY_MODE} is {mode!r}, not one of {', '.join(POSTGRES_RELAYS)}"
        )
    return str(mode)


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
    try:
        settings = get_settings()
        slot = slot_name(settings.database_name)
        applied: list[str] = []
        database = connection_settings(settings)
        mode = ""
        if request_type in ("Create", "Update"):
            mode = relay_mode(event, settings.postgres_relay)  # before anything changes
            applied = apply_migrations(database)
            with open_connection(database) as connection:
                relay = switch_relay(connection, mode, slot)
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
            {"Applied": ",".join(applied), "Relay": mode},
        )
    except Exception as exc:  # noqa: BLE001 (any failure must still answer CloudFormation, with its reason)
        logger.exception("order database migration failed")
        answer(event, "FAILED", f"{type(exc).__name__}: {exc}", {})
